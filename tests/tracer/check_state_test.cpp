// CompileOptions::check and kiln::compare on functions that change state the caller holds: a
// training step's parameters, optimizer state and .grad (tracer::StateJournal). Found by a
// fresh-user trial: check ran the step up to 3 times per call and raised a false divergence;
// compare() let its compiled run read parameters the eager run had already updated.
#include <catch2/catch.hpp>

#include <cstring>
#include <stdexcept>

#include "kiln/kiln.h"
#include "kiln/nn.h"

using namespace kiln;

namespace {

std::vector<float> vec(const Tensor& t) { return t.detach().contiguous().to_vector<float>(); }

// A model, its optimizer and one training step on fixed data, all deterministic.
struct Trainer {
  nn::Linear lin{3, 2};
  nn::AdamW opt;
  Tensor x = arange(12, DType::Float32).view({4, 3}) * 0.1 - 0.5;
  Trainer() : opt(lin.parameters(), nn::AdamWOptions{.lr = 0.1}) {
    NoGradGuard ng;
    lin.weight.copy_(arange(6, DType::Float32).view({2, 3}) * 0.2 - 0.5);
    lin.bias.copy_(tensor({0.25f, -0.75f}));
  }
  Tensor step(const Tensor& in) {
    opt.zero_grad();
    Tensor y = lin(in);
    Tensor loss = (y * y).sum();
    loss.backward();
    opt.step();
    return loss;
  }
};

}  // namespace

TEST_CASE("check = true on a training step: one step per call, checked state, eager's values",
          "[compile]") {
  Trainer eager, checked;
  int runs = 0;
  auto step = compile([&](const Tensor& in) { ++runs; return checked.step(in); }, {.check = true});
  for (int k = 0; k < 4; ++k) {
    Tensor le = eager.step(eager.x);
    Tensor lc = step(checked.x);
    CHECK(lc.item<float>() == Approx(le.item<float>()).epsilon(1e-6));
    std::vector<float> we = vec(eager.lin.weight), wc = vec(checked.lin.weight);
    for (size_t i = 0; i < we.size(); ++i) CHECK(wc[i] == Approx(we[i]).epsilon(1e-6));
    std::vector<float> ge = vec(eager.lin.bias.grad()), gc = vec(checked.lin.bias.grad());
    for (size_t i = 0; i < ge.size(); ++i) CHECK(gc[i] == Approx(ge[i]).epsilon(1e-6));
    CHECK(checked.opt.step_count() == k + 1);
  }
  // The host function ran for eager's reference every call, and once more to trace.
  CHECK(runs == 5);
}

TEST_CASE("compare() on a training step matches and leaves the state as it found it",
          "[compile]") {
  Trainer t;
  t.step(t.x);  // .grad and the optimizer's moments exist
  std::vector<float> w = vec(t.lin.weight), g = vec(t.lin.weight.grad());
  CompareReport r = kiln::compare([&](const Tensor& in) { return t.step(in); }, t.x);
  INFO(r.str());
  CHECK(r.ok);
  CHECK(r.first_divergence.empty());
  CHECK(vec(t.lin.weight) == w);
  CHECK(vec(t.lin.weight.grad()) == g);
  CHECK(t.opt.step_count() == 1);
}

TEST_CASE("check = true reports state that compiled code leaves different, and undoes the call",
          "[compile]") {
  // A raw write through the storage's pointer is not recorded (data<T>() would make the
  // function run eagerly; Storage::data() is not watched): eager's run makes it, a replay does
  // not, so the parameter differs while the loss agrees.
  Trainer t;
  auto step = compile([&](const Tensor& in) {
    Tensor loss = t.step(in);
    Tensor& b = t.lin.bias;
    static_cast<float*>(b.storage()->data())[b.offset()] += 1.0f;
    return loss;
  }, {.check = true});
  step(t.x);  // traced: the trace run made the raw write too
  std::vector<float> w = vec(t.lin.weight), b = vec(t.lin.bias);
  try {
    step(t.x);
    FAIL("no error");
  } catch (const Error& e) {
    CHECK_THAT(e.what(), Catch::Contains("check: the tensor written at") &&
                             Catch::Contains("check_state_test.cpp") &&
                             Catch::Contains("differs from eager"));
  }
  CHECK(vec(t.lin.weight) == w);  // the failed call had no effect
  CHECK(vec(t.lin.bias) == b);
  CHECK(t.opt.step_count() == 1);
}

