// Shape-only runs (CompileOptions::shape_only_checks): a symbolic specialisation is confirmed for
// new sizes by running the function without kernels, then replayed. Each case compares with
// eager at every call and checks that the caller's state (tensors, .grad, the generator) is
// what eager leaves.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <set>

#include "kiln/kiln.h"
#include "tracer/util.h"

using namespace kiln;
using kiln::testing::contains;
using kiln::testing::max_diff;
using kiln::testing::vec;

namespace {

// One decoding step of a one-layer attention model whose KV cache grows by cat: the cache's
// length changes on every call.
struct Decoder {
  static constexpr int64_t kDim = 16;
  Tensor wq, wk, wv, wo;
  Decoder() {
    manual_seed(11);
    wq = randn({kDim, kDim}) * 0.3;
    wk = randn({kDim, kDim}) * 0.3;
    wv = randn({kDim, kDim}) * 0.3;
    wo = randn({kDim, kDim}) * 0.3;
  }
  std::vector<Tensor> operator()(const Tensor& x, const Tensor& keys, const Tensor& values) const {
    Tensor k = cat({keys, matmul(x, wk)}, 1), v = cat({values, matmul(x, wv)}, 1);
    Tensor a = softmax(matmul(matmul(x, wq), k.transpose(1, 2)) * 0.25, -1);
    return {tanh(matmul(matmul(a, v), wo)) + x, k, v};
  }
};

}  // namespace

TEST_CASE("compile: a KV cache grown by cat replays every step after a few traces",
          "[compile][dynamic][shape-only]") {
  Decoder step;
  int runs = 0;
  auto cstep = compile([&](const Tensor& x, const Tensor& k, const Tensor& v) {
    ++runs;
    return step(x, k, v);
  });
  Tensor x = sin(arange(Decoder::kDim, Float32) * 0.7).view({1, 1, Decoder::kDim});
  Tensor k = zeros({1, 1, Decoder::kDim}), v = zeros({1, 1, Decoder::kDim});
  Tensor ex = x, ek = k, ev = v;
  constexpr int kSteps = 24;
  for (int s = 0; s < kSteps; ++s) {
    std::vector<Tensor> got = cstep(x, k, v), want = step(ex, ek, ev);
    INFO("step " << s);
    REQUIRE(got[1].size(1) == s + 2);
    CHECK(max_diff(got[0], want[0]) < 1e-5);
    CHECK(max_diff(got[1], want[1]) < 1e-5);
    x = got[0], k = got[1], v = got[2];
    ex = want[0], ek = want[1], ev = want[2];
  }
  const std::string ex_text = cstep.explain();
  INFO(ex_text);
  // Lengths 1 (specialised) and 2, 3 (made symbolic at 3), 4 confirmed by a trace; every later
  // length is checked shape-only and replayed (the body runs once per call all the same).
  CHECK(cstep.compile_count() == 3);
  CHECK(runs == kSteps);
  CHECK(contains(ex_text, "and 1 confirming new sizes"));
  CHECK(contains(ex_text, fmt::format("and {} shape-only run(s)", kSteps - 4)));
  CHECK(contains(ex_text, fmt::format("{} replay(s)", kSteps - 4)));
  // The cat's `T + 1` output size comes from the inputs' sizes: the region is built with
  // symbolic dims, not for the traced shapes only.
  CHECK_FALSE(contains(ex_text, "traced shapes only"));
}

TEST_CASE("compile: with shape_only_checks = false every new length is traced",
          "[compile][dynamic][shape-only]") {
  Decoder step;
  auto cstep = compile([&](const Tensor& x, const Tensor& k, const Tensor& v) {
    return step(x, k, v);
  }, CompileOptions{.shape_only_checks = false});
  Tensor x = ones({1, 1, Decoder::kDim}), k = zeros({1, 1, Decoder::kDim}), v = k;
  for (int s = 0; s < 8; ++s) {
    std::vector<Tensor> got = cstep(x, k, v);
    x = got[0], k = got[1], v = got[2];
  }
  INFO(cstep.explain());
  CHECK(contains(cstep.explain(), "3 trace(s) and 5 confirming new sizes"));
  CHECK_FALSE(contains(cstep.explain(), "shape-only run(s) confirming"));
}

