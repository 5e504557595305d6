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
// CHECK: %[[BIG:.*]] = arith.constant 0x4B400000 : f32
// CHECK: linalg.generic {{.*}}iterator_types = ["parallel", "reduction"]
// CHECK: arith.maximumf
// CHECK: linalg.generic {{.*}}iterator_types = ["parallel", "parallel"]
// CHECK: arith.subf
// CHECK: arith.select
// CHECK: arith.select
// CHECK-NEXT: arith.mulf
// CHECK-NEXT: arith.addf %{{.*}}, %[[BIG]] : f32
// CHECK: linalg.generic {{.*}}iterator_types = ["parallel", "reduction"]
// CHECK: linalg.generic {{.*}}iterator_types = ["parallel", "parallel"]
// CHECK-NOT: %[[BIG]]
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

// A residual add h = a + b * 1.25 before layer_norm's centring: recomputing h inside a
// consumer would read two floats per element where the stored h is one, so h is stored once and
// both sums and the output read it (before, each reduction re-read a and b, and in the
// Transformer step each layer_norm's loops re-read every tensor back to the previous one).
// CHECK-LABEL: func.func @residual_centred
// CHECK: %[[H:.*]] = linalg.generic {{.*}}iterator_types = ["parallel", "parallel"]} ins(%arg0, %arg1 :
// CHECK: arith.mulf
// CHECK: arith.addf
// CHECK: linalg.generic {{.*}}iterator_types = ["parallel", "reduction"]} ins(%[[H]] : tensor<?x256xf32>)
// CHECK: linalg.generic {{.*}}iterator_types = ["parallel", "parallel"]}
// CHECK: linalg.generic {{.*}}iterator_types = ["parallel", "reduction"]} ins(%[[H]], %{{.*}} : tensor<?x256xf32>, tensor<?x1xf32>)
// CHECK: arith.subf
// CHECK: linalg.generic {{.*}}iterator_types = ["parallel", "parallel"]}
// CHECK: linalg.generic {{.*}}iterator_types = ["parallel", "parallel"]} ins(%[[H]], %{{.*}}, %arg2 :
// CHECK-NOT: linalg.generic
// CHECK: return
// UPSTREAM-LABEL: func.func @residual_centred
func.func @residual_centred(%a: tensor<?x256xf32>, %b: tensor<?x256xf32>, %r: tensor<?x1xf32>) -> (tensor<?x256xf32>, tensor<?x1xf32>) {
  %c = kiln.constant dense<1.25> : tensor<f32> : tensor<f32>
  %bs = kiln.elementwise "mul" %b, %c : (tensor<?x256xf32>, tensor<f32>) -> tensor<?x256xf32>
  %h = kiln.elementwise "add" %a, %bs : (tensor<?x256xf32>, tensor<?x256xf32>) -> tensor<?x256xf32>
  %m = kiln.reduce "mean" %h {dims = array<i64: 1>, keepdim} : (tensor<?x256xf32>) -> tensor<?x1xf32>
  %d = kiln.elementwise "sub" %h, %m : (tensor<?x256xf32>, tensor<?x1xf32>) -> tensor<?x256xf32>
  %sq = kiln.elementwise "mul" %d, %d : (tensor<?x256xf32>, tensor<?x256xf32>) -> tensor<?x256xf32>
  %v = kiln.reduce "sum" %sq {dims = array<i64: 1>, keepdim} : (tensor<?x256xf32>) -> tensor<?x1xf32>
  %y = kiln.elementwise "mul" %d, %r : (tensor<?x256xf32>, tensor<?x1xf32>) -> tensor<?x256xf32>
  return %y, %v : tensor<?x256xf32>, tensor<?x1xf32>
}

