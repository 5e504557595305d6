// `to` (kiln.elementwise "to", target type in `dtype`) and one_hot (kiln.index) lowered to
// linalg.generic (codegen/lower.cpp), with eager's cast semantics, and both fusing with their
// elementwise neighbours (kiln-fuse-elementwise).
// RUN: kiln-opt %s --convert-kiln-to-linalg | FileCheck %s
// RUN: kiln-opt %s --convert-kiln-to-linalg | kiln-opt | FileCheck %s
// RUN: kiln-opt %s --convert-kiln-to-linalg --kiln-fuse-elementwise | FileCheck %s --check-prefix=FUSED

// CHECK-DAG: #[[ID:.*]] = affine_map<(d0, d1) -> (d0, d1)>
// CHECK-DAG: #[[ROWS:.*]] = affine_map<(d0, d1) -> (d0)>

// float -> int truncates (fptosi); NaN and values outside [-2^31, 2^31) give INT_MIN, as
// eager's cvttss2si does (fptosi alone would be poison there).
// CHECK-LABEL: func.func @cast_f32_i32
// CHECK-DAG: %[[MIN:.*]] = arith.constant -2147483648 : i32
// CHECK-DAG: %[[HI:.*]] = arith.constant 2.14748365E+9 : f32
// CHECK-DAG: %[[LO:.*]] = arith.constant -2.14748365E+9 : f32
// CHECK: linalg.generic {indexing_maps = [#[[ID]], #[[ID]]], iterator_types = ["parallel", "parallel"]} ins(%arg0 : tensor<?x4xf32>) outs(%{{.*}} : tensor<?x4xi32>)
// CHECK-NEXT: ^bb0(%[[X:.*]]: f32, %{{.*}}: i32):
// CHECK-NEXT: %[[GE:.*]] = arith.cmpf oge, %[[X]], %[[LO]] : f32
// CHECK-NEXT: %[[LT:.*]] = arith.cmpf olt, %[[X]], %[[HI]] : f32
// CHECK-NEXT: %[[IN:.*]] = arith.andi %[[GE]], %[[LT]] : i1
// CHECK-NEXT: %[[T:.*]] = arith.fptosi %[[X]] : f32 to i32
// CHECK-NEXT: %[[R:.*]] = arith.select %[[IN]], %[[T]], %[[MIN]] : i32
// CHECK-NEXT: linalg.yield %[[R]] : i32
func.func @cast_f32_i32(%x: tensor<?x4xf32>) -> tensor<?x4xi32> {
  %0 = kiln.elementwise "to" %x {dtype = i32} : (tensor<?x4xf32>) -> tensor<?x4xi32>
  return %0 : tensor<?x4xi32>
}

// To bool is x != 0 (unordered: NaN is true, -0 is false).
// CHECK-LABEL: func.func @cast_f64_bool
// CHECK: %[[Z:.*]] = arith.constant 0.000000e+00 : f64
// CHECK: ^bb0(%[[X:.*]]: f64, %{{.*}}: i1):
// CHECK-NEXT: %[[NZ:.*]] = arith.cmpf une, %[[X]], %[[Z]] : f64
// CHECK-NEXT: linalg.yield %[[NZ]] : i1
func.func @cast_f64_bool(%x: tensor<4xf64>) -> tensor<4xi1> {
  %0 = kiln.elementwise "to" %x {dtype = i1} : (tensor<4xf64>) -> tensor<4xi1>
  return %0 : tensor<4xi1>
}

// Integers narrow by wrapping; bool -> float is 0/1; float64 -> float32 rounds.
// CHECK-LABEL: func.func @cast_narrow
// CHECK: arith.trunci %{{.*}} : i64 to i32
// CHECK: arith.uitofp %{{.*}} : i1 to f32
// CHECK: arith.truncf %{{.*}} : f64 to f32
func.func @cast_narrow(%x: tensor<4xi64>, %b: tensor<4xi1>, %d: tensor<4xf64>)
    -> (tensor<4xi32>, tensor<4xf32>, tensor<4xf32>) {
  %0 = kiln.elementwise "to" %x {dtype = i32} : (tensor<4xi64>) -> tensor<4xi32>
  %1 = kiln.elementwise "to" %b {dtype = f32} : (tensor<4xi1>) -> tensor<4xf32>
  %2 = kiln.elementwise "to" %d {dtype = f32} : (tensor<4xf64>) -> tensor<4xf32>
  return %0, %1, %2 : tensor<4xi32>, tensor<4xf32>, tensor<4xf32>
}

