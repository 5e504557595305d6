// compile(): what a call's result depends on beyond shapes and dtypes — one tensor passed twice
// vs two views of one buffer, the characters of a string argument, grad mode switched on inside
// the function, whole-tensor host reads — and the option / diagnostic checks around them
// (mark_dynamic, cache_size_limit, explain()'s replay count, check/compare with random ops).
// Each case was a silent wrong answer or a false error found by a new user's trial.
#include <catch2/catch.hpp>

#include <cstring>
#include <cmath>
#include <optional>
#include <string>
#include <string_view>

#include "codegen/codegen.h"
#include "kiln/kiln.h"
#include "kiln/nn.h"
#include "tracer/util.h"

using namespace kiln;
using kiln::testing::contains;
using kiln::testing::vec;

TEST_CASE("compile: f(t, t) does not replay for two views of one buffer", "[compile][alias]") {
  auto g = compile([](const Tensor& a, const Tensor& b) { return a - b; });
  Tensor t = arange(4, Float32);
  CHECK(vec(g(t, t)) == std::vector<float>{0, 0, 0, 0});
  Tensor u = arange(8, Float32);
  // Was [0, 0, 0, 0]: the trace took a and b as one value.
  CHECK(vec(g(u.slice(0, 0, 4), u.slice(0, 4, 8))) == std::vector<float>{-4, -4, -4, -4});
  CHECK(contains(g.explain(), "the same elements as arg 0"));

  // In place, partly overlapping views: eager's result and buffer.
  auto h = [](Tensor a, const Tensor& b) {
    a += b;
    return a * b;
  };
  auto ch = compile(h);
  Tensor s = arange(4, Float32);
  ch(s, s);
  Tensor w1 = arange(8, Float32), w2 = arange(8, Float32);
  std::vector<float> eager = vec(h(w1.slice(0, 0, 4), w1.slice(0, 2, 6)));
  std::vector<float> compiled = vec(ch(w2.slice(0, 0, 4), w2.slice(0, 2, 6)));
  CHECK(compiled == eager);
  CHECK(vec(w2) == vec(w1));
}

TEST_CASE("compile: a string_view or const char* argument is guarded by its characters",
          "[compile][host]") {
  auto f = [](const Tensor& x, std::string_view act) {
    return act == "relu" ? relu(x) : tanh(x);
  };
  auto cf = compile(f);
  Tensor x = full({3}, -1.0);
  std::string mode = "relu";
  CHECK(vec(cf(x, std::string_view(mode))) == std::vector<float>{0, 0, 0});
  mode = "tanh";  // the same buffer, new characters: was replayed as relu
  CHECK(vec(cf(x, std::string_view(mode)))[0] == Approx(std::tanh(-1.0)));
  CHECK(cf.compile_count() == 2);

  auto g = compile([](const Tensor& y, const char* act) {
    return std::strcmp(act, "relu") == 0 ? relu(y) : y * 2.0;
  });
  char buf[8] = "relu";
  CHECK(vec(g(x, static_cast<const char*>(buf))) == std::vector<float>{0, 0, 0});
  std::strcpy(buf, "twice");
  CHECK(vec(g(x, static_cast<const char*>(buf))) == std::vector<float>{-2, -2, -2});
}

TEST_CASE("compile: enable_grad inside a function called under no_grad keeps the graph",
          "[compile][autograd]") {
  Tensor w = full({3}, 2.0).requires_grad_();
  auto f = compile([&](const Tensor& x) {
    enable_grad on;
    return (x * w).sum();
  });
  Tensor x = arange(3, Float32);
  for (int call = 0; call < 3; ++call) {  // trace, then replays
    Tensor r;
    {
      no_grad off;
      r = f(x);
    }
    REQUIRE(r.requires_grad());  // replays returned requires_grad=false
    w.set_grad(Tensor());
    r.backward();
    CHECK(vec(w.grad()) == std::vector<float>{0, 1, 2});
  }
}

TEST_CASE("compile: to_vector() of a tensor inside the function is a graph break per element",
          "[compile][break]") {
  auto k = [](const Tensor& x) {
    double s = 0;
    for (float e : x.to_vector<float>()) s += e;
    return x * s;
  };
  auto ck = compile(k);
  Tensor a = full({2}, 1.0), b = tensor({1.f, 3.f});
  for (int call = 0; call < 2; ++call) {  // threw "cannot be converted to a scalar"
    CHECK(vec(ck(a)) == std::vector<float>{2, 2});
    CHECK(vec(ck(b)) == std::vector<float>{4, 12});  // new element values: a new branch
  }
  CHECK(contains(ck.explain(), "host read at"));
  Tensor e = zeros({0});
  CHECK(vec(ck(e)).empty());

  // Reading many elements on every call makes the function run eagerly.
  auto big = compile(k);
  Tensor many = ones({300});
  CHECK(vec(big(many))[0] == 300.f);
  CHECK(vec(big(many))[299] == 300.f);
  CHECK(contains(big.explain(), "runs eagerly from now on"));
}

