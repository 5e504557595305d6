// kiln.elementwise -> linalg.generic on tensors (codegen/lower.cpp), and the result
// fusing into one loop nest with upstream linalg-fuse-elementwise-ops.
// RUN: kiln-opt %s --convert-kiln-to-linalg | FileCheck %s
// RUN: kiln-opt %s --convert-kiln-to-linalg | kiln-opt | FileCheck %s
// RUN: kiln-opt %s --convert-kiln-to-linalg | kiln-opt --linalg-fuse-elementwise-ops | FileCheck %s --check-prefix=FUSED

// CHECK-DAG: #[[ID:.*]] = affine_map<(d0, d1) -> (d0, d1)>
// CHECK-DAG: #[[ROW:.*]] = affine_map<(d0, d1) -> (d1)>
// CHECK-DAG: #[[COL:.*]] = affine_map<(d0, d1) -> (d0, 0)>

// x*x + x, then tanh: three generics before fusion, one after.
// CHECK-LABEL: func.func @chain
// CHECK: %[[C0:.*]] = arith.constant 0 : index
// CHECK: %[[D:.*]] = tensor.dim %arg0, %[[C0]] : tensor<?x4xf32>
// CHECK: %[[E:.*]] = tensor.empty(%[[D]]) : tensor<?x4xf32>
// CHECK: linalg.generic {indexing_maps = [#[[ID]], #[[ID]], #[[ID]]], iterator_types = ["parallel", "parallel"]} ins(%arg0, %arg0 : tensor<?x4xf32>, tensor<?x4xf32>) outs(%[[E]] : tensor<?x4xf32>)
// CHECK: arith.mulf
// CHECK: linalg.generic
// CHECK: arith.addf
// CHECK: linalg.generic
// CHECK: math.tanh
// CHECK-NOT: kiln.
// FUSED-LABEL: func.func @chain
// FUSED-COUNT-1: linalg.generic
// FUSED-NOT: linalg.generic
// FUSED: return
func.func @chain(%x: tensor<?x4xf32>) -> tensor<?x4xf32> {
  %0 = kiln.elementwise "mul" %x, %x : (tensor<?x4xf32>, tensor<?x4xf32>) -> tensor<?x4xf32>
  %1 = kiln.elementwise "add" %0, %x : (tensor<?x4xf32>, tensor<?x4xf32>) -> tensor<?x4xf32>
  %2 = kiln.elementwise "tanh" %1 : (tensor<?x4xf32>) -> tensor<?x4xf32>
  return %2 : tensor<?x4xf32>
}

// Broadcasting and promotion: int32 [3,1] + float32 [4] with alpha -> float32 [3,4].
// (The pattern driver hoists constants out of the body and puts them right of commutative ops.)
// CHECK-LABEL: func.func @broadcast_promote
// CHECK: %[[ALPHA:.*]] = arith.constant 2.000000e+00 : f32
// CHECK: %[[E:.*]] = tensor.empty() : tensor<3x4xf32>
// CHECK: linalg.generic {indexing_maps = [#[[COL]], #[[ROW]], #[[ID]]], {{.*}} ins(%arg0, %arg1 : tensor<3x1xi32>, tensor<4xf32>) outs(%[[E]] : tensor<3x4xf32>)
// CHECK-NEXT: ^bb0(%[[A:.*]]: i32, %[[B:.*]]: f32, %{{.*}}: f32):
// CHECK-NEXT: %[[AF:.*]] = arith.sitofp %[[A]] : i32 to f32
// CHECK-NEXT: %[[M:.*]] = arith.mulf %[[B]], %[[ALPHA]] : f32
// CHECK-NEXT: %[[S:.*]] = arith.addf %[[AF]], %[[M]] : f32
// CHECK-NEXT: linalg.yield %[[S]] : f32
func.func @broadcast_promote(%a: tensor<3x1xi32>, %b: tensor<4xf32>) -> tensor<3x4xf32> {
  %0 = kiln.elementwise "add" %a, %b {alpha = 2.0 : f64} : (tensor<3x1xi32>, tensor<4xf32>) -> tensor<3x4xf32>
  return %0 : tensor<3x4xf32>
}

// Neg follows formulas::Neg: -1 * x for floats (so -(+0) = -0), 0 - x for integers.
// CHECK-LABEL: func.func @neg_exp
// CHECK-DAG: %[[Z:.*]] = arith.constant 0 : i64
// CHECK-DAG: %[[M1:.*]] = arith.constant -1.000000e+00 : f64
// CHECK-DAG: %[[BIG:.*]] = arith.constant 0x4B400000 : f32
// CHECK: arith.mulf %{{.*}}, %[[M1]] : f64
// CHECK: arith.subi %[[Z]], %{{.*}} : i64
// CHECK: arith.sitofp %{{.*}} : i64 to f32
// float32 exp is expanded as eager's (formulas::exp_f32): x clamped to [-104, 89], then
// k = x / ln 2 rounded by adding 1.5 * 2^23 (and subtracting it), ...
// CHECK: arith.select
// CHECK: arith.select
// CHECK-NEXT: arith.mulf
// CHECK-NEXT: arith.addf %{{.*}}, %[[BIG]] : f32
func.func @neg_exp(%x: tensor<f64>, %i: tensor<5xi64>) -> (tensor<f64>, tensor<5xi64>, tensor<5xf32>) {
  %0 = kiln.elementwise "neg" %x : (tensor<f64>) -> tensor<f64>
  %1 = kiln.elementwise "neg" %i : (tensor<5xi64>) -> tensor<5xi64>
  %2 = kiln.elementwise "exp" %i : (tensor<5xi64>) -> tensor<5xf32>
  return %0, %1, %2 : tensor<f64>, tensor<5xi64>, tensor<5xf32>
}

