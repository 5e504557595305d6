// kiln-decompose: composite ops -> primitive kiln ops (ir/decompose.cpp), then all of it lowers
// to linalg (no kiln op left) and fuses.
// RUN: kiln-opt %s --kiln-decompose | FileCheck %s
// RUN: kiln-opt %s --kiln-decompose | kiln-opt | FileCheck %s
// RUN: kiln-opt %s --kiln-decompose --convert-kiln-to-linalg --canonicalize --linalg-fuse-elementwise-ops --cse \
// RUN: | FileCheck %s --check-prefix=LOWER

// LOWER-NOT: kiln.
// LOWER-LABEL: func.func @softmax
// LOWER-COUNT-2: linalg.fill
// LOWER: arith.addf %{{.*}} fastmath<reassoc> {kiln_nonnegative_terms, kiln_widened_float32_sum} : f64
// LOWER-LABEL: func.func @nll_loss
// LOWER: tensor.extract %arg0
// LOWER-NOT: kiln.

// softmax = exp(x - amax) * reciprocal(sum(exp(x - amax))), reductions with keepdim over the dim.
// CHECK-LABEL: func.func @softmax
// CHECK: %[[M:.*]] = kiln.reduce "amax" %arg0 {dims = array<i64: -1>, keepdim} : (tensor<?x5xf32>) -> tensor<?x1xf32>
// CHECK: %[[D:.*]] = kiln.elementwise "sub" %arg0, %[[M]] : (tensor<?x5xf32>, tensor<?x1xf32>) -> tensor<?x5xf32>
// CHECK: %[[E:.*]] = kiln.elementwise "exp" %[[D]]
// The sum of exps is marked as one of terms >= 0 (ir/dialect.h): its float32 lowering carries
// the mark to the float64 add (LOWER), where CPU row loops may sum in float32 blocks.
// CHECK: %[[S:.*]] = kiln.reduce "sum" %[[E]] {dims = array<i64: -1>, keepdim, kiln_nonnegative_terms}
// CHECK: %[[R:.*]] = kiln.elementwise "reciprocal" %[[S]] : (tensor<?x1xf32>) -> tensor<?x1xf32>
// CHECK: %[[Y:.*]] = kiln.elementwise "mul" %[[E]], %[[R]] : (tensor<?x5xf32>, tensor<?x1xf32>) -> tensor<?x5xf32>
// CHECK: return %[[Y]]
func.func @softmax(%x: tensor<?x5xf32>) -> tensor<?x5xf32> {
  %0 = kiln.composite "softmax" %x {dim = -1 : i64} : (tensor<?x5xf32>) -> tensor<?x5xf32>
  return %0 : tensor<?x5xf32>
}

// log_softmax = (x - amax) - log(sum(exp(x - amax))); dim defaults to 0.
// CHECK-LABEL: func.func @log_softmax
// CHECK: %[[M:.*]] = kiln.reduce "amax" %arg0 {dims = array<i64: 0>, keepdim} : (tensor<3x5xf64>) -> tensor<1x5xf64>
// CHECK: %[[D:.*]] = kiln.elementwise "sub" %arg0, %[[M]]
// CHECK: %[[E:.*]] = kiln.elementwise "exp" %[[D]]
// CHECK: %[[S:.*]] = kiln.reduce "sum" %[[E]] {dims = array<i64: 0>, keepdim, kiln_nonnegative_terms}
// CHECK: %[[L:.*]] = kiln.elementwise "log" %[[S]]
// CHECK: %[[Y:.*]] = kiln.elementwise "sub" %[[D]], %[[L]] : (tensor<3x5xf64>, tensor<1x5xf64>) -> tensor<3x5xf64>
// CHECK: return %[[Y]]
func.func @log_softmax(%x: tensor<3x5xf64>) -> tensor<3x5xf64> {
  %0 = kiln.composite "log_softmax" %x : (tensor<3x5xf64>) -> tensor<3x5xf64>
  return %0 : tensor<3x5xf64>
}

