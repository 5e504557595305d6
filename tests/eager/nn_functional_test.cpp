// softmax, log_softmax, layer_norm, nll_loss, cross_entropy, mse_loss against known answers
// and float64 references.
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <random>

#include "kiln/kiln.h"

using namespace kiln;

namespace {

std::vector<float> random_floats(int64_t n, uint32_t seed, float lo = -3, float hi = 3) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

// Double-precision softmax (or log_softmax) of x along `dim` (logical values).
std::vector<double> ref_softmax(const Tensor& x, int dim, bool log) {
  std::vector<double> v = x.to_vector<double>();
  const Shape& s = x.shape();
  int64_t a = 1, n = 1, b = 1;
  for (int i = 0; i < s.size(); ++i) (i < dim ? a : i == dim ? n : b) *= s[i];
  std::vector<double> out(v.size());
  for (int64_t i = 0; i < a; ++i)
    for (int64_t k = 0; k < b; ++k) {
      auto at = [&](int64_t j) { return (i * n + j) * b + k; };
      double m = -INFINITY;
      for (int64_t j = 0; j < n; ++j) m = std::max(m, v[at(j)]);
      double s = 0;
      for (int64_t j = 0; j < n; ++j) s += std::exp(v[at(j)] - m);
      for (int64_t j = 0; j < n; ++j)
        out[at(j)] = log ? v[at(j)] - m - std::log(s) : std::exp(v[at(j)] - m) / s;
    }
  return out;
}

void check_close(const std::vector<double>& got, const std::vector<double>& want, double rtol,
                 double atol) {
  REQUIRE(got.size() == want.size());
  int bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    bool ok = std::abs(got[i] - want[i]) <= atol + rtol * std::abs(want[i]);
    if (!ok && ++bad <= 5) {
      INFO("element " << i << ": got " << got[i] << ", want " << want[i]);
      CHECK(ok);
    }
  }
  CHECK(bad == 0);
}

}  // namespace

TEST_CASE("softmax and log_softmax: known values") {
  Tensor x = tensor<float>({{1, 2, 3}, {0, 0, 0}});
  std::vector<float> s = softmax(x, 1).to_vector<float>();
  const double e = std::exp(1.0), e2 = e * e, e3 = e2 * e, z = e + e2 + e3;
  CHECK(s[0] == Approx(e / z));
  CHECK(s[1] == Approx(e2 / z));
  CHECK(s[2] == Approx(e3 / z));
  CHECK(s[3] == Approx(1.0 / 3));
  std::vector<float> ls = log_softmax(x, -1).to_vector<float>();
  CHECK(ls[0] == Approx(1 - std::log(z)));
  CHECK(ls[2] == Approx(3 - std::log(z)));
  CHECK(ls[4] == Approx(-std::log(3.0)));
  // Along dim 0: each column of [[1,2,3],[0,0,0]].
  std::vector<float> c = softmax(x, 0).to_vector<float>();
  CHECK(c[0] == Approx(e / (e + 1)));
  CHECK(c[3] == Approx(1 / (e + 1)));
  CHECK(c[2] == Approx(e3 / (e3 + 1)));
  // Large logits do not overflow.
  std::vector<float> big = softmax(tensor<float>({1000, 1001}), 0).to_vector<float>();
  CHECK(big[0] == Approx(1 / (1 + e)));
  CHECK(big[1] == Approx(e / (1 + e)));
  CHECK(log_softmax(tensor<float>({-1000, -1001}), 0).to_vector<float>()[0] ==
        Approx(-std::log1p(1 / e)));
  // 0-d: softmax is 1, log_softmax 0; int input gives float.
  CHECK(softmax(scalar_tensor(5.0f), 0).item<float>() == 1);
  CHECK(log_softmax(scalar_tensor(5.0f), -1).item<float>() == 0);
  Tensor si = softmax(tensor<int32_t>({1, 1}), 0);
  CHECK(si.dtype() == Float32);
  CHECK(si.to_vector<float>() == std::vector<float>{0.5f, 0.5f});
  // A NaN poisons its row only; -inf entries get probability 0.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> n = softmax(tensor<float>({{1, nan}, {-inf, 0}}), 1).to_vector<float>();
  CHECK(std::isnan(n[0]));
  CHECK(std::isnan(n[1]));
  CHECK(n[2] == 0);
  CHECK(n[3] == 1);
  CHECK(log_softmax(tensor<float>({-inf, 0}), 0).to_vector<float>()[0] == -inf);
  // Empty.
  CHECK(softmax(empty({0, 4}), 1).shape() == Shape{0, 4});
  CHECK(softmax(empty({3, 0}), 1).shape() == Shape{3, 0});
  CHECK_THROWS_AS(softmax(x, 2), kiln::Error);
  CHECK_THROWS_AS(log_softmax(x, -3), kiln::Error);
}