TEST_CASE("compile: check=true and compare() with random ops start both runs from one seed",
          "[compile][random]") {
  auto f = [](const Tensor& x) { return dropout(x, 0.5) + rand({4}); };
  manual_seed(0);
  CompareReport rep = kiln::compare(f, ones({4}));
  CHECK(rep.ok);  // reported a divergence at dropout's mask
  auto cf = compile(f, CompileOptions{.check = true});
  manual_seed(3);
  Tensor expect = f(ones({4}));
  for (int call = 0; call < 2; ++call) {
    manual_seed(3);
    CHECK(vec(cf(ones({4}))) == vec(expect));  // threw a false "differs from eager"
    // The generator ends where one run leaves it.
    Tensor next = rand({1});
    manual_seed(3);
    f(ones({4}));
    CHECK(vec(next) == vec(rand({1})));
  }
}

TEST_CASE("compile: bad mark_dynamic indices and cache_size_limit raise", "[compile][options]") {
  auto f = [](const Tensor& x) { return x + 1.0; };
  for (auto [arg, dim] : {std::pair{0, 5}, std::pair{3, 0}, std::pair{0, -2}}) {
    auto cf = compile(f, CompileOptions{}.mark_dynamic(arg, dim));
    CHECK_THROWS_WITH(cf(ones({4})), Catch::Contains("mark_dynamic"));
  }
  auto neg = compile(f, CompileOptions{}.mark_dynamic(0, -1));  // the last dim
  neg(ones({4}));
  neg(ones({5}));
  CHECK(neg.compile_count() == 1);
  CHECK(contains(neg.explain(), "s0.0"));

  CHECK_THROWS_WITH(compile(f, CompileOptions{.cache_size_limit = 0}),
                    Catch::Contains("cache_size_limit is 0"));
}

TEST_CASE("compile: explain() counts replays, not calls that traced a new branch",
          "[compile][explain]") {
  auto f = compile([](const Tensor& x) { return x.sum().item<double>() > 0 ? x * 2.0 : x * 3.0; });
  f(ones({2}));
  f(-ones({2}));  // a new branch: traced, not replayed
  CHECK(contains(f.explain(), "0 replay(s)"));
  f(ones({2}));
  CHECK(contains(f.explain(), "1 replay(s)"));
}

TEST_CASE("compile: two views with the same elements are one value only while they stay so",
          "[compile][alias]") {
  auto f = [](Tensor a, const Tensor& b) {
    a += b;
    return a * b;
  };
  auto cf = compile(f);
  Tensor t = arange(8, Float32);
  cf(t.slice(0, 0, 4), t.slice(0, 0, 4));  // two tensors, the same elements: one value
  Tensor s1 = arange(8, Float32), s2 = arange(8, Float32);
  std::vector<float> eager = vec(f(s1.slice(0, 0, 4), s1.slice(0, 4, 8)));
  CHECK(vec(cf(s2.slice(0, 0, 4), s2.slice(0, 4, 8))) == eager);  // was [16, 36, 64, 100]
  CHECK(vec(s2) == vec(s1));  // s2[4:8] was overwritten
}

TEST_CASE("compile: a string literal or char array argument is guarded by its characters",
          "[compile][host]") {
  auto f = compile([](const Tensor& x, std::string_view act) { return act == "relu" ? relu(x) : -x; });
  Tensor x = full({2}, -1.0);
  CHECK(vec(f(x, "relu")) == std::vector<float>{0, 0});  // crashed in strlen
  CHECK(vec(f(x, "neg")) == std::vector<float>{1, 1});
  auto g = compile([](const Tensor& y, const char* act) { return std::strcmp(act, "relu") == 0 ? relu(y) : -y; });
  char buf[8] = "relu";
  CHECK(vec(g(x, buf)) == std::vector<float>{0, 0});
  std::strcpy(buf, "neg");
  CHECK(vec(g(x, buf)) == std::vector<float>{1, 1});
  CHECK(vec(g(x, "relu")) == std::vector<float>{0, 0});
}

TEST_CASE("compile: mark_dynamic counts the caller's arguments (a list is one)",
          "[compile][options]") {
  auto g = [](std::vector<Tensor> xs, const Tensor& y) { return xs[0].sum() + xs[1].sum() + y.sum(); };
  std::vector<Tensor> xs{ones({3}), ones({3})};
  auto cg = compile(g, CompileOptions{}.mark_dynamic(1, 0));  // y's dim 0
  CHECK(cg(xs, ones({2})).item<float>() == 8);
  CHECK(cg(xs, ones({5})).item<float>() == 11);
  CHECK(cg(xs, ones({7})).item<float>() == 13);
  CHECK(cg.compile_count() == 1);
  auto c0 = compile(g, CompileOptions{}.mark_dynamic(0, 0));
  CHECK_THROWS_WITH(c0(xs, ones({2})), Catch::Contains("argument 0 is not a tensor (the function "
                                                       "'fn' takes 2 argument(s))"));
}

TEST_CASE("compile: mark_dynamic errors name the compile() line; a later rank change retraces",
          "[compile][options]") {
  // Found by a fresh-user trial: these named tracer/compile.h, and a call whose argument had
  // another rank than the first call's raised instead of retracing.
  auto f = [](const Tensor& x) { return x * 2.0; };
  auto cf = compile(f, CompileOptions{}.mark_dynamic(0, 1));
  CHECK(vec(cf(ones({2, 3}))) == std::vector<float>(6, 2.0f));
  CHECK(vec(cf(ones({4}))) == std::vector<float>(4, 2.0f));  // rank 1: traced without the mark
  CHECK(vec(cf(ones({2, 5}))) == std::vector<float>(10, 2.0f));
  CHECK(cf.compile_count() == 2);
  auto bad = compile(f, CompileOptions{}.mark_dynamic(0, 2));
  const int bad_line = __LINE__ - 1;
  try {
    bad(ones({2, 3}));  // the first call: the options are wrong
    FAIL("no error");
  } catch (const Error& e) {
    CHECK_THAT(e.what(), Catch::Contains("dim 2 is out of range for argument 0 of rank 2") &&
                             Catch::Contains(fmt::format("{}:{}", __FILE__, bad_line)));
  }
}