// layer_norm: mean and var in f64 (a float32 (x - mean)^2 overflows where the result is O(1)),
// rsqrt(var + eps); rows with var > 2^190 use s = 1/16, others s = 1: y = ((x*s - mu32*s) -
// lo*s) * (rstd/s) in f32, lo = mean - mu32 (mu32 the mean rounded to f32: its rounding alone
// was 3 % of a row's spread on a large offset), then * w + b. Without weight/bias, the last
// mul/add are absent.
// CHECK-LABEL: func.func @layer_norm
// CHECK: %[[X:.*]] = kiln.elementwise "to" %arg0 {dtype = f64} : (tensor<?x8xf32>) -> tensor<?x8xf64>
// CHECK: %[[MU:.*]] = kiln.reduce "mean" %[[X]] {dims = array<i64: 1>, keepdim} : (tensor<?x8xf64>) -> tensor<?x1xf64>
// CHECK: %[[D:.*]] = kiln.elementwise "sub" %[[X]], %[[MU]]
// CHECK: %[[SQ:.*]] = kiln.elementwise "mul" %[[D]], %[[D]]
// CHECK: %[[V:.*]] = kiln.reduce "mean" %[[SQ]] {dims = array<i64: 1>, keepdim}
// CHECK: %[[EPS:.*]] = kiln.constant dense<1.000000e-05> : tensor<f64>
// CHECK: %[[VE:.*]] = kiln.elementwise "add" %[[V]], %[[EPS]] : (tensor<?x1xf64>, tensor<f64>) -> tensor<?x1xf64>
// CHECK: %[[R:.*]] = kiln.elementwise "rsqrt" %[[VE]]
// CHECK: %[[BIG:.*]] = kiln.constant dense<1.5692754338466702E+57> : tensor<f64>
// CHECK: %[[SCALED:.*]] = kiln.elementwise "gt" %[[V]], %[[BIG]]
// CHECK: %[[S64:.*]] = kiln.elementwise "where" %[[SCALED]], %{{.*}}, %{{.*}} : (tensor<?x1xi1>, tensor<f64>, tensor<f64>) -> tensor<?x1xf64>
// CHECK: %[[S:.*]] = kiln.elementwise "to" %[[S64]] {dtype = f32}
// CHECK: %[[MU32:.*]] = kiln.elementwise "to" %[[MU]] {dtype = f32}
// CHECK: %[[XS:.*]] = kiln.elementwise "mul" %arg0, %[[S]] : (tensor<?x8xf32>, tensor<?x1xf32>) -> tensor<?x8xf32>
// CHECK: %[[MS:.*]] = kiln.elementwise "mul" %[[MU32]], %[[S]]
// CHECK: %[[DS:.*]] = kiln.elementwise "sub" %[[XS]], %[[MS]]
// CHECK: %[[MU32W:.*]] = kiln.elementwise "to" %[[MU32]] {dtype = f64}
// CHECK: %[[LO:.*]] = kiln.elementwise "sub" %[[MU]], %[[MU32W]]
// CHECK: %[[LOS:.*]] = kiln.elementwise "mul" %[[LO]], %[[S64]]
// CHECK: %[[LOS32:.*]] = kiln.elementwise "to" %[[LOS]] {dtype = f32}
// CHECK: %[[DL:.*]] = kiln.elementwise "sub" %[[DS]], %[[LOS32]]
// CHECK: %[[RS64:.*]] = kiln.elementwise "div" %[[R]], %[[S64]]
// CHECK: %[[RS:.*]] = kiln.elementwise "to" %[[RS64]] {dtype = f32}
// CHECK: %[[N:.*]] = kiln.elementwise "mul" %[[DL]], %[[RS]]
// CHECK: %[[W:.*]] = kiln.elementwise "mul" %[[N]], %arg1 : (tensor<?x8xf32>, tensor<8xf32>) -> tensor<?x8xf32>
// CHECK: %[[Y:.*]] = kiln.elementwise "add" %[[W]], %arg2
// CHECK: kiln.constant dense<1.000000e-03>
// CHECK: kiln.elementwise "rsqrt"
// CHECK: kiln.elementwise "sub"
// CHECK: kiln.elementwise "div"
// CHECK: kiln.elementwise "to"
// CHECK: %[[Y2:.*]] = kiln.elementwise "mul"
// CHECK-NOT: kiln.elementwise
// CHECK: return %[[Y]], %[[Y2]]
func.func @layer_norm(%x: tensor<?x8xf32>, %w: tensor<8xf32>, %b: tensor<8xf32>) -> (tensor<?x8xf32>, tensor<?x8xf32>) {
  %0 = kiln.composite "layer_norm" %x, %w, %b {dims = array<i64: 8>, eps = 1.0e-05 : f64} : (tensor<?x8xf32>, tensor<8xf32>, tensor<8xf32>) -> tensor<?x8xf32>
  %1 = kiln.composite "layer_norm" %x {dims = array<i64: 8>, eps = 1.0e-03 : f64} : (tensor<?x8xf32>) -> tensor<?x8xf32>
  return %0, %1 : tensor<?x8xf32>, tensor<?x8xf32>
}