TEST_CASE("compile: a cache grown by cat from empty settles under Dynamic::Always",
          "[compile][dynamic][shape-only]") {
  // Always marks the length symbolic from one trace, guessing the cat's output length as a
  // constant; the next length refutes it, and the trace there is generalised against the
  // refuted entry, which it replaces (break-it pass: compared only with the size-1 entry, every
  // length got an entry of its own, and the function ran eagerly after 8).
  auto grow = [](const Tensor& cache, const Tensor& row) {
    Tensor next = cat({cache, row}, 0);
    return std::vector<Tensor>{next, next.sum(0)};
  };
  CompileOptions always;
  always.dynamic = Dynamic::Always;
  auto cgrow = compile(grow, always);
  for (int pass = 0; pass < 2; ++pass) {
    Tensor cache = zeros({0, 4}), want = cache;
    for (int t = 0; t < 12; ++t) {
      Tensor row = full({1, 4}, double(t + 1));
      std::vector<Tensor> got = cgrow(cache, row), ref = grow(want, row);
      REQUIRE(got[0].shape() == Shape{t + 1, 4});
      CHECK(vec(got[0]) == vec(ref[0]));
      CHECK(vec(got[1]) == std::vector<float>(4, float((t + 1) * (t + 2) / 2)));
      cache = got[0], want = ref[0];
    }
  }
  const std::string text = cgrow.explain();
  INFO(text);
  // Lengths 0 and 1 are specialised, 2 is guessed, 3 refutes the guess and replaces it.
  CHECK(cgrow.compile_count() == 4);
  CHECK(cgrow.cache_entries() == 3);
  CHECK(contains(text, "replaces specialisation #2"));
  CHECK(contains(text, "shape-only run(s) confirming new sizes"));
  CHECK_FALSE(contains(text, "runs eagerly"));
}

TEST_CASE("compile: sizes from C++ integer division of a size settle after a few traces",
          "[compile][dynamic][shape-only]") {
  // Slices to `n / 2`, from `n / 2`, to `(n + 1) / 2`, of `(n * m) / 3` elements, ...: no
  // multiple or affine function of n, so every size was traced (each pair of sizes fit an
  // affine formula the next refuted) until the cache limit, then the function ran eagerly.
  using Fn = std::function<Tensor(const Tensor&)>;
  const std::vector<std::pair<const char*, Fn>> cases{
      {"n / 2", [](const Tensor& x) { return x.slice(0, 0, x.size(0) / 2).sum(0) * 2.0; }},
      {"n - n / 2", [](const Tensor& x) { return x.slice(0, x.size(0) / 2, x.size(0)).sum(0); }},
      {"(n + 1) / 2", [](const Tensor& x) { return x.slice(0, 1, (x.size(0) + 1) / 2).sum(0); }},
      {"(n * m) / 3", [](const Tensor& x) {
         const int64_t nm = x.size(0) * x.size(1);
         return x.reshape({nm}).slice(0, 0, nm / 3).sum(0);
       }},
      {"n - n / 3", [](const Tensor& x) { return x.slice(0, x.size(0) / 3, x.size(0)).sum(0); }},
      {"n / 4, 0 at n = 2, 3", [](const Tensor& x) {
         return x.slice(0, 0, x.size(0) / 4).sum(0) + 1.0;
       }},
      {"(n * 3) / 2 and 3 * (n / 2)", [](const Tensor& x) {
         const int64_t n = x.size(0);
         Tensor three = x.slice(1, 0, 3).contiguous();
         Tensor half = three.slice(0, 0, n / 2).reshape({(n / 2) * 3});
         return three.reshape({n * 3}).slice(0, 0, (n * 3) / 2).sum(0) + half.mean(0);
       }},
  };
  // explain() shows the formula taken (the first case's).
  const char* half_formula = "end = s0.0 / 2";
  for (const auto& [what, f] : cases) {
    INFO(what);
    auto cf = compile(f);
    for (int64_t n = 2; n < 24; ++n) {
      Tensor x = arange(n * (n + 2), DType::Float32).reshape({n, n + 2});
      INFO("n = " << n);
      CHECK(max_diff(cf(x), f(x)) == 0);
    }
    const std::string text = cf.explain();
    INFO(text);
    // Two or three traces fit several formulas at small sizes; a few more tell them apart.
    CHECK(cf.compile_count() <= 5);
    CHECK(contains(text, "shape-only run(s) confirming new sizes"));
    CHECK_FALSE(contains(text, "runs eagerly"));
    if (what == std::string("n / 2")) CHECK(contains(text, half_formula));
  }
}

TEST_CASE("compile: a size min(n, 10) is not taken for a division of n", "[compile][dynamic]") {
  // Break-it pass: the division formulas fit min(n, 10) at n = 2 and 11 ((4n + 1) / 5 + 1 and
  // others), each refuted at the next size, and every size was traced to the cache limit.
  auto f = [](const Tensor& x) {
    return x.slice(0, 0, std::min<int64_t>(x.size(0), 10)).sum(0) + 1.0;
  };
  auto cf = compile(f);
  for (int64_t n = 2; n <= 40; ++n) {
    Tensor x = arange(n * 3, DType::Float32).reshape({n, 3});
    CHECK(max_diff(cf(x), f(x)) == 0);
  }
  INFO(cf.explain());
  CHECK(cf.compile_count() <= 4);
  CHECK_FALSE(contains(cf.explain(), "runs eagerly"));
}

