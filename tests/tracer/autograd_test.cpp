// compile() with autograd: compiled backward, whole training steps, double backward, RNG.
#include <catch2/catch.hpp>
#include <cmath>

#include "kiln/kiln.h"
#include "tracer/util.h"
#include "kiln/nn.h"
#include "nn/optim.h"
#include "nn/transformer.h"

using namespace kiln;
using kiln::testing::contains;
using kiln::testing::training_step;
using kiln::testing::vec;


TEST_CASE("compile tutorial: c = a*b is 300 with gradients 20 and 15", "[compile][autograd]") {
  auto mul_fn = compile([](const Tensor& a, const Tensor& b) { return a * b; });
  for (int i = 0; i < 3; ++i) {  // trace, then replays
    Tensor a = scalar_tensor(15.0).requires_grad_();
    Tensor b = scalar_tensor(20.0).requires_grad_();
    Tensor c = mul_fn(a, b);
    CHECK(c.item<double>() == 300);
    c.backward();
    CHECK(a.grad().item<double>() == 20);
    CHECK(b.grad().item<double>() == 15);
    if (i > 0) CHECK(c.grad_fn_name() == "CompiledFunctionBackward");
  }
  CHECK(mul_fn.compile_count() == 1);
  CHECK(contains(mul_fn.explain(), "backward:"));
}

TEST_CASE("compile: an output without a gradient adds nothing, as in eager backward",
          "[compile][autograd]") {
  // Found by a fresh-user trial: replays ran the traced backward with a zero gradient for
  // the unused output, so sqrt's backward at 0 gave 0 * inf = NaN, and an input reached only
  // through that output got a zero .grad (AdamW then decayed it) instead of none.
  auto f = compile([](const Tensor& x) { return std::make_tuple(x * 2.0, sqrt(x)); });
  auto g = compile([](const Tensor& a, const Tensor& b) { return std::make_tuple(a * 3.0, b * b); });
  for (int call = 0; call < 4; ++call) {  // trace, then replays
    INFO("call " << call);
    Tensor x = from_vector<float>({0, 4}, {2}).requires_grad_();
    std::get<0>(f(x)).sum().backward();
    CHECK(vec(x.grad()) == std::vector<float>{2, 2});
    Tensor y = from_vector<float>({0, 4}, {2}).requires_grad_();
    std::get<1>(f(y)).sum().backward();  // the other output: d sqrt(y) = 1 / (2 sqrt(y))
    CHECK(std::isinf(vec(y.grad())[0]));
    CHECK(vec(y.grad())[1] == Approx(0.25));
    Tensor a = ones({2}).requires_grad_(), b = ones({2}).requires_grad_();
    auto [p, q] = g(a, b);
    p.sum().backward();
    CHECK(vec(a.grad()) == std::vector<float>{3, 3});
    CHECK_FALSE(b.grad().defined());
    auto [p2, q2] = g(a, b);
    (p2.sum() + q2.sum()).backward();  // both outputs: both get gradients
    CHECK(vec(a.grad()) == std::vector<float>{6, 6});
    CHECK(vec(b.grad()) == std::vector<float>{2, 2});
  }
  CHECK(f.compile_count() == 1);
  CHECK(g.compile_count() == 1);
}

TEST_CASE("compile: a replay that fails a guard changes nothing before the call is traced again",
          "[compile]") {
  // A captured tensor read only for the output used to be checked after the write-back to x:
  // the failed replay had already added 1, and the new trace added it again.
  Tensor w = ones({2});
  auto f = compile([&](Tensor x) {
    x += 1.0;
    return w * 1.0;
  });
  Tensor x = zeros({2});
  f(x);
  f(x);
  CHECK(vec(x) == std::vector<float>{2, 2});
  w = full({3}, 5.0);  // the captured tensor is another one now: the guard fails
  CHECK(vec(f(x)) == std::vector<float>{5, 5, 5});
  CHECK(vec(x) == std::vector<float>{3, 3});  // once, not twice
  CHECK(f.compile_count() == 2);
}

TEST_CASE("compile: an input with autograd history is traced once; its history is not",
          "[compile][autograd]") {
  // grad() ran the whole graph behind the inputs too; the trace recorded that history's
  // backward, captured its saved tensors, and traced again on every call (they were freed).
  auto f = compile([](const Tensor& x) { return (x * x).sum(); });
  for (int k = 1; k <= 4; ++k) {
    INFO("call " << k);
    Tensor leaf = full({2}, 0.1 * k).requires_grad_();
    Tensor x = exp(leaf * 2.0);
    f(x).backward();
    double expected = 4 * std::exp(0.4 * k);  // d/dl sum(exp(2l)^2) = 4 exp(4l)
    for (float g : vec(leaf.grad())) CHECK(g == Approx(expected).epsilon(1e-5));
  }
  CHECK(f.compile_count() == 1);
  // grad() with inputs leaves the history it did not need intact: a later backward through
  // it still works without retain_graph.
  Tensor leaf = ones({2}).requires_grad_();
  Tensor x = exp(leaf);
  Tensor y = x * x;
  Tensor gx = kiln::grad({y.sum()}, {x})[0];
  CHECK(vec(gx)[0] == Approx(2 * std::exp(1.0)));
  y = x * 3.0;
  y.sum().backward();
  CHECK(vec(leaf.grad())[0] == Approx(3 * std::exp(1.0)));
}

TEST_CASE("compile: changing in place an input with autograd history runs eagerly",
          "[compile][autograd]") {
  // Eager gives such an input a new history (the function's ops, then its old one); a replay
  // would write the value back without it and the gradient would skip the function.
  auto f = compile([](Tensor x) {
    x *= 2.0;
    return x * 1.0;
  });
  for (int k = 1; k <= 4; ++k) {
    INFO("call " << k);
    Tensor leaf = full({2}, double(k)).requires_grad_();
    Tensor x = leaf * 1.0;
    Tensor y = f(x);
    CHECK(vec(x) == std::vector<float>{2.0f * k, 2.0f * k});
    CHECK(vec(y) == std::vector<float>{2.0f * k, 2.0f * k});
    y.sum().backward();
    CHECK(vec(leaf.grad()) == std::vector<float>{2, 2});
  }
  CHECK(contains(f.explain(), "runs eagerly from now on"));
  CHECK(contains(f.explain(), "requires grad and has autograd history"));
}

TEST_CASE("compile: one compiled call's output fed into another: gradients as in eager",
          "[compile][autograd]") {
  // Found by a fresh-user trial: f(f(x, w), w) gave wrong weight gradients from the third call
  // on (the outer trace ran the inner call's backward as well, counting that path twice).
  auto f = compile([](const Tensor& x, const Tensor& w) { return tanh(x * w); });
  auto g = compile([](const Tensor& x, const Tensor& w) { return tanh(x * w); });
  auto eager_grad = [] {
    Tensor w = from_vector<float>({0.5f, -1.5f}, {2}).requires_grad_();
    Tensor x = from_vector<float>({1, 2}, {2});
    tanh(tanh(x * w) * w).sum().backward();
    return vec(w.grad());
  };
  std::vector<float> expected = eager_grad();
  for (int call = 0; call < 5; ++call) {
    INFO("call " << call);
    Tensor w = from_vector<float>({0.5f, -1.5f}, {2}).requires_grad_();
    Tensor x = from_vector<float>({1, 2}, {2});
    f(f(x, w), w).sum().backward();
    std::vector<float> got = vec(w.grad());
    for (size_t i = 0; i < got.size(); ++i) CHECK(got[i] == Approx(expected[i]).epsilon(1e-6));
    Tensor w2 = from_vector<float>({0.5f, -1.5f}, {2}).requires_grad_();
    g(f(x, w2), w2).sum().backward();  // two compiled functions
    got = vec(w2.grad());
    for (size_t i = 0; i < got.size(); ++i) CHECK(got[i] == Approx(expected[i]).epsilon(1e-6));
  }
  CHECK(g.compile_count() == 1);
}

TEST_CASE("compile: an output returned both with and without a gradient (h, h.detach())",
          "[compile][autograd]") {
  auto f = compile([](const Tensor& w) {
    Tensor h = w * 3.0;
    return std::make_tuple(h, h.detach());
  });
  for (int call = 0; call < 3; ++call) {
    INFO("call " << call);
    Tensor w = ones({2}).requires_grad_();
    auto [h, d] = f(w);
    CHECK(h.requires_grad());
    CHECK_FALSE(d.requires_grad());
    (h + d).sum().backward();
    CHECK(vec(w.grad()) == std::vector<float>{3, 3});
    CHECK_THROWS_WITH((d * 5.0).sum().backward(), Catch::Contains("does not require grad"));
  }
}

TEST_CASE("compile: a double backward re-runs the forward from the inputs before the call changed them",
          "[compile][autograd]") {
  // Found by a fresh-user trial: create_graph re-ran the forward from the already changed
  // argument (x + 1 applied twice: gradient 2 w (x + 2) instead of 2 w (x + 1)).
  auto f = compile([](Tensor x, const Tensor& w) {
    x += 1.0;
    return (w * w * x).sum();
  });
  for (int call = 0; call < 3; ++call) {
    INFO("call " << call);
    Tensor x = ones({2});
    Tensor w = from_vector<float>({1, 3}, {2}).requires_grad_();
    Tensor y = f(x, w);
    CHECK(y.item<float>() == 20);
    Tensor gw = kiln::grad({y}, {w}, {}, /*create_graph=*/true)[0];
    CHECK(vec(gw) == std::vector<float>{4, 12});  // 2 w x with x = 2
    CHECK(vec(x) == std::vector<float>{2, 2});
    Tensor ggw = kiln::grad({gw.sum()}, {w})[0];
    CHECK(vec(ggw) == std::vector<float>{4, 4});  // 2 x
  }
}

