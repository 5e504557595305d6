// compile() and host state: a module's training flag is guarded (train()/eval() after compiling
// selects the entry traced in that mode), and an optimizer's hyperparameters are runtime
// inputs (a learning-rate schedule takes effect on replay, without recompiling).
#include <catch2/catch.hpp>
#include <cmath>

#include "error_of.h"
#include "kiln/kiln.h"
#include "kiln/nn.h"
#include "nn/optim.h"
#include "tracer/util.h"

using namespace kiln;
using kiln::testing::contains;
using kiln::testing::vec;

namespace {
void check_close(const Tensor& compiled, const Tensor& eager, double tol = 1e-6) {
  std::vector<float> c = vec(compiled), e = vec(eager);
  REQUIRE(c.size() == e.size());
  for (size_t i = 0; i < c.size(); ++i) CHECK(c[i] == Approx(e[i]).epsilon(tol).margin(tol));
}
}  // namespace

TEST_CASE("compile(module): eval() after compiling turns dropout off, train() back on",
          "[compile][host]") {
  manual_seed(0);
  nn::Dropout d(0.5);
  auto cm = compile(d);
  Tensor x = ones({6});
  for (int k = 0; k < 2; ++k) {  // trace, then replay, in training mode: dropout as eager's
    manual_seed(10 + k);
    std::vector<float> e = vec(d.forward(x));
    manual_seed(10 + k);
    CHECK(vec(cm(x)) == e);
  }
  d.eval();
  CHECK(vec(cm(x)) == std::vector<float>(6, 1.f));  // was [2, 2, 2, 2, 0, 0]: mode ignored
  CHECK(vec(cm(x)) == std::vector<float>(6, 1.f));
  d.train();
  manual_seed(12);
  std::vector<float> e = vec(d.forward(x));
  manual_seed(12);
  CHECK(vec(cm(x)) == e);
  CHECK(e != std::vector<float>(6, 1.f));
  std::string ex = cm.explain();
  INFO(ex);
  CHECK(cm.compile_count() == 2);  // one trace per mode; both entries kept
  CHECK(cm.cache_entries() == 2);
  CHECK(contains(ex, "Dropout.is_training() at"));
  CHECK(contains(ex, "is false, expected true"));  // the recompile's reason
  // Read by kiln's Dropout: named by the compile() line, not nn/module.cpp.
  CHECK(contains(ex, "Dropout.is_training() == true (at"));
  CHECK_FALSE(contains(ex, "nn/module.cpp"));
  CHECK_FALSE(contains(ex, "nn/layers.cpp"));
}

TEST_CASE("compile: a Sequential with Dropout, compiled whole or called from a lambda, follows "
          "train()/eval() of its submodules", "[compile][host]") {
  manual_seed(3);
  nn::Sequential model{std::make_shared<nn::Linear>(4, 8), std::make_shared<nn::ReLU>(),
                       std::make_shared<nn::Dropout>(0.5), std::make_shared<nn::Linear>(8, 2)};
  Tensor x = randn({5, 4});
  auto whole = compile(model);
  auto lambda = compile([&model](const Tensor& in) { return model.forward(in) * 1.0; });
  for (bool training : {true, false, true, false}) {
    model.train(training);
    INFO("training " << training);
    manual_seed(7);
    Tensor e = model.forward(x);
    manual_seed(7);
    check_close(whole(x), e);
    manual_seed(7);
    check_close(lambda(x), e);
  }
  CHECK(whole.compile_count() == 2);
  CHECK(lambda.compile_count() == 2);
  // Only the Dropout reads its mode, so a submodule's eval() alone switches too.
  model.train();
  model.named_children()[2].second->eval();
  check_close(whole(x), model.forward(x));
  CHECK(whole.compile_count() == 2);
}

TEST_CASE("compile: a module built inside the compiled function keeps a readable mode",
          "[compile][host]") {
  auto f = compile([](const Tensor& x) {
    nn::Dropout d(0.5);
    d.eval();
    return d.forward(x) + 1.0;
  });
  for (int k = 0; k < 3; ++k) CHECK(vec(f(ones({3}))) == std::vector<float>(3, 2.f));
  CHECK(f.compile_count() == 1);
}