TEST_CASE("compile: an optimizer step traced while a .grad was undefined retraces when it is "
          "defined", "[compile][autograd]") {
  for (int adam = 0; adam < 2; ++adam) {
    Tensor a = full({2}, 1.0).requires_grad_(), b = full({2}, 1.0).requires_grad_();
    std::unique_ptr<nn::Optimizer> opt;
    if (adam) opt = std::make_unique<nn::AdamW>(std::vector<Tensor>{a, b}, nn::AdamWOptions{.lr = 0.1, .weight_decay = 0});
    else opt = std::make_unique<nn::SGD>(std::vector<Tensor>{a, b}, nn::SGDOptions{.lr = 0.1});
    auto step = compile([&] { opt->step(); });
    a.set_grad(full({2}, 1.0));
    step();
    step();
    b.set_grad(full({2}, 1.0));  // b was skipped by the trace: it was not updated at all
    step();
    CHECK(vec(b)[0] == Approx(0.9));  // SGD: 1 - 0.1; AdamW's first step: 1 - lr
  }
  // AdamW's first call without any gradient recorded nothing: later calls replayed that.
  Tensor p = full({2}, 1.0).requires_grad_();
  nn::AdamW opt({p}, {.lr = 0.1, .weight_decay = 0});
  auto step = compile([&] { opt.step(); });
  step();
  p.set_grad(full({2}, 1.0));
  for (int i = 0; i < 3; ++i) step();
  CHECK(vec(p)[0] == Approx(0.7));
  CHECK(opt.step_count() == 3);
}

TEST_CASE("compile: a leaf made inside the function, its backward and its .grad returned",
          "[compile][autograd]") {
  auto cg = compile([](const Tensor& x) {
    Tensor w = x.clone().requires_grad_();
    (w * w).sum().backward();
    return w.grad();
  });
  Tensor x = full({2, 3}, 0.5);
  for (int call = 0; call < 3; ++call)  // replays raised "value used before it was computed"
    CHECK(vec(cg(x)) == std::vector<float>(6, 1.0f));
}

TEST_CASE("compile: a .grad the function reads is the leaf's .grad at each call, even when read "
          "before the leaf is used", "[compile][autograd]") {
  // Plain SGD reads g = p.grad() before p: g was taken as a fixed captured tensor, so a cleared
  // or replaced .grad kept the old one applied (while the caller held it).
  for (int variant = 0; variant < 2; ++variant) {
    Tensor p = tensor({1.0, 2.0}).requires_grad_();
    nn::SGD opt({p}, {.lr = 0.1});
    auto step = compile([&] { opt.step(); });
    Tensor g = full({2}, 1.0, {DType::Float64});
    p.set_grad(g);
    step();
    step();  // p = [0.8, 1.8]
    if (variant == 0) p.set_grad(Tensor());  // no gradient: p must not change
    else p.set_grad(full({2}, 10.0, {DType::Float64}));  // a new .grad tensor: p -= 1
    step();
    std::vector<double> want = variant == 0 ? std::vector<double>{0.8, 1.8}
                                            : std::vector<double>{-0.2, 0.8};
    std::vector<double> got = p.to_vector<double>();
    for (int i = 0; i < 2; ++i) CHECK(got[i] == Approx(want[i]));
  }
  // A function that branches on the .grad being defined.
  Tensor q = tensor({1.0f, 2.0f}).requires_grad_();
  auto f = compile([&](const Tensor& x) {
    Tensor g = q.grad();
    return g.defined() ? (x * g).sum() : x.sum() * -1.0;
  });
  q.set_grad(full({2}, 2.0));
  Tensor held = q.grad();
  CHECK(f(ones({2})).item<float>() == 4);
  CHECK(f(ones({2})).item<float>() == 4);
  q.set_grad(full({2}, 5.0));
  CHECK(f(ones({2})).item<float>() == 10);  // was 4
  q.set_grad(Tensor());
  CHECK(f(ones({2})).item<float>() == -2);  // was 4
}

TEST_CASE("compile: a view whose base was written in place after it was taken takes the "
          "base's new history, as in eager, on replays too", "[compile][autograd]") {
  auto body = [](const Tensor& v) { return (v * v).sum(); };
  auto g = compile(body);
  // y = 2x, then y[1:3] *= 3: early = y[2:4] = [6·x2, 2·x3] = [18, 8], sum(early²) = 388,
  // d/dx = [0, 0, 2·18·6, 2·8·2].
  auto run = [&](bool compiled) {
    Tensor x = tensor({1.0f, 2.0f, 3.0f, 4.0f}).requires_grad_();
    Tensor y = x * 2.0;
    Tensor early = y.slice(0, 2, 4);
    g(early);
    g(early);
    y.slice(0, 1, 3) *= 3.0;
    Tensor loss = compiled ? g(early) : body(early);
    CHECK(loss.item<float>() == 388.0f);
    loss.backward();
    CHECK(x.grad().to_vector<float>() == std::vector<float>{0, 0, 216, 32});
  };
  run(false);
  run(true);
  // A captured view: cv = c[0:2] with c = 2x, then c *= 3: sum(2·cv) = 36, d/dx = [12, 12, 0, 0].
  Tensor x = tensor({1.0f, 2.0f, 3.0f, 4.0f}).requires_grad_();
  Tensor c = x * 2.0;
  Tensor cv = c.slice(0, 0, 2);
  auto h = compile([&] { return (cv * 2.0).sum(); });
  h();
  h();
  c *= 3.0;
  Tensor loss = h();
  CHECK(loss.item<float>() == 36.0f);
  loss.backward();
  CHECK(x.grad().to_vector<float>() == std::vector<float>{12, 12, 0, 0});
}

