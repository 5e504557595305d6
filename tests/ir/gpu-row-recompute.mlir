// kiln-gpu-row-recompute (codegen/row_recompute.cpp, recompute_row_intermediates): in a merged
// GPU row loop, a buffer one column loop stores and only later loops of the same row load is
// not stored; each load becomes the stored value's few ops again, on inputs nothing in the row
// loop writes.
// RUN: kiln-opt %s --split-input-file --kiln-gpu-row-recompute | FileCheck %s

// Attention's backward row: dropout's gradient (g where the mask keeps, times 1/(1-p)), its row
// sum against the probabilities, and the score gradient. The gradient's buffer and the loop
// that stored it go; both readers compute it from g and the mask.
// CHECK-LABEL: func.func @dropout_backward
// CHECK-NOT:     memref.alloc() : memref<2x64x128xf32>
// CHECK:         scf.parallel (%[[B:.*]], %[[R:.*]]) =
// CHECK-NEXT:      memref.store
// CHECK-NEXT:      scf.for %[[J:.*]] = %c0 to %c128 step %c1 {
// CHECK-NEXT:        memref.load %{{.*}}[%[[B]], %[[R]], %[[J]]] : memref<2x64x128xf32>
// CHECK-NEXT:        memref.load %{{.*}}[%[[B]], %[[R]], %[[J]]] : memref<2x64x128xi8>
// CHECK:             arith.select
// CHECK:             arith.mulf
// CHECK:             memref.load %{{.*}}[%[[B]], %[[R]], %[[J]]] : memref<2x64x128xf32>
// CHECK:           scf.for %[[K:.*]] = %c0 to %c128 step %c1 {
// CHECK-NEXT:        memref.load %{{.*}}[%[[B]], %[[R]], %[[K]]] : memref<2x64x128xf32>
// CHECK-NEXT:        memref.load %{{.*}}[%[[B]], %[[R]], %[[K]]] : memref<2x64x128xi8>
// CHECK:             memref.store %{{.*}}, %{{.*}}[%[[B]], %[[R]], %[[K]]]
// CHECK-NOT:     memref.dealloc %{{.*}} : memref<2x64x128xf32>
// CHECK:         return
func.func @dropout_backward(%g: memref<2x64x128xf32>, %keep: memref<2x64x128xi8>,
                            %p: memref<2x64x128xf32>,
                            %out: memref<2x64x128xf32> {llvm.noalias}) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c2 = arith.constant 2 : index
  %c64 = arith.constant 64 : index
  %c128 = arith.constant 128 : index
  %zero8 = arith.constant 0 : i8
  %zero = arith.constant 0.0 : f32
  %scale = arith.constant 1.25 : f32
  %gp = memref.alloc() : memref<2x64x128xf32>
  %sum = memref.alloc() : memref<2x64x1xf32>
  scf.parallel (%b, %r) = (%c0, %c0) to (%c2, %c64) step (%c1, %c1) {
    scf.for %j = %c0 to %c128 step %c1 {
      %v = memref.load %g[%b, %r, %j] : memref<2x64x128xf32>
      %k = memref.load %keep[%b, %r, %j] : memref<2x64x128xi8>
      %on = arith.cmpi ne, %k, %zero8 : i8
      %kept = arith.select %on, %v, %zero : f32
      %d = arith.mulf %kept, %scale : f32
      memref.store %d, %gp[%b, %r, %j] : memref<2x64x128xf32>
    }
    memref.store %zero, %sum[%b, %r, %c0] : memref<2x64x1xf32>
    scf.for %j = %c0 to %c128 step %c1 {
      %d = memref.load %gp[%b, %r, %j] : memref<2x64x128xf32>
      %y = memref.load %p[%b, %r, %j] : memref<2x64x128xf32>
      %s = memref.load %sum[%b, %r, %c0] : memref<2x64x1xf32>
      %t = arith.mulf %d, %y : f32
      %u = arith.addf %s, %t : f32
      memref.store %u, %sum[%b, %r, %c0] : memref<2x64x1xf32>
    }
    scf.for %j = %c0 to %c128 step %c1 {
      %d = memref.load %gp[%b, %r, %j] : memref<2x64x128xf32>
      %y = memref.load %p[%b, %r, %j] : memref<2x64x128xf32>
      %s = memref.load %sum[%b, %r, %c0] : memref<2x64x1xf32>
      %e = arith.subf %d, %s : f32
      %o = arith.mulf %e, %y : f32
      memref.store %o, %out[%b, %r, %j] : memref<2x64x128xf32>
    }
    scf.reduce
  }
  memref.dealloc %gp : memref<2x64x128xf32>
  memref.dealloc %sum : memref<2x64x1xf32>
  return
}

// -----