TEST_CASE("compile: a step that calls train() itself is one entry across eval() between calls",
          "[compile][host]") {
  // Found by a break-it pass: the PyTorch idiom, model.train() at the start of the step and
  // model.eval() for validation between epochs, guarded the flag's value at the call (false)
  // against the value traced (true, the function's own write): every epoch traced again, and
  // after 8 identical entries the step ran eagerly for good. train() inside the function is
  // now replayed on every call, and the reads after it are not guards.
  nn::Sequential model;
  model.push_back(std::make_shared<nn::Dropout>(0.5));
  auto step = compile([&](const Tensor& x) {
    model.train();
    return model.forward(x) * 1.0;
  });
  for (int epoch = 0; epoch < 10; ++epoch) {
    for (int s = 0; s < 2; ++s) {
      manual_seed(100 + s);
      Tensor got = step(ones({64}));
      CHECK(model.is_training());  // the replayed train() set it, as eager would
      manual_seed(100 + s);
      CHECK(vec(got) == vec(model.forward(ones({64})) * 1.0));  // dropout on: eager's mask
    }
    model.eval();  // validation between epochs
    CHECK(vec(model.forward(ones({64}))) == std::vector<float>(64, 1.f));
  }
  CHECK(step.compile_count() == 1);
  CHECK(contains(step.explain(), "host callback Dropout.train()"));
  // A read before the function's own write still guards the value at the call.
  nn::Dropout d(0.5);
  auto reads_first = compile([&](const Tensor& x) {
    Tensor y = d.is_training() ? x * 2.0 : x * 3.0;
    d.train();
    return y;
  });
  d.eval();
  CHECK(vec(reads_first(ones({2}))) == std::vector<float>{3, 3});
  d.eval();
  CHECK(vec(reads_first(ones({2}))) == std::vector<float>{3, 3});
  CHECK(vec(reads_first(ones({2}))) == std::vector<float>{2, 2});  // left in training mode
  CHECK(reads_first.compile_count() == 2);
}

namespace {
// A 1-element parameter and the loss sum((w·x − 1)²): one optimizer step per call.
struct Problem {
  Tensor w = from_vector<float>({0.5f, -1.25f}, {2}).requires_grad_();
  Tensor x = from_vector<float>({1.5f, 2.f}, {2});
  auto step(nn::Optimizer& opt) {
    return [this, &opt]() {
      opt.zero_grad();
      Tensor loss = ((w * x - 1.0) * (w * x - 1.0)).sum();
      loss.backward();
      opt.step();
      return loss.detach();
    };
  }
};
}  // namespace

TEST_CASE("compile: an SGD (momentum, weight decay) step follows a learning-rate schedule "
          "without recompiling", "[compile][host][optim]") {
  for (bool nesterov : {false, true}) {
    INFO("nesterov " << nesterov);
    Problem pe, pc;
    nn::SGDOptions o{.lr = 0.1, .momentum = 0.9, .dampening = nesterov ? 0 : 0.2,
                     .weight_decay = 0.05, .nesterov = nesterov};
    nn::SGD eager_opt({pe.w}, o), compiled_opt({pc.w}, o);
    auto eager_step = pe.step(eager_opt);
    auto compiled_step = compile(pc.step(compiled_opt));
    for (int k = 0; k < 6; ++k) {
      INFO("step " << k);
      double lr = 0.1 / (k + 1);
      eager_opt.options.lr = compiled_opt.options.lr = lr;
      // The other options change too: momentum, dampening and weight decay are inputs as well.
      eager_opt.options.momentum = compiled_opt.options.momentum = 0.9 - 0.1 * k;
      eager_opt.options.weight_decay = compiled_opt.options.weight_decay = 0.05 * (k + 1);
      Tensor le = eager_step(), lc = compiled_step();
      check_close(lc, le);
      check_close(pc.w, pe.w);
      check_close(compiled_opt.momentum_buffer(0), eager_opt.momentum_buffer(0));
    }
    INFO(compiled_step.explain());
    CHECK(compiled_step.compile_count() == 1);  // the schedule does not recompile
    CHECK(contains(compiled_step.explain(), "read on every call as graph inputs"));
    // A constant lr is not what the compiled step computes: the values moved with the schedule.
    CHECK(pc.w.to_vector<float>() != std::vector<float>{0.5f, -1.25f});
  }
}

