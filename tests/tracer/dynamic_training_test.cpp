// Automatic dynamic shapes for whole training steps: host numbers computed from sizes (a mean's
// 1/n, mse_loss's 2/n), tensors made inside the function (zeros, ones, arange, a backward's
// seed), dropout's generator offsets, and sizes that are products of two changing sizes. Each
// case runs the same function eagerly and compiled at several sizes and compares the values.
#include <catch2/catch.hpp>

#include <cmath>

#include "kiln/kiln.h"
#include "tracer/util.h"

using namespace kiln;
using kiln::testing::contains;
using kiln::testing::max_diff;
using kiln::testing::vec;

namespace {

Tensor ramp(int64_t rows, int64_t cols, double scale) {
  return sin(arange(rows * cols, Float32).view({rows, cols}) * scale);
}

}  // namespace

TEST_CASE("compile: a host value equal to a size, or a number over it, follows the size",
          "[compile][dynamic]") {
  auto times_n = compile([](const Tensor& x) { return x * static_cast<double>(x.size(0)); });
  auto two_over_n = compile([](const Tensor& x) { return x * (2.0 / double(x.size(0) * 3)); });
  for (int64_t n : {2, 3, 4, 7, 3}) {
    CHECK(vec(times_n(ones({n}))) == std::vector<float>(n, float(n)));
    CHECK(vec(two_over_n(ones({n}))) == std::vector<float>(n, float(2.0 / double(n * 3))));
  }
  INFO(times_n.explain() << two_over_n.explain());
  CHECK(times_n.compile_count() == 2);
  CHECK(two_over_n.compile_count() == 2);
}

TEST_CASE("compile: a size-derived guess that a later size contradicts traces again",
          "[compile][dynamic]") {
  // 6 and 9 look like "the size"; 10 gives 9, which the symbolic trace would get wrong.
  auto cf = compile([](const Tensor& x) { return x * static_cast<double>(x.size(0) / 3 * 3); });
  for (int64_t n : {6, 9, 10, 12})
    CHECK(vec(cf(ones({n}))) == std::vector<float>(n, float(n / 3 * 3)));
  INFO(cf.explain());
  CHECK(cf.compile_count() == 3);
  CHECK(contains(cf.explain(), "does not follow the size it followed in the symbolic trace"));
}

TEST_CASE("compile: zeros, ones and arange made inside the function follow the sizes",
          "[compile][dynamic]") {
  auto f = [](const Tensor& x) {
    int64_t n = x.size(0);
    Tensor pos = arange(n, Int64).to(Float32).unsqueeze(1);  // 0, 1, ..., n-1
    Tensor odd = arange(1, 2 * n, 2, {Int64}).to(Float32).unsqueeze(1);  // 1, 3, ..., 2n-1
    return x * ones({n, 3}) + pos + odd * 10.0 + zeros({n, 3});
  };
  auto cf = compile(f);
  for (int64_t n : {4, 6, 9, 5}) {
    Tensor x = ramp(n, 3, 0.3);
    Tensor want = f(x), got = cf(x);
    REQUIRE(got.shape() == Shape{n, 3});
    CHECK(vec(got) == vec(want));
    // Row i is x + i + 10 (2i + 1): spot-check the last row against the formula.
    CHECK(vec(got)[3 * (n - 1)] == Approx(vec(x)[3 * (n - 1)] + (n - 1) + 10.0 * (2 * n - 1)));
  }
  INFO(cf.explain());
  CHECK(cf.compile_count() == 2);
}