TEST_CASE("softmax matches a float64 reference along every dim and layout") {
  const Shape shape{3, 37, 45};
  Tensor base = from_vector(random_floats(numel(shape), 5), shape);
  for (int layout = 0; layout < 2; ++layout) {
    // layout 1: same values, dims stored in reverse order (dense, non-contiguous).
    Tensor x = layout == 0 ? base : base.permute({2, 1, 0}).contiguous().permute({2, 1, 0});
    for (int dim = 0; dim < 3; ++dim) {
      for (bool log : {false, true}) {
        INFO("dim " << dim << " log " << log << " layout " << layout);
        Tensor y = log ? log_softmax(x, dim) : softmax(x, dim - 3 * (dim == 2));
        CHECK(y.shape() == shape);
        check_close(y.to_vector<double>(), ref_softmax(x, dim, log), 1e-5, 1e-6);
      }
    }
  }
  // Rows sum to 1; log_softmax = log(softmax); multi-stripe columns and long rows.
  for (const Shape& s : {Shape{64, 1000}, Shape{7, 2, 600}, Shape{2, 70000}}) {
    Tensor x = from_vector(random_floats(numel(s), 9), s);
    int dim = s.size() - 1;
    std::vector<double> sm = softmax(x, dim).to_vector<double>();
    std::vector<double> lsm = log_softmax(x, dim).to_vector<double>();
    check_close(sm, ref_softmax(x, dim, false), 1e-5, 1e-7);
    std::vector<double> log_sm(sm.size());
    for (size_t i = 0; i < sm.size(); ++i) log_sm[i] = std::log(sm[i]);
    check_close(lsm, log_sm, 1e-5, 1e-5);
    int64_t n = s[dim];
    for (int64_t r = 0; r < static_cast<int64_t>(sm.size()) / n; r += 3) {
      double total = 0;
      for (int64_t j = 0; j < n; ++j) total += sm[r * n + j];
      CHECK(total == Approx(1).epsilon(1e-5));
    }
    // Along dim 0 (column path).
    check_close(softmax(x, 0).to_vector<double>(), ref_softmax(x, 0, false), 1e-5, 1e-7);
    check_close(log_softmax(x, 0).to_vector<double>(), ref_softmax(x, 0, true), 1e-5, 1e-5);
  }
  // A long column: summed in float row after row it lost 9.5e-5 relative at 65536 rows (a
  // fresh user's trial); the column path now adds blocks of rows in double, as rows do.
  const Shape tall{65536, 20};
  Tensor x = from_vector(random_floats(numel(tall), 13), tall);
  check_close(softmax(x, 0).to_vector<double>(), ref_softmax(x, 0, false), 4e-6, 0);
  check_close(log_softmax(x, 0).to_vector<double>(), ref_softmax(x, 0, true), 4e-6, 1e-6);
}

