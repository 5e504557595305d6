// Short inner loops (codegen/loop_hints.cpp): a row of 10 classes becomes masked AVX-512 code
// instead of scalar code, with the same results as eager.
#include <catch2/catch.hpp>

#include <cmath>
#include <string>
#include <vector>

#include "kiln/kiln.h"
#include "tests/codegen/compile_logs.h"

using namespace kiln;
using kiln::test::count;

TEST_CASE("loop hints: log_softmax over 10 classes is masked vector code and matches eager") {
  ir::Graph g;
  ir::Value x = g.input(DType::Float32, {64, 10});
  OpAttrs last;
  last.dim = -1;
  g.output(g.op(OpKind::LogSoftmax, {x}, last));
  const std::string ir = test::compile_logs(g, "codegen");
  REQUIRE(ir.find("LLVM IR after -O2") != std::string::npos);
  if (__builtin_cpu_supports("avx512f")) {
    // The rows' max, exp-sum and output loops run on masked 16-lane vectors; without the
    // hints -O2 unrolled them into scalar code (no masked loads at all).
    CHECK(count(ir, "@llvm.masked.load.v16f32") >= 2);
  } else {
    WARN("skipped the vector-code check: the host has no AVX-512");
  }
  codegen::Executable exe(g);
  Tensor in = mul(randn({64, 10}), 4.0);
  Tensor got = exe.run({in})[0];
  Tensor want = log_softmax(in.to(DType::Float64), -1);
  CHECK(amax(abs(sub(got.to(DType::Float64), want))).item<double>() < 1e-5);
}

TEST_CASE("loop hints: the hints force nothing: argmax stays silent, a product keeps its order") {
  // The hint only asks for a masked tail where LLVM vectorises anyway. Forcing vectorisation
  // (review) printed LLVM's "loop not vectorized" warnings for argmax over 10 classes, and let
  // LLVM reassociate a product's multiplies, which lower.cpp leaves in order.
  ir::Graph argmax;
  OpAttrs rows;
  rows.dim = 1;
  argmax.output(argmax.op(OpKind::Argmax, {argmax.input(DType::Float32, {64, 10})}, rows));
  CHECK(test::compile_logs(argmax, "").empty());

  ir::Graph prod_graph;
  OpAttrs each_row;
  each_row.dims = {1};
  prod_graph.output(
      prod_graph.op(OpKind::Prod, {prod_graph.input(DType::Float32, {2, 18})}, each_row));
  codegen::Executable exe(prod_graph);
  // The product accumulates in float64 (as eager's). Row 0 in order: nine factors 1e38
  // overflow float64 to inf, which stays inf; paired lane by lane with the 1e-38s
  // (reassociated) it would be about 1.
  std::vector<float> v(36, 1.0f);
  for (int i = 0; i < 9; ++i) v[i] = 1e38f;
  for (int i = 9; i < 18; ++i) v[i] = 1e-38f;
  for (int i = 18; i < 36; ++i) v[i] = 1.0f + 0.001f * static_cast<float>(i);
  Tensor x = from_vector(v, {2, 18});
  Tensor got = exe.run({x})[0];
  CHECK(std::isinf(got.data<float>()[0]));
  // Row 1 is the in-order float64 product, rounded once (eager's kernel is not the reference:
  // its accumulation order depends on how kiln itself was built, as in the sanitizer builds).
  double in_order = 1.0;
  for (int i = 18; i < 36; ++i) in_order *= v[i];
  CHECK(got.data<float>()[1] == static_cast<float>(in_order));
}

TEST_CASE("loop hints: a float64 product beside softmax's merged loop keeps its order") {
  // Softmax's exp and sum merge into one loop, which asks for 16 lanes (column_fusion.cpp).
  // The hint once also reached every later loop of the row (found by a break-it pass): the
  // product of a cast was regrouped, 1e37 * 1e37 overflowed, and inf * 0 gave NaN.
  constexpr int64_t n = 1152;
  ir::Graph g;
  ir::Value x = g.input(DType::Float32, {2, n});
  OpAttrs last, each_row;
  last.dim = -1;
  each_row.dims = {1};
  OpAttrs to_f64;
  to_f64.dtype = DType::Float64;
  g.output(g.op(OpKind::Softmax, {x}, last));
  g.output(g.op(OpKind::Prod, {g.op(OpKind::Cast, {x}, to_f64)}, each_row));
  const std::string logs = test::compile_logs(g, "codegen");
  CHECK(count(logs, "loop not vectorized") == 0);
  std::vector<float> v(2 * n);
  for (int64_t i = 0; i < 2 * n; ++i) v[i] = i % 2 ? 1e-37f : 1e37f;
  codegen::Executable exe(g);
  std::vector<Tensor> out = exe.run({from_vector(v, {2, n})});
  for (int64_t row = 0; row < 2; ++row) {
    double in_order = 1.0;
    for (int64_t i = 0; i < n; ++i) in_order *= static_cast<double>(v[row * n + i]);
    CHECK(out[1].data<double>()[row] == in_order);
    // The 1e37s share the probability; exp(1e-37 - 1e37) is 0.
    CHECK(out[0].data<float>()[row * n] == Approx(1.0 / (n / 2)).epsilon(1e-6));
    CHECK(out[0].data<float>()[row * n + 1] == 0.0f);
  }
}

