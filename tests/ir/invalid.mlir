// Verifier errors: the dialect calls core's infer_meta, so messages are eager mode's.
// RUN: kiln-opt %s -split-input-file -verify-diagnostics

func.func @bad_broadcast(%a: tensor<2x3xf32>, %b: tensor<4xf32>) -> tensor<2x3xf32> {
  // expected-error @+1 {{'kiln.elementwise' op add: }}
  %0 = kiln.elementwise "add" %a, %b : (tensor<2x3xf32>, tensor<4xf32>) -> tensor<2x3xf32>
  return %0 : tensor<2x3xf32>
}

// -----

func.func @unknown_kind(%a: tensor<3xf32>) -> tensor<3xf32> {
  // expected-error @+1 {{unknown op kind "frobnicate"}}
  %0 = kiln.elementwise "frobnicate" %a : (tensor<3xf32>) -> tensor<3xf32>
  return %0 : tensor<3xf32>
}

// -----

func.func @wrong_category(%a: tensor<3xf32>) -> tensor<f32> {
  // expected-error @+1 {{op kind "sum" belongs to kiln.reduce}}
  %0 = kiln.elementwise "sum" %a : (tensor<3xf32>) -> tensor<f32>
  return %0 : tensor<f32>
}

// -----

func.func @wrong_arity(%a: tensor<3xf32>) -> tensor<3xf32> {
  // expected-error @+1 {{add: expects 2 tensor inputs, got 1}}
  %0 = kiln.elementwise "add" %a : (tensor<3xf32>) -> tensor<3xf32>
  return %0 : tensor<3xf32>
}

// -----

func.func @wrong_dtype(%a: tensor<3xi32>) -> tensor<3xi32> {
  // expected-error @+1 {{result type 'tensor<3xi32>' does not match the type 'tensor<3xf32>' inferred for "exp"}}
  %0 = kiln.elementwise "exp" %a : (tensor<3xi32>) -> tensor<3xi32>
  return %0 : tensor<3xi32>
}

// -----

func.func @wrong_shape(%a: tensor<3xf32>, %b: tensor<2x1xf32>) -> tensor<3xf32> {
  // expected-error @+1 {{does not match the type 'tensor<2x3xf32>' inferred for "mul"}}
  %0 = kiln.elementwise "mul" %a, %b : (tensor<3xf32>, tensor<2x1xf32>) -> tensor<3xf32>
  return %0 : tensor<3xf32>
}

// -----

func.func @bool_neg(%a: tensor<3xi1>) -> tensor<3xi1> {
  // expected-error @+1 {{'kiln.elementwise' op neg: }}
  %0 = kiln.elementwise "neg" %a : (tensor<3xi1>) -> tensor<3xi1>
  return %0 : tensor<3xi1>
}

// -----

func.func @matmul_mismatch(%a: tensor<2x3xf32>, %b: tensor<4x5xf32>) -> tensor<2x5xf32> {
  // expected-error @+1 {{matmul: shapes [2, 3] and [4, 5] cannot be multiplied (3 != 4)}}
  %0 = kiln.matmul "matmul" %a, %b : (tensor<2x3xf32>, tensor<4x5xf32>) -> tensor<2x5xf32>
  return %0 : tensor<2x5xf32>
}

// -----

func.func @mean_of_int(%a: tensor<3xi64>) -> tensor<i64> {
  // expected-error @+1 {{mean: input dtype must be floating point, got int64}}
  %0 = kiln.reduce "mean" %a : (tensor<3xi64>) -> tensor<i64>
  return %0 : tensor<i64>
}

// -----

func.func @bad_constant() -> tensor<2xf32> {
  // expected-error @+1 {{value type 'tensor<3xf32>' differs from result type 'tensor<2xf32>'}}
  %0 = kiln.constant dense<[1.0, 2.0, 3.0]> : tensor<3xf32> : tensor<2xf32>
  return %0 : tensor<2xf32>
}

// -----

func.func @composite_wrong_category(%a: tensor<3xf32>) -> tensor<3xf32> {
  // expected-error @+1 {{op kind "exp" belongs to kiln.elementwise}}
  %0 = kiln.composite "exp" %a : (tensor<3xf32>) -> tensor<3xf32>
  return %0 : tensor<3xf32>
}

// -----

