// Reductions: known answers, a float64 reference over many shapes / dims / layouts, NaN and
// Inf, integer dtypes, 0-d and empty tensors, errors.
#include <catch2/catch.hpp>
#include <cmath>
#include <functional>
#include <limits>
#include <random>

#include "backends/cpu/parallel.h"
#include "kiln/kiln.h"

using namespace kiln;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

std::vector<float> random_floats(int64_t n, uint32_t seed, float lo = -1, float hi = 1) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

Tensor random_tensor(const Shape& shape, uint32_t seed, float lo = -1, float hi = 1) {
  return from_vector(random_floats(numel(shape), seed, lo, hi), shape);
}

// Same logical values as x, laid out in memory in the dim order `perm` (a dense non-contiguous
// tensor unless perm is the identity).
Tensor with_layout(const Tensor& x, const Dims& perm) {
  Dims inv = perm;
  for (int i = 0; i < perm.size(); ++i) inv[perm[i]] = i;
  return x.permute(perm).contiguous().permute(inv);
}

// Elements of x grouped by output element (logical order within a group), for the reduced
// dims in `mask`; also the expected output shape.
struct Groups {
  std::vector<std::vector<double>> g;
  Shape shape;
};
Groups group(const Tensor& x, uint32_t mask, bool keepdim) {
  std::vector<double> v = x.to_vector<double>();
  const Shape& s = x.shape();
  Groups r;
  int64_t nout = 1;
  for (int d = 0; d < s.size(); ++d) {
    if (!(mask >> d & 1)) {
      r.shape.push_back(s[d]);
      nout *= s[d];
    } else if (keepdim) {
      r.shape.push_back(1);
    }
  }
  r.g.resize(nout);
  for (int64_t i = 0; i < static_cast<int64_t>(v.size()); ++i) {
    int64_t rem = i, o = 0, ostride = 1;
    for (int d = s.size() - 1; d >= 0; --d) {
      int64_t idx = rem % s[d];
      rem /= s[d];
      if (!(mask >> d & 1)) {
        o += idx * ostride;
        ostride *= s[d];
      }
    }
    r.g[o].push_back(v[i]);
  }
  return r;
}

double ref_sum(const std::vector<double>& g) {
  double s = 0;
  for (double x : g) s += x;
  return s;
}
double ref_mean(const std::vector<double>& g) { return ref_sum(g) / g.size(); }
double ref_prod(const std::vector<double>& g) {
  double p = 1;
  for (double x : g) p *= x;
  return p;
}
double ref_var(const std::vector<double>& g, int64_t correction) {
  double m = ref_mean(g), s = 0;
  for (double x : g) s += (x - m) * (x - m);
  double denom = static_cast<double>(g.size()) - correction;
  return s / std::max(denom, 0.0);  // PyTorch: inf, or NaN when s = 0
}
double ref_extreme(const std::vector<double>& g, bool is_max) {
  double m = is_max ? -kInf : kInf;
  for (double x : g) {
    if (std::isnan(x)) return x;
    m = is_max ? std::max(m, x) : std::min(m, x);
  }
  return m;
}
double ref_arg(const std::vector<double>& g, bool is_max) {
  int64_t best = 0;
  for (int64_t i = 0; i < static_cast<int64_t>(g.size()); ++i) {
    if (std::isnan(g[i])) return static_cast<double>(i);
    if (is_max ? g[i] > g[best] : g[i] < g[best]) best = i;
  }
  return static_cast<double>(best);
}
double ref_lse(const std::vector<double>& g) {
  double m = ref_extreme(g, true);
  if (std::isinf(m)) m = 0;
  double s = 0;
  for (double x : g) s += std::exp(x - m);
  return std::log(s) + m;
}

// Element-wise comparison; NaN must match NaN, infinities must match exactly.
void check_close(const std::vector<double>& got, const std::vector<double>& want, double rtol,
                 double atol = 0) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("element " << i << ": got " << got[i] << ", want " << want[i]);
    if (std::isnan(want[i])) {
      CHECK(std::isnan(got[i]));
    } else if (std::isinf(want[i])) {
      CHECK(got[i] == want[i]);
    } else {
      CHECK(std::abs(got[i] - want[i]) <= atol + rtol * std::abs(want[i]));
    }
  }
}

Dims mask_dims(uint32_t mask, int rank, bool negative) {
  Dims d;
  for (int i = 0; i < rank; ++i)
    if (mask >> i & 1) d.push_back(negative ? i - rank : i);
  return d;
}

struct RefOp {
  const char* name;
  std::function<Tensor(const Tensor&, const Dims&, bool)> run;
  std::function<double(const std::vector<double>&)> ref;
  double rtol, atol;
};

std::vector<RefOp> ref_ops() {
  return {
      {"sum", [](const Tensor& x, const Dims& d, bool k) { return sum(x, d, k); }, ref_sum, 1e-5,
       1e-5},
      {"mean", [](const Tensor& x, const Dims& d, bool k) { return mean(x, d, k); }, ref_mean, 1e-5,
       1e-6},
      {"amax", [](const Tensor& x, const Dims& d, bool k) { return amax(x, d, k); },
       [](const auto& g) { return ref_extreme(g, true); }, 0, 0},
      {"amin", [](const Tensor& x, const Dims& d, bool k) { return amin(x, d, k); },
       [](const auto& g) { return ref_extreme(g, false); }, 0, 0},
      {"var", [](const Tensor& x, const Dims& d, bool k) { return var(x, d, 1, k); },
       [](const auto& g) { return ref_var(g, 1); }, 1e-5, 1e-6},
      {"var0", [](const Tensor& x, const Dims& d, bool k) { return var(x, d, 0, k); },
       [](const auto& g) { return ref_var(g, 0); }, 1e-5, 1e-6},
      {"std", [](const Tensor& x, const Dims& d, bool k) { return kiln::std(x, d, 1, k); },
       [](const auto& g) { return std::sqrt(ref_var(g, 1)); }, 1e-5, 1e-6},
      {"logsumexp", [](const Tensor& x, const Dims& d, bool k) { return logsumexp(x, d, k); },
       ref_lse, 1e-5, 1e-6},
      {"prod", [](const Tensor& x, const Dims& d, bool k) { return prod(x, d, k); }, ref_prod, 1e-4,
       1e-30},
  };
}

}  // namespace

