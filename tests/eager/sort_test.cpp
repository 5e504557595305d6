// argsort / sort / topk and cumsum against independent references: std::stable_sort of copied
// lines (NaN the largest value), running sums in float64 / int64 by index arithmetic.
#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "backends/cpu/parallel.h"
#include "error_of.h"
#include "gradcheck.h"
#include "kiln/kiln.h"

using namespace kiln;

namespace {
using L = std::vector<int64_t>;
using D = std::vector<double>;

// x's lines along dim d as [outer, n, inner] blocks of its row-major values (as float64:
// exact for every dtype the tests use).
struct Lines {
  int64_t outer = 1, n = 1, inner = 1;
  D values;
  D line(int64_t a, int64_t c) const {
    D v;
    for (int64_t j = 0; j < n; ++j) v.push_back(values[(a * n + j) * inner + c]);
    return v;
  }
};
Lines lines_of(const Tensor& x, int d) {
  Lines l;
  for (int i = 0; i < d; ++i) l.outer *= x.shape()[i];
  l.n = x.dim() ? x.shape()[d] : 1;
  for (int i = d + 1; i < x.dim(); ++i) l.inner *= x.shape()[i];
  l.values = x.to(DType::Float64).contiguous().to_vector<double>();
  return l;
}

// The indices of a line in PyTorch's stable order: NaN the largest value.
L stable_order(const D& v, bool descending) {
  L idx(v.size());
  std::iota(idx.begin(), idx.end(), 0);
  auto less = [](double a, double b) { return !std::isnan(a) && (std::isnan(b) || a < b); };
  std::stable_sort(idx.begin(), idx.end(), [&](int64_t i, int64_t j) {
    return descending ? less(v[j], v[i]) : less(v[i], v[j]);
  });
  return idx;
}

// The expected indices and values of topk(x, k, d, largest) (k = -1: sort) in the result's
// row-major order, by sorting copied lines.
struct Expected {
  L indices;
  D values;
};
Expected expected_sort(const Tensor& x, int d, bool descending, int64_t k = -1) {
  const Lines l = lines_of(x, d);
  const int64_t kk = k < 0 ? l.n : k;
  Expected e;
  e.indices.resize(static_cast<size_t>(l.outer * kk * l.inner));
  e.values.resize(e.indices.size());
  for (int64_t a = 0; a < l.outer; ++a)
    for (int64_t c = 0; c < l.inner; ++c) {
      const D v = l.line(a, c);
      const L order = stable_order(v, descending);
      for (int64_t j = 0; j < kk; ++j) {
        const size_t at = static_cast<size_t>((a * kk + j) * l.inner + c);
        e.indices[at] = order[static_cast<size_t>(j)];
        e.values[at] = v[static_cast<size_t>(order[static_cast<size_t>(j)])];
      }
    }
  return e;
}

// NaN equal to NaN; -0 and +0 told apart (a value moved, never recomputed).
bool same_values(const D& a, const D& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) && std::isnan(b[i])) continue;
    if (a[i] != b[i] || std::signbit(a[i]) != std::signbit(b[i])) return false;
  }
  return true;
}

D values_of(const Tensor& t) { return t.to(DType::Float64).contiguous().to_vector<double>(); }

// Small integers with many ties, NaNs and infinities among them, ±0.
Tensor tied_values(const Shape& shape, DType dtype, uint64_t seed) {
  manual_seed(seed);
  Tensor x = randint(-3, 4, shape, {DType::Int64}).to(DType::Float64);
  D v = x.to_vector<double>();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  for (size_t i = 0; i < v.size(); ++i) {
    if (v[i] == 0 && i % 2) v[i] = -0.0;
    if (!is_floating(dtype)) continue;
    if (i % 11 == 3) v[i] = nan;
    if (i % 13 == 5) v[i] = -nan;  // a NaN with the sign bit set sorts as the largest too
    if (i % 17 == 7) v[i] = i % 2 ? inf : -inf;
  }
  return from_vector(v, shape).to(dtype);
}

}  // namespace