func.func @layer_norm_shape(%x: tensor<2x8xf32>) -> tensor<2x8xf32> {
  // expected-error @+1 {{layer_norm: normalized_shape [4] does not match the last dims of input [2, 8]}}
  %0 = kiln.composite "layer_norm" %x {dims = array<i64: 4>, eps = 1.0e-5 : f64} : (tensor<2x8xf32>) -> tensor<2x8xf32>
  return %0 : tensor<2x8xf32>
}

// -----

func.func @nll_loss_target(%x: tensor<2x8xf32>, %t: tensor<2xf32>) -> tensor<f32> {
  // expected-error @+1 {{nll_loss: target must be int64 or int32, got float32}}
  %0 = kiln.composite "nll_loss" %x, %t {mode = 1} : (tensor<2x8xf32>, tensor<2xf32>) -> tensor<f32>
  return %0 : tensor<f32>
}

// -----

func.func @cast_without_dtype(%a: tensor<3xf32>) -> tensor<3xi32> {
  // expected-error @+1 {{"to" needs its target element type in `dtype`}}
  %0 = kiln.elementwise "to" %a : (tensor<3xf32>) -> tensor<3xi32>
  return %0 : tensor<3xi32>
}

// -----

func.func @cast_result_not_dtype(%a: tensor<3xf32>) -> tensor<3xi32> {
  // expected-error @+1 {{does not match the type 'tensor<3xi64>' inferred for "to"}}
  %0 = kiln.elementwise "to" %a {dtype = i64} : (tensor<3xf32>) -> tensor<3xi32>
  return %0 : tensor<3xi32>
}

// -----

func.func @one_hot_int32(%a: tensor<3xi32>) -> tensor<3x4xi64> {
  // expected-error @+1 {{one_hot: indices must be int64, got int32}}
  %0 = kiln.index "one_hot" %a {mode = 4 : i64} : (tensor<3xi32>) -> tensor<3x4xi64>
  return %0 : tensor<3x4xi64>
}

// -----

func.func @one_hot_wrong_classes(%a: tensor<3xi64>) -> tensor<3x4xi64> {
  // expected-error @+1 {{does not match the type 'tensor<3x5xi64>' inferred for "one_hot"}}
  %0 = kiln.index "one_hot" %a {mode = 5 : i64} : (tensor<3xi64>) -> tensor<3x4xi64>
  return %0 : tensor<3x4xi64>
}

// -----

func.func @dropout_not_covered(%k: tensor<2xi64>) -> tensor<3xf32> {
  // expected-error @+1 {{op kind "dropout" belongs to no kiln op yet}}
  %0 = kiln.random "dropout" %k {p = 0.5 : f64} : (tensor<2xi64>) -> tensor<3xf32>
  return %0 : tensor<3xf32>
}

// -----

func.func @scatter_add_index_too_large(%a: tensor<3xf32>, %i: tensor<4xi64>) -> tensor<3xf32> {
  // expected-error @+1 {{index's size in dim 0 (4) exceeds the source's (3)}}
  %0 = kiln.index "scatter_add" %a, %i, %a : (tensor<3xf32>, tensor<4xi64>, tensor<3xf32>) -> tensor<3xf32>
  return %0 : tensor<3xf32>
}

// -----

func.func @gather_float_index(%a: tensor<3xf32>, %i: tensor<3xf32>) -> tensor<3xf32> {
  // expected-error @+1 {{gather: indices must be int64 or int32, got float32}}
  %0 = kiln.index "gather" %a, %i : (tensor<3xf32>, tensor<3xf32>) -> tensor<3xf32>
  return %0 : tensor<3xf32>
}

// -----

func.func @random_key(%k: tensor<3xi64>) -> tensor<4xi1> {
  // expected-error @+1 {{dropout_mask: takes one key operand, tensor<2xi64> (seed, offset)}}
  %0 = kiln.random "dropout_mask" %k {p = 0.5 : f64} : (tensor<3xi64>) -> tensor<4xi1>
  return %0 : tensor<4xi1>
}

// -----

func.func @random_dtype(%k: tensor<2xi64>) -> tensor<4xi32> {
  // expected-error @+1 {{dtype must be floating point or bool}}
  %0 = kiln.random "dropout_mask" %k {p = 0.5 : f64} : (tensor<2xi64>) -> tensor<4xi32>
  return %0 : tensor<4xi32>
}