TEST_CASE("reductions: known values") {
  Tensor x = tensor<float>({{1, 2, 3}, {4, 5, 6}});
  CHECK(sum(x).item<float>() == 21);
  CHECK(sum(x).dim() == 0);
  CHECK(sum(x).dtype() == Float32);
  CHECK(sum(x, {0}).to_vector<float>() == std::vector<float>{5, 7, 9});
  CHECK(sum(x, {1}).to_vector<float>() == std::vector<float>{6, 15});
  CHECK(sum(x, {-1}).to_vector<float>() == std::vector<float>{6, 15});
  CHECK(sum(x, {1}, true).shape() == Shape{2, 1});
  CHECK(sum(x, {0, 1}, true).shape() == Shape{1, 1});
  CHECK(sum(x, {-2, -1}).item<float>() == 21);
  CHECK(x.sum({0}).to_vector<float>() == std::vector<float>{5, 7, 9});
  CHECK(mean(x).item<float>() == 3.5f);
  CHECK(mean(x, {0}).to_vector<float>() == std::vector<float>{2.5f, 3.5f, 4.5f});
  CHECK(prod(x).item<float>() == 720);
  CHECK(prod(x, {1}).to_vector<float>() == std::vector<float>{6, 120});
  CHECK(amax(x).item<float>() == 6);
  CHECK(amax(x, {0}).to_vector<float>() == std::vector<float>{4, 5, 6});
  CHECK(amin(x, {1}).to_vector<float>() == std::vector<float>{1, 4});
  CHECK(var(x).item<float>() == Approx(3.5));
  CHECK(var(x, {}, 0).item<float>() == Approx(17.5 / 6));
  CHECK(var(x, {1}).to_vector<float>() == std::vector<float>{1, 1});
  CHECK(var(x, {0}).to_vector<float>() == std::vector<float>{4.5f, 4.5f, 4.5f});
  CHECK(kiln::std(x).item<float>() == Approx(std::sqrt(3.5)));
  CHECK(logsumexp(x, {1}).to_vector<float>()[0] == Approx(3.4076059644));
  CHECK(logsumexp(x, {1}).to_vector<float>()[1] == Approx(6.4076059644));
  CHECK(argmax(x).item<int64_t>() == 5);
  CHECK(argmax(x).dtype() == Int64);
  CHECK(argmin(x).item<int64_t>() == 0);
  CHECK(argmax(x, 0).to_vector<int64_t>() == std::vector<int64_t>{1, 1, 1});
  CHECK(argmax(x, 1).to_vector<int64_t>() == std::vector<int64_t>{2, 2});
  CHECK(argmin(x, -1, true).shape() == Shape{2, 1});
  CHECK(argmax(x, std::nullopt, true).shape() == Shape{1, 1});
  CHECK(argmax(x, std::nullopt, true).item<int64_t>() == 5);

  Tensor b = tensor<float>({{0, 1, 2}, {3, 4, 5}});
  CHECK(all(b).item<bool>() == false);
  CHECK(any(b).item<bool>() == true);
  CHECK(all(b, {0}).to_vector<bool>() == std::vector<bool>{false, true, true});
  CHECK(all(b, {1}).to_vector<bool>() == std::vector<bool>{false, true});
  CHECK(any(b, {0}).dtype() == Bool);
}

TEST_CASE("reductions: transposed and permuted inputs") {
  Tensor x = tensor<float>({{1, 2, 3}, {4, 5, 6}}).t();  // [[1,4],[2,5],[3,6]]
  REQUIRE_FALSE(x.is_contiguous());
  CHECK(sum(x, {0}).to_vector<float>() == std::vector<float>{6, 15});
  CHECK(sum(x, {1}).to_vector<float>() == std::vector<float>{5, 7, 9});
  CHECK(argmax(x).item<int64_t>() == 5);  // flat index in x's logical order
  CHECK(argmin(x, 1).to_vector<int64_t>() == std::vector<int64_t>{0, 0, 0});
  CHECK(argmax(x, 0).to_vector<int64_t>() == std::vector<int64_t>{2, 2});
  Tensor y = tensor<float>({{5, 1, 9}, {2, 8, 0}}).t();  // [[5,2],[1,8],[9,0]]
  CHECK(argmax(y).item<int64_t>() == 4);
  CHECK(argmin(y).item<int64_t>() == 5);
  CHECK(amax(y, {0}).to_vector<float>() == std::vector<float>{9, 8});
}

TEST_CASE("reductions match a float64 reference over dims, keepdim and layouts") {
  const std::vector<RefOp> ops = ref_ops();
  const Shape shape{4, 5, 6, 7};
  Tensor base = random_tensor(shape, 1);
  // Values near 1 keep products of up to 840 elements in range.
  Tensor base_prod = random_tensor(shape, 2, 0.97f, 1.03f);
  const std::vector<Dims> layouts = {{0, 1, 2, 3}, {3, 2, 1, 0}, {1, 3, 0, 2}};
  for (const Dims& layout : layouts) {
    for (uint32_t mask = 1; mask < 16; ++mask) {
      for (bool keepdim : {false, true}) {
        for (const RefOp& op : ops) {
          Tensor x = with_layout(std::string(op.name) == "prod" ? base_prod : base, layout);
          Dims dims = mask_dims(mask, 4, mask & 1);
          INFO(op.name << " dims " << to_string(dims) << " keepdim " << keepdim << " layout "
                       << to_string(layout));
          Groups g = group(x, mask, keepdim);
          Tensor got = op.run(x, dims, keepdim);
          REQUIRE(got.shape() == g.shape);
          std::vector<double> want;
          for (const auto& grp : g.g) want.push_back(op.ref(grp));
          check_close(got.to_vector<double>(), want, op.rtol, op.atol);
        }
        // argmax / argmin over one dim.
        if (__builtin_popcount(mask) == 1) {
          Tensor x = with_layout(base, layout);
          int d = __builtin_ctz(mask);
          for (bool is_max : {true, false}) {
            Groups g = group(x, mask, keepdim);
            Tensor got = is_max ? argmax(x, d - 4, keepdim) : argmin(x, d, keepdim);
            REQUIRE(got.shape() == g.shape);
            std::vector<double> want;
            for (const auto& grp : g.g) want.push_back(ref_arg(grp, is_max));
            check_close(got.to_vector<double>(), want, 0);
          }
        }
      }
    }
    // All dims.
    Tensor x = with_layout(base, layout);
    Groups g = group(x, 15, false);
    CHECK(argmax(x).item<int64_t>() == ref_arg(g.g[0], true));
    CHECK(argmin(x).item<int64_t>() == ref_arg(g.g[0], false));
    CHECK(sum(x).item<float>() == Approx(ref_sum(g.g[0])).margin(1e-4));
  }
}