// AdamW's update of one parameter: the new moments m and v are returned and read again by the
// parameter's update. kiln computes all three in one loop nest with three results (m and v are
// stored once, not re-read); upstream stores m and v from loops of their own and reads them back.
// CHECK-LABEL: func.func @adamw_moments
// CHECK: %[[U:.*]]:3 = linalg.generic {{.*}}iterator_types = ["parallel", "parallel"]
// CHECK: math.sqrt
// CHECK: linalg.yield %{{.*}}, %{{.*}}, %{{.*}} : f32, f32, f32
// CHECK-NOT: linalg.generic
// CHECK: return %[[U]]#2, %[[U]]#1, %[[U]]#0
// UPSTREAM-LABEL: func.func @adamw_moments
// UPSTREAM-COUNT-3: linalg.generic
// UPSTREAM-NOT: linalg.generic
func.func @adamw_moments(%p: tensor<64x32xf32>, %g: tensor<64x32xf32>, %m: tensor<64x32xf32>, %v: tensor<64x32xf32>) -> (tensor<64x32xf32>, tensor<64x32xf32>, tensor<64x32xf32>) {
  %b1 = kiln.constant dense<0.9> : tensor<f32> : tensor<f32>
  %c1 = kiln.constant dense<0.1> : tensor<f32> : tensor<f32>
  %b2 = kiln.constant dense<0.999> : tensor<f32> : tensor<f32>
  %c2 = kiln.constant dense<0.001> : tensor<f32> : tensor<f32>
  %eps = kiln.constant dense<1.0e-8> : tensor<f32> : tensor<f32>
  %lr = kiln.constant dense<0.001> : tensor<f32> : tensor<f32>
  %m1 = kiln.elementwise "mul" %m, %b1 : (tensor<64x32xf32>, tensor<f32>) -> tensor<64x32xf32>
  %g1 = kiln.elementwise "mul" %g, %c1 : (tensor<64x32xf32>, tensor<f32>) -> tensor<64x32xf32>
  %mn = kiln.elementwise "add" %m1, %g1 : (tensor<64x32xf32>, tensor<64x32xf32>) -> tensor<64x32xf32>
  %v1 = kiln.elementwise "mul" %v, %b2 : (tensor<64x32xf32>, tensor<f32>) -> tensor<64x32xf32>
  %gg = kiln.elementwise "mul" %g, %g : (tensor<64x32xf32>, tensor<64x32xf32>) -> tensor<64x32xf32>
  %g2 = kiln.elementwise "mul" %gg, %c2 : (tensor<64x32xf32>, tensor<f32>) -> tensor<64x32xf32>
  %vn = kiln.elementwise "add" %v1, %g2 : (tensor<64x32xf32>, tensor<64x32xf32>) -> tensor<64x32xf32>
  %s = kiln.elementwise "sqrt" %vn : (tensor<64x32xf32>) -> tensor<64x32xf32>
  %d = kiln.elementwise "add" %s, %eps : (tensor<64x32xf32>, tensor<f32>) -> tensor<64x32xf32>
  %q = kiln.elementwise "div" %mn, %d : (tensor<64x32xf32>, tensor<64x32xf32>) -> tensor<64x32xf32>
  %u = kiln.elementwise "mul" %q, %lr : (tensor<64x32xf32>, tensor<f32>) -> tensor<64x32xf32>
  %pn = kiln.elementwise "sub" %p, %u : (tensor<64x32xf32>, tensor<64x32xf32>) -> tensor<64x32xf32>
  return %pn, %mn, %vn : tensor<64x32xf32>, tensor<64x32xf32>, tensor<64x32xf32>
}

// A value returned and read by two loop nests is stored once, as a second result of its first
// consumer's loop nest (merge_returned_producers: every other use comes after that consumer);
// the second consumer reads it back.
// CHECK-LABEL: func.func @returned_two_consumers
// UPSTREAM-LABEL: func.func @returned_two_consumers
// CHECK-COUNT-2: linalg.generic
// CHECK-NOT: linalg.generic
// CHECK: return
func.func @returned_two_consumers(%x: tensor<64x32xf32>) -> (tensor<64x32xf32>, tensor<64x32xf32>, tensor<64x32xf32>) {
  %c = kiln.constant dense<2.0> : tensor<f32> : tensor<f32>
  %a = kiln.elementwise "mul" %x, %x : (tensor<64x32xf32>, tensor<64x32xf32>) -> tensor<64x32xf32>
  %b = kiln.elementwise "add" %a, %x : (tensor<64x32xf32>, tensor<64x32xf32>) -> tensor<64x32xf32>
  %d = kiln.elementwise "mul" %a, %c : (tensor<64x32xf32>, tensor<f32>) -> tensor<64x32xf32>
  return %b, %d, %a : tensor<64x32xf32>, tensor<64x32xf32>, tensor<64x32xf32>
}