// Found by a second fresh-user trial of check and compare (each case failed before its fix).
TEST_CASE("check = true inside another compiled function or compare: one step per call",
          "[compile]") {
  Tensor w = ones({2}).requires_grad_();
  auto step = [&](const Tensor& x) {
    w.set_grad(Tensor());
    Tensor loss = (w * x).sum();
    loss.backward();
    {
      NoGradGuard ng;
      w -= w.grad() * 0.5;
    }
    return loss;
  };
  auto inner = compile(step, {.check = true});
  auto outer = compile([&](const Tensor& x) { return inner(x) * 1.0; }, {.check = true});
  Tensor x = tensor({1.0f, 2.0f});
  for (int i = 1; i <= 4; ++i) {
    Tensor loss = outer(x);
    CHECK(loss.item<float>() == Approx(3.0 - 2.5 * (i - 1)));
    CHECK(w.to_vector<float>() == std::vector<float>{1 - 0.5f * i, 1 - 1.0f * i});
  }
  CompareReport r = kiln::compare([&](const Tensor& in) { return inner(in); }, x);
  CHECK(r.ok);
  CHECK(w.to_vector<float>() == std::vector<float>{-1, -3});  // compare gave the step back
}

TEST_CASE("check = true compares void steps, written arguments and host-number outputs",
          "[compile]") {
  // A host constant changed after tracing is stale in the replay (tf.function semantics):
  // check must see it whatever the function returns.
  float scale = 1;
  Tensor w = ones({2});
  auto void_step = compile([&](const Tensor& x) { w += x * scale; }, {.check = true});
  void_step(ones({2}));
  CHECK(w.to_vector<float>() == std::vector<float>{2, 2});
  scale = 3;
  CHECK_THROWS_WITH(void_step(ones({2})), Catch::Contains("check: the tensor written at") &&
                                             Catch::Contains("check_state_test.cpp"));
  CHECK(w.to_vector<float>() == std::vector<float>{2, 2});  // no effect

  float k = 1;
  auto scale_arg = compile([&](Tensor a) { a *= k; return a.sum() * 0.0; }, {.check = true});
  Tensor a = arange(3, DType::Float32);
  scale_arg(a);
  k = 5;
  CHECK_THROWS_WITH(scale_arg(a), Catch::Contains("tensor argument 0 after the call differs"));
  CHECK(a.to_vector<float>() == std::vector<float>{0, 1, 2});  // given back

  double s = 1;
  auto two = compile([&](const Tensor& x) { return std::make_pair(x * 2.0, s * 10); },
                     {.check = true});
  two(ones({1}));
  s = 3;
  CHECK_THROWS_WITH(two(ones({1})), Catch::Contains("output 1 differs"));
}

TEST_CASE("check = true with retain_grad caches the function; compare keeps the generator",
          "[compile]") {
  Tensor w = arange(3, DType::Float32).requires_grad_();
  auto f = compile([&](const Tensor& x) {
    Tensor y = x * w;
    y.retain_grad();
    (y * y).sum().backward();
    return y.grad() * 1.0;
  }, {.check = true});
  for (int i = 0; i < 4; ++i) {
    w.set_grad(Tensor());
    CHECK(f(arange(3, DType::Float32) + 1.0).to_vector<float>() == std::vector<float>{0, 4, 12});
  }
  CHECK(f.compile_count() == 1);

  manual_seed(1);
  Tensor expected = rand({3});
  manual_seed(1);
  CompareReport r = kiln::compare([](const Tensor& x) { return dropout(x, 0.5, true); }, ones({64}));
  CHECK(r.ok);
  CHECK(rand({3}).to_vector<float>() == expected.to_vector<float>());
}