TEST_CASE("sum and mean over short rows, a batch of rows at a time, match a float64 reference") {
  for (DType dt : {DType::Float32, DType::Float64}) {
    for (int64_t n : {1, 2, 3, 7, 8, 15, 16, 17}) {
      const int64_t rows = 16 * 3 + 5;  // whole batches of rows and a tail
      Tensor x = random_tensor({rows, n}, 70 + n).to(dt);
      std::vector<double> v = x.to_vector<double>(), want(rows);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t j = 0; j < n; ++j) want[r] += v[r * n + j];
      INFO(name(dt) << " n " << n);
      check_close(sum(x, {1}).to_vector<double>(), want, 1e-6, 1e-6);
      for (double& w : want) w /= n;
      check_close(mean(x, {-1}, true).to_vector<double>(), want, 1e-6, 1e-6);
      // Reduced as rows of a transposed view too.
      check_close(x.t().mean(0).to_vector<double>(), want, 1e-6, 1e-6);
    }
  }
  // A float32 row whose float32 sum overflows: the mean is representable, the sum inf.
  std::vector<float> v(40 * 2, 1.0f);
  v[2 * 21] = v[2 * 21 + 1] = 3e38f;
  Tensor x = from_vector(v, {40, 2});
  CHECK(mean(x, {1}).to_vector<float>()[21] == 3e38f);
  CHECK(sum(x, {1}).to_vector<float>()[21] == INFINITY);
  CHECK(sum(x, {1}).to_vector<float>()[20] == 2);
}

TEST_CASE("amax, amin, argmax, argmin and logsumexp over short rows match the reference: ties, "
          "NaN, infinities, signed zeros") {
  // The short-row paths (a batch of rows at a time through gathers) against the first-extreme
  // rule, for every row length below a batch, whole batches of rows and a tail.
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const std::vector<double> values = {0, 1, 2, -0.0, kInf, -kInf, nan, 2};
  for (DType dt : {Float32, Float64}) {
    std::mt19937 gen(7);
    std::uniform_int_distribution<int> pick(0, 40);
    for (int64_t n : {1, 2, 3, 7, 8, 15, 16, 31, 33, 63}) {
      const int64_t rows = 16 * 4 + 9;
      std::vector<double> v(rows * n);
      for (auto& e : v) {
        int k = pick(gen);
        e = k < static_cast<int>(values.size()) ? values[k] : (k % 4);  // ties are common
      }
      Tensor x = from_vector(v, {rows, n}).to(dt);
      INFO(name(dt) << " n " << n);
      Groups g = group(x, 2u, false);
      for (bool is_max : {true, false}) {
        std::vector<double> want_arg, want_ext;
        for (const auto& grp : g.g) {
          want_arg.push_back(ref_arg(grp, is_max));
          want_ext.push_back(ref_extreme(grp, is_max));
        }
        check_close((is_max ? argmax(x, 1) : argmin(x, 1)).to_vector<double>(), want_arg, 0);
        std::vector<double> ext = (is_max ? amax(x, {1}) : amin(x, {1})).to_vector<double>();
        for (size_t i = 0; i < ext.size(); ++i) {
          INFO("row " << i);
          CHECK((std::isnan(want_ext[i]) ? std::isnan(ext[i]) : ext[i] == want_ext[i]));
        }
      }
      std::vector<double> want_lse;
      for (const auto& grp : g.g) want_lse.push_back(ref_lse(grp));
      std::vector<double> lse = logsumexp(x, {1}).to_vector<double>();
      for (size_t i = 0; i < lse.size(); ++i) {
        INFO("row " << i);
        CHECK((std::isnan(want_lse[i]) ? std::isnan(lse[i])
                                       : lse[i] == Approx(want_lse[i]).epsilon(1e-6)));
      }
    }
  }
}

TEST_CASE("reductions of non-dense (strided, expanded) inputs") {
  Tensor big = random_tensor({6, 10, 8}, 3);
  Tensor x = big.slice(1, 1, 10, 3).slice(2, 0, 8, 2);  // [6, 3, 4], gaps in memory
  REQUIRE_FALSE(x.is_non_overlapping_and_dense());
  for (uint32_t mask = 1; mask < 8; ++mask) {
    Groups g = group(x, mask, false);
    std::vector<double> want_sum, want_max;
    for (const auto& grp : g.g) {
      want_sum.push_back(ref_sum(grp));
      want_max.push_back(ref_extreme(grp, true));
    }
    Dims dims = mask_dims(mask, 3, false);
    check_close(sum(x, dims).to_vector<double>(), want_sum, 1e-5, 1e-6);
    check_close(amax(x, dims).to_vector<double>(), want_max, 0);
  }
  Tensor e = tensor<float>({1, 2, 3}).view({3, 1}).expand({3, 4});  // stride-0 dim
  CHECK(sum(e, {1}).to_vector<float>() == std::vector<float>{4, 8, 12});
  CHECK(sum(e, {0}).to_vector<float>() == std::vector<float>{6, 6, 6, 6});
  CHECK(argmax(e).item<int64_t>() == 8);
  Tensor col = x.select(2, 1);  // [6, 3]
  Groups g = group(col, 1, false);
  std::vector<double> want;
  for (const auto& grp : g.g) want.push_back(ref_arg(grp, false));
  check_close(argmin(col, 0).to_vector<double>(), want, 0);
}