TEST_CASE("compile: backward() inside a compiled function accumulates into .grad as in eager",
          "[compile][autograd]") {
  // The trace saw w.grad undefined and set it; replays with a defined .grad must add to it
  // (they overwrote it: 1, 2, 3, 4 instead of 1, 3, 6, 10).
  Tensor w = ones({2}).requires_grad_();
  auto f = compile([&](const Tensor& x) {
    Tensor loss = (w * x).sum();
    loss.backward();
    return loss.detach();
  });
  for (int k = 0; k < 4; ++k) {
    f(full({2}, double(k + 1)));
    if (k == 0) CHECK(contains(f.explain(), "1 leaf .grad(s) that backward sets: undefined at the call"));
    float expected = (k + 1) * (k + 2) / 2.0f;
    CHECK(vec(w.grad()) == std::vector<float>{expected, expected});
  }
  w.set_grad(Tensor());  // as zero_grad(set_to_none): the first gradient is set again
  f(full({2}, 5.0));
  CHECK(vec(w.grad()) == std::vector<float>{5, 5});
  f(full({2}, 1.0));
  CHECK(vec(w.grad()) == std::vector<float>{6, 6});
  // One specialisation for an undefined .grad at the call and one for a defined one, both kept:
  // the later switches replay them.
  CHECK(f.compile_count() == 2);
}

// Break-it pass: traced with a leaf argument, the replay for a non-leaf one (same dtype, shape
// and requires_grad) set the non-leaf's .grad; eager passes the gradient on to its leaf.
TEST_CASE("compile: backward() inside, an argument that is no longer a leaf passes the gradient "
          "on", "[compile][autograd]") {
  auto step = [](const Tensor& x) {
    Tensor loss = (x * x).sum();
    loss.backward();
    return loss.detach();
  };
  auto f = compile(step);
  for (int call = 0; call < 6; ++call) {
    INFO("call " << call);
    const bool leaf = call % 3 != 2;  // leaves first, then alternating
    Tensor a = ones({3}).requires_grad_();
    Tensor x = leaf ? a : a * 2.0;
    CHECK(f(x).item<float>() == (leaf ? 3.0f : 12.0f));
    REQUIRE(a.grad().defined());
    CHECK(vec(a.grad()) == (leaf ? std::vector<float>{2, 2, 2} : std::vector<float>{8, 8, 8}));
    CHECK(x.grad().defined() == leaf);
  }
}

TEST_CASE("compile: backward() inside runs the history each call's argument brings, not the "
          "traced call's", "[compile][autograd]") {
  // Found by a session's probe: the trace held the argument's own history (tanh's backward,
  // whose saved output is the argument itself) as graph ops, guarded by nothing but the leaf w,
  // so a replay gave a sigmoid argument tanh's gradient (-2.6e6 for 9.9e5). Replays now run
  // the history each call brings on eager autograd, after the compiled part (a graph break):
  // one trace for all four kinds of history.
  Tensor w = (randn({8, 8}) * 0.5).requires_grad_();
  auto history = [&](int call) {
    switch (call % 4) {
      case 0: return w.tanh();
      case 1: return w.sigmoid() * 3.0;
      case 2: return w * 2.0;  // saves nothing: the scalar is in the traced formula
      default: return w * 5.0;
    }
  };
  auto step = [](const Tensor& h) {
    Tensor loss = (h.matmul(h) * 2.0).sum();
    loss.backward();
    return loss.detach();
  };
  auto f = compile(step, CompileOptions{}, "outside_history");
  for (int call = 0; call < 8; ++call) {
    INFO("call " << call);
    w.set_grad(Tensor());
    Tensor want_loss = step(history(call));
    Tensor want = w.grad();
    w.set_grad(Tensor());
    const float got_loss = f(history(call)).item<float>(), want_l = want_loss.item<float>();
    CHECK(std::fabs(got_loss - want_l) <= 1e-5f * (1 + std::fabs(want_l)));
    REQUIRE(w.grad().defined());
    const float scale = 1 + want.abs().amax().item<float>();
    CHECK((w.grad() - want).abs().amax().item<float>() <= 1e-5f * scale);
  }
  const std::string e = f.explain();
  CHECK(f.compile_count() == 1);
  CHECK_FALSE(contains(e, "runs eagerly"));
  CHECK(contains(e, "into autograd history made before the call, on eager autograd"));
  CompileOptions full;
  full.fullgraph = true;
  auto g = compile(step, full);
  // It raises at the backward(), before that history runs: the caller's graph is not freed,
  // and w.grad is as it was.
  w.set_grad(Tensor());
  Tensor h = history(1);
  try {
    g(h);
    FAIL("expected an error");
  } catch (const Error& e) {
    CHECK(contains(e.what(), "runs autograd history made before the call"));
    CHECK(contains(e.what(), "autograd_test.cpp"));
  }
  CHECK_FALSE(w.grad().defined());
  CHECK_NOTHROW(step(h));  // the history is still there
  REQUIRE(w.grad().defined());
  // A function that catches that error is not traced as if it had run the history.
  auto catching = compile(
      [&](const Tensor& x) {
        try {
          return step(x);
        } catch (const Error&) {
          return x.sum().detach();
        }
      },
      full);
  w.set_grad(Tensor());
  CHECK_THROWS_WITH(catching(history(2)), Catch::Contains("caught the error its backward()"));
  CHECK_FALSE(w.grad().defined());
}

namespace {
// Largest |a - b| relative to 1 + max |b|.
float rel_diff(const Tensor& a, const Tensor& b) {
  return (a - b).abs().amax().item<float>() / (1 + b.abs().amax().item<float>());
}
}  // namespace

TEST_CASE("compile: a compiled head's backward() into an eager encoder's fresh history each "
          "call is one trace; the encoder's gradients are eager's", "[compile][autograd]") {
  // Stop 59's repro: features from an eager encoder, a compiled head that runs backward() and
  // steps its own weights. The trace captured the encoder's nodes and the leaf behind them,
  // so each call's fresh features traced again (12 calls, 8 traces), then it ran eagerly.
  Tensor w1 = (randn({6, 5}) * 0.4).requires_grad_();  // encoder (eager)
  Tensor w2 = (randn({5, 3}) * 0.4).requires_grad_();  // head (compiled)
  auto step_of = [](Tensor head) {
    return [head](const Tensor& feat) mutable {
      Tensor loss = feat.matmul(head).tanh().pow(2.0).sum();
      loss.backward();
      NoGradGuard no_grad;
      head.sub_(head.grad() * 0.1);
      head.set_grad(Tensor());
      // A host read after backward(), whose branch the calls take both ways: a replay that
      // misses a branch traces the call again, so it must not have run the history yet.
      return (feat.sum() > 0).item<bool>() ? loss.detach() : loss.detach() * -1.0;
    };
  };
  auto f = compile(step_of(w2), CompileOptions{}, "head_step");
  Tensor w1_e = w1.detach().clone().requires_grad_(), w2_e = w2.detach().clone().requires_grad_();
  auto eager_step = step_of(w2_e);  // the reference, on copies of the weights
  for (int call = 0; call < 12; ++call) {
    INFO("call " << call);
    Tensor x = randn({4, 6});
    const float want = eager_step(x.matmul(w1_e).sigmoid() - 0.5).item<float>();
    const float got = f(x.matmul(w1).sigmoid() - 0.5).item<float>();
    CHECK(std::fabs(got - want) <= 1e-5f * (1 + std::fabs(got)));
    REQUIRE(w1.grad().defined());
    CHECK(rel_diff(w1.grad(), w1_e.grad()) <= 1e-5f);
    CHECK(rel_diff(w2, w2_e) <= 1e-5f);
    w1.set_grad(Tensor());
    w1_e.set_grad(Tensor());
  }
  CHECK(f.compile_count() == 2);  // one trace per branch
  const std::string e = f.explain();
  CHECK_FALSE(contains(e, "not cached"));
  CHECK(contains(e, "into autograd history made before the call, on eager autograd"));
}

TEST_CASE("compile: backward() into several arguments' histories, one behind another, gives "
          "eager's gradients", "[compile][autograd]") {
  // z's history runs through y's: the deferred part starts at both and meets in y's node.
  auto step = [](const Tensor& y, const Tensor& z) {
    Tensor loss = (y * z).sum() + (y.exp() * 0.5).sum();
    loss.backward();
    return loss.detach();
  };
  auto f = compile(step);
  for (int call = 0; call < 4; ++call) {
    INFO("call " << call);
    Tensor a = (randn({3, 4})).requires_grad_();
    Tensor a_e = a.detach().clone().requires_grad_();
    Tensor want = step(sin(a_e), sin(a_e) * cos(a_e));
    Tensor y = sin(a);
    const float got = f(y, y * cos(a)).item<float>();
    CHECK(std::fabs(got - want.item<float>()) <= 1e-5f * (1 + std::fabs(got)));
    REQUIRE(a.grad().defined());
    CHECK(rel_diff(a.grad(), a_e.grad()) <= 1e-5f);
  }
  CHECK(f.compile_count() == 1);
}

