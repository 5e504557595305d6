// kiln-gpu-static-rows (codegen/row_fusion.cpp, fuse_static_row_loops): in graphs with static
// shapes that are not row-separable (a whole training step), consecutive loops that share row
// dims merge into one loop over those rows when a reduction is among them and the merged loop
// is one whose rows spread over a warp's lanes, so a row is read back from cache by the warp
// that wrote it instead of from DRAM by another kernel.
// RUN: kiln-opt %s --split-input-file --kiln-gpu-static-rows | FileCheck %s
// RUN: kiln-opt %s --split-input-file --kiln-gpu-static-rows=lanes=1 | FileCheck %s --check-prefix=ONE

// Softmax's row max and the normalisation with dropout after it (attention's forward): one loop
// over the 64 rows, the 4-D elementwise loop's last dim a serial loop inside it.
// CHECK-LABEL: func.func @max_then_scale
// CHECK:         scf.parallel (%[[B:.*]], %[[R:.*]]) = (%c0, %c0) to (%c2, %c64) step (%c1, %c1) {
// CHECK:           scf.for %[[J:.*]] = %c0 to %c128 step %c1 {
// CHECK:             arith.maximumf
// CHECK:           scf.for %[[K:.*]] = %c0 to %c128 step %c1 {
// CHECK:             memref.load %{{.*}}[%[[B]], %[[R]], %c0]
// CHECK:             memref.store %{{.*}}, %{{.*}}[%[[B]], %[[R]], %[[K]]]
// CHECK-NOT:     scf.parallel
// CHECK:         return
func.func @max_then_scale(%x: memref<2x64x128xf32>, %keep: memref<2x64x128xi8>,
                          %y: memref<2x64x128xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c2 = arith.constant 2 : index
  %c64 = arith.constant 64 : index
  %c128 = arith.constant 128 : index
  %zero8 = arith.constant 0 : i8
  %zero = arith.constant 0.0 : f32
  %neg_inf = arith.constant 0xFF800000 : f32
  %max = memref.alloc() : memref<2x64x1xf32>
  scf.parallel (%b, %r) = (%c0, %c0) to (%c2, %c64) step (%c1, %c1) {
    memref.store %neg_inf, %max[%b, %r, %c0] : memref<2x64x1xf32>
    scf.for %j = %c0 to %c128 step %c1 {
      %v = memref.load %x[%b, %r, %j] : memref<2x64x128xf32>
      %m = memref.load %max[%b, %r, %c0] : memref<2x64x1xf32>
      %n = arith.maximumf %v, %m : f32
      memref.store %n, %max[%b, %r, %c0] : memref<2x64x1xf32>
    }
    scf.reduce
  }
  scf.parallel (%b, %r, %j) = (%c0, %c0, %c0) to (%c2, %c64, %c128) step (%c1, %c1, %c1) {
    %v = memref.load %x[%b, %r, %j] : memref<2x64x128xf32>
    %m = memref.load %max[%b, %r, %c0] : memref<2x64x1xf32>
    %k = memref.load %keep[%b, %r, %j] : memref<2x64x128xi8>
    %d = arith.subf %v, %m : f32
    %on = arith.cmpi ne, %k, %zero8 : i8
    %o = arith.select %on, %d, %zero : f32
    memref.store %o, %y[%b, %r, %j] : memref<2x64x128xf32>
    scf.reduce
  }
  memref.dealloc %max : memref<2x64x1xf32>
  return
}

// -----

// Softmax's backward shape: an elementwise loop, a row sum of its result, an elementwise loop
// that reads both: one loop over the rows.
// CHECK-LABEL: func.func @scale_sum_scale
// CHECK:         scf.parallel (%[[R:.*]]) = (%c0) to (%c64) step (%c1) {
// CHECK:           scf.for
// CHECK:           scf.for
// CHECK:           scf.for
// CHECK-NOT:     scf.parallel
// CHECK:         return
func.func @scale_sum_scale(%g: memref<64x128xf32>, %y: memref<64x128xf32>,
                           %out: memref<64x128xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c64 = arith.constant 64 : index
  %c128 = arith.constant 128 : index
  %zero = arith.constant -0.0 : f32
  %gy = memref.alloc() : memref<64x128xf32>
  %sum = memref.alloc() : memref<64xf32>
  scf.parallel (%r, %j) = (%c0, %c0) to (%c64, %c128) step (%c1, %c1) {
    %a = memref.load %g[%r, %j] : memref<64x128xf32>
    %b = memref.load %y[%r, %j] : memref<64x128xf32>
    %p = arith.mulf %a, %b : f32
    memref.store %p, %gy[%r, %j] : memref<64x128xf32>
    scf.reduce
  }
  scf.parallel (%r) = (%c0) to (%c64) step (%c1) {
    memref.store %zero, %sum[%r] : memref<64xf32>
    scf.for %j = %c0 to %c128 step %c1 {
      %v = memref.load %gy[%r, %j] : memref<64x128xf32>
      %s = memref.load %sum[%r] : memref<64xf32>
      %t = arith.addf %s, %v : f32
      memref.store %t, %sum[%r] : memref<64xf32>
    }
    scf.reduce
  }
  scf.parallel (%r, %j) = (%c0, %c0) to (%c64, %c128) step (%c1, %c1) {
    %a = memref.load %gy[%r, %j] : memref<64x128xf32>
    %s = memref.load %sum[%r] : memref<64xf32>
    %d = arith.subf %a, %s : f32
    memref.store %d, %out[%r, %j] : memref<64x128xf32>
    scf.reduce
  }
  memref.dealloc %gy : memref<64x128xf32>
  memref.dealloc %sum : memref<64xf32>
  return
}

