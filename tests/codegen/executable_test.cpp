// codegen::Executable: graphs compiled to native code (MLIR JIT) against eager mode.
#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "backends/cpu/blas.h"
#include "backends/cpu/parallel.h"
#include "codegen/codegen.h"
#include "codegen/runtime.h"
#include "kiln/kiln.h"
#include "tests/codegen/compile_logs.h"

using namespace kiln;

namespace {

/// Largest |a - b| over all elements (float32, same shape); NaN positions must agree.
double max_diff(const Tensor& a, const Tensor& b) {
  REQUIRE(a.shape() == b.shape());
  Tensor ac = a.contiguous(), bc = b.contiguous();
  const float* pa = ac.data<float>();
  const float* pb = bc.data<float>();
  double m = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    if (std::isnan(pa[i]) || std::isnan(pb[i])) {
      if (!(std::isnan(pa[i]) && std::isnan(pb[i]))) return std::numeric_limits<double>::infinity();
      continue;
    }
    m = std::max(m, std::abs(double(pa[i]) - double(pb[i])));
  }
  return m;
}

float kNaNf() { return std::numeric_limits<float>::quiet_NaN(); }

ir::Graph square_plus(const std::vector<int64_t>& shape, bool tanh = false) {
  ir::Graph g;
  ir::Value x = g.input(DType::Float32, shape);
  ir::Value y = g.op(OpKind::Add, {g.op(OpKind::Mul, {x, x}), x});
  if (tanh) y = g.op(OpKind::Tanh, {y});
  g.output(y);
  return g;
}

}  // namespace

TEST_CASE("Executable: x*x + x on float32 [1000] and [3, 4] equals eager") {
  for (Shape shape : {Shape{1000}, Shape{3, 4}}) {
    codegen::Executable exe(square_plus(shape.vec()));
    Tensor x = randn(shape);
    std::vector<Tensor> out = exe.run({x});
    REQUIRE(out.size() == 1);
    CHECK(out[0].dtype() == DType::Float32);
    CHECK(max_diff(out[0], add(mul(x, x), x)) == 0);
  }
}

TEST_CASE("Executable: x*x + x, then tanh is one kernel") {
  codegen::Executable exe(square_plus({ir::kDynamic}, /*tanh=*/true));
  INFO(exe.linalg_ir());
  CHECK(exe.num_kernels() == 1);
  Tensor x = randn({4097});
  // tanh is a polynomial approximation (math dialect): within 2e-6 absolute of eager's tanhf.
  CHECK(max_diff(exe.run({x})[0], tanh(add(mul(x, x), x))) < 2e-6);
}

TEST_CASE("Executable: exp and gelu chains within tolerance of eager") {
  ir::Graph g;
  ir::Value x = g.input(DType::Float32, {64, 33});
  g.output(g.op(OpKind::Exp, {g.op(OpKind::Mul, {x, x})}));
  OpAttrs erf;  // mode 0 = exact (erf) gelu
  g.output(g.op(OpKind::Gelu, {g.op(OpKind::Add, {x, x})}, erf));
  codegen::Executable exe(g);
  Tensor xt = randn({64, 33});
  std::vector<Tensor> out = exe.run({xt});
  REQUIRE(out.size() == 2);
  Tensor e = exp(mul(xt, xt));
  // Relative 1e-6 for exp (polynomial approximation), absolute 1e-6 for gelu.
  double rel = max_diff(div(out[0], e), ones({64, 33}));
  CHECK(rel < 2e-6);
  CHECK(max_diff(out[1], gelu(add(xt, xt))) < 2e-6);
}

TEST_CASE("Executable: gelu's negative tail is within a few ulp (z = -x/sqrt(2) corrected)") {
  // Found by a break-it pass: the rounding of z = -x/√2 alone moves erfc(z) by 2z·dz relative,
  // so float32 gelu(-12.93) was 196 ulp off (1.6e-5), float64 gelu(-37.3) 1,492 ulp (1.9e-13).
  // Reference: long double.
  for (DType dt : {DType::Float32, DType::Float64}) {
    const bool f32 = dt == DType::Float32;
    ir::Graph g;
    g.output(g.op(OpKind::Gelu, {g.input(dt, {4001})}));
    codegen::Executable exe(g);
    std::vector<double> xs;
    for (int i = 0; i < 4001; ++i) xs.push_back(-1.0 - (f32 ? 12.0 : 36.0) * i / 4000.0);
    Tensor x = from_vector(xs, {4001}).to(dt);
    std::vector<double> in = x.to(DType::Float64).to_vector<double>();
    std::vector<double> got = exe.run({x})[0].to(DType::Float64).to_vector<double>();
    double worst = 0;
    for (size_t i = 0; i < in.size(); ++i) {
      const long double xl = in[i];
      const auto want = static_cast<double>(0.5L * xl * erfcl(-xl / sqrtl(2.0L)));
      if (want != 0) worst = std::max(worst, std::fabs(got[i] - want) / std::fabs(want));
    }
    INFO((f32 ? "float32" : "float64") << std::string(": max relative error ") << worst);
    CHECK(worst < (f32 ? 6e-7 : 2e-15));
  }
}

TEST_CASE("Executable: sum and amax reductions") {
  ir::Graph g;
  ir::Value x = g.input(DType::Float32, {5, 7});
  OpAttrs rows;
  rows.dims = {1};
  g.output(g.op(OpKind::Sum, {x}, rows));
  OpAttrs all;
  all.all_dims = true;
  g.output(g.op(OpKind::Amax, {x}, all));
  codegen::Executable exe(g);
  Tensor xt = randn({5, 7});
  std::vector<Tensor> out = exe.run({xt});
  REQUIRE(out.size() == 2);
  CHECK(max_diff(out[0], sum(xt, {1})) < 1e-5);
  CHECK(out[1].shape() == Shape{});
  CHECK(max_diff(out[1], amax(xt)) == 0);
}

TEST_CASE("Executable: broadcasting [2,1,3] + [4,1]") {
  ir::Graph g;
  ir::Value a = g.input(DType::Float32, {2, 1, 3});
  ir::Value b = g.input(DType::Float32, {4, 1});
  g.output(g.op(OpKind::Add, {a, b}));
  codegen::Executable exe(g);
  Tensor at = randn({2, 1, 3}), bt = randn({4, 1});
  std::vector<Tensor> out = exe.run({at, bt});
  CHECK(out[0].shape() == Shape{2, 4, 3});
  CHECK(max_diff(out[0], add(at, bt)) == 0);
}

TEST_CASE("Executable: maximum keeps NaN; non-contiguous input") {
  ir::Graph g;
  ir::Value a = g.input(DType::Float32, {3, 2});
  ir::Value b = g.input(DType::Float32, {3, 2});
  g.output(g.op(OpKind::Maximum, {a, b}));
  codegen::Executable exe(g);
  float nan = std::numeric_limits<float>::quiet_NaN();
  Tensor at = from_vector<float>({1, nan, 3, 4, 5, 6}, {2, 3}).transpose(0, 1);  // [3, 2] strided
  Tensor bt = from_vector<float>({2, 2, nan, 0, 0, 7}, {3, 2});
  Tensor out = exe.run({at, bt})[0];
  CHECK(max_diff(out, maximum(at, bt)) == 0);
  CHECK(std::isnan(out.contiguous().data<float>()[2]));
}

TEST_CASE("Executable: a dynamic dim runs on two sizes without recompiling") {
  codegen::Executable exe(square_plus({ir::kDynamic, 4}));
  for (int64_t n : {3, 1000}) {
    Tensor x = randn({n, 4});
    Tensor out = exe.run({x})[0];
    CHECK(out.shape() == Shape{n, 4});
    CHECK(max_diff(out, add(mul(x, x), x)) == 0);
  }
}

TEST_CASE("Executable: dynamic dims through a reduction ([?, ?] summed over dim 1)") {
  ir::Graph g;
  ir::Value x = g.input(DType::Float32, {ir::kDynamic, ir::kDynamic});
  OpAttrs cols;
  cols.dims = {1};
  g.output(g.op(OpKind::Sum, {g.op(OpKind::Mul, {x, x})}, cols));
  codegen::Executable exe(g);
  for (Shape shape : {Shape{3, 5}, Shape{7, 2}}) {
    Tensor xt = randn(shape);
    Tensor out = exe.run({xt})[0];
    CHECK(out.shape() == Shape{shape[0]});
    CHECK(max_diff(out, sum(mul(xt, xt), {1})) < 1e-5);
  }
}

TEST_CASE("Executable: a cat along a dynamic dim sizes its output from the inputs' dims") {
  // [1, ?, 4] ++ [1, 1, 4] along dim 1 (a KV cache grown by one) and 40 [?] inputs (lowered
  // to tensor.concat): the output's `?` is a sum of input dims plus a constant (DimFormula).
  // Both were rejected ("cannot tell a dynamic output dim"), so compile() ran such regions
  // compiled at their traced shapes only.
  ir::Graph g;
  ir::Value cache = g.input(DType::Float32, {1, ir::kDynamic, 4});
  ir::Value next = g.input(DType::Float32, {1, 1, 4});
  OpAttrs along_t;
  along_t.dim = 1;
  g.output(g.op(OpKind::Cat, {cache, g.op(OpKind::Tanh, {next})}, along_t));
  codegen::Executable exe(g);
  for (int64_t t : {1, 5, 33}) {
    Tensor c = randn({1, t, 4}), n = randn({1, 1, 4});
    Tensor out = exe.run({c, n})[0];
    CHECK(out.shape() == Shape{1, t + 1, 4});
    CHECK(max_diff(out, cat({c, tanh(n)}, 1)) < 1e-6);
  }
  ir::Graph many;
  std::vector<ir::Value> parts;
  OpAttrs dim0;  // (dim 0)
  for (int i = 0; i < 40; ++i)
    parts.push_back(many.op(OpKind::Exp, {many.input(DType::Float32, {ir::kDynamic})}));
  many.output(many.op(OpKind::Cat, parts, dim0));
  codegen::Executable exe_many(many);
  std::vector<Tensor> ins;
  for (int i = 0; i < 40; ++i) ins.push_back(randn({i % 3 + 1}));
  std::vector<Tensor> exps;
  for (const Tensor& t : ins) exps.push_back(exp(t));
  Tensor out = exe_many.run(ins)[0];
  CHECK(out.shape() == Shape{79});  // 14 * 1 + 13 * 2 + 13 * 3
  CHECK(max_diff(out, cat(exps, 0)) < 1e-6);
}