TEST_CASE("compile: a backward() whose history part sets a .grad the function also touches is "
          "not cached and stays right", "[compile][autograd]") {
  Tensor w = (randn({4, 4}) * 0.5).requires_grad_();
  SECTION("the function reads the encoder weight's .grad after backward()") {
    auto step = [&](const Tensor& h) {
      (h * h).sum().backward();
      return w.grad().abs().sum().detach();
    };
    auto f = compile(step, CompileOptions{}, "reads_history_grad");
    for (int call = 0; call < 5; ++call) {
      INFO("call " << call);
      w.set_grad(Tensor());
      const float want = step(w.tanh()).item<float>();
      w.set_grad(Tensor());
      CHECK(std::fabs(f(w.tanh()).item<float>() - want) <= 1e-5f * (1 + want));
    }
    CHECK(contains(f.explain(), "which sets the .grad of a tensor (shape [4, 4]) that the "
                                "function reads or sets after"));
  }
  SECTION("the weight is used inside the function too") {
    auto step = [&](const Tensor& h) {
      Tensor loss = (h.matmul(w)).sum();
      loss.backward();
      return loss.detach();
    };
    auto f = compile(step, CompileOptions{}, "weight_on_both_sides");
    for (int call = 0; call < 5; ++call) {
      INFO("call " << call);
      w.set_grad(Tensor());
      step(w.tanh());
      Tensor want = w.grad().clone();
      w.set_grad(Tensor());
      f(w.tanh());
      REQUIRE(w.grad().defined());
      CHECK(rel_diff(w.grad(), want) <= 1e-5f);
    }
    CHECK(contains(f.explain(), "which sets a .grad that the function's own backward() or code "
                                "reads or sets too"));
  }
  SECTION("a later call's history reaches the weight the function steps (break-it pass)") {
    // The trace's history (h * 2) reaches no weight; later calls' (h * w.sum()) reach w, whose
    // .grad the function reads to step it: eager steps with the history's part included.
    Tensor w_e = w.detach().clone().requires_grad_();
    auto step_of = [](Tensor weight) {
      return [weight](const Tensor& h) mutable {
        weight.set_grad(Tensor());  // reset by the function: its .grad at the call is no guard
        Tensor loss = h.matmul(weight).sum();
        loss.backward();
        NoGradGuard no_grad;
        weight.sub_(weight.grad() * 0.1);
        weight.set_grad(Tensor());
        return loss.detach();
      };
    };
    auto f = compile(step_of(w), CompileOptions{}, "history_reaches_weight");
    auto eager_step = step_of(w_e);
    for (int call = 0; call < 5; ++call) {
      INFO("call " << call);
      Tensor a = randn({3, 4}).requires_grad_();
      Tensor a_e = a.detach().clone().requires_grad_();
      eager_step(call == 0 ? a_e * 2.0 : a_e * w_e.sum());
      f(call == 0 ? a * 2.0 : a * w.sum());
      CHECK(rel_diff(w, w_e) <= 1e-5f);
      CHECK(rel_diff(a.grad(), a_e.grad()) <= 1e-5f);
    }
  }
  SECTION("the function writes in place a weight the history saved, after backward()") {
    // A replay runs the history at its end, after its writes: it would find w changed.
    auto step = [&](const Tensor& h) {
      Tensor loss = (h * h).sum();
      loss.backward();
      NoGradGuard no_grad;
      w.mul_(0.5);
      return loss.detach();
    };
    auto f = compile(step, CompileOptions{}, "writes_saved");
    for (int call = 0; call < 4; ++call) {
      INFO("call " << call);
      Tensor w_before = w.detach().clone();
      w.set_grad(Tensor());
      f(w * w);  // its backward saved w
      Tensor want = w_before.pow(3.0) * 4.0;  // d/dw sum(w^4)
      REQUIRE(w.grad().defined());
      CHECK(rel_diff(w.grad(), want) <= 1e-5f);
      CHECK(rel_diff(w, w_before * 0.5) <= 1e-6f);
    }
    CHECK(contains(f.explain(), "which saved a tensor (shape [4, 4]) that the function changes in "
                                "place"));
  }
}

TEST_CASE("compile: a later call's history that saved a tensor the function writes, or that "
          "an earlier backward freed, runs as eager", "[compile][autograd]") {
  // Re-test of the break-it pass: a replay runs the history at its end, after its writes.
  Tensor buf = ones({4, 5});
  Tensor w = (randn({5, 3}) * 0.5).requires_grad_();
  SECTION("the function writes in place, after backward(), a tensor the history saved") {
    auto step = [&](const Tensor& feat) {
      Tensor loss = feat.matmul(w).sum();
      loss.backward();
      NoGradGuard no_grad;
      buf.mul_(2.0);
      return loss.detach();
    };
    auto f = compile(step, CompileOptions{}, "writes_later_saved");
    for (int call = 0; call < 4; ++call) {
      INFO("call " << call);
      Tensor a = randn({4, 5}).requires_grad_();
      Tensor buf_before = buf.clone();
      f(call < 2 ? a * 3.0 : a * buf);  // calls 2, 3: MulBackward saved buf
      REQUIRE(a.grad().defined());
      // d/da sum((a * c) @ w) = c * (ones @ w^T), c = 3 or buf as it was at the call.
      Tensor c = call < 2 ? full({4, 5}, 3.0) : buf_before;
      CHECK(rel_diff(a.grad(), c * ones({4, 3}).matmul(w.detach().t())) <= 1e-6f);
      CHECK(rel_diff(buf, buf_before * 2.0) == 0.0f);
      w.set_grad(Tensor());
    }
  }
  SECTION("the history was freed by an earlier call: the error comes before the step") {
    auto step = [&](const Tensor& feat) {
      Tensor loss = feat.matmul(w).sum();
      loss.backward();
      NoGradGuard no_grad;
      w.sub_(w.grad() * 0.1);
      w.set_grad(Tensor());
      return loss.detach();
    };
    auto f = compile(step, CompileOptions{}, "freed_history");
    Tensor a = randn({4, 5}).requires_grad_();
    f(sin(a));
    Tensor feat = sin(a);
    f(feat);  // a replay
    Tensor w_before = w.detach().clone();
    CHECK_THROWS_WITH(f(feat), Catch::Contains("backward through the graph a second time"));
    CHECK(rel_diff(w, w_before) == 0.0f);  // eager raised at backward(), before the step
  }
}

TEST_CASE("compile: retain_grad() inside on an argument with history holds on replays",
          "[compile][autograd]") {
  // Break-it pass: replays ran the history before retaining the argument's .grad.
  Tensor w = (randn({4, 3}) * 0.5).requires_grad_();
  Tensor enc = randn({5, 4}).requires_grad_();
  auto f = compile([&](const Tensor& feat) {
    feat.retain_grad();
    Tensor loss = feat.matmul(w).sum();
    loss.backward();
    return loss.detach();
  });
  for (int call = 0; call < 3; ++call) {
    INFO("call " << call);
    Tensor feat = enc.tanh();
    f(feat);
    REQUIRE(feat.grad().defined());
    // d loss / d feat = ones @ w^T.
    CHECK(rel_diff(feat.grad(), ones({5, 3}).matmul(w.t())) <= 1e-6f);
    w.set_grad(Tensor());
    enc.set_grad(Tensor());
  }
  CHECK(f.compile_count() == 1);
}

TEST_CASE("compile: check=true and compare() of a head fed by an eager encoder leave the "
          "caller's graph alone", "[compile][autograd]") {
  // Break-it pass: their eager runs got copies still attached to the caller's graph, so the
  // copy's backward() ran and freed the encoder's history before the compiled run needed it.
  Tensor enc = (randn({5, 4}) * 0.5).requires_grad_();
  Tensor w = (randn({4, 3}) * 0.5).requires_grad_();
  auto head = [&](const Tensor& feat) {
    Tensor loss = feat.matmul(w).tanh().sum();
    loss.backward();
    w.set_grad(Tensor());
    return loss.detach();
  };
  CompileOptions checked;
  checked.check = true;
  auto f = compile(head, checked, "checked_head");
  for (int call = 0; call < 3; ++call) {
    INFO("call " << call);
    enc.set_grad(Tensor());
    Tensor feat = sin(enc);
    const float loss = f(feat).item<float>();
    REQUIRE(enc.grad().defined());
    // d/d enc of sum(tanh(sin(enc) w)) = cos(enc) * ((1 - tanh^2) @ w^T).
    Tensor t = sin(enc.detach()).matmul(w.detach()).tanh();
    Tensor want = cos(enc.detach()) * (1.0 - t * t).matmul(w.detach().t());
    CHECK(rel_diff(enc.grad(), want) <= 1e-5f);
    CHECK(std::fabs(loss - t.sum().item<float>()) <= 1e-5f * (1 + std::fabs(loss)));
  }
  Tensor feat = sin(enc);
  CompareReport r = kiln::compare(head, feat);
  INFO(r.str());
  CHECK(r.ok);
  enc.set_grad(Tensor());
  feat.sum().backward();  // the caller's graph is still there
  CHECK(rel_diff(enc.grad(), cos(enc.detach())) <= 1e-6f);
}