TEST_CASE("large reductions: split rows, column blocks and float32 accuracy") {
  // Shapes that exercise the long-row split, the column path with few / many columns, the
  // column split along R and multiple column stripes.
  struct Case {
    Shape shape;
    Dims dims;
  };
  const std::vector<Case> cases = {
      {{3, 200000}, {1}},    {{200000, 3}, {0}}, {{4096, 256}, {0}}, {{64, 1024, 8}, {1}},
      {{2, 3000, 600}, {1}}, {{40, 3000}, {1}},  {{1000, 1000}, {}}, {{50, 2500}, {0}},
  };
  uint32_t seed = 10;
  for (const Case& c : cases) {
    Tensor x = random_tensor(c.shape, seed++);
    uint32_t mask = 0;
    for (int64_t d : c.dims) mask |= 1u << d;
    if (c.dims.empty()) mask = (1u << c.shape.size()) - 1;
    Groups g = group(x, mask, false);
    INFO("shape " << to_string(c.shape) << " dims " << to_string(c.dims));
    std::vector<double> s, m, v, mx, am, lse;
    for (const auto& grp : g.g) {
      s.push_back(ref_sum(grp));
      m.push_back(ref_mean(grp));
      v.push_back(ref_var(grp, 1));
      mx.push_back(ref_extreme(grp, true));
      am.push_back(ref_arg(grp, false));
      lse.push_back(ref_lse(grp));
    }
    // Sums of n values in [-1, 1): the error bound scales with sqrt(n), not with |sum|.
    double n = static_cast<double>(numel(c.shape)) / g.g.size();
    check_close(sum(x, c.dims).to_vector<double>(), s, 1e-6, 1e-6 * std::sqrt(n));
    check_close(mean(x, c.dims).to_vector<double>(), m, 1e-6, 1e-6 / std::sqrt(n));
    check_close(var(x, c.dims).to_vector<double>(), v, 1e-5);
    check_close(amax(x, c.dims).to_vector<double>(), mx, 0);
    check_close(logsumexp(x, c.dims).to_vector<double>(), lse, 1e-6);
    if (c.dims.size() == 1)
      check_close(argmin(x, c.dims[0]).to_vector<double>(), am, 0);
    else
      CHECK(argmin(x).item<int64_t>() == am[0]);
  }
}

TEST_CASE("float32 sum of 1M elements is within 1e-6 of a float64 reference") {
  for (float lo : {0.0f, -1.0f}) {
    std::vector<float> v = random_floats(1 << 20, 42, lo, 1.0f);
    double ref = 0, ref_abs = 0;
    for (float f : v) {
      ref += f;
      ref_abs += std::abs(f);
    }
    Tensor x = from_vector(v, {1 << 20});
    double got = sum(x).item<float>();
    INFO("got " << got << " want " << ref);
    CHECK(std::abs(got - ref) <= 1e-6 * ref_abs);
    // Column-wise: [1024, 1024] summed over dim 0, compared per column.
    Tensor y = x.view({1024, 1024});
    std::vector<float> cols = sum(y, {0}).to_vector<float>();
    for (int j = 0; j < 1024; j += 97) {
      double r = 0, ra = 0;
      for (int i = 0; i < 1024; ++i) {
        r += v[i * 1024 + j];
        ra += std::abs(v[i * 1024 + j]);
      }
      CHECK(std::abs(cols[j] - r) <= 1e-6 * ra);
    }
  }
}

TEST_CASE("reduction results do not depend on the number of threads") {
  Tensor x = random_tensor({3, 300000}, 7);
  Tensor y = random_tensor({300000, 5}, 8);
  int saved = cpu::num_threads();
  cpu::set_num_threads(1);
  std::vector<float> a1 = sum(x, {1}).to_vector<float>(), b1 = sum(y, {0}).to_vector<float>();
  float c1 = sum(x).item<float>();
  cpu::set_num_threads(2);
  std::vector<float> a2 = sum(x, {1}).to_vector<float>(), b2 = sum(y, {0}).to_vector<float>();
  float c2 = sum(x).item<float>();
  cpu::set_num_threads(saved);
  CHECK(a1 == a2);
  CHECK(b1 == b2);
  CHECK(c1 == c2);
}

TEST_CASE("FC-02 NaN and Inf semantics of reductions") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  CHECK(std::isnan(amax(tensor<float>({7, nan, -2.5f, 11, 0.25f})).item<float>()));
  CHECK(std::isnan(amin(tensor<float>({7, nan, -2.5f, 11, 0.25f})).item<float>()));
  CHECK(argmax(tensor<float>({4, 5.5f, nan})).item<int64_t>() == 2);
  CHECK(argmin(tensor<float>({4, 5.5f, nan})).item<int64_t>() == 2);
  CHECK(argmax(tensor<float>({nan, 1, nan})).item<int64_t>() == 0);
  CHECK(argmin(tensor<float>({3, nan, 1, nan})).item<int64_t>() == 1);
  // Ties: the first index.
  CHECK(argmax(tensor<float>({1, 3, 3, 2})).item<int64_t>() == 1);
  CHECK(argmin(tensor<float>({1, 0, 5, 0})).item<int64_t>() == 1);
  // NaN in the SIMD body of a long row and in the column path.
  std::vector<float> v(1000, 1.0f);
  v[700] = nan;
  v[900] = nan;
  v[10] = 5;
  Tensor row = from_vector(v, {1000});
  CHECK(std::isnan(amax(row).item<float>()));
  CHECK(std::isnan(amin(row).item<float>()));
  CHECK(argmax(row).item<int64_t>() == 700);
  CHECK(argmin(row).item<int64_t>() == 700);
  CHECK(std::isnan(sum(row).item<float>()));
  CHECK(std::isnan(logsumexp(row, {0}).item<float>()));
  Tensor cols = row.view({100, 10});  // NaN at rows 70 and 90, column 0
  std::vector<float> cm = amax(cols, {0}).to_vector<float>();
  CHECK(std::isnan(cm[0]));
  CHECK(cm[1] == 1.0f);
  CHECK(argmax(cols, 0).to_vector<int64_t>()[0] == 70);
  CHECK(argmax(cols, 0).to_vector<int64_t>()[1] == 0);
  // Infinities.
  CHECK(amax(tensor<float>({-inf, -inf})).item<float>() == -inf);
  CHECK(amin(tensor<float>({inf, 2})).item<float>() == 2);
  CHECK(std::isnan(sum(tensor<float>({inf, -inf})).item<float>()));
  CHECK(sum(tensor<float>({inf, 1})).item<float>() == inf);
  CHECK(logsumexp(tensor<float>({inf, 1}), {0}).item<float>() == inf);
  CHECK(logsumexp(tensor<float>({-inf, -inf}), {0}).item<float>() == -inf);
  CHECK(logsumexp(tensor<float>({-inf, 0}), {0}).item<float>() == 0);
  CHECK(argmax(tensor<float>({-inf, -inf})).item<int64_t>() == 0);
  CHECK(argmin(tensor<float>({inf, -inf, -inf})).item<int64_t>() == 1);
  // logsumexp is stable for large values.
  CHECK(logsumexp(tensor<float>({1000, 1000}), {0}).item<float>() == Approx(1000 + std::log(2.0)));
  CHECK(logsumexp(tensor<float>({-1000, -1000}), {0}).item<float>() ==
        Approx(-1000 + std::log(2.0)));
  // all / any: NaN is non-zero.
  CHECK(all(tensor<float>({nan, 1})).item<bool>());
  CHECK(any(tensor<float>({0, nan})).item<bool>());
  CHECK_FALSE(any(tensor<float>({0, -0.0f})).item<bool>());
}

