// kiln-cpu-row-loops (codegen/row_fusion.cpp): the CPU's row loops (convert-linalg-to-parallel-
// loops of a row-separable graph) merge into one loop over rows; an intermediate only that loop
// touches, at its row, shrinks to one row; a row copied element for element into an output
// written nowhere else is computed in the output's row.
// RUN: kiln-opt %s --split-input-file --kiln-cpu-row-loops | FileCheck %s
// RUN: kiln-opt %s --split-input-file --kiln-cpu-row-loops=verify=true | FileCheck %s --check-prefix=VERIFY

// Softmax as the CPU pipeline has it: the max, exp(x - max) into an intermediate, its sum,
// then the intermediate divided by the sum into the output.
// CHECK-LABEL: func.func @softmax
// CHECK-DAG:     memref.alloc() {{.*}} : memref<1x1xf32>
// CHECK-DAG:     memref.alloc() {{.*}} : memref<1x1xf32>
// CHECK-NOT:     memref.alloc
// CHECK:         scf.parallel (%[[ROW:.*]]) =
// CHECK-NOT:     scf.parallel
// CHECK:           math.exp
// CHECK-NEXT:      memref.store %{{.*}}, %[[OUT:.*]][%[[ROW]], %{{.*}}] : memref<?x8xf32>
// CHECK:           memref.load %[[OUT]][%[[ROW]], %{{.*}}] : memref<?x8xf32>
// CHECK:           arith.divf
// CHECK-NEXT:      memref.store %{{.*}}, %[[OUT]][%[[ROW]], %{{.*}}] : memref<?x8xf32>
// VERIFY-LABEL: func.func @softmax
// VERIFY:         scf.parallel
// VERIFY-NOT:     scf.parallel
// VERIFY:         return
func.func @softmax(%x: memref<?x8xf32>, %out: memref<?x8xf32> {llvm.noalias}) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c8 = arith.constant 8 : index
  %neg_inf = arith.constant 0xFF800000 : f32
  %zero = arith.constant 0.0 : f32
  %rows = memref.dim %x, %c0 : memref<?x8xf32>
  %max = memref.alloc(%rows) {alignment = 64 : i64} : memref<?x1xf32>
  scf.parallel (%i, %k) = (%c0, %c0) to (%rows, %c1) step (%c1, %c1) {
    memref.store %neg_inf, %max[%i, %k] : memref<?x1xf32>
    scf.reduce
  }
  scf.parallel (%i) = (%c0) to (%rows) step (%c1) {
    scf.for %j = %c0 to %c8 step %c1 {
      %v = memref.load %x[%i, %j] : memref<?x8xf32>
      %m = memref.load %max[%i, %c0] : memref<?x1xf32>
      %n = arith.maximumf %v, %m : f32
      memref.store %n, %max[%i, %c0] : memref<?x1xf32>
    }
    scf.reduce
  }
  %e = memref.alloc(%rows) {alignment = 64 : i64} : memref<?x8xf32>
  scf.parallel (%i, %j) = (%c0, %c0) to (%rows, %c8) step (%c1, %c1) {
    %v = memref.load %x[%i, %j] : memref<?x8xf32>
    %m = memref.load %max[%i, %c0] : memref<?x1xf32>
    %d = arith.subf %v, %m : f32
    %ex = math.exp %d : f32
    memref.store %ex, %e[%i, %j] : memref<?x8xf32>
    scf.reduce
  }
  %sum = memref.alloc(%rows) {alignment = 64 : i64} : memref<?x1xf32>
  scf.parallel (%i, %k) = (%c0, %c0) to (%rows, %c1) step (%c1, %c1) {
    memref.store %zero, %sum[%i, %k] : memref<?x1xf32>
    scf.reduce
  }
  scf.parallel (%i) = (%c0) to (%rows) step (%c1) {
    scf.for %j = %c0 to %c8 step %c1 {
      %v = memref.load %e[%i, %j] : memref<?x8xf32>
      %s = memref.load %sum[%i, %c0] : memref<?x1xf32>
      %t = arith.addf %s, %v : f32
      memref.store %t, %sum[%i, %c0] : memref<?x1xf32>
    }
    scf.reduce
  }
  scf.parallel (%i, %j) = (%c0, %c0) to (%rows, %c8) step (%c1, %c1) {
    %v = memref.load %e[%i, %j] : memref<?x8xf32>
    %s = memref.load %sum[%i, %c0] : memref<?x1xf32>
    %q = arith.divf %v, %s : f32
    memref.store %q, %out[%i, %j] : memref<?x8xf32>
    scf.reduce
  }
  memref.dealloc %max : memref<?x1xf32>
  memref.dealloc %e : memref<?x8xf32>
  memref.dealloc %sum : memref<?x1xf32>
  return
}

// -----