// Break-it pass: replays lost what the function did to autograd state itself.
TEST_CASE("compile: retain_grad() on an argument and requires_grad_() inside the function hold "
          "on replay", "[compile][autograd]") {
  SECTION("x.retain_grad() on a non-leaf argument") {
    auto f = compile([](const Tensor& x) {
      x.retain_grad();
      return (x * 3.0).sum();
    });
    for (int call = 0; call < 3; ++call) {
      INFO("call " << call);
      Tensor a = ones({3}).requires_grad_();
      Tensor x = a * 2.0;
      f(x).backward();
      REQUIRE(x.grad().defined());  // undefined on replay before
      CHECK(vec(x.grad()) == std::vector<float>{3, 3, 3});
      CHECK(vec(a.grad()) == std::vector<float>{6, 6, 6});
    }
  }
  SECTION("a leaf made inside and returned") {
    for (bool factory : {false, true}) {
      auto f = compile([factory](const Tensor& x) {
        Tensor p = factory ? full({2}, 2.0) : x * 2.0;
        p.requires_grad_();
        return p;
      });
      for (int call = 0; call < 3; ++call) {
        INFO("call " << call << (factory ? ", full()" : ", x * 2"));
        Tensor p = f(ones({2}));
        CHECK(p.requires_grad());  // false on replay before
        CHECK(p.is_leaf());
        CHECK(vec(p) == std::vector<float>{2, 2});
      }
    }
  }
  SECTION("an output that requires grad through such a leaf only: runs eagerly") {
    auto f = compile([](const Tensor& x) {
      Tensor w = ones({2});
      w.requires_grad_();
      return (x * w).sum();
    });
    for (int call = 0; call < 3; ++call) {
      Tensor y = f(ones({2}));
      CHECK(y.requires_grad());
      CHECK(!y.is_leaf());
    }
    CHECK(contains(f.explain(), "through a tensor it made require grad itself"));
  }
  SECTION("an output with history through such a leaf and an argument: runs eagerly") {
    auto f = compile([](const Tensor& x, const Tensor& w) {
      Tensor p = x.clone();
      p.requires_grad_();
      return std::vector<Tensor>{(p * w).sum(), p};
    });
    Tensor w = tensor({1.f, 2.f}).requires_grad_();
    for (int call = 0; call < 3; ++call) {
      INFO("call " << call);
      std::vector<Tensor> r = f(ones({2}), w);
      r[0].backward();
      REQUIRE(r[1].grad().defined());  // undefined on replay before
      CHECK(vec(r[1].grad()) == std::vector<float>{1, 2});
    }
  }
  SECTION("backward() into arg.detach().requires_grad_() leaves the argument's .grad alone") {
    auto f = compile([](const Tensor& x, const Tensor& w1) {
      Tensor w = w1.detach().requires_grad_();
      Tensor loss = (x * w).sum();
      loss.backward();
      return w.grad();
    });
    Tensor w1 = tensor({1.f, 2.f});
    for (int call = 0; call < 4; ++call) {
      INFO("call " << call);
      CHECK(vec(f(tensor({3.f, 4.f}), w1)) == std::vector<float>{3, 4});
      CHECK(!w1.grad().defined());  // set on replay before, and traced again every call
    }
    CHECK(f.compile_count() <= 1);
  }
}

TEST_CASE("compile: backward() inside sets the .grad of retained non-leaves on every replay",
          "[compile][autograd]") {
  // Found by a break-it pass: the retained .grad was undefined on replays (an output), or kept
  // its second call's value (an argument), while the leaves' gradients were right.
  SECTION("an output that retains grad") {
    auto f = compile([](const Tensor& x) {
      Tensor h = x * 2.0;
      h.retain_grad();
      (h * h).sum().backward();
      return h;
    });
    for (int call = 0; call < 3; ++call) {
      INFO("call " << call);
      Tensor x = tensor({1.f, 2.f}).requires_grad_();
      Tensor h = f(x);
      REQUIRE(h.grad().defined());
      CHECK(vec(h.grad()) == std::vector<float>{4, 8});  // d(h*h)/dh = 2h
      CHECK(vec(x.grad()) == std::vector<float>{8, 16});
    }
  }
  SECTION("a non-leaf argument that retains grad, passed again: its .grad accumulates") {
    auto f = compile([](const Tensor& y) {
      Tensor l = (y * y).sum();
      l.backward();
      return l;
    });
    Tensor x = tensor({1.f, 2.f}).requires_grad_();
    Tensor y = x + 1.0;  // [2, 3]
    y.retain_grad();
    for (int call = 1; call <= 4; ++call) {
      INFO("call " << call);
      f(y);
      const float k = static_cast<float>(call);
      CHECK(vec(y.grad()) == std::vector<float>{4 * k, 6 * k});  // stuck at call 2's before
      CHECK(vec(x.grad()) == std::vector<float>{4 * k, 6 * k});
    }
  }
}

TEST_CASE("compile: a second backward through compiled code needs retain_graph, as in eager",
          "[compile][autograd]") {
  auto f = compile([](const Tensor& t) { return (t * t).sum(); });
  for (int i = 0; i < 4; ++i) {  // the trace (eager nodes), then replays (the compiled node)
    INFO("call " << i);
    Tensor w = tensor({1.0, 2.0, 3.0}).requires_grad_();
    Tensor r = f(w);
    r.backward();
    const unsigned line = __LINE__ + 2;
    try {
      r.backward();
      FAIL("expected kiln::Error");
    } catch (const Error& e) {
      CHECK(contains(e.what(), "second time"));
      CHECK(e.where().line() == line);
    }
    CHECK(w.grad().to_vector<double>() == std::vector<double>{2, 4, 6});  // not added twice
    // With retain_graph the second backward runs and accumulates.
    Tensor r2 = f(w);
    r2.backward({}, /*retain_graph=*/true);
    r2.backward();
    CHECK(w.grad().to_vector<double>() == std::vector<double>{6, 12, 18});
  }
}

TEST_CASE("compile tutorial: dynamic_computation, one trace per branch", "[compile][autograd]") {
  auto dynamic_computation = compile([](const Tensor& x) {
    if (abs(x).item<double>() > 0) return x * x + x;
    return zeros_like(x);
  });
  for (int i = 0; i < 3; ++i) {
    Tensor x = scalar_tensor(2.0).requires_grad_();
    Tensor y = dynamic_computation(x);
    CHECK(y.item<double>() == 6);
    y.backward();
    CHECK(x.grad().item<double>() == 5);
    Tensor z = dynamic_computation(scalar_tensor(0.0));
    CHECK(z.item<double>() == 0);
  }
  INFO(dynamic_computation.explain());
  // Branch "2.0 with grad" and the guard set "no grad" with branch "0.0".
  CHECK(dynamic_computation.compile_count() == 2);
  CHECK(dynamic_computation.cache_entries() == 2);
}

TEST_CASE("FC-20 (compile): graph traced under no_grad is not reused with grad",
          "[compile][autograd]") {
  Tensor w = from_vector<float>({2, 3}, {2}).requires_grad_();
  auto f = compile([&](const Tensor& x) { return sum(w * x); });
  {
    NoGradGuard ng;
    Tensor out = f(ones({2}));
    CHECK(out.item<float>() == 5);
    CHECK_FALSE(out.requires_grad());
  }
  for (int i = 0; i < 2; ++i) {
    w.set_grad(Tensor());
    Tensor out = f(ones({2}));
    CHECK(out.item<float>() == 5);
    REQUIRE(out.requires_grad());
    out.backward();
    CHECK(vec(w.grad()) == std::vector<float>{1, 1});
  }
  // Flipping requires_grad off and on selects the right variant.
  w.requires_grad_(false);
  CHECK_FALSE(f(ones({2})).requires_grad());
  w.requires_grad_(true);
  w.set_grad(Tensor());
  Tensor out = f(full({2}, 2.0f));
  REQUIRE(out.requires_grad());
  out.backward();
  CHECK(vec(w.grad()) == std::vector<float>{2, 2});
}

TEST_CASE("FC-21 (compile): double backward through compiled code", "[compile][autograd]") {
  auto f = compile([](const Tensor& x) { return pow(x, 5); });
  for (int rep = 0; rep < 2; ++rep) {
    for (double x0 : {1.0, 2.0}) {
      Tensor x = scalar_tensor(x0).requires_grad_();
      Tensor y = f(x);
      Tensor g = grad({y}, {x}, {}, /*create_graph=*/true)[0];
      Tensor gg = grad({g}, {x})[0];
      CHECK(g.item<double>() == Approx(5 * std::pow(x0, 4)));
      CHECK(gg.item<double>() == Approx(20 * std::pow(x0, 3)));
    }
  }
  // Intermediates of the forward matter for the second derivative: y = (x^2)^2 * x.
  auto h = compile([](const Tensor& x) { Tensor s = x * x; return s * s * x; });
  for (int rep = 0; rep < 2; ++rep) {
    Tensor x = scalar_tensor(2.0).requires_grad_();
    Tensor g = grad({h(x)}, {x}, {}, true)[0];
    CHECK(g.item<double>() == Approx(80));
    CHECK(grad({g}, {x})[0].item<double>() == Approx(160));
  }
}

TEST_CASE("compile: backward of a fused MLP forward equals eager", "[compile][autograd]") {
  manual_seed(3);
  nn::Linear l1(8, 16), l2(16, 4);
  auto fn = [&](const Tensor& x) { return sum(tanh(l2.forward(relu(l1.forward(x))))); };
  auto cf = compile(fn);
  Tensor x = randn({5, 8});
  std::vector<Tensor> params = {l1.parameters()[0], l1.parameters()[1], l2.parameters()[0],
                                l2.parameters()[1]};
  zero_grad(params);
  Tensor ye = fn(x);
  ye.backward();
  std::vector<std::vector<float>> ge;
  for (const Tensor& p : params) ge.push_back(vec(p.grad()));
  for (int i = 0; i < 2; ++i) {
    zero_grad(params);
    Tensor y = cf(x);
    CHECK(y.item<float>() == Approx(ye.item<float>()).epsilon(1e-5));
    y.backward();
    for (size_t k = 0; k < params.size(); ++k) {
      std::vector<float> g = vec(params[k].grad());
      REQUIRE(g.size() == ge[k].size());
      for (size_t j = 0; j < g.size(); ++j) CHECK(g[j] == Approx(ge[k][j]).margin(1e-5).epsilon(1e-4));
    }
  }
}

