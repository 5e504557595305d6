// kiln.reduce -> linalg.fill + linalg.generic with reduction iterators (codegen/lower.cpp).
// RUN: kiln-opt %s --convert-kiln-to-linalg | FileCheck %s
// RUN: kiln-opt %s --convert-kiln-to-linalg \
// RUN: | mlir-opt --pass-pipeline='builtin.module(eliminate-empty-tensors,one-shot-bufferize{bufferize-function-boundaries function-boundary-type-conversion=identity-layout-map},buffer-deallocation-pipeline,func.func(convert-linalg-to-loops),convert-scf-to-cf,expand-strided-metadata,lower-affine,convert-to-llvm,reconcile-unrealized-casts)' \
// RUN: | mlir-translate --mlir-to-llvmir | FileCheck %s --check-prefix=LLVM

// LLVM: define {{.*}} @reduce(

// CHECK-DAG: #[[ID:.*]] = affine_map<(d0, d1) -> (d0, d1)>
// CHECK-DAG: #[[KEEP:.*]] = affine_map<(d0, d1) -> (d0, 0)>
// CHECK-DAG: #[[COL:.*]] = affine_map<(d0, d1) -> (d1)>
// CHECK-DAG: #[[ALL:.*]] = affine_map<(d0, d1) -> ()>
// CHECK-DAG: #[[ROW:.*]] = affine_map<(d0, d1) -> (d0)>
// CHECK-LABEL: func.func @reduce
// mean over dim 1, keepdim: float32 summed in float64 (as eager), divided by the count (4),
// rounded to float32 once
// CHECK-DAG: %[[FOUR:.*]] = arith.constant 4.000000e+00 : f64
// CHECK-DAG: %[[NEGINF:.*]] = arith.constant 0xFF800000 : f32
// CHECK-DAG: %[[IMAX:.*]] = arith.constant 2147483647 : i32
// CHECK: %[[S:.*]] = linalg.generic {indexing_maps = [#[[ID]], #[[KEEP]]], iterator_types = ["parallel", "reduction"]}
// CHECK: arith.extf %{{.*}} : f32 to f64
// CHECK-NEXT: arith.addf {{.*}} fastmath<reassoc> {kiln_widened_float32_sum} : f64
// CHECK: linalg.generic
// CHECK: arith.divf %{{.*}}, %[[FOUR]] : f64
// CHECK-NEXT: arith.truncf %{{.*}} : f64 to f32
// amax over dim 0 keeps NaN (arith.maximumf), starting from -inf
// CHECK: linalg.fill ins(%[[NEGINF]] : f32)
// CHECK: linalg.generic {indexing_maps = [#[[ID]], #[[COL]]], iterator_types = ["reduction", "parallel"]}
// CHECK: arith.maximumf
// int32 sum accumulates in int64
// CHECK: linalg.generic {indexing_maps = [#[[ID]], #[[ALL]]], iterator_types = ["reduction", "reduction"]}
// CHECK: arith.extsi %{{.*}} : i32 to i64
// CHECK-NEXT: arith.addi
// CHECK: linalg.fill ins(%[[IMAX]] : i32)
// CHECK: linalg.generic {indexing_maps = [#[[ID]], #[[ROW]]], iterator_types = ["parallel", "reduction"]}
// CHECK: arith.minsi
func.func @reduce(%x: tensor<?x4xf32>, %i: tensor<3x5xi32>) -> (tensor<?x1xf32>, tensor<4xf32>, tensor<i64>, tensor<3xi32>) {
  %0 = kiln.reduce "mean" %x {dims = array<i64: 1>, keepdim} : (tensor<?x4xf32>) -> tensor<?x1xf32>
  %1 = kiln.reduce "amax" %x {dims = array<i64: 0>} : (tensor<?x4xf32>) -> tensor<4xf32>
  %2 = kiln.reduce "sum" %i : (tensor<3x5xi32>) -> tensor<i64>
  %3 = kiln.reduce "amin" %i {dims = array<i64: -1>} : (tensor<3x5xi32>) -> tensor<3xi32>
  return %0, %1, %2, %3 : tensor<?x1xf32>, tensor<4xf32>, tensor<i64>, tensor<3xi32>
}
