// isnan / isinf / isfinite / isclose / allclose / equal: PyTorch's documented examples and
// the edge values (infinities, NaN, integers, broadcasting, errors).
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <vector>

#include "kiln/kiln.h"

using namespace kiln;
using B = std::vector<bool>;

namespace {
constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
B bools(const Tensor& t) {
  REQUIRE(t.dtype() == DType::Bool);
  return t.to_vector<bool>();
}
}  // namespace

TEST_CASE("isnan, isinf, isfinite") {
  Tensor x = tensor({1.f, kInf, -kInf, kNaN, 0.f, -3.5f});
  CHECK(bools(kiln::isnan(x)) == B{false, false, false, true, false, false});
  CHECK(bools(kiln::isinf(x)) == B{false, true, true, false, false, false});
  CHECK(bools(kiln::isfinite(x)) == B{true, false, false, false, true, true});
  Tensor i = tensor({1, -2, 3});
  CHECK(bools(kiln::isnan(i)) == B{false, false, false});
  CHECK(bools(kiln::isinf(i)) == B{false, false, false});
  CHECK(bools(kiln::isfinite(i)) == B{true, true, true});
  CHECK(bools(kiln::isfinite(tensor({true, false}))) == B{true, true});
}

TEST_CASE("isclose and allclose: PyTorch's examples and edge values") {
  // torch.isclose / torch.allclose documentation.
  Tensor a = tensor({10000.0, 1e-07}), b = tensor({10000.1, 1e-08});
  CHECK(bools(isclose(a, b)) == B{true, false});
  CHECK_FALSE(allclose(a, b));
  Tensor c = tensor({10000.0, 1e-08}), d = tensor({10000.1, 1e-09});
  CHECK(bools(isclose(c, d)) == B{true, true});
  CHECK(allclose(c, d));
  Tensor n = tensor({1.f, kNaN});
  CHECK(bools(isclose(n, n)) == B{true, false});
  CHECK(bools(isclose(n, n, 1e-5, 1e-8, /*equal_nan=*/true)) == B{true, true});
  CHECK_FALSE(allclose(n, n));
  CHECK(allclose(n, n, 1e-5, 1e-8, true));
  // Infinities: close only to the same infinity.
  Tensor inf = tensor({kInf, kInf, -kInf, kInf});
  Tensor other = tensor({kInf, -kInf, -kInf, 3e38f});
  CHECK(bools(isclose(inf, other)) == B{true, false, true, false});
  // The tolerance is relative to b: |a - b| <= atol + rtol |b|.
  CHECK(bools(isclose(tensor({1.0}), tensor({2.0}), 0.5, 0.0)) == B{true});
  CHECK(bools(isclose(tensor({2.0}), tensor({1.0}), 0.5, 0.0)) == B{false});
  // Broadcasting, integers (as float64), mixed dtypes.
  CHECK(bools(isclose(tensor({{1.f, 2.f}, {3.f, 1.f}}), tensor({1.f}))) ==
        B{true, false, false, true});
  CHECK(bools(isclose(tensor({3, 4}), tensor({3, 5}))) == B{true, false});
  CHECK(bools(isclose(tensor({true, false}), tensor({true, true}))) == B{true, false});
  CHECK(allclose(tensor({1, 2}), tensor({1.f, 2.f})));
  // Review: int64 beyond 2^53 compared through float64, where 2^53 + 1 rounds to 2^53.
  const int64_t big = int64_t{1} << 53;
  Tensor i = tensor<int64_t>({big, big + 1});
  Tensor j = tensor<int64_t>({big + 1, big + 1});
  CHECK(bools(isclose(i, j, 0.0, 0.0)) == B{false, true});
  CHECK_FALSE(allclose(i, j, 0.0, 0.0));
  CHECK(bools(isclose(i, j, 0.0, 1.0)) == B{true, true});
  CHECK(bools(isclose(tensor({3, -4}), tensor({5, -5}), 0.2, 0.0)) == B{false, true});
  // The int64 difference of the extremes would overflow (and wrap to "close").
  const int64_t top = std::numeric_limits<int64_t>::max();
  CHECK(bools(isclose(tensor<int64_t>({top, top}), tensor<int64_t>({-1, top - 1}), 0.0, 1.0)) ==
        B{false, true});
  // Errors name isclose and the shapes.
  CHECK_THROWS_WITH(isclose(ones({2, 3}), ones({4})),
                    Catch::Contains("isclose") && Catch::Contains("[2, 3]"));
  CHECK_THROWS_WITH(allclose(ones({2}), ones({2}), -1.0), Catch::Contains("rtol (-1)"));
}

TEST_CASE("equal: same shape and equal elements") {
  CHECK(equal(tensor({1.f, 2.f}), tensor({1.f, 2.f})));
  CHECK_FALSE(equal(tensor({1.f, 2.f}), tensor({1.f, 2.5f})));
  CHECK_FALSE(equal(tensor({1.f, 2.f}), tensor({{1.f, 2.f}})));  // shapes differ: not broadcast
  CHECK_FALSE(equal(tensor({kNaN}), tensor({kNaN})));
  CHECK(equal(zeros({0}), zeros({0})));
  CHECK(equal(tensor({1, 2}), tensor({1.0, 2.0})));
}

TEST_CASE("max / min: of all elements, and values with indices along a dim") {
  Tensor x = tensor({{3.f, 7.f, 7.f}, {-1.f, -5.f, 2.f}});
  CHECK(kiln::max(x).item<float>() == 7.f);
  CHECK(kiln::min(x).item<float>() == -5.f);
  CHECK(kiln::max(x).dim() == 0);
  CHECK(std::isnan(kiln::max(tensor({1.f, kNaN, 3.f})).item<float>()));
  auto [values, indices] = kiln::max(x, 1);
  CHECK(values.to_vector<float>() == std::vector<float>{7.f, 2.f});
  CHECK(indices.to_vector<int64_t>() == std::vector<int64_t>{1, 2});  // the first of the tied 7s
  CHECK(indices.dtype() == DType::Int64);
  auto [mins, at] = kiln::min(x, 0, /*keepdim=*/true);
  CHECK(mins.shape() == Shape{1, 3});
  CHECK(mins.to_vector<float>() == std::vector<float>{-1.f, -5.f, 2.f});
  CHECK(at.to_vector<int64_t>() == std::vector<int64_t>{1, 1, 1});
  // The gradient goes to the chosen element only (amax would split it between the tied 7s).
  Tensor w = x.detach().requires_grad_();
  kiln::max(w, 1).values.sum().backward();
  CHECK(w.grad().to_vector<float>() == std::vector<float>{0, 1, 0, 0, 0, 1});
  CHECK_THROWS_WITH(kiln::max(zeros({0})), Catch::StartsWith("kiln::max:") &&
                                                !Catch::Contains("amax"));
  CHECK_THROWS_WITH(kiln::max(x, 2), Catch::StartsWith("kiln::max:"));
  // bool along a dim, as PyTorch (argmax alone has no bool kernel there either; review).
  Tensor b = tensor({{false, true, true}, {false, false, false}});
  auto [any_true, first] = kiln::max(b, 1);
  CHECK(any_true.dtype() == DType::Bool);
  CHECK(any_true.to_vector<bool>() == std::vector<bool>{true, false});
  CHECK(first.to_vector<int64_t>() == std::vector<int64_t>{1, 0});
  auto [all_true, where_false] = kiln::min(b, 0);
  CHECK(all_true.to_vector<bool>() == std::vector<bool>{false, false, false});
  CHECK(where_false.to_vector<int64_t>() == std::vector<int64_t>{0, 1, 1});
}