// The forward of x @ W.t() + b keeps W.t() for the backward: a view of an input, which the
// region returns as an eager view (no copy) instead of a graph output, so the region stays
// row-parallel (one kernel; a [K, N] output has no rows); the bias folds into the GEMM.
TEST_CASE("compile: Linear on [B, T, K] with grad: W.t() saved as a view, one row-parallel kernel",
          "[compile][autograd]") {
  manual_seed(5);
  nn::Linear lin(64, 48);
  Tensor x = randn({4, 32, 64});
  auto fn = [&](const Tensor& x) { return lin.forward(x); };
  auto cf = compile(fn);
  std::vector<Tensor> params = lin.parameters();
  Tensor g = randn({4, 32, 48});
  zero_grad(params);
  Tensor ye = fn(x);
  ye.backward(g);
  std::vector<std::vector<float>> ge;
  for (const Tensor& p : params) ge.push_back(vec(p.grad()));
  for (int i = 0; i < 3; ++i) {
    zero_grad(params);
    Tensor y = cf(x);
    std::vector<float> a = vec(y), b = vec(ye);
    REQUIRE(a.size() == b.size());
    for (size_t j = 0; j < a.size(); ++j) CHECK(a[j] == Approx(b[j]).margin(1e-5).epsilon(1e-5));
    y.backward(g);
    for (size_t k = 0; k < params.size(); ++k) {
      std::vector<float> gk = vec(params[k].grad());
      REQUIRE(gk.size() == ge[k].size());
      for (size_t j = 0; j < gk.size(); ++j) CHECK(gk[j] == Approx(ge[k][j]).margin(1e-5).epsilon(1e-4));
    }
  }
  std::string ex = cf.explain();
  INFO(ex);
  CHECK(contains(ex, "compiled region: 3 ops -> 1 kernel(s)"));
}

TEST_CASE("compile: a whole training step (forward, backward, AdamW) equals eager",
          "[compile][autograd]") {
  auto make = [] {
    manual_seed(11);
    auto model = std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
        std::make_shared<nn::Linear>(6, 12), std::make_shared<nn::ReLU>(),
        std::make_shared<nn::Dropout>(0.25), std::make_shared<nn::Linear>(12, 3)});
    return model;
  };
  auto eager_model = make();
  auto compiled_model = make();
  nn::AdamW eager_opt(eager_model->parameters(), {.lr = 1e-2});
  nn::AdamW compiled_opt(compiled_model->parameters(), {.lr = 1e-2});
  auto eager_step = training_step(*eager_model, eager_opt);
  auto compiled_step = compile(training_step(*compiled_model, compiled_opt));
  manual_seed(5);
  Tensor x = randn({16, 6});
  Tensor y = from_vector<int64_t>({0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2, 0}, {16});
  for (int s = 0; s < 6; ++s) {
    manual_seed(100 + s);  // same dropout masks in both modes
    float le = eager_step(x, y).item<float>();
    manual_seed(100 + s);
    float lc = compiled_step(x, y).item<float>();
    CHECK(lc == Approx(le).epsilon(1e-5));
    CHECK(generator_state().offset > 0);
  }
  auto pe = eager_model->parameters(), pc = compiled_model->parameters();
  for (size_t k = 0; k < pe.size(); ++k) {
    std::vector<float> a = vec(pe[k]), b = vec(pc[k]);
    for (size_t j = 0; j < a.size(); ++j) CHECK(b[j] == Approx(a[j]).margin(1e-5));
  }
  CHECK(compiled_opt.step_count() == 6);
  INFO(compiled_step.explain());
  CHECK(compiled_step.compile_count() == 1);
}

TEST_CASE("compile: dropout draws eager's numbers for the same seed and offset",
          "[compile][rng]") {
  auto f = compile([](const Tensor& x) { return dropout(x * 1.0, 0.5, true) + 0.0; });
  Tensor x = ones({64});
  for (int i = 0; i < 3; ++i) {
    manual_seed(42 + i);
    std::vector<float> e = vec(dropout(x * 1.0, 0.5, true) + 0.0);
    GeneratorState after_eager = generator_state();
    manual_seed(42 + i);
    std::vector<float> c = vec(f(x));
    CHECK(c == e);
    CHECK(generator_state().offset == after_eager.offset);
  }
  // Consecutive calls draw fresh numbers, as eager does.
  manual_seed(1);
  std::vector<float> a = vec(f(x)), b = vec(f(x));
  CHECK(a != b);
}

TEST_CASE("compile: a replay that raises advances the generator as eager's ops before the error",
          "[compile][rng]") {
  // Review (a new user's trial): the generator was left where the call started, so the next
  // call redrew the failed call's dropout masks where eager draws new ones.
  auto f = [](const Tensor& x, const Tensor& idx) {
    Tensor kept = index_select(dropout(x, 0.5, true), 0, idx);  // raises for a bad idx
    return kept + randn({3});                                    // not drawn then
  };
  auto cf = compile(f);
  Tensor x = ones({4, 3});
  cf(x, tensor<int64_t>({0, 1}));
  cf(x, tensor<int64_t>({2, 3}));
  manual_seed(5);
  CHECK_THROWS_AS(f(x, tensor<int64_t>({0, 9})), Error);
  const GeneratorState eager = generator_state();
  manual_seed(5);
  CHECK_THROWS_AS(cf(x, tensor<int64_t>({0, 9})), Error);
  CHECK(generator_state().offset == eager.offset);
  CHECK(eager.offset > 0);
  // The next call draws what eager's next call draws.
  manual_seed(5);
  try { f(x, tensor<int64_t>({0, 9})); } catch (const Error&) {}
  std::vector<float> e = vec(f(x, tensor<int64_t>({1, 2})));
  manual_seed(5);
  try { cf(x, tensor<int64_t>({0, 9})); } catch (const Error&) {}
  CHECK(vec(cf(x, tensor<int64_t>({1, 2}))) == e);
}

TEST_CASE("compile: dropout is x * mask in the compiled region; the backward reuses the mask",
          "[compile][rng][autograd]") {
  // Dropped elements are 0 even where x is inf or nan (as eager's kernel), kept ones x * 2.
  Tensor w = from_vector<float>({1, 2, 3, 4, 5, 6, 7, 8}, {8});
  w.requires_grad_();
  auto step = [&](const Tensor& x) {
    w.set_grad(Tensor());
    Tensor y = dropout(x * w, 0.5, true);
    (y * y).sum().backward();
    return y.detach();
  };
  auto f = compile(step);
  Tensor x = from_vector<float>({1, -2, INFINITY, NAN, -INFINITY, 0.5f, -0.f, 3}, {8});
  for (int i = 0; i < 4; ++i) {
    manual_seed(7 + i);
    std::vector<float> ye = vec(step(x)), ge = vec(w.grad());
    manual_seed(7 + i);
    std::vector<float> yc = vec(f(x)), gc = vec(w.grad());
    for (size_t j = 0; j < ye.size(); ++j) {
      INFO("call " << i << " element " << j);
      CHECK((std::isnan(ye[j]) ? std::isnan(yc[j]) : yc[j] == ye[j]));
      CHECK((std::isnan(ge[j]) ? std::isnan(gc[j]) : gc[j] == ge[j]));
    }
  }
  // One mask per dropout: the forward's, drawn before the compiled region.
  std::string text = f.explain();
  INFO(text);
  size_t masks = 0;
  for (size_t at = 0; (at = text.find("eager op: dropout_mask", at)) != std::string::npos; ++at) ++masks;
  CHECK(masks == 1);
  CHECK(text.find("eager op: dropout (") == std::string::npos);
  CHECK(text.find("compiled region") != std::string::npos);
}

TEST_CASE("compile: a Transformer encoder training step equals eager", "[compile][autograd][transformer]") {
  auto make = [] {
    manual_seed(21);
    nn::TransformerEncoderLayerOptions o;
    o.d_model = 32, o.nhead = 4, o.dim_feedforward = 64, o.dropout = 0.1;
    o.activation = "gelu", o.batch_first = true;
    return std::make_shared<nn::TransformerEncoder>(o, 2);
  };
  auto em = make(), cm = make();
  nn::AdamW eo(em->parameters(), {.lr = 1e-3}), co(cm->parameters(), {.lr = 1e-3});
  auto step = [](nn::Module& m, nn::Optimizer& opt) {
    return [&m, &opt](const Tensor& x) {
      opt.zero_grad();
      Tensor loss = m.forward(x).sum();
      loss.backward();
      opt.step();
      return loss.detach();
    };
  };
  auto eager_step = step(*em, eo);
  auto compiled_step = compile(step(*cm, co));
  manual_seed(3);
  Tensor x = randn({2, 8, 32});
  for (int s = 0; s < 4; ++s) {
    manual_seed(50 + s);
    float le = eager_step(x).item<float>();
    manual_seed(50 + s);
    float lc = compiled_step(x).item<float>();
    CHECK(lc == Approx(le).margin(1e-3).epsilon(1e-4));
  }
  auto pe = em->parameters(), pc = cm->parameters();
  double worst = 0;
  for (size_t k = 0; k < pe.size(); ++k) {
    std::vector<float> a = vec(pe[k]), b = vec(pc[k]);
    for (size_t j = 0; j < a.size(); ++j) worst = std::max(worst, double(std::fabs(a[j] - b[j])));
  }
  CHECK(worst < 5e-4);  // Adam normalises gradients: rounding differences of ~1e-7 in tiny ones show up here
  if (std::getenv("KILN_TEST_EXPLAIN")) fmt::print("{}", compiled_step.explain());
  INFO(compiled_step.explain());
  CHECK(compiled_step.compile_count() == 1);
}

