// Parse, print, parse again: the printed form is stable and every op verifies.
// RUN: kiln-opt %s | kiln-opt | FileCheck %s

// CHECK-LABEL: func.func @elementwise
func.func @elementwise(%a: tensor<?x4xf32>, %b: tensor<4xf32>, %i: tensor<3xi32>)
    -> (tensor<?x4xf32>, tensor<?x4xf32>, tensor<3xi64>, tensor<?x4xi1>) {
  // CHECK: %[[M:.*]] = kiln.elementwise "mul" %arg0, %arg1 : (tensor<?x4xf32>, tensor<4xf32>) -> tensor<?x4xf32>
  %0 = kiln.elementwise "mul" %a, %b : (tensor<?x4xf32>, tensor<4xf32>) -> tensor<?x4xf32>
  // CHECK: kiln.elementwise "add" %[[M]], %arg0 {alpha = 2.500000e+00 : f64}
  %1 = kiln.elementwise "add" %0, %a {alpha = 2.5 : f64} : (tensor<?x4xf32>, tensor<?x4xf32>) -> tensor<?x4xf32>
  // CHECK: kiln.elementwise "exp" %{{.*}} : (tensor<?x4xf32>) -> tensor<?x4xf32>
  %2 = kiln.elementwise "exp" %1 : (tensor<?x4xf32>) -> tensor<?x4xf32>
  // CHECK: kiln.elementwise "neg" %arg2 : (tensor<3xi32>) -> tensor<3xi32>
  %3 = kiln.elementwise "neg" %i : (tensor<3xi32>) -> tensor<3xi32>
  // CHECK: kiln.reduce "sum" %{{.*}} : (tensor<3xi32>) -> tensor<i64>
  %s = kiln.reduce "sum" %3 : (tensor<3xi32>) -> tensor<i64>
  // CHECK: kiln.elementwise "lt" %{{.*}}, %{{.*}} : (tensor<?x4xf32>, tensor<i64>) -> tensor<?x4xi1>
  %4 = kiln.elementwise "lt" %2, %s : (tensor<?x4xf32>, tensor<i64>) -> tensor<?x4xi1>
  // CHECK: kiln.elementwise "clamp" %{{.*}} {alpha = 0 : i64} : (tensor<3xi32>) -> tensor<3xi32>
  %5 = kiln.elementwise "clamp" %3 {alpha = 0 : i64} : (tensor<3xi32>) -> tensor<3xi32>
  %6 = kiln.elementwise "mul" %5, %5 : (tensor<3xi32>, tensor<3xi32>) -> tensor<3xi32>
  // CHECK: kiln.elementwise "add" %{{.*}}, %{{.*}} : (tensor<3xi32>, tensor<3xi64>) -> tensor<3xi64>
  %c = kiln.constant dense<[1, 2, 3]> : tensor<3xi64> : tensor<3xi64>
  %7 = kiln.elementwise "add" %6, %c : (tensor<3xi32>, tensor<3xi64>) -> tensor<3xi64>
  return %1, %2, %7, %4 : tensor<?x4xf32>, tensor<?x4xf32>, tensor<3xi64>, tensor<?x4xi1>
}