TEST_CASE("softmax, log_softmax and layer_norm over short rows (blocks of rows) match float64") {
  // Rows shorter than 4 batches go through the short-row kernels: several blocks of rows and
  // a partial one, every length up to past the threshold, float32 and float64.
  for (DType dt : {DType::Float32, DType::Float64}) {
    for (int64_t n : {1, 2, 3, 7, 8, 10, 15, 16, 17, 31, 33, 63, 64, 65}) {
      const int64_t rows = 2048 / n * 2 + 5;
      Tensor x = from_vector(random_floats(rows * n, 40 + n), {rows, n}).to(dt);
      INFO(name(dt) << " n " << n);
      for (bool log : {false, true}) {
        Tensor y = log ? log_softmax(x, 1) : softmax(x, -1);
        REQUIRE(y.dtype() == dt);
        check_close(y.to_vector<double>(), ref_softmax(x, 1, log), 2e-6, 1e-7);
      }
      Tensor w = from_vector(random_floats(n, 50 + n, 0.5f, 1.5f), {n}).to(dt);
      Tensor b = from_vector(random_floats(n, 60 + n), {n}).to(dt);
      std::vector<double> xv = x.to_vector<double>(), wv = w.to_vector<double>(),
                          bv = b.to_vector<double>(), want(xv.size());
      for (int64_t r = 0; r < rows; ++r) {
        double mean = 0, var = 0;
        for (int64_t j = 0; j < n; ++j) mean += xv[r * n + j] / n;
        for (int64_t j = 0; j < n; ++j) var += (xv[r * n + j] - mean) * (xv[r * n + j] - mean) / n;
        for (int64_t j = 0; j < n; ++j)
          want[r * n + j] = (xv[r * n + j] - mean) / std::sqrt(var + 1e-5) * wv[j] + bv[j];
      }
      check_close(layer_norm(x, {n}, w, b).to_vector<double>(), want, 1e-5, 1e-5);
    }
  }
  // NaN and infinite rows among finite ones keep eager's semantics row by row.
  const float inf = INFINITY, nan = NAN;
  Tensor x = tensor<float>({{1, 2, 3}, {nan, 0, 1}, {-inf, -inf, -inf}, {inf, 0, 0}, {0, 0, 0},
                            {-inf, 0, 1}, {1e30f, -1e30f, 0}});
  std::vector<float> s = softmax(x, 1).to_vector<float>();
  std::vector<float> ls = log_softmax(x, 1).to_vector<float>();
  CHECK(s[0] == Approx(0.09003057f));
  CHECK(std::isnan(s[3]));
  CHECK(std::isnan(s[6]));
  CHECK(std::isnan(s[9]));  // inf − inf
  CHECK(s[12] == Approx(1 / 3.0f));
  CHECK(s[15] == 0);
  CHECK(ls[15] == -inf);
  CHECK(s[18] == 1);
  CHECK(s[19] == 0);
  CHECK(ls[18] == 0);
  CHECK(ls[19] == Approx(-2e30f));
  // A constant row normalises to exactly 0; a row past the float32 variance limit is finite.
  std::vector<float> ln =
      layer_norm(tensor<float>({{2.731f, 2.731f, 2.731f}, {3e38f, -3e38f, 0}}), {3}).to_vector<float>();
  CHECK(ln[0] == 0);
  CHECK(ln[3] == Approx(std::sqrt(1.5)).epsilon(1e-5));
  CHECK(ln[5] == Approx(0).margin(1e-6));
}

TEST_CASE("softmax over short rows: a row's bits do not depend on the thread count or on the "
          "rows around it") {
  // A break-it pass: float64 rows went partly through a scalar exp and log (libm's), partly
  // through the batch formulas, depending on where each block of rows started.
  for (DType dt : {DType::Float32, DType::Float64}) {
    for (int64_t n : {5, 16, 31}) {
      Tensor x = from_vector(random_floats(30000 * n, 80 + n), {30000, n}).to(dt);
      for (bool log : {false, true}) {
        INFO(name(dt) << " n " << n << " log " << log);
        auto run = [&](const Tensor& t) { return log ? log_softmax(t, 1) : softmax(t, 1); };
        const int saved = kiln::get_num_threads();
        kiln::set_num_threads(1);
        std::vector<double> one = run(x).to_vector<double>();
        kiln::set_num_threads(2);
        std::vector<double> two = run(x).to_vector<double>();
        kiln::set_num_threads(saved);
        size_t differ = 0;  // counted: Catch would print every element of the vectors
        for (size_t i = 0; i < one.size(); ++i) differ += one[i] != two[i];
        CHECK(differ == 0);
        for (int64_t r : {int64_t{0}, int64_t{17}, int64_t{15817}}) {
          std::vector<double> alone = run(x.slice(0, r, r + 1)).to_vector<double>();
          differ = 0;
          for (int64_t j = 0; j < n; ++j) differ += alone[j] != one[r * n + j];
          CHECK(differ == 0);
        }
      }
    }
  }
}

