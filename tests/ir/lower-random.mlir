// kiln.random "dropout_mask": the Philox key is its operand (tensor<2xi64>: seed, offset), so
// the op is pure; lowered to one linalg.generic over the result that reads the key inside its
// body and runs Philox4x32-10's ten rounds per element (codegen/lower_random.cpp).
// rand, randn and randint (`low`, `high`) follow eager's counter layout and formulas.
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

// rand (float32, [-2.5, 3)): u = the top 24 bits of word 2i times 2^-24; low + span * u.
// ROUNDTRIP-LABEL: func.func @rand
// ROUNDTRIP: kiln.random "rand" %arg0 {high = 3.000000e+00 : f64, low = -2.500000e+00 : f64, p = 0.000000e+00 : f64}
// CHECK-LABEL: func.func @rand
// CHECK-DAG: %[[SPAN:.*]] = arith.constant 5.500000e+00 : f32
// CHECK-DAG: %[[LOW:.*]] = arith.constant -2.500000e+00 : f32
// CHECK: %[[TOP:.*]] = arith.shrui %{{.*}}, %{{.*}} : i32
// CHECK: %[[F:.*]] = arith.uitofp %[[TOP]] : i32 to f32
// CHECK: %[[U:.*]] = arith.mulf %[[F]], %{{.*}} : f32
// CHECK: %[[S:.*]] = arith.mulf %[[U]], %[[SPAN]] : f32
// CHECK: arith.addf %[[S]], %[[LOW]] : f32
func.func @rand(%key: tensor<2xi64>) -> tensor<5x3xf32> {
  %0 = kiln.random "rand" %key {p = 0.0 : f64, low = -2.5 : f64, high = 3.0 : f64} : (tensor<2xi64>) -> tensor<5x3xf32>
  return %0 : tensor<5x3xf32>
}

// randn: Box-Muller in float64 from the element's four words, then rounded to float32.
// CHECK-LABEL: func.func @randn
// CHECK: math.log %{{.*}} : f64
// CHECK: math.sqrt %{{.*}} : f64
// CHECK: math.cos %{{.*}} : f64
// CHECK: arith.truncf %{{.*}} : f64 to f32
func.func @randn(%key: tensor<2xi64>) -> tensor<9xf32> {
  %0 = kiln.random "randn" %key {p = 0.0 : f64, low = 0.0 : f64, high = 1.0 : f64} : (tensor<2xi64>) -> tensor<9xf32>
  return %0 : tensor<9xf32>
}

// randint (int64, [-7, 100)): low + the high half of the 64-bit word pair times 107.
// CHECK-LABEL: func.func @randint
// CHECK-DAG: %[[RANGE:.*]] = arith.constant 107 : i64
// CHECK: %[[LO:.*]], %[[HI:.*]] = arith.mului_extended %{{.*}}, %[[RANGE]] : i64
// CHECK: arith.addi %[[HI]], %{{.*}} : i64
func.func @randint(%key: tensor<2xi64>) -> tensor<4xi64> {
  %0 = kiln.random "randint" %key {p = 0.0 : f64, low = -7 : i64, high = 100 : i64} : (tensor<2xi64>) -> tensor<4xi64>
  return %0 : tensor<4xi64>
}
