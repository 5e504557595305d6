// The Index rows that read or select elements lowered to linalg.generic
// (codegen/lower_index.cpp): tril / triu compare j - i with the diagonal; masked_fill selects
// the value where the broadcast mask is true; index_select, gather and embedding read their
// source with tensor.extract at the loaded index clamped into [0, size - 1], so an index out
// of range (which the tracer and eager CUDA ops reject with eager's error) never reads outside
// the buffer; all of them fuse with their elementwise neighbours. index_add and scatter_add
// become scf.for nests adding into the result at clamped indices.
// RUN: kiln-opt %s --convert-kiln-to-linalg | FileCheck %s
// RUN: kiln-opt %s --convert-kiln-to-linalg | kiln-opt | FileCheck %s
// RUN: kiln-opt %s --convert-kiln-to-linalg --kiln-fuse-elementwise | FileCheck %s --check-prefix=FUSED

// CHECK-DAG: #[[COLS:.*]] = affine_map<(d0, d1) -> (d1)>
// CHECK-DAG: #[[BT:.*]] = affine_map<(d0, d1, d2) -> (d0, d1)>

// CHECK-LABEL: func.func @tril
// CHECK-DAG: %[[D:.*]] = arith.constant -1 : i64
// CHECK-DAG: %[[Z:.*]] = arith.constant 0.000000e+00 : f32
// CHECK: linalg.generic
// CHECK-NEXT: ^bb0(%[[X:.*]]: f32, %{{.*}}: f32):
// CHECK-DAG: %[[J:.*]] = linalg.index 2 : index
// CHECK-DAG: %[[I:.*]] = linalg.index 1 : index
// CHECK: %[[DIFF:.*]] = arith.subi
// CHECK: %[[KEEP:.*]] = arith.cmpi sle, %[[DIFF]], %[[D]] : i64
// CHECK: %[[R:.*]] = arith.select %[[KEEP]], %[[X]], %[[Z]] : f32
// CHECK: linalg.yield %[[R]] : f32
func.func @tril(%x: tensor<2x3x4xf32>) -> tensor<2x3x4xf32> {
  %0 = kiln.index "tril" %x {mode = -1 : i64} : (tensor<2x3x4xf32>) -> tensor<2x3x4xf32>
  return %0 : tensor<2x3x4xf32>
}

// triu of a bool matrix with the default diagonal 0: j - i >= 0, else false.
// CHECK-LABEL: func.func @triu_bool
// CHECK: arith.cmpi sge
// CHECK: arith.select %{{.*}}, %{{.*}}, %false : i1
func.func @triu_bool(%x: tensor<?x5xi1>) -> tensor<?x5xi1> {
  %0 = kiln.index "triu" %x : (tensor<?x5xi1>) -> tensor<?x5xi1>
  return %0 : tensor<?x5xi1>
}

// masked_fill: the [4] mask broadcast over the rows of x.
// CHECK-LABEL: func.func @masked_fill
// CHECK: %[[V:.*]] = arith.constant 0xFF800000 : f32
// CHECK: linalg.generic {indexing_maps = [#{{.*}}, #[[COLS]], #{{.*}}]
// CHECK-NEXT: ^bb0(%[[X:.*]]: f32, %[[M:.*]]: i1, %{{.*}}: f32):
// CHECK-NEXT: %[[R:.*]] = arith.select %[[M]], %[[V]], %[[X]] : f32
func.func @masked_fill(%x: tensor<3x4xf32>, %m: tensor<4xi1>) -> tensor<3x4xf32> {
  %0 = kiln.index "masked_fill" %x, %m {alpha = 0xFFF0000000000000 : f64}
      : (tensor<3x4xf32>, tensor<4xi1>) -> tensor<3x4xf32>
  return %0 : tensor<3x4xf32>
}

// embedding: [B, T] int32 indices into a [V, D] table; the index is extended, clamped into
// [0, V - 1] and read with the column loop index.
// CHECK-LABEL: func.func @embedding
// CHECK-DAG: %[[C0:.*]] = arith.constant 0 : i64
// CHECK-DAG: %[[LAST:.*]] = arith.constant 9 : i64
// CHECK: linalg.generic {indexing_maps = [#[[BT]], #{{.*}}]
// CHECK-NEXT: ^bb0(%[[T:.*]]: i32, %{{.*}}: f32):
// CHECK-NEXT: %[[W:.*]] = arith.extsi %[[T]] : i32 to i64
// CHECK-NEXT: %[[LO:.*]] = arith.maxsi %[[W]], %[[C0]] : i64
// CHECK-NEXT: %[[IN:.*]] = arith.minsi %[[LO]], %[[LAST]] : i64
// CHECK-NEXT: %[[AT:.*]] = arith.index_cast %[[IN]] : i64 to index
// CHECK-NEXT: %[[COL:.*]] = linalg.index 2 : index
// CHECK-NEXT: %[[E:.*]] = tensor.extract %arg0[%[[AT]], %[[COL]]] : tensor<10x8xf32>
// CHECK-NEXT: linalg.yield %[[E]] : f32
// FUSED-LABEL: func.func @embedding
// FUSED: linalg.generic
// FUSED: tensor.extract
// FUSED: arith.mulf
// FUSED-NOT: linalg.generic
// FUSED: return
func.func @embedding(%w: tensor<10x8xf32>, %t: tensor<2x3xi32>) -> tensor<2x3x8xf32> {
  %0 = kiln.index "embedding" %w, %t : (tensor<10x8xf32>, tensor<2x3xi32>) -> tensor<2x3x8xf32>
  %1 = kiln.elementwise "mul" %0, %0 : (tensor<2x3x8xf32>, tensor<2x3x8xf32>) -> tensor<2x3x8xf32>
  return %1 : tensor<2x3x8xf32>
}