TEST_CASE("compile: dropout at changing sizes draws eager's masks and leaves the generator "
          "where eager does",
          "[compile][dynamic]") {
  auto f = [](const Tensor& x) { return dropout(x, 0.5) + dropout(x * 2.0, 0.25).sum({1}, true); };
  auto cf = compile(f);
  for (int64_t n : {8, 16, 13, 24, 5}) {
    Tensor x = ramp(n, 6, 0.1) + 2.0;
    manual_seed(n);
    Tensor want = f(x);
    Tensor next_eager = rand({4});
    manual_seed(n);
    Tensor got = cf(x);
    Tensor next_compiled = rand({4});
    // The same masks; the compiled sum may round differently (replays at new sizes after the
    // shape-only runs: a confirming trace returned eager's values).
    CHECK(max_diff(got, want, 1e-3) < 1e-6);
    CHECK(vec(next_compiled) == vec(next_eager));
  }
  INFO(cf.explain());
  CHECK(cf.compile_count() == 2);
}

TEST_CASE("compile: a reshape to batch * length follows both sizes", "[compile][dynamic]") {
  auto f = [](const Tensor& x) {
    int64_t b = x.size(0), t = x.size(1);
    return (x.reshape({b * t, 4}) * 2.0).sum({1}).mean();
  };
  auto cf = compile(f);
  for (auto [b, t] : std::vector<std::pair<int64_t, int64_t>>{
           {4, 16}, {4, 24}, {3, 24}, {3, 8}, {5, 10}, {2, 7}, {6, 12}}) {
    Tensor x = ramp(b * t, 4, 0.01).view({b, t, 4});
    CHECK(max_diff(cf(x), f(x), 1e-3) < 1e-6);
  }
  INFO(cf.explain());
  // Sizes (4,16) then a new length, then a new batch: both dims symbolic from the fourth
  // trace on; later sizes replay it.
  CHECK(cf.compile_count() <= 4);
}

TEST_CASE("compile: an MLP training step with mse_loss compiles twice over many batch sizes",
          "[compile][dynamic]") {
  auto run = [](bool compiled) {
    manual_seed(3);
    auto model = std::make_shared<nn::Sequential>();
    model->push_back(std::make_shared<nn::Linear>(5, 8));
    model->push_back(std::make_shared<nn::ReLU>());
    model->push_back(std::make_shared<nn::Linear>(8, 2));
    nn::SGD opt(model->parameters(), {.lr = 0.05});
    auto step = [&](const Tensor& x, const Tensor& y) {
      opt.zero_grad();
      Tensor loss = mse_loss(model->forward(x), y);
      loss.backward();
      opt.step();
      return loss.detach();
    };
    auto cstep = compile(step);
    std::vector<double> losses;
    for (int64_t b : {8, 16, 24, 40, 12, 8, 33}) {
      Tensor x = ramp(b, 5, 0.7), y = ramp(b, 2, 0.3);
      losses.push_back((compiled ? cstep(x, y) : step(x, y)).item<double>());
    }
    if (compiled) {
      INFO(cstep.explain());
      CHECK(cstep.compile_count() == 2);
    }
    return std::make_pair(losses, vec(model->parameters()[0]));
  };
  auto [eager_losses, eager_w] = run(false);
  auto [compiled_losses, compiled_w] = run(true);
  for (size_t i = 0; i < eager_losses.size(); ++i)
    CHECK(compiled_losses[i] == Approx(eager_losses[i]).epsilon(1e-5));
  for (size_t i = 0; i < eager_w.size(); ++i)
    CHECK(compiled_w[i] == Approx(eager_w[i]).epsilon(1e-5).margin(1e-7));
}

