// kiln-fuse-elementwise (codegen/fusion.cpp): kernels counted after fusion.
// RUN: kiln-opt %s --convert-kiln-to-linalg --kiln-fuse-elementwise | FileCheck %s
// RUN: kiln-opt %s --convert-kiln-to-linalg --linalg-fuse-elementwise-ops | FileCheck %s --check-prefix=UPSTREAM

// x*x + x, then tanh: one loop nest.
// CHECK-LABEL: func.func @chain
// CHECK-COUNT-1: linalg.generic
// CHECK-NOT: linalg.generic
// CHECK: return
func.func @chain(%x: tensor<?x4xf32>) -> tensor<?x4xf32> {
  %0 = kiln.elementwise "mul" %x, %x : (tensor<?x4xf32>, tensor<?x4xf32>) -> tensor<?x4xf32>
  %1 = kiln.elementwise "add" %0, %x : (tensor<?x4xf32>, tensor<?x4xf32>) -> tensor<?x4xf32>
  %2 = kiln.elementwise "tanh" %1 : (tensor<?x4xf32>) -> tensor<?x4xf32>
  return %2 : tensor<?x4xf32>
}

// softmax written out: e = exp(x - max) feeds both the sum and the divide. A transcendental is
// computed once and stored (as eager does): max; e; sum of e; divide. x - max is fused into e.
// CHECK-LABEL: func.func @softmax
// CHECK: linalg.generic {{.*}}iterator_types = ["parallel", "reduction"]
// CHECK: arith.maximumf
// CHECK: linalg.generic {{.*}}iterator_types = ["parallel", "parallel"]
// CHECK: arith.subf
// CHECK: arith.select
// CHECK: arith.select
// CHECK-NEXT: arith.mulf
// CHECK-NEXT: math.roundeven
// CHECK: linalg.generic {{.*}}iterator_types = ["parallel", "reduction"]
// CHECK: linalg.generic {{.*}}iterator_types = ["parallel", "parallel"]
// CHECK-NOT: math.roundeven
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

// layer_norm's centring: d = x - mean feeds the sum of squares and the output. kiln recomputes
// the cheap d in both consumers (d is never stored): sum; sum of squares; output (each float32
// sum accumulates in float64 and is rounded once by a small [?, 1] loop).
// Upstream fuses d into neither (it has two uses) and keeps it as a loop nest of its own.
// CHECK-LABEL: func.func @centred
// CHECK: linalg.generic {{.*}}iterator_types = ["parallel", "reduction"]
// CHECK: arith.extf
// CHECK: linalg.generic {{.*}}iterator_types = ["parallel", "parallel"]
// CHECK: arith.truncf
// CHECK: linalg.generic {{.*}}iterator_types = ["parallel", "reduction"]
// CHECK: arith.subf
// CHECK: arith.mulf
// CHECK: linalg.generic {{.*}}iterator_types = ["parallel", "parallel"]
// CHECK: arith.truncf
// CHECK: linalg.generic {{.*}}iterator_types = ["parallel", "parallel"]
// CHECK: arith.subf
// CHECK: arith.mulf
// CHECK-NOT: linalg.generic
// CHECK: return
// UPSTREAM-LABEL: func.func @centred
// UPSTREAM-COUNT-5: linalg.generic
// UPSTREAM-NOT: linalg.generic
func.func @centred(%x: tensor<?x1024xf32>, %r: tensor<?x1xf32>) -> (tensor<?x1024xf32>, tensor<?x1xf32>) {
  %m = kiln.reduce "mean" %x {dims = array<i64: 1>, keepdim} : (tensor<?x1024xf32>) -> tensor<?x1xf32>
  %d = kiln.elementwise "sub" %x, %m : (tensor<?x1024xf32>, tensor<?x1xf32>) -> tensor<?x1024xf32>
  %sq = kiln.elementwise "mul" %d, %d : (tensor<?x1024xf32>, tensor<?x1024xf32>) -> tensor<?x1024xf32>
  %v = kiln.reduce "sum" %sq {dims = array<i64: 1>, keepdim} : (tensor<?x1024xf32>) -> tensor<?x1xf32>
  %y = kiln.elementwise "mul" %d, %r : (tensor<?x1024xf32>, tensor<?x1xf32>) -> tensor<?x1024xf32>
  return %y, %v : tensor<?x1024xf32>, tensor<?x1xf32>
}