TEST_CASE("argmax / argmin with ties and NaNs in rows and columns match the reference") {
  // Small integer values make ties common; some NaNs. Shapes wide enough for the vectorised
  // column path (>= 16 columns) plus a scalar tail of columns.
  for (DType dt : {Float32, Float64}) {
    std::mt19937 gen(99);
    std::uniform_int_distribution<int> val(0, 3), nan_pick(0, 60);
    const Shape shape{37, 45};
    std::vector<double> v(numel(shape));
    for (auto& e : v) e = nan_pick(gen) == 0 ? std::numeric_limits<double>::quiet_NaN() : val(gen);
    Tensor x = from_vector(v, shape).to(dt);
    for (Tensor t : {x, with_layout(x, {1, 0})}) {
      for (int d = 0; d < 2; ++d) {
        for (bool is_max : {true, false}) {
          INFO("dtype " << name(dt) << " dim " << d << " max " << is_max);
          Groups g = group(t, 1u << d, false);
          std::vector<double> want;
          for (const auto& grp : g.g) want.push_back(ref_arg(grp, is_max));
          Tensor got = is_max ? argmax(t, d) : argmin(t, d);
          check_close(got.to_vector<double>(), want, 0);
        }
      }
      Groups all_g = group(t, 3, false);
      CHECK(argmax(t).item<int64_t>() == ref_arg(all_g.g[0], true));
      CHECK(argmin(t).item<int64_t>() == ref_arg(all_g.g[0], false));
    }
  }
  // A long column block (R split into chunks) with a NaN late in one column and ties.
  std::vector<float> v(20000 * 20, 1.0f);
  v[15000 * 20 + 3] = std::numeric_limits<float>::quiet_NaN();
  v[12000 * 20 + 5] = 2.0f;
  v[17000 * 20 + 5] = 2.0f;
  Tensor x = from_vector(v, {20000, 20});
  std::vector<int64_t> am = argmax(x, 0).to_vector<int64_t>();
  CHECK(am[0] == 0);
  CHECK(am[3] == 15000);
  CHECK(am[5] == 12000);
  CHECK(argmin(x, 0).to_vector<int64_t>()[3] == 15000);
  CHECK(argmin(x, 0).to_vector<int64_t>()[5] == 0);
}

TEST_CASE("reductions of integer and bool tensors") {
  Tensor i32 = tensor<int32_t>({2147483647, 1, 5});
  Tensor s = sum(i32);
  CHECK(s.dtype() == Int64);
  CHECK(s.item<int64_t>() == 2147483653LL);
  CHECK(sum(tensor<int32_t>({{1, 2}, {3, 4}}), {0}).to_vector<int64_t>() ==
        std::vector<int64_t>{4, 6});
  CHECK(prod(tensor<int32_t>({100000, 100000, 3})).item<int64_t>() == 30000000000LL);
  CHECK(prod(tensor<int32_t>({1, 2})).dtype() == Int64);
  Tensor am = amax(tensor<int32_t>({{3, -7}, {1, 9}}), {1});
  CHECK(am.dtype() == Int32);
  CHECK(am.to_vector<int32_t>() == std::vector<int32_t>{3, 9});
  CHECK(amin(tensor<int64_t>({5, -3, 8})).item<int64_t>() == -3);
  CHECK(argmax(tensor<int32_t>({3, 9, 9, 1})).item<int64_t>() == 1);
  CHECK(argmin(tensor<int64_t>({{3, 9}, {-1, 1}}), 0).to_vector<int64_t>() ==
        std::vector<int64_t>{1, 1});
  Tensor bools = tensor<bool>({true, false, true, true});
  CHECK(sum(bools).dtype() == Int64);
  CHECK(sum(bools).item<int64_t>() == 3);
  CHECK(sum(bools.view({2, 2}), 0).to_vector<int64_t>() == std::vector<int64_t>{2, 1});
  CHECK(prod(bools).item<int64_t>() == 0);
  CHECK(sum(tensor<int32_t>({{-5, 2}, {3, -4}}).t(), 1).to_vector<int64_t>() ==
        std::vector<int64_t>{-2, -2});  // a strided int32 input
  CHECK(all(bools).item<bool>() == false);
  CHECK(any(bools).item<bool>() == true);
  CHECK(amax(bools).item<bool>() == true);
  CHECK(amin(bools).item<bool>() == false);
  CHECK(amax(bools).dtype() == Bool);
  CHECK(all(tensor<int32_t>({1, 2, -3})).item<bool>());
  CHECK_FALSE(all(tensor<int64_t>({1, 0})).item<bool>());
  // logsumexp of ints is float.
  Tensor l = logsumexp(tensor<int32_t>({0, 0}), {0});
  CHECK(l.dtype() == Float32);
  CHECK(l.item<float>() == Approx(std::log(2.0)));
  // Large integer sums (vectorised path) are exact.
  std::vector<int32_t> big(100003);
  int64_t want = 0;
  for (size_t i = 0; i < big.size(); ++i) want += big[i] = static_cast<int32_t>(i * 7919 % 100000);
  CHECK(sum(from_vector(big, {100003})).item<int64_t>() == want);
  // float64 input.
  Tensor d = tensor<double>({1e16, 1.0, -1e16});
  CHECK(d.dtype() == Float64);
  CHECK(sum(d).dtype() == Float64);
  CHECK(mean(tensor<double>({1, 2})).item<double>() == 1.5);
}

