// Views as values, batched/mixed matmul, addmm, integer and bool elementwise ops, any/argmax
// (codegen/lower.cpp), and float matmuls as calls to the runtime GEMM after bufferization
// (codegen/extern_calls.cpp).
// RUN: kiln-opt %s --convert-kiln-to-linalg | FileCheck %s
// RUN: kiln-opt %s --convert-kiln-to-linalg \
// RUN: | mlir-opt --pass-pipeline='builtin.module(one-shot-bufferize{bufferize-function-boundaries function-boundary-type-conversion=identity-layout-map})' \
// RUN: | kiln-opt --kiln-extern-calls | FileCheck %s --check-prefix=EXTERN
// RUN: kiln-opt %s --convert-kiln-to-linalg \
// RUN: | mlir-opt --pass-pipeline='builtin.module(eliminate-empty-tensors,one-shot-bufferize{bufferize-function-boundaries function-boundary-type-conversion=identity-layout-map})' \
// RUN: | kiln-opt --kiln-extern-calls \
// RUN: | mlir-opt --pass-pipeline='builtin.module(buffer-deallocation-pipeline,convert-bufferization-to-memref,func.func(convert-linalg-to-loops),convert-scf-to-cf,expand-strided-metadata,lower-affine,convert-to-llvm,reconcile-unrealized-casts)' \
// RUN: | mlir-translate --mlir-to-llvmir | FileCheck %s --check-prefix=LLVM

// CHECK-DAG: #[[SLICE:.*]] = affine_map<(d0, d1) -> (d0, d1 * 2 + 1)>
// CHECK-DAG: #[[SELECT:.*]] = affine_map<(d0) -> (3, d0)>
// CHECK-DAG: #[[BCAST:.*]] = affine_map<(d0, d1) -> (d0, 0)>
// CHECK-DAG: #[[UNSQ:.*]] = affine_map<(d0, d1, d2) -> (d0, d2)>
// CHECK-DAG: #[[SQ:.*]] = affine_map<(d0) -> (d0, 0)>

// CHECK-LABEL: func.func @views
// CHECK: linalg.generic {indexing_maps = [#[[SLICE]], {{.*}}ins(%arg0 : tensor<4x6xf32>) outs({{.*}} : tensor<4x2xf32>)
// CHECK: linalg.generic {indexing_maps = [#[[SELECT]], {{.*}}ins(%arg0 : tensor<4x6xf32>) outs({{.*}} : tensor<6xf32>)
// CHECK: linalg.generic {indexing_maps = [#[[BCAST]], {{.*}}ins(%arg1 : tensor<4x1xi32>) outs({{.*}} : tensor<4x5xi32>)
// CHECK: linalg.generic {indexing_maps = [#[[UNSQ]], {{.*}}outs({{.*}} : tensor<4x1x6xf32>)
// CHECK: linalg.generic {indexing_maps = [#[[SQ]], {{.*}}outs({{.*}} : tensor<4xi32>)
// CHECK: tensor.collapse_shape %arg0 {{\[}}[0, 1]] : tensor<4x6xf32> into tensor<24xf32>
// CHECK: %[[F:.*]] = tensor.collapse_shape %arg2 {{\[}}[0, 1]] : tensor<?x5xf64> into tensor<?xf64>
// CHECK: %[[N:.*]] = tensor.dim %[[F]]
// CHECK: %[[Q:.*]] = arith.divui %[[N]], %c5
// CHECK: tensor.expand_shape %[[F]] {{\[}}[0, 1]] output_shape [5, %[[Q]]] : tensor<?xf64> into tensor<5x?xf64>
// CHECK-NOT: kiln.
func.func @views(%x: tensor<4x6xf32>, %s: tensor<4x1xi32>, %d: tensor<?x5xf64>) -> (tensor<4x2xf32>, tensor<6xf32>, tensor<4x5xi32>, tensor<4x1x6xf32>, tensor<4xi32>, tensor<24xf32>, tensor<5x?xf64>) {
  %0 = kiln.view "slice" %x {dim = 1 : i64, start = 1 : i64, end = 5 : i64, step = 2 : i64} : (tensor<4x6xf32>) -> tensor<4x2xf32>
  %1 = kiln.view "select" %x {dim = 0 : i64, start = -1 : i64} : (tensor<4x6xf32>) -> tensor<6xf32>
  %2 = kiln.view "expand" %s {dims = array<i64: -1, 5>} : (tensor<4x1xi32>) -> tensor<4x5xi32>
  %3 = kiln.view "unsqueeze" %x {dim = 1 : i64} : (tensor<4x6xf32>) -> tensor<4x1x6xf32>
  %4 = kiln.view "squeeze" %s {dim = 1 : i64} : (tensor<4x1xi32>) -> tensor<4xi32>
  %5 = kiln.view "view" %x {dims = array<i64: 24>} : (tensor<4x6xf32>) -> tensor<24xf32>
  %6 = kiln.view "view" %d {dims = array<i64: 5, -1>} : (tensor<?x5xf64>) -> tensor<5x?xf64>
  return %0, %1, %2, %3, %4, %5, %6 : tensor<4x2xf32>, tensor<6xf32>, tensor<4x5xi32>, tensor<4x1x6xf32>, tensor<4xi32>, tensor<24xf32>, tensor<5x?xf64>
}

