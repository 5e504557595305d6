// Random ops: the Philox counter layout (the contract compiled code follows), determinism,
// thread-count independence and distribution checks.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <numbers>
#include <set>
#include <vector>

#include "backends/cpu/parallel.h"
#include "core/philox.h"
#include "eager/dispatch.h"
#include "kiln/kiln.h"

using namespace kiln;

namespace {

double mean_of(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return s / static_cast<double>(v.size());
}
double std_of(const std::vector<double>& v) {
  double m = mean_of(v), s = 0;
  for (double x : v) s += (x - m) * (x - m);
  return std::sqrt(s / static_cast<double>(v.size() - 1));
}

}  // namespace

TEST_CASE("random ops follow the documented Philox counter layout") {
  const uint64_t seed = 1234;
  manual_seed(seed);
  // rand float32: element i is word 2i; 5 elements reserve 10 words = 3 blocks.
  std::vector<float> u = rand({5}).to_vector<float>();
  for (uint64_t i = 0; i < 5; ++i)
    CHECK(u[i] == philox::to_uniform_float(philox::bits(seed, 0, 2 * i)));
  CHECK(generator_state().offset == 3);
  // rand float64: words (2i, 2i+1), starting at the next free counter.
  std::vector<double> d = rand({3}, {Float64}).to_vector<double>();
  for (uint64_t i = 0; i < 3; ++i)
    CHECK(d[i] == philox::to_uniform_double(philox::bits(seed, 3, 2 * i),
                                            philox::bits(seed, 3, 2 * i + 1)));
  CHECK(generator_state().offset == 5);
  // randn: Box–Muller on words 4i..4i+3 (one block per element).
  std::vector<double> z = randn({4}, {Float64}).to_vector<double>();
  for (uint64_t i = 0; i < 4; ++i) {
    double u1 = philox::to_uniform_double(philox::bits(seed, 5, 4 * i), philox::bits(seed, 5, 4 * i + 1));
    double u2 = philox::to_uniform_double(philox::bits(seed, 5, 4 * i + 2),
                                          philox::bits(seed, 5, 4 * i + 3));
    // log/cos may be vectorised (libmvec): equal to a few ulp.
    double want = std::sqrt(-2 * std::log(1 - u1)) * std::cos(2 * std::numbers::pi * u2);
    CHECK(z[i] == Approx(want).epsilon(1e-14).margin(1e-300));
  }
  CHECK(generator_state().offset == 9);
  // randint: 64 bits from words (2i, 2i+1), scaled to the range by a 64x64 -> 128-bit product.
  std::vector<int64_t> r = randint(-3, 1000, {6}).to_vector<int64_t>();
  for (uint64_t i = 0; i < 6; ++i) {
    uint64_t x = uint64_t{philox::bits(seed, 9, 2 * i)} << 32 | philox::bits(seed, 9, 2 * i + 1);
    CHECK(r[i] == -3 + static_cast<int64_t>((static_cast<unsigned __int128>(x) * 1003) >> 64));
  }
  // dropout: element i is kept iff the uniform float of word i is >= p.
  uint64_t off = generator_state().offset;
  Tensor x = arange(1, 11, 1, {Float32});
  std::vector<float> y = dropout(x, 0.5).to_vector<float>();
  for (uint64_t i = 0; i < 10; ++i) {
    bool keep = philox::to_uniform_float(philox::bits(seed, off, i)) >= 0.5f;
    CHECK(y[i] == (keep ? 2.f * (i + 1) : 0.f));
  }
  CHECK(generator_state().offset == off + 3);
}