TEST_CASE("argsort / sort / topk: PyTorch's stable order along every dim, NaN the largest, "
          "ties by index, non-contiguous input, any thread count", "[sort]") {
  const int saved = cpu::num_threads();
  for (DType dtype : {DType::Float32, DType::Float64, DType::Int32, DType::Int64}) {
    const Tensor x = tied_values({4, 9, 5}, dtype, 3);
    // The same values through a transpose: strided along every dim.
    const Tensor xt = x.transpose(0, 2).contiguous().transpose(0, 2);
    REQUIRE_FALSE(xt.is_contiguous());
    for (int threads : {1, 3}) {
      cpu::set_num_threads(threads);
      for (int64_t dim : {0, 1, 2, -1, -2}) {
        const int d = static_cast<int>(dim < 0 ? dim + 3 : dim);
        for (bool descending : {false, true}) {
          INFO(name(dtype) << " threads " << threads << " dim " << dim << " descending "
                           << descending);
          const Expected want = expected_sort(x, d, descending);
          const Tensor idx = argsort(x, dim, descending);
          CHECK(idx.dtype() == DType::Int64);
          CHECK(idx.shape() == x.shape());
          CHECK(idx.to_vector<int64_t>() == want.indices);
          auto [values, indices] = sort(xt, dim, descending);
          CHECK(values.dtype() == dtype);
          CHECK(indices.to_vector<int64_t>() == want.indices);
          CHECK(same_values(values_of(values), want.values));
          CHECK(xt.argsort(dim, descending).to_vector<int64_t>() == want.indices);
          for (int64_t k : {int64_t{0}, int64_t{1}, int64_t{3}, x.shape()[d]}) {
            INFO("k " << k);
            const Expected top = expected_sort(x, d, descending, k);
            auto [tv, ti] = topk(xt, k, dim, /*largest=*/descending);
            Shape want_shape = x.shape();
            want_shape[d] = k;
            CHECK(tv.shape() == want_shape);
            CHECK(ti.to_vector<int64_t>() == top.indices);
            CHECK(same_values(values_of(tv), top.values));
          }
        }
      }
    }
  }
  cpu::set_num_threads(saved);
}

TEST_CASE("argsort / topk: extreme values, bool, long lines and many lines", "[sort]") {
  // int32 / int64 extremes (the kernel's keys flip the sign bit), float64 ±0, ±inf, denormals.
  const int32_t i32min = std::numeric_limits<int32_t>::min();
  const int32_t i32max = std::numeric_limits<int32_t>::max();
  CHECK(argsort(from_vector<int32_t>({i32max, -1, i32min, 0, i32min, 1}, {6}))
            .to_vector<int64_t>() == L{2, 4, 1, 3, 5, 0});
  const int64_t i64min = std::numeric_limits<int64_t>::min();
  const int64_t i64max = std::numeric_limits<int64_t>::max();
  CHECK(argsort(from_vector<int64_t>({i64max, -1, i64min, 0, i64max}, {5}), 0, true)
            .to_vector<int64_t>() == L{0, 4, 3, 1, 2});
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const Tensor f = from_vector<double>({0.0, -0.0, 4.9e-324, -inf, nan, inf, -4.9e-324, -0.0},
                                       {8});
  CHECK(argsort(f).to_vector<int64_t>() == L{3, 6, 0, 1, 7, 2, 5, 4});
  CHECK(argsort(f, 0, true).to_vector<int64_t>() == L{4, 5, 2, 0, 1, 7, 6, 3});
  // In float32 ±4.9e-324 round to ±0: five zeros in index order.
  CHECK(argsort(f.to(DType::Float32)).to_vector<int64_t>() == L{3, 0, 1, 2, 6, 7, 5, 4});
  // topk with NaNs: largest takes them first (in index order), smallest last.
  auto [big, big_at] = topk(from_vector<float>({1, NAN, 3, NAN, 2}, {5}), 3);
  CHECK(big_at.to_vector<int64_t>() == L{1, 3, 2});
  CHECK(std::isnan(big.to_vector<float>()[0]));
  CHECK(big.to_vector<float>()[2] == 3.f);
  auto [small, small_at] = topk(from_vector<float>({1, NAN, 3, NAN, 2}, {5}), 4, -1, false);
  CHECK(small_at.to_vector<int64_t>() == L{0, 4, 2, 1});
  // bool: false < true, stable.
  const Tensor b = from_vector(std::vector<bool>{true, false, true, false}, {4});
  CHECK(argsort(b).to_vector<int64_t>() == L{1, 3, 0, 2});
  auto [bv, bi] = sort(b, 0, true);
  CHECK(bi.to_vector<int64_t>() == L{0, 2, 1, 3});
  CHECK(bv.to_vector<bool>() == std::vector<bool>{true, true, false, false});
  CHECK(topk(b, 1).indices.to_vector<int64_t>() == L{0});
  // Vocabulary-sized rows (the kernel's radix sort and top-k heap) and many short rows, split
  // across threads: equal to the reference. int32: many ties.
  const int saved = cpu::num_threads();
  for (DType dtype : {DType::Float32, DType::Float64, DType::Int32}) {
    for (const Shape& shape : {Shape{3, 40000}, Shape{3000, 7}}) {
      manual_seed(4);
      const Tensor x = (randn(shape) * 1000).to(dtype);
      const int64_t k = std::min<int64_t>(10, shape[1] - 2);
      const Expected want = expected_sort(x, 1, true, k);
      const Expected all = expected_sort(x, 1, false);
      for (int threads : {1, 2}) {
        cpu::set_num_threads(threads);
        INFO(name(dtype) << " " << to_string(shape) << " threads " << threads);
        auto [v, i] = topk(x, k, 1);
        CHECK(i.to_vector<int64_t>() == want.indices);
        CHECK(same_values(values_of(v), want.values));
        CHECK(argsort(x, 1).to_vector<int64_t>() == all.indices);
      }
    }
  }
  cpu::set_num_threads(saved);
}