// var = sum((x - mean)^2) / (n - correction), in f64 for f32 inputs (cast back once at the
// end): a constant divisor for static reduced dims; for a dynamic one, n is counted at run time
// and n - correction <= 0 selects nan. std = sqrt(var).
// CHECK-LABEL: func.func @var_std
// CHECK: %[[X:.*]] = kiln.elementwise "to" %arg0 {dtype = f64} : (tensor<4x6xf32>) -> tensor<4x6xf64>
// CHECK: %[[MU:.*]] = kiln.reduce "mean" %[[X]] {dims = array<i64: 1>, keepdim} : (tensor<4x6xf64>) -> tensor<4x1xf64>
// CHECK: %[[D:.*]] = kiln.elementwise "sub" %[[X]], %[[MU]]
// CHECK: %[[SQ:.*]] = kiln.elementwise "mul" %[[D]], %[[D]]
// CHECK: %[[S:.*]] = kiln.reduce "sum" %[[SQ]] {dims = array<i64: 1>} : (tensor<4x6xf64>) -> tensor<4xf64>
// CHECK: %[[FIVE:.*]] = kiln.constant dense<5.000000e+00> : tensor<f64>
// CHECK: %[[V64:.*]] = kiln.elementwise "div" %[[S]], %[[FIVE]]
// CHECK: %[[V:.*]] = kiln.elementwise "to" %[[V64]] {dtype = f32} : (tensor<4xf64>) -> tensor<4xf32>
// CHECK-NOT: kiln.elementwise "to"
// CHECK: kiln.reduce "mean" %arg1 {dims = array<i64: 0>, keepdim} : (tensor<?x6xf64>) -> tensor<1x6xf64>
// CHECK: %[[S2:.*]] = kiln.reduce "sum" %{{.*}} {dims = array<i64: 0>, keepdim} : (tensor<?x6xf64>) -> tensor<1x6xf64>
// CHECK: %[[EQ:.*]] = kiln.elementwise "eq" %arg1, %arg1
// CHECK: %[[NE:.*]] = kiln.elementwise "ne" %arg1, %arg1
// CHECK: %[[ALL:.*]] = kiln.elementwise "logical_or" %[[EQ]], %[[NE]]
// CHECK: %[[N:.*]] = kiln.reduce "sum" %[[ALL]] {dims = array<i64: 0>, keepdim} : (tensor<?x6xi1>) -> tensor<1x6xi64>
// CHECK: %[[DEN:.*]] = kiln.elementwise "sub" %[[N]], %{{.*}} : (tensor<1x6xi64>, tensor<i64>) -> tensor<1x6xi64>
// CHECK: %[[ZERO:.*]] = kiln.constant dense<0> : tensor<i64>
// CHECK: %[[POS:.*]] = kiln.elementwise "maximum" %[[DEN]], %[[ZERO]]
// CHECK: %[[V2:.*]] = kiln.elementwise "div" %[[S2]], %[[POS]] : (tensor<1x6xf64>, tensor<1x6xi64>) -> tensor<1x6xf64>
// CHECK: kiln.constant dense<6.000000e+00> : tensor<f64>
// CHECK: %[[SQRT:.*]] = kiln.elementwise "sqrt"
// CHECK: %[[SD:.*]] = kiln.elementwise "to" %[[SQRT]] {dtype = f32} : (tensor<4x1xf64>) -> tensor<4x1xf32>
// CHECK: return %[[V]], %[[V2]], %[[SD]]
func.func @var_std(%x: tensor<4x6xf32>, %y: tensor<?x6xf64>) -> (tensor<4xf32>, tensor<1x6xf64>, tensor<4x1xf32>) {
  %0 = kiln.reduce "var" %x {dims = array<i64: 1>, mode = 1 : i64} : (tensor<4x6xf32>) -> tensor<4xf32>
  %1 = kiln.reduce "var" %y {dims = array<i64: 0>, keepdim, mode = 1 : i64} : (tensor<?x6xf64>) -> tensor<1x6xf64>
  %2 = kiln.reduce "std" %x {dims = array<i64: 1>, keepdim} : (tensor<4x6xf32>) -> tensor<4x1xf32>
  return %0, %1, %2 : tensor<4xf32>, tensor<1x6xf64>, tensor<4x1xf32>
}

