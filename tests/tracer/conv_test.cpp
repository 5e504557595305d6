// compile() and the Window rows (unfold, fold), which have no IR op: a compiled replay runs them
// (and so conv2d and the pools, composites over unfold) on eager kernels between its compiled
// regions. A small CNN's training step traces once and replays with eager's values and
// parameters; gradients and changing batch sizes too.
#include <catch2/catch.hpp>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "kiln/kiln.h"
#include "tracer/util.h"

using namespace kiln;
using kiln::testing::contains;
using kiln::testing::training_step;
using kiln::testing::vec;

namespace {

// conv2d -> relu -> max_pool2d -> flatten -> linear, for [N, 2, 6, 6] input and 3 classes.
class SmallCnn : public nn::Module {
 public:
  SmallCnn() {
    conv = register_module("conv", std::make_shared<nn::Conv2d>(2, 4, 3, 1, 1));
    fc = register_module("fc", std::make_shared<nn::Linear>(4 * 3 * 3, 3));
  }
  Tensor forward(const Tensor& x) override {
    return fc->forward(pool.forward(relu(conv->forward(x))).flatten(1));
  }
  std::string name() const override { return "SmallCnn"; }
  std::shared_ptr<nn::Conv2d> conv;
  std::shared_ptr<nn::Linear> fc;
  nn::MaxPool2d pool{2};
};

double max_abs_diff(const Tensor& a, const Tensor& b) {
  return amax(abs(a.to(DType::Float64) - b.to(DType::Float64))).item<double>();
}

}  // namespace

TEST_CASE("compile: a CNN training step (conv2d, relu, max_pool2d, linear, cross_entropy, "
          "AdamW) traces once and replays eager's losses and parameters",
          "[compile][conv]") {
  manual_seed(21);
  SmallCnn eager_model;
  manual_seed(21);
  SmallCnn compiled_model;
  nn::AdamW eager_opt(eager_model.parameters(), {.lr = 1e-2});
  nn::AdamW compiled_opt(compiled_model.parameters(), {.lr = 1e-2});
  auto eager_step = training_step(eager_model, eager_opt);
  auto compiled_step = compile(training_step(compiled_model, compiled_opt));
  manual_seed(5);
  Tensor x = randn({8, 2, 6, 6});
  Tensor y = from_vector<int64_t>({0, 1, 2, 0, 1, 2, 0, 1}, {8});
  float first = 0, last = 0;
  for (int s = 0; s < 6; ++s) {
    INFO("step " << s);
    const float le = eager_step(x, y).item<float>();
    const float lc = compiled_step(x, y).item<float>();
    CHECK(lc == Approx(le).epsilon(1e-5));
    (s == 0 ? first : last) = le;
  }
  CHECK(last < first);  // it learns
  auto pe = eager_model.parameters(), pc = compiled_model.parameters();
  REQUIRE(pe.size() == 4);
  for (size_t k = 0; k < pe.size(); ++k) {
    INFO("parameter " << k);
    CHECK(max_abs_diff(pe[k], pc[k]) < 1e-5);
  }
  const std::string ex = compiled_step.explain();
  INFO(ex);
  CHECK(compiled_step.compile_count() == 1);
  CHECK(contains(ex, "1 trace(s)"));
  CHECK(contains(ex, "unfold"));
  CHECK(contains(ex, "fold"));
}

TEST_CASE("compile: gradients through conv2d, the pools and fold equal eager's",
          "[compile][conv]") {
  auto fn = [](const Tensor& x, const Tensor& w, const Tensor& b) {
    Tensor h = conv2d(x * 2, w, b, {2, 1}, 1, {1, 2}, 2);
    Tensor p = max_pool2d(h, 3, 1, 1) + avg_pool2d(h, 3, 1, 1);
    Tensor f = fold(unfold(x, 2), {5, 6}, 2);  // adds each element's window count times
    return (p * p).sum() + (f * x).sum();
  };
  auto cf = compile(fn);
  manual_seed(6);
  for (int call = 0; call < 3; ++call) {
    INFO("call " << call);
    auto leaf = [](const Shape& s) { return randn(s, {DType::Float64}).requires_grad_(); };
    Tensor x = leaf({2, 4, 5, 6}), w = leaf({6, 2, 3, 2}), b = leaf({6});
    Tensor xe = x.detach().requires_grad_(), we = w.detach().requires_grad_();
    Tensor be = b.detach().requires_grad_();
    Tensor lc = cf(x, w, b), le = fn(xe, we, be);
    CHECK(lc.item<double>() == Approx(le.item<double>()).epsilon(1e-12));
    lc.backward();
    le.backward();
    CHECK(max_abs_diff(x.grad(), xe.grad()) < 1e-11);
    CHECK(max_abs_diff(w.grad(), we.grad()) < 1e-11);
    CHECK(max_abs_diff(b.grad(), be.grad()) < 1e-11);
  }
  CHECK(cf.compile_count() == 1);
}

TEST_CASE("compile: conv2d and max_pool2d at changing batch sizes equal eager",
          "[compile][conv][dynamic]") {
  manual_seed(8);
  const Tensor w = randn({5, 3, 3, 3});
  auto fn = [&](const Tensor& x) { return max_pool2d(relu(conv2d(x, w, Tensor(), 1, 1)), 2); };
  auto cf = compile(fn);
  for (int64_t n : {2, 3, 5, 4, 7}) {  // (1 would be a specialisation of its own)
    INFO("n " << n);
    Tensor x = randn({n, 3, 8, 8});
    Tensor c = cf(x), e = fn(x);
    REQUIRE(c.shape() == Shape{n, 5, 4, 4});
    CHECK(vec(c) == vec(e));
  }
  INFO(cf.explain());
  CHECK(cf.compile_count() <= 2);  // the static trace, then one dynamic one
}

TEST_CASE("compile: a conv2d training step at changing image sizes equals eager",
          "[compile][conv][dynamic]") {
  // unfold's output and fold's attrs (the backward's) follow the image size: each new size
  // traces again or replays a symbolic trace; either way the values are eager's.
  manual_seed(9);
  auto fn = [](const Tensor& x, const Tensor& w) {
    Tensor y = avg_pool2d(conv2d(x, w, Tensor(), 2, 1), 2);
    Tensor gw = grad({(y * y).sum()}, {w})[0];
    return std::vector<Tensor>{y, gw};
  };
  auto cf = compile(fn);
  const Tensor w = randn({4, 3, 3, 3}).requires_grad_();
  for (int64_t hw : {8, 12, 8, 16, 20}) {
    INFO("image " << hw << "x" << hw);
    Tensor x = randn({2, 3, hw, hw + 4});
    std::vector<Tensor> c = cf(x, w), e = fn(x, w);
    REQUIRE(c[0].shape() == e[0].shape());
    for (size_t i = 0; i < 2; ++i)  // float32 sums in another order: relative to the largest
      CHECK(max_abs_diff(c[i], e[i]) < 1e-5 * (1 + amax(abs(e[i])).item<float>()));
  }
  INFO(cf.explain());
  CHECK(cf.compile_count() <= 4);
}