TEST_CASE("compile: an nn::Module's forward, parameters captured", "[compile][autograd]") {
  manual_seed(8);
  nn::Sequential model{std::make_shared<nn::Linear>(4, 8), std::make_shared<nn::GELU>(),
                       std::make_shared<nn::Linear>(8, 2)};
  auto cm = kiln::compile(model);
  Tensor x = randn({3, 4});
  std::vector<float> e = vec(model(x));
  for (int i = 0; i < 2; ++i) {
    std::vector<float> c = vec(cm(x));
    for (size_t k = 0; k < e.size(); ++k) CHECK(c[k] == Approx(e[k]).margin(1e-6));
  }
  // An in-place parameter update is seen by the next replay without recompiling.
  {
    NoGradGuard ng;
    for (Tensor p : model.parameters()) p *= 0.5;
  }
  std::vector<float> e2 = vec(model(x)), c2 = vec(cm(x));
  for (size_t k = 0; k < e2.size(); ++k) CHECK(c2[k] == Approx(e2[k]).margin(1e-6));
  CHECK(cm.compile_count() == 1);
}

TEST_CASE("compile: an argument or captured tensor whose view was written in place carries "
          "that history, on replays too", "[compile][autograd]") {
  // h.slice(0, 0, 2) = x * 2 gives h x's history (CopySlices). A replay of the entry traced
  // with h not requiring grad used to return (h * w).sum() without x's path.
  auto f = compile([](const Tensor& h, const Tensor& w) { return (h * w).sum(); });
  Tensor w = tensor({1.0f, 2.0f, 3.0f}).requires_grad_();
  for (int k = 0; k < 3; ++k) f(ones({3}), w);  // traced, then replayed
  Tensor x = tensor({1.0f, 3.0f}).requires_grad_();
  Tensor h = zeros({3});
  h.slice(0, 0, 2).copy_(x * 2.0);
  w.set_grad(Tensor());
  f(h, w).backward();
  CHECK(vec(x.grad()) == std::vector<float>{2, 4});  // d/dx sum(2x · w[0:2]) = 2 w[0:2]
  CHECK(vec(w.grad()) == std::vector<float>{2, 6, 0});
  CHECK(f.compile_count() == 2);  // h requires grad now: a guard

  // The same tensor captured instead of passed.
  Tensor c = ones({3});
  auto g = compile([&](const Tensor& w2) { return (c * w2).sum(); });
  for (int k = 0; k < 3; ++k) g(w);
  c.slice(0, 0, 2).copy_(x * 2.0);
  x.set_grad(Tensor());
  g(w).backward();
  CHECK(vec(x.grad()) == std::vector<float>{2, 4});
  {
    NoGradGuard no_grad;  // c's new values
    CHECK(g(tensor({1.0f, 1.0f, 1.0f})).item<float>() == 2 + 6 + 1);
  }

  // A function that writes into a view itself runs eagerly, with eager's gradients.
  auto k = compile([](const Tensor& a) {
    Tensor buf = zeros({3});
    buf.slice(0, 1, 3).copy_(a * a);
    return (buf * 2.0).sum();
  });
  for (int call = 0; call < 2; ++call) {
    Tensor a = tensor({1.0f, 2.0f}).requires_grad_();
    k(a).backward();
    CHECK(vec(a.grad()) == std::vector<float>{4, 8});
  }
  CHECK(contains(k.explain(), "CopySlices"));
}

TEST_CASE("compile: a function that runs a create_graph backward runs eagerly", "[compile][autograd]") {
  // Found by a fresh-user trial: replays returned x.grad without its history, so a gradient
  // penalty's own gradient was lost (eager and PyTorch: d/dx Σ 3x² = [6, 12]).
  auto f = compile([](const Tensor& x) {
    sum(x * x * x).backward(Tensor(), false, /*create_graph=*/true);
    return x.grad() * 1.0;
  });
  auto penalty = compile([](const Tensor& x) {
    Tensor g = grad({sum(x * x * x)}, {x}, {}, /*create_graph=*/true)[0];
    return sum(x) + sum(g * g);  // d/dx = 1 + 2·3x²·6x = 1 + 36x³
  });
  for (int call = 0; call < 3; ++call) {
    INFO("call " << call);
    Tensor x = tensor({1.0, 2.0}).requires_grad_();
    Tensor out = f(x);
    CHECK(out.to_vector<double>() == std::vector<double>{3, 12});
    REQUIRE(x.grad().requires_grad());
    CHECK(grad({sum(x.grad())}, {x})[0].to_vector<double>() == std::vector<double>{6, 12});
    Tensor z = tensor({1.0, 2.0}).requires_grad_();
    penalty(z).backward();
    CHECK(z.grad().to_vector<double>() == std::vector<double>{37, 289});
  }
  CHECK(contains(f.explain(), "create_graph=true"));
}

TEST_CASE("compile: an output whose backward would raise keeps raising on replays",
          "[compile][autograd]") {
  // Found by a re-test: x*w saves x, then the function adds to x in place. Eager raises at the
  // backward; replays returned y without requires_grad, silently dropping its gradient.
  auto f = compile([](const Tensor& x, const Tensor& w) {
    Tensor y = x * w;
    Tensor xx = x;
    xx += 1.0;
    return y;
  });
  Tensor w = ones({3}).requires_grad_();
  for (int call = 0; call < 3; ++call) {
    INFO("call " << call);
    Tensor y = f(arange(3, DType::Float32), w);
    CHECK(y.requires_grad());
    CHECK_THROWS_WITH((y.sum() + (w * w).sum()).backward(), Catch::Contains("in-place"));
  }
  CHECK(contains(f.explain(), "outputs' backward fails"));
}

TEST_CASE("compile: a no_grad view of a leaf passed to a function that writes it raises as eager",
          "[compile][autograd]") {
  auto f = compile([](const Tensor& v) {
    Tensor vv = v;
    vv += 1.0;
    return v * 2.0;
  });
  for (int call = 0; call < 3; ++call) f(zeros({4}));  // traced and replayed with plain tensors
  Tensor p = zeros({2, 2}).requires_grad_();
  Tensor v;
  {
    NoGradGuard ng;
    v = p.view({-1});
  }
  CHECK_THROWS_WITH(f(v), Catch::Contains("made under no_grad"));
  CHECK(vec(p.detach().view({-1})) == std::vector<float>{0, 0, 0, 0});
}

namespace {
float max_abs_diff(const Tensor& a, const Tensor& b) { return amax(abs(a - b)).item<float>(); }
}  // namespace

TEST_CASE("compile: two backwards in one step (gradient accumulation) compile once, as eager",
          "[compile][autograd]") {
  // Found by a fresh-user trial: the second backward accumulates into the .grad the first
  // created, in place, and every trace was refused as state escaping the call.
  auto make = [] {
    manual_seed(3);
    return std::make_shared<nn::Linear>(4, 3);
  };
  auto eager_lin = make(), compiled_lin = make();
  nn::SGD eager_opt(eager_lin->parameters(), {.lr = 0.1});
  nn::SGD compiled_opt(compiled_lin->parameters(), {.lr = 0.1});
  auto step = [](nn::Linear& lin, nn::SGD& opt, const Tensor& x) {
    opt.zero_grad();
    for (int k = 0; k < 2; ++k) lin(x.slice(0, 2 * k, 2 * k + 2)).pow(2).mean().backward();
    opt.step();
  };
  auto cstep = kiln::compile([&](const Tensor& x) { step(*compiled_lin, compiled_opt, x); });
  for (int i = 0; i < 5; ++i) {
    Tensor x = randn({4, 4});
    step(*eager_lin, eager_opt, x);
    cstep(x);
    CHECK(max_abs_diff(compiled_lin->weight, eager_lin->weight) < 1e-6);
    CHECK(max_abs_diff(compiled_lin->weight.grad(), eager_lin->weight.grad()) < 1e-6);
  }
  CHECK(cstep.compile_count() == 1);
  CHECK(cstep.cache_entries() == 1);
  // An argument's .grad from two backwards, one of them retaining the graph.
  auto f = [](const Tensor& x) {
    Tensor y = (x * x).sum();
    y.backward({}, true);
    y.backward();
    x.exp().sum().backward();
  };
  auto cf = kiln::compile(f);
  for (int i = 0; i < 3; ++i) {
    Tensor a = randn({5}).requires_grad_(), b = a.detach().clone().requires_grad_();
    f(a);
    cf(b);
    CHECK(max_abs_diff(b.grad(), a.grad()) < 1e-5);
  }
  CHECK(cf.compile_count() == 1);
}