// logsumexp = log(sum(exp(x - m))) + m, m = amax with +-inf replaced by 0; without keepdim the
// max is reduced a second time for the final add.
// CHECK-LABEL: func.func @logsumexp
// CHECK: %[[M:.*]] = kiln.reduce "amax" %arg0 {dims = array<i64: 1>, keepdim}
// CHECK: %[[A:.*]] = kiln.elementwise "abs" %[[M]]
// CHECK: %[[INF:.*]] = kiln.constant dense<0x7F800000> : tensor<f32>
// CHECK: %[[ISINF:.*]] = kiln.elementwise "eq" %[[A]], %[[INF]]
// CHECK: %[[ZERO:.*]] = kiln.constant dense<0.000000e+00> : tensor<f32>
// CHECK: %[[MF:.*]] = kiln.elementwise "where" %[[ISINF]], %[[ZERO]], %[[M]]
// CHECK: %[[D:.*]] = kiln.elementwise "sub" %arg0, %[[MF]]
// CHECK: %[[E:.*]] = kiln.elementwise "exp" %[[D]]
// CHECK: %[[S:.*]] = kiln.reduce "sum" %[[E]] {dims = array<i64: 1>, kiln_nonnegative_terms} : (tensor<4x6xf32>) -> tensor<4xf32>
// CHECK: %[[L:.*]] = kiln.elementwise "log" %[[S]]
// CHECK: %[[M2:.*]] = kiln.reduce "amax" %arg0 {dims = array<i64: 1>} : (tensor<4x6xf32>) -> tensor<4xf32>
// CHECK: %[[MF2:.*]] = kiln.elementwise "where" %{{.*}}, %{{.*}}, %[[M2]]
// CHECK: %[[Y:.*]] = kiln.elementwise "add" %[[L]], %[[MF2]]
// CHECK: kiln.reduce "sum" %{{.*}} {dims = array<i64: 1>, keepdim, kiln_nonnegative_terms}
// CHECK: %[[Y2:.*]] = kiln.elementwise "add" %{{.*}}, %{{.*}} : (tensor<4x1xf32>, tensor<4x1xf32>) -> tensor<4x1xf32>
// CHECK: return %[[Y]], %[[Y2]]
func.func @logsumexp(%x: tensor<4x6xf32>) -> (tensor<4xf32>, tensor<4x1xf32>) {
  %0 = kiln.reduce "logsumexp" %x {dims = array<i64: 1>} : (tensor<4x6xf32>) -> tensor<4xf32>
  %1 = kiln.reduce "logsumexp" %x {dims = array<i64: 1>, keepdim} : (tensor<4x6xf32>) -> tensor<4x1xf32>
  return %0, %1 : tensor<4xf32>, tensor<4x1xf32>
}

