// kiln.random "dropout_mask": the Philox key is its operand (tensor<2xi64>: seed, offset), so
// the op is pure; lowered to one linalg.generic over the result that reads the key inside its
// body and runs Philox4x32-10's ten rounds per element (codegen/lower_random.cpp).
// RUN: kiln-opt %s | kiln-opt | FileCheck %s --check-prefix=ROUNDTRIP
// RUN: kiln-opt %s --convert-kiln-to-linalg | FileCheck %s

// ROUNDTRIP-LABEL: func.func @mask
// ROUNDTRIP: kiln.random "dropout_mask" %arg0 {p = 1.000000e-01 : f64} : (tensor<2xi64>) -> tensor<64x128xi1>
// CHECK-LABEL: func.func @mask
// CHECK: linalg.generic
// CHECK-SAME: outs(%{{.*}} : tensor<64x128xi1>)
// CHECK-COUNT-2: tensor.extract %arg0
// CHECK-COUNT-19: arith.mului_extended
// CHECK: arith.cmpi uge
// CHECK-NOT: kiln.random
func.func @mask(%key: tensor<2xi64>) -> tensor<64x128xi1> {
  %0 = kiln.random "dropout_mask" %key {p = 0.1 : f64} : (tensor<2xi64>) -> tensor<64x128xi1>
  return %0 : tensor<64x128xi1>
}

// A floating mask: 1 / (1 - p) where kept, else 0.
// CHECK-LABEL: func.func @scaled
// CHECK: arith.constant 2.000000e+00 : f32
// CHECK: arith.select
func.func @scaled(%key: tensor<2xi64>) -> tensor<7xf32> {
  %0 = kiln.random "dropout_mask" %key {p = 0.5 : f64} : (tensor<2xi64>) -> tensor<7xf32>
  return %0 : tensor<7xf32>
}