TEST_CASE("compile: wide string views and pointers are guarded by their characters too",
          "[compile][host]") {
  auto f = compile([](const Tensor& x, std::wstring_view act) { return act == L"relu" ? relu(x) : -x; });
  Tensor x = full({2}, -1.0);
  std::wstring mode = L"relu";
  CHECK(vec(f(x, std::wstring_view(mode))) == std::vector<float>{0, 0});
  mode = L"negx";  // the same buffer, new characters: was replayed as relu
  CHECK(vec(f(x, std::wstring_view(mode))) == std::vector<float>{1, 1});
  auto g = compile([](const Tensor& y, const char16_t* act) { return act[0] == u'r' ? relu(y) : -y; });
  char16_t buf[5] = u"relu";
  CHECK(vec(g(x, buf)) == std::vector<float>{0, 0});
  buf[0] = u'n';
  CHECK(vec(g(x, buf)) == std::vector<float>{1, 1});
}

TEST_CASE("compile: a view of a strided argument stays a view on replays", "[compile][alias]") {
  // base[:, ::2].reshape(-1) is a view (stride 2) in eager and PyTorch; replays returned a copy,
  // so writes through the result no longer reached the argument.
  auto f = compile([](const Tensor& a) { return a.reshape({-1}); });
  for (int call = 0; call < 3; ++call) {
    Tensor base = arange(24, DType::Float32).view({4, 6});
    Tensor a = base.slice(1, 0, 6, 2);
    Tensor y = f(a);
    INFO("call " << call);
    CHECK(y.stride(0) == 2);
    CHECK(y.storage().get() == base.storage().get());
    CHECK(vec(y) == std::vector<float>{0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22});
    y.fill_(-1);
    CHECK(vec(base.select(0, 1)) == std::vector<float>{-1, 7, -1, 9, -1, 11});
  }
  // Strides a view cannot express still copy, as reshape does.
  auto g = compile([](const Tensor& a) { return a.reshape({-1}); });
  for (int call = 0; call < 3; ++call) {
    Tensor t = arange(6, DType::Float32).view({2, 3}).t();
    CHECK(vec(g(t)) == std::vector<float>{0, 3, 1, 4, 2, 5});
  }
}

TEST_CASE("compile: returning a view of a tensor the function made is cached", "[compile][alias]") {
  // The output's base (matmul's result) outlives the call through the view; it was taken for
  // host state, so every call traced again and the function ended up running eagerly.
  auto f = compile([](const Tensor& x, const Tensor& w) { return matmul(x, w).view({-1}); });
  auto g = compile([](const Tensor& x) { return (x * 2.0).t(); });
  Tensor w = tensor({{1.0f, 0.0f}, {0.0f, 2.0f}});
  for (int call = 0; call < 4; ++call) {
    Tensor x = tensor({{1.0f, 2.0f}, {3.0f, float(call)}});
    CHECK(vec(f(x, w)) == std::vector<float>{1, 4, 3, 2.0f * call});
    CHECK(vec(g(x)) == std::vector<float>{2, 6, 4, 2.0f * call});
  }
  CHECK(contains(f.explain(), "1 trace(s), 1 cache entry"));
  CHECK(contains(g.explain(), "1 trace(s), 1 cache entry"));
  CHECK_FALSE(contains(f.explain(), "not cached"));
}

TEST_CASE("compile: a tensor made from host data and returned is a new tensor on every call",
          "[compile][alias]") {
  // Review (a new user's trial): replays returned the trace's copy of `tensor({1, 2})` itself,
  // so a caller's in-place change showed up in every later call's results.
  auto made = compile([](const Tensor&) { return tensor({1.0f, 2.0f}); });
  auto made_and_used = compile([](const Tensor& x) {
    Tensor c = tensor({1.0f, 2.0f});
    return std::vector<Tensor>{c, x * c, c.view({2, 1})};
  });
  auto ramp = compile([](const Tensor& x) { return std::vector<Tensor>{arange(3, Float32), x}; });
  auto folded = compile([](const Tensor&) { return tensor({1.0f, 2.0f}) * 2.0f; });
  for (int call = 0; call < 4; ++call) {
    INFO("call " << call);
    Tensor r = made(zeros({1}));
    CHECK(vec(r) == std::vector<float>{1, 2});
    r.fill_(-1.0f);
    std::vector<Tensor> out = made_and_used(ones({2}));
    CHECK(vec(out[0]) == std::vector<float>{1, 2});
    CHECK(vec(out[1]) == std::vector<float>{1, 2});
    out[0].mul_(10.0f);  // the view returned with it shares its memory, as in eager
    CHECK(vec(out[2]) == std::vector<float>{10, 20});
    Tensor a = ramp(ones({1}))[0];
    CHECK(vec(a) == std::vector<float>{0, 1, 2});
    a.add_(5.0f);
    Tensor d = folded(ones({1}));
    CHECK(vec(d) == std::vector<float>{2, 4});
    d.fill_(0.0f);
  }
  CHECK(contains(made_and_used.explain(), "1 trace(s), 1 cache entry"));
}