TEST_CASE("reductions of 0-d tensors") {
  Tensor s = scalar_tensor(3.5f);
  CHECK(sum(s).item<float>() == 3.5f);
  CHECK(sum(s).dim() == 0);
  CHECK(sum(s, {0}).item<float>() == 3.5f);
  CHECK(sum(s, {-1}, true).dim() == 0);
  CHECK(mean(s).item<float>() == 3.5f);
  CHECK(prod(s).item<float>() == 3.5f);
  CHECK(amax(s).item<float>() == 3.5f);
  CHECK(std::isnan(var(s).item<float>()));
  CHECK(var(s, {}, 0).item<float>() == 0);
  CHECK(logsumexp(s, {0}).item<float>() == 3.5f);
  CHECK(argmax(s).item<int64_t>() == 0);
  CHECK(argmax(s, 0).item<int64_t>() == 0);
  CHECK(argmin(s, -1, true).dim() == 0);
  CHECK(all(s).item<bool>());
  // Reducing over size-1 dims only.
  Tensor x = tensor<float>({1, 2, 3}).view({3, 1});
  CHECK(sum(x, {1}).to_vector<float>() == std::vector<float>{1, 2, 3});
  CHECK(std::isnan(var(x, {1}).to_vector<float>()[0]));
}

TEST_CASE("FC-23 reductions over zero-size tensors") {
  Tensor x = empty({0, 3});
  Tensor a = argmin(x, 1);
  CHECK(a.shape() == Shape{0});
  CHECK(a.dtype() == Int64);
  Tensor r = a.reshape({0, 3});
  CHECK(r.shape() == Shape{0, 3});
  CHECK(r.dtype() == Int64);
  CHECK(r.numel() == 0);
  CHECK(argmax(x, 1, true).shape() == Shape{0, 1});
  CHECK(amax(x, {1}).shape() == Shape{0});

  Tensor e = empty({0});
  CHECK(sum(e).item<float>() == 0.0f);
  CHECK(sum(e).dim() == 0);
  CHECK(prod(e).item<float>() == 1.0f);
  CHECK(std::isnan(mean(e).item<float>()));
  CHECK(std::isnan(var(e).item<float>()));
  CHECK(logsumexp(e, {0}).item<float>() == -std::numeric_limits<float>::infinity());
  CHECK(all(e).item<bool>() == true);
  CHECK(any(e).item<bool>() == false);
  CHECK(sum(empty({0}, Int32)).item<int64_t>() == 0);
  CHECK(prod(empty({0}, Int64)).item<int64_t>() == 1);
  CHECK_THROWS_AS(amax(e), kiln::Error);
  CHECK_THROWS_AS(amin(x, {0}), kiln::Error);
  CHECK_THROWS_AS(argmax(e), kiln::Error);
  CHECK_THROWS_AS(argmin(x, 0), kiln::Error);

  // Reducing the empty dim of [0, 3] gives identities; reducing the other gives empty.
  CHECK(sum(x, {0}).to_vector<float>() == std::vector<float>{0, 0, 0});
  CHECK(prod(x, {0}, true).shape() == Shape{1, 3});
  CHECK(prod(x, {0}).to_vector<float>() == std::vector<float>{1, 1, 1});
  std::vector<float> m = mean(x, {0}).to_vector<float>();
  CHECK((m.size() == 3 && std::isnan(m[0]) && std::isnan(m[2])));
  CHECK(sum(x, {1}).shape() == Shape{0});
  CHECK(all(x, {0}).to_vector<bool>() == std::vector<bool>{true, true, true});
}

TEST_CASE("reduction errors") {
  Tensor x = tensor<float>({{1, 2}, {3, 4}});
  CHECK_THROWS_AS(sum(x, {2}), kiln::Error);
  CHECK_THROWS_AS(sum(x, {-3}), kiln::Error);
  CHECK_THROWS_AS(sum(x, {0, -2}), kiln::Error);  // repeated dim
  CHECK_THROWS_AS(argmax(x, 2), kiln::Error);
  CHECK_THROWS_AS(mean(tensor<int32_t>({1, 2})), kiln::Error);
  CHECK_THROWS_AS(var(tensor<int64_t>({1, 2})), kiln::Error);
  CHECK_THROWS_AS(argmax(tensor<bool>({true})), kiln::Error);
  CHECK_THROWS_WITH(amax(empty({2, 0}), {1}), Catch::Contains("size 0"));
}

TEST_CASE("std of float32 values near the float32 limit is not inf") {
  // (x - mean)² was squared in float32 and overflowed (inf) although std is representable.
  // float64: mean 0, var = 3e38², std = |3e38| with correction 0.
  const float big = 3e38f;
  Tensor x = from_vector<float>({big, -big}, {2});
  CHECK(kiln::std(x, {}, 0).item<float>() == big);
  // With correction 1 the answer, 3e38·√2 = 4.2e38, is past FLT_MAX: inf is right there.
  CHECK(std::isinf(kiln::std(x, {}, 1).item<float>()));
  CHECK(std::isinf(var(x, {}, 0).item<float>()));  // 9e76: not representable
  // Over dim 0 of [2, 2] (the column path): [std(3e38, -3e38), std(1, 1)] = [3e38, 0].
  Tensor y = from_vector<float>({big, 1, -big, 1}, {2, 2});
  CHECK(kiln::std(y, {0}, 0).to_vector<float>() == std::vector<float>{big, 0});
  // Tiny values: float32 squares of 1e-25 underflow to 0; std is 1e-25.
  Tensor t = from_vector<float>({1e-25f, -1e-25f}, {2});
  CHECK(kiln::std(t, {}, 0).item<float>() == Approx(1e-25).epsilon(1e-6));
}