TEST_CASE("argsort / sort / topk: 0-d and 0-size inputs, as PyTorch", "[sort]") {
  const Tensor s = scalar_tensor(2.5);
  for (int64_t dim : {0, -1}) {
    auto [v, i] = sort(s, dim);
    CHECK(v.dim() == 0);
    CHECK(i.dim() == 0);
    CHECK(v.item<double>() == 2.5);
    CHECK(i.item<int64_t>() == 0);
    CHECK(argsort(s, dim, true).item<int64_t>() == 0);
    for (int64_t k : {0, 1}) {  // PyTorch: a 0-d input has one element; k 0 or 1 gives it
      auto [tv, ti] = topk(s, k, dim);
      CHECK(tv.dim() == 0);
      CHECK(tv.item<double>() == 2.5);
      CHECK(ti.item<int64_t>() == 0);
    }
  }
  auto [ev, ei] = sort(zeros({0, 3}), 0);
  CHECK(ev.shape() == Shape{0, 3});
  CHECK(ei.shape() == Shape{0, 3});
  CHECK(argsort(zeros({3, 0}), 1).shape() == Shape{3, 0});
  CHECK(argsort(zeros({3, 0}), 0).shape() == Shape{3, 0});
  auto [tv, ti] = topk(zeros({0, 4}), 2);
  CHECK(tv.shape() == Shape{0, 2});
  CHECK(topk(zeros({3, 0}), 0).indices.shape() == Shape{3, 0});
  CHECK(topk(ones({2, 5}), 0).values.shape() == Shape{2, 0});
}

TEST_CASE("sort / topk values: gradients through gather by finite differences; argsort and "
          "the indices do not require grad", "[sort][autograd]") {
  using kiln::testing::gradcheck;
  using kiln::testing::uniform;
  // Distinct values (finite differences must not reorder them).
  gradcheck([](const std::vector<Tensor>& in) { return sort(in[0], 1).values; },
            {uniform({3, 6}, -1, 1, 21)});
  gradcheck([](const std::vector<Tensor>& in) { return sort(in[0].t(), 0, true).values; },
            {uniform({4, 5}, -1, 1, 22)});
  gradcheck([](const std::vector<Tensor>& in) { return topk(in[0], 2, 0).values; },
            {uniform({5, 3}, -1, 1, 23)});
  gradcheck([](const std::vector<Tensor>& in) { return topk(in[0], 3, -1, false).values; },
            {uniform({2, 7}, -1, 1, 24)});
  // The gradient of sort's values lands where each value came from.
  Tensor x = from_vector<float>({3, 1, 2}, {3}).requires_grad_();
  auto [v, i] = sort(x);
  CHECK(v.requires_grad());
  CHECK_FALSE(i.requires_grad());
  CHECK_FALSE(argsort(x).requires_grad());
  (v * from_vector<float>({10, 20, 30}, {3})).sum().backward();
  CHECK(x.grad().to_vector<float>() == std::vector<float>{30, 10, 20});
}

