// Module settings and optimizer options changed after compiling: a compiled call sees the
// change as eager does (guards), and invalid options raise eager's error instead of turning
// the parameters into inf / NaN.
#include <catch2/catch.hpp>

#include <cmath>
#include <optional>
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

// Break-it pass: layers pushed onto a compiled Sequential were not seen (the old [2, 3]
// output was replayed, compile_count 1), compiled as a module or captured by a lambda.
TEST_CASE("compile: layers added to a Sequential after compiling trace again") {
  manual_seed(5);
  for (bool captured : {false, true}) {
    INFO((captured ? "a lambda that captures the Sequential" : "compile(seq)"));
    Sequential seq({std::make_shared<Linear>(3, 3)});
    auto cm = compile(seq);
    auto cf = compile([&seq](const Tensor& x) { return seq(x); });
    auto call = [&](const Tensor& x) { return captured ? cf(x) : cm(x); };
    Tensor x = randn({2, 3});
    call(x);
    CHECK(vec(call(x)) == vec(seq(x)));
    seq.push_back(std::make_shared<ReLU>());
    seq.push_back(std::make_shared<Linear>(3, 2));
    for (int i = 0; i < 2; ++i) {
      Tensor got = call(x), want = seq(x);
      REQUIRE(got.shape() == Shape{2, 2});
      CHECK(vec(got) == vec(want));
    }
    CHECK((captured ? cf.compile_count() : cm.compile_count()) == 2);
    CHECK(contains(captured ? cf.explain() : cm.explain(), "Sequential's 3 submodule(s)"));
  }
}

TEST_CASE("compile: a module argument built where a destroyed one was traces again") {
  // A break-it pass: a sweep that emplaced each new model into one std::optional (the same
  // address) replayed the first model's weights, which a kept list of parameters held alive.
  auto fn = [](Module& m, const Tensor& x) { return m.forward(x) * 2.0 + 1.0; };
  auto f = compile(fn);
  std::vector<Tensor> kept;
  std::optional<Sequential> model;
  const void* first = nullptr;
  Tensor x = ones({1, 3});
  for (int i = 0; i < 4; ++i) {
    INFO("model " << i);
    model.reset();
    model.emplace();
    if (!first) first = &*model;
    REQUIRE(static_cast<const void*>(&*model) == first);
    manual_seed(100 + i);
    model->push_back(std::make_shared<Linear>(3, 2));
    for (const Tensor& p : model->parameters()) kept.push_back(p);
    for (int call = 0; call < 2; ++call) {  // traced, then the new entry replays
      Tensor got = f(*model, x), want = fn(*model, x);
      CHECK((got - want).abs().amax().item<float>() <= 1e-6f);
    }
  }
  CHECK(contains(f.explain(), "another object"));
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
  // The same steps eagerly, on a twin parameter.
  Tensor q = tensor({1.f, -2.f}).requires_grad_();
  AdamW eager_opt({q}, {.lr = 0.1});
  auto eager_step = [&] {
    eager_opt.zero_grad();
    (q * q).sum().backward();
    eager_opt.step();
  };
  for (int i = 0; i < 3; ++i) step(), eager_step();
  const std::vector<float> before = vec(p);
  opt.options.beta2 = 1.5;  // read at run time by the replay: was v *= 1.5, p -> NaN
  CHECK_THROWS_WITH(step(), Catch::Contains("AdamW.step: invalid options") &&
                                Catch::Contains("module_settings_test.cpp"));
  CHECK(vec(p) == before);
  opt.options.lr = NAN;  // a second invalid call
  CHECK_THROWS_WITH(step(), Catch::Contains("AdamW.step: invalid options: lr nan"));
  CHECK(vec(p) == before);
  opt.options.beta2 = 0.999, opt.options.lr = 0.1;
  // The entry traced with valid options was kept (it had been dropped as if the optimizer were
  // gone, and every step after an invalid one traced again).
  for (int i = 0; i < 3; ++i) step(), eager_step();
  CHECK(step.compile_count() == 1);
  CHECK(vec(p) == vec(q));
  CHECK(vec(p) != before);
}
