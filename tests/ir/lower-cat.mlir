// cat (kiln.shape "cat") lowered to a tensor.empty of the result and one tensor.insert_slice
// per input at its offset along `dim` (codegen/lower.cpp LowerCat), static and dynamic sizes.
// RUN: kiln-opt %s --convert-kiln-to-linalg | FileCheck %s
// RUN: kiln-opt %s | kiln-opt | FileCheck %s --check-prefix=ROUND

// ROUND-LABEL: func.func @cat_rows
// ROUND: kiln.shape "cat" %arg0, %arg1 {dim = 0 : i64}
// CHECK-LABEL: func.func @cat_rows
// CHECK: %[[E:.*]] = tensor.empty() : tensor<5x4xf32>
// CHECK: %[[A:.*]] = tensor.insert_slice %arg0 into %[[E]][0, 0] [2, 4] [1, 1] : tensor<2x4xf32> into tensor<5x4xf32>
// CHECK: %[[B:.*]] = tensor.insert_slice %arg1 into %[[A]][2, 0] [3, 4] [1, 1] : tensor<3x4xf32> into tensor<5x4xf32>
// CHECK: return %[[B]]
func.func @cat_rows(%a: tensor<2x4xf32>, %b: tensor<3x4xf32>) -> tensor<5x4xf32> {
  %0 = kiln.shape "cat" %a, %b {dim = 0 : i64} : (tensor<2x4xf32>, tensor<3x4xf32>) -> tensor<5x4xf32>
  return %0 : tensor<5x4xf32>
}

// Along the last dim (dim = -1) of inputs with a `?` batch: the result's `?` is the first input's.
// CHECK-LABEL: func.func @cat_last_dim
// CHECK: %[[N:.*]] = tensor.dim %arg0, %c0 : tensor<?x4xf32>
// CHECK: %[[E:.*]] = tensor.empty(%[[N]]) : tensor<?x6xf32>
// CHECK: tensor.insert_slice %arg0 into %[[E]][0, 0] [%{{.*}}, 4] [1, 1]
// CHECK: tensor.insert_slice %arg1 into %{{.*}}[0, 4] [%{{.*}}, 2] [1, 1]
func.func @cat_last_dim(%a: tensor<?x4xf32>, %b: tensor<?x2xf32>) -> tensor<?x6xf32> {
  %0 = kiln.shape "cat" %a, %b {dim = -1 : i64} : (tensor<?x4xf32>, tensor<?x2xf32>) -> tensor<?x6xf32>
  return %0 : tensor<?x6xf32>
}

// Along a `?` dim: the result's size and the second offset are sums of the inputs' sizes.
// CHECK-LABEL: func.func @cat_dynamic_dim
// CHECK: %[[N:.*]] = tensor.dim %arg0, %c0 : tensor<?x4xi64>
// CHECK: %[[T:.*]] = arith.addi %[[N]], %c3 : index
// CHECK: %[[E:.*]] = tensor.empty(%[[T]]) : tensor<?x4xi64>
// CHECK: tensor.insert_slice %arg1 into %{{.*}}[%{{.*}}, 0] [3, 4] [1, 1] : tensor<3x4xi64> into tensor<?x4xi64>
func.func @cat_dynamic_dim(%a: tensor<?x4xi64>, %b: tensor<3x4xi64>) -> tensor<?x4xi64> {
  %0 = kiln.shape "cat" %a, %b {dim = 0 : i64} : (tensor<?x4xi64>, tensor<3x4xi64>) -> tensor<?x4xi64>
  return %0 : tensor<?x4xi64>
}

// More than 32 inputs: one tensor.concat (one-shot bufferization's analysis of a long chain
// of insert_slices grew faster than n^3: a stack of 200 RNN states took 203 s to compile).
// CHECK-LABEL: func.func @cat_many
// CHECK-NOT: tensor.insert_slice
// CHECK: %[[C:.*]] = tensor.concat dim(1) %arg0, %arg1, %arg0, {{.*}} -> tensor<?x66xf32>
// CHECK-NOT: tensor.insert_slice
// CHECK: return %[[C]]
func.func @cat_many(%a: tensor<?x2xf32>, %b: tensor<?x2xf32>) -> tensor<?x66xf32> {
  %0 = kiln.shape "cat"
      %a, %b, %a, %b, %a, %b, %a, %b, %a, %b, %a, %b, %a, %b, %a, %b, %a, %b, %a, %b, %a, %b,
      %a, %b, %a, %b, %a, %b, %a, %b, %a, %b, %a
      {dim = 1 : i64} :
      (tensor<?x2xf32>, tensor<?x2xf32>, tensor<?x2xf32>, tensor<?x2xf32>, tensor<?x2xf32>,
       tensor<?x2xf32>, tensor<?x2xf32>, tensor<?x2xf32>, tensor<?x2xf32>, tensor<?x2xf32>,
       tensor<?x2xf32>, tensor<?x2xf32>, tensor<?x2xf32>, tensor<?x2xf32>, tensor<?x2xf32>,
       tensor<?x2xf32>, tensor<?x2xf32>, tensor<?x2xf32>, tensor<?x2xf32>, tensor<?x2xf32>,
       tensor<?x2xf32>, tensor<?x2xf32>, tensor<?x2xf32>, tensor<?x2xf32>, tensor<?x2xf32>,
       tensor<?x2xf32>, tensor<?x2xf32>, tensor<?x2xf32>, tensor<?x2xf32>, tensor<?x2xf32>,
       tensor<?x2xf32>, tensor<?x2xf32>, tensor<?x2xf32>)
      -> tensor<?x66xf32>
  return %0 : tensor<?x66xf32>
}