TEST_CASE("Executable: a float32 product accumulates in float64, as eager's") {
  // A break-it pass: in float32, a row with inf whose other factors underflowed gave
  // inf * 0 = NaN (eager -inf), and 3e38 times factors below 1 gave inf (eager and the float64
  // product: 0).
  manual_seed(1);
  std::vector<float> v = randn({3, 1025}).to_vector<float>();
  v[0 * 1025 + 512] = -INFINITY;
  v[1 * 1025 + 0] = 3e38f;
  Tensor x = from_vector(v, {3, 1025});
  ir::Graph g;
  OpAttrs each_row;
  each_row.dims = {1};
  g.output(g.op(OpKind::Prod, {g.input(DType::Float32, {3, 1025})}, each_row));
  std::vector<float> got = codegen::Executable(g).run({x})[0].to_vector<float>();
  for (int r = 0; r < 3; ++r) {
    long double want = 1;
    for (int j = 0; j < 1025; ++j) want *= v[r * 1025 + j];
    INFO("row " << r);
    CHECK(std::isinf(got[r]) == std::isinf(static_cast<float>(want)));
    CHECK(std::fabs(got[r]) == std::fabs(static_cast<float>(want)));  // 0 for rows 1 and 2
  }
  std::vector<float> eager = prod(x, {1}).to_vector<float>();
  for (int r = 0; r < 3; ++r) CHECK(eager[r] == got[r]);  // bit for bit: both in float64
}

TEST_CASE("Executable: row-parallel graphs equal eager across block boundaries") {
  cpu::set_num_threads(2);
  SECTION("elementwise with a broadcast bias, rows not a multiple of the block") {
    ir::Graph g;
    ir::Value x = g.input(DType::Float32, {1237, 301});
    ir::Value b = g.input(DType::Float32, {301});
    g.output(g.op(OpKind::Tanh, {g.op(OpKind::Add, {g.op(OpKind::Mul, {x, x}), b})}));
    codegen::Executable exe(g);
    CHECK(exe.row_parallel());
    Tensor xt = randn({1237, 301}), bt = randn({301});
    CHECK(max_diff(exe.run({xt, bt})[0], tanh(add(mul(xt, xt), bt))) < 2e-6);
    CHECK_THROWS_AS(exe.run({randn({1236, 301}), bt}), Error);  // dim 0 stays checked
  }
  SECTION("results sized by the rows of an input read only for its size: not split") {
    // x + x.t() filled with true (kiln-fuzz --large, seed 4, program 145): the fill folds the
    // reads away, leaving x.size(0) as both dims of [n, 1, n], which blocks of rows overran.
    ir::Graph g;
    ir::Value x = g.input(DType::Bool, {ir::kDynamic, 1, 1});
    OpAttrs t;
    t.dim = 2;
    t.dim1 = 0;
    ir::Value v = g.op(OpKind::Add, {x, g.op(OpKind::Transpose, {x}, t)});
    ir::Value yes = g.constant(true, DType::Bool);
    ir::Value filled = g.op(OpKind::Where, {g.op(OpKind::Eq, {v, v}), yes, yes});
    g.output(filled);
    g.output(g.op(OpKind::Add, {filled, g.constant(2.0, DType::Float32)}));
    codegen::Executable exe(g);
    CHECK_FALSE(exe.row_parallel());
    for (int64_t n : {258, 2000}) {
      std::vector<Tensor> r = exe.run({ones({n, 1, 1}, DType::Bool)});
      REQUIRE(r[1].shape() == Shape{n, 1, n});
      CHECK(r[1].sum().item<double>() == 3.0 * n * n);
      CHECK(r[0].to(DType::Float64).sum().item<double>() == double(n) * n);
    }
  }
  SECTION("row reduction with keepdim, then a broadcast divide (softmax-like, 2 outputs)") {
    ir::Graph g;
    ir::Value x = g.input(DType::Float32, {2000, 257});
    OpAttrs last;
    last.dims = {1};
    last.keepdim = true;
    ir::Value e = g.op(OpKind::Exp, {x});
    ir::Value s = g.op(OpKind::Sum, {e}, last);
    g.output(g.op(OpKind::Div, {e, s}));
    g.output(s);
    codegen::Executable exe(g);
    CHECK(exe.row_parallel());
    INFO(exe.linalg_ir());
    // exp (computed once, stored), sum (accumulated in float64), its rounding to float32 (the
    // sum is an output too, so the rounding is not fused into the divide), divide.
    CHECK(exe.num_loop_nests() == 4);
    CHECK(exe.num_kernels() == 1);     // both inside one parallel loop over row blocks
    Tensor xt = randn({2000, 257});
    std::vector<Tensor> out = exe.run({xt});
    Tensor es = sum(exp(xt), {1}, true);
    CHECK(max_diff(div(out[1], es), ones({2000, 1})) < 1e-5);
    CHECK(max_diff(out[0], div(exp(xt), es)) < 1e-6);
  }
  SECTION("x @ W + b: W and b are passed whole to every block") {
    ir::Graph g;
    ir::Value x = g.input(DType::Float32, {1500, 64});
    ir::Value w = g.input(DType::Float32, {64, 48});
    ir::Value b = g.input(DType::Float32, {48});
    g.output(g.op(OpKind::Add, {g.op(OpKind::Matmul, {x, w}), b}));
    codegen::Executable exe(g);
    CHECK(exe.row_parallel());
    Tensor xt = randn({1500, 64}), wt = randn({64, 48}), bt = randn({48});
    CHECK(max_diff(exe.run({xt, wt, bt})[0], add(matmul(xt, wt), bt)) < 1e-4);
  }
  SECTION("a reduction over the rows is not split and still right") {
    ir::Graph g;
    ir::Value x = g.input(DType::Float32, {3000, 100});
    OpAttrs rows;
    rows.dims = {0};
    g.output(g.op(OpKind::Sum, {g.op(OpKind::Mul, {x, x})}, rows));
    codegen::Executable exe(g);
    CHECK_FALSE(exe.row_parallel());
    Tensor xt = randn({3000, 100});
    Tensor ref = sum(mul(xt, xt), {0});
    CHECK(max_diff(div(exe.run({xt})[0], ref), ones({100})) < 1e-5);
  }
  SECTION("the same result with 1 and 2 threads (a row does not depend on its block)") {
    codegen::Executable exe(square_plus({1 << 18}, /*tanh=*/true));
    Tensor x = randn({1 << 18});
    cpu::set_num_threads(1);
    Tensor one = exe.run({x})[0];
    cpu::set_num_threads(2);
    CHECK(max_diff(exe.run({x})[0], one) == 0);
  }
}

TEST_CASE("Executable: concurrent run() from 4 threads on different sizes") {
  codegen::Executable exe(square_plus({ir::kDynamic, 8}, /*tanh=*/true));
  std::vector<Tensor> xs, refs;
  for (int64_t n : {5, 700, 20000, 33}) {
    xs.push_back(randn({n, 8}));
    refs.push_back(tanh(add(mul(xs.back(), xs.back()), xs.back())));
  }
  std::vector<double> worst(xs.size(), 0);
  std::vector<std::thread> threads;
  for (size_t t = 0; t < xs.size(); ++t)
    threads.emplace_back([&, t] {
      for (int rep = 0; rep < 50; ++rep) {
        Tensor out = exe.run({xs[t]})[0];
        const float* o = out.data<float>();
        const float* r = refs[t].data<float>();
        for (int64_t i = 0; i < out.numel(); ++i)
          worst[t] = std::max(worst[t], std::abs(double(o[i]) - double(r[i])));
      }
    });
  for (auto& th : threads) th.join();
  for (double w : worst) CHECK(w < 2e-6);
}

TEST_CASE("Executable: errors are kiln::Error") {
  codegen::Executable exe(square_plus({4}));
  CHECK_THROWS_AS(exe.run({randn({5})}), Error);
  CHECK_THROWS_AS(exe.run({}), Error);
  ir::Graph g;
  ir::Value x = g.input(DType::Float32, {ir::kDynamic});
  OpAttrs slice;
  slice.end = 2;
  g.output(g.op(OpKind::Slice, {x}, slice));  // slice of a `?` dim: no lowering
  CHECK_THROWS_AS(codegen::Executable(g), Error);
  // The message names the op and its operand types, not the dialect op that carries it (it
  // said "no lowering yet for: kiln.composite").
  ir::Graph empty_rows;
  OpAttrs last;
  last.dim = -1;
  empty_rows.output(
      empty_rows.op(OpKind::Softmax, {empty_rows.input(DType::Float32, {3, 0})}, last));
  std::string message;
  try {
    codegen::Executable exe0(empty_rows);
  } catch (const Error& e) {
    message = e.what();
  }
  CHECK(message.find("no lowering for softmax on tensor<3x0xf32>") != std::string::npos);
}

TEST_CASE("Executable: timing of x*x + x on 2^24 float32 (prints, not a check)", "[.timing]") {
  const int64_t n = int64_t(1) << 24;
  auto c0 = std::chrono::steady_clock::now();
  codegen::Executable exe(square_plus({ir::kDynamic}));
  double compile_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - c0).count();
  codegen::Executable exe_tanh(square_plus({ir::kDynamic}, /*tanh=*/true));
  Tensor x = randn({n});
  auto time = [](auto&& f) {
    double best = 1e9;
    for (int i = 0; i < 5; ++i) {
      auto t0 = std::chrono::steady_clock::now();
      f();
      best = std::min(best, std::chrono::duration<double, std::milli>(
                                std::chrono::steady_clock::now() - t0).count());
    }
    return best;
  };
  double jit = time([&] { exe.run({x}); });
  double eager = time([&] { add(mul(x, x), x); });
  double jit_tanh = time([&] { exe_tanh.run({x}); });
  double eager_tanh = time([&] { tanh(add(mul(x, x), x)); });
  std::printf("x*x + x on 2^24 float32: compiled %.2f ms, eager %.2f ms (compile %.1f ms)\n", jit,
              eager, compile_ms);
  std::printf("tanh(x*x + x) on 2^24 float32: compiled %.2f ms, eager %.2f ms\n", jit_tanh,
              eager_tanh);
}