TEST_CASE("layer_norm matches a float64 reference") {
  auto ref = [](const Tensor& x, int64_t m, const std::vector<double>& w,
                const std::vector<double>& b, double eps) {
    std::vector<double> v = x.to_vector<double>();
    std::vector<double> out(v.size());
    for (size_t r = 0; r < v.size() / m; ++r) {
      double mean = 0, var = 0;
      for (int64_t j = 0; j < m; ++j) mean += v[r * m + j];
      mean /= m;
      for (int64_t j = 0; j < m; ++j) var += (v[r * m + j] - mean) * (v[r * m + j] - mean);
      var /= m;
      for (int64_t j = 0; j < m; ++j) {
        double y = (v[r * m + j] - mean) / std::sqrt(var + eps);
        if (!w.empty()) y *= w[j];
        if (!b.empty()) y += b[j];
        out[r * m + j] = y;
      }
    }
    return out;
  };
  // Offset data (mean 5) checks the variance is not computed as E[x²] − E[x]².
  const Shape shape{17, 6, 129};
  std::vector<float> v = random_floats(numel(shape), 11, 4, 6);
  Tensor x = from_vector(v, shape);
  Tensor w1 = from_vector(random_floats(129, 12, 0.5f, 1.5f), {129});
  Tensor b1 = from_vector(random_floats(129, 13), {129});
  check_close(layer_norm(x, {129}, w1, b1).to_vector<double>(),
              ref(x, 129, w1.to_vector<double>(), b1.to_vector<double>(), 1e-5), 1e-4, 1e-4);
  check_close(layer_norm(x, {129}).to_vector<double>(), ref(x, 129, {}, {}, 1e-5), 1e-4, 1e-4);
  check_close(layer_norm(x, {129}, w1).to_vector<double>(),
              ref(x, 129, w1.to_vector<double>(), {}, 1e-5), 1e-4, 1e-4);
  check_close(layer_norm(x, {129}, Tensor(), b1, 0.5).to_vector<double>(),
              ref(x, 129, {}, b1.to_vector<double>(), 0.5), 1e-4, 1e-4);
  // Two trailing dims, and a transposed input.
  Tensor w2 = from_vector(random_floats(6 * 129, 14), {6, 129});
  Tensor b2 = from_vector(random_floats(6 * 129, 15), {6, 129});
  check_close(layer_norm(x, {6, 129}, w2, b2).to_vector<double>(),
              ref(x, 6 * 129, w2.to_vector<double>(), b2.to_vector<double>(), 1e-5), 1e-4, 1e-4);
  Tensor xt = x.transpose(0, 2);  // [129, 6, 17]
  Tensor w3 = from_vector(random_floats(17, 16), {17});
  check_close(layer_norm(xt, {17}, w3).to_vector<double>(),
              ref(xt, 17, w3.to_vector<double>(), {}, 1e-5), 1e-4, 1e-4);
  // Known values: [1, 2, 3] → mean 2, var 2/3.
  std::vector<float> k =
      layer_norm(tensor<float>({1, 2, 3}), {3}, Tensor(), Tensor(), 0).to_vector<float>();
  CHECK(k[0] == Approx(-std::sqrt(1.5)));
  CHECK(k[1] == Approx(0).margin(1e-7));
  CHECK(k[2] == Approx(std::sqrt(1.5)));
  // A constant row normalises to 0 (times weight, plus bias).
  CHECK(layer_norm(tensor<float>({4, 4}), {2}, tensor<float>({2, 2}), tensor<float>({1, -1}))
            .to_vector<float>() == std::vector<float>{1, -1});
  CHECK(layer_norm(empty({0, 8}), {8}).shape() == Shape{0, 8});
  CHECK_THROWS_AS(layer_norm(x, {128}), kiln::Error);
  CHECK_THROWS_AS(layer_norm(x, {129}, tensor<float>({1, 2})), kiln::Error);
  CHECK_THROWS_AS(layer_norm(tensor<int32_t>({1, 2}), {2}), kiln::Error);
}