TEST_CASE("compile: x / sqrt(n) and x * (1 / sqrt(n)) follow the size", "[compile][dynamic]") {
  // Break-it pass: only the reciprocal form was recognised; dividing by the constant sqrt(n)
  // traced every size up to the cache limit.
  auto divided = [](const Tensor& x) { return x / std::sqrt(double(x.size(0))); };
  auto scaled = [](const Tensor& x) { return x * (1.0 / std::sqrt(double(x.size(0) + 1))); };
  auto cdivided = compile(divided);
  auto cscaled = compile(scaled);
  for (int64_t n : {2, 3, 5, 8, 6, 7, 11, 13, 10}) {
    Tensor x = arange(n, DType::Float32) + 1.0;
    CHECK(max_diff(cdivided(x), divided(x)) == 0);
    CHECK(max_diff(cscaled(x), scaled(x)) == 0);
  }
  INFO(cdivided.explain());
  INFO(cscaled.explain());
  CHECK(cdivided.compile_count() == 2);
  CHECK(cscaled.compile_count() == 2);
  CHECK(contains(cdivided.explain(), "= sqrt(s0.0)"));
  CHECK(contains(cscaled.explain(), "= 1 / sqrt(s0.0 + 1)"));
}

TEST_CASE("compile: a scale 1 / sqrt(length) of a cache grown by cat settles under "
          "Dynamic::Always", "[compile][dynamic][shape-only]") {
  // The host scale is a constant of each trace; as a reciprocal square root of a size it
  // follows the length (break-it pass: every length was traced until the cache limit, with a
  // message that named the cat's length, not the scale).
  auto attend = [](const Tensor& keys, const Tensor& row) {
    Tensor k = cat({keys, row}, 0);
    const double scale = 1.0 / std::sqrt(double(k.size(0)));
    return std::vector<Tensor>{k, k.sum(0) * scale};
  };
  CompileOptions always;
  always.dynamic = Dynamic::Always;
  auto cattend = compile(attend, always);
  Tensor keys = zeros({0, 4});
  for (int t = 0; t < 20; ++t) {
    Tensor row = full({1, 4}, double(t + 1));
    std::vector<Tensor> got = cattend(keys, row), want = attend(keys, row);
    INFO("length " << t + 1);
    CHECK(max_diff(got[1], want[1]) == 0);
    keys = got[0];
  }
  const std::string text = cattend.explain();
  INFO(text);
  CHECK(cattend.compile_count() == 4);
  CHECK(contains(text, "shape-only run(s) confirming new sizes"));
  CHECK_FALSE(contains(text, "runs eagerly"));
}

TEST_CASE("compile: attention over a cache prefix up to a position passed by value settles",
          "[compile][dynamic][shape-only]") {
  // `cache.slice(1, 0, pos + 1)` with `pos` an int: the prefix length follows the host
  // integer (positions 0 and 1 specialised), so a 40-step decode compiles 4 times and then
  // confirms each new position shape-only (was: a trace per position up to the cache limit,
  // then eager).
  manual_seed(5);
  Tensor cache = randn({1, 48, 8}), q = randn({1, 1, 8});
  auto attend = [&](const Tensor& query, int64_t pos) {
    Tensor k = cache.slice(1, 0, pos + 1);
    return matmul(softmax(matmul(query, k.transpose(1, 2)) * 0.35, -1), k);
  };
  auto cattend = compile(attend);
  for (int64_t pos = 0; pos < 40; ++pos) {
    INFO("pos = " << pos);
    CHECK(max_diff(cattend(q, pos), attend(q, pos), 1.0) < 1e-5);
  }
  const std::string text = cattend.explain();
  INFO(text);
  CHECK(cattend.compile_count() == 4);
  CHECK(contains(text, "shape-only run(s) confirming new sizes"));
  CHECK_FALSE(contains(text, "runs eagerly"));
}

