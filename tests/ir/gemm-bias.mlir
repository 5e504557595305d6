// x @ w + bias (codegen/fusion.cpp, fold_addend_into_gemm): the addend is broadcast into the
// GEMM's C (a linalg.broadcast, or a linalg.copy for a full-size addend) and the matmul
// accumulates into it, so no add loop follows the GEMM; kiln-extern-calls then calls the GEMM
// with beta = 1 (the third-to-last argument) instead of 0. The init of a GEMM over collapsed
// rows is the result's own tensor.empty, collapsed, so that the GEMM's C can be the output. An
// add whose only user is an elementwise op is left to fuse into that op's loop instead.
// RUN: kiln-opt %s --convert-kiln-to-linalg --canonicalize --kiln-fuse-elementwise | FileCheck %s
// RUN: kiln-opt %s --convert-kiln-to-linalg --canonicalize --kiln-fuse-elementwise \
// RUN: | mlir-opt --pass-pipeline='builtin.module(eliminate-empty-tensors,one-shot-bufferize{bufferize-function-boundaries function-boundary-type-conversion=identity-layout-map})' \
// RUN: | kiln-opt --kiln-extern-calls | FileCheck %s --check-prefix=EXTERN
// GPU code (recompute-math) recomputes a bias add in every consumer that reads it element for
// element instead (codegen/fusion.cpp, kMaxLightOps), and head transposes fuse as generics.
// RUN: kiln-opt %s --convert-kiln-to-linalg --canonicalize --kiln-fuse-elementwise=recompute-math=true | FileCheck %s --check-prefix=GPU

// nn::Linear on [B, T, K] as traced: matmul, then add of the bias [N].
// CHECK-LABEL: func.func @linear_bias
// CHECK: %[[E:.*]] = tensor.empty(%{{.*}}) : tensor<?x128x1024xf32>
// CHECK: %[[C:.*]] = tensor.collapse_shape %[[E]] {{\[}}[0, 1], [2]] : tensor<?x128x1024xf32> into tensor<?x1024xf32>
// CHECK: %[[B:.*]] = linalg.broadcast ins(%arg2 : tensor<1024xf32>) outs(%[[C]] : tensor<?x1024xf32>) dimensions = [0]
// CHECK: %[[MM:.*]] = linalg.matmul indexing_maps = [{{.*}}] ins(%{{.*}}, %arg1 : tensor<?x256xf32>, tensor<1024x256xf32>) outs(%[[B]] : tensor<?x1024xf32>)
// CHECK: %[[R:.*]] = tensor.expand_shape %[[MM]] {{\[}}[0, 1], [2]]
// CHECK-NOT: linalg.generic
// CHECK-NOT: linalg.fill
// CHECK: return %[[R]]
// GPU-LABEL: func.func @linear_bias
// GPU: linalg.broadcast
// GPU: linalg.matmul
// EXTERN-LABEL: func.func @linear_bias
// EXTERN: linalg.broadcast
// EXTERN: call @kiln_rt_gemm_f32({{.*}}, %c1{{[_0-9]*}}, %c0{{[_0-9]*}}, %c1{{[_0-9]*}}) :
// EXTERN-NOT: linalg.generic
func.func @linear_bias(%x: tensor<?x128x256xf32>, %w: tensor<1024x256xf32>, %b: tensor<1024xf32>) -> tensor<?x128x1024xf32> {
  %wt = kiln.view "transpose" %w {dim = 0, dim1 = 1} : (tensor<1024x256xf32>) -> tensor<256x1024xf32>
  %y = kiln.matmul "matmul" %x, %wt : (tensor<?x128x256xf32>, tensor<256x1024xf32>) -> tensor<?x128x1024xf32>
  %z = kiln.elementwise "add" %y, %b : (tensor<?x128x1024xf32>, tensor<1024xf32>) -> tensor<?x128x1024xf32>
  return %z : tensor<?x128x1024xf32>
}