// nll_loss: the target's log-prob read with gather along the class dim (its lowering clamps
// the index; the tracer and eager CUDA ops check the targets); ignored targets give 0; mean
// divides by the count of the others.
// CHECK-LABEL: func.func @nll_loss
// CHECK: %[[IDX:.*]] = kiln.view "unsqueeze" %arg1 {dim = 1 : i64} : (tensor<?xi64>) -> tensor<?x1xi64>
// CHECK: %[[G:.*]] = kiln.index "gather" %arg0, %[[IDX]] {dim = 1 : i64} : (tensor<?x3xf32>, tensor<?x1xi64>) -> tensor<?x1xf32>
// CHECK: %[[P:.*]] = kiln.view "squeeze" %[[G]] {dim = 1 : i64} : (tensor<?x1xf32>) -> tensor<?xf32>
// CHECK: %[[ZERO:.*]] = kiln.constant dense<0.000000e+00> : tensor<f32>
// CHECK: %[[IGN:.*]] = kiln.constant dense<1> : tensor<i64>
// CHECK: %[[VALID:.*]] = kiln.elementwise "ne" %arg1, %[[IGN]]
// CHECK: %[[NEG:.*]] = kiln.elementwise "neg" %[[P]]
// CHECK: %[[L:.*]] = kiln.elementwise "where" %[[VALID]], %[[NEG]], %[[ZERO]]
// CHECK: %[[T:.*]] = kiln.reduce "sum" %[[L]] : (tensor<?xf32>) -> tensor<f32>
// CHECK: %[[C:.*]] = kiln.reduce "sum" %[[VALID]] : (tensor<?xi1>) -> tensor<i64>
// CHECK: %[[MEAN:.*]] = kiln.elementwise "div" %[[T]], %[[C]] : (tensor<f32>, tensor<i64>) -> tensor<f32>
// CHECK: kiln.constant dense<-100> : tensor<i64>
// CHECK: %[[NONE:.*]] = kiln.elementwise "where" %{{.*}} : (tensor<?xi1>, tensor<?xf32>, tensor<f32>) -> tensor<?xf32>
// CHECK: return %[[MEAN]], %[[NONE]]
func.func @nll_loss(%x: tensor<?x3xf32>, %t: tensor<?xi64>) -> (tensor<f32>, tensor<?xf32>) {
  %0 = kiln.composite "nll_loss" %x, %t {mode = 1 : i64, ignore_index = 1 : i64} : (tensor<?x3xf32>, tensor<?xi64>) -> tensor<f32>
  %1 = kiln.composite "nll_loss" %x, %t : (tensor<?x3xf32>, tensor<?xi64>) -> tensor<?xf32>
  return %0, %1 : tensor<f32>, tensor<?xf32>
}

// mse_loss = mean((a - b)^2), broadcasting; the mean in f64 (f32 squares overflow where the
// mean is representable), cast back once.
// CHECK-LABEL: func.func @mse_loss
// CHECK: %[[A:.*]] = kiln.elementwise "to" %arg0 {dtype = f64} : (tensor<4x3xf32>) -> tensor<4x3xf64>
// CHECK: %[[B:.*]] = kiln.elementwise "to" %arg1 {dtype = f64} : (tensor<3xf32>) -> tensor<3xf64>
// CHECK: %[[D:.*]] = kiln.elementwise "sub" %[[A]], %[[B]] : (tensor<4x3xf64>, tensor<3xf64>) -> tensor<4x3xf64>
// CHECK: %[[SQ:.*]] = kiln.elementwise "mul" %[[D]], %[[D]]
// CHECK: %[[M:.*]] = kiln.reduce "mean" %[[SQ]] : (tensor<4x3xf64>) -> tensor<f64>
// CHECK: %[[Y:.*]] = kiln.elementwise "to" %[[M]] {dtype = f32} : (tensor<f64>) -> tensor<f32>
// CHECK: return %[[Y]]
func.func @mse_loss(%a: tensor<4x3xf32>, %b: tensor<3xf32>) -> tensor<f32> {
  %0 = kiln.composite "mse_loss" %a, %b {mode = 1 : i64} : (tensor<4x3xf32>, tensor<3xf32>) -> tensor<f32>
  return %0 : tensor<f32>
}

// A weight gradient as autograd records it, (x^T @ g * 1)^T: the multiply by 1 and the
// double transpose fold away and the product becomes g^T @ x (lowering reads g transposed).
// CHECK-LABEL: func.func @transposed_product
// CHECK-NEXT: %[[GT:.*]] = kiln.view "transpose" %arg1 {dim1 = 1 : i64} : (tensor<64x24xf32>) -> tensor<24x64xf32>
// CHECK-NEXT: %[[P:.*]] = kiln.matmul "matmul" %[[GT]], %arg0 : (tensor<24x64xf32>, tensor<64x40xf32>) -> tensor<24x40xf32>
// CHECK-NEXT: return %[[P]]
func.func @transposed_product(%x: tensor<64x40xf32>, %g: tensor<64x24xf32>) -> tensor<24x40xf32> {
  %xt = kiln.view "transpose" %x {dim1 = 1} : (tensor<64x40xf32>) -> tensor<40x64xf32>
  %p = kiln.matmul "matmul" %xt, %g : (tensor<40x64xf32>, tensor<64x24xf32>) -> tensor<40x24xf32>
  %one = kiln.constant dense<1.0> : tensor<f32> : tensor<f32>
  %s = kiln.elementwise "mul" %p, %one : (tensor<40x24xf32>, tensor<f32>) -> tensor<40x24xf32>
  %t = kiln.view "transpose" %s {dim = -1, dim1 = -2} : (tensor<40x24xf32>) -> tensor<24x40xf32>
  return %t : tensor<24x40xf32>
}

