// compile() with `to` and one_hot in compiled regions: cross_entropy's backward (one_hot(target)
// .to(float) * valid ...) no longer runs as eager ops between the regions, and an out-of-range
// target still raises eager's error.
#include <catch2/catch.hpp>
#include <functional>
#include <limits>
#include <string>

#include "kiln/kiln.h"
#include "kiln/nn.h"
#include "nn/optim.h"
#include "tracer/util.h"

using namespace kiln;
using kiln::testing::contains;
using kiln::testing::training_step;
using kiln::testing::vec;

namespace {

std::shared_ptr<nn::Sequential> make_model() {
  manual_seed(21);
  return std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(6, 12), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(12, 5)});
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("compile: cross_entropy's backward compiles one_hot and to, and equals eager",
          "[compile][autograd]") {
  auto eager_model = make_model(), compiled_model = make_model();
  nn::AdamW eager_opt(eager_model->parameters(), {.lr = 1e-2});
  nn::AdamW compiled_opt(compiled_model->parameters(), {.lr = 1e-2});
  auto eager_step = training_step(*eager_model, eager_opt);
  auto compiled_step = compile(training_step(*compiled_model, compiled_opt));
  manual_seed(5);
  Tensor x = randn({16, 6});
  // -100 is nll_loss's ignore_index: where(valid, target, 0) before the one_hot.
  Tensor y = from_vector<int64_t>({0, 1, 2, 3, 4, 0, -100, 2, 3, 4, 0, 1, 2, 3, 4, 1}, Shape{16});
  for (int s = 0; s < 5; ++s) {
    float le = eager_step(x, y).item<float>();
    float lc = compiled_step(x, y).item<float>();
    CHECK(lc == Approx(le).epsilon(1e-5));
  }
  auto pe = eager_model->parameters(), pc = compiled_model->parameters();
  for (size_t k = 0; k < pe.size(); ++k) {
    std::vector<float> a = vec(pe[k]), b = vec(pc[k]);
    for (size_t j = 0; j < a.size(); ++j) CHECK(b[j] == Approx(a[j]).margin(1e-5));
  }
  std::string text = compiled_step.explain();
  INFO(text);
  CHECK(compiled_step.compile_count() == 1);
  CHECK(contains(text, "one_hot"));  // inside a compiled region's op list
  CHECK_FALSE(contains(text, "eager op: one_hot"));
  CHECK_FALSE(contains(text, "eager op: to "));
  CHECK_FALSE(contains(text, "eager op: unsqueeze"));

  // A class index out of range raises eager's error in the compiled step too (same shapes: no
  // retrace), at the same line: the compiled nll_loss gives 0 for it (ir/decompose.cpp), and
  // the scan of its targets after the region re-runs it on eager kernels. Before that, the
  // backward's one_hot (a zero row) raised one_hot's error at eager/derivatives.cpp.
  // Runs while the region is timed against its ops on eager kernels and after (kTrials).
  for (int round = 0; round < 3; ++round)
    for (int64_t wrong : {int64_t{5}, int64_t{-7}, int64_t{1} << 40}) {
      Tensor bad =
          from_vector<int64_t>({0, 1, 2, 3, 4, 0, 1, 2, 3, wrong, 0, 1, 2, 3, 4, 1}, Shape{16});
      std::string nll_error = error_of([&] { eager_step(x, bad); });
      REQUIRE(contains(nll_error, "kiln::cross_entropy: target"));
      CHECK(error_of([&] { compiled_step(x, bad); }) == nll_error);
      compiled_step(x, y);
    }
  CHECK(compiled_step.compile_count() == 1);
}

TEST_CASE("compile: to() between dtypes in a compiled region equals eager", "[compile]") {
  auto fn = [](const Tensor& x) {
    Tensor i = (x * 3.0).to(DType::Int32);
    return (i.to(DType::Int64) * 2).to(DType::Float64) + x.to(DType::Bool).to(DType::Float64);
  };
  auto cf = compile(fn);
  for (int s = 0; s < 3; ++s) {
    Tensor x = from_vector<float>({0.f, -0.f, 0.4f, -0.4f, 1.7f, -2.9f, 1e9f, -1e9f, 3e38f,
                                   std::numeric_limits<float>::infinity(), NAN, 5.5f},
                                  Shape{12});
    std::vector<double> a = fn(x).to_vector<double>(), b = cf(x).to_vector<double>();
    REQUIRE(a.size() == b.size());
    for (size_t j = 0; j < a.size(); ++j) CHECK(b[j] == a[j]);
  }
  INFO(cf.explain());
  CHECK_FALSE(contains(cf.explain(), "eager op: to "));
}