TEST_CASE("compile: in-place writes to a .grad that exists at the call reach it on every replay "
          "(a compiled clip_grad_norm_ with backward run outside)",
          "[compile][autograd]") {
  // Found by a review against PyTorch: the replay computed the scaled gradient and dropped it,
  // so an eager optimizer step after a compiled clip used the unclipped gradient.
  Tensor p = zeros({2}).requires_grad_();
  auto halve = compile([&](const Tensor& d) {
    Tensor g = p.grad();
    g *= 0.5;
    return d;
  });
  for (double v : {8.0, 6.0, 100.0}) {
    Tensor g = full({2}, v);
    p.set_grad(g);
    halve(zeros({}));
    CHECK(p.grad().is_same(g));  // the same tensor, written in place
    CHECK(g.to_vector<float>() == std::vector<float>{float(v / 2), float(v / 2)});
  }
  CHECK(halve.compile_count() == 1);

  auto run = [](bool compiled) {
    Tensor w = zeros({3}).requires_grad_();
    auto clip = [&] { return nn::clip_grad_norm_({w}, 1.0); };
    auto cclip = compile(clip);
    for (int step = 0; step < 3; ++step) {
      w.set_grad(full({3}, 10.0 * (step + 1)));
      Tensor norm = compiled ? cclip() : clip();
      CHECK(norm.item<double>() == Approx(10.0 * (step + 1) * std::sqrt(3.0)));
      NoGradGuard no_grad;
      w.sub_(w.grad());  // SGD, lr 1, eagerly
    }
    return w.to_vector<float>();
  };
  std::vector<float> eager = run(false), compiled = run(true);
  CHECK(eager[0] == Approx(-std::sqrt(3.0)));  // three steps of 1/sqrt(3)
  CHECK(compiled == eager);
}

TEST_CASE("compile: an output computed from another output that requires grad runs eagerly "
          "(gradients with respect to the first are eager's); retain_grad on an output holds on "
          "replays and the trace's own backward does not fill it",
          "[compile][autograd]") {
  // Found by a review: replays returned (h, l) as siblings of one node, so d(l + h.sum())/dh
  // was [1, 1, 1] instead of [7, 7, 7] and h.retain_grad() saw nothing from l.
  auto body = [](const Tensor& x) {
    Tensor h = x * 3.0;
    return std::make_tuple(h, (h * h).sum());
  };
  auto cf = compile(body);
  for (int call = 0; call < 3; ++call) {
    Tensor x = ones({3}).requires_grad_();
    auto [h, l] = cf(x);
    std::vector<Tensor> g = grad({l + h.sum()}, {x, h});
    CHECK(vec(g[0]) == std::vector<float>(3, 21.f));
    CHECK(vec(g[1]) == std::vector<float>(3, 7.f));
  }
  CHECK(contains(cf.explain(), "output 1 is computed from output 0"));
  // Counted among the tensors returned (a vector's length is not one of them).
  auto cv = compile([](const Tensor& x) {
    Tensor h = x * 3.0;
    return std::vector<Tensor>{h, (h * h).sum()};
  });
  cv(ones({3}).requires_grad_());
  CHECK(contains(cv.explain(), "output 1 is computed from output 0"));

  // retain_grad inside, backward outside: h.grad is eager's, on the trace and on replays.
  auto cr = compile([](const Tensor& x) {
    Tensor h = x * 3.0;
    h.retain_grad();
    return h;
  });
  for (int call = 0; call < 3; ++call) {
    Tensor x = ones({3}).requires_grad_();
    Tensor h = cr(x);
    CHECK_FALSE(h.grad().defined());  // the trace's backward filled it with its seed
    (h * h).sum().backward();
    REQUIRE(h.grad().defined());  // replays: undefined
    CHECK(vec(h.grad()) == std::vector<float>(3, 6.f));
    CHECK(vec(x.grad()) == std::vector<float>(3, 18.f));
  }
  CHECK(cr.compile_count() == 1);
}

TEST_CASE("compile: a detached output is a new tensor without history on every call",
          "[compile][autograd]") {
  // Found by review: replays returned x itself for x.detach(), so gradient flowed through it.
  auto f = compile([](const Tensor& x) { return x.detach(); });
  auto leaf = compile([](const Tensor& x) { return x.detach().requires_grad_(); });
  for (int call = 0; call < 3; ++call) {
    Tensor x = tensor({1.0f, 2.0f, 3.0f}).requires_grad_();
    Tensor d = f(x);
    CHECK_FALSE(d.is_same(x));
    CHECK_FALSE(d.requires_grad());
    CHECK(d.storage().get() == x.storage().get());  // shares x's memory, as eager's detach
    CHECK_THROWS_AS((d * d).sum().backward(), Error);
    Tensor o = leaf(x);
    (o * o).sum().backward();
    CHECK(vec(o.grad()) == std::vector<float>{2, 4, 6});
    CHECK_FALSE(x.grad().defined());
  }
}

TEST_CASE("compile: outputs of one call are back-propagated one after the other",
          "[compile][autograd]") {
  // Found by review: the outputs share one backward node, which the first backward freed, so
  // the second raised "backward through the graph a second time" from the first replay on.
  auto f = compile([](const Tensor& x) { return std::vector<Tensor>{x * 2.0, exp(x)}; });
  for (int call = 0; call < 3; ++call) {
    Tensor x = tensor({1.0f, 0.0f}).requires_grad_();
    std::vector<Tensor> o = f(x);
    o[1].sum().backward();
    o[0].sum().backward();
    std::vector<float> g = vec(x.grad());
    CHECK(g[0] == Approx(2 + std::exp(1.0)));
    CHECK(g[1] == Approx(3.0));
    CHECK_THROWS_WITH(o[0].sum().backward(), Catch::Contains("a second time"));  // as eager
  }
}

TEST_CASE("compile: outputs computed through one node that saved tensors free them for each "
          "other, as in eager", "[compile][autograd]") {
  // Review: eager (and PyTorch) raise at b.backward() after a.backward(): exp's saved output
  // was freed. Replays allowed it. With retain_graph on the first, both work.
  auto f = [](const Tensor& x) {
    Tensor e = x.exp();
    return std::make_tuple((e * 2.0).sum(), (e * x).sum());
  };
  auto cf = compile(f);
  for (int call = 0; call < 4; ++call) {
    for (bool compiled : {false, true}) {
      INFO("call " << call << (compiled ? " compiled" : " eager"));
      Tensor x = from_vector<double>({1, 2}, {2}).requires_grad_();
      auto [a, b] = compiled ? cf(x) : f(x);
      a.backward();
      CHECK_THROWS_WITH(b.backward(), Catch::Contains("a second time"));
      Tensor y = from_vector<double>({1, 2}, {2}).requires_grad_();
      auto [c, d] = compiled ? cf(y) : f(y);
      c.backward(Tensor(), /*retain_graph=*/true);
      d.backward();
      // d/dy of 2e^y + y e^y: 2e^y + e^y (1 + y).
      std::vector<double> g = y.grad().to_vector<double>();
      CHECK(g[0] == Approx(2 * std::exp(1.0) + std::exp(1.0) * 2));
      CHECK(g[1] == Approx(2 * std::exp(2.0) + std::exp(2.0) * 3));
    }
  }
}

namespace {
// y = f(x) for x = zeros({2}) that requires grad, then x (or y, `to_output`) += 1 under no_grad.
template <class F> std::pair<Tensor, Tensor> exp_call_then_add_one(F& f, bool to_output) {
  Tensor x = zeros({2}).requires_grad_();
  Tensor y = f(x);
  NoGradGuard ng;
  (to_output ? y : x).add_(1);
  return {x, y};
}
}  // namespace

TEST_CASE("compile: a double backward through a replay keeps detach() and no_grad out of the "
          "graph, and refuses inputs changed since the call", "[compile][autograd]") {
  // Second derivative of sum(x² · mean(x.detach())) is 2·mean(x) per element, and the
  // gradient of |g|² with g = 2x·c is 8x·c² (c = mean(x) constant): [0, 8, 16] at x = [0, 1, 2].
  auto f = [](const Tensor& x) { return (x * x * x.detach().mean()).sum(); };
  auto f_ng = [](const Tensor& x) {
    Tensor c;
    {
      NoGradGuard ng;
      c = x.mean();
    }
    return (x * x * c).sum();
  };
  for (auto* fn : {+f, +f_ng}) {
    auto cf = compile(fn);
    for (int call = 1; call <= 3; ++call) {
      INFO("call " << call);
      Tensor xe = arange(3, {DType::Float32}).requires_grad_();
      Tensor xc = arange(3, {DType::Float32}).requires_grad_();
      Tensor ge = grad({fn(xe)}, {xe}, {}, true)[0];
      Tensor gc = grad({cf(xc)}, {xc}, {}, true)[0];
      CHECK(vec(gc) == vec(ge));
      Tensor he = grad({(ge * ge).sum()}, {xe})[0];
      Tensor hc = grad({(gc * gc).sum()}, {xc})[0];
      CHECK(vec(he) == std::vector<float>{0, 8, 16});
      CHECK(vec(hc) == vec(he));
    }
    CHECK(cf.compile_count() == 1);
  }
  // exp saves its output, so eager may change x after the call; the compiled re-run would read
  // the changed x: a replay raises instead of a wrong gradient (the tracing call is eager's).
  auto cexp = compile([](const Tensor& x) { return x.exp(); });
  for (int call = 1; call <= 3; ++call) {
    INFO("call " << call);
    auto [x, y] = exp_call_then_add_one(cexp, /*to_output=*/false);
    if (call == 1)
      CHECK(vec(grad({y.sum()}, {x}, {}, true)[0]) == std::vector<float>{1, 1});
    else
      CHECK_THROWS_WITH(grad({y.sum()}, {x}, {}, true),
                        Catch::Contains("was modified in place after the call"));
  }
  Tensor x2 = zeros({2}).requires_grad_();
  CHECK(vec(grad({cexp(x2).sum()}, {x2}, {}, true)[0]) == std::vector<float>{1, 1});
  CHECK(cexp.compile_count() == 1);
}