TEST_CASE("check = true names what a stale trace differs in: a constant, a path, a capture",
          "[compile]") {
  // Found by review: these said "first divergence: not found", as a fresh trace, compiled,
  // matches eager; the difference is between the replayed trace and eager.
  double scale = 2;
  auto scaled = compile([&](const Tensor& x) { return x * scale + 1.0; }, {.check = true});
  scaled(ones({2}));
  scale = 3;
  CHECK_THROWS_WITH(scaled(ones({2})),
                    Catch::Contains("mul at ") && Catch::Contains("check_state_test.cpp") &&
                        Catch::Contains("uses the constant 2 it was traced with; eager now "
                                        "uses 3") &&
                        Catch::Contains("kiln::guarded"));

  bool relu_first = true;
  auto branchy = compile([&](const Tensor& x) { return relu_first ? relu(x) * 2.0 : exp(x); },
                         {.check = true});
  branchy(ones({2}));
  relu_first = false;
  CHECK_THROWS_WITH(branchy(ones({2})),
                    Catch::Contains("the compiled code runs relu at ") &&
                        Catch::Contains("where eager now runs exp at ") &&
                        Catch::Contains("another path"));

  Tensor bias = ones({2});
  Tensor keep = bias;  // the traced tensor stays alive, so the capture guard still holds
  auto shifted = compile([&](const Tensor& x) { return x + bias; }, {.check = true});
  shifted(ones({2}));
  bias = full({2}, 5.0);
  CHECK_THROWS_WITH(shifted(ones({2})),
                    Catch::Contains("reads the captured tensor it was traced with"));
}

TEST_CASE("check = true and compare() keep arguments that share memory sharing it (review)") {
  // Eager's reference run used to get an independent copy of each argument, so a write through
  // one no longer showed through the other: a false "differs from eager", and the call undone.
  auto scale_then_sum = [](Tensor a, const Tensor& b) {
    a.mul_(2);
    return b.sum();
  };
  auto add_transpose = [](Tensor a, const Tensor& b) {
    a.add_(b);
    return a * 1;
  };
  auto checked_sum = compile(scale_then_sum, CompileOptions{.check = true});
  auto checked_add = compile(add_transpose, CompileOptions{.check = true});
  for (int call = 0; call < 3; ++call) {
    Tensor w = arange(9, DType::Float32).view({3, 3});
    CHECK(checked_sum(w, w).item<float>() == 72.0f);  // (0 + ... + 8) · 2
    CHECK(vec(w) == vec(arange(9, DType::Float32) * 2));
    CHECK(compare(scale_then_sum, w, w).ok);

    // x += x.t() reads what it writes; both runs see the same overlap.
    Tensor x = arange(4, DType::Float32).view({2, 2});
    Tensor expect = x.clone();
    add_transpose(expect, expect.t());
    Tensor y = checked_add(x, x.t());
    CHECK(vec(y) == vec(expect));
    CHECK(vec(x) == vec(expect));
  }
}

TEST_CASE("check = true names the shapes when an output's shape differs from eager's") {
  // It said only "max abs diff inf" (review). A compiled function whose host code reads a
  // global the tracer cannot see (the documented way to go stale) returns another shape.
  static int64_t width = 2;
  auto f = compile([](const Tensor& x) { return x.slice(0, 0, width) * 2; },
                   CompileOptions{.check = true});
  Tensor x = arange(4, DType::Float32);
  CHECK(vec(f(x)) == std::vector<float>{0, 2});
  width = 3;
  std::string what;
  try {
    f(x);
  } catch (const Error& e) {
    what = e.what();
  }
  width = 2;
  CHECK_THAT(what, Catch::Contains("output 0 (shape [2] compiled, [3] eager) differs from eager"));
}

TEST_CASE("check = true: an infinity against a finite value is beyond any tolerance (review)") {
  // |inf - x| <= atol + rtol·|inf| held, so a compiled 3e38 passed against eager's inf.
  double scale = 2;
  auto scaled = compile([&](const Tensor& x) { return x * scale; }, {.check = true});
  CHECK(vec(scaled(ones({2}))) == std::vector<float>{2, 2});
  scale = INFINITY;
  CHECK_THROWS_WITH(scaled(ones({2})), Catch::Contains("differs from eager"));
  // Both overflow alike: equal infinities match.
  CHECK(compare([](const Tensor& x) { return x * 1e38 * 10.0; }, full({1}, 4.0f)).ok);
  // mean of [3e38, 3e38]: 3e38 compiled and eager (eager's float32 partial sums gave inf).
  auto mean_of = compile([](const Tensor& x) { return x.mean() * 1.0; }, {.check = true});
  for (int call = 0; call < 3; ++call)
    CHECK(mean_of(full({2}, 3e38f)).item<float>() == 3e38f);
}