TEST_CASE("compile: a training step checked shape-only leaves weights, optimizer state, .grad "
          "and the generator as eager does",
          "[compile][dynamic][shape-only]") {
  // Dropout draws, SGD with momentum writes the weights and its buffers, backward sets .grad:
  // a shape-only run does all of that without values and must give it all back before the
  // replay (a version counter left bumped, a .grad left garbage or the generator left advanced
  // shows in the losses, the weights or the next draw).
  auto run = [](bool compiled) {
    manual_seed(7);
    nn::Linear l1(6, 12), l2(12, 3);
    std::vector<Tensor> params = l1.parameters();
    for (const Tensor& p : l2.parameters()) params.push_back(p);
    nn::SGD opt(params, {.lr = 0.05, .momentum = 0.9});
    auto step = [&](const Tensor& x, const Tensor& y) {
      opt.zero_grad();
      Tensor loss = mse_loss(l2(dropout(relu(l1(x)), 0.25)), y);
      loss.backward();
      opt.step();
      return loss.detach();
    };
    auto cstep = compile(step);
    std::vector<float> out;
    for (int64_t b : {4, 6, 8, 10, 12, 5, 7, 9, 10, 14}) {
      Tensor x = sin(arange(b * 6, Float32).view({b, 6}) * 0.37);
      Tensor y = cos(arange(b * 3, Float32).view({b, 3}) * 0.21);
      out.push_back((compiled ? cstep(x, y) : step(x, y)).item<float>());
      out.push_back(rand({1}).item<float>());  // where the generator is after the step
    }
    if (compiled) {
      INFO(cstep.explain());
      CHECK(contains(cstep.explain(), "shape-only run(s)"));
    }
    for (const Tensor& p : params)
      for (float w : vec(p)) out.push_back(w);
    for (const Tensor& p : params)
      for (float g : vec(p.grad())) out.push_back(g);
    return out;
  };
  std::vector<float> eager = run(false), compiled = run(true);
  REQUIRE(eager.size() == compiled.size());
  for (size_t i = 0; i < eager.size(); ++i) {
    INFO("value " << i);
    CHECK(compiled[i] == Approx(eager[i]).epsilon(1e-5).margin(1e-6));
  }
}

TEST_CASE("compile: a shape-only run that reads a value or runs other ops is traced instead",
          "[compile][dynamic][shape-only]") {
  int runs = 0;
  auto f = [&](const Tensor& x) {
    ++runs;
    // From 9 rows on, a host read (shape-only: aborted before the value is seen); from 12,
    // another op (shape-only: the ops differ, so the run does not confirm).
    if (x.size(0) >= 12) return (x * 3.0).exp();
    if (x.size(0) >= 9 && (x.sum() > 0.0).item<bool>()) return x * 2.0 + 1.0;
    return x * 2.0;
  };
  auto cf = compile(f);
  std::set<int64_t> seen;
  for (int64_t n : {2, 3, 4, 5, 6, 9, 10, 12, 13, 6}) {
    const bool first = seen.insert(n).second;
    Tensor x = cos(arange(n, Float32) * 0.5);
    runs = 0;
    Tensor got = cf(x);
    const int compiled_runs = runs;
    Tensor want = f(x);
    INFO("n = " << n);
    CHECK(max_diff(got, want) < 1e-6);
    // Sizes 5 and 6 are confirmed shape-only (the body runs once); 9, 10, 12 and 13 run it
    // shape-only first and then as a trace (twice).
    if (!first) CHECK(compiled_runs == 0);  // a replay
    if (first && (n == 5 || n == 6)) CHECK(compiled_runs == 1);
    if (first && n >= 9) CHECK(compiled_runs == 2);
  }
  INFO(cf.explain());
  CHECK(contains(cf.explain(), "and 2 shape-only run(s)"));
}

TEST_CASE("compile: a shape-only run stops before an in-place write with autograd history into "
          "a tensor the caller holds",
          "[compile][dynamic][shape-only]") {
  // From 5 elements on, buf.mul_(w) with w requiring grad gives buf a gradient history in
  // eager, which a shape-only run could not give back: it stops before the write, and the call
  // is traced, so buf's values and history are eager's (a history left by the shape-only run
  // would double w's gradient).
  Tensor w = scalar_tensor(1.5).requires_grad_();
  int runs = 0;
  auto f = [&](const Tensor& x, const Tensor& buf) {
    ++runs;
    Tensor(buf).mul_(x.size(0) >= 5 ? w : scalar_tensor(1.5));
    return x * 2.0;
  };
  auto cf = compile(f);
  for (int64_t n : {2, 3, 4, 5, 6}) {
    INFO("n = " << n);
    Tensor buf = arange(n, Float32) + 1.0, ebuf = arange(n, Float32) + 1.0;
    Tensor x = ones({n});
    runs = 0;
    CHECK(vec(cf(x, buf)) == vec(f(x, ebuf)));
    CHECK(runs == (n >= 5 ? 3 : 2));  // (from 5: shape-only, then traced; then eager's run)
    CHECK(vec(buf) == vec(ebuf));
    REQUIRE(buf.requires_grad() == (n >= 5));
    if (n < 5) continue;
    w.set_grad(Tensor());
    buf.sum().backward();
    const float compiled_grad = w.grad().item<float>();
    CHECK(compiled_grad == float(n * (n + 1) / 2));  // d/dw sum(w * (1..n))
    w.set_grad(Tensor());
  }
}