TEST_CASE("compile: an AdamW step follows a schedule of lr, betas, eps and weight decay "
          "without recompiling", "[compile][host][optim]") {
  Problem pe, pc;
  nn::AdamWOptions o{.lr = 0.1, .beta1 = 0.9, .beta2 = 0.99, .eps = 1e-6, .weight_decay = 0.1};
  nn::AdamW eager_opt({pe.w}, o), compiled_opt({pc.w}, o);
  auto eager_step = pe.step(eager_opt);
  auto compiled_step = compile(pc.step(compiled_opt));
  for (int k = 0; k < 8; ++k) {
    INFO("step " << k);
    for (nn::AdamW* opt : {&eager_opt, &compiled_opt}) {
      opt->options.lr = 0.1 / (k + 1);
      opt->options.beta1 = 0.9 - 0.02 * k;
      opt->options.beta2 = 0.99 + 0.001 * k;
      opt->options.eps = 1e-6 * (k + 1);
      opt->options.weight_decay = 0.1 + 0.01 * k;
    }
    Tensor le = eager_step(), lc = compiled_step();
    check_close(lc, le);
    check_close(pc.w, pe.w);
    check_close(compiled_opt.exp_avg(0), eager_opt.exp_avg(0));
    check_close(compiled_opt.exp_avg_sq(0), eager_opt.exp_avg_sq(0));
  }
  CHECK(compiled_opt.step_count() == 8);
  INFO(compiled_step.explain());
  CHECK(compiled_step.compile_count() == 1);
}

TEST_CASE("compile: switching an optimizer's host branch (weight decay on/off) recompiles once "
          "per branch, with the reason in explain()", "[compile][host][optim]") {
  Problem pe, pc;
  nn::AdamW eager_opt({pe.w}, {.lr = 0.05, .weight_decay = 0.1});
  nn::AdamW compiled_opt({pc.w}, {.lr = 0.05, .weight_decay = 0.1});
  auto eager_step = pe.step(eager_opt);
  auto compiled_step = compile(pc.step(compiled_opt));
  for (int k = 0; k < 6; ++k) {
    INFO("step " << k);
    double wd = k % 2 ? 0.0 : 0.1;  // off on odd steps: the decay multiply is skipped
    eager_opt.options.weight_decay = compiled_opt.options.weight_decay = wd;
    check_close(compiled_step(), eager_step());
    check_close(pc.w, pe.w);
  }
  std::string ex = compiled_step.explain();
  INFO(ex);
  CHECK(compiled_step.compile_count() == 2);  // one trace per branch, then replays
  CHECK(contains(ex, "AdamW weight_decay != 0 at"));
  CHECK(contains(ex, "is false, expected true"));
}

TEST_CASE("compile: AdamW's per-parameter step counts in a compiled training step follow "
          "PyTorch when parameters start late, freeze and unfreeze", "[compile][host][optim]") {
  // PyTorch 1.13 reference, as tests/nn/nn_test.cpp's eager test of the same schedule:
  //   a = tensor([1., -2.]), b = tensor([.5]) (requires_grad); AdamW([a, b], lr=0.05,
  //   betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1); per step set a/b.requires_grad_,
  //   zero_grad(set_to_none=True),
  //   loss = (tensor([.5, 1.5])*a*a).sum() + (tensor([-2.])*b*b).sum(),
  //   backward unless the step has none, opt.step(); a, b printed with %.9g.
  // Steps 4 and 6 replay the entry traced at step 2 (the same requires_grad flags, both with
  // gradients) with other counts in the state tensors: t must come from them, not from the
  // trace.
  struct Step {
    bool ta, tb, backward;
    std::vector<float> a, b;
  };
  const std::vector<Step> steps = {
      {true, false, true, {0.945000052f, -1.94000006f}, {0.5f}},
      {true, true, true, {0.890416026f, -1.88037097f}, {0.547499955f}},
      {false, true, true, {0.890416026f, -1.88037097f}, {0.594904602f}},
      {true, true, true, {0.836348891f, -1.82115984f}, {0.642294824f}},
      {true, true, false, {0.836348891f, -1.82115984f}, {0.642294824f}},
      {true, true, true, {0.782905459f, -1.7624141f}, {0.689739585f}},
  };
  Tensor a = from_vector<float>({1.0f, -2.0f}, {2}).requires_grad_();
  Tensor b = from_vector<float>({0.5f}, {1}).requires_grad_();
  Tensor ca = from_vector<float>({0.5f, 1.5f}, {2}), cb = from_vector<float>({-2.0f}, {1});
  nn::AdamW opt({a, b}, {.lr = 0.05, .beta1 = 0.8, .beta2 = 0.95, .eps = 1e-6,
                         .weight_decay = 0.1});
  auto step = compile([&](bool backward) {
    opt.zero_grad();
    Tensor loss = (ca * a * a).sum() + (cb * b * b).sum();
    if (backward) loss.backward();
    opt.step();
    return loss.detach();
  });
  for (size_t s = 0; s < steps.size(); ++s) {
    INFO("step " << s + 1);
    a.requires_grad_(steps[s].ta);
    b.requires_grad_(steps[s].tb);
    step(steps[s].backward);
    std::vector<float> ga = vec(a), gb = vec(b);
    for (size_t i = 0; i < 2; ++i) CHECK(ga[i] == Approx(steps[s].a[i]).epsilon(1e-6));
    CHECK(gb[0] == Approx(steps[s].b[0]).epsilon(1e-6));
  }
  CHECK(opt.step_count(0) == 4);
  CHECK(opt.step_count(1) == 4);
  CHECK(opt.step_count() == 5);  // step 5 had no gradient: not counted
  INFO(step.explain());
  CHECK(step.compile_count() == 4);  // steps 1, 2, 3 and 5 trace; 4 and 6 replay step 2's
}