TEST_CASE("nll_loss and cross_entropy") {
  // Hand-computed: log_softmax([1,2,3]) = [1,2,3] − 3.40760596; log_softmax([0,0,0]) = −log 3.
  Tensor logits = tensor<float>({{1, 2, 3}, {0, 0, 0}});
  Tensor target = tensor<int64_t>({2, 1});
  const double l0 = 3.4076059644 - 3, l1 = std::log(3.0);
  CHECK(cross_entropy(logits, target).item<float>() == Approx((l0 + l1) / 2));
  CHECK(cross_entropy(logits, target, Reduction::Sum).item<float>() == Approx(l0 + l1));
  std::vector<float> none = cross_entropy(logits, target, Reduction::None).to_vector<float>();
  REQUIRE(none.size() == 2);
  CHECK(none[0] == Approx(l0));
  CHECK(none[1] == Approx(l1));
  CHECK(cross_entropy(logits, tensor<int32_t>({0, 1})).item<float>() ==
        Approx((3.4076059644 - 1 + l1) / 2));

  Tensor lp = tensor<float>({{-1, -2, -3}, {-4, -5, -6}, {-7, -8, -9}});
  Tensor t = tensor<int64_t>({0, 2, 1});
  CHECK(nll_loss(lp, t).item<float>() == Approx((1 + 6 + 8) / 3.0));
  CHECK(nll_loss(lp, t, Reduction::Sum).item<float>() == 15);
  CHECK(nll_loss(lp, t, Reduction::None).to_vector<float>() == std::vector<float>{1, 6, 8});
  CHECK(nll_loss(lp, t, Reduction::None).shape() == Shape{3});
  // Transposed input (strided access).
  CHECK(nll_loss(lp.t(), t, Reduction::None).to_vector<float>() == std::vector<float>{1, 8, 6});
  // ignore_index: skipped, mean divides by the count of the others.
  Tensor ti = tensor<int64_t>({0, -100, 1});
  CHECK(nll_loss(lp, ti).item<float>() == Approx((1 + 8) / 2.0));
  CHECK(nll_loss(lp, ti, Reduction::None).to_vector<float>() == std::vector<float>{1, 0, 8});
  CHECK(nll_loss(lp, tensor<int64_t>({2, 2, 2}), Reduction::Mean, 2).item<float>() !=
        nll_loss(lp, tensor<int64_t>({2, 2, 2}), Reduction::Mean, 2).item<float>());  // nan
  CHECK(nll_loss(lp, tensor<int64_t>({2, 2, 2}), Reduction::Sum, 2).item<float>() == 0);
  CHECK(nll_loss(lp, tensor<int64_t>({0, 1, 2}), Reduction::Sum, 1).item<float>() == 10);
  // 1-D input with a 0-d target.
  CHECK(nll_loss(tensor<float>({-0.5f, -1.5f}), scalar_tensor(1, Int64)).item<float>() == 1.5f);
  // float64 input keeps its dtype.
  CHECK(nll_loss(lp.to(Float64), t).dtype() == Float64);
  // Empty batch.
  Tensor e = nll_loss(empty({0, 3}), empty({0}, Int64));
  CHECK(std::isnan(e.item<float>()));
  CHECK(nll_loss(empty({0, 3}), empty({0}, Int64), Reduction::Sum).item<float>() == 0);

  // Errors: out-of-range targets name the value.
  CHECK_THROWS_WITH(nll_loss(lp, tensor<int64_t>({0, 3, 1})), Catch::Contains("target 3"));
  CHECK_THROWS_WITH(nll_loss(lp, tensor<int64_t>({-1, 0, 1})), Catch::Contains("target -1"));
  CHECK_THROWS_AS(cross_entropy(logits, tensor<int64_t>({5, 0})), kiln::Error);
  CHECK_THROWS_AS(nll_loss(lp, tensor<float>({0, 1, 2})), kiln::Error);
  CHECK_THROWS_AS(nll_loss(lp, tensor<int64_t>({0, 1})), kiln::Error);
}

