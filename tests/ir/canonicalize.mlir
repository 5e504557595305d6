// Upstream canonicalize + CSE on kiln ops: identity views fold, duplicates merge, dead ops go.
// RUN: kiln-opt %s -canonicalize -cse | FileCheck %s

// CHECK-LABEL: func.func @cse
// CHECK-NEXT: %[[M:.*]] = kiln.elementwise "mul" %arg0, %arg0
// CHECK-NEXT: %[[A:.*]] = kiln.elementwise "add" %[[M]], %[[M]]
// CHECK-NEXT: return %[[A]]
func.func @cse(%x: tensor<?xf32>) -> tensor<?xf32> {
  %0 = kiln.elementwise "mul" %x, %x : (tensor<?xf32>, tensor<?xf32>) -> tensor<?xf32>
  %1 = kiln.elementwise "mul" %x, %x : (tensor<?xf32>, tensor<?xf32>) -> tensor<?xf32>
  %2 = kiln.elementwise "add" %0, %1 : (tensor<?xf32>, tensor<?xf32>) -> tensor<?xf32>
  %dead = kiln.elementwise "exp" %2 : (tensor<?xf32>) -> tensor<?xf32>
  return %2 : tensor<?xf32>
}

// CHECK-LABEL: func.func @identity_views
// CHECK-NEXT: return %arg0
func.func @identity_views(%x: tensor<2x3xf32>) -> tensor<2x3xf32> {
  %0 = kiln.view "view" %x {dims = array<i64: 2, 3>} : (tensor<2x3xf32>) -> tensor<2x3xf32>
  %1 = kiln.view "transpose" %0 {dim = 1, dim1 = 1} : (tensor<2x3xf32>) -> tensor<2x3xf32>
  %2 = kiln.view "permute" %1 {dims = array<i64: 0, 1>} : (tensor<2x3xf32>) -> tensor<2x3xf32>
  return %2 : tensor<2x3xf32>
}

// CHECK-LABEL: func.func @real_views_stay
// CHECK: kiln.view "transpose"
func.func @real_views_stay(%x: tensor<2x3xf32>) -> tensor<3x2xf32> {
  %0 = kiln.view "transpose" %x {dim = 0, dim1 = 1} : (tensor<2x3xf32>) -> tensor<3x2xf32>
  return %0 : tensor<3x2xf32>
}

// CHECK-LABEL: func.func @constants
// CHECK-NEXT: %[[C:.*]] = kiln.constant dense<1.000000e+00> : tensor<4xf32> : tensor<4xf32>
// CHECK-NEXT: kiln.elementwise "add" %[[C]], %[[C]]
func.func @constants() -> tensor<4xf32> {
  %0 = kiln.constant dense<1.0> : tensor<4xf32> : tensor<4xf32>
  %1 = kiln.constant dense<1.0> : tensor<4xf32> : tensor<4xf32>
  %2 = kiln.elementwise "add" %0, %1 : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  return %2 : tensor<4xf32>
}
