// Module settings and optimizer options changed after compiling: a compiled call sees the
// change as eager does (guards), and invalid options raise eager's error instead of turning
// the parameters into inf / NaN.
#include <catch2/catch.hpp>

#include <cmath>
#include <string>

#include "kiln/kiln.h"
#include "kiln/nn.h"
#include "tracer/util.h"

using namespace kiln;
using namespace kiln::nn;
using kiln::testing::contains;
using kiln::testing::vec;

TEST_CASE("compile: LayerNorm.normalized_shape and MultiheadAttention.num_heads are guarded") {
  manual_seed(4);
  LayerNorm ln(Shape{3}, 1e-5, false);
  auto cln = compile(ln);
  Tensor x = randn({2, 3});
  cln(x);
  cln(x);
  ln.normalized_shape = Shape{2, 3};
  CHECK(vec(cln(x)) == vec(ln(x)));
  CHECK(contains(cln.explain(), "LayerNorm.normalized_shape == [3]"));

  MultiheadAttention mha(8, 2);
  mha.eval();
  auto cmha = compile([&](const Tensor& q) { return mha.forward(q, q, q).output; });
  Tensor q = randn({4, 1, 8});
  cmha(q);
  cmha(q);
  mha.num_heads = 4;
  std::vector<float> eager = vec(mha.forward(q, q, q).output), compiled = vec(cmha(q));
  for (size_t i = 0; i < eager.size(); ++i) CHECK(compiled[i] == Approx(eager[i]).margin(1e-6));
  mha.num_heads = 0;
  CHECK_THROWS_WITH(cmha(q), Catch::Contains("num_heads (0) must be positive"));
}

TEST_CASE("compile: an optimizer option made invalid after compiling is eager's error") {
  Tensor p = tensor({1.f, -2.f}).requires_grad_();
  AdamW opt({p}, {.lr = 0.1});
  auto step = compile([&] {
    opt.zero_grad();
    Tensor loss = (p * p).sum();
    loss.backward();
    opt.step();
    return loss.detach();
  });
  for (int i = 0; i < 3; ++i) step();
  const std::vector<float> before = vec(p);
  opt.options.beta2 = 1.5;  // read at run time by the replay: was v *= 1.5, p -> NaN
  CHECK_THROWS_WITH(step(), Catch::Contains("AdamW.step: invalid options") &&
                                Catch::Contains("module_settings_test.cpp"));
  CHECK(vec(p) == before);
  opt.options.beta2 = 0.999;
  step();
  for (float v : vec(p)) CHECK(std::isfinite(v));
  CHECK(vec(p) != before);
}