// -----

// Kept apart: the second loop reads the next row's max, which another row's thread computes.
// CHECK-LABEL: func.func @other_row
// CHECK:         scf.parallel (%{{[^,]*}}) = (%c0) to (%c63)
// CHECK:         scf.parallel (%{{.*}}, %{{.*}}) = (%c0, %c0) to (%c63, %c128)
// ONE-LABEL: func.func @other_row
// ONE:           scf.parallel (%{{[^,]*}}) = (%c0) to (%c63)
// ONE:           scf.parallel (%{{.*}}, %{{.*}}) = (%c0, %c0) to (%c63, %c128)
func.func @other_row(%x: memref<64x128xf32>, %y: memref<63x128xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c63 = arith.constant 63 : index
  %c128 = arith.constant 128 : index
  %zero = arith.constant -0.0 : f32
  %sum = memref.alloc() : memref<64xf32>
  scf.parallel (%r) = (%c0) to (%c63) step (%c1) {
    memref.store %zero, %sum[%r] : memref<64xf32>
    scf.for %j = %c0 to %c128 step %c1 {
      %v = memref.load %x[%r, %j] : memref<64x128xf32>
      %s = memref.load %sum[%r] : memref<64xf32>
      %t = arith.addf %s, %v : f32
      memref.store %t, %sum[%r] : memref<64xf32>
    }
    scf.reduce
  }
  scf.parallel (%r, %j) = (%c0, %c0) to (%c63, %c128) step (%c1, %c1) {
    %next = arith.addi %r, %c1 : index
    %s = memref.load %sum[%next] : memref<64xf32>
    memref.store %s, %y[%r, %j] : memref<63x128xf32>
    scf.reduce
  }
  memref.dealloc %sum : memref<64xf32>
  return
}

// -----

// Rows of 32 columns: on a GPU a warp would leave most lanes idle, so a row keeps a thread and
// the loops stay apart (a merged row loop would read each thread's row 512 bytes from its
// neighbour's); the emulation's lanes of one merge them.
// CHECK-LABEL: func.func @short_rows
// CHECK:         scf.parallel (%{{[^,]*}}) = (%c0) to (%c64)
// CHECK:         scf.parallel (%{{.*}}, %{{.*}}) = (%c0, %c0) to (%c64, %c32)
// ONE-LABEL: func.func @short_rows
// ONE:           scf.parallel (%{{[^,]*}}) = (%c0) to (%c64) step (%c1) {
// ONE-COUNT-2:     scf.for
// ONE-NOT:       scf.parallel
// ONE:           return
func.func @short_rows(%x: memref<64x32xf32>, %y: memref<64x32xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c32 = arith.constant 32 : index
  %c64 = arith.constant 64 : index
  %zero = arith.constant -0.0 : f32
  %sum = memref.alloc() : memref<64xf32>
  scf.parallel (%r) = (%c0) to (%c64) step (%c1) {
    memref.store %zero, %sum[%r] : memref<64xf32>
    scf.for %j = %c0 to %c32 step %c1 {
      %v = memref.load %x[%r, %j] : memref<64x32xf32>
      %s = memref.load %sum[%r] : memref<64xf32>
      %t = arith.addf %s, %v : f32
      memref.store %t, %sum[%r] : memref<64xf32>
    }
    scf.reduce
  }
  scf.parallel (%r, %j) = (%c0, %c0) to (%c64, %c32) step (%c1, %c1) {
    %v = memref.load %x[%r, %j] : memref<64x32xf32>
    %s = memref.load %sum[%r] : memref<64xf32>
    %d = arith.divf %v, %s : f32
    memref.store %d, %y[%r, %j] : memref<64x32xf32>
    scf.reduce
  }
  memref.dealloc %sum : memref<64xf32>
  return
}

// -----

