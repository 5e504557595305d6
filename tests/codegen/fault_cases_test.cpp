// Fault cases (../shared/cases/fault-cases.md) in compiled mode: graphs built with ir::Graph,
// compiled with codegen::Executable, checked against the cases' right answers and eager mode.
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <limits>
#include <vector>

#include "codegen/codegen.h"
#include "kiln/kiln.h"

using namespace kiln;

namespace {

const float kNaN = std::numeric_limits<float>::quiet_NaN();

/// Compiles a one-input graph `build(g, x)` for `x`'s dtype and shape and runs it on `x`.
template <class F> Tensor run1(const Tensor& x, F&& build) {
  ir::Graph g;
  ir::Value in = g.input(x.dtype(), x.shape().vec());
  g.output(build(g, in));
  codegen::Executable exe(g, codegen::CompileOptions{.disk_cache = false});
  return exe.run({x})[0];
}

/// Element-wise equality with NaN == NaN.
void check_equal(const Tensor& got, const std::vector<float>& want) {
  REQUIRE(got.numel() == static_cast<int64_t>(want.size()));
  Tensor c = got.contiguous();
  for (size_t i = 0; i < want.size(); ++i) {
    INFO("element " << i);
    float v = c.data<float>()[i];
    if (std::isnan(want[i])) CHECK(std::isnan(v));
    else CHECK(v == want[i]);
  }
}

}  // namespace

TEST_CASE("FC-02 (compiled): NaN kept by amax, relu, clamp, maximum") {
  Tensor x1 = from_vector<float>({7, kNaN, -2.5f, 11, 0.25f}, {5});
  OpAttrs all;
  all.all_dims = true;
  Tensor m = run1(x1, [&](ir::Graph& g, ir::Value x) { return g.op(OpKind::Amax, {x}, all); });
  CHECK(m.shape() == Shape{});
  CHECK(std::isnan(m.data<float>()[0]));

  Tensor x2 = from_vector<float>({kNaN, -1, 2}, {3});
  check_equal(run1(x2, [](ir::Graph& g, ir::Value x) { return g.op(OpKind::Relu, {x}); }),
              {kNaN, 0, 2});

  Tensor x3 = from_vector<float>({kNaN, -3, 0.5f, 4}, {4});
  OpAttrs unit;
  unit.has_low = unit.has_high = true;
  unit.alpha = Scalar(0.0);
  unit.beta = Scalar(1.0);
  check_equal(run1(x3, [&](ir::Graph& g, ir::Value x) { return g.op(OpKind::Clamp, {x}, unit); }),
              {kNaN, 0, 0.5f, 1});

  ir::Graph g;
  ir::Value a = g.input(DType::Float32, {2});
  ir::Value b = g.input(DType::Float32, {2});
  g.output(g.op(OpKind::Maximum, {a, b}));
  codegen::Executable exe(g, codegen::CompileOptions{.disk_cache = false});
  check_equal(exe.run({from_vector<float>({1, kNaN}, {2}), from_vector<float>({kNaN, 1}, {2})})[0],
              {kNaN, kNaN});
}

TEST_CASE("FC-23 (compiled): sum over a zero-size tensor is 0") {
  Tensor x = zeros({0});
  OpAttrs all;
  all.all_dims = true;
  Tensor s = run1(x, [&](ir::Graph& g, ir::Value v) { return g.op(OpKind::Sum, {v}, all); });
  CHECK(s.shape() == Shape{});
  CHECK(s.data<float>()[0] == 0.0f);
  // A zero-size dim with a dynamic size: an empty result, no crash.
  ir::Graph g;
  ir::Value v = g.input(DType::Float32, {ir::kDynamic, 3});
  OpAttrs rows;
  rows.dims = {1};
  g.output(g.op(OpKind::Sum, {g.op(OpKind::Exp, {v})}, rows));
  codegen::Executable exe(g, codegen::CompileOptions{.disk_cache = false});
  Tensor out = exe.run({zeros({0, 3})})[0];
  CHECK(out.shape() == Shape{0});
}

TEST_CASE("FC-34 (compiled): compile time about linear in an unrolled (a+b, a-b) chain") {
  auto build = [](int n) {
    ir::Graph g;
    ir::Value a = g.input(DType::Float32, {1});
    ir::Value b = g.input(DType::Float32, {1});
    for (int i = 0; i < n; ++i) {
      ir::Value s = g.op(OpKind::Add, {a, b});
      ir::Value d = g.op(OpKind::Sub, {a, b});
      a = s;
      b = d;
    }
    g.output(a);
    g.output(b);
    return g;
  };
  auto compile_ms = [&](int n, std::vector<Tensor>* out) {
    ir::Graph g = build(n);
    auto t0 = std::chrono::steady_clock::now();
    codegen::Executable exe(g, codegen::CompileOptions{.memory_cache = false, .disk_cache = false});
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    *out = exe.run({ones({1}), zeros({1})});
    return ms;
  };
  for (int n : {1, 2, 7, 20, 39, 40}) {
    std::vector<Tensor> out;
    compile_ms(n, &out);
    double a = std::ldexp(1.0, n / 2), b = n % 2 ? a : 0.0;  // even n: (2^(n/2), 0); odd: equal
    if (n % 2) a = b = std::ldexp(1.0, (n - 1) / 2);
    INFO("n = " << n);
    CHECK(out[0].data<float>()[0] == static_cast<float>(a));
    CHECK(out[1].data<float>()[0] == static_cast<float>(b));
  }
  // Best of 5 each, so a busy machine does not decide the ratio. Linear is 2, a tree (the
  // fault) 2^20; the bound leaves room for the shared machine (2.51 was seen with a second
  // test run on the other core).
  double t20 = 1e9, t40 = 1e9;
  std::vector<Tensor> out;
  for (int rep = 0; rep < 5; ++rep) {
    t20 = std::min(t20, compile_ms(20, &out));
    t40 = std::min(t40, compile_ms(40, &out));
  }
  INFO("compile ms: n=20 " << t20 << ", n=40 " << t40);
  CHECK(t40 / t20 <= 3.0);
}