// CHECK-LABEL: func.func @matmuls
// CHECK: linalg.batch_matmul ins(%arg0, %arg1 : tensor<2x3x4xf32>, tensor<2x4x5xf32>)
// CHECK: linalg.generic {{.*}}iterator_types = ["parallel", "reduction"]} ins(%arg2, %arg3 : tensor<4xi32>, tensor<4x5xf64>)
// CHECK: arith.sitofp
// CHECK: arith.mulf
// CHECK: arith.addf
// CHECK: %[[MM:.*]] = linalg.matmul ins(%arg5, %arg6 : tensor<3x4xf32>, tensor<4x5xf32>)
// CHECK: linalg.generic {{.*}}ins(%arg4, %[[MM]] : tensor<5xf32>, tensor<3x5xf32>)
// CHECK: %[[P:.*]] = arith.mulf %{{.*}}, %cst_0
// CHECK: math.fma %cst, %in, %[[P]] : f32
// EXTERN-DAG: func.func private @kiln_rt_gemm_f32(index, index, index, index, index, index, index, index, index, index, index, index, index, index, index, index, index, index, index, index)
// The zero fill of C folds into the call: beta = 0 (then trans_a = trans_b = 0, the last two).
// EXTERN-LABEL: func.func @matmuls
// EXTERN: memref.extract_aligned_pointer_as_index
// EXTERN: call @kiln_rt_gemm_f32({{.*}}, %c0{{[_0-9]*}}, %c0{{[_0-9]*}}, %c0{{[_0-9]*}}) :
// EXTERN: linalg.fill
// EXTERN: linalg.generic
// EXTERN: call @kiln_rt_gemm_f32({{.*}}, %c0{{[_0-9]*}}, %c0{{[_0-9]*}}, %c0{{[_0-9]*}}) :
// EXTERN-NOT: linalg.matmul
// EXTERN-NOT: linalg.batch_matmul
// LLVM: declare void @kiln_rt_gemm_f32(i64, i64, i64, i64, i64, i64, i64, i64, i64, i64, i64, i64, i64, i64, i64, i64, i64, i64, i64, i64)
// LLVM: define {{.*}} @matmuls(
// LLVM: call void @kiln_rt_gemm_f32(
func.func @matmuls(%a: tensor<2x3x4xf32>, %b: tensor<2x4x5xf32>, %v: tensor<4xi32>, %m: tensor<4x5xf64>, %bias: tensor<5xf32>, %p: tensor<3x4xf32>, %q: tensor<4x5xf32>) -> (tensor<2x3x5xf32>, tensor<5xf64>, tensor<3x5xf32>) {
  %0 = kiln.matmul "matmul" %a, %b : (tensor<2x3x4xf32>, tensor<2x4x5xf32>) -> tensor<2x3x5xf32>
  %1 = kiln.matmul "matmul" %v, %m : (tensor<4xi32>, tensor<4x5xf64>) -> tensor<5xf64>
  %2 = kiln.matmul "addmm" %bias, %p, %q {alpha = 5.000000e-01 : f64, beta = 2.000000e+00 : f64} : (tensor<5xf32>, tensor<3x4xf32>, tensor<4x5xf32>) -> tensor<3x5xf32>
  return %0, %1, %2 : tensor<2x3x5xf32>, tensor<5xf64>, tensor<3x5xf32>
}