TEST_CASE("kiln::guarded does not split the graph and recompiles once per value",
          "[compile][host]") {
  bool flag = false;
  auto h = compile([&](const Tensor& x) { return kiln::guarded(flag) ? x * x : x * x + 1.0; });
  Tensor two = from_vector<float>({2}, {1});
  for (int k = 0; k < 4; ++k) {
    flag = k % 2;
    CHECK(h(two).item<float>() == (flag ? 4 : 5));
  }
  std::string ex = h.explain();
  INFO(ex);
  CHECK(h.compile_count() == 2);
  CHECK(contains(ex, "guarded host value kiln::guarded == false"));
  CHECK(contains(ex, "guarded host value kiln::guarded == true"));
  CHECK(!contains(ex, "on host value"));  // no trace-tree branch: one segment per entry
}

TEST_CASE("compile: a module setting changed after compiling traces again (Dropout.p, "
          "LayerNorm.eps, GELU.approximate, the encoder layer's norm_first and activation, "
          "attention's batch_first)", "[compile][host]") {
  manual_seed(5);
  nn::Dropout drop(0.5);
  nn::LayerNorm norm(Shape{4}, 1e-5);
  nn::GELU act;
  auto f = compile([&](const Tensor& x) { return drop.forward(act.forward(norm.forward(x))); });
  Tensor x = from_vector<float>({1, 2, 3, 4, -1, 0, 0, 1}, {2, 4});
  auto check_step = [&] {
    manual_seed(21);
    Tensor e = drop.forward(act.forward(norm.forward(x)));
    manual_seed(21);
    check_close(f(x), e);
  };
  check_step();
  check_step();
  drop.p = 0.25;  // the replay kept p = 0.5: its kept values were scaled by 2, not 4/3
  check_step();
  norm.eps = 4.0;  // a large eps changes every value
  check_step();
  act.approximate = "tanh";
  check_step();
  drop.p = 0.5;  // back to a value traced before: no new trace for it
  norm.eps = 1e-5;
  act.approximate = "none";
  check_step();
  CHECK(f.compile_count() == 4);
  std::string ex = f.explain();
  INFO(ex);
  CHECK(contains(ex, "guarded host value Dropout.p == 0.25"));
  CHECK(contains(ex, "guarded host value LayerNorm.eps == 4 (at"));
  CHECK_FALSE(contains(ex, "nn/layers.cpp"));  // named by the compile() line
  CHECK(contains(ex, "guarded host value GELU.approximate == \"tanh\" == true"));

  nn::TransformerEncoderLayerOptions o;
  o.d_model = 8;
  o.nhead = 2;
  o.dim_feedforward = 16;
  o.dropout = 0;
  o.batch_first = true;
  nn::TransformerEncoderLayer layer(o);
  auto g = compile(layer);
  Tensor src = randn({3, 3, 8});  // batch == length: batch_first flips nothing in the shapes
  check_close(g(src), layer.forward(src), 1e-5);
  layer.options.norm_first = true;
  check_close(g(src), layer.forward(src), 1e-5);
  layer.options.activation = "gelu";
  check_close(g(src), layer.forward(src), 1e-5);
  layer.self_attn->batch_first = false;
  check_close(g(src), layer.forward(src), 1e-5);
  CHECK(g.compile_count() == 4);
}

