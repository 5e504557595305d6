// Matmuls shaped for the runtime GEMM (codegen/lower.cpp, codegen/extern_calls.cpp):
// - x [..., M, K] @ w [K, N]: x collapsed to [M', K], one linalg.matmul, the result expanded;
// - a transpose of an operand's last two dims (nn::Linear's x @ W.t(), its backward's
//   g.t() @ x, attention's q @ k^T) is read in place by a transposed-map matmul, no copy;
// - kiln-extern-calls passes the transposes to the GEMM as trans_a / trans_b (the last two args).
// RUN: kiln-opt %s --convert-kiln-to-linalg --canonicalize | FileCheck %s
// RUN: kiln-opt %s --convert-kiln-to-linalg --canonicalize \
// RUN: | mlir-opt --pass-pipeline='builtin.module(eliminate-empty-tensors,one-shot-bufferize{bufferize-function-boundaries function-boundary-type-conversion=identity-layout-map})' \
// RUN: | kiln-opt --kiln-extern-calls | FileCheck %s --check-prefix=EXTERN
// RUN: kiln-opt %s --convert-kiln-to-linalg --canonicalize \
// RUN: | mlir-opt --pass-pipeline='builtin.module(eliminate-empty-tensors,one-shot-bufferize{bufferize-function-boundaries function-boundary-type-conversion=identity-layout-map})' \
// RUN: | kiln-opt --kiln-extern-calls \
// RUN: | mlir-opt --pass-pipeline='builtin.module(buffer-deallocation-pipeline,convert-bufferization-to-memref,func.func(convert-linalg-to-loops),convert-scf-to-cf,expand-strided-metadata,lower-affine,convert-to-llvm,reconcile-unrealized-casts)' \
// RUN: | mlir-translate --mlir-to-llvmir | FileCheck %s --check-prefix=LLVM

// CHECK-LABEL: func.func @linear
// CHECK-NOT: linalg.transpose
// CHECK: %[[X:.*]] = tensor.collapse_shape %arg0 {{\[}}[0, 1], [2]] : tensor<?x128x256xf32> into tensor<?x256xf32>
// CHECK: %[[MM:.*]] = linalg.matmul indexing_maps = [{{.*}}] ins(%[[X]], %arg1 : tensor<?x256xf32>, tensor<1024x256xf32>) outs(%{{.*}} : tensor<?x1024xf32>)
// CHECK: tensor.expand_shape %[[MM]] {{\[}}[0, 1], [2]] output_shape [%{{.*}}, 128, 1024] : tensor<?x1024xf32> into tensor<?x128x1024xf32>
// EXTERN-LABEL: func.func @linear
// EXTERN: memref.collapse_shape
// EXTERN: call @kiln_rt_gemm_f32({{.*}}, %c0{{[_0-9]*}}, %c0{{[_0-9]*}}, %c1{{[_0-9]*}}) :
// EXTERN-NOT: linalg.matmul
// EXTERN-NOT: linalg.transpose
func.func @linear(%x: tensor<?x128x256xf32>, %w: tensor<1024x256xf32>) -> tensor<?x128x1024xf32> {
  %wt = kiln.view "transpose" %w {dim = 0, dim1 = 1} : (tensor<1024x256xf32>) -> tensor<256x1024xf32>
  %y = kiln.matmul "matmul" %x, %wt : (tensor<?x128x256xf32>, tensor<256x1024xf32>) -> tensor<?x128x1024xf32>
  return %y : tensor<?x128x1024xf32>
}

// CHECK-LABEL: func.func @grad_w
// CHECK-NOT: linalg.transpose
// CHECK: linalg.matmul indexing_maps = [{{.*}}] ins(%arg0, %arg1 : tensor<64x32xf64>, tensor<64x16xf64>) outs(%{{.*}} : tensor<32x16xf64>)
// EXTERN-LABEL: func.func @grad_w
// EXTERN: call @kiln_rt_gemm_f64({{.*}}, %c0{{[_0-9]*}}, %c1{{[_0-9]*}}, %c0{{[_0-9]*}}) :
// EXTERN-NOT: linalg.matmul
// EXTERN-NOT: linalg.transpose
func.func @grad_w(%g: tensor<64x32xf64>, %x: tensor<64x16xf64>) -> tensor<32x16xf64> {
  %gt = kiln.view "transpose" %g {dim = -1} : (tensor<64x32xf64>) -> tensor<32x64xf64>
  %r = kiln.matmul "matmul" %gt, %x : (tensor<32x64xf64>, tensor<64x16xf64>) -> tensor<32x16xf64>
  return %r : tensor<32x16xf64>
}

