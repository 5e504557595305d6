// Fault cases (../shared/cases/fault-cases.md) through compile(); the rest of the compile()
// cases are in compile_test.cpp and autograd_test.cpp under their ids.
#include <catch2/catch.hpp>

#include <cmath>
#include <thread>

#include "kiln/kiln.h"
#include "tracer/util.h"

using namespace kiln;
using kiln::testing::contains;
using kiln::testing::vec;


TEST_CASE("FC-02 (compile): NaN kept by max / argmax") {
  auto f = compile([](const Tensor& x) { return std::make_pair(amax(x, {}, false), argmax(x)); });
  for (int i = 0; i < 2; ++i) {
    auto [m, a] = f(from_vector<float>({1, NAN, 3}, {3}));
    CHECK(std::isnan(m.item<float>()));
    CHECK(a.item<int64_t>() == 1);
  }
}

TEST_CASE("FC-23 (compile): reduction over a zero-size tensor, then reshape") {
  auto f = compile([](const Tensor& x) { return x.sum({1}).view({1, 0}); });
  for (int i = 0; i < 2; ++i) {
    Tensor y = f(zeros({0, 3}));
    CHECK(y.shape() == Shape{1, 0});
  }
  auto g = compile([](const Tensor& x) { return x.sum() + 1.0; });
  for (int i = 0; i < 2; ++i) CHECK(g(zeros({0, 4})).item<float>() == 1);
}

TEST_CASE("FC-25 (compile): flatten(contiguous(transpose(x))) has fresh strides") {
  auto p = compile([](const Tensor& x) { return x.transpose(0, 1).contiguous().flatten(); });
  Tensor x = from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  for (int i = 0; i < 2; ++i) CHECK(vec(p(x)) == std::vector<float>{1, 4, 2, 5, 3, 6});
}

TEST_CASE("FC-27 (compile): out-of-range embedding index raises in both modes") {
  Tensor w = from_vector<float>({10, 20, 30, 40, 50, 60, 70, 80}, {4, 2});
  auto e = compile([](const Tensor& w, const Tensor& i) { return embedding(w, i) * 1.0; });
  CHECK(vec(e(w, from_vector<int64_t>({2, 1}, {2}))) == std::vector<float>{50, 60, 30, 40});
  for (int k = 0; k < 2; ++k) {
    try {
      e(w, from_vector<int64_t>({2, -2}, {2}));
      FAIL("expected an error");
    } catch (const Error& err) {
      CHECK(std::string(err.what()).find("-2") != std::string::npos);
    }
  }
}

TEST_CASE("FC-29 (compile): per-call options do not leak between threads") {
  auto cf = compile([](const Tensor& x) { return x * x; }, {.dynamic = Dynamic::Never});
  std::atomic<int> wrong{0};
  auto worker = [&](int parity) {
    for (int i = 0; i < 20; ++i) {
      Tensor x = randn({2 * i + parity});
      std::vector<float> xs = vec(x), ys = vec(cf(x));
      for (size_t k = 0; k < xs.size(); ++k)
        if (ys[k] != xs[k] * xs[k]) ++wrong;
    }
  };
  std::thread a(worker, 0), b(worker, 1);
  a.join(), b.join();
  CHECK(wrong == 0);
  CHECK(cf.cache_entries() <= cf.options().cache_size_limit);
  CHECK(cf.explain().find("dynamic never") != std::string::npos);
  CHECK(cf.explain().find(">=2") == std::string::npos);  // no symbolic variant
}

TEST_CASE("FC-32 (compile): a shape sweep keeps the cache bounded and results correct") {
  auto cf = compile([](const Tensor& x, const Tensor& y) { return mean(matmul(x.t(), y)); });
  for (int64_t k = 1; k <= 300; ++k) {
    Tensor x = randn({8, k}), y = randn({8, k});
    double want = mean(matmul(x.t(), y)).item<double>();
    REQUIRE(cf(x, y).item<double>() == Approx(want).margin(1e-5).epsilon(1e-4));
  }
  INFO(cf.explain());
  CHECK(cf.cache_entries() <= cf.options().cache_size_limit);
  CHECK(cf.compile_count() <= 4);
}

TEST_CASE("FC-34 (compile): an unrolled (a+b, a-b) chain of 40 steps") {
  auto f = compile([](Tensor a, Tensor b) {
    for (int i = 0; i < 40; ++i) {
      Tensor s = a + b, d = a - b;
      a = s, b = d;
    }
    return std::make_pair(a, b);
  });
  for (int i = 0; i < 2; ++i) {
    auto [a, b] = f(from_vector<float>({1}, {1}), from_vector<float>({0}, {1}));
    CHECK(a.item<float>() == 1048576.0f);
    CHECK(b.item<float>() == 0.0f);
  }
}