TEST_CASE("compile: a setting of a module destroyed after compiling is not read",
          "[compile][host]") {
  // Under ASan a read of the destroyed module's p would be a heap-use-after-free.
  auto d = std::make_unique<nn::Dropout>(0.0);
  bool use = true;
  auto f = compile([&](const Tensor& x) {
    return kiln::guarded(use) ? d->forward(x) + 1.0 : x * 3.0;
  });
  Tensor x = ones({3});
  CHECK(vec(f(x)) == std::vector<float>(3, 2.f));
  CHECK(vec(f(x)) == std::vector<float>(3, 2.f));
  d.reset();
  use = false;  // the first entry's guards are checked (Dropout.p's reads nothing), then a trace
  CHECK(vec(f(x)) == std::vector<float>(3, 3.f));
  CHECK(vec(f(x)) == std::vector<float>(3, 3.f));
  CHECK(f.compile_count() == 2);
}

TEST_CASE("compile: a function that reseeds the generator runs eagerly, with the same draws",
          "[compile][host]") {
  // Found by a fresh-user trial: a replay drew from the caller's generator state, so the third
  // call returned other numbers than eager's, silently.
  const std::string here = __FILE__;
  auto f = [](const Tensor& x) {
    manual_seed(7);
    return x + rand({3});
  };
  auto cf = kiln::compile(f, CompileOptions{}, "reseeding");
  Tensor zeros3 = zeros({3});
  std::vector<float> eager = vec(f(zeros3));
  for (int call = 0; call < 3; ++call) {
    manual_seed(123 + call);
    (void)rand({100});  // the caller's generator state differs on every call
    CHECK(vec(cf(zeros3)) == eager);
  }
  CHECK_THAT(cf.explain(), Catch::Contains("runs eagerly from now on") &&
                               Catch::Contains("reseeds kiln's random generator") &&
                               Catch::Contains(here));
  // A function that only draws (no reseed) still compiles and follows the caller's generator.
  auto g = [](const Tensor& x) { return x + rand({3}); };
  auto cg = kiln::compile(g);
  for (int call = 0; call < 3; ++call) {
    manual_seed(40 + call);
    std::vector<float> want = vec(g(zeros3));
    manual_seed(40 + call);
    CHECK(vec(cg(zeros3)) == want);
  }
  CHECK_THAT(cg.explain(), !Catch::Contains("runs eagerly from now on"));
}

TEST_CASE("compile: a parameter replaced with register_parameter after compiling retraces",
          "[compile][host]") {
  // Found by a fresh-user trial: the optimizer kept the old weight alive, so the capture guard
  // passed and the replay used it, silently differing from eager.
  manual_seed(1);
  nn::Linear lin(4, 2);
  nn::SGD opt(lin.parameters(), {.lr = 0.1});
  auto f = [&](const Tensor& x) { return lin(x); };
  auto cf = kiln::compile(f);
  Tensor x = randn({3, 4});
  check_close(cf(x), f(x));
  check_close(cf(x), f(x));
  lin.weight = lin.register_parameter("weight", full({2, 4}, 0.5));  // a swap
  check_close(cf(x), f(x));
  CHECK(cf.compile_count() == 2);
  CHECK_THAT(cf.explain(), Catch::Contains("a module's parameter or buffer was replaced"));
  lin.weight = lin.register_parameter("weight", lin.weight);  // the same tensor: no retrace
  check_close(cf(x), f(x));
  CHECK(cf.compile_count() == 2);
}