TEST_CASE("Executable: timing of row sums over [4096, 1024] float32 (prints, not a check)",
          "[.timing]") {
  ir::Graph g;
  ir::Value x = g.input(DType::Float32, {4096, 1024});
  OpAttrs last;
  last.dims = {1};
  g.output(g.op(OpKind::Sum, {x}, last));
  g.output(g.op(OpKind::Amax, {x}, last));
  codegen::Executable exe(g);
  Tensor xt = randn({4096, 1024});
  for (int threads : {1, 2}) {
    cpu::set_num_threads(threads);
    double best_jit = 1e9, best_eager = 1e9;
    for (int i = 0; i < 10; ++i) {
      auto t0 = std::chrono::steady_clock::now();
      exe.run({xt});
      auto t1 = std::chrono::steady_clock::now();
      sum(xt, {1});
      amax(xt, {1});
      auto t2 = std::chrono::steady_clock::now();
      best_jit = std::min(best_jit, std::chrono::duration<double, std::milli>(t1 - t0).count());
      best_eager = std::min(best_eager, std::chrono::duration<double, std::milli>(t2 - t1).count());
    }
    std::printf("sum and amax (dim 1) of [4096, 1024], %d thread(s): compiled %.3f ms, eager %.3f ms\n",
                threads, best_jit, best_eager);
  }
}

TEST_CASE("Executable: timing of softmax from primitives on [4096, 1024] (prints, not a check)",
          "[.timing]") {
  ir::Graph g;
  ir::Value x = g.input(DType::Float32, {4096, 1024});
  OpAttrs last;
  last.dims = {1};
  last.keepdim = true;
  ir::Value e = g.op(OpKind::Exp, {g.op(OpKind::Sub, {x, g.op(OpKind::Amax, {x}, last)})});
  // Like eager: multiply by 1 / sum.
  g.output(g.op(OpKind::Mul, {e, g.op(OpKind::Reciprocal, {g.op(OpKind::Sum, {e}, last)})}));
  codegen::Executable exe(g);
  Tensor xt = randn({4096, 1024});
  CHECK(max_diff(exe.run({xt})[0], softmax(xt, -1)) < 1e-6);
  for (int threads : {1, 2}) {
    cpu::set_num_threads(threads);
    double best_jit = 1e9, best_eager = 1e9;
    for (int i = 0; i < 20; ++i) {
      auto t0 = std::chrono::steady_clock::now();
      exe.run({xt});
      auto t1 = std::chrono::steady_clock::now();
      softmax(xt, -1);
      auto t2 = std::chrono::steady_clock::now();
      best_jit = std::min(best_jit, std::chrono::duration<double, std::milli>(t1 - t0).count());
      best_eager = std::min(best_eager, std::chrono::duration<double, std::milli>(t2 - t1).count());
    }
    std::printf("softmax [4096, 1024], %d thread(s): compiled %.3f ms, eager %.3f ms\n", threads,
                best_jit, best_eager);
  }
}

TEST_CASE("Executable: timing of softmax's parts on [4096, 1024] (prints, not a check)",
          "[.timing]") {
  cpu::set_num_threads(1);
  OpAttrs last;
  last.dims = {1};
  last.keepdim = true;
  auto time_graph = [&](const char* what, ir::Graph g, std::vector<Tensor> in) {
    codegen::Executable exe(g);
    double best = 1e9;
    for (int i = 0; i < 20; ++i) {
      auto t0 = std::chrono::steady_clock::now();
      exe.run(in);
      best = std::min(best, std::chrono::duration<double, std::milli>(
                                std::chrono::steady_clock::now() - t0).count());
    }
    std::printf("%-28s %.3f ms (1 thread, %d loop nests, row-parallel %d)\n", what, best, exe.num_loop_nests(), int(exe.row_parallel()));
  };
  Tensor x = randn({4096, 1024}), m = randn({4096, 1}), r = randn({4096, 1});
  {
    ir::Graph g;
    ir::Value xi = g.input(DType::Float32, {4096, 1024});
    g.output(g.op(OpKind::Amax, {xi}, last));
    time_graph("amax", std::move(g), {x});
  }
  {
    ir::Graph g;
    ir::Value xi = g.input(DType::Float32, {4096, 1024});
    ir::Value mi = g.input(DType::Float32, {4096, 1});
    g.output(g.op(OpKind::Sum, {g.op(OpKind::Exp, {g.op(OpKind::Sub, {xi, mi})})}, last));
    time_graph("sum(exp(x - m))", std::move(g), {x, m});
  }
  {
    ir::Graph g;
    ir::Value xi = g.input(DType::Float32, {4096, 1024});
    ir::Value mi = g.input(DType::Float32, {4096, 1});
    ir::Value ri = g.input(DType::Float32, {4096, 1});
    g.output(g.op(OpKind::Mul, {g.op(OpKind::Exp, {g.op(OpKind::Sub, {xi, mi})}), ri}));
    time_graph("exp(x - m) * r", std::move(g), {x, m, r});
  }
  {
    ir::Graph g;
    ir::Value xi = g.input(DType::Float32, {4096, 1024});
    g.output(g.op(OpKind::Exp, {xi}));
    time_graph("exp(x)", std::move(g), {x});
  }
  {
    ir::Graph g;
    OpAttrs a;
    a.dim = -1;
    g.output(g.op(OpKind::Softmax, {g.input(DType::Float32, {4096, 1024})}, a));
    time_graph("softmax", std::move(g), {x});
  }
  double best = 1e9;
  for (int i = 0; i < 20; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    softmax(x, -1);
    best = std::min(best, std::chrono::duration<double, std::milli>(
                              std::chrono::steady_clock::now() - t0).count());
  }
  std::printf("%-28s %.3f ms (1 thread)\n", "eager softmax", best);
  best = 1e9;
  for (int i = 0; i < 20; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    exp(x);
    best = std::min(best, std::chrono::duration<double, std::milli>(
                              std::chrono::steady_clock::now() - t0).count());
  }
  std::printf("%-28s %.3f ms (1 thread)\n", "eager exp", best);
}

TEST_CASE("Executable: float32 exp follows eager's algorithm (within 1 ulp, edge cases)") {
  const int64_t n = 4096;
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = -104.f + 208.f * float(i) / float(n);  // past both limits
  const float inf = std::numeric_limits<float>::infinity();
  for (float special : {0.f, -0.f, 1e-8f, -88.3f, -88.4f, 88.3f, 88.4f, inf, -inf, kNaNf()})
    v.push_back(special);
  v.resize(static_cast<size_t>((v.size() + 15) / 16 * 16), 1.f);  // whole vectors in eager too
  Tensor x = from_vector<float>(v, {static_cast<int64_t>(v.size())});
  ir::Graph g;
  g.output(g.op(OpKind::Exp, {g.input(DType::Float32, {ir::kDynamic})}));
  codegen::Executable exe(g);
  Tensor got = exe.run({x})[0], want = exp(x);
  int64_t exact = 0;
  for (int64_t i = 0; i < x.numel(); ++i) {
    float a = got.data<float>()[i], b = want.data<float>()[i];
    INFO("x = " << v[static_cast<size_t>(i)] << ": compiled " << a << ", eager " << b);
    if (std::isnan(b)) {
      CHECK(std::isnan(a));
      ++exact;
      continue;
    }
    if (a != b)  // 1 ulp; for denormal results (below -87.3) the spacing is 2^-149
      CHECK(std::abs(double(a) - double(b)) <= std::max(1.2e-7 * std::abs(double(b)), 0x1p-149));
    exact += a == b;
  }
  // Within 1 ulp everywhere; most values identical (eager's kernels and the JIT contract
  // a few multiply-adds differently).
  CHECK(exact >= x.numel() * 95 / 100);
}

namespace {

/// a @ b as a graph (float32, [m, k] @ [k, n]).
ir::Graph matmul_graph(int64_t m, int64_t k, int64_t n, DType dt = DType::Float32) {
  ir::Graph g;
  ir::Value a = g.input(dt, {m, k}), b = g.input(dt, {k, n});
  g.output(g.op(OpKind::Matmul, {a, b}));
  return g;
}

/// Compiles `g` with the extern GEMM call (default) or with the generated loops
/// (KILN_NO_EXTERN_GEMM=1, read by the kiln-extern-calls pass at compile time and part of the
/// compile cache's key; both caches are bypassed anyway, so each call really compiles).
codegen::Executable compile(const ir::Graph& g, bool extern_gemm) {
  if (!extern_gemm) setenv("KILN_NO_EXTERN_GEMM", "1", 1);
  codegen::CompileOptions no_cache;
  no_cache.memory_cache = no_cache.disk_cache = false;
  codegen::Executable exe(g, no_cache);
  unsetenv("KILN_NO_EXTERN_GEMM");
  return exe;
}

}  // namespace

TEST_CASE("Executable: matmul through the runtime GEMM and through loops equals eager") {
  for (DType dt : {DType::Float32, DType::Float64}) {
    Tensor a = randn({33, 70}).to(dt), b = randn({70, 19}).to(dt);
    Tensor want = matmul(a, b).to(DType::Float64);
    for (bool ext : {true, false}) {
      std::vector<Tensor> out = compile(matmul_graph(33, 70, 19, dt), ext).run({a, b});
      REQUIRE(out[0].dtype() == dt);
      Tensor diff = abs(sub(out[0].to(DType::Float64), want));
      CHECK(amax(diff, {0, 1}).item<double>() < (dt == DType::Float32 ? 1e-4 : 1e-12));
    }
  }
}