// Kept: a product with another use, a transpose of other dims, a multiply by 1 that broadcasts,
// a multiply by 2.
// CHECK-LABEL: func.func @kept_as_written
// CHECK: %[[P:.*]] = kiln.matmul "matmul" %arg0, %arg1
// CHECK: kiln.view "transpose" %[[P]]
// CHECK: %[[B:.*]] = kiln.matmul "matmul" %arg2, %arg3
// CHECK: kiln.view "transpose" %[[B]] {dim = 0 : i64, dim1 = 1 : i64}
// CHECK: kiln.elementwise "mul" %arg4, %{{.*}} : (tensor<3xf32>, tensor<2x3xf32>)
// CHECK: kiln.elementwise "mul" %arg4, %{{.*}} : (tensor<3xf32>, tensor<f32>)
func.func @kept_as_written(%a: tensor<4x5xf32>, %b: tensor<5x6xf32>, %c: tensor<2x4x5xf32>,
                           %d: tensor<2x5x6xf32>, %v: tensor<3xf32>)
    -> (tensor<4x6xf32>, tensor<6x4xf32>, tensor<4x2x6xf32>, tensor<2x3xf32>, tensor<3xf32>) {
  %p = kiln.matmul "matmul" %a, %b : (tensor<4x5xf32>, tensor<5x6xf32>) -> tensor<4x6xf32>
  %pt = kiln.view "transpose" %p {dim1 = 1} : (tensor<4x6xf32>) -> tensor<6x4xf32>
  %bp = kiln.matmul "matmul" %c, %d : (tensor<2x4x5xf32>, tensor<2x5x6xf32>) -> tensor<2x4x6xf32>
  %bt = kiln.view "transpose" %bp {dim = 0, dim1 = 1} : (tensor<2x4x6xf32>) -> tensor<4x2x6xf32>
  %ones = kiln.constant dense<1.0> : tensor<2x3xf32> : tensor<2x3xf32>
  %m = kiln.elementwise "mul" %v, %ones : (tensor<3xf32>, tensor<2x3xf32>) -> tensor<2x3xf32>
  %two = kiln.constant dense<2.0> : tensor<f32> : tensor<f32>
  %m2 = kiln.elementwise "mul" %v, %two : (tensor<3xf32>, tensor<f32>) -> tensor<3xf32>
  return %p, %pt, %bt, %m, %m2 : tensor<4x6xf32>, tensor<6x4xf32>, tensor<4x2x6xf32>, tensor<2x3xf32>, tensor<3xf32>
}