TEST_CASE("compile: another module's buffer replaced does not retrace; its own swapped back and "
          "forth does, and a replaced submodule", "[compile][host]") {
  // A break-it pass: one process-wide count of replacements was guarded by every entry, so an
  // unrelated module refreshing a buffer each step retraced every compiled function until it
  // reached its cache limit and ran eagerly.
  manual_seed(2);
  nn::Linear lin(4, 2), other(4, 4);
  auto f = [&](const Tensor& x) { return lin(x); };
  auto cf = kiln::compile(f);
  Tensor x = randn({3, 4});
  cf(x);
  for (int step = 0; step < 12; ++step) {
    other.register_buffer("mask", full({4}, double(step)));
    check_close(cf(x), f(x));
  }
  CHECK(cf.compile_count() == 1);
  // Its own weight swapped for another and back (EMA weights): each swap retraces once.
  Tensor w = lin.weight, ema = full({2, 4}, 0.25);
  for (int swap = 0; swap < 2; ++swap) {
    lin.weight = lin.register_parameter("weight", ema);
    check_close(cf(x), f(x));
    check_close(cf(x), f(x));
    lin.weight = lin.register_parameter("weight", w);
    check_close(cf(x), f(x));
  }
  CHECK(cf.compile_count() == 5);
  // A submodule replaced by one without tensors (an activation) retraces too.
  struct Net : nn::Module {
    std::shared_ptr<nn::Module> act = register_module("act", std::make_shared<nn::ReLU>());
    Tensor forward(const Tensor& t) override { return act->forward(t) * 2.0; }
    std::string name() const override { return "Net"; }
    void use(std::shared_ptr<nn::Module> m) { act = register_module("act", std::move(m)); }
  } net;
  auto g = [&](const Tensor& t) { return net(t); };
  auto cg = kiln::compile(g);
  cg(x);
  check_close(cg(x), g(x));
  net.use(std::make_shared<nn::GELU>());
  check_close(cg(x), g(x));
  CHECK(cg.compile_count() == 2);
}

TEST_CASE("compile(module): errors in kiln's layer code name the cm(x) line, traced or replayed") {
  nn::Linear lin(3, 4);
  auto cl = kiln::compile(lin);
  unsigned line = __LINE__ + 1;
  Error e = kiln::testing::error_of([&] { cl(ones({2, 5})); });
  CHECK_THAT(e.what(), Catch::Contains("kiln::linear"));
  CHECK(std::string(e.where().file_name()) == __FILE__);
  CHECK(e.where().line() == line);
  nn::Embedding emb(5, 2);
  auto ce = kiln::compile(emb);
  ce(tensor({1, 2}).to(DType::Int64));
  ce(tensor({3, 4}).to(DType::Int64));
  line = __LINE__ + 1;
  e = kiln::testing::error_of([&] { ce(tensor({1, 7}).to(DType::Int64)); });
  CHECK_THAT(e.what(), Catch::Contains("index 7 is out of range"));
  CHECK(std::string(e.where().file_name()) == __FILE__);
  CHECK(e.where().line() == line);
  CHECK(ce.compile_count() == 1);  // raised by a replay
  CHECK(vec(ce(tensor({4}).to(DType::Int64))) == vec(emb(tensor({4}).to(DType::Int64))));
}

TEST_CASE("compile: an output the function also keeps in host state is not replayed",
          "[compile]") {
  // A break-it pass: `losses.push_back(loss); return loss;` kept only the traced call's loss
  // (a replay returns a new tensor and runs no host code), silently.
  std::vector<Tensor> losses;
  auto step = compile([&](const Tensor& x) {
    Tensor loss = (x * x).mean();
    losses.push_back(loss);
    return loss;
  });
  for (int i = 1; i <= 5; ++i) CHECK(step(full({4}, double(i))).item<float>() == float(i * i));
  REQUIRE(losses.size() == 5);
  for (int i = 1; i <= 5; ++i) CHECK(losses[i - 1].item<float>() == float(i * i));
  CHECK(contains(step.explain(), "its output 0 is also kept in host state"));
  struct State {
    Tensor last;
  } st;
  auto keep_last = compile([&](const Tensor& x) {
    Tensor y = x * 2.0;
    st.last = y;
    return y;
  });
  for (int i = 1; i <= 4; ++i) {
    Tensor r = keep_last(full({3}, double(i)));
    CHECK(vec(st.last) == vec(r));
    CHECK(vec(r) == std::vector<float>(3, float(2 * i)));
  }
}

TEST_CASE("compile: outputs held only by the outputs (twice, or as a view's base) replay",
          "[compile]") {
  auto f = compile([](const Tensor& x) {
    Tensor y = x * 2.0;
    return std::vector<Tensor>{y, y, y.view({2, 2}), x.t()};
  });
  for (int i = 0; i < 3; ++i) {
    std::vector<Tensor> r = f(full({4}, 1.0).view({2, 2}));
    CHECK(vec(r[2]) == std::vector<float>(4, 2.0f));
  }
  INFO(f.explain());
  CHECK(f.compile_count() == 1);
  CHECK(contains(f.explain(), "2 replay(s)"));
}