TEST_CASE("mean of float32 values whose float32 partial sums overflow is representable") {
  // The SIMD lanes' float32 partial sums overflowed: mean([3e38, 3e38]) was inf here and 3e38
  // in compiled code, which sums in double (review). The sum itself is past FLT_MAX: inf.
  const float big = 3e38f;
  Tensor x = full({2}, big);
  CHECK(mean(x).item<float>() == big);
  CHECK(std::isinf(sum(x).item<float>()));
  Tensor rows = full({40, 3}, big);  // longer rows go through the vector loop
  CHECK(mean(rows.t().contiguous(), {1}).to_vector<float>() == std::vector<float>(3, big));
  Tensor cols = from_vector<float>({big, 1, big, 1}, {2, 2});  // the column path
  CHECK(mean(cols, {0}).to_vector<float>() == std::vector<float>{big, 1});
  CHECK(mean(from_vector<float>({INFINITY, big}, {2})).item<float>() == INFINITY);
  CHECK(std::isnan(mean(from_vector<float>({INFINITY, -INFINITY, big}, {3})).item<float>()));
}

TEST_CASE("a float32 product multiplies in float64: its partial products neither overflow nor "
          "underflow") {
  // float32 lane products: 3e38 times 63 factors of 0.5 was inf (the product is 3.3e19), and
  // -inf among factors whose lanes underflowed to 0 was NaN (the product is -inf).
  std::vector<float> big(64, 0.5f), inf_row(64, 1e-10f);
  big[0] = 3e38f;
  inf_row[5] = -INFINITY;
  const float want_big = static_cast<float>(3e38 * std::ldexp(1.0, -63));
  CHECK(prod(from_vector(big, {64})).item<float>() == want_big);
  CHECK(prod(from_vector(inf_row, {64})).item<float>() == -INFINITY);
  // Columns (dim 0 of [64, 2]) take the column path.
  std::vector<float> cols;
  for (int r = 0; r < 64; ++r) cols.insert(cols.end(), {big[r], inf_row[r]});
  CHECK(prod(from_vector(cols, {64, 2}), {0}).to_vector<float>() ==
        std::vector<float>{want_big, -INFINITY});
  // A true float32 overflow is still inf, and 0 times inf NaN, as in PyTorch.
  CHECK(prod(full({3}, 1e20f)).item<float>() == INFINITY);
  CHECK(std::isnan(prod(from_vector<float>({0, INFINITY}, {2})).item<float>()));
}

TEST_CASE("var, std and layer_norm of float32 rows on a large offset are accurate") {
  // Found by review: rows 1e4 + 0.01·N(0, 1) (std/|mean| = 1e-6, just above the exact path's
  // threshold) had var 4.4e-3 too large, relative: the float32 mean's rounding, squared. The
  // reference is float64 two-pass over the same float32 values. Rows (dim 1) and columns
  // (dim 0, the strided path) both.
  const int64_t rows = 16, cols = 1031;
  std::mt19937 gen(7);
  std::normal_distribution<float> noise(0, 1);
  std::vector<float> v(rows * cols);
  for (float& e : v) e = 1e4f + 0.01f * noise(gen);
  Tensor x = from_vector(v, {rows, cols});
  auto ref_var = [&](int64_t r, bool by_row) {
    const int64_t n = by_row ? cols : rows;
    auto at = [&](int64_t i) { return double(by_row ? v[r * cols + i] : v[i * cols + r]); };
    double mean = 0, m2 = 0;
    for (int64_t i = 0; i < n; ++i) mean += at(i);
    mean /= n;
    for (int64_t i = 0; i < n; ++i) m2 += (at(i) - mean) * (at(i) - mean);
    return m2 / (n - 1);
  };
  std::vector<float> by_row = var(x, 1).to_vector<float>();
  for (int64_t r = 0; r < rows; ++r) CHECK(by_row[r] == Approx(ref_var(r, true)).epsilon(1e-5));
  std::vector<float> by_col = var(x.t().contiguous().t(), 1).to_vector<float>();
  for (int64_t r = 0; r < rows; ++r) CHECK(by_col[r] == Approx(ref_var(r, true)).epsilon(1e-5));
  std::vector<float> cols_var = var(x, 0).to_vector<float>();
  for (int64_t c = 0; c < 40; ++c) CHECK(cols_var[c] == Approx(ref_var(c, false)).epsilon(1e-5));
  std::vector<float> sd = kiln::std(x, 1).to_vector<float>();
  for (int64_t r = 0; r < rows; ++r)
    CHECK(sd[r] == Approx(std::sqrt(ref_var(r, true))).epsilon(1e-5));
}

TEST_CASE("var, std and layer_norm of float64 rows near DBL_MAX: inf, not NaN") {
  // Found by a break-it pass: the mean is summed shifted by the row's first value, and the
  // shifted terms of [1e308, 3e307, 0.25, 0.25] (near -1e308) overflowed: mean -inf, var NaN.
  // The mean, 3.25e307, is finite; the variance, (6.75e307)² / 3 + ..., overflows: inf, as in
  // compiled code. layer_norm's rstd is then 0: its output 0 in every position.
  const std::vector<double> v{1e308, 3e307, 0.25, 0.25};
  Tensor x = from_vector(v, {1, 4});
  CHECK(var(x, 1).item<double>() == INFINITY);
  CHECK(kiln::std(x, 1, 0).item<double>() == INFINITY);
  CHECK(var(x.t().contiguous(), 0).item<double>() == INFINITY);  // the column path
  CHECK(mean(x, {1}).item<double>() == Approx(3.25e307).epsilon(1e-12));
  for (double y : layer_norm(x, Shape{4}).to_vector<double>()) CHECK(y == 0.0);
  // Its backward reads the same statistics: finite, no NaN.
  Tensor xg = x.clone().requires_grad_();
  sum(mul(layer_norm(xg, Shape{4}), tensor({1.0, -2.0, 3.0, 0.5}))).backward();
  for (double g : xg.grad().to_vector<double>()) CHECK(std::isfinite(g));
  // A row of +-inf still gives NaN (PyTorch), and a finite one is unchanged.
  CHECK(std::isnan(var(from_vector<double>({INFINITY, 1.0}, {1, 2}), 1).item<double>()));
  CHECK(var(from_vector<double>({1.0, 3.0}, {1, 2}), 1).item<double>() == 2.0);
}

