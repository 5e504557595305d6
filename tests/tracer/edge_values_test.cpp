// Compiled counterparts of eager edge cases (tests/eager): empty matrices in tril, host values
// that overflow the tensor's dtype — on the first call and on replays with a new value.
#include <catch2/catch.hpp>

#include <cmath>
#include <random>

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

TEST_CASE("maximum, minimum and clamp keep their first operand on ties of -0. and +0., eagerly "
          "and compiled (PyTorch)", "[compile][edge]") {
  // PyTorch 1.13: maximum([-0., 0.], [0., -0.]) = [-0., 0.], minimum alike; clamp([-0., 0.],
  // 0, 1) = [-0., 0.]; clamp([0., -0.], max=-0.) = [0., -0.]; NaN in either operand wins.
  Tensor a = tensor({-0.0f, 0.0f, NAN, 1.0f}), b = tensor({0.0f, -0.0f, 1.0f, NAN});
  auto signs = [](const Tensor& t) {
    std::vector<int> out;
    for (float v : t.to_vector<float>()) out.push_back(std::isnan(v) ? 2 : std::signbit(v));
    return out;
  };
  auto both = compile([](const Tensor& x, const Tensor& y) {
    return std::make_tuple(maximum(x, y) * 1.0f, minimum(x, y) * 1.0f, x.clamp(0.0, 1.0) * 1.0f);
  });
  for (int call = 0; call < 3; ++call) {
    auto [mx, mn, cl] = both(a, b);
    for (const Tensor& t : {maximum(a, b), mx}) CHECK(signs(t) == std::vector<int>{1, 0, 2, 2});
    for (const Tensor& t : {minimum(a, b), mn}) CHECK(signs(t) == std::vector<int>{1, 0, 2, 2});
    for (const Tensor& t : {a.clamp(0.0, 1.0), cl}) CHECK(signs(t) == std::vector<int>{1, 0, 2, 0});
  }
}

TEST_CASE("pow with a number exponent 0.5 or -0.5 is sqrt or rsqrt, eagerly and compiled "
          "(PyTorch)", "[compile][edge]") {
  // PyTorch 1.13: [-inf, -0., 4.].pow(0.5) = [nan, -0., 2.], .pow(-0.5) = [nan, -inf, 0.5]
  // (C's pow gives inf, 0 and inf, inf); a tensor exponent follows C's pow: [inf, 0., 2.].
  Tensor x = tensor({-INFINITY, -0.0f, 4.0f});
  auto half = [](const Tensor& t) { return t.pow(0.5) * 1.0f; };
  auto minus_half = [](const Tensor& t) { return t.pow(-0.5) * 1.0f; };
  auto ch = compile(half);
  auto cm = compile(minus_half);
  for (int call = 0; call < 3; ++call) {
    for (const Tensor& y : {half(x), ch(x)}) {
      std::vector<float> v = y.to_vector<float>();
      CHECK(std::isnan(v[0]));
      CHECK((v[1] == 0.0f && std::signbit(v[1])));
      CHECK(v[2] == 2.0f);
    }
    for (const Tensor& y : {minus_half(x), cm(x)}) {
      std::vector<float> v = y.to_vector<float>();
      CHECK(std::isnan(v[0]));
      CHECK(v[1] == -INFINITY);
      CHECK(v[2] == 0.5f);
    }
  }
  std::vector<float> c_pow = pow(x, scalar_tensor(0.5)).to_vector<float>();
  CHECK(c_pow[0] == INFINITY);
  CHECK((c_pow[1] == 0.0f && !std::signbit(c_pow[1])));
}