TEST_CASE("compile: a language-model step (positions, dropout, attention) compiles twice over "
          "many sequence lengths",
          "[compile][dynamic]") {
  constexpr int64_t kVocab = 17, kDim = 8;
  auto run = [](bool compiled) {
    manual_seed(5);
    nn::Embedding tok(kVocab, kDim), pos(32, kDim);
    nn::TransformerEncoderLayer layer({.d_model = kDim, .nhead = 2, .dim_feedforward = 16,
                                       .dropout = 0.2, .batch_first = true});
    nn::Linear head(kDim, kVocab);
    std::vector<Tensor> params;
    for (nn::Module* m : std::initializer_list<nn::Module*>{&tok, &pos, &layer, &head})
      for (const Tensor& p : m->parameters()) params.push_back(p);
    nn::AdamW opt(params, {.lr = 1e-2});
    auto step = [&](const Tensor& x, const Tensor& y) {
      opt.zero_grad();
      int64_t b = x.size(0), t = x.size(1);
      Tensor h = tok(x) + pos(arange(t, Int64));
      h = layer.forward(h, nn::causal_mask(t), Tensor());
      Tensor loss = cross_entropy(head(h).reshape({b * t, kVocab}), y.reshape({b * t}));
      loss.backward();
      opt.step();
      return loss.detach();
    };
    auto cstep = compile(step);
    std::vector<double> losses;
    int s = 0;
    for (int64_t t : {6, 9, 12, 7, 16, 10, 6}) {
      Tensor x = remainder(arange(3 * t, Int64) * 5 + s, kVocab).view({3, t});
      Tensor y = remainder(x * 3 + 1, kVocab);
      manual_seed(100 + s++);
      losses.push_back((compiled ? cstep(x, y) : step(x, y)).item<double>());
    }
    if (compiled) {
      INFO(cstep.explain());
      CHECK(cstep.compile_count() == 2);
    }
    return losses;
  };
  std::vector<double> eager = run(false), compiled = run(true);
  REQUIRE(eager.size() == compiled.size());
  for (size_t i = 0; i < eager.size(); ++i) CHECK(compiled[i] == Approx(eager[i]).epsilon(1e-5));
  CHECK(eager.back() < eager.front());  // it trains
}

TEST_CASE("compile: a tensor made from host data that changes with the size, or a fill value "
          "computed from it, keeps one specialisation per size",
          "[compile][dynamic]") {
  auto from_host = compile([](const Tensor& x) {
    int64_t n = x.size(0);
    return x + from_vector(std::vector<float>(n, float(n)), {n});
  });
  auto filled =
      compile([](const Tensor& x) { return x + full({x.size(0)}, double(x.size(0) + 1)); });
  for (int64_t n : {3, 5, 7, 5}) {
    CHECK(vec(from_host(ones({n}))) == std::vector<float>(n, float(n + 1)));
    CHECK(vec(filled(ones({n}))) == std::vector<float>(n, float(n + 2)));
  }
  INFO(from_host.explain() << filled.explain());
  CHECK(from_host.compile_count() == 3);
  CHECK(filled.compile_count() == 3);
  CHECK(contains(from_host.explain(), "is neither an arange of whole numbers nor overwritten by "
                                      "fill_/copy_"));
}

TEST_CASE("compile: zeros/ones inside the function with a dim that stays fixed in two traces "
          "but not in general",
          "[compile][dynamic]") {
  // min(n, 4) is 4 for n = 5 and 6; the tensor is allocated from the symbolic trace's shape,
  // so a size set where it is 3 must not replay that trace.
  auto f = [](const Tensor& x) {
    int64_t n = x.size(0);
    return (x + ones({n, std::min<int64_t>(n, 4)})).sum({1});
  };
  auto cf = compile(f);
  for (int64_t n : {5, 6, 3, 3, 7, 3}) {
    Tensor got = cf(ones({n, 1}));
    REQUIRE(got.shape() == Shape{n});
    CHECK(vec(got) == std::vector<float>(n, 2.0f * float(std::min<int64_t>(n, 4))));
  }
}

TEST_CASE("compile: eye() inside the function keeps its diagonal on replays and follows sizes",
          "[compile][dynamic]") {
  auto cf = compile([](const Tensor& x) { return x + eye(x.size(0)) * 5.0; });
  for (int64_t n : {3, 3, 4, 6, 4}) {
    std::vector<float> got = vec(cf(zeros({n, n})));
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < n; ++j) CHECK(got[i * n + j] == (i == j ? 5.0f : 0.0f));
  }
  CHECK(cf.compile_count() == 2);
}