TEST_CASE("Executable: timing of matmul 1024^3 float32 (prints, not a check)", "[.timing]") {
  const int64_t n = 1024;
  Tensor a = randn({n, n}), b = randn({n, n});
  auto time = [](auto&& f, int reps) {  // best of `reps` (the machine is shared)
    double best = 1e9;
    for (int i = 0; i < reps; ++i) {
      auto t0 = std::chrono::steady_clock::now();
      f();
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    return best;
  };
  double flop = 2.0 * n * n * n;
  codegen::Executable ext = compile(matmul_graph(n, n, n), true);
  codegen::Executable loops = compile(matmul_graph(n, n, n), false);
  double t_ext = time([&] { ext.run({a, b}); }, 10);
  double t_eager = time([&] { matmul(a, b); }, 10);
  double t_loops = time([&] { loops.run({a, b}); }, 1);
  std::printf("matmul 1024x1024x1024 float32: compiled + extern GEMM %.1f GFLOP/s, compiled loops "
              "%.1f GFLOP/s, eager %.1f GFLOP/s\n",
              flop / t_ext * 1e-9, flop / t_loops * 1e-9, flop / t_eager * 1e-9);
}

namespace {

/// Largest |b| (float32): the scale for relative comparisons.
double max_abs(const Tensor& b) {
  Tensor bc = b.contiguous();
  const float* p = bc.data<float>();
  double m = 0;
  for (int64_t i = 0; i < b.numel(); ++i) m = std::max(m, std::abs(double(p[i])));
  return m;
}

OpAttrs slice_attrs(int64_t dim, int64_t start, int64_t end, int64_t step = 1) {
  OpAttrs s;  // as Tensor::slice
  s.dim = dim;
  s.start = start;
  s.end = end;
  s.step = step;
  return s;
}

/// nn::MultiheadAttention's in-projection as the tracer records it: x @ w[start:end].t() +
/// b[start:end], with w [3E, E] and b [3E] graph inputs.
ir::Graph in_projection(const Shape& x_shape, int64_t e, int64_t start) {
  ir::Graph g;
  ir::Value w = g.input(DType::Float32, {3 * e, e});
  ir::Value b = g.input(DType::Float32, {3 * e});
  ir::Value x = g.input(DType::Float32, x_shape.vec());
  OpAttrs s = slice_attrs(0, start, start + e);
  ir::Value wq = g.op(OpKind::Slice, {w}, s);
  ir::Value bq = g.op(OpKind::Slice, {b}, s);
  OpAttrs t;  // as Tensor::transpose(0, 1)
  t.dim = 0;
  t.dim1 = 1;
  ir::Value wt = g.op(OpKind::Transpose, {wq}, t);
  g.output(g.op(OpKind::Add, {g.op(OpKind::Matmul, {x, wt}), bq}));
  return g;
}

void check_in_projection(const Shape& x_shape, int64_t e, bool row_parallel) {
  Tensor w = randn({3 * e, e}), b = randn({3 * e}), x = randn(x_shape);
  for (int64_t start : {int64_t(0), e, 2 * e}) {
    INFO("x " << to_string(x_shape) << ", slice " << start << ".." << start + e);
    codegen::Executable exe(in_projection(x_shape, e, start));
    INFO(exe.linalg_ir());
    // Rows relaxed to `?`: the weight's slices and transpose are computed whole by each block.
    CHECK(exe.row_parallel() == row_parallel);
    std::vector<Tensor> out = exe.run({w, b, x});
    REQUIRE(out.size() == 1);
    Tensor ref = add(matmul(x, w.slice(0, start, start + e).t()), b.slice(0, start, start + e));
    CHECK(max_diff(out[0], ref) <= 1e-5 * max_abs(ref));
  }
}

}  // namespace

// A slice starting at 0 with step 1 used to lower to a copy whose input map is the plain dim `i`
// (`0 + 1 * i` folds), which linalg reads as "this operand's dim is the loop range": the [96]
// input gave 96 iterations for a [32] slice ("inferred input/output operand #1 has shape's
// dimension #0 to be 96, but found 32"), in the copy and in every consumer it fused into.
TEST_CASE("Executable: MultiheadAttention in-projection (slices of w and b) equals eager") {
  check_in_projection({2, 8, 32}, 32, /*row_parallel=*/true);
}

TEST_CASE("Executable: large MultiheadAttention in-projection equals eager") {
  check_in_projection({64, 128, 256}, 256, /*row_parallel=*/true);
  // As many rows as w has: w, which views read, keeps its static size; x's rows are split.
  check_in_projection({96, 4, 32}, 32, /*row_parallel=*/true);
}

TEST_CASE("Executable: slices and selects of inputs feeding elementwise ops and matmul") {
  SECTION("prefix slice along dim 0 and dim 1 into add") {
    for (int64_t dim : {0, 1}) {
      ir::Graph g;
      ir::Value x = g.input(DType::Float32, {5, 6});
      ir::Value y = g.input(DType::Float32, {3, 3});
      ir::Value s = g.op(OpKind::Slice, {x}, slice_attrs(0, 0, 3));
      ir::Value s2 = g.op(OpKind::Slice, {s}, slice_attrs(1, 0, 3));
      g.output(g.op(OpKind::Add, {dim == 0 ? s2 : g.op(OpKind::Mul, {s2, s2}), y}));
      codegen::Executable exe(g);
      INFO(exe.linalg_ir());
      Tensor xt = randn({5, 6}), yt = randn({3, 3});
      Tensor sx = xt.slice(0, 0, 3).slice(1, 0, 3);
      Tensor ref = add(dim == 0 ? sx : mul(sx, sx), yt);
      CHECK(max_diff(exe.run({xt, yt})[0], ref) == 0);
    }
  }
  SECTION("prefix slice as a graph output, next to a `?` dim") {
    ir::Graph g;
    ir::Value x = g.input(DType::Float32, {ir::kDynamic, 96});
    g.output(g.op(OpKind::Slice, {x}, slice_attrs(1, 0, 32)));
    g.output(g.op(OpKind::Neg, {g.op(OpKind::Slice, {x}, slice_attrs(-1, 0, 40))}));
    codegen::Executable exe(g);
    INFO(exe.linalg_ir());
    for (int64_t n : {1, 7}) {
      Tensor xt = randn({n, 96});
      std::vector<Tensor> out = exe.run({xt});
      REQUIRE(out.size() == 2);
      CHECK(max_diff(out[0], xt.slice(1, 0, 32)) == 0);
      CHECK(max_diff(out[1], neg(xt.slice(1, 0, 40))) == 0);
    }
  }
  SECTION("select and strided/offset slices of a weight into matmul, bias slice into add") {
    ir::Graph g;
    ir::Value w = g.input(DType::Float32, {3, 64, 16});
    ir::Value b = g.input(DType::Float32, {48});
    ir::Value x = g.input(DType::Float32, {4, 16});
    OpAttrs sel;  // as Tensor::select(0, 1)
    sel.dim = 0;
    sel.start = 1;
    ir::Value w1 = g.op(OpKind::Select, {w}, sel);                          // [64, 16]
    ir::Value w2 = g.op(OpKind::Slice, {w1}, slice_attrs(0, 0, 32, 2));   // [16, 16]
    ir::Value w3 = g.op(OpKind::Slice, {w1}, slice_attrs(0, 0, 16));      // [16, 16]
    OpAttrs t;
    t.dim = 0;
    t.dim1 = 1;
    ir::Value m = g.op(OpKind::Matmul, {x, g.op(OpKind::Transpose, {w2}, t)});
    ir::Value m2 = g.op(OpKind::Matmul, {x, w3});
    ir::Value bias = g.op(OpKind::Slice, {b}, slice_attrs(0, 16, 32));
    g.output(g.op(OpKind::Add, {g.op(OpKind::Add, {m, m2}), bias}));
    codegen::Executable exe(g);
    INFO(exe.linalg_ir());
    Tensor wt = randn({3, 64, 16}), bt = randn({48}), xt = randn({4, 16});
    Tensor w1t = wt.select(0, 1);
    Tensor ref = add(add(matmul(xt, w1t.slice(0, 0, 32, 2).t()), matmul(xt, w1t.slice(0, 0, 16))),
                     bt.slice(0, 16, 32));
    CHECK(max_diff(exe.run({wt, bt, xt})[0], ref) <= 1e-5 * max_abs(ref));
  }
}

// Linear layers as the tracer records them: the matmuls must reach the runtime GEMM (BLAS), with
// the weight's transpose folded into the call (trans flags) instead of copied, and an N-D x
// collapsed into one GEMM over its rows (codegen/lower.cpp, extern_calls.cpp).
namespace {

/// max |a - b| / max |b| in float64 (same shape).
double rel_diff(const Tensor& a, const Tensor& b) {
  REQUIRE(a.shape() == b.shape());
  Tensor a64 = a.to(DType::Float64).contiguous(), b64 = b.to(DType::Float64).contiguous();
  double scale = amax(abs(b64), {}).item<double>();
  double d = amax(abs(sub(a64, b64)), {}).item<double>();
  return scale == 0 ? d : d / scale;
}

OpAttrs transpose_attrs(int64_t d0, int64_t d1) {
  OpAttrs t;  // as Tensor::transpose(d0, d1)
  t.dim = d0;
  t.dim1 = d1;
  return t;
}

/// The fused IR reads `w` in place: no transpose copy, a (possibly transposed-map) named matmul.
void check_gemm_ir(const codegen::Executable& exe) {
  const std::string& ir = exe.linalg_ir();
  INFO(ir);
  CHECK(ir.find("linalg.transpose") == std::string::npos);
  CHECK((ir.find("linalg.matmul") != std::string::npos ||
         ir.find("linalg.batch_matmul") != std::string::npos));
}

/// Runs `exe` and checks that it called the runtime GEMM `calls` times at least.
std::vector<Tensor> run_counting_gemm(const codegen::Executable& exe, const std::vector<Tensor>& in,
                                      uint64_t calls = 1) {
  uint64_t before = codegen::gemm_calls();
  std::vector<Tensor> out = exe.run(in);
  CHECK(codegen::gemm_calls() - before >= calls);
  return out;
}

}  // namespace

// A batch of tiny products (attention over short heads, per-item transforms): the runtime
// GEMM runs them through cpu::small_gemm_batch, as eager matmul does, so compiled code gives
// eager's bits: each product is one fixed chain of multiply-adds however the batch is split.
TEST_CASE("Executable: a batch of tiny products runs the small-matrix kernel, eager's bits") {
  for (DType dt : {DType::Float32, DType::Float64})
    for (bool trans_b : {false, true}) {
      INFO("dtype " << kiln::name(dt) << (trans_b ? ", B transposed" : ""));
      const int64_t nb = 512, m = 8, n = 5, k = 12;
      REQUIRE(cpu::small_gemm_fits(m, n, k));
      ir::Graph g;
      ir::Value a = g.input(dt, {nb, m, k});
      ir::Value b = g.input(dt, trans_b ? std::vector<int64_t>{nb, n, k}
                                        : std::vector<int64_t>{nb, k, n});
      ir::Value bb = trans_b ? g.op(OpKind::Transpose, {b}, transpose_attrs(1, 2)) : b;
      g.output(g.op(OpKind::Matmul, {a, bb}));
      codegen::Executable exe(g);
      check_gemm_ir(exe);
      Tensor at = randn({nb, m, k}).to(dt);
      Tensor bt = randn(trans_b ? Shape{nb, n, k} : Shape{nb, k, n}).to(dt);
      std::vector<Tensor> out = run_counting_gemm(exe, {at, bt});
      Tensor want = matmul(at, trans_b ? bt.transpose(1, 2) : bt);
      CHECK(out[0].to_vector<double>() == want.to_vector<double>());
      Tensor ref = matmul(at.to(DType::Float64),
                          (trans_b ? bt.transpose(1, 2) : bt).to(DType::Float64));
      CHECK(rel_diff(out[0], ref) < (dt == DType::Float32 ? 1e-6 : 1e-14));
    }
}

TEST_CASE("Executable: Linear forward x @ W.t() + b runs one GEMM with trans_b (2-D and 3-D)") {
  for (DType dt : {DType::Float32, DType::Float64}) {
    for (Shape xs : {Shape{8, 128, 256}, Shape{64, 256}, Shape{2, 3, 5, 256}}) {
      INFO("dtype " << kiln::name(dt) << ", x " << to_string(xs));
      ir::Graph g;
      ir::Value x = g.input(dt, xs.vec());
      ir::Value w = g.input(dt, {1024, 256});
      ir::Value b = g.input(dt, {1024});
      ir::Value wt = g.op(OpKind::Transpose, {w}, transpose_attrs(0, 1));
      g.output(g.op(OpKind::Add, {g.op(OpKind::Matmul, {x, wt}), b}));
      codegen::Executable exe(g);
      check_gemm_ir(exe);
      if (xs.size() > 2) CHECK(exe.linalg_ir().find("tensor.collapse_shape") != std::string::npos);
      // x's rows split over the thread pool; w is passed whole and never copied per block.
      CHECK(exe.row_parallel());
      Tensor xt = randn(xs).to(dt), wt_ = randn({1024, 256}).to(dt), bt = randn({1024}).to(dt);
      std::vector<Tensor> out = run_counting_gemm(exe, {xt, wt_, bt});
      REQUIRE(out.size() == 1);
      REQUIRE(out[0].dtype() == dt);
      CHECK(rel_diff(out[0], add(matmul(xt, wt_.t()), bt)) < 1e-4);
    }
  }
}

// x @ W.t() + b (nn::Linear as traced on [B, T, K]) and addmm (2-D): the bias is the GEMM's C
// (broadcast into the output, then the GEMM accumulates: beta = 1), no add loop after the GEMM
// (codegen/fusion.cpp); the GEMM writes the graph's output buffer (through the expand_shape).
TEST_CASE("Executable: Linear's bias is the GEMM's C (broadcast, then accumulate) vs float64") {
  for (DType dt : {DType::Float32, DType::Float64}) {
    for (bool addmm : {false, true}) {
      Shape xs = addmm ? Shape{256, 128} : Shape{8, 64, 128};
      INFO("dtype " << kiln::name(dt) << (addmm ? ", addmm" : ", matmul + add"));
      ir::Graph g;
      ir::Value x = g.input(dt, xs.vec());
      ir::Value w = g.input(dt, {96, 128});
      ir::Value b = g.input(dt, {96});
      ir::Value wt = g.op(OpKind::Transpose, {w}, transpose_attrs(0, 1));
      g.output(addmm ? g.op(OpKind::Addmm, {b, x, wt})
                     : g.op(OpKind::Add, {g.op(OpKind::Matmul, {x, wt}), b}));
      codegen::Executable exe(g);
      const std::string& ir = exe.linalg_ir();
      INFO(ir);
      CHECK(ir.find("linalg.broadcast") != std::string::npos);
      CHECK(ir.find("linalg.generic") == std::string::npos);
      CHECK(ir.find("linalg.fill") == std::string::npos);
      CHECK(exe.num_loop_nests() == 2);  // the bias broadcast and the GEMM
      CHECK(exe.row_parallel());
      Tensor xt = randn(xs).to(dt), wt_ = randn({96, 128}).to(dt), bt = (randn({96}) * 10).to(dt);
      std::vector<Tensor> out = run_counting_gemm(exe, {xt, wt_, bt});
      REQUIRE(out.size() == 1);
      Tensor ref = add(matmul(xt.to(DType::Float64), wt_.to(DType::Float64).t()), bt.to(DType::Float64));
      CHECK(rel_diff(out[0], ref) < (dt == DType::Float32 ? 2e-6 : 1e-14));
      CHECK(rel_diff(out[0], add(matmul(xt, wt_.t()), bt)) < (dt == DType::Float32 ? 2e-6 : 1e-14));
    }
  }
}

// The transformer's feed-forward input and MHA in-projection: layer_norm -> Linear -> gelu with
// the bias added in gelu's loop, and the heads view x.view(B, T, H, D).transpose(1, 2) of a
// GEMM's result (dim 0 kept: still row-parallel, row_split.cpp), against eager.
TEST_CASE("Executable: layer_norm -> Linear -> gelu, and attention heads of a Linear, row-parallel") {
  const int64_t B = 8, T = 64, E = 64, F = 256, H = 4, D = E / H;
  Tensor x = randn({B, T, E}), lw = randn({E}), lb = randn({E});
  Tensor w1 = randn({F, E}) * 0.1, b1 = randn({F}), wq = randn({E, E}) * 0.1, bq = randn({E});
  {
    ir::Graph g;
    ir::Value xv = g.input(DType::Float32, {B, T, E});
    ir::Value lwv = g.input(DType::Float32, {E}), lbv = g.input(DType::Float32, {E});
    ir::Value wv = g.input(DType::Float32, {F, E}), bv = g.input(DType::Float32, {F});
    OpAttrs ln;
    ln.dims = Dims{E};
    ln.eps = 1e-5;
    ir::Value h = g.op(OpKind::LayerNorm, {xv, lwv, lbv}, ln);
    ir::Value y = g.op(OpKind::Add, {g.op(OpKind::Matmul, {h, g.op(OpKind::Transpose, {wv}, transpose_attrs(0, 1))}), bv});
    g.output(g.op(OpKind::Gelu, {y}));
    codegen::Executable exe(g);
    INFO(exe.linalg_ir());
    CHECK(exe.row_parallel());
    // The add's only user is gelu: it fuses into gelu's loop, not into the GEMM's C (fusion.cpp).
    CHECK(exe.linalg_ir().find("linalg.broadcast") == std::string::npos);
    std::vector<Tensor> out = run_counting_gemm(exe, {x, lw, lb, w1, b1});
    Tensor ref = gelu(add(matmul(layer_norm(x, {E}, lw, lb), w1.t()), b1));
    CHECK(max_diff(out[0], ref) < 1e-5 * max_abs(ref));
  }
  {
    ir::Graph g;
    ir::Value xv = g.input(DType::Float32, {B, T, E});
    ir::Value wv = g.input(DType::Float32, {E, E}), bv = g.input(DType::Float32, {E});
    ir::Value y = g.op(OpKind::Add, {g.op(OpKind::Matmul, {xv, g.op(OpKind::Transpose, {wv}, transpose_attrs(0, 1))}), bv});
    OpAttrs heads;
    heads.dims = Dims({B, T, H, D});
    ir::Value q = g.op(OpKind::Transpose, {g.op(OpKind::View, {y}, heads)}, transpose_attrs(1, 2));
    g.output(g.op(OpKind::Mul, {q, g.constant(Scalar(0.25), DType::Float32)}));
    g.output(g.op(OpKind::Transpose, {q}, transpose_attrs(-1, -2)));
    codegen::Executable exe(g);
    INFO(exe.linalg_ir());
    CHECK(exe.row_parallel());
    std::vector<Tensor> out = run_counting_gemm(exe, {x, wq, bq});
    REQUIRE(out.size() == 2);
    Tensor qr = add(matmul(x, wq.t()), bq).view({B, T, H, D}).transpose(1, 2);
    CHECK(max_diff(out[0], mul(qr, 0.25)) < 1e-5 * max_abs(qr));
    CHECK(max_diff(out[1], qr.transpose(-1, -2)) < 1e-5 * max_abs(qr));
  }
  {  // heads merged back: (attn @ v).transpose(1, 2).view(B, T, E), then the out-projection
    ir::Graph g;
    ir::Value av = g.input(DType::Float32, {B, H, T, T}), vv = g.input(DType::Float32, {B, H, T, D});
    ir::Value wv = g.input(DType::Float32, {E, E}), bv = g.input(DType::Float32, {E});
    OpAttrs merged;
    merged.dims = Dims({B, T, E});
    ir::Value m = g.op(OpKind::View, {g.op(OpKind::Transpose, {g.op(OpKind::Matmul, {av, vv})}, transpose_attrs(1, 2))}, merged);
    g.output(m);
    g.output(g.op(OpKind::Add, {g.op(OpKind::Matmul, {m, g.op(OpKind::Transpose, {wv}, transpose_attrs(0, 1))}), bv}));
    codegen::Executable exe(g);
    INFO(exe.linalg_ir());
    CHECK(exe.row_parallel());
    Tensor at = softmax(randn({B, H, T, T}), -1), vt = randn({B, H, T, D});
    std::vector<Tensor> out = run_counting_gemm(exe, {at, vt, wq, bq}, 2);
    REQUIRE(out.size() == 2);
    Tensor mr = matmul(at, vt).transpose(1, 2).reshape({B, T, E});
    Tensor yr = add(matmul(mr, wq.t()), bq);
    CHECK(max_diff(out[0], mr) < 1e-5 * max_abs(mr));
    CHECK(max_diff(out[1], yr) < 1e-5 * max_abs(yr));
  }
}

// The transformer benchmark's Linear regions (d_model 256, feed-forward 1024, batch 8 x 128),
// compiled vs the same ops on eager kernels: medians of 60 alternating runs, so that load from
// other jobs on the shared machine hits both about equally.
TEST_CASE("Executable: timing of the transformer's Linear regions vs eager (prints, not a check)",
          "[.timing]") {
  const int64_t B = 8, T = 128, E = 256, F = 1024;
  auto now = [] { return std::chrono::steady_clock::now(); };
  auto report = [&](const char* name, const codegen::Executable& exe, const std::vector<Tensor>& in,
                    auto&& eager) {
    std::vector<double> tc, te;
    for (int i = 0; i < 61; ++i) {
      auto t0 = now();
      exe.run(in);
      auto t1 = now();
      eager();
      auto t2 = now();
      if (i == 0) continue;  // warm-up
      tc.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
      te.push_back(std::chrono::duration<double, std::micro>(t2 - t1).count());
    }
    std::sort(tc.begin(), tc.end());
    std::sort(te.begin(), te.end());
    std::printf("%-40s eager %7.0f us, compiled %7.0f us (medians): compiled / eager %.2f\n", name,
                te[30], tc[30], tc[30] / te[30]);
  };
  for (auto [K, N] : {std::pair<int64_t, int64_t>{F, E}, {E, F}}) {
    ir::Graph g;
    ir::Value x = g.input(DType::Float32, {B, T, K});
    ir::Value w = g.input(DType::Float32, {N, K});
    ir::Value b = g.input(DType::Float32, {N});
    g.output(g.op(OpKind::Add, {g.op(OpKind::Matmul, {x, g.op(OpKind::Transpose, {w}, transpose_attrs(0, 1))}), b}));
    std::vector<Tensor> in = {randn({B, T, K}), randn({N, K}) * 0.05, randn({N})};
    report(K == F ? "x [8,128,1024] @ W.t() + b -> 256" : "x [8,128,256] @ W.t() + b -> 1024",
           codegen::Executable(g), in, [&] { return add(matmul(in[0], in[1].t()), in[2]); });
  }
  ir::Graph g;
  ir::Value x = g.input(DType::Float32, {B, T, E}), r = g.input(DType::Float32, {B, T, E});
  ir::Value lw = g.input(DType::Float32, {E}), lb = g.input(DType::Float32, {E});
  ir::Value w = g.input(DType::Float32, {F, E}), b = g.input(DType::Float32, {F});
  OpAttrs ln;
  ln.dims = Dims{E};
  ln.eps = 1e-5;
  ir::Value h = g.op(OpKind::LayerNorm, {g.op(OpKind::Add, {x, r}), lw, lb}, ln);
  g.output(g.op(OpKind::Gelu, {g.op(OpKind::Add, {g.op(OpKind::Matmul, {h, g.op(OpKind::Transpose, {w}, transpose_attrs(0, 1))}), b})}));
  std::vector<Tensor> in = {randn({B, T, E}), randn({B, T, E}), randn({E}), randn({E}), randn({F, E}) * 0.05, randn({F})};
  report("gelu(layer_norm(x + r) @ W.t() + b)", codegen::Executable(g), in, [&] {
    return gelu(add(matmul(layer_norm(add(in[0], in[1]), {E}, in[2], in[3]), in[4].t()), in[5]));
  });
}

TEST_CASE("Executable: Linear backward products run GEMMs with trans flags") {
  // grad_out [B*T, N], input [B*T, K], w [N, K]: grad_w = g.t() @ x (trans_a),
  // grad_x = g @ w (plain), and both transposed: x.t() @ g.t()... as (g @ x).t() is not a
  // product; (w.t() @ g.t()) = (g @ w).t() exercises trans_a and trans_b together.
  const int64_t bt_rows = 1024, n = 512, k = 256;
  for (DType dt : {DType::Float32, DType::Float64}) {
    INFO("dtype " << kiln::name(dt));
    Tensor gt = randn({bt_rows, n}).to(dt), xt = randn({bt_rows, k}).to(dt), wt_ = randn({n, k}).to(dt);
    {
      ir::Graph g;
      ir::Value go = g.input(dt, {bt_rows, n});
      ir::Value x = g.input(dt, {bt_rows, k});
      g.output(g.op(OpKind::Matmul, {g.op(OpKind::Transpose, {go}, transpose_attrs(0, 1)), x}));
      codegen::Executable exe(g);
      check_gemm_ir(exe);
      std::vector<Tensor> out = run_counting_gemm(exe, {gt, xt});
      CHECK(rel_diff(out[0], matmul(gt.t(), xt)) < 1e-4);
    }
    {
      ir::Graph g;
      ir::Value w = g.input(dt, {n, k});
      ir::Value go = g.input(dt, {bt_rows, n});
      g.output(g.op(OpKind::Matmul, {g.op(OpKind::Transpose, {w}, transpose_attrs(0, 1)),
                                     g.op(OpKind::Transpose, {go}, transpose_attrs(-1, -2))}));
      codegen::Executable exe(g);
      check_gemm_ir(exe);
      std::vector<Tensor> out = run_counting_gemm(exe, {wt_, gt});
      CHECK(rel_diff(out[0], matmul(wt_.t(), gt.t())) < 1e-4);
    }
    {  // 3-D: grad_w = g.reshape(-1, N).t() @ x.reshape(-1, K), grad_x = g @ w
      ir::Graph g;
      ir::Value go = g.input(dt, {8, 128, n});
      ir::Value x = g.input(dt, {8, 128, k});
      ir::Value w = g.input(dt, {n, k});
      OpAttrs v2n, v2k;
      v2n.dims = Dims({-1, n});
      v2k.dims = Dims({-1, k});
      ir::Value g2 = g.op(OpKind::View, {go}, v2n);
      ir::Value x2 = g.op(OpKind::View, {x}, v2k);
      g.output(g.op(OpKind::Matmul, {g.op(OpKind::Transpose, {g2}, transpose_attrs(0, 1)), x2}));
      g.output(g.op(OpKind::Matmul, {go, w}));
      codegen::Executable exe(g);
      check_gemm_ir(exe);
      Tensor g3 = randn({8, 128, n}).to(dt), x3 = randn({8, 128, k}).to(dt);
      std::vector<Tensor> out = run_counting_gemm(exe, {g3, x3, wt_}, 2);
      REQUIRE(out.size() == 2);
      CHECK(rel_diff(out[0], matmul(g3.view({-1, n}).t(), x3.view({-1, k}))) < 1e-4);
      CHECK(rel_diff(out[1], matmul(g3, wt_)) < 1e-4);
    }
  }
}

// Autograd's weight gradient of x @ W.t() is (x.t() @ g).t() (scaled by addmm's alpha = 1):
// kiln-decompose rewrites it into g.t() @ x, so the GEMM writes the result in place (trans_a)
// instead of a GEMM into a temporary and a transposing copy. Against float64 references; a
// product with another use, and a batched product that broadcasts, keep their transposes.
TEST_CASE("Executable: a transposed product (x.t() @ g).t() is one GEMM without a transpose copy") {
  for (DType dt : {DType::Float32, DType::Float64}) {
    INFO("dtype " << kiln::name(dt));
    const double tol = dt == DType::Float32 ? 2e-6 : 1e-13;
    Tensor xt = randn({96, 40}).to(dt), gt = randn({96, 24}).to(dt);
    auto ref = [](const Tensor& a, const Tensor& b) {  // (a.t() @ b).t() in float64
      return matmul(a.to(DType::Float64).t(), b.to(DType::Float64)).t();
    };
    {
      ir::Graph g;
      ir::Value x = g.input(dt, {96, 40});
      ir::Value go = g.input(dt, {96, 24});
      ir::Value one = g.constant(Scalar(1.0), dt);
      ir::Value prod = g.op(OpKind::Matmul, {g.op(OpKind::Transpose, {x}, transpose_attrs(0, 1)), go});
      g.output(g.op(OpKind::Transpose, {g.op(OpKind::Mul, {prod, one})}, transpose_attrs(0, 1)));
      codegen::Executable exe(g);
      check_gemm_ir(exe);
      std::vector<Tensor> out = run_counting_gemm(exe, {xt, gt});
      REQUIRE(out[0].shape() == Shape({24, 40}));
      CHECK(rel_diff(out[0], ref(xt, gt)) < tol);
    }
    {  // 3-D, equal batch dims: (a @ b).transpose(-1, -2) = b^T @ a^T per batch
      ir::Graph g;
      ir::Value a = g.input(dt, {4, 16, 8});
      ir::Value b = g.input(dt, {4, 8, 12});
      g.output(g.op(OpKind::Transpose, {g.op(OpKind::Matmul, {a, b})}, transpose_attrs(-1, -2)));
      codegen::Executable exe(g);
      check_gemm_ir(exe);
      Tensor a3 = randn({4, 16, 8}).to(dt), b3 = randn({4, 8, 12}).to(dt);
      std::vector<Tensor> out = run_counting_gemm(exe, {a3, b3});
      Tensor want = matmul(a3.to(DType::Float64), b3.to(DType::Float64)).transpose(-1, -2);
      CHECK(rel_diff(out[0], want) < tol);
    }
    {  // the product is also an output: computed once, its transpose stays a copy
      ir::Graph g;
      ir::Value x = g.input(dt, {96, 40});
      ir::Value go = g.input(dt, {96, 24});
      ir::Value prod = g.op(OpKind::Matmul, {g.op(OpKind::Transpose, {x}, transpose_attrs(0, 1)), go});
      g.output(prod);
      g.output(g.op(OpKind::Transpose, {prod}, transpose_attrs(0, 1)));
      codegen::Executable exe(g);
      CHECK(exe.linalg_ir().find("linalg.transpose") != std::string::npos);
      std::vector<Tensor> out = exe.run({xt, gt});
      REQUIRE(out.size() == 2);
      CHECK(rel_diff(out[0], ref(xt, gt).t()) < tol);
      CHECK(rel_diff(out[1], ref(xt, gt)) < tol);
    }
    {  // a broadcast batch ([16, 8] @ [4, 8, 12]) is left as written
      ir::Graph g;
      ir::Value a = g.input(dt, {16, 8});
      ir::Value b = g.input(dt, {4, 8, 12});
      g.output(g.op(OpKind::Transpose, {g.op(OpKind::Matmul, {a, b})}, transpose_attrs(-1, -2)));
      codegen::Executable exe(g);
      Tensor a2 = randn({16, 8}).to(dt), b3 = randn({4, 8, 12}).to(dt);
      std::vector<Tensor> out = exe.run({a2, b3});
      Tensor want = matmul(a2.to(DType::Float64), b3.to(DType::Float64)).transpose(-1, -2);
      CHECK(rel_diff(out[0], want) < tol);
    }
  }
}

TEST_CASE("Executable: attention scores q @ k.transpose(-2, -1) is a batched GEMM with trans_b") {
  ir::Graph g;
  ir::Value q = g.input(DType::Float32, {6, 40, 32});
  ir::Value k = g.input(DType::Float32, {6, 40, 32});
  g.output(g.op(OpKind::Matmul, {q, g.op(OpKind::Transpose, {k}, transpose_attrs(-2, -1))}));
  codegen::Executable exe(g);
  check_gemm_ir(exe);
  Tensor qt = randn({6, 40, 32}), kt = randn({6, 40, 32});
  std::vector<Tensor> out = run_counting_gemm(exe, {qt, kt});
  CHECK(rel_diff(out[0], matmul(qt, kt.transpose(-2, -1))) < 1e-4);
}

TEST_CASE("Executable: 4-D attention products are one batched GEMM (batch dims collapsed)") {
  for (DType dt : {DType::Float32, DType::Float64}) {
    INFO("dtype " << kiln::name(dt));
    ir::Graph g;
    ir::Value q = g.input(dt, {2, 3, 40, 32});
    ir::Value k = g.input(dt, {2, 3, 40, 32});
    ir::Value s = g.op(OpKind::Matmul, {q, g.op(OpKind::Transpose, {k}, transpose_attrs(-2, -1))});
    g.output(g.op(OpKind::Matmul, {s, k}));  // scores @ v with v = k
    codegen::Executable exe(g);
    check_gemm_ir(exe);
    Tensor qt = randn({2, 3, 40, 32}).to(dt), kt = randn({2, 3, 40, 32}).to(dt);
    const uint64_t ops = cpu::gemm_time().ops;
    std::vector<Tensor> out = run_counting_gemm(exe, {qt, kt}, 2);
    CHECK(cpu::gemm_time().ops == ops + 2);  // each batched GEMM call timed once
    CHECK(rel_diff(out[0], matmul(matmul(qt, kt.transpose(-2, -1)), kt)) < 1e-4);
  }
}

TEST_CASE("Executable: a 4-D GEMM result is written into the output, not copied there") {
  // The batched GEMM runs over [b*h, m, n]; its result was computed in a temporary and copied
  // out as [b, h, m, n] (a whole extra pass: on CUDA a kernel of its own in attention). Now the
  // output buffer, collapsed, is the GEMM's C. A second output reads the product after it.
  // Static and `?` batch (row-split on the CPU), compiled and with the GPU loops emulated.
  for (int64_t batch : {int64_t{2}, ir::kDynamic}) {
    for (bool emulate : {false, true}) {
      INFO("batch " << batch << (emulate ? ", GPU loops emulated" : ""));
      ir::Graph g;
      ir::Value q = g.input(DType::Float32, {batch, 3, 40, 32});
      ir::Value k = g.input(DType::Float32, {batch, 3, 32, 24});
      ir::Value s = g.op(OpKind::Matmul, {q, k});
      g.output(s);
      g.output(g.op(OpKind::Add, {s, g.constant(Scalar(1.0), DType::Float32)}));
      codegen::CompileOptions o;
      o.disk_cache = false;
      o.emulate_gpu_loops = emulate;
      codegen::Executable exe(g, o);
      for (int64_t b : {int64_t{2}, int64_t{5}}) {
        if (batch != ir::kDynamic && b != batch) continue;
        Tensor qt = randn({b, 3, 40, 32}), kt = randn({b, 3, 32, 24});
        std::vector<Tensor> out = exe.run({qt, kt});
        Tensor want = matmul(qt, kt);
        CHECK(rel_diff(out[0], want) < 1e-5);
        CHECK(rel_diff(out[1], want + 1) < 1e-5);
      }
      const std::string bufferized = test::stage_text(test::compile_logs(g, "ir", o), "bufferized");
      REQUIRE(!bufferized.empty());
      CHECK(test::count(bufferized, "memref.copy") == 0);
      CHECK(test::count(bufferized, "memref.collapse_shape %arg2") == 1);  // C is the output
    }
  }
}

TEST_CASE("Executable: 2-D @ 3-D is one batched GEMM with a shared left operand") {
  for (DType dt : {DType::Float32, DType::Float64}) {
    INFO("dtype " << kiln::name(dt));
    ir::Graph g;
    ir::Value a = g.input(dt, {48, 64});
    ir::Value b = g.input(dt, {5, 64, 40});
    ir::Value w = g.input(dt, {5, 48, 32});
    g.output(g.op(OpKind::Matmul, {a, b}));
    // a.t() @ w: a copy of a.t() (linalg has no transposed broadcast map), then the GEMM
    g.output(g.op(OpKind::Matmul, {g.op(OpKind::Transpose, {a}, transpose_attrs(0, 1)), w}));
    codegen::Executable exe(g);
    INFO(exe.linalg_ir());
    CHECK(exe.linalg_ir().find("linalg.batch_matmul") != std::string::npos);
    Tensor at = randn({48, 64}).to(dt), bt = randn({5, 64, 40}).to(dt), wt_ = randn({5, 48, 32}).to(dt);
    std::vector<Tensor> out = run_counting_gemm(exe, {at, bt, wt_}, 2);
    REQUIRE(out.size() == 2);
    CHECK(rel_diff(out[0], matmul(at, bt)) < 1e-4);
    CHECK(rel_diff(out[1], matmul(at.t(), wt_)) < 1e-4);
  }
}

TEST_CASE("Executable::run_into writes the caller's outputs and checks them") {
  codegen::Executable exe(square_plus({3, 4}));
  Tensor x = randn({3, 4});
  Tensor out = zeros({3, 4});
  exe.run_into({x}, {out});
  CHECK(max_diff(out, add(mul(x, x), x)) == 0);
  CHECK_THROWS_WITH(exe.run_into({x}, {zeros({4, 3})}), Catch::Contains("output 0"));
  CHECK_THROWS_WITH(exe.run_into({x}, {zeros({3, 4}, TensorOptions{DType::Float64})}),
                    Catch::Contains("output 0"));
  CHECK_THROWS_WITH(exe.run_into({x}, {x}), Catch::Contains("shares memory with an input"));
  // The code is compiled for output buffers that nothing else reaches (llvm.noalias).
  ir::Graph two;
  ir::Value xv = two.input(DType::Float32, {3, 4});
  two.output(two.op(OpKind::Exp, {xv}));
  two.output(two.op(OpKind::Neg, {xv}));
  codegen::Executable two_exe(two);
  CHECK_THROWS_WITH(two_exe.run_into({x}, {out, out}), Catch::Contains("outputs 0 and 1 share"));
  Tensor wide = zeros({2, 3, 4});  // two halves of one buffer do not overlap
  two_exe.run_into({x}, {wide.select(0, 0), wide.select(0, 1)});
  CHECK(max_diff(wide.select(0, 0), exp(x)) < 1e-6);
  CHECK(max_diff(wide.select(0, 1), neg(x)) == 0);
  CHECK_THROWS_WITH(exe.run_into({x}, {}), Catch::Contains("expected 1 outputs"));
}

TEST_CASE("Executable: bool inputs and outputs are bytes, read and written inside the fused loops") {
  // A mask used twice (as a dropout mask is, forward and backward) and a bool result.
  for (bool dynamic : {false, true}) {
    INFO("dynamic rows " << dynamic);
    ir::Graph g;
    const int64_t rows = dynamic ? ir::kDynamic : 37;
    ir::Value mask = g.input(DType::Bool, {rows, 129});
    ir::Value x = g.input(DType::Float32, {rows, 129});
    ir::Value zero = g.constant(0.0, DType::Float32);
    ir::Value two = g.constant(2.0, DType::Float32);
    g.output(g.op(OpKind::Where, {mask, g.op(OpKind::Mul, {x, two}), zero}));
    g.output(g.op(OpKind::Where, {mask, x, g.op(OpKind::Neg, {x})}));
    g.output(g.op(OpKind::LogicalAnd, {mask, g.op(OpKind::Gt, {x, zero})}));
    codegen::Executable exe(g);
    INFO(exe.linalg_ir());
    // Bytes at the boundary, and no bool tensor between loops.
    CHECK(exe.linalg_ir().find("129xi8>") != std::string::npos);
    CHECK(exe.linalg_ir().find("129xi1>") == std::string::npos);
    Tensor m = rand({37, 129}) > 0.3;
    Tensor xv = randn({37, 129});
    std::vector<Tensor> out = exe.run({m, xv});
    REQUIRE(out.size() == 3);
    CHECK(out[2].dtype() == DType::Bool);
    CHECK(out[0].to_vector<float>() == where(m, xv * 2.0f, 0.0f).to_vector<float>());
    CHECK(out[1].to_vector<float>() == where(m, xv, -xv).to_vector<float>());
    CHECK(out[2].to_vector<bool>() == logical_and(m, xv > 0).to_vector<bool>());
  }
}

TEST_CASE("Executable: a 1,200-op elementwise chain is split into bounded loop bodies") {
  // One fused body of every op made compile time quadratic (a 1,000-op chain: 3.6 s, 5,000
  // ops: 2 minutes); the bodies are capped (fusion.cpp), each still one pass over memory.
  ir::Graph g;
  ir::Value v = g.input(DType::Float32, {1000});
  ir::Value scale = g.constant(1.0001, DType::Float32), shift = g.constant(0.001, DType::Float32);
  constexpr int kSteps = 600;
  for (int i = 0; i < kSteps; ++i) v = g.op(OpKind::Add, {g.op(OpKind::Mul, {v, scale}), shift});
  g.output(v);
  codegen::Executable exe(g);
  CHECK(exe.num_loop_nests() >= 5);   // at most 128 body ops each
  CHECK(exe.num_loop_nests() <= 30);  // still fused: not one loop per op
  Tensor x = randn({1000});
  Tensor expect = x;
  for (int i = 0; i < kSteps; ++i) expect = expect * 1.0001f + 0.001f;
  CHECK(max_diff(exe.run({x})[0], expect) < 1e-4);
}

TEST_CASE("Executable: GEMMs whose zero inits CSE merged fill no buffer that nothing reads") {
  // Two products of one result shape share a zero fill after CSE; each gets its own
  // (unshare_inits), and the shared original is dropped, not bufferized and filled per call.
  ir::Graph g;
  ir::Value a = g.input(DType::Float32, {64, 10}), b = g.input(DType::Float32, {10, 128});
  ir::Value d = g.input(DType::Float32, {10, 128});
  g.output(g.op(OpKind::Matmul, {a, b}));
  g.output(g.op(OpKind::Matmul, {a, d}));
  const std::string bufferized = test::stage_text(test::compile_logs(g, "ir"), "bufferized");
  REQUIRE(!bufferized.empty());
  CHECK(test::count(bufferized, "call @kiln_rt_gemm_f32") == 2);
  CHECK(test::count(bufferized, "memref.alloc(") == 0);
  codegen::Executable exe(g);
  Tensor ta = randn({64, 10}), tb = randn({10, 128}), td = randn({10, 128});
  std::vector<Tensor> out = exe.run({ta, tb, td});
  CHECK(amax(abs(sub(out[0], matmul(ta, tb)))).item<double>() < 1e-5);
  CHECK(amax(abs(sub(out[1], matmul(ta, td)))).item<double>() < 1e-5);
}

TEST_CASE("Executable: more live intermediates than the runtime's per-thread buffer cache holds") {
  // 150 GEMM results, all read by the final sum: more freed blocks than the cache's 128 slots,
  // so frees evict, and the second and third runs take cached blocks of two sizes.
  ir::Graph g;
  ir::Value x = g.input(DType::Float32, {16, 16}), y = g.input(DType::Float32, {16, 2048});
  constexpr int kProducts = 150;
  ir::Value total;
  for (int i = 1; i <= kProducts; ++i) {
    ir::Value scaled = g.op(OpKind::Mul, {x, g.constant(Scalar(double(i)), DType::Float32)});
    ir::Value r = g.op(OpKind::Matmul, {scaled, i % 2 ? x : g.op(OpKind::Neg, {x})});
    total = i == 1 ? r : g.op(OpKind::Add, {total, r});
  }
  g.output(total);
  g.output(g.op(OpKind::Matmul, {x, y}));  // a larger block beside the small ones
  const std::string bufferized = test::stage_text(test::compile_logs(g, "ir"), "bufferized");
  CHECK(test::count(bufferized, "memref.alloc(") > 128);
  codegen::Executable exe(g);
  // sum over i of i * (-1)^(i+1) * x @ x = -75 * x @ x for 150 terms.
  for (int run = 0; run < 3; ++run) {
    Tensor tx = randn({16, 16}), ty = randn({16, 2048});
    std::vector<Tensor> out = exe.run({tx, ty});
    Tensor expect = matmul(tx, tx) * -75.0f;
    CHECK(max_diff(out[0], expect) < 1e-3 * amax(abs(expect)).item<double>());
    CHECK(max_diff(out[1], matmul(tx, ty)) < 1e-4);
  }
}

TEST_CASE("Executable: elements selected from a vector are read inside their consumer's loop") {
  // AdamW's bias corrections as the tracer records them: 1 - beta^step over a [parameters]
  // vector, then one element per parameter, broadcast over that parameter's update. Each
  // select was a loop nest of its own (a 1-thread kernel on a GPU), two per parameter.
  ir::Graph g;
  ir::Value steps = g.input(DType::Float32, {15});
  ir::Value x = g.input(DType::Float32, {96, 32});
  ir::Value half = g.constant(Scalar(0.5), DType::Float32);
  ir::Value c = g.op(OpKind::Sub, {g.constant(Scalar(1.0), DType::Float32),
                                   g.op(OpKind::Pow, {half, steps})});  // [15]
  auto element = [&](int64_t k) {
    OpAttrs sel;
    sel.dim = 0;
    sel.start = k;
    return g.op(OpKind::Select, {c}, sel);  // 0-d
  };
  g.output(g.op(OpKind::Div, {g.op(OpKind::Mul, {x, element(3)}), element(7)}));
  codegen::Executable exe(g);
  INFO(exe.linalg_ir());
  CHECK(exe.num_loop_nests() == 2);  // the [15] vector, then the update reading two elements
  Tensor st = arange(1, 16, 1, {DType::Float32}), xt = randn({96, 32});
  Tensor ct = sub(full({}, 1.0, {DType::Float32}), pow(full({}, 0.5, {DType::Float32}), st));
  Tensor ref = div(mul(xt, ct.select(0, 3)), ct.select(0, 7));
  CHECK(max_diff(exe.run({st, xt})[0], ref) <= 1e-6 * max_abs(ref));
}

TEST_CASE("Executable: `?` input sizes that do not agree raise instead of reading past a buffer") {
  // Found by a break-it helper: a [?, ?] @ [?, ?] product run on [2, 3000] and [1, 4] read
  // 3000 floats of a 4-float input and returned garbage.
  const int64_t q = ir::kDynamic;
  ir::Graph mm;
  mm.output(mm.op(OpKind::Matmul, {mm.input(DType::Float32, {q, q}),
                                   mm.input(DType::Float32, {q, q})}));
  codegen::Executable product(mm);
  Tensor a = randn({2, 3}), b = randn({3, 4});
  Tensor c = product.run({a, b})[0];
  REQUIRE(c.shape() == Shape{2, 4});
  CHECK(max_diff(c, matmul(a, b)) < 1e-5);
  CHECK_THROWS_WITH(product.run({randn({2, 3000}), randn({1, 4})}),
                    Catch::Contains("do not agree") && Catch::Contains("matmul"));
  CHECK_THROWS_WITH(product.run_into({randn({2, 5}), randn({4, 4})}, {zeros({2, 4})}),
                    Catch::Contains("do not agree"));

  // Elementwise: the code reads a `?` dim as not broadcast, so size 1 against 5 is refused,
  // while 1 against 1 and equal sizes run.
  ir::Graph add;
  add.output(add.op(OpKind::Add, {add.input(DType::Float32, {q}), add.input(DType::Float32, {q})}));
  codegen::Executable sum(add);
  Tensor x = randn({5}), y = randn({5});
  CHECK(max_diff(sum.run({x, y})[0], kiln::add(x, y)) == 0);
  Tensor one = randn({1});
  CHECK(max_diff(sum.run({one, one})[0], kiln::add(one, one)) == 0);
  CHECK_THROWS_WITH(sum.run({x, randn({3})}), Catch::Contains("do not agree"));
  CHECK_THROWS_WITH(sum.run({x, one}), Catch::Contains("would broadcast its `?` dim 0"));
  CHECK_THROWS_WITH(sum.run({one, x}), Catch::Contains("would broadcast its `?` dim 0"));

  SECTION("check_dynamic_sizes off: consistent inputs run as before") {
    codegen::CompileOptions o;
    o.check_dynamic_sizes = false;
    codegen::Executable unchecked(mm, o);
    CHECK(max_diff(unchecked.run({a, b})[0], matmul(a, b)) < 1e-5);
  }
}

// Shape inference stands a placeholder size for each `?` dim; 10007^5 floats overflowed int64
// and a rank-5 graph with every dim `?` raised "shape [10007, 10007, 10007, 10007, 10007] is
// too large" (compile() then ran such functions at their traced shapes only).
TEST_CASE("Executable: graphs with 5 to 12 `?` dims build and run") {
  for (int rank : {5, 8, 12}) {
    INFO("rank " << rank);
    ir::Graph g;
    ir::Value x = g.input(DType::Float32, std::vector<int64_t>(rank, -1));
    OpAttrs last;
    last.dims = Dims{rank - 1};
    last.keepdim = true;
    g.output(g.op(OpKind::Add, {g.op(OpKind::Mul, {x, x}), g.op(OpKind::Sum, {x}, last)}));
    codegen::Executable exe(g);
    std::vector<int64_t> shape(rank, 1);
    shape[0] = 3;
    shape[rank - 1] = 4;
    shape[rank / 2] = 2;
    Tensor in = randn(Shape(shape));
    Tensor out = exe.run({in})[0];
    Tensor expected = add(mul(in, in), sum(in, {rank - 1}, true));
    REQUIRE(out.shape() == expected.shape());
    CHECK(amax(abs(sub(out, expected))).item<double>() < 1e-5);
  }
}