TEST_CASE("compile: state that alternates between calls keeps one entry per state",
          "[compile][cache]") {
  // Found by a fresh-user trial: a failed guard on a captured tensor's .grad or requires_grad
  // replaced the entry, so gradient accumulation (the .grad undefined on the first micro-step,
  // defined on the second) and freeze/unfreeze traced on every call.
  auto run = [](bool compiled) {
    manual_seed(5);
    nn::Linear lin(4, 2);
    nn::SGD opt(lin.parameters(), {.lr = 0.1});
    auto micro = [&](const Tensor& x) {
      Tensor l = sum(lin(x) * lin(x));
      l.backward();
      return l.detach();
    };
    auto cmicro = compile(micro);
    for (int step = 0; step < 6; ++step) {
      for (int m = 0; m < 2; ++m) {
        Tensor x = full({3, 4}, 0.1 * (step + 1) + 0.05 * m);
        compiled ? cmicro(x) : micro(x);
      }
      opt.step();
      opt.zero_grad();
    }
    if (compiled) CHECK(cmicro.compile_count() == 2);
    return std::make_pair(vec(lin.weight), vec(lin.bias));
  };
  auto eager = run(false), compiled = run(true);
  for (size_t i = 0; i < eager.first.size(); ++i) CHECK(compiled.first[i] == Approx(eager.first[i]));
  for (size_t i = 0; i < eager.second.size(); ++i) CHECK(compiled.second[i] == Approx(eager.second[i]));

  // A captured weight frozen and unfrozen on alternate calls: two entries, then replays.
  Tensor w = ones({2, 3}).requires_grad_();
  auto f = compile([&](const Tensor& x) { return sum(matmul(x, w.t())); });
  for (int call = 0; call < 6; ++call) {
    w.requires_grad_(call % 2 == 0);
    Tensor y = f(ones({1, 3}) * double(call));
    CHECK(y.item<float>() == Approx(6.0 * call));
    CHECK(y.requires_grad() == (call % 2 == 0));
  }
  CHECK(f.compile_count() == 2);
  CHECK(contains(f.explain(), "2 cache entries"));
}

TEST_CASE("compile: a parameter written through another handle on its memory is cached",
          "[compile][alias]") {
  // The state_dict() entry is a detached alias of lin.weight (as in PyTorch); the step writes
  // through it. It used to re-trace every call ("a tensor it created outlives the call").
  auto run = [](bool compiled) {
    manual_seed(2);
    nn::Linear lin(3, 2);
    Tensor w = lin.state_dict()[0].second;  // "weight"
    Tensor b = lin.bias.detach();
    auto step = [&](const Tensor& x) {
      Tensor y = pow(lin.forward(x), 2).sum();
      lin.zero_grad();
      y.backward();
      NoGradGuard ng;
      w -= lin.weight.grad() * 0.1;
      b -= lin.bias.grad() * 0.1;
      return y.detach();
    };
    auto cstep = compile(step);
    std::vector<float> losses;
    for (int i = 0; i < 4; ++i) {
      Tensor x = arange(6, Float32).view({2, 3}) * (0.1 * (i + 1));
      losses.push_back((compiled ? cstep(x) : step(x)).item<float>());
    }
    if (compiled) CHECK(cstep.compile_count() == 1);
    CHECK(vec(w) == vec(lin.weight));  // the alias and the parameter are one memory
    return std::make_pair(losses, vec(lin.weight));
  };
  auto [eager_losses, eager_w] = run(false);
  auto [compiled_losses, compiled_w] = run(true);
  for (size_t i = 0; i < eager_losses.size(); ++i)
    CHECK(compiled_losses[i] == Approx(eager_losses[i]).epsilon(1e-6));
  for (size_t i = 0; i < eager_w.size(); ++i) CHECK(compiled_w[i] == Approx(eager_w[i]));
  CHECK(eager_losses[1] != eager_losses[0]);
}

namespace {
struct Batch {
  Tensor x, y;
};
}  // namespace

TEST_CASE("compile: std::optional<Tensor> arguments are guarded as tensors, and a struct's "
          "Tensor members the trace used by identity",
          "[compile][args]") {
  // Found by a review: replays used the first call's tensors (every call gave [2, 2, 2]).
  auto cf = compile([](const Tensor& x, const std::optional<Tensor>& b) {
    return b ? x + *b : x * 2.0;
  });
  Tensor b1 = full({3}, 10.0), b2 = full({3}, 20.0);
  std::optional<Tensor> seq[] = {std::nullopt, b1, std::nullopt, b2, std::nullopt, b1, b2};
  const float want[] = {2, 11, 2, 21, 2, 11, 21};
  for (int i = 0; i < 7; ++i) CHECK(vec(cf(ones({3}), seq[i])) == std::vector<float>(3, want[i]));
  CHECK(cf.compile_count() == 2);  // one trace with b, one without

  auto cg = compile([](const Batch& b) { return b.x * b.y; });
  std::vector<Batch> data{{full({2}, 1.0), full({2}, 1.0)}, {full({2}, 2.0), full({2}, 3.0)}};
  for (int pass = 0; pass < 2; ++pass) {
    CHECK(vec(cg(data[0])) == std::vector<float>{1, 1});
    CHECK(vec(cg(data[1])) == std::vector<float>{6, 6});  // was [1, 1]
  }
  Batch reused = data[0];
  CHECK(vec(cg(reused)) == std::vector<float>{1, 1});
  reused.y = full({2}, 5.0);  // a member assigned another tensor
  CHECK(vec(cg(reused)) == std::vector<float>{5, 5});
  CHECK(contains(cg.explain(), "holds another tensor"));
  CHECK(contains(cg.explain(), "arg 0: its 2 Tensor member(s) the function read are the traced"));
}