TEST_CASE("compile: a branch traced at one size of a marked dynamic dim is confirmed at others",
          "[compile][dynamic]") {
  auto f = [](const Tensor& x) {
    if ((x.sum() > 0.0).item<bool>()) return x * 3.0;
    return x * static_cast<double>(x.size(0));
  };
  auto cf = compile(f, CompileOptions{}.mark_dynamic(0, 0));
  for (int64_t n : {4, 4, 6, 6, 6, 9, 9}) {
    for (double sign : {1.0, -1.0}) {
      Tensor x = ones({n}) * sign;
      CHECK(vec(cf(x)) == vec(f(x)));
    }
  }
}

TEST_CASE("compile: the sizes a symbolic entry was traced at replay without another trace",
          "[compile][dynamic]") {
  int runs = 0;  // calls of the function body: traces, not replays
  auto cf = compile([&](const Tensor& x) {
    ++runs;
    return x * 2.0;
  });
  for (int64_t n : {4, 8, 8, 8}) CHECK(vec(cf(ones({n}))) == std::vector<float>(n, 2.0f));
  CHECK(runs == 2);  // 4: first trace; 8: the symbolic trace, then replays
  cf(ones({16}));    // a new size set: one confirming trace
  cf(ones({16}));
  CHECK(runs == 3);
}

TEST_CASE("compile: var's and std's N - correction in their backward follow the batch size",
          "[compile][dynamic]") {
  // The backward holds 2 / (N - 1) (var) and N - 1 (std) as host numbers: an affine function of
  // the size, and a number over one.
  Tensor w = (arange(4, Float32) * 0.25 + 0.5).requires_grad_();
  auto f = [&](const Tensor& x) {
    Tensor h = x * w;
    Tensor loss = var(h, {0}).sum() + kiln::std(h, {0}, 2).sum() + var(h) * 0.5;
    w.set_grad(Tensor());
    loss.backward();
    return w.grad().clone();
  };
  auto cf = compile(f);
  for (int64_t n : {5, 8, 11, 6, 17}) {
    Tensor x = ramp(n, 4, 0.37);
    CHECK(max_diff(cf(x), f(x), 1e-3) < 1e-5);
  }
  INFO(cf.explain());
  CHECK(cf.compile_count() == 2);
}

TEST_CASE("compile: a mark_dynamic entry that a size refutes is generalised from the third trace",
          "[compile][dynamic]") {
  // mark_dynamic guesses from one trace; the mean's count in the backward is not a marked size,
  // so the first new size refutes it and the traces are then compared as after a size change.
  Tensor w = ones({3}).requires_grad_();
  auto f = [&](const Tensor& x) {
    w.set_grad(Tensor());
    mean(x * w).backward();
    return w.grad().clone();
  };
  auto cf = compile(f, CompileOptions{}.mark_dynamic(0, 0));
  for (int64_t n = 4; n <= 13; ++n) {
    Tensor x = ramp(n, 3, 0.5);
    // From n = 6 on a replay (the generalised entry replaced the guessed one), whose sums
    // round otherwise than eager's.
    CHECK(max_diff(cf(x), f(x), 1e-3) < 1e-5);
  }
  INFO(cf.explain());
  CHECK(cf.compile_count() == 2);
  CHECK(cf.cache_entries() == 1);
  CHECK(contains(cf.explain(), "replaces specialisation #0"));
}

TEST_CASE("compile: a branch first taken at new sizes of a marked dynamic dim replays its "
          "prefix at those sizes",
          "[compile][dynamic]") {
  auto f = [](const Tensor& x) {
    Tensor y = x * static_cast<double>(x.size(0));
    if ((y.sum() > 0.0).item<bool>()) return y;
    return y - 1.0;
  };
  for (Dynamic mode : {Dynamic::Auto, Dynamic::Always}) {
    CompileOptions o;
    o.dynamic = mode;
    if (mode == Dynamic::Auto) o.mark_dynamic(0, 0);
    auto cf = compile(f, o);
    for (auto [n, sign] : std::vector<std::pair<int64_t, double>>{
             {4, 1}, {6, -1}, {6, -1}, {6, 1}, {4, -1}, {9, -1}, {9, -1}}) {
      Tensor x = full({n}, sign);
      CHECK(vec(cf(x)) == vec(f(x)));
    }
  }
}