// Autograd's sum of slice gradients padded by cats (q, k, v of one in-projection weight): one
// cat of per-slice sums, cut at every boundary of either cat; the zeros are broadcast to each
// piece (no whole-size zeros remain).
// CHECK-LABEL: func.func @sum_of_cats
// CHECK-NOT: tensor<4x4xf32>
// CHECK-NOT: tensor<6x4xf32>) -> tensor<6x4xf32>
// CHECK: kiln.shape "cat" %{{.*}}, %{{.*}}, %{{.*}} {dim = 0 : i64} : (tensor<2x4xf32>, tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<6x4xf32>
// CHECK-NEXT: return
func.func @sum_of_cats(%q: tensor<2x4xf32>, %k: tensor<2x4xf32>, %v: tensor<2x4xf32>) -> tensor<6x4xf32> {
  %c = kiln.constant dense<0.0> : tensor<f32> : tensor<f32>
  %z4 = kiln.view "expand" %c {dims = array<i64: 4, 4>} : (tensor<f32>) -> tensor<4x4xf32>
  %z2 = kiln.view "expand" %c {dims = array<i64: 2, 4>} : (tensor<f32>) -> tensor<2x4xf32>
  %gq = kiln.shape "cat" %q, %z4 {dim = 0 : i64} : (tensor<2x4xf32>, tensor<4x4xf32>) -> tensor<6x4xf32>
  %gk = kiln.shape "cat" %z2, %k, %z2 {dim = 0 : i64} : (tensor<2x4xf32>, tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<6x4xf32>
  %gv = kiln.shape "cat" %z4, %v {dim = 0 : i64} : (tensor<4x4xf32>, tensor<2x4xf32>) -> tensor<6x4xf32>
  %s = kiln.elementwise "add" %gq, %gk : (tensor<6x4xf32>, tensor<6x4xf32>) -> tensor<6x4xf32>
  %t = kiln.elementwise "add" %s, %gv : (tensor<6x4xf32>, tensor<6x4xf32>) -> tensor<6x4xf32>
  return %t : tensor<6x4xf32>
}

// Parts that straddle a cut are sliced: [0, 2) a[0:2] + c, [2, 3) a[2:3] + d[0:1], [3, 6) b + d[1:4].
// CHECK-LABEL: func.func @sum_of_cats_sliced
// CHECK-DAG: kiln.view "slice" %arg0 {end = 2 : i64, start = 0 : i64, step = 1 : i64} : (tensor<3x4xf32>) -> tensor<2x4xf32>
// CHECK-DAG: kiln.view "slice" %arg0 {end = 3 : i64, start = 2 : i64, step = 1 : i64} : (tensor<3x4xf32>) -> tensor<1x4xf32>
// CHECK-DAG: kiln.view "slice" %arg3 {end = 1 : i64, start = 0 : i64, step = 1 : i64} : (tensor<4x4xf32>) -> tensor<1x4xf32>
// CHECK-DAG: kiln.view "slice" %arg3 {end = 4 : i64, start = 1 : i64, step = 1 : i64} : (tensor<4x4xf32>) -> tensor<3x4xf32>
// CHECK: kiln.shape "cat" {{.*}} : (tensor<2x4xf32>, tensor<1x4xf32>, tensor<3x4xf32>) -> tensor<6x4xf32>
func.func @sum_of_cats_sliced(%a: tensor<3x4xf32>, %b: tensor<3x4xf32>, %c: tensor<2x4xf32>, %d: tensor<4x4xf32>) -> tensor<6x4xf32> {
  %x = kiln.shape "cat" %a, %b {dim = 0 : i64} : (tensor<3x4xf32>, tensor<3x4xf32>) -> tensor<6x4xf32>
  %y = kiln.shape "cat" %c, %d {dim = -2 : i64} : (tensor<2x4xf32>, tensor<4x4xf32>) -> tensor<6x4xf32>
  %s = kiln.elementwise "add" %x, %y : (tensor<6x4xf32>, tensor<6x4xf32>) -> tensor<6x4xf32>
  return %s : tensor<6x4xf32>
}

// Kept: cats along different dims, and a broadcasting add.
// CHECK-LABEL: func.func @sums_of_cats_kept
// CHECK: kiln.elementwise "add" %{{.*}}, %{{.*}} : (tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x4xf32>
// CHECK: kiln.elementwise "add" %{{.*}}, %{{.*}} : (tensor<4x4xf32>, tensor<1x4xf32>) -> tensor<4x4xf32>
func.func @sums_of_cats_kept(%a: tensor<2x4xf32>, %b: tensor<4x2xf32>, %r: tensor<1x2xf32>) -> (tensor<4x4xf32>, tensor<4x4xf32>) {
  %x = kiln.shape "cat" %a, %a {dim = 0 : i64} : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<4x4xf32>
  %y = kiln.shape "cat" %b, %b {dim = 1 : i64} : (tensor<4x2xf32>, tensor<4x2xf32>) -> tensor<4x4xf32>
  %s = kiln.elementwise "add" %x, %y : (tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x4xf32>
  %rr = kiln.shape "cat" %r, %r {dim = 1 : i64} : (tensor<1x2xf32>, tensor<1x2xf32>) -> tensor<1x4xf32>
  %t = kiln.elementwise "add" %x, %rr : (tensor<4x4xf32>, tensor<1x4xf32>) -> tensor<4x4xf32>
  return %s, %t : tensor<4x4xf32>, tensor<4x4xf32>
}