namespace {
// Running sums along dim d by index arithmetic, in float64 (floats) or int64 (integers).
D cumsum_by_hand(const Tensor& x, int d, bool integer) {
  const Lines l = lines_of(x, d);
  D out(l.values.size());
  for (int64_t a = 0; a < l.outer; ++a)
    for (int64_t c = 0; c < l.inner; ++c) {
      double sum = 0;
      int64_t isum = 0;
      for (int64_t j = 0; j < l.n; ++j) {
        const size_t at = static_cast<size_t>((a * l.n + j) * l.inner + c);
        sum += l.values[at];
        isum += static_cast<int64_t>(l.values[at]);
        out[at] = integer ? static_cast<double>(isum) : sum;
      }
    }
  return out;
}
}  // namespace

TEST_CASE("cumsum: running sums along every dim against float64 / int64 references; int and "
          "bool give int64; 0-d and 0-size", "[cumsum]") {
  manual_seed(8);
  const Tensor f64 = randn({5, 6, 4}, {DType::Float64}) * 100;
  const Tensor f32 = randn({5, 6, 4}) * 100;
  const int saved = cpu::num_threads();
  for (int threads : {1, 3}) {
    cpu::set_num_threads(threads);
    for (int64_t dim : {0, 1, 2, -1, -3}) {
      INFO("threads " << threads << " dim " << dim);
      const int d = static_cast<int>(dim < 0 ? dim + 3 : dim);
      // float64: sequential sums, the reference's own order: bit for bit.
      CHECK(values_of(cumsum(f64, dim)) == cumsum_by_hand(f64, d, false));
      // float32: summed in float64, each result rounded once (as PyTorch's CPU kernel).
      const D exact = cumsum_by_hand(f32, d, false);
      std::vector<float> rounded(exact.begin(), exact.end());
      const Tensor c32 = cumsum(f32, dim);
      CHECK(c32.dtype() == DType::Float32);
      CHECK(c32.to_vector<float>() == rounded);
      // Non-contiguous input: the same sums.
      const Tensor t = f32.transpose(0, 2).contiguous().transpose(0, 2);
      CHECK(t.cumsum(dim).to_vector<float>() == rounded);
    }
  }
  cpu::set_num_threads(saved);
  // The rounding bound that follows, over a long float32 row: within half an ulp of the exact
  // sum, where float32 accumulation drifts by many ulps.
  const std::vector<float> c = cumsum(full({1, 1 << 20}, 0.1f), 1).to_vector<float>();
  auto ulp = [](double v) {
    return double(std::nextafter(float(v), INFINITY)) - double(float(v));
  };
  double sum = 0, worst = 0;  // the largest |error| in ulps
  float naive = 0;
  for (size_t j = 0; j < c.size(); ++j) {
    sum += double(0.1f);
    naive += 0.1f;
    worst = std::max(worst, std::fabs(c[j] - sum) / ulp(sum));
  }
  CHECK(worst <= 0.5);
  CHECK(std::fabs(naive - sum) > 10 * ulp(sum));
  // Integers and bool: int64 results, exact; int32 sums past int32's range.
  const Tensor i32 = from_vector<int32_t>({2147483647, 2147483647, -5, 7}, {2, 2});
  const Tensor ci = cumsum(i32, 0);
  CHECK(ci.dtype() == DType::Int64);
  CHECK(ci.to_vector<int64_t>() == L{2147483647, 2147483647, 2147483642, 2147483654});
  CHECK(cumsum(i32, 1).to_vector<int64_t>() == L{2147483647, 4294967294, -5, 2});
  const Tensor b = from_vector(std::vector<bool>{true, false, true, true}, {4});
  CHECK(cumsum(b, 0).dtype() == DType::Int64);
  CHECK(cumsum(b, 0).to_vector<int64_t>() == L{1, 1, 2, 3});
  CHECK(cumsum(b, 0, DType::Float64).to_vector<double>() == D{1, 1, 2, 3});
  CHECK(cumsum(from_vector<int64_t>({5, -7, 3}, {3}), -1).to_vector<int64_t>() == L{5, -2, 1});
  // 0-d: itself; 0-size: empty.
  CHECK(cumsum(scalar_tensor(4.5), 0).item<double>() == 4.5);
  CHECK(cumsum(scalar_tensor(4.5), -1).dim() == 0);
  CHECK(cumsum(zeros({0, 3}), 0).shape() == Shape{0, 3});
  CHECK(cumsum(zeros({3, 0}), 0).shape() == Shape{3, 0});
  CHECK(cumsum(zeros({3, 0}, {DType::Int32}), 1).dtype() == DType::Int64);
}