TEST_CASE("compile: functions taking Tensor& or a module by non-const reference compile, also "
          "with check=true; a uint64_t argument above INT64_MAX is guarded by value",
          "[compile][args]") {
  nn::Linear lin(3, 2);
  for (bool check : {false, true}) {
    CompileOptions o;
    o.check = check;
    auto cf = compile([](nn::Linear& m, const Tensor& x) { return m(x); }, o);
    Tensor x = ones({1, 3});
    for (int i = 0; i < 2; ++i) CHECK(vec(cf(lin, x)) == vec(lin(x)));
    auto scale = compile([](Tensor& t) { t.mul_(2.0); }, o);
    Tensor t = ones({2});
    scale(t);
    scale(t);
    CHECK(vec(t) == std::vector<float>{4, 4});
  }
  auto f = compile([](const Tensor& x, uint64_t k) { return x + double(k % 1000); });
  const uint64_t big = (uint64_t{1} << 63) + 5;  // 9223372036854775813
  CHECK(vec(f(ones({2}), big)) == std::vector<float>{814, 814});
  CHECK(vec(f(ones({2}), big + 1)) == std::vector<float>{815, 815});  // another value: retraced
  CHECK(vec(f(ones({2}), uint64_t{7})) == std::vector<float>{8, 8});
}

TEST_CASE("compile: a module passed by reference is guarded by identity", "[compile][args]") {
  // Found by a review: f(b, x) replayed the trace of f(a, x) with a's weights (a Sequential's
  // layers are reached through pointers, not held in its bytes).
  manual_seed(2);
  nn::Sequential a{std::make_shared<nn::Linear>(3, 2)}, b{std::make_shared<nn::Linear>(3, 2)};
  auto f = compile([](nn::Sequential& m, const Tensor& x) { return m(x).sum(); });
  Tensor x = randn({4, 3});
  for (int pass = 0; pass < 2; ++pass) {
    CHECK(f(a, x).item<float>() == Approx(a(x).sum().item<float>()));
    CHECK(f(b, x).item<float>() == Approx(b(x).sum().item<float>()));
  }
  CHECK(f.compile_count() == 2);
  CHECK(contains(f.explain(), "argument 0 is another object"));
}

TEST_CASE("compile: a result that is a transpose of a computed value has eager's strides on "
          "every call (compiled code and eager kernels alike)",
          "[compile][args]") {
  // Found by a review: compiled runs returned a contiguous copy, eager runs the view, and the
  // calls that time compiled code against eager kernels alternated, so `out.view({12})` passed
  // on some calls only.
  auto f = [](const Tensor& x) {
    return std::make_tuple(x * 2.0, (x + 1.0).t(), (x - 1.0).view({3, 2, 2}).permute({2, 0, 1}));
  };
  auto cf = compile(f);
  cf(ones({3, 4}));
  Tensor x = arange(12, Float32).view({4, 3}).t();  // [3, 4], strides [1, 3]
  for (int call = 0; call < 12; ++call) {
    auto [e0, e1, e2] = f(x);
    auto [c0, c1, c2] = cf(x);
    CHECK(c1.strides() == e1.strides());
    CHECK(c2.strides() == e2.strides());
    CHECK(vec(c1) == vec(e1));
    CHECK(vec(c2) == vec(e2));
    CHECK_THROWS_WITH(c1.view({12}), Catch::Contains("not compatible"));
  }
}

TEST_CASE("compile: results that are views of one computed value share its memory, as eager's",
          "[compile][args]") {
  // Found by a review: a slice / expand / view result was a copy of its own on compiled calls,
  // so an in-place write to one result missed the others (eager: they share memory).
  auto f = [](const Tensor& x) {
    Tensor y = x * 2.0 + 1.0;
    return std::make_tuple(y, y.slice(0, 1, 3), y.expand({2, 4}), y.view({2, 2}), y.unsqueeze(0));
  };
  auto cf = compile(f);
  for (int call = 0; call < 12; ++call) {
    INFO("call " << call);
    auto [y, part, wide, square, row] = cf(arange(4, Float32));
    auto [ey, epart, ewide, esquare, erow] = f(arange(4, Float32));
    CHECK(wide.strides() == ewide.strides());  // [0, 1]: expand does not copy
    CHECK(part.strides() == epart.strides());
    part.add_(100.0);
    CHECK(vec(y) == std::vector<float>{1, 103, 105, 7});
    CHECK(vec(wide) == std::vector<float>{1, 103, 105, 7, 1, 103, 105, 7});
    square.fill_(0.0);
    CHECK(vec(row) == std::vector<float>{0, 0, 0, 0});
  }
  CHECK(cf.compile_count() == 1);
}