// addmm with alpha = beta = 1 (nn::Linear on 2-D input): the same; the bias first.
// CHECK-LABEL: func.func @addmm
// CHECK: %[[B:.*]] = linalg.broadcast ins(%arg0 : tensor<16xf64>) outs(%{{.*}} : tensor<8x16xf64>) dimensions = [0]
// CHECK: linalg.matmul indexing_maps = [{{.*}}] ins(%arg1, %arg2 : tensor<8x32xf64>, tensor<16x32xf64>) outs(%[[B]] : tensor<8x16xf64>)
// CHECK-NOT: linalg.generic
// EXTERN-LABEL: func.func @addmm
// EXTERN: call @kiln_rt_gemm_f64({{.*}}, %c1{{[_0-9]*}}, %c0{{[_0-9]*}}, %c1{{[_0-9]*}}) :
func.func @addmm(%b: tensor<16xf64>, %x: tensor<8x32xf64>, %w: tensor<16x32xf64>) -> tensor<8x16xf64> {
  %wt = kiln.view "transpose" %w {dim = 0, dim1 = 1} : (tensor<16x32xf64>) -> tensor<32x16xf64>
  %y = kiln.matmul "addmm" %b, %x, %wt : (tensor<16xf64>, tensor<8x32xf64>, tensor<32x16xf64>) -> tensor<8x16xf64>
  return %y : tensor<8x16xf64>
}

// gelu(x @ w + b), the add's only user an elementwise op: not folded (a broadcast loop writing
// C and the GEMM reading it back cost more); fusion puts the add into gelu's loop, which reads
// the bias and the GEMM's result.
// CHECK-LABEL: func.func @gelu_bias
// CHECK-NOT: linalg.broadcast
// CHECK: %[[MM:.*]] = linalg.matmul
// CHECK: linalg.generic {{.*}} ins(%arg2, %[[MM]] : tensor<64xf32>, tensor<32x64xf32>)
// CHECK: arith.addf
// CHECK: math.erf
func.func @gelu_bias(%x: tensor<32x16xf32>, %w: tensor<16x64xf32>, %b: tensor<64xf32>) -> tensor<32x64xf32> {
  %y = kiln.matmul "matmul" %x, %w : (tensor<32x16xf32>, tensor<16x64xf32>) -> tensor<32x64xf32>
  %z = kiln.elementwise "add" %b, %y : (tensor<64xf32>, tensor<32x64xf32>) -> tensor<32x64xf32>
  %g = kiln.elementwise "gelu" %z : (tensor<32x64xf32>) -> tensor<32x64xf32>
  return %g : tensor<32x64xf32>
}

// A full-size addend (a residual) is copied into C.
// CHECK-LABEL: func.func @residual
// CHECK: %[[C:.*]] = linalg.copy ins(%arg2 : tensor<32x64xf32>)
// CHECK: linalg.matmul {{.*}} outs(%[[C]] : tensor<32x64xf32>)
// CHECK-NOT: linalg.generic
func.func @residual(%x: tensor<32x16xf32>, %w: tensor<16x64xf32>, %r: tensor<32x64xf32>) -> tensor<32x64xf32> {
  %y = kiln.matmul "matmul" %x, %w : (tensor<32x16xf32>, tensor<16x64xf32>) -> tensor<32x64xf32>
  %z = kiln.elementwise "add" %y, %r : (tensor<32x64xf32>, tensor<32x64xf32>) -> tensor<32x64xf32>
  return %z : tensor<32x64xf32>
}

// Not folded: the product is an output too (it must stay the plain product), or the addend
// varies along the collapsed rows, or the add has alpha != 1 (a mul in the body).
// CHECK-LABEL: func.func @not_folded
// CHECK-NOT: linalg.broadcast
// CHECK-NOT: linalg.copy
// CHECK: return
func.func @not_folded(%x: tensor<4x8x16xf32>, %w: tensor<16x64xf32>, %b: tensor<64xf32>, %r: tensor<4x8x64xf32>) -> (tensor<4x8x64xf32>, tensor<4x8x64xf32>, tensor<4x8x64xf32>, tensor<4x8x64xf32>) {
  %y = kiln.matmul "matmul" %x, %w : (tensor<4x8x16xf32>, tensor<16x64xf32>) -> tensor<4x8x64xf32>
  %z = kiln.elementwise "add" %y, %b : (tensor<4x8x64xf32>, tensor<64xf32>) -> tensor<4x8x64xf32>
  %y2 = kiln.matmul "matmul" %x, %w : (tensor<4x8x16xf32>, tensor<16x64xf32>) -> tensor<4x8x64xf32>
  %z2 = kiln.elementwise "add" %y2, %r : (tensor<4x8x64xf32>, tensor<4x8x64xf32>) -> tensor<4x8x64xf32>
  %y3 = kiln.matmul "matmul" %x, %w : (tensor<4x8x16xf32>, tensor<16x64xf32>) -> tensor<4x8x64xf32>
  %z3 = kiln.elementwise "add" %y3, %b {alpha = 2.000000e+00 : f64} : (tensor<4x8x64xf32>, tensor<64xf32>) -> tensor<4x8x64xf32>
  return %y, %z, %z2, %z3 : tensor<4x8x64xf32>, tensor<4x8x64xf32>, tensor<4x8x64xf32>, tensor<4x8x64xf32>
}