TEST_CASE("cross_entropy and nll_loss take K-dimensional input [N, C, d] and target [N, d]") {
  // PyTorch 1.13 (float64): x = sin(0.1 * arange(24).reshape(2, 3, 4)) * 2, one target ignored.
  Tensor x = (sin(arange(24, DType::Float64).view({2, 3, 4}) * 0.1) * 2.0).requires_grad_();
  Tensor t = tensor<int64_t>({{0, 2, 1, 1}, {2, 0, -100, 1}});
  CHECK(cross_entropy(x, t).item<double>() == Approx(1.1647766492925822).epsilon(1e-12));
  CHECK(cross_entropy(x, t, Reduction::Sum).item<double>() ==
        Approx(8.153436545048075).epsilon(1e-12));
  Tensor none = cross_entropy(x, t, Reduction::None);
  REQUIRE(none.shape() == Shape{2, 4});
  std::vector<double> want{1.998417538526128, 0.5874642827536488, 1.1695599578509093,
                           1.1431729897674143, 1.1769342484578496, 1.056394534253639, 0.0,
                           1.0214929934384869};
  std::vector<double> got = none.detach().to_vector<double>();
  for (size_t i = 0; i < want.size(); ++i) CHECK(got[i] == Approx(want[i]).epsilon(1e-12));
  cross_entropy(x, t).backward();
  Tensor g = x.grad();
  std::vector<double> g00{g.select(0, 0).select(1, 0).to_vector<double>()};
  CHECK(g00[0] == Approx(-0.12349291204999195).epsilon(1e-12));
  CHECK(g00[1] == Approx(0.04219341963308957).epsilon(1e-12));
  CHECK(g00[2] == Approx(0.08129949241690239).epsilon(1e-12));
  CHECK(g.select(0, 1).select(1, 2).to_vector<double>() == std::vector<double>{0, 0, 0});
  // A target of the wrong shape names both shapes.
  CHECK_THROWS_WITH(nll_loss(x, tensor<int64_t>({0, 1})),
                    Catch::Contains("[2, 4]") && Catch::Contains("[2, 3, 4]") &&
                        Catch::Contains("[2]"));
}

TEST_CASE("mse_loss") {
  Tensor a = tensor<float>({1, 2, 3});
  Tensor b = tensor<float>({1, 0, 5});
  CHECK(mse_loss(a, b).item<float>() == Approx(8.0 / 3));
  CHECK(mse_loss(a, b, Reduction::Sum).item<float>() == 8);
  CHECK(mse_loss(a, b, Reduction::None).to_vector<float>() == std::vector<float>{0, 4, 4});
  CHECK(mse_loss(a, b).dim() == 0);
  // Broadcasting [2, 3] against [3].
  Tensor m = tensor<float>({{1, 2, 3}, {4, 5, 6}});
  CHECK(mse_loss(m, a, Reduction::None).to_vector<float>() == std::vector<float>{0, 0, 0, 9, 9, 9});
  CHECK(mse_loss(m, a, Reduction::Sum).item<float>() == 27);
  CHECK(mse_loss(m.t(), tensor<float>({1, 1}).view({1, 2}), Reduction::Sum).item<float>() ==
        0 + 9 + 1 + 16 + 4 + 25);
  // int inputs give float; float64 keeps float64.
  CHECK(mse_loss(tensor<int32_t>({1, 3}), tensor<int32_t>({0, 0})).item<float>() == 5);
  CHECK(mse_loss(a.to(Float64), b).dtype() == Float64);
  // Large: float64 reference.
  std::vector<float> u = random_floats(300001, 21), v = random_floats(300001, 22);
  double ref = 0;
  for (size_t i = 0; i < u.size(); ++i) ref += (double(u[i]) - v[i]) * (double(u[i]) - v[i]);
  Tensor tu = from_vector(u, {300001}), tv = from_vector(v, {300001});
  CHECK(mse_loss(tu, tv, Reduction::Sum).item<float>() == Approx(ref).epsilon(1e-6));
  CHECK(mse_loss(tu, tv).item<float>() == Approx(ref / u.size()).epsilon(1e-6));
  CHECK(std::isnan(mse_loss(empty({0}), empty({0})).item<float>()));
  CHECK(mse_loss(empty({0}), empty({0}), Reduction::Sum).item<float>() == 0);
  CHECK_THROWS_AS(mse_loss(a, tensor<float>({1, 2})), kiln::Error);
}