TEST_CASE("Philox words of long draws match the scalar generator, across a counter carry") {
  // Draws of several tiles with a ragged end go through the vectorised block generator; the
  // counter offset starts 40 blocks below 2^32, so the low counter word wraps mid-draw and
  // the high word must carry.
  const uint64_t seed = 0x0123456789abcdefULL;
  manual_seed(seed);
  const uint64_t off = (uint64_t{1} << 32) - 40;
  set_generator_state({seed, off});
  const int64_t n = 3 * 4096 + 77;
  std::vector<float> m = dropout(ones({n}), 0.25).to_vector<float>();
  int64_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    const bool keep =
        philox::to_uniform_float(philox::bits(seed, off, static_cast<uint64_t>(i))) >= 0.25f;
    bad += m[static_cast<size_t>(i)] != (keep ? 1.f / 0.75f : 0.f);
  }
  CHECK(bad == 0);
  // rand reads every other word: element i is word 2i.
  const uint64_t off2 = generator_state().offset;
  std::vector<float> u = rand({n}).to_vector<float>();
  for (int64_t i = 0; i < n; ++i)
    bad += u[static_cast<size_t>(i)] !=
           philox::to_uniform_float(philox::bits(seed, off2, 2 * static_cast<uint64_t>(i)));
  CHECK(bad == 0);
}

TEST_CASE("randn of several tiles follows the Box-Muller formula, float32 and float64") {
  // Every element of a draw of several tiles with a ragged last one (the vectorised loop's
  // body and remainder: libmvec's log / cos where the build has it, libm's in the remainder),
  // against the formula in double, to a few ulp (absolutely near cos's zeros).
  const uint64_t seed = 99;
  manual_seed(seed);
  const int64_t n = 2 * 1024 + 333;
  for (DType t : {DType::Float64, DType::Float32}) {
    const uint64_t off = generator_state().offset;
    std::vector<double> z = randn({n}, {t}).to(DType::Float64).to_vector<double>();
    int64_t bad = 0;
    for (int64_t i = 0; i < n; ++i) {
      const uint64_t w = 4 * static_cast<uint64_t>(i);
      const double u1 = philox::to_uniform_double(philox::bits(seed, off, w),
                                                  philox::bits(seed, off, w + 1));
      const double u2 = philox::to_uniform_double(philox::bits(seed, off, w + 2),
                                                  philox::bits(seed, off, w + 3));
      const double want =
          std::sqrt(-2 * std::log(1 - u1)) * std::cos(2 * std::numbers::pi * u2);
      const double got = z[static_cast<size_t>(i)];
      if (t == DType::Float64) bad += std::abs(got - want) > 1e-14 * std::max(1.0, std::abs(want));
      else bad += got != static_cast<double>(static_cast<float>(want)) &&
                  std::abs(got - want) > 1e-7 * std::max(1.0, std::abs(want));
    }
    CHECK(bad == 0);
  }
}

TEST_CASE("random ops are deterministic and independent of the thread count") {
  manual_seed(42);
  Tensor a = rand({100000});
  Tensor n1 = randn({100000});
  manual_seed(42);
  Tensor b = rand({100000});
  Tensor n2 = randn({100000});
  CHECK(a.to_vector<float>() == b.to_vector<float>());
  CHECK(n1.to_vector<float>() == n2.to_vector<float>());
  Tensor c = rand({100000});  // fresh counters: different numbers
  CHECK(c.to_vector<float>() != b.to_vector<float>());

  Tensor x = ones({300, 400}).t();  // non-contiguous input
  int saved = cpu::num_threads();
  std::vector<std::vector<double>> runs;
  for (int threads : {1, 2}) {
    cpu::set_num_threads(threads);
    manual_seed(7);
    std::vector<double> all = rand({70001}, {Float64}).to_vector<double>();
    for (double v : randn({70001}, {Float64}).to_vector<double>()) all.push_back(v);
    for (double v : randint(0, 1 << 20, {70001}).to_vector<double>()) all.push_back(v);
    for (double v : dropout(x, 0.25).to_vector<double>()) all.push_back(v);
    runs.push_back(all);
  }
  cpu::set_num_threads(saved);
  CHECK(runs[0] == runs[1]);
}