TEST_CASE("blocked sums: softmax's sum runs in float32 lanes, blocks of 4096 summed in float64") {
  // blocked_sums.cpp: a float32 sum of exps (terms >= 0) only rounded to float32 keeps float32
  // partials per block of 4,096 columns instead of widening every term to float64 (half the
  // lanes, and conversions). Sums that may cancel too, redone where a block overflows (next).
  constexpr int64_t n = 10000;  // three blocks
  ir::Graph g;
  ir::Value x = g.input(DType::Float32, {3, n});
  OpAttrs last, each_row;
  last.dim = -1;
  each_row.dims = {1};
  g.output(g.op(OpKind::Softmax, {x}, last));
  g.output(g.op(OpKind::LogSumExp, {x}, each_row));
  const std::string logs = test::compile_logs(g, "codegen");
  if (__builtin_cpu_supports("avx512f")) {
    CHECK(count(logs, "fadd reassoc <16 x float>") >= 2);  // softmax's and logsumexp's sums
    CHECK(count(logs, "fpext <16 x float>") == 0);         // no term widened to float64
  } else {
    WARN("skipped the vector-code check: the host has no AVX-512");
  }
  codegen::Executable exe(g);
  Tensor in = add(mul(rand({3, n}), 8.0), 1000.0);
  std::vector<Tensor> out = exe.run({in});
  Tensor in64 = in.to(DType::Float64);
  const double softmax_error =
      amax(abs(sub(out[0].to(DType::Float64), softmax(in64, -1)))).item<double>();
  CHECK(softmax_error < 1e-9);  // probabilities near 1e-4: about 1e-5 relative
  const double lse_error =
      amax(abs(sub(out[1].to(DType::Float64), logsumexp(in64, {1})))).item<double>();
  CHECK(lse_error < 2e-4);  // near 1010: a few float32 ulp (6.1e-5)
}

TEST_CASE("blocked sums: cancelling 3e38s and a mean redo their block in float64; a float64 "
          "sum the user asked for keeps float64") {
  // Found by a break-it pass when every float32 row sum was first blocked, with no fallback:
  // float32 partials of [3e38, 3e38, -3e38, -3e38] overflowed (inf for 0), and an explicit
  // float64 sum of [1e8, 3998 x 1.0, -1e8] lost the ones (3936 for 3998). Now a block whose
  // float32 partial is inf or NaN is summed again in float64, as eager's kernels redo a row.
  std::vector<float> cancel;
  for (int i = 0; i < 3; ++i) cancel.insert(cancel.end(), {3e38f, 3e38f, -3e38f, -3e38f});
  OpAttrs each_row, to_f64, to_f32;
  each_row.dims = {1};
  to_f64.dtype = DType::Float64;
  to_f32.dtype = DType::Float32;
  {
    ir::Graph g;
    ir::Value x = g.input(DType::Float32, {3, ir::kDynamic});
    g.output(g.op(OpKind::Sum, {x}, each_row));
    codegen::Executable exe(g);
    Tensor got = exe.run({from_vector(cancel, {3, 4})})[0];
    for (int r = 0; r < 3; ++r) CHECK(got.data<float>()[r] == 0.0f);
  }
  {
    ir::Graph g;
    g.output(g.op(OpKind::Mean, {g.input(DType::Float32, {3, ir::kDynamic})}, each_row));
    codegen::Executable exe(g);
    std::vector<float> big(3 * 5000, 3e38f);
    CHECK(exe.run({from_vector(big, {3, 5000})})[0].data<float>()[0] == 3e38f);  // as eager's
  }
  {
    ir::Graph g;
    ir::Value x = g.input(DType::Float32, {2, 4000});
    ir::Value wide = g.op(OpKind::Cast, {x}, to_f64);
    g.output(g.op(OpKind::Cast, {g.op(OpKind::Sum, {wide}, each_row)}, to_f32));
    std::vector<float> v(2 * 4000, 1.0f);
    for (int r = 0; r < 2; ++r) v[r * 4000] = 1e8f, v[r * 4000 + 3999] = -1e8f;
    codegen::Executable exe(g);
    Tensor got = exe.run({from_vector(v, {2, 4000})})[0];
    CHECK(got.data<float>()[0] == 3998.0f);
    CHECK(got.data<float>()[1] == 3998.0f);
  }
  {
    // 10,000 columns: three blocks. Row 0: zeros, then in the middle block 1,024 x 3e38 and
    // 1,024 x -3e38 (two or more in each of up to 512 partial sums that LLVM keeps: inf), then
    // 0.25 in the last block; its float64 sum is exact. Row 1 has a NaN, row 2 an inf, row 3
    // ordinary values. A plain row sum runs in float32 lanes. (Huge values that cancel lose
    // the small terms summed before them, in float64 too: an error of a few ulp of sum |x|.)
    constexpr int64_t n = 10000;
    ir::Graph g;
    g.output(g.op(OpKind::Sum, {g.input(DType::Float32, {4, n})}, each_row));
    const std::string logs = test::compile_logs(g, "codegen");
    if (__builtin_cpu_supports("avx512f")) CHECK(count(logs, "fadd reassoc <16 x float>") >= 1);
    std::vector<float> v(4 * n, 0.25f);
    for (int64_t j = 0; j < 8192; ++j)
      v[j] = j < 4096 ? 0.0f : j < 5120 ? 3e38f : j < 6144 ? -3e38f : 0.0f;
    v[n + 7000] = NAN;
    v[2 * n + 9999] = INFINITY;
    codegen::Executable exe(g);
    Tensor got = exe.run({from_vector(v, {4, n})})[0];
    CHECK(got.data<float>()[0] == 0.25f * (n - 8192));
    CHECK(std::isnan(got.data<float>()[1]));
    CHECK(got.data<float>()[2] == INFINITY);
    CHECK(got.data<float>()[3] == 0.25f * n);
  }
}

