// kiln-fuse-elementwise for GPU code (option recompute-math, codegen/fusion.cpp): a producer
// calling math functions is recomputed into each consumer when one is a reduction, instead of
// written to memory and read back (TorchInductor's looped softmax recomputes exp(x - max)).
// RUN: kiln-opt %s --convert-kiln-to-linalg --kiln-fuse-elementwise="recompute-math=true" | FileCheck %s

// softmax: max; sum of exp(x - max); exp(x - max) / sum. No loop nest stores e.
// CHECK-LABEL: func.func @softmax
// CHECK: %[[BIG:.*]] = arith.constant 0x4B400000 : f32
// CHECK: linalg.generic {{.*}}iterator_types = ["parallel", "reduction"]
// CHECK: arith.maximumf
// CHECK: linalg.generic {{.*}}iterator_types = ["parallel", "reduction"]
// CHECK: arith.subf
// CHECK: arith.addf %{{.*}}, %[[BIG]] : f32
// CHECK: linalg.generic {{.*}}iterator_types = ["parallel", "parallel"]
// CHECK: arith.subf
// CHECK: arith.addf %{{.*}}, %[[BIG]] : f32
// CHECK: arith.divf
// CHECK-NOT: linalg.generic
// CHECK: return
func.func @softmax(%x: tensor<?x1024xf32>) -> tensor<?x1024xf32> {
  %m = kiln.reduce "amax" %x {dims = array<i64: 1>, keepdim} : (tensor<?x1024xf32>) -> tensor<?x1xf32>
  %d = kiln.elementwise "sub" %x, %m : (tensor<?x1024xf32>, tensor<?x1xf32>) -> tensor<?x1024xf32>
  %e = kiln.elementwise "exp" %d : (tensor<?x1024xf32>) -> tensor<?x1024xf32>
  %s = kiln.reduce "sum" %e {dims = array<i64: 1>, keepdim} : (tensor<?x1024xf32>) -> tensor<?x1xf32>
  %y = kiln.elementwise "div" %e, %s : (tensor<?x1024xf32>, tensor<?x1xf32>) -> tensor<?x1024xf32>
  return %y : tensor<?x1024xf32>
}