// An int64 0-d operand of an int32 op takes no part in the result type: it narrows (wrapping,
// as eager's cast). The lowering sign-extended instead, which MLIR rejected, so the whole
// region ran on eager kernels (review).
TEST_CASE("compile: an int32 tensor with an int64 0-d operand compiles and wraps as eager",
          "[compile]") {
  auto fn = [](const Tensor& a, const Tensor& b) {
    return ((a * 2 + b) * 3 - a).to(DType::Float32).exp().sum() + where(a > 2, a, b).sum();
  };
  auto cf = compile(fn);
  Tensor a = arange(10, DType::Int32);
  for (int64_t k : {int64_t{3}, int64_t{4294967301}}) {  // 2^32 + 5 wraps to 5 in int32
    Tensor b = scalar_tensor(k, DType::Int64);
    double expect = fn(a, b).item<double>();
    for (int call = 0; call < 12; ++call)  // past the runs that time compiled against eager
      CHECK(cf(a, b).item<double>() == Approx(expect).epsilon(1e-6));
  }
  CHECK(fn(a, scalar_tensor(int64_t{4294967301}, DType::Int64)).item<double>() ==
        Approx(fn(a, scalar_tensor(int64_t{5}, DType::Int64)).item<double>()));
  INFO(cf.explain());
  CHECK_FALSE(contains(cf.explain(), "not compiled"));
}

TEST_CASE("compile: values eager rejects raise eager's error on every call (nll_loss targets, "
          "integer division by zero, integer 0 to a negative power)", "[compile]") {
  // Each compiled function runs 12 good and 12 bad calls: past the runs that time its region
  // against eager kernels, so compiled code runs too. Before, compiled code returned a value
  // (a 0 loss term, 4 for 8 // 0, 1 for 0 ** -1) on those calls.
  auto loss = [](const Tensor& x, const Tensor& t) { return cross_entropy(x * 2.0, t); };
  auto div = [](const Tensor& a, const Tensor& b) {
    return floor_divide(a * 2, b) + remainder(a, b + 0);
  };
  auto pw = [](const Tensor& a, const Tensor& b) { return pow(a * 1, b) + 1; };
  Tensor logits = from_vector<float>({1, 2, 3, 0, 0, 1}, {2, 3});
  struct Case {
    std::function<Tensor(const Tensor&, const Tensor&)> fn;
    Tensor a, good, bad;
    const char* error;
  };
  std::vector<Case> cases = {
      {loss, logits, from_vector<int64_t>({0, 2}, {2}), from_vector<int64_t>({0, 3}, {2}),
       "kiln::cross_entropy: target 3 is out of bounds"},
      {loss, logits, from_vector<int64_t>({-100, 1}, {2}), from_vector<int64_t>({-1, 1}, {2}),
       "kiln::cross_entropy: target -1 is out of bounds"},
      {div, from_vector<int32_t>({4, -7}, {2}), from_vector<int32_t>({3, -2}, {2}),
       from_vector<int32_t>({2, 0}, {2}), "integer division by zero"},
      {pw, from_vector<int64_t>({0, 3}, {2}), from_vector<int64_t>({1, 2}, {2}),
       from_vector<int64_t>({-1, 2}, {2}), "cannot be raised to a negative power"}};
  for (Case& c : cases) {
    INFO(c.error);
    auto cf = compile(c.fn);
    std::string expected = error_of([&] { c.fn(c.a, c.bad); });
    REQUIRE(contains(expected, c.error));
    std::vector<double> good = c.fn(c.a, c.good).to_vector<double>();
    for (int k = 0; k < 12; ++k) {
      std::vector<double> got = cf(c.a, c.good).to_vector<double>();
      REQUIRE(got.size() == good.size());
      for (size_t j = 0; j < got.size(); ++j) CHECK(got[j] == Approx(good[j]).epsilon(1e-6));
      CHECK(error_of([&] { cf(c.a, c.bad); }) == expected);
    }
    CHECK(cf.compile_count() == 1);
  }
}