// PyTorch 1.13 multiplies the product by alpha = 0 rather than skip it as BLAS may: NaN and
// inf in it reach the result (an earlier review took BLAS's rule for PyTorch's; a later one
// checked torch.addmm itself).
TEST_CASE("addmm with alpha = 0 multiplies the product by 0 as PyTorch: NaN and inf in it reach "
          "the result, eagerly and compiled, float32 and float64",
          "[compile][edge]") {
  for (DType dt : {Float32, Float64}) {
    INFO(name(dt));
    Tensor a = from_vector<double>({INFINITY, 1, 2, -3}, {2, 2}).to(dt);
    Tensor b = ones({2, 3}, dt);
    Tensor bias = from_vector<double>({1, -2, 3}, {3}).to(dt);
    auto scaled = [](const Tensor& c, const Tensor& x, const Tensor& y) {
      return addmm(c, x, y, 2.0, 0.0);
    };
    auto dropped = [](const Tensor& c, const Tensor& x, const Tensor& y) {
      return addmm(c, x, y, 0.0, 0.0);
    };
    auto cs = compile(scaled);
    auto cd = compile(dropped);
    // torch.addmm(bias, a, b, beta=2, alpha=0): [[nan] * 3, [2, -4, 6]]; with beta=0 and a
    // NaN bias: [[nan] * 3, [-0] * 3].
    auto expect = [](const Tensor& r, const std::vector<double>& row1) {
      std::vector<double> v = r.to_vector<double>();
      REQUIRE(v.size() == 6);
      for (int j = 0; j < 3; ++j) {
        CHECK(std::isnan(v[j]));
        CHECK(v[3 + j] == row1[j]);
        CHECK(std::signbit(v[3 + j]) == std::signbit(row1[j]));
      }
    };
    for (int call = 0; call < 3; ++call) {
      expect(scaled(bias, a, b), {2, -4, 6});
      expect(cs(bias, a, b), {2, -4, 6});
      expect(dropped(bias * NAN, a, b), {-0.0, -0.0, -0.0});
      expect(cd(bias * NAN, a, b), {-0.0, -0.0, -0.0});
    }
    // alpha = -0. keeps its sign: -0. times positive products (re-review).
    auto negative_zero = [](const Tensor& c, const Tensor& x, const Tensor& y) {
      return addmm(c, x, y, 0.0, -0.0);
    };
    auto cn = compile(negative_zero);
    Tensor pos = ones({2, 2}, dt);
    for (const Tensor& r : {negative_zero(bias, pos, b), cn(bias, pos, b), cn(bias, pos, b)})
      for (double v : r.to_vector<double>()) CHECK((v == 0 && std::signbit(v)));
  }
}

TEST_CASE("dropout keeps NaN and inf visible: a dropped NaN or inf is NaN (x * mask, as "
          "PyTorch), a dropped -3 is -0, eagerly and compiled",
          "[compile][edge]") {
  const int64_t n = 64;
  std::vector<float> values;
  for (int64_t i = 0; i < n; ++i) values.push_back(i % 3 == 0 ? NAN : i % 3 == 1 ? INFINITY : -3);
  Tensor x = from_vector<float>(values, {n});
  auto f = [](const Tensor& t) { return dropout(t, 0.5); };
  auto cf = compile(f);
  manual_seed(4);
  std::vector<float> mask = dropout(ones({n}), 0.5).to_vector<float>();  // 2 kept, 0 dropped
  int dropped = 0;
  for (int call = 0; call < 3; ++call) {
    manual_seed(4);
    std::vector<float> eager = f(x).to_vector<float>();
    manual_seed(4);
    std::vector<float> compiled = cf(x).to_vector<float>();
    for (int64_t i = 0; i < n; ++i) {
      INFO("element " << i << " of " << values[i] << ", mask " << mask[i]);
      for (float y : {eager[i], compiled[i]}) {
        if (i % 3 == 2) {
          CHECK(y == (mask[i] == 0 ? 0.0f : -6.0f));
          CHECK(std::signbit(y));
        } else if (i % 3 == 1 && mask[i] != 0) {
          CHECK(y == INFINITY);
        } else {
          CHECK(std::isnan(y));
        }
      }
      dropped += mask[i] == 0;
    }
  }
  CHECK(dropped > 0);
}

TEST_CASE("compile: a float32 dot product over a long k is as accurate as eager's") {
  // Compiled code calls the same GEMM (cpu::sgemm), whose 1x1 products sum in double.
  const int64_t k = 4'000'000;
  manual_seed(0);
  Tensor v = rand({k}), w = rand({k});
  const double exact = matmul(v.to(Float64), w.to(Float64)).item<double>();
  auto f = compile([](const Tensor& a, const Tensor& b) { return matmul(a, b) * 2.0f; });
  for (int call = 0; call < 2; ++call)
    CHECK(std::abs(f(v, w).item<double>() - 2 * exact) < 2e-6 * exact);
}