// one_hot: over [N, C], the input read without the class dim, compared with linalg.index 1.
// CHECK-LABEL: func.func @one_hot
// CHECK: %[[N:.*]] = tensor.dim %arg0, %{{.*}} : tensor<?xi64>
// CHECK: %[[E:.*]] = tensor.empty(%[[N]]) : tensor<?x10xi64>
// CHECK: linalg.generic {indexing_maps = [#[[ROWS]], #[[ID]]], iterator_types = ["parallel", "parallel"]} ins(%arg0 : tensor<?xi64>) outs(%[[E]] : tensor<?x10xi64>)
// CHECK-NEXT: ^bb0(%[[T:.*]]: i64, %{{.*}}: i64):
// CHECK-NEXT: %[[I:.*]] = linalg.index 1 : index
// CHECK-NEXT: %[[C:.*]] = arith.index_cast %[[I]] : index to i64
// CHECK-NEXT: %[[EQ:.*]] = arith.cmpi eq, %[[T]], %[[C]] : i64
// CHECK-NEXT: %[[R:.*]] = arith.extui %[[EQ]] : i1 to i64
// CHECK-NEXT: linalg.yield %[[R]] : i64
func.func @one_hot(%t: tensor<?xi64>) -> tensor<?x10xi64> {
  %0 = kiln.index "one_hot" %t {mode = 10 : i64} : (tensor<?xi64>) -> tensor<?x10xi64>
  return %0 : tensor<?x10xi64>
}

// A cast inside an elementwise chain: (x * x).to(int32) + y, .to(float64) is one loop nest.
// CHECK-LABEL: func.func @cast_chain
// CHECK-COUNT-4: linalg.generic
// FUSED-LABEL: func.func @cast_chain
// FUSED: linalg.generic
// FUSED: arith.mulf
// FUSED: arith.fptosi
// FUSED: arith.select
// FUSED: arith.addi
// FUSED: arith.sitofp {{.*}} : i32 to f64
// FUSED-NOT: linalg.generic
// FUSED: return
func.func @cast_chain(%x: tensor<?x4xf32>, %y: tensor<?x4xi32>) -> tensor<?x4xf64> {
  %0 = kiln.elementwise "mul" %x, %x : (tensor<?x4xf32>, tensor<?x4xf32>) -> tensor<?x4xf32>
  %1 = kiln.elementwise "to" %0 {dtype = i32} : (tensor<?x4xf32>) -> tensor<?x4xi32>
  %2 = kiln.elementwise "add" %1, %y : (tensor<?x4xi32>, tensor<?x4xi32>) -> tensor<?x4xi32>
  %3 = kiln.elementwise "to" %2 {dtype = f64} : (tensor<?x4xi32>) -> tensor<?x4xf64>
  return %3 : tensor<?x4xf64>
}

// nll_loss's backward core: one_hot(t).to(f32) * g fuses into one loop nest.
// FUSED-LABEL: func.func @one_hot_cast_mul
// FUSED: linalg.generic
// FUSED: linalg.index 1
// FUSED: arith.cmpi eq
// FUSED: arith.sitofp {{.*}} : i64 to f32
// FUSED: arith.mulf
// FUSED-NOT: linalg.generic
// FUSED: return
func.func @one_hot_cast_mul(%t: tensor<?xi64>, %g: tensor<?x10xf32>) -> tensor<?x10xf32> {
  %0 = kiln.index "one_hot" %t {mode = 10 : i64} : (tensor<?xi64>) -> tensor<?x10xi64>
  %1 = kiln.elementwise "to" %0 {dtype = f32} : (tensor<?x10xi64>) -> tensor<?x10xf32>
  %2 = kiln.elementwise "mul" %1, %g : (tensor<?x10xf32>, tensor<?x10xf32>) -> tensor<?x10xf32>
  return %2 : tensor<?x10xf32>
}
