// Compiled counterparts of eager edge cases (tests/eager): empty matrices in tril, host values
// that overflow the tensor's dtype — on the first call and on replays with a new value.
#include <catch2/catch.hpp>

#include <cmath>

#include "kiln/kiln.h"

using namespace kiln;

TEST_CASE("compile: tril of a matrix with no columns", "[compile][edge]") {
  auto f = compile([](const Tensor& x) { return tril(x) + 1.0; });
  for (int call = 0; call < 2; ++call) CHECK(f(zeros({3, 0})).shape() == Shape{3, 0});
}

TEST_CASE("compile: masked_fill with a value that overflows int32 raises on replay too",
          "[compile][edge]") {
  Tensor x = tensor({1, 2, -3});
  auto f = compile([](const Tensor& t, double v) { return masked_fill(t, t > 0, v); });
  CHECK(f(x, 7.0).to_vector<int64_t>() == std::vector<int64_t>{7, 7, -3});
  CHECK(f(x, 8.0).to_vector<int64_t>() == std::vector<int64_t>{8, 8, -3});  // symbolic value
  CHECK(f(x, 9.0).to_vector<int64_t>() == std::vector<int64_t>{9, 9, -3});
  CHECK_THROWS_WITH(f(x, 1e20), Catch::Contains("without overflow"));  // stored INT_MIN
  CHECK(f(x, 10.0).to_vector<int64_t>() == std::vector<int64_t>{10, 10, -3});
}

TEST_CASE("sign(-0.0) is +0.0 eagerly and compiled (PyTorch)", "[compile][edge]") {
  Tensor x = tensor({-0.0f, 0.0f, NAN, -2.0f, 3.0f});
  auto f = compile([](const Tensor& t) { return sign(t) * 1.0f; });
  for (const Tensor& y : {sign(x), f(x), f(x), f(x)}) {
    std::vector<float> v = y.to_vector<float>();
    CHECK(v[0] == 0.0f);
    CHECK_FALSE(std::signbit(v[0]));  // 1 / sign(-0.0) is +inf in PyTorch
    CHECK(std::isnan(v[2]));
    CHECK(v[3] == -1.0f);
    CHECK(v[4] == 1.0f);
  }
}