TEST_CASE("compile: a function that takes a pointer to tensor memory runs eagerly",
          "[compile]") {
  // A replay runs the recorded ops only: a write or read through data<T>() would be skipped
  // (the write was lost and the read value frozen at the first call's).
  auto writes = compile([](const Tensor& x) {
    Tensor y = x * 2.0;
    y.data<float>()[0] = 100.f;
    return y + 1.0;
  });
  auto reads = compile([](const Tensor& x) {
    float s = static_cast<const float*>(x.raw_data())[1];
    return x * s;
  });
  for (int i = 1; i <= 3; ++i) {
    float v = static_cast<float>(i);
    CHECK(vec(writes(full({3}, v))) == std::vector<float>{101, 2 * v + 1, 2 * v + 1});
    CHECK(vec(reads(tensor({1.f, v, 0.f}))) == std::vector<float>{v, v * v, 0});
  }
  CHECK(contains(writes.explain(), "data<T>() or raw_data() at"));
  CHECK(contains(writes.explain(), "call_semantics_test.cpp"));
  // kiln's own kernels take pointers too: only the user's code counts.
  auto plain = compile([](const Tensor& x) { return x * 2.0 + 1.0; });
  for (int i = 0; i < 3; ++i) plain(ones({3}));
  CHECK(plain.compile_count() == 1);
  CHECK_FALSE(contains(plain.explain(), "eagerly"));
  auto full_graph = compile([](const Tensor& x) { return x * x.data<float>()[0]; },
                            {.fullgraph = true});
  try {
    full_graph(ones({2}));
    FAIL("expected an error");
  } catch (const Error& e) {
    CHECK(contains(e.what(), "fullgraph=true, but"));
    CHECK(contains(e.what(), "call_semantics_test.cpp"));
  }
}

TEST_CASE("compile: a kiln::Scalar argument is a host number: its value and kind are guarded",
          "[compile]") {
  auto f = [](const Tensor& x, Scalar s) { return x * s; };
  auto cf = compile(f);
  Tensor x = arange(3, {DType::Int32});
  for (Scalar s : {Scalar(2), Scalar(3), Scalar(2.5), Scalar(3)}) {
    Tensor e = f(x, s), c = cf(x, s);
    CHECK(c.dtype() == e.dtype());
    CHECK(equal(c, e));
  }
  CHECK(equal(cf(x, Scalar(3)), tensor({0, 3, 6}).to(DType::Int32)));
  CHECK(equal(cf(x, Scalar(2.5)), tensor({0.0, 2.5, 5.0}).to(DType::Float32)));
}

// Review: a captured tensor rebound before every call traced on every call, forever (each
// entry was dropped when its tensor was freed), and the recompile log grew by one line a call.
TEST_CASE("compile: entries dropped for a freed captured tensor count toward cache_size_limit",
          "[compile][options]") {
  Tensor w = full({4}, 1.0f);
  auto cf = compile([&](const Tensor& x) { return x * w; });
  const Tensor x = arange(4, DType::Float32);
  for (int i = 0; i < 20; ++i) {
    w = full({4}, static_cast<double>(i));
    CHECK(cf(x).to_vector<float>() == (x * static_cast<double>(i)).to_vector<float>());
  }
  CHECK(cf.compile_count() <= 8);
  CHECK_THAT(cf.explain(), Catch::Contains("cache limit reached") &&
                               Catch::Contains("a tensor the function captured was freed"));

  // With a large limit the log keeps the latest recompiles only.
  Tensor v = full({4}, 1.0f);
  auto many = compile([&](const Tensor& in) { return in + v; },
                      CompileOptions{.cache_size_limit = 1000});
  for (int i = 0; i < 100; ++i) {
    v = full({4}, static_cast<double>(i));
    CHECK(many(x).to_vector<float>() == (x + static_cast<double>(i)).to_vector<float>());
  }
  std::string log = many.explain();
  CHECK_THAT(log, Catch::Contains("earlier ones not kept") && Catch::Contains("trace #100:") &&
                      !Catch::Contains("trace #2:"));
}

TEST_CASE("compile: a captured tensor's guard that fails raises before the replay writes in "
          "place, so the retrace applies the function's writes once", "[compile][alias]") {
  NoGradGuard no_grad;
  Tensor w = ones({4});
  auto f = compile([&](Tensor x) {
    x.view({2, 2}).add_(1);  // a write through a view: the replay writes x itself
    return x * w;
  });
  Tensor x = zeros({4});
  f(x);
  f(x);
  CHECK(f.compile_count() == 1);
  CHECK(vec(x) == std::vector<float>(4, 2.f));
  w.requires_grad_(true);  // the guard of w fails: the call traces again
  CHECK(vec(f(x)) == std::vector<float>(4, 3.f));
  CHECK(vec(x) == std::vector<float>(4, 3.f));  // was 4: added in the replay and in the trace
  CHECK(f.compile_count() == 2);
  f(x);  // a replay of the second trace
  CHECK(vec(x) == std::vector<float>(4, 4.f));
  w = full({4}, 2.f);  // the captured tensor is freed: the entries that read it are dropped
  CHECK(vec(f(x)) == std::vector<float>(4, 10.f));
  CHECK(vec(x) == std::vector<float>(4, 5.f));
  CHECK(f.compile_count() == 3);
}