TEST_CASE("compile: dims that change one at a time, with a traced backward",
          "[compile][dynamic]") {
  auto cf = compile([](const Tensor& x) { return softmax(x, 1) * layer_norm(x, {x.size(1)}); });
  auto f = [](const Tensor& x) { return softmax(x, 1) * layer_norm(x, {x.size(1)}); };
  for (Shape s : {Shape{4, 5}, Shape{6, 5}, Shape{6, 7}, Shape{8, 7}, Shape{8, 7}, Shape{8, 9},
                  Shape{6, 7}, Shape{10, 11}}) {
    Tensor a = sin(arange(numel(s), Float32).view(s)).requires_grad_();
    Tensor b = sin(arange(numel(s), Float32).view(s)).requires_grad_();
    Tensor ya = cf(a), yb = f(b);
    (ya * ya).sum().backward();
    (yb * yb).sum().backward();
    CHECK(max_diff(ya, yb, 1e-3) < 1e-5);
    CHECK(max_diff(a.grad(), b.grad(), 1e-3) < 1e-4);
  }
  INFO(cf.explain());
  CHECK(cf.compile_count() <= 4);
}

TEST_CASE("compile: a marked dim traced at size 1 that broadcasts stays specialised",
          "[compile][dynamic]") {
  auto f = [](const Tensor& x, const Tensor& y) { return (x * y).sum({1}); };
  auto cf = compile(f, CompileOptions{}.mark_dynamic(0, 1).mark_dynamic(1, 1));
  for (auto [xc, yc] : std::vector<std::pair<int64_t, int64_t>>{
           {1, 6}, {1, 6}, {4, 4}, {1, 4}, {5, 5}, {1, 5}, {3, 3}}) {
    Tensor x = arange(3 * xc, Float32).view({3, xc}) + 1.0;
    Tensor y = arange(3 * yc, Float32).view({3, yc}) + 1.0;
    CHECK(vec(cf(x, y)) == vec(f(x, y)));
  }
  // Dynamic::Always leaves size-1 dims specialised, as automatic dynamic does: a [3, 1]
  // argument replays instead of tracing on every call.
  CompileOptions always;
  always.dynamic = Dynamic::Always;
  auto twice = compile([](const Tensor& x) { return x * 2.0; }, always);
  for (int i = 0; i < 5; ++i) CHECK(vec(twice(ones({3, 1}))) == std::vector<float>(3, 2.0f));
  CHECK(twice.compile_count() == 1);
  // Host scalars become symbolic under Always as under Auto (review: Always kept one entry per
  // value, and ran eagerly after 8 values, where Auto had 2 traces).
  auto scaled = compile([](const Tensor& x, double s) { return x * s; }, always);
  for (int i = 0; i < 10; ++i)
    CHECK(vec(scaled(ones({4, 3}), 1.0 + i)) == std::vector<float>(12, float(1.0 + i)));
  CHECK(scaled.compile_count() == 2);  // the first value's entry, then the symbolic one
  CHECK(scaled.cache_entries() == 2);
  CHECK_FALSE(contains(scaled.explain(), "runs eagerly"));
}