// CHECK-LABEL: func.func @scores
// CHECK-NOT: linalg.transpose
// CHECK: linalg.batch_matmul indexing_maps = [{{.*}}] ins(%arg0, %arg1 : tensor<4x8x16xf32>, tensor<4x8x16xf32>) outs(%{{.*}} : tensor<4x8x8xf32>)
// EXTERN-LABEL: func.func @scores
// EXTERN: call @kiln_rt_gemm_f32({{.*}}, %c0{{[_0-9]*}}, %c0{{[_0-9]*}}, %c1{{[_0-9]*}}) :
// EXTERN-NOT: linalg.batch_matmul
func.func @scores(%q: tensor<4x8x16xf32>, %k: tensor<4x8x16xf32>) -> tensor<4x8x8xf32> {
  %kt = kiln.view "transpose" %k {dim = 1, dim1 = 2} : (tensor<4x8x16xf32>) -> tensor<4x16x8xf32>
  %s = kiln.matmul "matmul" %q, %kt : (tensor<4x8x16xf32>, tensor<4x16x8xf32>) -> tensor<4x8x8xf32>
  return %s : tensor<4x8x8xf32>
}

// Rank 4, the same batch dims ([B, H, T, D] attention): batch dims collapsed, one batch_matmul.
// CHECK-LABEL: func.func @heads
// CHECK-NOT: linalg.transpose
// CHECK: %[[Q:.*]] = tensor.collapse_shape %arg0 {{\[}}[0, 1], [2], [3]] : tensor<?x4x8x16xf32> into tensor<?x8x16xf32>
// CHECK: %[[K:.*]] = tensor.collapse_shape %arg1 {{\[}}[0, 1], [2], [3]] : tensor<?x4x8x16xf32> into tensor<?x8x16xf32>
// CHECK: %[[S:.*]] = linalg.batch_matmul indexing_maps = [{{.*}}] ins(%[[Q]], %[[K]] : tensor<?x8x16xf32>, tensor<?x8x16xf32>) outs(%{{.*}} : tensor<?x8x8xf32>)
// CHECK: tensor.expand_shape %[[S]] {{\[}}[0, 1], [2], [3]] output_shape [%{{.*}}, 4, 8, 8] : tensor<?x8x8xf32> into tensor<?x4x8x8xf32>
// EXTERN-LABEL: func.func @heads
// EXTERN: call @kiln_rt_gemm_f32({{.*}}, %c0{{[_0-9]*}}, %c0{{[_0-9]*}}, %c1{{[_0-9]*}}) :
// EXTERN-NOT: linalg.batch_matmul
func.func @heads(%q: tensor<?x4x8x16xf32>, %k: tensor<?x4x8x16xf32>) -> tensor<?x4x8x8xf32> {
  %kt = kiln.view "transpose" %k {dim = -2, dim1 = -1} : (tensor<?x4x8x16xf32>) -> tensor<?x4x16x8xf32>
  %s = kiln.matmul "matmul" %q, %kt : (tensor<?x4x8x16xf32>, tensor<?x4x16x8xf32>) -> tensor<?x4x8x8xf32>
  return %s : tensor<?x4x8x8xf32>
}

// Both operands transposed: (b^T a^T) with user-defined maps, both flags set.
// CHECK-LABEL: func.func @both
// CHECK-NOT: linalg.transpose
// EXTERN-LABEL: func.func @both
// EXTERN: call @kiln_rt_gemm_f32({{.*}}, %c0{{[_0-9]*}}, %c1{{[_0-9]*}}, %c1{{[_0-9]*}}) :
func.func @both(%a: tensor<5x3xf32>, %b: tensor<7x5xf32>) -> tensor<3x7xf32> {
  %at = kiln.view "transpose" %a {dim = 0, dim1 = 1} : (tensor<5x3xf32>) -> tensor<3x5xf32>
  %bt = kiln.view "transpose" %b {dim = 0, dim1 = 1} : (tensor<7x5xf32>) -> tensor<5x7xf32>
  %r = kiln.matmul "matmul" %at, %bt : (tensor<3x5xf32>, tensor<5x7xf32>) -> tensor<3x7xf32>
  return %r : tensor<3x7xf32>
}

// LLVM: declare void @kiln_rt_gemm_f32(i64, i64, i64, i64, i64, i64, i64, i64, i64, i64, i64, i64, i64, i64, i64, i64, i64, i64, i64, i64)
// LLVM-LABEL: define {{.*}} @linear(
// LLVM: call void @kiln_rt_gemm_f32(

// 2-D @ 3-D: a batch_matmul whose A has no batch dim (batch stride 0 in the GEMM call).
// CHECK-LABEL: func.func @shared_lhs
// CHECK: linalg.batch_matmul indexing_maps = [{{.*}}] ins(%arg0, %arg1 : tensor<5x3xf32>, tensor<4x3x7xf32>) outs(%{{.*}} : tensor<4x5x7xf32>)
// EXTERN-LABEL: func.func @shared_lhs
// EXTERN: call @kiln_rt_gemm_f32(
// EXTERN-NOT: linalg.batch_matmul
func.func @shared_lhs(%a: tensor<5x3xf32>, %b: tensor<4x3x7xf32>) -> tensor<4x5x7xf32> {
  %r = kiln.matmul "matmul" %a, %b : (tensor<5x3xf32>, tensor<4x3x7xf32>) -> tensor<4x5x7xf32>
  return %r : tensor<4x5x7xf32>
}