TEST_CASE("layer_norm of float32 rows whose variance overflows float32") {
  // float64 reference: the row [a, b, a, b] normalises to [1, -1, 1, -1]; [c, -c, -c, -c] to
  // [√3, -1/√3, -1/√3, -1/√3]. The float32 variance (1.8e75, 8.7e76) overflowed and gave NaN;
  // in the second row x - mean (5.1e38) itself is past FLT_MAX.
  const float a = 8.5e37f, b = -2.8e19f, c = 3.4e38f;
  Tensor x = from_vector<float>({a, b, a, b, c, -c, -c, -c, 1, 2, 3, 4}, {3, 4}).requires_grad_();
  Tensor y = layer_norm(x, {4});
  std::vector<float> v = y.to_vector<float>();
  const double r3 = std::sqrt(3.0), n = std::sqrt(1.25 + 1e-5);
  const std::vector<double> want = {1, -1, 1, -1, r3, -1 / r3, -1 / r3, -1 / r3,
                                    -1.5 / n, -0.5 / n, 0.5 / n, 1.5 / n};
  for (size_t i = 0; i < want.size(); ++i) CHECK(v[i] == Approx(want[i]).epsilon(1e-5));
  // Backward of Σ y·[1, 0, 0, 0]: rstd·(g - mean g - xhat·mean(g·xhat)); for row 0 rstd is
  // 1/4.25e37, so dx = [0.5, 0, -0.5, 0]·rstd (it was NaN: rstd from a float32 variance).
  (y * from_vector<float>({1, 0, 0, 0}, {4})).sum().backward();
  std::vector<float> g = x.grad().to_vector<float>();
  CHECK(g[0] == Approx(1.1764706047943377e-38).epsilon(1e-4));
  CHECK(g[2] == Approx(-1.1764706047943375e-38).epsilon(1e-4));
  CHECK(std::abs(g[1]) < 1e-43f);
  CHECK(std::abs(g[3]) < 1e-43f);
  for (int i = 4; i < 8; ++i) CHECK(std::abs(g[i]) < 1e-43f);  // float64: ~1e-55
  // Row 2 (ordinary): [0.75, -0.25, -0.25, -0.25]·rstd - xhat·mean(g·xhat)·rstd.
  const double x0 = -1.5 / n, mgx = x0 / 4;
  for (int j = 0; j < 4; ++j) {
    double xh = (j - 1.5) / n, gj = j == 0 ? 1.0 : 0.0;
    CHECK(g[8 + j] == Approx((gj - 0.25 - xh * mgx) / n).epsilon(1e-4));
  }
}

TEST_CASE("mse_loss mean of float32 differences whose squares overflow float32") {
  // (2e19)² = 4e38 is past FLT_MAX, the mean over 2 elements (2e38) is not: the float32
  // square made it inf. float64: (2e19f)² / 2.
  const float d = 2e19f;
  Tensor a = tensor<float>({d, 1}), b = tensor<float>({0, 1});
  CHECK(mse_loss(a, b).item<float>() == Approx(static_cast<double>(d) * d / 2).epsilon(1e-6));
  CHECK(std::isinf(mse_loss(a, b, Reduction::Sum).item<float>()));  // 4e38: inf is right
  // A long contiguous run (the SIMD path with float partial sums).
  std::vector<float> big(1000, 0.f);
  big[3] = d;
  Tensor x = from_vector(big, {1000}), z = zeros({1000});
  CHECK(mse_loss(x, z).item<float>() == Approx(static_cast<double>(d) * d / 1000).epsilon(1e-6));
}

TEST_CASE("layer_norm with an empty normalized_shape says it needs at least one dim") {
  // Was "normalized_shape [] does not match the last dims of input []".
  CHECK_THROWS_WITH(layer_norm(scalar_tensor(1.0), {}), Catch::Contains("at least 1 dim"));
  CHECK_THROWS_WITH(layer_norm(ones({2, 3}), {2}), Catch::Contains("does not match"));
}