TEST_CASE("blocked sums: a long float64 sum adds blocks of 4096, not one running sum") {
  // Found by a break-it pass: one running float64 sum of 10^7 terms lost every term under half
  // an ulp of its total: sum(x) * 1e7 for x = [1, 1e-16 x (10^7 - 1)] was 1 + 0.969e-9, exactly
  // 1/32 of the small terms short (the LLVM lane that held the 1). Each block of 4096 terms now
  // has a partial of its own, as eager's kernels sum. Exact: 1 + (n - 1) * 1e-16.
  constexpr int64_t n = 1000003;
  std::vector<double> v(n, 1e-16);
  v[0] = 1.0;
  const double exact = 1.0 + static_cast<double>(n - 1) * 1e-16;
  SECTION("a whole-tensor sum (one loop, no rows)") {
    ir::Graph g;
    OpAttrs all;
    all.all_dims = true;
    g.output(g.op(OpKind::Sum, {g.input(DType::Float64, {ir::kDynamic})}, all));
    codegen::Executable exe(g);
    const double got = exe.run({from_vector(v, {n})})[0].item<double>();
    INFO(got - exact);
    CHECK(std::abs(got - exact) < 1e-13);  // one running sum: 3e-12 off
  }
  SECTION("a whole-tensor sum of short rows (a partial per row of 100)") {
    ir::Graph g;
    OpAttrs all;
    all.all_dims = true;
    g.output(g.op(OpKind::Sum, {g.input(DType::Float64, {ir::kDynamic, 100})}, all));
    codegen::Executable exe(g);
    std::vector<double> w(1000000, 1e-16);
    w[0] = 1.0;
    const double got = exe.run({from_vector(w, {10000, 100})})[0].item<double>();
    INFO(got - (1.0 + 999999 * 1e-16));
    CHECK(std::abs(got - (1.0 + 999999 * 1e-16)) < 1e-13);
  }
  SECTION("sums written into their parts of a cat's result (views of one buffer)") {
    // Found by a second break-it pass: the accumulator was a subview, and two sums shared it.
    ir::Graph g;
    ir::Value x = g.input(DType::Float64, {2, n});
    OpAttrs each_row, along_1;
    each_row.dims = {1};
    each_row.keepdim = true;
    along_1.dim = 1;
    ir::Value twice = g.op(OpKind::Mul, {x, g.constant(Scalar(2.0), DType::Float64)});
    g.output(g.op(OpKind::Cat, {g.op(OpKind::Sum, {x}, each_row),
                                g.op(OpKind::Sum, {twice}, each_row)}, along_1));
    codegen::Executable exe(g);
    std::vector<double> rows = v;
    rows.insert(rows.end(), v.begin(), v.end());
    Tensor got = exe.run({from_vector(rows, {2, n})})[0];
    REQUIRE(got.shape() == Shape{2, 2});
    for (int k = 0; k < 4; ++k) {
      INFO(k << ": " << got.data<double>()[k] - (k % 2 ? 2 : 1) * exact);
      CHECK(std::abs(got.data<double>()[k] - (k % 2 ? 2 : 1) * exact) < 2e-13);
    }
  }
  SECTION("a row sum (a row loop's column loop)") {
    ir::Graph g;
    OpAttrs each_row;
    each_row.dims = {1};
    g.output(g.op(OpKind::Sum, {g.input(DType::Float64, {ir::kDynamic, n})}, each_row));
    codegen::Executable exe(g);
    std::vector<double> rows = v;
    rows.insert(rows.end(), v.rbegin(), v.rend());  // row 1: the 1 last
    Tensor got = exe.run({from_vector(rows, {2, n})})[0];
    for (int r = 0; r < 2; ++r) {
      INFO(r << ": " << got.data<double>()[r] - exact);
      CHECK(std::abs(got.data<double>()[r] - exact) < 1e-13);
    }
  }
}