// Groups are cut where the rows change: the column loop over 128 between them shares no row
// dim with the 64-row loops, so each side stays as it was; the two loops after it merge.
// CHECK-LABEL: func.func @cut_groups
// CHECK:         scf.parallel (%{{.*}}, %{{.*}}) = (%c0, %c0) to (%c64, %c128)
// CHECK:         scf.parallel (%{{[^,]*}}) = (%c0) to (%c128)
// CHECK:         scf.parallel (%{{[^,]*}}) = (%c0) to (%c64) step (%c1) {
// CHECK-COUNT-2:   scf.for
// CHECK-NOT:     scf.parallel
// CHECK:         return
func.func @cut_groups(%x: memref<64x128xf32>, %y: memref<64x128xf32>, %col: memref<128xf32>,
                      %z: memref<64x128xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c64 = arith.constant 64 : index
  %c128 = arith.constant 128 : index
  %zero = arith.constant -0.0 : f32
  %sum = memref.alloc() : memref<64xf32>
  scf.parallel (%r, %j) = (%c0, %c0) to (%c64, %c128) step (%c1, %c1) {
    %v = memref.load %x[%r, %j] : memref<64x128xf32>
    %w = arith.mulf %v, %v : f32
    memref.store %w, %y[%r, %j] : memref<64x128xf32>
    scf.reduce
  }
  scf.parallel (%j) = (%c0) to (%c128) step (%c1) {
    %v = memref.load %x[%c0, %j] : memref<64x128xf32>
    memref.store %v, %col[%j] : memref<128xf32>
    scf.reduce
  }
  scf.parallel (%r) = (%c0) to (%c64) step (%c1) {
    memref.store %zero, %sum[%r] : memref<64xf32>
    scf.for %j = %c0 to %c128 step %c1 {
      %v = memref.load %y[%r, %j] : memref<64x128xf32>
      %s = memref.load %sum[%r] : memref<64xf32>
      %t = arith.addf %s, %v : f32
      memref.store %t, %sum[%r] : memref<64xf32>
    }
    scf.reduce
  }
  scf.parallel (%r, %j) = (%c0, %c0) to (%c64, %c128) step (%c1, %c1) {
    %v = memref.load %y[%r, %j] : memref<64x128xf32>
    %s = memref.load %sum[%r] : memref<64xf32>
    %d = arith.subf %v, %s : f32
    memref.store %d, %z[%r, %j] : memref<64x128xf32>
    scf.reduce
  }
  memref.dealloc %sum : memref<64xf32>
  return
}

// -----

// A call between the loops (a GEMM) stays between them: nothing merges across it, and two
// elementwise loops with no reduction are left to fuse_same_domain_loops.
// CHECK-LABEL: func.func @call_between
// CHECK:         scf.parallel (%{{[^,]*}}) = (%c0) to (%c64)
// CHECK:         call @gemm
// CHECK:         scf.parallel (%{{.*}}, %{{.*}}) = (%c0, %c0) to (%c64, %c128)
// CHECK:         scf.parallel (%{{.*}}, %{{.*}}) = (%c0, %c0) to (%c64, %c128)
func.func private @gemm(index)
func.func @call_between(%x: memref<64x128xf32>, %y: memref<64x128xf32>, %z: memref<64x128xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c64 = arith.constant 64 : index
  %c128 = arith.constant 128 : index
  %zero = arith.constant -0.0 : f32
  %sum = memref.alloc() : memref<64xf32>
  scf.parallel (%r) = (%c0) to (%c64) step (%c1) {
    memref.store %zero, %sum[%r] : memref<64xf32>
    scf.for %j = %c0 to %c128 step %c1 {
      %v = memref.load %x[%r, %j] : memref<64x128xf32>
      %s = memref.load %sum[%r] : memref<64xf32>
      %t = arith.addf %s, %v : f32
      memref.store %t, %sum[%r] : memref<64xf32>
    }
    scf.reduce
  }
  call @gemm(%c0) : (index) -> ()
  scf.parallel (%r, %j) = (%c0, %c0) to (%c64, %c128) step (%c1, %c1) {
    %v = memref.load %x[%r, %j] : memref<64x128xf32>
    %s = memref.load %sum[%r] : memref<64xf32>
    %d = arith.subf %v, %s : f32
    memref.store %d, %y[%r, %j] : memref<64x128xf32>
    scf.reduce
  }
  scf.parallel (%r, %j) = (%c0, %c0) to (%c64, %c128) step (%c1, %c1) {
    %v = memref.load %y[%r, %j] : memref<64x128xf32>
    %d = arith.mulf %v, %v : f32
    memref.store %d, %z[%r, %j] : memref<64x128xf32>
    scf.reduce
  }
  memref.dealloc %sum : memref<64xf32>
  return
}