// Two in a chain (b = a + 1, a = x * 2) read by a last loop: both go, the last loop computes
// both from x. The column loop that also writes an output stays.
// CHECK-LABEL: func.func @chain
// CHECK-NOT:     memref.alloc
// CHECK:         scf.parallel
// CHECK:           scf.for
// CHECK:             memref.store %{{.*}}, %arg1
// CHECK:           scf.for
// CHECK-NEXT:        memref.load %arg0
// CHECK-NEXT:        arith.mulf
// CHECK-NEXT:        arith.addf
// CHECK-NEXT:        memref.store %{{.*}}, %arg2
// CHECK-NOT:     memref.dealloc
func.func @chain(%x: memref<64x128xf32>, %side: memref<64x128xf32> {llvm.noalias},
                 %y: memref<64x128xf32> {llvm.noalias}) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c64 = arith.constant 64 : index
  %c128 = arith.constant 128 : index
  %two = arith.constant 2.0 : f32
  %one = arith.constant 1.0 : f32
  %a = memref.alloc() : memref<64x128xf32>
  %b = memref.alloc() : memref<64x128xf32>
  scf.parallel (%r) = (%c0) to (%c64) step (%c1) {
    scf.for %j = %c0 to %c128 step %c1 {
      %v = memref.load %x[%r, %j] : memref<64x128xf32>
      %t = arith.mulf %v, %two : f32
      memref.store %t, %a[%r, %j] : memref<64x128xf32>
    }
    scf.for %j = %c0 to %c128 step %c1 {
      %v = memref.load %a[%r, %j] : memref<64x128xf32>
      %t = arith.addf %v, %one : f32
      memref.store %t, %b[%r, %j] : memref<64x128xf32>
      memref.store %v, %side[%r, %j] : memref<64x128xf32>
    }
    scf.for %j = %c0 to %c128 step %c1 {
      %v = memref.load %b[%r, %j] : memref<64x128xf32>
      memref.store %v, %y[%r, %j] : memref<64x128xf32>
    }
    scf.reduce
  }
  memref.dealloc %a : memref<64x128xf32>
  memref.dealloc %b : memref<64x128xf32>
  return
}

// -----

// Kept, each for one reason: the input is written in the row loop (@input_written); a math
// function (@exp); a running value of the column loop (@running); the column loop covers only
// part of the dim (@part); inputs of 12 bytes for a 4-byte element (@wide); a load of another
// row (@other_row); a load in the storing loop itself (@same_loop); a store at one row IV twice,
// which every j row writes (@repeated_row).
// CHECK-LABEL: func.func @input_written
// CHECK:         memref.alloc
// CHECK-LABEL: func.func @exp
// CHECK:         memref.alloc
// CHECK-LABEL: func.func @running
// CHECK:         memref.alloc
// CHECK-LABEL: func.func @part
// CHECK:         memref.alloc
// CHECK-LABEL: func.func @wide
// CHECK:         memref.alloc
// CHECK-LABEL: func.func @other_row
// CHECK:         memref.alloc
// CHECK-LABEL: func.func @same_loop
// CHECK:         memref.alloc
// CHECK-LABEL: func.func @repeated_row
// CHECK:         memref.alloc
func.func @input_written(%x: memref<64x128xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c64 = arith.constant 64 : index
  %c128 = arith.constant 128 : index
  %two = arith.constant 2.0 : f32
  %t = memref.alloc() : memref<64x128xf32>
  scf.parallel (%r) = (%c0) to (%c64) step (%c1) {
    scf.for %j = %c0 to %c128 step %c1 {
      %v = memref.load %x[%r, %j] : memref<64x128xf32>
      %w = arith.mulf %v, %two : f32
      memref.store %w, %t[%r, %j] : memref<64x128xf32>
      memref.store %two, %x[%r, %j] : memref<64x128xf32>
    }
    scf.for %j = %c0 to %c128 step %c1 {
      %v = memref.load %t[%r, %j] : memref<64x128xf32>
      memref.store %v, %x[%r, %j] : memref<64x128xf32>
    }
    scf.reduce
  }
  return
}

func.func @exp(%x: memref<64x128xf32>, %y: memref<64x128xf32> {llvm.noalias}) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c64 = arith.constant 64 : index
  %c128 = arith.constant 128 : index
  %t = memref.alloc() : memref<64x128xf32>
  scf.parallel (%r) = (%c0) to (%c64) step (%c1) {
    scf.for %j = %c0 to %c128 step %c1 {
      %v = memref.load %x[%r, %j] : memref<64x128xf32>
      %w = math.exp %v : f32
      memref.store %w, %t[%r, %j] : memref<64x128xf32>
    }
    scf.for %j = %c0 to %c128 step %c1 {
      %v = memref.load %t[%r, %j] : memref<64x128xf32>
      memref.store %v, %y[%r, %j] : memref<64x128xf32>
    }
    scf.reduce
  }
  return
}