namespace {

// A language-model step that shifts its targets inside (x[:, :T-1], x[:, 1:]) and reshapes to
// B * (T - 1), run at `sizes` ((batch, length)) eagerly or compiled: the losses, and the
// compiled function's compile count.
using Sizes = std::vector<std::pair<int64_t, int64_t>>;

std::pair<std::vector<double>, int> lm_step_losses(bool compiled, const Sizes& sizes) {
  constexpr int64_t kVocab = 11, kDim = 6;
  manual_seed(7);
  nn::Embedding tok(kVocab, kDim);
  nn::Linear head(kDim, kVocab);
  std::vector<Tensor> params = tok.parameters();
  for (const Tensor& p : head.parameters()) params.push_back(p);
  nn::SGD opt(params, {.lr = 0.1});
  auto step = [&](const Tensor& seq) {
    opt.zero_grad();
    int64_t b = seq.size(0), t = seq.size(1);
    Tensor inp = seq.slice(1, 0, t - 1), tgt = seq.slice(1, 1, t);
    Tensor logits = head(tok(inp));
    Tensor loss = cross_entropy(logits.reshape({b * (t - 1), kVocab}), tgt.reshape({-1}));
    loss.backward();
    opt.step();
    return loss.detach();
  };
  auto cstep = compile(step);
  std::vector<double> losses;
  for (auto [b, t] : sizes) {
    Tensor seq = remainder(arange(b * t, Int64) * 7 + t, kVocab).view({b, t});
    losses.push_back((compiled ? cstep(seq) : step(seq)).item<double>());
  }
  if (compiled) UNSCOPED_INFO(cstep.explain());
  return {losses, cstep.compile_count()};
}

void check_lm_step(const Sizes& sizes) {
  auto [eager, unused] = lm_step_losses(false, sizes);
  auto [compiled, compiles] = lm_step_losses(true, sizes);
  CHECK(compiles == 2);
  for (size_t i = 0; i < eager.size(); ++i) CHECK(compiled[i] == Approx(eager[i]).epsilon(1e-5));
}

}  // namespace

TEST_CASE("compile: a language-model step that shifts its targets inside (x[:, :T-1], x[:, 1:]) "
          "compiles twice",
          "[compile][dynamic]") {
  check_lm_step({{4, 6}, {4, 9}, {4, 12}, {4, 7}, {4, 16}, {4, 9}});
}

TEST_CASE("compile: batch and length changing together: the shifted slice follows the length "
          "(not a formula of the batch that two traces also fit)",
          "[compile][dynamic]") {
  // From (3, 3) to (2, 5) the slice's length 2 -> 4 fits both T - 1 and -2 * B + 8; earlier
  // traces and the simpler formula pick T - 1. (The earlier guess refuted every later size and
  // the function ran eagerly after 8 compiles.)
  auto f = compile([](const Tensor& x) { return x.slice(1, 1, x.size(1)) * 2.0; });
  const int64_t sizes[][2] = {{2, 3}, {3, 3}, {2, 5}, {3, 5}, {2, 9}, {3, 9}, {2, 4}, {4, 6}};
  for (auto [b, t] : sizes) {
    Tensor x = ramp(b, t, 0.3);
    CHECK(max_diff(f(x), x.slice(1, 1, t) * 2.0, 1e-3) == 0.0);
  }
  INFO(f.explain());
  CHECK(f.compile_count() == 3);
  CHECK_FALSE(contains(f.explain(), "runs eagerly"));
}

TEST_CASE("compile: a language-model step with batch and length both changing reshapes to "
          "B * (T - 1) and compiles twice",
          "[compile][dynamic]") {
  check_lm_step({{2, 9}, {3, 12}, {4, 5}, {2, 17}, {3, 8}, {4, 10}, {2, 6}});
}

TEST_CASE("compile: a function with a data-dependent branch becomes symbolic per path when "
          "sizes change (was a static entry per size until the cache limit)",
          "[compile][dynamic]") {
  int runs = 0;  // runs of the body: traces, not replays
  auto body = [&](const Tensor& x) {
    ++runs;
    Tensor y = x * static_cast<double>(x.size(0));
    if ((y.sum() > 0.0).item<bool>()) return y * 2.0;
    return y - 1.0;
  };
  auto cf = compile(body);
  int calls = 0;
  for (int pass = 0; pass < 3; ++pass)
    for (int64_t n : {4, 5, 6, 7, 8, 9, 10, 11, 12, 13})
      for (double sign : {1.0, -1.0}) {
        Tensor x = full({n}, sign);
        std::vector<float> want(n, sign > 0 ? float(2 * n) : float(-n - 1));
        CHECK(cf(x).to_vector<float>() == want);
        ++calls;
      }
  INFO(cf.explain());
  // Both paths traced at 4, then each made symbolic from its trace at 5 (4 compiles); each new
  // size of a path is confirmed by one trace, then replays.
  CHECK(cf.compile_count() == 4);
  CHECK(runs == 20);
  CHECK(calls == 60);
  CHECK_FALSE(contains(cf.explain(), "runs eagerly"));
}