// index_select along dim 1 of a source with a `?` batch: the result's batch size is the
// source's, its dim 1 the index's length; the last valid index is the source's dim 1 - 1.
// CHECK-LABEL: func.func @index_select
// CHECK: %[[B:.*]] = tensor.dim %arg0, %{{.*}} : tensor<?x6xf64>
// CHECK: tensor.empty(%[[B]]) : tensor<?x4xf64>
// CHECK: linalg.generic {indexing_maps = [#[[COLS]], #{{.*}}]
// CHECK: %[[ROW:.*]] = linalg.index 0 : index
// CHECK: tensor.extract %arg0[%[[ROW]], %{{.*}}] : tensor<?x6xf64>
func.func @index_select(%x: tensor<?x6xf64>, %i: tensor<4xi64>) -> tensor<?x4xf64> {
  %0 = kiln.index "index_select" %x, %i {dim = 1 : i64} : (tensor<?x6xf64>, tensor<4xi64>) -> tensor<?x4xf64>
  return %0 : tensor<?x4xf64>
}

// gather along dim 0: the index has the result's shape; the column is the loop's.
// CHECK-LABEL: func.func @gather
// CHECK: %[[AT:.*]] = arith.index_cast %{{.*}} : i64 to index
// CHECK: %[[COL:.*]] = linalg.index 1 : index
// CHECK: tensor.extract %arg0[%[[AT]], %[[COL]]] : tensor<5x3xi32>
func.func @gather(%x: tensor<5x3xi32>, %i: tensor<2x3xi64>) -> tensor<2x3xi32> {
  %0 = kiln.index "gather" %x, %i {dim = 0 : i64} : (tensor<5x3xi32>, tensor<2x3xi64>) -> tensor<2x3xi32>
  return %0 : tensor<2x3xi32>
}

// index_add: x's rows plus the source's rows at the clamped indices, in order: one scf.for per
// dim of the source carrying the result, tagged for the GPU lowering (atomic adds there).
// CHECK-LABEL: func.func @index_add
// CHECK-DAG: %[[LAST:.*]] = arith.constant 4 : i64
// CHECK: %[[R:.*]] = scf.for %[[I:.*]] = %{{.*}} iter_args(%[[ACC:.*]] = %arg0)
// CHECK: scf.for %[[J:.*]] = %{{.*}} iter_args(%[[ACC2:.*]] = %[[ACC]])
// CHECK: %[[IDX:.*]] = tensor.extract %arg1[%[[I]]] : tensor<4xi64>
// CHECK: %[[HI:.*]] = arith.minsi %{{.*}}, %[[LAST]] : i64
// CHECK: %[[ROW:.*]] = arith.index_cast %[[HI]] : i64 to index
// CHECK: %[[V:.*]] = tensor.extract %arg2[%[[I]], %[[J]]]
// CHECK: %[[OLD:.*]] = tensor.extract %[[ACC2]][%[[ROW]], %[[J]]]
// CHECK: %[[SUM:.*]] = arith.addf %[[OLD]], %[[V]] : f32
// CHECK: tensor.insert %[[SUM]] into %[[ACC2]][%[[ROW]], %[[J]]]
// CHECK: } {kiln.scatter_add}
// CHECK: return %[[R]]
func.func @index_add(%x: tensor<5x3xf32>, %i: tensor<4xi64>, %s: tensor<4x3xf32>) -> tensor<5x3xf32> {
  %0 = kiln.index "index_add" %x, %i, %s {dim = 0 : i64} : (tensor<5x3xf32>, tensor<4xi64>, tensor<4x3xf32>) -> tensor<5x3xf32>
  return %0 : tensor<5x3xf32>
}

// scatter_add of int64 along dim 1: the index's own element picks the column; integer add.
// CHECK-LABEL: func.func @scatter_add
// CHECK-DAG: %[[LAST:.*]] = arith.constant 6 : i64
// CHECK: scf.for %[[I:.*]] = %{{.*}} iter_args
// CHECK: scf.for %[[J:.*]] = %{{.*}} iter_args(%[[ACC:.*]] = %{{.*}})
// CHECK: %[[IDX:.*]] = tensor.extract %arg1[%[[I]], %[[J]]] : tensor<2x3xi32>
// CHECK: arith.extsi %[[IDX]] : i32 to i64
// CHECK: %[[HI:.*]] = arith.minsi %{{.*}}, %[[LAST]] : i64
// CHECK: %[[COL:.*]] = arith.index_cast %[[HI]] : i64 to index
// CHECK: tensor.extract %[[ACC]][%[[I]], %[[COL]]]
// CHECK: arith.addi
// CHECK: tensor.insert %{{.*}} into %[[ACC]][%[[I]], %[[COL]]]
func.func @scatter_add(%x: tensor<2x7xi64>, %i: tensor<2x3xi32>, %s: tensor<2x4xi64>) -> tensor<2x7xi64> {
  %0 = kiln.index "scatter_add" %x, %i, %s {dim = 1 : i64} : (tensor<2x7xi64>, tensor<2x3xi32>, tensor<2x4xi64>) -> tensor<2x7xi64>
  return %0 : tensor<2x7xi64>
}

// Bool (a logical or) is not lowered: the op stays.
// CHECK-LABEL: func.func @index_add_bool
// CHECK: kiln.index "index_add"
func.func @index_add_bool(%x: tensor<5xi1>, %i: tensor<2xi64>, %s: tensor<2xi1>) -> tensor<5xi1> {
  %0 = kiln.index "index_add" %x, %i, %s : (tensor<5xi1>, tensor<2xi64>, tensor<2xi1>) -> tensor<5xi1>
  return %0 : tensor<5xi1>
}