// Integer floor_divide never divides by 0 or -1 (selects around divsi); bool add = or via i32;
// any = or of x != 0; argmax carries (value, index) accumulators.
// CHECK-LABEL: func.func @ints
// CHECK: %[[BIG:.*]] = arith.constant 0x4B400000 : f32
// CHECK: %[[Z:.*]] = arith.cmpi eq, %[[B:.*]], %c0_i32
// CHECK: %[[M1:.*]] = arith.cmpi eq, %[[B]], %c-1_i32
// CHECK: %[[SP:.*]] = arith.ori %[[Z]], %[[M1]]
// CHECK: %[[SAFE:.*]] = arith.select %[[SP]], %c1_i32, %[[B]]
// CHECK: arith.divsi %{{.*}}, %[[SAFE]]
// CHECK: arith.extui %{{.*}} : i1 to i32
// CHECK: arith.addi
// CHECK: arith.cmpi ne
// CHECK: linalg.yield %{{.*}} : i1
// CHECK: arith.ori %{{.*}} : i1
// CHECK: linalg.generic {{.*}}outs(%{{.*}}, %{{.*}} : tensor<3xi32>, tensor<3xi64>)
// CHECK: linalg.index 1
// CHECK: arith.index_cast
// logsumexp: max, then exp(x - max) summed in f64, then log + max.
// CHECK: arith.cmpf ogt
// CHECK: arith.addf %{{.*}}, %[[BIG]] : f32
// CHECK: arith.extf %{{.*}} : f32 to f64
// CHECK: math.log %{{.*}} : f64
func.func @ints(%a: tensor<8xi32>, %b: tensor<8xi32>, %p: tensor<8xi1>, %q: tensor<8xi1>, %r: tensor<3x4xi32>, %f: tensor<3x4xf32>) -> (tensor<8xi32>, tensor<8xi1>, tensor<i1>, tensor<3xi64>, tensor<3xf32>) {
  %0 = kiln.elementwise "floor_divide" %a, %b : (tensor<8xi32>, tensor<8xi32>) -> tensor<8xi32>
  %1 = kiln.elementwise "add" %p, %q : (tensor<8xi1>, tensor<8xi1>) -> tensor<8xi1>
  %2 = kiln.reduce "any" %a : (tensor<8xi32>) -> tensor<i1>
  %3 = kiln.reduce "argmax" %r {dims = array<i64: 1>} : (tensor<3x4xi32>) -> tensor<3xi64>
  %4 = kiln.reduce "logsumexp" %f {dims = array<i64: 1>} : (tensor<3x4xf32>) -> tensor<3xf32>
  return %0, %1, %2, %3, %4 : tensor<8xi32>, tensor<8xi1>, tensor<i1>, tensor<3xi64>, tensor<3xf32>
}

// A slice from 0 with step 1 reads its prefix through tensor.extract_slice: the copy's map
// `0 + 1 * i` would fold to the plain dim `i`, which linalg takes as the input's full size (the
// [96] input would give the [32] copy 96 iterations; nn::MultiheadAttention's in-projection).
// CHECK-LABEL: func.func @prefix_slices
// CHECK: %[[W:.*]] = tensor.extract_slice %arg0[0, 0] [32, 32] [1, 1] : tensor<96x32xf32> to tensor<32x32xf32>
// CHECK: linalg.generic {indexing_maps = [#[[ID2:map[0-9]*]], #[[ID2]]], {{.*}}ins(%[[W]] : tensor<32x32xf32>)
// CHECK: %[[B:.*]] = tensor.extract_slice %arg1[0] [32] [1] : tensor<96xf32> to tensor<32xf32>
// CHECK: linalg.generic {{.*}}ins(%[[B]] : tensor<32xf32>)
// CHECK: %[[D:.*]] = tensor.dim %arg2, %c0
// CHECK: tensor.extract_slice %arg2[0, 0] [%[[D]], 0] [1, 1] : tensor<?x6xf32> to tensor<?x0xf32>
// CHECK: linalg.generic {{.*}}outs({{.*}} : tensor<?x3xf32>)
func.func @prefix_slices(%w: tensor<96x32xf32>, %b: tensor<96xf32>, %x: tensor<?x6xf32>) -> (tensor<32x32xf32>, tensor<32xf32>, tensor<?x0xf32>, tensor<?x3xf32>) {
  %0 = kiln.view "slice" %w {end = 32 : i64, start = 0 : i64, step = 1 : i64} : (tensor<96x32xf32>) -> tensor<32x32xf32>
  %1 = kiln.view "slice" %b {end = 32 : i64, start = 0 : i64, step = 1 : i64} : (tensor<96xf32>) -> tensor<32xf32>
  %2 = kiln.view "slice" %x {dim = 1 : i64, end = 0 : i64, start = 0 : i64, step = 1 : i64} : (tensor<?x6xf32>) -> tensor<?x0xf32>
  %3 = kiln.view "slice" %x {dim = 1 : i64, end = 6 : i64, start = 0 : i64, step = 2 : i64} : (tensor<?x6xf32>) -> tensor<?x3xf32>
  return %0, %1, %2, %3 : tensor<32x32xf32>, tensor<32xf32>, tensor<?x0xf32>, tensor<?x3xf32>
}