TEST_CASE("rand is uniform on [0, 1)") {
  manual_seed(3);
  for (DType t : {DType::Float32, DType::Float64}) {
    Tensor u = rand({1000000}, {t});
    CHECK(u.dtype() == t);
    std::vector<double> v = u.to_vector<double>();
    CHECK(*std::min_element(v.begin(), v.end()) >= 0.0);
    CHECK(*std::max_element(v.begin(), v.end()) < 1.0);
    CHECK(mean_of(v) == Approx(0.5).margin(0.002));
    CHECK(std_of(v) == Approx(std::sqrt(1.0 / 12)).margin(0.002));
    // Each tenth of the interval gets about a tenth of the values.
    std::vector<int> bins(10);
    for (double x : v) ++bins[static_cast<int>(x * 10)];
    for (int b : bins) CHECK(b == Approx(100000).margin(1500));
  }
  CHECK(rand({}).dim() == 0);
  CHECK(rand({2, 0, 3}).shape() == Shape{2, 0, 3});
  CHECK_THROWS_AS(rand({2}, {Int64}), Error);
  CHECK_THROWS_AS(rand({-1}), Error);
}

TEST_CASE("randn has mean 0 and std 1") {
  manual_seed(11);
  std::vector<double> v = randn({1000000}).to_vector<double>();
  CHECK(std::abs(mean_of(v)) < 0.01);
  CHECK(std::abs(std_of(v) - 1.0) < 0.01);
  // Tails: P(|z| > 2) = 4.55 %.
  double tail = std::count_if(v.begin(), v.end(), [](double z) { return std::abs(z) > 2; }) / 1e6;
  CHECK(tail == Approx(0.0455).margin(0.002));
  CHECK(randn({3}, {Float64}).dtype() == DType::Float64);
}

TEST_CASE("randint stays in [low, high) and hits every value") {
  manual_seed(5);
  for (DType t : {DType::Int64, DType::Int32, DType::Float32}) {
    Tensor r = randint(-4, 7, {20000}, {t});
    CHECK(r.dtype() == t);
    std::vector<int64_t> v = r.to_vector<int64_t>();
    std::set<int64_t> seen(v.begin(), v.end());
    CHECK(*seen.begin() == -4);
    CHECK(*seen.rbegin() == 6);
    CHECK(seen.size() == 11);
  }
  // A range wider than int64's positive half.
  std::vector<int64_t> wide =
      randint(INT64_MIN + 1, INT64_MAX, {1000}).to_vector<int64_t>();
  CHECK(std::count_if(wide.begin(), wide.end(), [](int64_t x) { return x < 0; }) ==
        Approx(500).margin(80));
  CHECK(randint(3, 4, {5}).to_vector<int64_t>() == std::vector<int64_t>(5, 3));
  CHECK_THROWS_AS(randint(5, 5, {2}), Error);
  CHECK_THROWS_AS(randint(0, int64_t{1} << 40, {2}, {Int32}), Error);
  // bool, as PyTorch: bounds within [0, 2]; the draws are int64 randint's.
  manual_seed(6);
  std::vector<int64_t> ints = randint(0, 2, {1000}).to_vector<int64_t>();
  manual_seed(6);
  Tensor bits = randint(0, 2, {1000}, {Bool});
  CHECK(bits.dtype() == DType::Bool);
  CHECK(bits.to(DType::Int64).to_vector<int64_t>() == ints);
  CHECK(std::count(ints.begin(), ints.end(), 1) == Approx(500).margin(80));
  CHECK(randint(1, 2, {3}, {Bool}).to_vector<bool>() == std::vector<bool>(3, true));
  CHECK_THROWS_WITH(randint(0, 3, {2}, {Bool}),
                    Catch::Contains("randint") && Catch::Contains("bounds [0, 3)"));
  CHECK_THROWS_AS(randint(-1, 1, {2}, {Bool}), Error);
}