TEST_CASE("compile: a mark_dynamic dim first traced at size 1 settles (a host value equal to "
          "the size)",
          "[compile][dynamic]") {
  // Found by a review: each size was compared with the size-1 trace, which generalize() cannot
  // use, so every size compiled until the cache limit.
  CompileOptions o;
  o.mark_dynamic(0, 0);
  auto f = [](const Tensor& x) { return x.sum(0) + double(x.size(0)); };
  auto cf = compile(f, o);
  for (int64_t n : {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 3}) {
    Tensor x = ramp(n, 2, 0.1);
    CHECK(max_diff(cf(x), f(x), 1e-3) < 1e-6);
  }
  INFO(cf.explain());
  CHECK(cf.compile_count() == 3);  // size 1; size 2 (marked); size 3 compared with size 2
  CHECK_FALSE(contains(cf.explain(), "runs eagerly"));
}

TEST_CASE("automatic dynamic: a new size is compared with every earlier entry until one fits",
          "[compile][dynamic]") {
  // Found by a review: the entry compared with was the one whose sizes differed most, even
  // when it differed in state the size guards do not see, and every new size got an entry of
  // its own up to the cache limit (8 compiles each, then eager).
  SECTION("gradient accumulation: .grad undefined on the first micro-batch, defined after") {
    manual_seed(1);
    nn::Linear lin(4, 3);
    auto micro = compile([&](const Tensor& x) {
      Tensor l = lin(x).sum();
      l.backward();
      return l.detach();
    });
    for (int s = 0; s < 6; ++s) {
      lin.zero_grad();
      for (int j = 0; j < 2; ++j) micro(randn({5 + 3 * s + j, 4}));
    }
    CHECK(micro.compile_count() == 4);  // two states, each static then symbolic
  }
  SECTION("a layer frozen and unfrozen") {
    nn::Linear a(4, 4), b(4, 3);
    auto cf = compile([&](const Tensor& x) { return b(a(x)).sum(); });
    int step = 0;
    for (auto [m, n] : {std::pair{4, 6}, {4, 9}, {4, 12}, {4, 8}, {4, 10}, {4, 11}, {2, 15},
                        {2, 7}, {3, 5}, {5, 5}}) {
      if (step == 3) a.weight.requires_grad_(false);
      if (step == 5) a.weight.requires_grad_(true);
      ++step;
      Tensor x = randn({m, n, 4});
      CHECK(cf(x).item<float>() == Approx(b(a(x)).sum().item<float>()).epsilon(1e-5));
    }
    CHECK(cf.compile_count() == 5);
  }
  SECTION("a batch of size 1 among others") {
    auto f = compile([](const Tensor& x) { return (x * 2.0).sum(); });
    for (auto [b, t] : {std::pair{4, 8}, {4, 11}, {1, 9}, {3, 13}, {2, 5}})
      CHECK(f(ones({b, t})).item<float>() == 2.0f * static_cast<float>(b * t));
    CHECK(f.compile_count() == 4);  // size 1 is specialised; the rest share one entry
  }
}

TEST_CASE("automatic dynamic: a float arange of the batch size becomes symbolic", "[compile]") {
  // Found by review: arange(n, Float32) specialised every size ("neither an arange"), while
  // the int64 arange became symbolic.
  auto f = compile([](const Tensor& x) { return x * arange(x.size(0), Float32).unsqueeze(1); });
  for (int64_t n : {8, 16, 10, 12}) {
    Tensor x = ramp(n, 3, 0.5);
    CHECK(max_diff(f(x), x * arange(n, Float32).unsqueeze(1), 1e-3) == 0);
  }
  CHECK(f.compile_count() == 2);
  // linspace's values are not whole numbers: specialised, and the reason names the line.
  auto g = compile([](const Tensor& x) { return x * linspace(0.0, 1.0, x.size(0)).unsqueeze(1); });
  for (int64_t n : {8, 16}) g(ramp(n, 3, 0.5));
  CHECK(contains(g.explain(), "read first by unsqueeze at "));
  CHECK(contains(g.explain(), "dynamic_training_test.cpp"));
}

