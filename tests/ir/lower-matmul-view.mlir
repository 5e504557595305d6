// kiln.matmul (2-D) -> linalg.matmul into a zero fill; kiln.view transpose/permute ->
// linalg.transpose (addmm and the other views stay kiln ops for now: lower-to-linalg.mlir).
// RUN: kiln-opt %s --convert-kiln-to-linalg | FileCheck %s
// RUN: kiln-opt %s --convert-kiln-to-linalg \
// RUN: | mlir-opt --pass-pipeline='builtin.module(eliminate-empty-tensors,one-shot-bufferize{bufferize-function-boundaries function-boundary-type-conversion=identity-layout-map},buffer-deallocation-pipeline,func.func(convert-linalg-to-loops),convert-scf-to-cf,expand-strided-metadata,lower-affine,convert-to-llvm,reconcile-unrealized-casts)' \
// RUN: | mlir-translate --mlir-to-llvmir | FileCheck %s --check-prefix=LLVM

// LLVM: define {{.*}} @mm(

// CHECK-LABEL: func.func @mm
// CHECK-DAG: %[[ZERO:.*]] = arith.constant 0.000000e+00 : f32
// CHECK-DAG: %[[C0:.*]] = arith.constant 0 : index
// CHECK: %[[M:.*]] = tensor.dim %arg0, %[[C0]] : tensor<?x16xf32>
// CHECK: %[[E:.*]] = tensor.empty(%[[M]]) : tensor<?x32xf32>
// CHECK: %[[F:.*]] = linalg.fill ins(%[[ZERO]] : f32) outs(%[[E]] : tensor<?x32xf32>)
// CHECK: %[[R:.*]] = linalg.matmul ins(%arg0, %arg1 : tensor<?x16xf32>, tensor<16x32xf32>) outs(%[[F]] : tensor<?x32xf32>)
// CHECK: linalg.transpose ins(%[[R]] : tensor<?x32xf32>) outs(%{{.*}} : tensor<32x?xf32>) permutation = [1, 0]
// CHECK: linalg.transpose ins(%arg2 : tensor<2x?x4xf64>) outs(%{{.*}} : tensor<4x2x?xf64>) permutation = [2, 0, 1]
func.func @mm(%a: tensor<?x16xf32>, %b: tensor<16x32xf32>, %x: tensor<2x?x4xf64>) -> (tensor<32x?xf32>, tensor<4x2x?xf64>) {
  %0 = kiln.matmul "matmul" %a, %b : (tensor<?x16xf32>, tensor<16x32xf32>) -> tensor<?x32xf32>
  %1 = kiln.view "transpose" %0 {dim = -1} : (tensor<?x32xf32>) -> tensor<32x?xf32>
  %2 = kiln.view "permute" %x {dims = array<i64: 2, 0, 1>} : (tensor<2x?x4xf64>) -> tensor<4x2x?xf64>
  return %1, %2 : tensor<32x?xf32>, tensor<4x2x?xf64>
}
