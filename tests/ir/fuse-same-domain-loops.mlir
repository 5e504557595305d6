// kiln-fuse-same-domain-loops (codegen/row_fusion.cpp): consecutive parallel loops over one
// iteration space merge when each iteration touches only its own elements of what they write.
// RUN: kiln-opt %s --split-input-file --kiln-fuse-same-domain-loops | FileCheck %s

// A bias gradient's column sum: zero the float64 sums, add the rows, round into the output
// (a view of an argument). One loop, where there were three (three GPU kernels).
// CHECK-LABEL: func.func @column_sum
// CHECK:         memref.expand_shape
// CHECK:         scf.parallel (%[[COL:.*]]) =
// CHECK:           memref.store %{{.*}}, %[[ACC:.*]][%c0{{.*}}, %[[COL]]] : memref<1x32xf64>
// CHECK:           scf.for
// CHECK:           memref.load %[[ACC]][%c0{{.*}}, %[[COL]]]
// CHECK:           arith.truncf
// CHECK-NOT:     scf.parallel
// CHECK:         return
func.func @column_sum(%x: memref<64x32xf32>, %out: memref<32xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c32 = arith.constant 32 : index
  %c64 = arith.constant 64 : index
  %zero = arith.constant 0.0 : f64
  %acc = memref.alloc() : memref<1x32xf64>
  scf.parallel (%j) = (%c0) to (%c32) step (%c1) {
    memref.store %zero, %acc[%c0, %j] : memref<1x32xf64>
    scf.reduce
  }
  scf.parallel (%j) = (%c0) to (%c32) step (%c1) {
    scf.for %i = %c0 to %c64 step %c1 {
      %v = memref.load %x[%i, %j] : memref<64x32xf32>
      %a = memref.load %acc[%c0, %j] : memref<1x32xf64>
      %w = arith.extf %v : f32 to f64
      %s = arith.addf %a, %w : f64
      memref.store %s, %acc[%c0, %j] : memref<1x32xf64>
    }
    scf.reduce
  }
  %view = memref.expand_shape %out [[0, 1]] output_shape [1, 32] : memref<32xf32> into memref<1x32xf32>
  scf.parallel (%j) = (%c0) to (%c32) step (%c1) {
    %a = memref.load %acc[%c0, %j] : memref<1x32xf64>
    %t = arith.truncf %a : f64 to f32
    memref.store %t, %view[%c0, %j] : memref<1x32xf32>
    scf.reduce
  }
  memref.dealloc %acc : memref<1x32xf64>
  return
}

// -----

// The second loop reads its neighbour's element of what the first wrote: apart.
// CHECK-LABEL: func.func @neighbour
// CHECK:         scf.parallel
// CHECK:         scf.parallel
func.func @neighbour(%x: memref<33xf32>, %out: memref<32xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c32 = arith.constant 32 : index
  %t = memref.alloc() : memref<33xf32>
  scf.parallel (%j) = (%c0) to (%c32) step (%c1) {
    %v = memref.load %x[%j] : memref<33xf32>
    memref.store %v, %t[%j] : memref<33xf32>
    scf.reduce
  }
  scf.parallel (%j) = (%c0) to (%c32) step (%c1) {
    %k = arith.addi %j, %c1 : index
    %v = memref.load %t[%k] : memref<33xf32>
    memref.store %v, %out[%j] : memref<32xf32>
    scf.reduce
  }
  memref.dealloc %t : memref<33xf32>
  return
}

// -----

// Every iteration writes the same element (not indexed by the loop): apart.
// CHECK-LABEL: func.func @shared_element
// CHECK:         scf.parallel
// CHECK:         scf.parallel
func.func @shared_element(%x: memref<32xf32>, %out: memref<32xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c32 = arith.constant 32 : index
  %t = memref.alloc() : memref<1xf32>
  scf.parallel (%j) = (%c0) to (%c32) step (%c1) {
    %v = memref.load %x[%j] : memref<32xf32>
    memref.store %v, %t[%c0] : memref<1xf32>
    scf.reduce
  }
  scf.parallel (%j) = (%c0) to (%c32) step (%c1) {
    %v = memref.load %t[%c0] : memref<1xf32>
    memref.store %v, %out[%j] : memref<32xf32>
    scf.reduce
  }
  memref.dealloc %t : memref<1xf32>
  return
}

// -----

// Different iteration spaces, and a call between loops over the same one: apart.
// CHECK-LABEL: func.func @apart
// CHECK:         scf.parallel
// CHECK:         scf.parallel
// CHECK:         call @touch
// CHECK:         scf.parallel
func.func private @touch(memref<32xf32>)
func.func @apart(%x: memref<32xf32>, %y: memref<32xf32>, %out: memref<32xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c16 = arith.constant 16 : index
  %c32 = arith.constant 32 : index
  %one = arith.constant 1.0 : f32
  scf.parallel (%j) = (%c0) to (%c16) step (%c1) {
    memref.store %one, %y[%j] : memref<32xf32>
    scf.reduce
  }
  scf.parallel (%j) = (%c0) to (%c32) step (%c1) {
    %v = memref.load %x[%j] : memref<32xf32>
    memref.store %v, %out[%j] : memref<32xf32>
    scf.reduce
  }
  func.call @touch(%out) : (memref<32xf32>) -> ()
  scf.parallel (%j) = (%c0) to (%c32) step (%c1) {
    %v = memref.load %out[%j] : memref<32xf32>
    %w = arith.addf %v, %one : f32
    memref.store %w, %out[%j] : memref<32xf32>
    scf.reduce
  }
  return
}