TEST_CASE("dropout") {
  manual_seed(9);
  const double p = 0.3;
  Tensor x = arange(1, 200001, 1, {Float32});
  std::vector<float> xv = x.to_vector<float>();
  std::vector<float> y = dropout(x, p).to_vector<float>();
  const float scale = static_cast<float>(1.0 / (1.0 - p));
  int64_t kept = 0;
  bool exact = true;
  for (size_t i = 0; i < y.size(); ++i) {
    if (y[i] != 0) {
      ++kept;
      exact &= y[i] == xv[i] * scale;
    }
  }
  CHECK(exact);
  CHECK(static_cast<double>(kept) / y.size() == Approx(1 - p).margin(0.005));
  // float64, strided input: the mask follows the logical (row-major) element order.
  Tensor m = arange(12, {Float64}).view({3, 4}).t();
  GeneratorState s = generator_state();
  std::vector<double> strided = dropout(m, 0.5).to_vector<double>();
  set_generator_state(s);
  std::vector<double> dense = dropout(m.contiguous(), 0.5).to_vector<double>();
  CHECK(strided == dense);
  std::vector<double> mv = m.to_vector<double>();
  for (size_t i = 0; i < mv.size(); ++i) CHECK((strided[i] == 0 || strided[i] == 2 * mv[i]));
  // p = 1 drops everything; p = 0 and eval mode return x itself.
  CHECK(dropout(x, 1.0).to_vector<float>() == std::vector<float>(200000, 0.f));
  CHECK(dropout(x, 0.5, false).is_same(x));
  CHECK(dropout(x, 0.0).is_same(x));
  CHECK_THROWS_AS(dropout(x, 1.5), Error);
  CHECK_THROWS_AS(dropout(tensor({1, 2}), 0.5), Error);
}

TEST_CASE("dropout_mask: dropout's scale or 0 per element, from the same words") {
  for (double p : {0.1, 0.5, 1.0}) {
    manual_seed(4);
    Tensor x = arange(1, 3001, 1, {Float32}).view({30, 100});
    GeneratorState s = generator_state();
    std::vector<float> y = dropout(x, p).to_vector<float>();
    OpAttrs a;
    a.dims = {30, 100};
    a.dtype = DType::Float32;
    a.p = p;
    a.seed = s.seed;
    a.offset = s.offset;
    std::vector<float> m = dispatch::call1({OpKind::DropoutMask, {}, a, Loc::current()}).to_vector<float>();
    std::vector<float> xv = x.to_vector<float>();
    const float scale = p < 1 ? static_cast<float>(1.0 / (1.0 - p)) : 0.f;
    a.dtype = DType::Bool;
    std::vector<bool> keep = dispatch::call1({OpKind::DropoutMask, {}, a, Loc::current()}).to_vector<bool>();
    size_t kept = 0;
    for (size_t i = 0; i < y.size(); ++i) {
      CHECK((m[i] == 0 || m[i] == scale));
      CHECK(y[i] == xv[i] * m[i]);  // kept: x * scale exactly; dropped: 0
      CHECK(keep[i] == (m[i] != 0));  // the bool mask: true where kept
      kept += keep[i];
    }
    if (p == 1.0) CHECK(kept == 0);
    if (p == 0.1) CHECK(kept > 2600);  // about 2700 of 3000
  }
  OpAttrs bad;
  bad.dims = {2};
  bad.dtype = DType::Float32;
  bad.p = 1.5;
  CHECK_THROWS_AS(dispatch::call1({OpKind::DropoutMask, {}, bad, Loc::current()}), Error);
  bad.p = 0.5;
  bad.dtype = DType::Int64;
  CHECK_THROWS_AS(dispatch::call1({OpKind::DropoutMask, {}, bad, Loc::current()}), Error);
}

TEST_CASE("a random op that raises leaves the generator as it was (review)", "[random]") {
  // The draws were reserved before the checks: randint(5, 5) moved the stream, and randn with
  // a negative size wound it back, so later draws repeated earlier ones.
  manual_seed(0);
  const std::vector<float> expected = rand({8}).to_vector<float>();
  manual_seed(0);
  CHECK_THROWS_AS(randint(5, 5, {3}), Error);
  for (int i = 0; i < 4; ++i) CHECK_THROWS_AS(randn({-1, 1}), Error);
  CHECK_THROWS_AS(rand({3}, DType::Int64), Error);
  CHECK_THROWS_AS(dropout(ones({3}), 0.5, true) + ones({4}), Error);  // the add fails
  CHECK(generator_state().offset == philox::blocks(3));  // only dropout's draws, which ran
  manual_seed(0);
  CHECK_THROWS_AS(randint(5, 5, {3}), Error);
  CHECK(rand({8}).to_vector<float>() == expected);
}