// Break-it pass: values guarded by == took -0.0 for 0.0 (x / v[0] replayed inf for -inf) and
// never matched a NaN (a trace per call until the cache limit).
TEST_CASE("compile: vectors and optionals of doubles are guarded as double arguments are",
          "[compile]") {
  Tensor x = ones({2});
  auto divide = [](const Tensor& t, const std::vector<double>& v) { return t / v[0]; };
  auto f = compile(divide);
  for (double d : {0.0, 0.0, -0.0, -0.0, 0.0}) {
    INFO("v[0] = " << d);
    CHECK(f(x, std::vector<double>{d}).to_vector<float>() ==
          divide(x, std::vector<double>{d}).to_vector<float>());
  }
  CHECK(f.compile_count() == 2);
  auto g = compile([](const Tensor& t, std::optional<double> s) { return t * s.value_or(1.0); });
  for (int i = 0; i < 4; ++i)
    CHECK(std::isnan(g(x, std::optional<double>(std::nan(""))).to_vector<float>()[0]));
  CHECK(g.compile_count() == 1);
  CHECK(g(x, std::nullopt).to_vector<float>() == std::vector<float>{1, 1});
  CHECK(g.compile_count() == 2);
}

// Break-it pass: a function that writes an argument and catches an op's error itself got that
// error from a replay (the replay raises before its write-backs; it now runs eagerly instead).
TEST_CASE("compile: a function that writes an argument and catches an op's error runs as eager",
          "[compile]") {
  auto step = [](Tensor x, const Tensor& idx) {
    x.add_(1.0);
    try {
      return index_select(x, 0, idx) * 2.0;
    } catch (const Error&) {
      return zeros({2});
    }
  };
  auto f = compile(step);
  const Tensor good = from_vector<int64_t>({0, 1}, {2}), bad = from_vector<int64_t>({0, 7}, {2});
  Tensor x = ones({3}), xe = ones({3});
  for (int i = 0; i < 2; ++i) CHECK(equal(f(x, good), step(xe, good)));
  CHECK(equal(f(x, bad), step(xe, bad)));  // raised the caught error on replay before
  CHECK(x.to_vector<float>() == xe.to_vector<float>());
  CHECK(equal(f(x, good), step(xe, good)));
  CHECK(x.to_vector<float>() == std::vector<float>{5, 5, 5});
}

TEST_CASE("compile: a replay that raises where eager does not runs eagerly from then on, saying "
          "why", "[compile]") {
  // Such an error is no check of values (eager makes those too) but a fault of the replay: one
  // (a .grad guard on a value the replay had not computed yet) ran every call eagerly without
  // a word.
  auto fn = [](const Tensor& x) { return (x * 2.0 + 1.0).exp(); };
  auto f = compile(fn, CompileOptions{}, "faulty_replay");
  Tensor x = tensor({0.5f, -1.f, 2.f});
  f(x);  // traced
  std::vector<float> got;
  {
    codegen::inject_fault_for_testing(codegen::InjectedFault::RunError);
    got = f(x).to_vector<float>();
    codegen::inject_fault_for_testing(codegen::InjectedFault::None);
  }
  CHECK(got == fn(x).to_vector<float>());  // the call's own eager run
  const std::string e = f.explain();
  CHECK(contains(e, "runs eagerly from now on"));
  CHECK(contains(e, "a replay raised where eager did not"));
  CHECK(contains(e, "injected fault"));
  CHECK(f(x).to_vector<float>() == fn(x).to_vector<float>());

  // Not when eager raised too and the function caught it (a break-it pass: that call made the
  // function eager for good, named a kiln bug).
  auto guarded = [](const Tensor& v, const Tensor& idx) {
    Tensor y = v * 2.0;
    try {
      return index_select(y, 0, idx) + 1.0;
    } catch (const Error&) {
      return y - 1.0;
    }
  };
  auto g = compile(guarded, CompileOptions{}, "catches_index");
  Tensor v = arange(3, DType::Float32), good = tensor({int64_t{1}}), bad = tensor({int64_t{5}});
  CHECK(g(v, good).to_vector<float>() == std::vector<float>{3});
  CHECK(g(v, bad).to_vector<float>() == std::vector<float>{-1, 1, 3});  // caught, as eager
  for (int call = 0; call < 2; ++call) CHECK(g(v, good).to_vector<float>() == std::vector<float>{3});
  CHECK(!contains(g.explain(), "runs eagerly from now on"));
  CHECK(contains(g.explain(), "2 replay(s)"));
}

TEST_CASE("compile: whether an argument that requires grad is a leaf is guarded", "[compile]") {
  // A break-it pass: x.is_leaf() read inside replayed the leaf's branch for a non-leaf.
  auto fn = [](const Tensor& x) { return x.is_leaf() ? x * 2.0 + 1.0 : x * 3.0 + 1.0; };
  auto f = compile(fn);
  Tensor leaf = ones({2}).requires_grad_();
  for (int call = 0; call < 3; ++call) {
    INFO("call " << call);
    CHECK(f(leaf).to_vector<float>() == std::vector<float>{3, 3});
    CHECK(f(leaf * 1.0).to_vector<float>() == std::vector<float>{4, 4});
  }
  CHECK(contains(f.explain(), "not a leaf"));
}