TEST_CASE("layer_norm of float32 rows on a large offset with a small spread matches float64, "
          "eagerly and compiled, with its gradients") {
  // Rows 1e4 + 0.01·U(-3, 3): x - mean with the mean rounded to float32 (ulp(1e4) / 2 = 5e-4,
  // 3 % of the row's std) put the outputs off by up to 0.1 and dx by as much, relative. The
  // reference: float64 statistics and formulas over the same float32 values. Rows of 999
  // (row path) and of 5 (the block path of short rows).
  for (int64_t m : {999, 5}) {
    const int64_t rows = 12;
    std::mt19937 gen(static_cast<unsigned>(m));
    std::uniform_real_distribution<float> u(-3, 3);
    std::vector<float> xv(rows * m), wv(m), bv(m), cv(rows * m);
    for (float& e : xv) e = 1e4f + 0.01f * u(gen);
    for (float& e : wv) e = 1 + 0.5f * u(gen);
    for (float& e : bv) e = u(gen);
    for (float& e : cv) e = u(gen);
    const double eps = 1e-5;
    std::vector<double> y_ref(rows * m), dx_ref(rows * m), dw_ref(m, 0.0);
    for (int64_t r = 0; r < rows; ++r) {
      const float* x = &xv[r * m];
      double mean = 0, var = 0, a = 0, b = 0;
      for (int64_t i = 0; i < m; ++i) mean += x[i];
      mean /= m;
      for (int64_t i = 0; i < m; ++i) var += (x[i] - mean) * (x[i] - mean);
      const double rstd = 1 / std::sqrt(var / m + eps);
      auto xhat = [&](int64_t i) { return (x[i] - mean) * rstd; };
      auto gx = [&](int64_t i) { return double(cv[r * m + i]) * wv[i]; };
      for (int64_t i = 0; i < m; ++i) {
        y_ref[r * m + i] = xhat(i) * wv[i] + bv[i];
        a += gx(i) / m;
        b += gx(i) * xhat(i) / m;
        dw_ref[i] += cv[r * m + i] * xhat(i);
      }
      for (int64_t i = 0; i < m; ++i) dx_ref[r * m + i] = rstd * (gx(i) - a - xhat(i) * b);
    }
    auto norm = [m](const Tensor& x, const Tensor& w, const Tensor& b) {
      return layer_norm(x, {m}, w, b);
    };
    auto loss = [&](const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& c) {
      return (norm(x, w, b) * c).sum();
    };
    auto norm_c = compile(norm);
    auto loss_c = compile(loss);
    // Largest error relative to the reference's largest magnitude.
    auto rel_err = [](const Tensor& got, const std::vector<double>& want) {
      std::vector<float> g = got.to_vector<float>();
      double err = 0, scale = 0;
      for (size_t i = 0; i < want.size(); ++i) {
        err = std::max(err, std::abs(g[i] - want[i]));
        scale = std::max(scale, std::abs(want[i]));
      }
      return err / scale;
    };
    for (int call = 0; call < 3; ++call) {
      CAPTURE(m, call);
      Tensor x = from_vector(xv, {rows, m}).requires_grad_();
      Tensor w = from_vector(wv, {m}).requires_grad_();
      Tensor b = from_vector(bv, {m}), c = from_vector(cv, {rows, m});
      // The first call traces (eager kernels), the next ones replay compiled code.
      CHECK(rel_err(norm_c(x, w, b), y_ref) < 2e-6);
      loss_c(x, w, b, c).backward();
      CHECK(rel_err(x.grad(), dx_ref) < 2e-5);
      CHECK(rel_err(w.grad(), dw_ref) < 2e-5);
    }
    CHECK(rel_err(layer_norm(from_vector(xv, {rows, m}), {m}, from_vector(wv, {m}),
                             from_vector(bv, {m})), y_ref) < 2e-6);
    CHECK(norm_c.compile_count() == 1);
    CHECK(loss_c.compile_count() == 1);
  }
}
