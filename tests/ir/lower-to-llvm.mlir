// The lowered kiln IR goes all the way to LLVM IR with upstream tools (the pipeline of
// /work/shared/notes/mlir22-toolchain.md): one fused loop doing mul, add, tanh.
// RUN: kiln-opt %s --convert-kiln-to-linalg \
// RUN: | mlir-opt --pass-pipeline='builtin.module(func.func(linalg-fuse-elementwise-ops),eliminate-empty-tensors,one-shot-bufferize{bufferize-function-boundaries function-boundary-type-conversion=identity-layout-map},buffer-deallocation-pipeline,func.func(convert-linalg-to-loops),convert-scf-to-cf,expand-strided-metadata,lower-affine,convert-to-llvm,reconcile-unrealized-casts)' \
// RUN: | mlir-translate --mlir-to-llvmir | FileCheck %s

// CHECK-LABEL: define {{.*}} @ew(
// CHECK: fmul float
// CHECK-NEXT: fadd float
// CHECK-NEXT: call float @llvm.tanh.f32
// CHECK-NOT: fmul
// CHECK: ret
func.func @ew(%x: tensor<?xf32>, %y: tensor<?xf32>) -> tensor<?xf32> {
  %0 = kiln.elementwise "mul" %x, %y : (tensor<?xf32>, tensor<?xf32>) -> tensor<?xf32>
  %1 = kiln.elementwise "add" %0, %x : (tensor<?xf32>, tensor<?xf32>) -> tensor<?xf32>
  %2 = kiln.elementwise "tanh" %1 : (tensor<?xf32>) -> tensor<?xf32>
  return %2 : tensor<?xf32>
}