TEST_CASE("compare() passes each argument with its layout, modules by reference, and numbers a "
          "vector's elements from 0 (review)") {
  // A lone argument was cloned contiguous: compare said "matches" for calls that raise.
  Tensor x = arange(6, DType::Float32).view({2, 3});
  auto flat = [](const Tensor& a) { return a.view({-1}) * 1; };
  CHECK_THROWS_WITH(flat(x.t()), Catch::Contains("view"));
  CHECK_THROWS_WITH(compare(flat, x.t()), Catch::Contains("view"));
  auto scale_in_place = [](Tensor a) {
    a.mul_(10);
    return a.sum();
  };
  Tensor expanded = arange(6, DType::Float32).unsqueeze(0).expand({2, 6});
  CHECK_THROWS_WITH(compare(scale_in_place, expanded), Catch::Contains("mul_"));
  auto strides_of = [](const Tensor& a) {
    CHECK(a.strides() == Strides{1, 3});
    return a * 2;
  };
  Tensor big = arange(1000, DType::Float32);
  CompareReport sliced = compare(strides_of, big.slice(0, 10, 16).view({2, 3}).t());
  CHECK(sliced.ok);
  CHECK(vec(big.slice(0, 10, 12)) == std::vector<float>{10, 11});  // the caller's memory as it was

  // A tensor list whose element the function writes in place (re-review: the compiled run
  // read eager's copy, already written, and compare blamed the op).
  auto increment_first = [](std::vector<Tensor> v) {
    v[0].add_(1);
    return v[0] * 1;
  };
  Tensor first = arange(3, DType::Float32);
  CompareReport listed = compare(increment_first, std::vector<Tensor>{first, ones({2})});
  CHECK(listed.ok);
  CHECK(vec(first) == std::vector<float>{0, 1, 2});  // given back

  // A module by non-const reference, as compile() takes it (compare did not compile).
  nn::Linear lin(3, 2);
  auto apply = [](nn::Linear& m, const Tensor& in) { return m(in); };
  CHECK(compare(apply, lin, x).ok);

  // A vector's elements are outputs 0 and 1 (its length came first as "output 0").
  auto pair = [](const Tensor& a) { return std::vector<Tensor>{a * 2.0, a + 1.0}; };
  CompareReport two = compare(pair, x);
  CHECK(two.outputs.size() == 2);
  CHECK_THAT(two.str(), Catch::Contains("output 1") && !Catch::Contains("output 2"));
  double g = 2.0;
  auto stale = compile([&](const Tensor& a) { return std::vector<Tensor>{a * g, a + 1.0}; },
                       CompileOptions{.check = true});
  stale(x);
  g = 3.0;
  CHECK_THROWS_WITH(stale(x), Catch::Contains("output 0"));
}

TEST_CASE("check=true: a function that raises leaves the arguments and captured tensors as "
          "eager does") {
  // A break-it pass: the reference run wrote copies of the arguments and the real captured
  // tensors, then raised: x was left unwritten, w written (eager writes both).
  Tensor w = ones({2});
  auto fn = [&](Tensor& x, bool fail) {
    x.add_(1.0);
    w.add_(1.0);
    if (fail) throw std::runtime_error("fail");
    return x * 2.0 + 1.0;
  };
  CompileOptions o;
  o.check = true;
  auto f = compile(fn, o);
  Tensor x = ones({2});
  CHECK_THROWS_WITH(f(x, true), "fail");
  CHECK(vec(x) == std::vector<float>{2, 2});
  CHECK(vec(w) == std::vector<float>{2, 2});
  CHECK(vec(f(x, false)) == std::vector<float>{7, 7});  // and the next call checks as before
  CHECK(vec(x) == std::vector<float>{3, 3});
  CHECK(vec(w) == std::vector<float>{3, 3});
}