func.func @running(%x: memref<64x128xf32>, %y: memref<64x128xf32> {llvm.noalias}) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c64 = arith.constant 64 : index
  %c128 = arith.constant 128 : index
  %zero = arith.constant 0.0 : f32
  %t = memref.alloc() : memref<64x128xf32>
  scf.parallel (%r) = (%c0) to (%c64) step (%c1) {
    %s = scf.for %j = %c0 to %c128 step %c1 iter_args(%acc = %zero) -> (f32) {
      %v = memref.load %x[%r, %j] : memref<64x128xf32>
      %w = arith.addf %acc, %v : f32
      memref.store %w, %t[%r, %j] : memref<64x128xf32>
      scf.yield %w : f32
    }
    scf.for %j = %c0 to %c128 step %c1 {
      %v = memref.load %t[%r, %j] : memref<64x128xf32>
      memref.store %v, %y[%r, %j] : memref<64x128xf32>
    }
    scf.reduce
  }
  return
}

func.func @part(%x: memref<64x128xf32>, %y: memref<64x128xf32> {llvm.noalias}) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c64 = arith.constant 64 : index
  %c127 = arith.constant 127 : index
  %c128 = arith.constant 128 : index
  %t = memref.alloc() : memref<64x128xf32>
  scf.parallel (%r) = (%c0) to (%c64) step (%c1) {
    scf.for %j = %c0 to %c127 step %c1 {
      %v = memref.load %x[%r, %j] : memref<64x128xf32>
      memref.store %v, %t[%r, %j] : memref<64x128xf32>
    }
    scf.for %j = %c0 to %c128 step %c1 {
      %v = memref.load %t[%r, %j] : memref<64x128xf32>
      memref.store %v, %y[%r, %j] : memref<64x128xf32>
    }
    scf.reduce
  }
  return
}

func.func @wide(%x: memref<64x128xf32>, %z: memref<64x128xf32>, %w: memref<64x128xf32>,
                %y: memref<64x128xf32> {llvm.noalias}) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c64 = arith.constant 64 : index
  %c128 = arith.constant 128 : index
  %t = memref.alloc() : memref<64x128xf32>
  scf.parallel (%r) = (%c0) to (%c64) step (%c1) {
    scf.for %j = %c0 to %c128 step %c1 {
      %a = memref.load %x[%r, %j] : memref<64x128xf32>
      %b = memref.load %z[%r, %j] : memref<64x128xf32>
      %c = memref.load %w[%r, %j] : memref<64x128xf32>
      %ab = arith.addf %a, %b : f32
      %abc = arith.addf %ab, %c : f32
      memref.store %abc, %t[%r, %j] : memref<64x128xf32>
    }
    scf.for %j = %c0 to %c128 step %c1 {
      %v = memref.load %t[%r, %j] : memref<64x128xf32>
      memref.store %v, %y[%r, %j] : memref<64x128xf32>
    }
    scf.reduce
  }
  return
}

func.func @other_row(%x: memref<64x128xf32>, %y: memref<63x128xf32> {llvm.noalias}) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c63 = arith.constant 63 : index
  %c128 = arith.constant 128 : index
  %t = memref.alloc() : memref<64x128xf32>
  scf.parallel (%r) = (%c0) to (%c63) step (%c1) {
    scf.for %j = %c0 to %c128 step %c1 {
      %v = memref.load %x[%r, %j] : memref<64x128xf32>
      memref.store %v, %t[%r, %j] : memref<64x128xf32>
    }
    scf.for %j = %c0 to %c128 step %c1 {
      %next = arith.addi %r, %c1 : index
      %v = memref.load %t[%next, %j] : memref<64x128xf32>
      memref.store %v, %y[%r, %j] : memref<63x128xf32>
    }
    scf.reduce
  }
  return
}

func.func @same_loop(%x: memref<64x128xf32>, %y: memref<64x128xf32> {llvm.noalias}) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c64 = arith.constant 64 : index
  %c128 = arith.constant 128 : index
  %t = memref.alloc() : memref<64x128xf32>
  scf.parallel (%r) = (%c0) to (%c64) step (%c1) {
    scf.for %j = %c0 to %c128 step %c1 {
      %v = memref.load %x[%r, %j] : memref<64x128xf32>
      memref.store %v, %t[%r, %j] : memref<64x128xf32>
      %u = memref.load %t[%r, %c0] : memref<64x128xf32>
      memref.store %u, %y[%r, %j] : memref<64x128xf32>
    }
    scf.reduce
  }
  return
}

func.func @repeated_row(%x: memref<4x4x128xf32>, %y: memref<4x4x128xf32> {llvm.noalias}) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c4 = arith.constant 4 : index
  %c128 = arith.constant 128 : index
  %t = memref.alloc() : memref<4x4x128xf32>
  scf.parallel (%i, %j) = (%c0, %c0) to (%c4, %c4) step (%c1, %c1) {
    scf.for %k = %c0 to %c128 step %c1 {
      %v = memref.load %x[%i, %j, %k] : memref<4x4x128xf32>
      memref.store %v, %t[%i, %i, %k] : memref<4x4x128xf32>
    }
    scf.for %k = %c0 to %c128 step %c1 {
      %v = memref.load %t[%i, %i, %k] : memref<4x4x128xf32>
      memref.store %v, %y[%i, %j, %k] : memref<4x4x128xf32>
    }
    scf.reduce
  }
  return
}