// The biased product read by two elementwise ops (gelu's forward and a stand-in for its
// backward): the CPU folds the bias into the GEMM's C and both read the stored sum; GPU code
// keeps the GEMM's plain product and recomputes the add in both loops, saving the broadcast
// pass and the GEMM's read of C.
// CHECK-LABEL: func.func @two_users
// CHECK: linalg.broadcast
// CHECK: linalg.matmul
// GPU-LABEL: func.func @two_users
// GPU-NOT: linalg.broadcast
// GPU: %[[MM:.*]] = linalg.matmul
// GPU: linalg.generic {{.*}} ins(%[[MM]], %arg2 : tensor<32x64xf32>, tensor<64xf32>)
// GPU: arith.addf
// GPU: math.erf
// GPU: linalg.generic {{.*}} ins(%[[MM]], %arg2 : tensor<32x64xf32>, tensor<64xf32>)
// GPU: arith.addf
// GPU: arith.mulf
// GPU-NOT: linalg.generic
// GPU: return
func.func @two_users(%x: tensor<32x16xf32>, %w: tensor<16x64xf32>, %b: tensor<64xf32>) -> (tensor<32x64xf32>, tensor<32x64xf32>) {
  %y = kiln.matmul "matmul" %x, %w : (tensor<32x16xf32>, tensor<16x64xf32>) -> tensor<32x64xf32>
  %z = kiln.elementwise "add" %y, %b : (tensor<32x64xf32>, tensor<64xf32>) -> tensor<32x64xf32>
  %g = kiln.elementwise "gelu" %z : (tensor<32x64xf32>) -> tensor<32x64xf32>
  %s = kiln.elementwise "mul" %z, %z : (tensor<32x64xf32>, tensor<32x64xf32>) -> tensor<32x64xf32>
  return %g, %s : tensor<32x64xf32>, tensor<32x64xf32>
}

// Attention's query: (x @ w + b) split into heads, heads transposed before rows, scaled. The
// CPU folds the bias into C, and one loop reads C with the heads' permutation and scales (the
// transpose, read only by an elementwise op, is a generic fused with it); GPU code writes the
// GEMM's product and one loop reads it with the heads' permutation, adds the bias and scales.
// CHECK-LABEL: func.func @query_heads
// CHECK: linalg.broadcast
// CHECK-NOT: linalg.transpose
// CHECK: linalg.matmul
// CHECK-NOT: linalg.transpose
// CHECK: linalg.generic
// CHECK-SAME: iterator_types = ["parallel", "parallel", "parallel", "parallel"]
// CHECK-NOT: arith.addf
// CHECK: arith.mulf
// CHECK-NOT: linalg.generic
// CHECK: return
// GPU-LABEL: func.func @query_heads
// GPU-NOT: linalg.broadcast
// GPU-NOT: linalg.transpose
// GPU: linalg.matmul
// GPU: linalg.generic
// GPU-SAME: iterator_types = ["parallel", "parallel", "parallel", "parallel"]
// GPU: arith.addf
// GPU: arith.mulf
// GPU-NOT: linalg.generic
// GPU: return
func.func @query_heads(%x: tensor<4x8x64xf32>, %w: tensor<64x64xf32>, %b: tensor<64xf32>) -> tensor<4x2x8x32xf32> {
  %y = kiln.matmul "matmul" %x, %w : (tensor<4x8x64xf32>, tensor<64x64xf32>) -> tensor<4x8x64xf32>
  %z = kiln.elementwise "add" %y, %b : (tensor<4x8x64xf32>, tensor<64xf32>) -> tensor<4x8x64xf32>
  %h = kiln.view "view" %z {dims = array<i64: 4, 8, 2, 32>} : (tensor<4x8x64xf32>) -> tensor<4x8x2x32xf32>
  %t = kiln.view "transpose" %h {dim = 1 : i64, dim1 = 2 : i64} : (tensor<4x8x2x32xf32>) -> tensor<4x2x8x32xf32>
  %c = kiln.constant dense<1.250000e-01> : tensor<f32> : tensor<f32>
  %q = kiln.elementwise "mul" %t, %c : (tensor<4x2x8x32xf32>, tensor<f32>) -> tensor<4x2x8x32xf32>
  return %q : tensor<4x2x8x32xf32>
}