// -----

// The rounded sums go to an output viewed as [1, 32] whose buffer a later loop reads as well
// (an optimizer reading the gradient): still one loop. The same output read inside the loops
// through its own shape keeps them apart.
// CHECK-LABEL: func.func @output_read_after
// CHECK:         scf.parallel
// CHECK-NEXT:      memref.store
// CHECK-NOT:     scf.parallel
// CHECK:           arith.truncf
// CHECK:         call @barrier
// CHECK:         scf.parallel
// CHECK:           arith.mulf
// CHECK:         return
// CHECK-LABEL: func.func @output_read_inside
// CHECK:         scf.parallel
// CHECK:         scf.parallel
// CHECK:         return
func.func @output_read_after(%acc: memref<1x32xf64>, %out: memref<32xf32>, %p: memref<32xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c32 = arith.constant 32 : index
  %zero = arith.constant 0.0 : f64
  scf.parallel (%j) = (%c0) to (%c32) step (%c1) {
    memref.store %zero, %acc[%c0, %j] : memref<1x32xf64>
    scf.reduce
  }
  %view = memref.expand_shape %out [[0, 1]] output_shape [1, 32] : memref<32xf32> into memref<1x32xf32>
  scf.parallel (%j) = (%c0) to (%c32) step (%c1) {
    %a = memref.load %acc[%c0, %j] : memref<1x32xf64>
    %t = arith.truncf %a : f64 to f32
    memref.store %t, %view[%c0, %j] : memref<1x32xf32>
    scf.reduce
  }
  func.call @barrier() : () -> ()
  scf.parallel (%j) = (%c0) to (%c32) step (%c1) {
    %g = memref.load %out[%j] : memref<32xf32>
    %w = arith.mulf %g, %g : f32
    memref.store %w, %p[%j] : memref<32xf32>
    scf.reduce
  }
  return
}
func.func private @barrier()
func.func @output_read_inside(%acc: memref<1x32xf64>, %out: memref<32xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c31 = arith.constant 31 : index
  %c32 = arith.constant 32 : index
  %view = memref.expand_shape %out [[0, 1]] output_shape [1, 32] : memref<32xf32> into memref<1x32xf32>
  scf.parallel (%j) = (%c0) to (%c32) step (%c1) {
    %a = memref.load %acc[%c0, %j] : memref<1x32xf64>
    %t = arith.truncf %a : f64 to f32
    memref.store %t, %view[%c0, %j] : memref<1x32xf32>
    scf.reduce
  }
  scf.parallel (%j) = (%c0) to (%c32) step (%c1) {
    %k = arith.subi %c31, %j : index
    %g = memref.load %out[%k] : memref<32xf32>
    %w = arith.extf %g : f32 to f64
    memref.store %w, %acc[%c0, %j] : memref<1x32xf64>
    scf.reduce
  }
  return
}

// -----

// A buffer written through a loop's iter_arg, or by a copy into a view: apart (neither write
// would be index-checked).
// CHECK-LABEL: func.func @iter_arg
// CHECK:         scf.parallel
// CHECK:         scf.parallel
func.func @iter_arg(%x: memref<33xf32>, %out: memref<32xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c32 = arith.constant 32 : index
  %t = memref.alloc() : memref<33xf32>
  scf.parallel (%j) = (%c0) to (%c32) step (%c1) {
    %v = memref.load %x[%j] : memref<33xf32>
    %r = scf.for %k = %c0 to %c1 step %c1 iter_args(%b = %t) -> (memref<33xf32>) {
      memref.store %v, %b[%j] : memref<33xf32>
      scf.yield %t : memref<33xf32>
    }
    scf.reduce
  }
  scf.parallel (%j) = (%c0) to (%c32) step (%c1) {
    %k = arith.addi %j, %c1 : index
    %v = memref.load %t[%k] : memref<33xf32>
    memref.store %v, %out[%j] : memref<32xf32>
    scf.reduce
  }
  memref.dealloc %t : memref<33xf32>
  return
}

// -----

// CHECK-LABEL: func.func @copy_write
// CHECK:         scf.parallel
// CHECK:         scf.parallel
func.func @copy_write(%x: memref<33xf32>, %out: memref<32xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c32 = arith.constant 32 : index
  %t = memref.alloc() : memref<33xf32>
  scf.parallel (%j) = (%c0) to (%c32) step (%c1) {
    %s = memref.subview %x[%j] [1] [1] : memref<33xf32> to memref<1xf32, strided<[1], offset: ?>>
    %d = memref.subview %t[%j] [1] [1] : memref<33xf32> to memref<1xf32, strided<[1], offset: ?>>
    memref.copy %s, %d : memref<1xf32, strided<[1], offset: ?>> to memref<1xf32, strided<[1], offset: ?>>
    scf.reduce
  }
  scf.parallel (%j) = (%c0) to (%c32) step (%c1) {
    %k = arith.addi %j, %c1 : index
    %v = memref.load %t[%k] : memref<33xf32>
    memref.store %v, %out[%j] : memref<32xf32>
    scf.reduce
  }
  memref.dealloc %t : memref<33xf32>
  return
}