TEST_CASE("automatic dynamic: a training step on the first half of the batch settles",
          "[compile]") {
  // x[:n / 2] -> Linear -> mse_loss / mean: the backwards' 2 / count and 1 / count have the
  // count (n / 2) * 2, a multiple of a division (break-it pass: each size was traced to the
  // cache limit, then the step ran eagerly).
  for (int variant = 0; variant < 2; ++variant) {
    INFO("variant " << variant);
    auto run = [&](bool compiled) {
      manual_seed(3);
      nn::Linear lin(4, 2);
      nn::SGD opt({lin.weight, lin.bias}, {.lr = 0.05});
      auto body = [&](const Tensor& x, const Tensor& y) {
        const int64_t half = x.size(0) / 2;
        opt.zero_grad();
        Tensor out = lin.forward(x.slice(0, 0, half));
        Tensor loss = variant == 0 ? mse_loss(out, y.slice(0, 0, half)) : out.mean();
        loss.backward();
        opt.step();
        return loss.detach();
      };
      auto step = compile(body);
      std::vector<float> losses;
      for (int64_t n = 4; n <= 30; ++n) {
        Tensor x = ramp(n, 4, 0.3), y = ramp(n, 2, 0.7);
        losses.push_back((compiled ? step(x, y) : body(x, y)).item<float>());
      }
      if (compiled) {
        INFO(step.explain());
        CHECK(step.compile_count() == 3);
      }
      return std::make_pair(losses, vec(lin.weight));
    };
    auto [eager_losses, eager_weight] = run(false);
    auto [losses, weight] = run(true);
    for (size_t i = 0; i < losses.size(); ++i)
      CHECK(std::abs(losses[i] - eager_losses[i]) <= 1e-5f * std::max(1.0f, std::abs(losses[i])));
    for (size_t i = 0; i < weight.size(); ++i)
      CHECK(std::abs(weight[i] - eager_weight[i]) < 1e-5f);
  }
}

TEST_CASE("automatic dynamic: sizes follow a host integer argument from 2 on", "[compile]") {
  // A slice bound passed by value (as torch.compile makes ints dynamic after they change); it
  // was specialised per value, up to the cache limit. Values 0 and 1 stay specialised, as
  // tensor sizes 0 and 1 do, and the reason says so.
  auto body = [](const Tensor& x, int64_t k) { return x.slice(1, 0, k).sum(1) * double(k); };
  auto f = compile(body);
  Tensor x = ramp(4, 40, 0.25);
  for (int64_t k : {2, 3, 4, 5, 1, 0, 9, 4, 30, 40})
    CHECK(max_diff(f(x, k), body(x, k), 1.0) < 1e-5);
  const std::string text = f.explain();
  INFO(text);
  CHECK(f.compile_count() == 4);  // 2, then 3 (symbolic), 1 and 0
  CHECK(contains(text, "host scalar of kind int (dynamic, >= 2: sizes follow it)"));
  CHECK(contains(text, "shape-only run(s) confirming new sizes"));
  CHECK(contains(text, "integers 0 and 1 are specialised"));
  // The batch changes too: the entry made from the symbolic one keeps the bound on k.
  for (auto [rows, k] : {std::pair{6, 7}, {9, 12}, {5, 20}, {6, 3}}) {
    Tensor y = ramp(rows, 40, 0.5);
    CHECK(max_diff(f(y, k), body(y, k), 1.0) < 1e-5);
  }
  INFO(f.explain());
  CHECK(f.compile_count() == 5);
}