// The output may share memory with the input (no llvm.noalias: an input computed in place):
// the exp keeps a row buffer of its own.
// CHECK-LABEL: func.func @output_may_alias
// CHECK:         %[[ROWBUF:.*]] = memref.alloc() {{.*}} : memref<1x8xf32>
// CHECK:         scf.parallel (%[[ROW:.*]]) =
// CHECK:           memref.store %{{.*}}, %[[ROWBUF]][%c0{{.*}}, %{{.*}}] : memref<1x8xf32>
// CHECK:           memref.load %[[ROWBUF]][%c0{{.*}}, %{{.*}}] : memref<1x8xf32>
// CHECK:           memref.store %{{.*}}, %{{.*}}[%[[ROW]], %{{.*}}] : memref<?x8xf32>
func.func @output_may_alias(%x: memref<?x8xf32>, %out: memref<?x8xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c8 = arith.constant 8 : index
  %rows = memref.dim %x, %c0 : memref<?x8xf32>
  %e = memref.alloc(%rows) {alignment = 64 : i64} : memref<?x8xf32>
  scf.parallel (%i) = (%c0) to (%rows) step (%c1) {
    scf.for %j = %c0 to %c8 step %c1 {
      %v = memref.load %x[%i, %j] : memref<?x8xf32>
      %ex = math.exp %v : f32
      memref.store %ex, %e[%i, %j] : memref<?x8xf32>
    }
    scf.reduce
  }
  scf.parallel (%i) = (%c0) to (%rows) step (%c1) {
    scf.for %j = %c0 to %c8 step %c1 {
      %v = memref.load %e[%i, %j] : memref<?x8xf32>
      %w = memref.load %x[%i, %j] : memref<?x8xf32>
      %p = arith.mulf %v, %w : f32
      memref.store %p, %out[%i, %j] : memref<?x8xf32>
    }
    scf.reduce
  }
  memref.dealloc %e : memref<?x8xf32>
  return
}

// -----

// The intermediate is read at another row (its row 0) and the output is read outside the copy
// loop: verify mode does not merge the loops, nothing shrinks, nothing is redirected.
// VERIFY-LABEL: func.func @other_rows
// VERIFY:         memref.alloc(%{{.*}}) {{.*}} : memref<?x8xf32>
// VERIFY:         scf.parallel
// VERIFY:         scf.parallel
func.func @other_rows(%x: memref<?x8xf32>, %out: memref<?x8xf32> {llvm.noalias}) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c8 = arith.constant 8 : index
  %rows = memref.dim %x, %c0 : memref<?x8xf32>
  %e = memref.alloc(%rows) {alignment = 64 : i64} : memref<?x8xf32>
  scf.parallel (%i) = (%c0) to (%rows) step (%c1) {
    scf.for %j = %c0 to %c8 step %c1 {
      %v = memref.load %x[%i, %j] : memref<?x8xf32>
      memref.store %v, %e[%i, %j] : memref<?x8xf32>
    }
    scf.reduce
  }
  scf.parallel (%i) = (%c0) to (%rows) step (%c1) {
    scf.for %j = %c0 to %c8 step %c1 {
      %v = memref.load %e[%c0, %j] : memref<?x8xf32>
      memref.store %v, %out[%i, %j] : memref<?x8xf32>
    }
    scf.reduce
  }
  memref.dealloc %e : memref<?x8xf32>
  return
}

// -----

// The copy loop reads the row again after storing the output: the row keeps a buffer of its
// own (in the output, the second read would see the first store).
// CHECK-LABEL: func.func @reread_after_store
// CHECK:         memref.alloc() : memref<1x8xf32>
func.func @reread_after_store(%x: memref<?x8xf32>, %out: memref<?x8xf32> {llvm.noalias}, %out2: memref<?x8xf32> {llvm.noalias}) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c8 = arith.constant 8 : index
  %one = arith.constant 1.0 : f32
  %rows = memref.dim %x, %c0 : memref<?x8xf32>
  %e = memref.alloc(%rows) : memref<?x8xf32>
  scf.parallel (%i) = (%c0) to (%rows) step (%c1) {
    scf.for %j = %c0 to %c8 step %c1 {
      %v = memref.load %x[%i, %j] : memref<?x8xf32>
      %ex = math.exp %v : f32
      memref.store %ex, %e[%i, %j] : memref<?x8xf32>
    }
    scf.for %j = %c0 to %c8 step %c1 {
      %a = memref.load %e[%i, %j] : memref<?x8xf32>
      %s = arith.addf %a, %one : f32
      memref.store %s, %out[%i, %j] : memref<?x8xf32>
      %b = memref.load %e[%i, %j] : memref<?x8xf32>
      memref.store %b, %out2[%i, %j] : memref<?x8xf32>
    }
    scf.reduce
  }
  memref.dealloc %e : memref<?x8xf32>
  return
}

// -----

// The row loop runs inside a serial loop, whose iterations carry each row's values: the buffer
// keeps all its rows.
// CHECK-LABEL: func.func @serial_around
// CHECK:         memref.alloc(%{{.*}}) : memref<?x8xf32>
func.func @serial_around(%x: memref<?x8xf32>, %out: memref<?x8xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c3 = arith.constant 3 : index
  %c8 = arith.constant 8 : index
  %zero = arith.constant 0.0 : f32
  %rows = memref.dim %x, %c0 : memref<?x8xf32>
  %acc = memref.alloc(%rows) : memref<?x8xf32>
  scf.for %t = %c0 to %c3 step %c1 {
    scf.parallel (%i) = (%c0) to (%rows) step (%c1) {
      scf.for %j = %c0 to %c8 step %c1 {
        %first = arith.cmpi eq, %t, %c0 : index
        %old = memref.load %acc[%i, %j] : memref<?x8xf32>
        %base = arith.select %first, %zero, %old : f32
        %v = memref.load %x[%i, %j] : memref<?x8xf32>
        %s = arith.addf %base, %v : f32
        memref.store %s, %acc[%i, %j] : memref<?x8xf32>
        memref.store %s, %out[%i, %j] : memref<?x8xf32>
      }
      scf.reduce
    }
  }
  memref.dealloc %acc : memref<?x8xf32>
  return
}