// Bool arithmetic computes in i32 and stores != 0 (as eager): add = or.
// CHECK-LABEL: func.func @bool_add
// CHECK: arith.extui %{{.*}} : i1 to i32
// CHECK: %[[S:.*]] = arith.addi
// CHECK: %[[R:.*]] = arith.cmpi ne, %[[S]], %c0_i32 : i32
// CHECK: linalg.yield %[[R]] : i1
func.func @bool_add(%b: tensor<3xi1>) -> tensor<3xi1> {
  %0 = kiln.elementwise "add" %b, %b : (tensor<3xi1>, tensor<3xi1>) -> tensor<3xi1>
  return %0 : tensor<3xi1>
}

// Comparisons: C++ semantics on floats (ordered, except != which is unordered), signed on
// integers, unsigned on bools.
// CHECK-LABEL: func.func @compare
// CHECK: arith.cmpf olt
// CHECK: arith.cmpf une
// CHECK: arith.cmpi slt
// CHECK: arith.cmpi ult
func.func @compare(%x: tensor<3xf32>, %i: tensor<3xi64>, %b: tensor<3xi1>) -> (tensor<3xi1>, tensor<3xi1>, tensor<3xi1>, tensor<3xi1>) {
  %0 = kiln.elementwise "lt" %x, %x : (tensor<3xf32>, tensor<3xf32>) -> tensor<3xi1>
  %1 = kiln.elementwise "ne" %x, %x : (tensor<3xf32>, tensor<3xf32>) -> tensor<3xi1>
  %2 = kiln.elementwise "lt" %i, %i : (tensor<3xi64>, tensor<3xi64>) -> tensor<3xi1>
  %3 = kiln.elementwise "lt" %b, %b : (tensor<3xi1>, tensor<3xi1>) -> tensor<3xi1>
  return %0, %1, %2, %3 : tensor<3xi1>, tensor<3xi1>, tensor<3xi1>, tensor<3xi1>
}

// Bodies come from core/formulas.h: relu = select(x < 0, 0, x); maximum keeps NaN of either
// and a on ties (select(a < b || isnan(b), b, a)); round is half to even; gelu mode 1 is the
// tanh form.
// CHECK-LABEL: func.func @formulas
// CHECK: arith.cmpf olt
// CHECK-NEXT: arith.select
// CHECK: %[[LT:.*]] = arith.cmpf olt, %[[A:.*]], %[[B:.*]] : f32
// CHECK-NEXT: %[[NAN:.*]] = arith.cmpf uno, %[[B]], %[[B]] : f32
// CHECK-NEXT: %[[OR:.*]] = arith.ori %[[LT]], %[[NAN]] : i1
// CHECK-NEXT: arith.select %[[OR]], %[[B]], %[[A]] : f32
// CHECK: math.roundeven
// CHECK: arith.negf
// CHECK: math.fma
// CHECK: arith.divf
func.func @formulas(%x: tensor<8xf32>, %y: tensor<8xf32>) -> (tensor<8xf32>, tensor<8xf32>, tensor<8xf32>, tensor<8xf32>) {
  %0 = kiln.elementwise "relu" %x : (tensor<8xf32>) -> tensor<8xf32>
  %1 = kiln.elementwise "maximum" %x, %y : (tensor<8xf32>, tensor<8xf32>) -> tensor<8xf32>
  %2 = kiln.elementwise "round" %x : (tensor<8xf32>) -> tensor<8xf32>
  %3 = kiln.elementwise "gelu" %x {mode = 1 : i64} : (tensor<8xf32>) -> tensor<8xf32>
  return %0, %1, %2, %3 : tensor<8xf32>, tensor<8xf32>, tensor<8xf32>, tensor<8xf32>
}

// Kinds without a lowering stay as kiln ops: slice of a `?` dim (sizes from the dialect's
// sentinel). Views, addmm, logsumexp: lower-views.mlir.
// CHECK-LABEL: func.func @slice_dynamic_not_lowered
// CHECK: kiln.view "slice"
func.func @slice_dynamic_not_lowered(%x: tensor<?xf32>) -> tensor<2xf32> {
  %0 = kiln.view "slice" %x {dim = 0 : i64, start = 0 : i64, end = 2 : i64, step = 1 : i64} : (tensor<?xf32>) -> tensor<2xf32>
  return %0 : tensor<2xf32>
}