TEST_CASE("var and std with N - correction <= 0 divide by zero as PyTorch") {
  // PyTorch 1.13: var([1,2,3], correction=3) = inf, correction=4 inf, var of a constant row nan.
  Tensor x = tensor({1.0f, 2.0f, 3.0f});
  CHECK(std::isinf(var(x, {0}, 3).item<float>()));
  CHECK(std::isinf(var(x, {0}, 4).item<float>()));
  CHECK(std::isinf(kiln::std(x, {0}, 3).item<float>()));
  CHECK(std::isnan(var(ones({3}), {0}, 3).item<float>()));
  CHECK(std::isinf(var(x.to(DType::Float64), {0}, 3).item<double>()));
}

namespace {
std::vector<double> values(const Tensor& t) { return t.to(DType::Float64).to_vector<double>(); }
}  // namespace

TEST_CASE("reductions take one dim as an integer, as in PyTorch; sum(x, {}) still means every dim") {
  Tensor x = from_vector(std::vector<double>{1, 2, 3, 4, 5, 6}, {2, 3});
  CHECK(values(sum(x, 1)) == std::vector<double>{6, 15});
  CHECK(values(x.sum(0)) == std::vector<double>{5, 7, 9});
  CHECK(values(x.mean(-1, true)) == std::vector<double>{2, 5});
  CHECK(values(amax(x, int64_t{0})) == std::vector<double>{4, 5, 6});
  CHECK(values(var(x, 1)) == std::vector<double>{1, 1});
  CHECK(values(kiln::std(x, 0, 0)) == std::vector<double>{1.5, 1.5, 1.5});
  CHECK(sum(x, {}).item<double>() == 21);
  CHECK(sum(x, {0}).shape() == Shape{3});
  try {
    (void)x.sum(2);
    FAIL("no error");
  } catch (const Error& e) {
    CHECK_THAT(e.what(), Catch::Contains("sum") && Catch::Contains(__FILE__));
  }
}

TEST_CASE("reductions of a large expanded view reduce its base, without copying it") {
  // Found by a fresh-user trial: ones({1}).expand({1e6, 1e6}).sum() asked for 4 TB. Each
  // result against float64 from the 3 base values; rows repeat each value 6e6 times.
  const int64_t n = 6'000'000;
  const std::vector<double> b = {0.5, -1.25, 2.0};
  Tensor base = from_vector(b, {3, 1}).to(Float32);
  Tensor x = base.expand({3, n});  // 1.8e7 elements, stride 0 along dim 1
  auto near = [](const Tensor& t, const std::vector<double>& want, double rel = 1e-6) {
    std::vector<double> got = t.to(Float64).to_vector<double>();
    REQUIRE(got.size() == want.size());
    for (size_t i = 0; i < got.size(); ++i) CHECK(got[i] == Approx(want[i]).epsilon(rel));
  };
  near(sum(x, 1), {0.5 * n, -1.25 * n, 2.0 * n});
  near(x.sum(1, true), {0.5 * n, -1.25 * n, 2.0 * n});
  CHECK(x.sum(1, true).shape() == Shape{3, 1});
  near(x.sum(), {1.25 * n});
  near(x.mean(1), b);
  near(amax(x, 1), b);
  near(amin(x), {-1.25});
  near(logsumexp(x, 1), {0.5 + std::log(double(n)), -1.25 + std::log(double(n)),
                         2.0 + std::log(double(n))});
  // A kept expanded dim is broadcast back: sum over dim 0 is the same for every column.
  Tensor s0 = sum(x, 0);
  CHECK(s0.shape() == Shape{n});
  near(s0.slice(0, n - 2, n), {1.25, 1.25});
  // var / std with corrections, against the closed form over 3n values.
  const double mean = 1.25 / 3, m2 = n * ((0.5 - mean) * (0.5 - mean) +
                                          (-1.25 - mean) * (-1.25 - mean) + (2 - mean) * (2 - mean));
  near(var(x, Dims{}, 1), {m2 / (3.0 * n - 1)}, 1e-5);
  near(kiln::std(x, Dims{}, 0), {std::sqrt(m2 / (3.0 * n))}, 1e-5);
  near(var(x, 1), {0, 0, 0});
  CHECK(std::isinf(var(x, Dims{}, 3 * n).item<float>()));  // N − correction = 0
  CHECK(std::isnan(var(x, 1, n).select(0, 0).item<float>()));  // and a constant row
  // prod: (1 + 1e-7)^(3n) in float64 terms; integers wrap as eager's do.
  Tensor p = full({1}, 1.0 + 1e-7, {Float64}).expand({3 * n});
  near(prod(p), {std::pow(1.0 + 1e-7, 3.0 * n)}, 1e-9);
  Tensor ones64 = ones({1}, {Int64}).expand({3 * n});
  CHECK(sum(ones64).item<int64_t>() == 3 * n);
  Tensor twos = full({1}, 2, {Int64}).expand({3 * n});
  CHECK(prod(twos).item<int64_t>() == 0);  // 2^(1.8e7) wraps to 0 in int64
  // The size the trial asked for: no copy, the exact count.
  CHECK(ones({1}).expand({1'000'000, 1'000'000}).sum().item<float>() == 1e12f);
  // bool and int32 views too: sum and prod read them as they are (an int64 copy of the view
  // was made first: 8 TB here).
  const int64_t huge = int64_t{1} << 40;
  CHECK(ones({1}, {Int32}).expand({huge}).sum().item<int64_t>() == huge);
  CHECK(full({1}, -3, {Int32}).expand({1 << 20, 1 << 20}).sum().item<int64_t>() == -3 * huge);
  CHECK(ones({1}, {Bool}).expand({huge}).sum().item<int64_t>() == huge);
  CHECK(full({1}, -1, {Int32}).expand({huge + 1}).prod().item<int64_t>() == -1);
}
