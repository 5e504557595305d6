// cat in compiled regions (codegen/lower.cpp LowerCat, ir/decompose.cpp SumOfCats): values and
// gradients against eager, dynamic sizes, bools, and the mixed-dtype cats that stay eager.
#include <catch2/catch.hpp>

#include "kiln/kiln.h"
#include "tracer/util.h"

using namespace kiln;
using kiln::testing::contains;
using kiln::testing::vec;

namespace {
// margin: the k bias's gradient is 0 in exact arithmetic (softmax ignores a shift of a row), a
// few 1e-6 of rounding in eager's order of sums, exactly 0 in the compiled one.
void check_close(const std::vector<float>& got, const std::vector<float>& want) {
  REQUIRE(got.size() == want.size());
  for (size_t j = 0; j < got.size(); ++j) {
    INFO("element " << j);
    CHECK(got[j] == Approx(want[j]).epsilon(1e-5).margin(1e-5));
  }
}
}  // namespace

TEST_CASE("compile: cat along each dim is one compiled region with eager's values and grads",
          "[compile][cat]") {
  for (int64_t dim : {0, 1, -1}) {
    INFO("dim " << dim);
    manual_seed(7);
    Tensor a = randn({3, 4}).requires_grad_(), b = randn({3, 4}).requires_grad_();
    Tensor c = randn({3, 4}).requires_grad_();
    auto f = [&](const Tensor& x) {
      for (Tensor* p : {&a, &b, &c}) p->set_grad(Tensor());
      Tensor y = cat({a * x, exp(b), c + 1.0}, dim);
      Tensor loss = (y * y).sum();
      loss.backward();
      return y.detach();
    };
    auto cf = compile(f);
    Tensor x = randn({3, 4});
    std::vector<float> y = vec(f(x)), ga = vec(a.grad()), gb = vec(b.grad()), gc = vec(c.grad());
    for (int i = 0; i < 3; ++i) {
      check_close(vec(cf(x)), y);
      check_close(vec(a.grad()), ga);
      check_close(vec(b.grad()), gb);
      check_close(vec(c.grad()), gc);
    }
    const std::string ex = cf.explain();
    INFO(ex);
    CHECK_FALSE(contains(ex, "eager op: cat"));
    CHECK(contains(ex, "1 compiled region(s)"));
  }
}

// A stack of many computed tensors (an RNN's states) lowers to one tensor.concat: its compile
// time grew faster than n^3 with a chain of insert_slices (a break-it pass).
TEST_CASE("compile: a stack of 40 RNN states has eager's values and gradients at two batch "
          "sizes", "[compile][cat]") {
  manual_seed(3);
  Tensor w = (randn({6, 6}) * 0.4).requires_grad_();
  auto f = [&](const Tensor& x) {
    w.set_grad(Tensor());
    std::vector<Tensor> hs;
    Tensor h = x;
    for (int t = 0; t < 40; ++t) hs.push_back(h = tanh(h.matmul(w) + 0.1));
    Tensor states = stack(hs, 1);  // [batch, 40, 6]
    Tensor loss = (states * states).mean();
    loss.backward();
    return states.detach();
  };
  auto cf = compile(f);
  for (int64_t batch : {3, 5, 3, 7}) {
    INFO("batch " << batch);
    Tensor x = randn({batch, 6});
    std::vector<float> want = vec(f(x)), want_grad = vec(w.grad());
    check_close(vec(cf(x)), want);
    check_close(vec(w.grad()), want_grad);
  }
  const std::string ex = cf.explain();
  INFO(ex);
  CHECK_FALSE(contains(ex, "eager op: stack"));
  CHECK_FALSE(contains(ex, "eager op: cat"));
}

TEST_CASE("compile: cat with a dynamic batch dim, joined along it and along another dim",
          "[compile][cat][dynamic]") {
  auto f = [](const Tensor& x, const Tensor& y) {
    Tensor rows = cat({x * 2.0, y}, 0);  // [n + m, 3]
    Tensor cols = cat({x, x - 1.0}, 1);  // [n, 6]
    return rows.sum() + kiln::sum(cols, {0}).sum() * 0.5;
  };
  auto cf = compile(f);
  manual_seed(2);
  for (int64_t n : {4, 6, 9, 5}) {
    INFO("n " << n);
    Tensor x = randn({n, 3}), y = randn({n + 1, 3});
    CHECK(cf(x, y).item<float>() == Approx(f(x, y).item<float>()).epsilon(1e-5));
  }
  INFO(cf.explain());
  CHECK(cf.compile_count() <= 2);  // the static trace, then one dynamic one
}

TEST_CASE("compile: a cat of mixed dtypes stays eager, a cat of bools compiles",
          "[compile][cat]") {
  auto f = [](const Tensor& x, const Tensor& i, const Tensor& m) {
    Tensor promoted = cat({x * 2.0, i}, 0);    // float32 and int64: float32, eager
    Tensor mask = cat({m, logical_not(m)}, 0);  // bool, compiled
    return where(mask, promoted + 1.0, 0.0);
  };
  auto cf = compile(f);
  Tensor x = from_vector<float>({1.5f, -2}, {2});
  Tensor i = from_vector<int64_t>({3, 4}, {2});
  Tensor m = from_vector<bool>({true, false}, {2});
  const std::vector<float> want = {4, 0, 0, 5};
  CHECK(vec(f(x, i, m)) == want);
  for (int k = 0; k < 3; ++k) CHECK(vec(cf(x, i, m)) == want);
  const std::string ex = cf.explain();
  INFO(ex);
  size_t eager_cats = 0;
  for (size_t at = 0; (at = ex.find("eager op: cat", at)) != std::string::npos; ++at) ++eager_cats;
  CHECK(eager_cats == 1);
}

// q, k and v weights as slices of one [3E, E] weight (MultiheadAttention's in-projection):
// autograd pads each slice's gradient to the whole weight with cat and sums the three; in the
// compiled step that is one cat of the three slice gradients.
TEST_CASE("compile: gradients of slices of one weight are summed as one cat",
          "[compile][cat][autograd]") {
  manual_seed(4);
  Tensor w = randn({6, 4}).requires_grad_();
  Tensor bias = randn({6}).requires_grad_();
  auto f = [&](const Tensor& x) {
    w.set_grad(Tensor());
    bias.set_grad(Tensor());
    Tensor q = linear(x, w.slice(0, 0, 2), bias.slice(0, 0, 2));
    Tensor k = linear(x, w.slice(0, 2, 4), bias.slice(0, 2, 4));
    Tensor v = linear(x, w.slice(0, 4, 6), bias.slice(0, 4, 6));
    Tensor loss = (softmax(matmul(q, k.t()), -1).matmul(v) * v).sum();
    loss.backward();
    return loss.detach();
  };
  auto cf = compile(f);
  Tensor x = randn({5, 4});
  const float loss = f(x).item<float>();
  std::vector<float> gw = vec(w.grad()), gb = vec(bias.grad());
  for (int i = 0; i < 3; ++i) {
    CHECK(cf(x).item<float>() == Approx(loss).epsilon(1e-5));
    check_close(vec(w.grad()), gw);
    check_close(vec(bias.grad()), gb);
  }
  const std::string ex = cf.explain();
  INFO(ex);
  CHECK_FALSE(contains(ex, "eager op:"));
  CHECK(contains(ex, "1 compiled region(s)"));
}