// CHECK-LABEL: func.func @reduce_matmul_view
func.func @reduce_matmul_view(%x: tensor<8x?xf32>, %w: tensor<16x32xf32>, %bias: tensor<32xf32>)
    -> (tensor<8x1xf32>, tensor<?x32xf32>, tensor<?x8xf32>, tensor<8xi64>) {
  // CHECK: kiln.reduce "mean" %arg0 {dims = array<i64: 1>, keepdim} : (tensor<8x?xf32>) -> tensor<8x1xf32>
  %0 = kiln.reduce "mean" %x {dims = array<i64: 1>, keepdim} : (tensor<8x?xf32>) -> tensor<8x1xf32>
  // CHECK: kiln.reduce "argmax" %arg0 {dims = array<i64: 1>} : (tensor<8x?xf32>) -> tensor<8xi64>
  %1 = kiln.reduce "argmax" %x {dims = array<i64: 1>} : (tensor<8x?xf32>) -> tensor<8xi64>
  // CHECK: kiln.view "transpose" %arg0 {dim1 = 1 : i64} : (tensor<8x?xf32>) -> tensor<?x8xf32>
  %t = kiln.view "transpose" %x {dim1 = 1} : (tensor<8x?xf32>) -> tensor<?x8xf32>
  // CHECK: kiln.matmul "matmul" %{{.*}}, %arg1 : (tensor<?x16xf32>, tensor<16x32xf32>) -> tensor<?x32xf32>
  %v = kiln.view "view" %x {dims = array<i64: -1, 16>} : (tensor<8x?xf32>) -> tensor<?x16xf32>
  %m = kiln.matmul "matmul" %v, %w : (tensor<?x16xf32>, tensor<16x32xf32>) -> tensor<?x32xf32>
  // CHECK: kiln.matmul "addmm" %arg2, %{{.*}}, %arg1 {beta = 0.000000e+00 : f64}
  %a = kiln.matmul "addmm" %bias, %v, %w {beta = 0.0 : f64} : (tensor<32xf32>, tensor<?x16xf32>, tensor<16x32xf32>) -> tensor<?x32xf32>
  return %0, %a, %t, %1 : tensor<8x1xf32>, tensor<?x32xf32>, tensor<?x8xf32>, tensor<8xi64>
}

// CHECK-LABEL: func.func @composite
func.func @composite(%x: tensor<?x8xf32>, %w: tensor<8xf32>, %t: tensor<?xi64>)
    -> (tensor<?x8xf32>, tensor<?x8xf32>, tensor<f32>) {
  // CHECK: kiln.composite "softmax" %arg0 {dim = -1 : i64} : (tensor<?x8xf32>) -> tensor<?x8xf32>
  %0 = kiln.composite "softmax" %x {dim = -1} : (tensor<?x8xf32>) -> tensor<?x8xf32>
  // CHECK: kiln.composite "layer_norm" %arg0, %arg1 {dims = array<i64: 8>, eps = 1.000000e-05 : f64} : (tensor<?x8xf32>, tensor<8xf32>) -> tensor<?x8xf32>
  %1 = kiln.composite "layer_norm" %x, %w {dims = array<i64: 8>, eps = 1.0e-5 : f64} : (tensor<?x8xf32>, tensor<8xf32>) -> tensor<?x8xf32>
  // CHECK: kiln.composite "nll_loss" %arg0, %arg2 {ignore_index = 0 : i64, mode = 2 : i64} : (tensor<?x8xf32>, tensor<?xi64>) -> tensor<f32>
  %2 = kiln.composite "nll_loss" %x, %t {mode = 2, ignore_index = 0} : (tensor<?x8xf32>, tensor<?xi64>) -> tensor<f32>
  return %0, %1, %2 : tensor<?x8xf32>, tensor<?x8xf32>, tensor<f32>
}

// CHECK-LABEL: func.func @cast_one_hot
func.func @cast_one_hot(%t: tensor<?xi64>, %x: tensor<4xf64>) -> (tensor<?x10xf32>, tensor<4xi1>) {
  // CHECK: %[[O:.*]] = kiln.index "one_hot" %arg0 {mode = 10 : i64} : (tensor<?xi64>) -> tensor<?x10xi64>
  %0 = kiln.index "one_hot" %t {mode = 10 : i64} : (tensor<?xi64>) -> tensor<?x10xi64>
  // CHECK: kiln.elementwise "to" %[[O]] {dtype = f32} : (tensor<?x10xi64>) -> tensor<?x10xf32>
  %1 = kiln.elementwise "to" %0 {dtype = f32} : (tensor<?x10xi64>) -> tensor<?x10xf32>
  // CHECK: kiln.elementwise "to" %arg1 {dtype = i1} : (tensor<4xf64>) -> tensor<4xi1>
  %2 = kiln.elementwise "to" %x {dtype = i1} : (tensor<4xf64>) -> tensor<4xi1>
  return %1, %2 : tensor<?x10xf32>, tensor<4xi1>
}