TEST_CASE("compile: a saved value changed in place names the op that saved it, as eager",
          "[compile][autograd]") {
  auto cexp = compile([](const Tensor& x) { return x.exp(); });
  for (int call = 1; call <= 3; ++call) {
    INFO("call " << call);
    Tensor y = exp_call_then_add_one(cexp, /*to_output=*/true).second;  // exp saved its output
    try {
      y.sum().backward();
      FAIL("no error");
    } catch (const Error& e) {
      CHECK(e.op() == "exp");
      CHECK_THAT(e.what(), Catch::Contains("modified by an in-place operation"));
    }
  }
  // A saved input names the op that read it (it said kiln::backward on replays; re-review).
  auto crem = compile([](const Tensor& a, const Tensor& b) { return remainder(a, b); });
  for (int call = 1; call <= 3; ++call) {
    INFO("call " << call);
    Tensor b = full({3}, 2.0).requires_grad_();
    Tensor a = arange(3, DType::Float32) * 1.0;
    Tensor r = crem(a, b);
    a.add_(1.0);
    try {
      r.sum().backward();
      FAIL("no error");
    } catch (const Error& e) {
      CHECK(e.op() == "remainder");
    }
  }
}

TEST_CASE("compile: outputs that are views take later in-place writes as eager's views do") {
  // Replays returned views without view tracking: an in-place write into the output of
  // `(w * 2).view({6})` lost w's gradient, and an output `w.t()` used after w was written in
  // place with history gave the old gradient silently (eager regenerates it from m's new one).
  auto doubled = compile([](const Tensor& w) { return (w * 2).view({6}); });
  auto transposed = compile([](const Tensor& w) { return w.t(); });
  for (int call = 0; call < 3; ++call) {
    Tensor w = arange(1, 7, 1, DType::Float64).requires_grad_();
    Tensor x = tensor({1.0, 2.0, 3.0}).requires_grad_();
    Tensor first = doubled(w).slice(0, 0, 3);
    first.mul_(x);  // a view of the output's memory: its history is rebased, as in eager
    first.sum().backward();
    CHECK(w.grad().to_vector<double>() == std::vector<double>{2, 4, 6, 0, 0, 0});
    CHECK(x.grad().to_vector<double>() == std::vector<double>{2, 4, 6});

    Tensor leaf = arange(1, 7, 1, DType::Float64).requires_grad_();
    Tensor m = leaf.view({2, 3}) * 2;
    Tensor o = transposed(m);
    m.mul_(3.0);
    o.sum().backward();  // o = (6·leaf)ᵀ now
    CHECK(leaf.grad().to_vector<double>() == std::vector<double>(6, 6.0));

    // A view output of a leaf argument made by view().requires_grad_() (its base has no
    // history) stayed a view: replays let mul_ write the leaf (re-review).
    Tensor w2 = arange(6, DType::Float64).view({2, 3}).requires_grad_();
    Tensor o2 = transposed(w2);
    CHECK_THROWS_WITH(o2.mul_(2.0), Catch::Contains("of a leaf tensor that requires grad"));
    CHECK(w2.detach().to_vector<double>() == std::vector<double>{0, 1, 2, 3, 4, 5});
  }
}

TEST_CASE("compile: double backward through replays handles x.detach(), dropout and relu as "
          "eager does (review)", "[compile][autograd]") {
  // The traced backward read x.detach() as live x (one value id), and dropout's recorded ops
  // (made under no_grad) cut x's history in the re-run: replays gave [2, 16, 54, 128] for
  // sum(x·x·x.detach()) (eager and PyTorch [1, 8, 27, 64]) and half of dropout's.
  auto detached = [](const Tensor& x) { return (x * x * x.detach()).sum(); };
  auto power = [](const Tensor& x) { return pow(x, x.detach()).sum(); };
  auto mse = [](const Tensor& x) { return mse_loss(x * x, x.detach()); };
  auto dropped = [](const Tensor& x) { return (dropout(x, 0.5) * x).sum(); };
  // relu's formula joins x's graph only under create_graph, which the traced backward lacked.
  auto rectified = [](const Tensor& x) { return (relu(x - 1.0) * 3.0).sum(); };
  for (auto* fn : {+detached, +power, +mse, +dropped, +rectified}) {
    auto cf = compile(fn);
    for (int call = 1; call <= 3; ++call) {
      INFO("call " << call);
      auto second = [&](auto& f) {
        manual_seed(7 + call);
        Tensor x = (arange(4, DType::Float64) + 0.5).requires_grad_();
        Tensor g = grad({f(x)}, {x}, {}, true)[0];
        return std::pair{g.detach(), grad({(g * g).sum()}, {x})[0]};
      };
      auto [ge, he] = second(fn);
      auto [gc, hc] = second(cf);
      CHECK(gc.to_vector<double>() == ge.to_vector<double>());
      CHECK(hc.to_vector<double>() == he.to_vector<double>());
    }
  }
  Tensor x = tensor({0.5, 1.0, 1.5, 2.0}).requires_grad_();
  Tensor g = grad({detached(x)}, {x}, {}, true)[0];
  CHECK(grad({(g * g).sum()}, {x})[0].to_vector<double>() == std::vector<double>{1, 8, 27, 64});
}

TEST_CASE("compile: backward from one output when the other's formula is singular, with dropout",
          "[compile][autograd]") {
  // sqrt's gradient at 0 makes the zero-filled partial backward NaN, so the replay falls back
  // to an eager backward, whose re-run lost dropout's history: a null grad_fn, SIGSEGV.
  auto cf = compile([](const Tensor& x) {
    return std::vector<Tensor>{dropout(x, 0.5) * 3.0, sqrt(x)};
  });
  std::vector<double> first;
  for (int call = 1; call <= 3; ++call) {
    manual_seed(5);
    Tensor x = arange(6, DType::Float64).requires_grad_();
    auto o = cf(x);
    o[0].sum().backward();
    std::vector<double> gx = x.grad().to_vector<double>();
    for (size_t i = 0; i < gx.size(); ++i) CHECK((gx[i] == 0 || gx[i] == 6));
    if (call == 1) first = gx;
    CHECK(gx == first);
  }
}

// backward() into a .grad that exists at the call: the trace accumulates into that tensor, so
// its layout and its sharing with other tensors are guarded. An expanded .grad (eager replaces
// it with the sum) raised "more than one element ... refers to a single memory location" when
// the trace had a dense one; one .grad shared by p and q (eager adds both gradients into it)
// gave p's sum to both when replayed for separate .grads, and lost q's the other way round.
TEST_CASE("compiled backward: an expanded .grad after a dense one is replaced, as in eager",
          "[compile][autograd]") {
  Tensor x = from_vector(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3});
  auto step = compile([](const Tensor& w, const Tensor& x) { (w * x).sum().backward(); });
  Tensor w = zeros({2, 3}).requires_grad_();
  w.set_grad(zeros({2, 3}));
  step(w, x);
  step(w, x);
  CHECK(vec(w.grad()) == std::vector<float>{2, 4, 6, 8, 10, 12});
  Tensor expanded_grad = tensor({100.f, 200.f, 300.f}).expand({2, 3});
  Tensor v = zeros({2, 3}).requires_grad_();
  v.set_grad(expanded_grad);
  step(v, x);
  CHECK(vec(v.grad().contiguous()) == std::vector<float>{101, 202, 303, 104, 205, 306});
  CHECK(vec(expanded_grad.contiguous()) == std::vector<float>{100, 200, 300, 100, 200, 300});
  CHECK(step.compile_count() == 2);
}

TEST_CASE("compiled backward: one .grad shared by two parameters, or not, as when traced",
          "[compile][autograd]") {
  Tensor x = tensor({1.f, 2.f});
  auto body = [](const Tensor& p, const Tensor& q, const Tensor& x) {
    ((p * x).sum() + (q * x * 2.0).sum()).backward();  // d/dp = x, d/dq = 2x
  };
  auto shared_call = [&](auto& f) {
    Tensor p = zeros({2}).requires_grad_(), q = zeros({2}).requires_grad_();
    Tensor g = tensor({10.f, 20.f});
    p.set_grad(g);
    q.set_grad(g);
    f(p, q, x);
    CHECK(vec(g) == std::vector<float>{13, 26});  // [10, 20] + x + 2x, in place
    CHECK(p.grad().is_same(g));
  };
  auto separate_call = [&](auto& f) {
    Tensor p = zeros({2}).requires_grad_(), q = zeros({2}).requires_grad_();
    p.set_grad(tensor({10.f, 20.f}));
    q.set_grad(tensor({30.f, 40.f}));
    f(p, q, x);
    CHECK(vec(p.grad()) == std::vector<float>{11, 22});
    CHECK(vec(q.grad()) == std::vector<float>{32, 44});
  };
  SECTION("traced shared, then separate, then shared again") {
    auto f = compile(body);
    shared_call(f);
    separate_call(f);
    shared_call(f);
    separate_call(f);
    CHECK(f.compile_count() == 2);
  }
  SECTION("traced separate, then shared") {
    auto f = compile(body);
    separate_call(f);
    shared_call(f);
    separate_call(f);
    CHECK(f.compile_count() == 2);
  }
}