TEST_CASE("cumsum: gradient (a reverse running sum) by finite differences, and exactly for "
          "float32", "[cumsum][autograd]") {
  using kiln::testing::gradcheck;
  using kiln::testing::uniform;
  gradcheck([](const std::vector<Tensor>& in) { return cumsum(in[0], 1); },
            {uniform({3, 5}, -1, 1, 31)});
  gradcheck([](const std::vector<Tensor>& in) { return cumsum(in[0].t(), 0); },
            {uniform({4, 3}, -1, 1, 32)});
  gradcheck([](const std::vector<Tensor>& in) { return cumsum(cumsum(in[0], -1), 0) * in[0]; },
            {uniform({3, 4}, -1, 1, 33)});
  // Second order: f = Σ cumsum(x²) has df/dx_j = 2 x_j (n - j), and d(Σ w·df/dx)/dx_j =
  // 2 w_j (n - j), through the backward's own (reverse) cumsum.
  const Tensor x2 = from_vector<double>({0.5, -1.5, 2.0, 3.0}, {4}).requires_grad_();
  const Tensor g = grad({cumsum(x2 * x2, 0).sum()}, {x2}, {}, /*create_graph=*/true)[0];
  CHECK(g.to_vector<double>() == D{4 * 1.0, 3 * -3.0, 2 * 4.0, 1 * 6.0});
  const Tensor w = from_vector<double>({1, 10, 100, 1000}, {4});
  CHECK(grad({(g * w).sum()}, {x2})[0].to_vector<double>() == D{8, 60, 400, 2000});
  Tensor x = zeros({4}).requires_grad_();
  cumsum(x, 0).backward(from_vector<float>({1, 2, 3, 4}, {4}));
  CHECK(x.grad().to_vector<float>() == std::vector<float>{10, 9, 7, 4});
}

TEST_CASE("argsort / sort / topk / cumsum: errors name the op, the values and the caller's "
          "line", "[sort][cumsum]") {
  const Tensor x = zeros({4, 3});
  // Each message also names the input: "(got float32 [4, 3])".
  auto check = [&](const std::function<void()>& f, const char* op, const std::string& says,
                   unsigned line) {
    kiln::testing::check_error(f, op, says, line);
    CHECK_THAT(kiln::testing::error_of(f).message(), Catch::Contains("float32 [4, 3]"));
  };
  check([&] { argsort(x, 2); }, "argsort", "out of range", __LINE__);
  check([&] { x.argsort(-3, true); }, "argsort", "out of range", __LINE__);
  check([&] { sort(x, 5); }, "sort", "out of range", __LINE__);
  check([&] { topk(x, 4); }, "topk", "k (4) is out of range for dim 1 of size 3", __LINE__);
  check([&] { x.topk(5, 0); }, "topk", "k (5) is out of range for dim 0 of size 4", __LINE__);
  check([&] { topk(x, -1); }, "topk", "k (-1) must not be negative", __LINE__);
  check([&] { topk(x, 1, 2); }, "topk", "out of range", __LINE__);
  check([&] { cumsum(x, 2); }, "cumsum", "out of range", __LINE__);
  check([&] { x.cumsum(-3); }, "cumsum", "out of range", __LINE__);
  const Error e = kiln::testing::error_of([] { topk(scalar_tensor(1.0), 2); });
  CHECK_THAT(e.message(), Catch::Contains("k (2) is out of range for dim 0 of size 1"));
  CHECK(kiln::testing::error_of([] { sort(Tensor()); }).op() == "sort");
}
