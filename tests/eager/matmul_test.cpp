// matmul / bmm / addmm / linear against a float64 reference computed here, and the GEMM
// kernels of backends/cpu/blas.h called directly.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdlib>
#include <vector>

#include "backends/cpu/blas.h"
#include "backends/cpu/parallel.h"
#include "kiln/kiln.h"

using namespace kiln;

namespace {

// Deterministic test values in [-1, 1) that are not all equal (no RNG dependence).
std::vector<double> values(int64_t n, int salt) {
  std::vector<double> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = std::fmod(0.37 * (i + 1) * (salt + 3) + 0.11 * salt, 2.0) - 1.0;
  return v;
}

// Integer dtypes get integers in [-10, 10].
Tensor make(const Shape& s, DType t, int salt) {
  std::vector<double> v = values(numel(s), salt);
  if (!is_floating(t))
    for (double& x : v) x = std::round(10 * x);
  return from_vector(v, s).to(t);
}

// Row-major element of `v` (shape s) at multi-index idx, broadcasting size-1 / missing dims.
double at(const std::vector<double>& v, const Shape& s, const std::vector<int64_t>& idx) {
  int64_t off = 0, stride = 1;
  int lead = static_cast<int>(idx.size()) - s.size();
  for (int d = s.size() - 1; d >= 0; --d) {
    int64_t i = s[d] == 1 ? 0 : idx[d + lead];
    off += i * stride;
    stride *= s[d];
  }
  return v[off];
}

// NumPy matmul semantics in float64, written independently of the kernel.
std::vector<double> ref_matmul(const Tensor& x, const Tensor& y, Shape& out_shape) {
  Shape xs = x.shape(), ys = y.shape();
  std::vector<double> xv = x.to_vector<double>(), yv = y.to_vector<double>();
  bool x1 = xs.size() == 1, y1 = ys.size() == 1;
  if (x1) xs = Shape{1, xs[0]};
  if (y1) ys = Shape{ys[0], 1};
  int64_t m = xs[xs.size() - 2], k = xs.back(), n = ys.back();
  Shape xb, yb;
  for (int i = 0; i + 2 < xs.size(); ++i) xb.push_back(xs[i]);
  for (int i = 0; i + 2 < ys.size(); ++i) yb.push_back(ys[i]);
  int r = std::max(xb.size(), yb.size());
  Shape batch = Dims::filled(r, 1);
  for (int i = 0; i < r; ++i) {
    int ix = i - (r - xb.size()), iy = i - (r - yb.size());
    int64_t a = ix >= 0 ? xb[ix] : 1, b = iy >= 0 ? yb[iy] : 1;
    batch[i] = a == 1 ? b : a;
  }
  std::vector<double> out;
  std::vector<int64_t> bidx(r, 0);
  for (int64_t bi = 0; bi < numel(batch); ++bi) {
    int64_t rem = bi;
    for (int d = r - 1; d >= 0; --d) bidx[d] = rem % batch[d], rem /= batch[d];
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double s = 0;
        for (int64_t p = 0; p < k; ++p) {
          std::vector<int64_t> ia = bidx, ib = bidx;
          ia.insert(ia.end(), {i, p});
          ib.insert(ib.end(), {p, j});
          s += at(xv, xs, ia) * at(yv, ys, ib);
        }
        out.push_back(s);
      }
  }
  out_shape = batch;
  if (!x1) out_shape.push_back(m);
  if (!y1) out_shape.push_back(n);
  return out;
}

void check_matmul(const Tensor& x, const Tensor& y, double tol) {
  Shape want_shape;
  std::vector<double> want = ref_matmul(x, y, want_shape);
  Tensor z = matmul(x, y);
  INFO("x " << to_string(x.shape()) << " y " << to_string(y.shape()));
  REQUIRE(z.shape() == want_shape);
  std::vector<double> got = z.to_vector<double>();
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) CHECK(got[i] == Approx(want[i]).margin(tol));
}

}  // namespace

TEST_CASE("matmul 2-D known values") {
  Tensor a = tensor({{1.f, 2.f, 3.f}, {4.f, 5.f, 6.f}});
  Tensor b = tensor({{7.f, 8.f}, {9.f, 10.f}, {11.f, 12.f}});
  Tensor c = matmul(a, b);
  CHECK(c.shape() == Shape{2, 2});
  CHECK(c.dtype() == DType::Float32);
  CHECK(c.to_vector<float>() == std::vector<float>{58, 64, 139, 154});
}

TEST_CASE("matmul shapes and broadcasting against a float64 reference") {
  for (DType t : {DType::Float32, DType::Float64}) {
    double tol = t == DType::Float32 ? 1e-4 : 1e-12;
    INFO("dtype " << name(t));
    check_matmul(make({5, 7}, t, 1), make({7, 3}, t, 2), tol);
    check_matmul(make({7}, t, 1), make({7}, t, 2), tol);            // dot -> 0-d
    check_matmul(make({7}, t, 3), make({7, 4}, t, 4), tol);         // vec @ mat
    check_matmul(make({4, 7}, t, 5), make({7}, t, 6), tol);         // mat @ vec
    check_matmul(make({2, 1, 3, 4}, t, 7), make({5, 4, 2}, t, 8), tol);  // -> [2, 5, 3, 2]
    check_matmul(make({3, 4, 6}, t, 9), make({6, 5}, t, 10), tol);  // folds into one GEMM
    check_matmul(make({6}, t, 11), make({3, 6, 2}, t, 12), tol);    // vec @ batch
    check_matmul(make({3, 2, 6}, t, 13), make({6}, t, 14), tol);    // batch @ vec
    check_matmul(make({6}, t, 19), make({6, 2}, t, 20).expand({3, 6, 2}), tol);
    check_matmul(make({3, 5, 4}, t, 21).transpose(1, 2), make({5, 2}, t, 22), tol);  // no fold
    check_matmul(make({2, 3, 4, 6}, t, 23).slice(2, 0, 4, 2), make({6, 5}, t, 24), tol);
    check_matmul(make({1, 1}, t, 15), make({1, 1}, t, 16), tol);
    // Larger than one cache block in every dim (exercises blocking and threading).
    check_matmul(make({67, 300}, t, 17), make({300, 45}, t, 18), t == DType::Float32 ? 1e-3 : 1e-10);
  }
  Tensor z = matmul(make({7}, Float32, 1), make({7}, Float32, 2));
  CHECK(z.dim() == 0);
  Tensor w = matmul(make({2, 1, 3, 4}, Float32, 1), make({5, 4, 2}, Float32, 2));
  CHECK(w.shape() == Shape{2, 5, 3, 2});
}

TEST_CASE("matmul of transposed and strided views") {
  for (DType t : {DType::Float32, DType::Float64, DType::Int64}) {
    INFO("dtype " << name(t));
    double tol = t == DType::Float32 ? 1e-4 : 1e-9;
    Tensor a = make({6, 5}, t, 1);  // a.t() is [5, 6] with unit row stride
    Tensor b = make({4, 6}, t, 2);
    check_matmul(a.t(), b.t(), tol);
    check_matmul(a.t(), make({6, 3}, t, 3), tol);
    check_matmul(make({3, 6}, t, 4), b.t().slice(1, 0, 3), tol);
    // No unit stride in either dim: a step-2 slice of a transpose.
    Tensor s = make({8, 10}, t, 5).slice(1, 0, 10, 2).slice(0, 0, 8, 2);  // [4, 5]
    check_matmul(s, make({5, 3}, t, 6), tol);
    check_matmul(make({3, 4}, t, 7), s, tol);
    // Batched transposes and an expanded (stride-0) batch.
    Tensor bt = make({3, 4, 5}, t, 8).transpose(1, 2);  // [3, 5, 4]
    check_matmul(bt, make({3, 4, 2}, t, 9), tol);
    check_matmul(make({2, 5}, t, 10).expand({3, 2, 5}), bt, tol);
    // Strided 1-D operands.
    check_matmul(make({10}, t, 11).slice(0, 0, 10, 2), make({5}, t, 12), tol);
    check_matmul(make({5, 3}, t, 13).select(1, 1), make({5, 2}, t, 14), tol);
  }
}

TEST_CASE("matmul integer dtypes are exact") {
  Tensor a = tensor({{1, 2, 3}, {4, 5, 6}}, {Int64});
  Tensor b = tensor({{7, 8}, {9, 10}, {11, 12}}, {Int64});
  Tensor c = matmul(a, b);
  CHECK(c.dtype() == DType::Int64);
  CHECK(c.to_vector<int64_t>() == std::vector<int64_t>{58, 64, 139, 154});
  Tensor ai = tensor({{1, 2, 3}, {4, 5, 6}});  // int32
  CHECK(matmul(ai, ai.t()).dtype() == DType::Int32);
  CHECK(matmul(ai, ai.t()).to_vector<int32_t>() == std::vector<int32_t>{14, 32, 32, 77});
  // Large values beyond float precision stay exact.
  Tensor big1 = tensor({(int64_t{1} << 30) + 1, int64_t{3}});
  Tensor big2 = tensor({(int64_t{1} << 20) + 1, int64_t{5}});
  CHECK(matmul(big1, big2).item<int64_t>() ==
        (int64_t{1} << 50) + (int64_t{1} << 30) + (int64_t{1} << 20) + 1 + 15);
  // Mixed dtypes promote: int32 @ float32 is float32.
  Tensor f = tensor({{1.f}, {2.f}, {3.f}});
  Tensor mixed = matmul(ai, f);
  CHECK(mixed.dtype() == DType::Float32);
  CHECK(mixed.to_vector<float>() == std::vector<float>{14, 32});
  std::vector<int64_t> iv(9 * 70), jv(70 * 11);
  for (size_t i = 0; i < iv.size(); ++i) iv[i] = static_cast<int64_t>(i * 7 % 23) - 11;
  for (size_t i = 0; i < jv.size(); ++i) jv[i] = static_cast<int64_t>(i * 5 % 19) - 9;
  check_matmul(from_vector(iv, {9, 70}), from_vector(jv, {70, 11}), 0);
  check_matmul(from_vector(iv, {9, 70}).to(Int32).t(), from_vector(iv, {9, 70}).to(Int32), 0);
}

TEST_CASE("matmul with an empty inner dim gives zeros, empty outer dims give empty") {
  for (DType t : {DType::Float32, DType::Float64, DType::Int32}) {
    Tensor z = matmul(zeros({3, 0}, {t}), zeros({0, 4}, {t}));
    CHECK(z.shape() == Shape{3, 4});
    CHECK(z.to_vector<double>() == std::vector<double>(12, 0.0));
    CHECK(matmul(zeros({0, 5}, {t}), zeros({5, 4}, {t})).shape() == Shape{0, 4});
    CHECK(matmul(zeros({2, 0, 5}, {t}), zeros({5, 4}, {t})).shape() == Shape{2, 0, 4});
    CHECK(matmul(zeros({0}, {t}), zeros({0}, {t})).item<double>() == 0.0);
  }
}

TEST_CASE("matmul errors name both shapes") {
  try {
    matmul(zeros({2, 3}), zeros({4, 5}));
    FAIL("expected kiln::Error");
  } catch (const Error& e) {
    CHECK(e.op() == "matmul");
    CHECK_THAT(e.message(), Catch::Contains("[2, 3]") && Catch::Contains("[4, 5]"));
  }
  CHECK_THROWS_AS(matmul(zeros({2, 2, 3}), zeros({3, 3, 2})), Error);  // batch 2 vs 3
  CHECK_THROWS_AS(matmul(zeros({}), zeros({2})), Error);
  CHECK_THROWS_AS(matmul(zeros({2}, {Bool}), zeros({2}, {Bool})), Error);
  CHECK_THROWS_AS(bmm(zeros({2, 2, 3}), zeros({3, 3, 2})), Error);
  CHECK_THROWS_AS(bmm(zeros({2, 3}), zeros({3, 2})), Error);
}

TEST_CASE("bmm") {
  Tensor a = make({4, 3, 5}, Float32, 1), b = make({4, 5, 2}, Float32, 2);
  Tensor c = bmm(a, b);
  CHECK(c.shape() == Shape{4, 3, 2});
  Shape s;
  std::vector<double> want = ref_matmul(a, b, s);
  std::vector<double> got = c.to_vector<double>();
  for (size_t i = 0; i < got.size(); ++i) CHECK(got[i] == Approx(want[i]).margin(1e-5));
}

TEST_CASE("addmm: beta * bias + alpha * (a @ b), bias broadcast") {
  Tensor a = tensor({{1.f, 2.f}, {3.f, 4.f}});
  Tensor b = tensor({{5.f, 6.f}, {7.f, 8.f}});  // a@b = [[19, 22], [43, 50]]
  Tensor bias = tensor({1.f, -1.f});
  CHECK(addmm(bias, a, b).to_vector<float>() == std::vector<float>{20, 21, 44, 49});
  CHECK(addmm(bias, a, b, 2, 0.5).to_vector<float>() ==
        std::vector<float>{11.5f, 9.f, 23.5f, 23.f});
  Tensor col = tensor({{10.f}, {20.f}});
  CHECK(addmm(col, a, b, 1, 1).to_vector<float>() == std::vector<float>{29, 32, 63, 70});
  // beta = 0 ignores the bias, NaNs included.
  Tensor nan_bias = full({2, 2}, std::nan(""));
  CHECK(addmm(nan_bias, a, b, 0, 1).to_vector<float>() == std::vector<float>{19, 22, 43, 50});
  // float64 and int64 through kiln's own kernel; a transposed operand.
  Tensor ad = a.to(Float64), bd = b.to(Float64);
  CHECK(addmm(scalar_tensor(0.5, {Float64}), ad.t(), bd, 2, 3).to_vector<double>() ==
        std::vector<double>{3 * 26 + 1, 3 * 30 + 1, 3 * 38 + 1, 3 * 44 + 1});
  Tensor ai = a.to(Int64), bi = b.to(Int64);
  CHECK(addmm(tensor({1, 2}, {Int64}), ai, bi, 3, 2).to_vector<int64_t>() ==
        std::vector<int64_t>{41, 50, 89, 106});
  // A float beta or alpha on integer tensors raises, as PyTorch (beta 0.5 acted as 0).
  CHECK_THROWS_WITH(addmm(tensor({1, 2}, {Int64}), ai, bi, 0.5, 1),
                    Catch::Contains("beta must not be a floating point number"));
  CHECK_THROWS_WITH(addmm(tensor({1, 2}, {Int64}), ai, bi, 1, 1.5),
                    Catch::Contains("alpha must not be a floating point number"));
  // Empty inner dim: the result is beta * bias.
  CHECK(addmm(bias, zeros({2, 0}), zeros({0, 2}), 3, 1).to_vector<float>() ==
        std::vector<float>{3, -3, 3, -3});
  // A dtype mismatch promotes (int bias, float matrices).
  CHECK(addmm(tensor({1, 1}), a, b).to_vector<float>() == std::vector<float>{20, 23, 44, 51});
  CHECK_THROWS_AS(addmm(zeros({3}), a, b), Error);
  CHECK_THROWS_AS(addmm(zeros({2}), zeros({2, 2, 2}), b), Error);
}

TEST_CASE("linear: x @ weight^T + bias") {
  Tensor w = make({3, 4}, Float32, 1);  // [out, in]
  Tensor bias = tensor({0.5f, -1.f, 2.f});
  Tensor x = make({5, 4}, Float32, 2);
  Shape s;
  std::vector<double> xw = ref_matmul(x, w.t(), s);
  std::vector<float> bv = bias.to_vector<float>();
  std::vector<double> got = linear(x, w, bias).to_vector<double>();
  REQUIRE(got.size() == 15);
  for (int i = 0; i < 5; ++i)
    for (int j = 0; j < 3; ++j) CHECK(got[i * 3 + j] == Approx(xw[i * 3 + j] + bv[j]).margin(1e-5));
  // Batched input without bias folds into one GEMM with a transposed weight.
  Tensor x3 = make({2, 5, 4}, Float32, 3);
  std::vector<double> want3 = ref_matmul(x3, w.t(), s);
  Tensor y3 = linear(x3, w);
  CHECK(y3.shape() == Shape{2, 5, 3});
  std::vector<double> got3 = y3.to_vector<double>();
  for (size_t i = 0; i < got3.size(); ++i) CHECK(got3[i] == Approx(want3[i]).margin(1e-5));
  CHECK_THROWS_AS(linear(x, make({3, 5}, Float32, 1)), Error);
  // The error speaks of features and the weight as given, not of the transposed product.
  CHECK_THROWS_WITH(linear(x, make({3, 5}, Float32, 1)),
                    Catch::Contains("has 4 features in its last dim; the weight [3, 5] "
                                    "[out_features, in_features] takes 5"));
}

TEST_CASE("large matmul: correct, and the same on one thread and on the pool") {
  // Big enough that every dtype's kernel splits rows across the pool (> 16 MFLOP per block).
  const int64_t m = 300, k = 400, n = 200;
  int saved = cpu::num_threads();
  for (DType t : {DType::Float32, DType::Float64, DType::Int64}) {
    INFO("dtype " << name(t));
    Tensor a = make({m, k}, t, 1), b = make({k, n}, t, 2);
    std::vector<double> av = a.to_vector<double>(), bv = b.to_vector<double>();
    cpu::set_num_threads(1);
    std::vector<double> one = matmul(a, b).to_vector<double>();
    cpu::set_num_threads(2);
    std::vector<double> two = matmul(a, b).to_vector<double>();
    cpu::set_num_threads(saved);
    if (t != DType::Float32) CHECK(one == two);  // oneDNN may split k differently
    bool ok = true;
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double s = 0;
        for (int64_t p = 0; p < k; ++p) s += av[i * k + p] * bv[p * n + j];
        double tol = t == DType::Float32 ? 1e-3 * (1 + std::abs(s)) : 1e-9 * (1 + std::abs(s));
        ok &= std::abs(one[i * n + j] - s) <= tol && std::abs(two[i * n + j] - s) <= tol;
      }
    CHECK(ok);
  }
  // Many small products in one batch (spread over the pool, one thread each).
  const int64_t nb = 64, bm = 64, bk = 48, bn = 64;
  for (DType t : {DType::Float32, DType::Float64}) {
    Tensor ba = make({nb, bm, bk}, t, 3), bb = make({nb, bk, bn}, t, 4);
    cpu::set_num_threads(1);
    std::vector<double> one_b = matmul(ba, bb).to_vector<double>();
    cpu::set_num_threads(2);
    std::vector<double> two_b = matmul(ba, bb).to_vector<double>();
    cpu::set_num_threads(saved);
    CHECK(one_b == two_b);
    std::vector<double> av = ba.to_vector<double>(), bv = bb.to_vector<double>();
    bool ok = true;
    for (int64_t q = 0; q < nb; ++q)
      for (int64_t i = 0; i < bm; ++i)
        for (int64_t j = 0; j < bn; ++j) {
          double s = 0;
          for (int64_t p = 0; p < bk; ++p) s += av[(q * bm + i) * bk + p] * bv[(q * bk + p) * bn + j];
          ok &= std::abs(two_b[(q * bm + i) * bn + j] - s) <= 1e-4 * (1 + std::abs(s));
        }
    CHECK(ok);
  }
}

TEST_CASE("blas.h: gemm on arbitrary strides and sgemm transposes") {
  // C = alpha * A @ B + beta * C with A given column-major (rsa = 1) and B with stride-0 rows.
  const int64_t m = 13, n = 37, k = 300;
  std::vector<double> a = values(m * k, 1), b = values(n, 2), c0 = values(m * n, 3);
  std::vector<double> c = c0;
  cpu::gemm<double>(m, n, k, 2.0, a.data(), 1, m, b.data(), 0, 1, -0.5, c.data(), n);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t p = 0; p < k; ++p) s += a[i + p * m] * b[j];
      CHECK(c[i * n + j] == Approx(2 * s - 0.5 * c0[i * n + j]).margin(1e-10));
    }
  // float through the same template (the fallback when oneDNN is missing).
  std::vector<float> af(a.begin(), a.end()), bf(b.begin(), b.end()), cf(m * n, 7.f);
  cpu::gemm<float>(m, n, k, 1.f, af.data(), 1, m, bf.data(), 0, 1, 0.f, cf.data(), n);
  for (int64_t i = 0; i < m; ++i) {
    double s = 0;
    for (int64_t p = 0; p < k; ++p) s += double(af[i + p * m]) * bf[0];
    CHECK(cf[i * n] == Approx(s).margin(1e-3));
  }
  // sgemm with both operands transposed: op(A) = Aᵀ where A is k×m, op(B) = Bᵀ where B is n×k.
  std::vector<double> ad = values(k * m, 4), bd = values(n * k, 5);
  std::vector<float> a2(ad.begin(), ad.end()), b2(bd.begin(), bd.end()), c2(m * n, 1.f);
  REQUIRE(cpu::sgemm(true, true, m, n, k, 1.f, a2.data(), m, b2.data(), k, 1.f, c2.data(), n));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 1;
      for (int64_t p = 0; p < k; ++p) s += double(a2[p * m + i]) * b2[j * k + p];
      CHECK(c2[i * n + j] == Approx(s).margin(1e-3));
    }
  // Integer GEMM wraps on overflow (computed in unsigned arithmetic).
  int32_t x = 1 << 30, y = 4, z = 0;
  cpu::gemm<int32_t>(1, 1, 1, 1, &x, 1, 1, &y, 1, 1, 0, &z, 1);
  CHECK(z == 0);
  // oneDNN is installed on the build machines (KILN_ONEDNN=0 forces kiln's own kernel).
  if (!std::getenv("KILN_ONEDNN")) {
    CHECK(cpu::onednn_available());
    // Loading it set OpenMP's passive wait policy (unless the user chose one).
    CHECK(std::getenv("OMP_WAIT_POLICY") != nullptr);
  }
}

namespace {

struct GemmShape { int64_t m, n, k; bool ta, tb; };

// out == alpha·op(A)·op(B) + beta·C in float64 within 1e-4 relative, the padding of each row of
// C past n (ldc > n) left alone.
bool matches_reference(GemmShape s, double alpha, double beta, const std::vector<float>& a,
                       int64_t lda, const std::vector<float>& b, int64_t ldb,
                       const std::vector<float>& c, const std::vector<float>& out, int64_t ldc) {
  bool ok = true;
  for (int64_t i = 0; i < s.m; ++i)
    for (int64_t j = 0; j < ldc; ++j) {
      double want = c[i * ldc + j];
      if (j < s.n) {
        double sum = 0;
        for (int64_t p = 0; p < s.k; ++p)
          sum += double(a[s.ta ? p * lda + i : i * lda + p]) * b[s.tb ? j * ldb + p : p * ldb + j];
        want = alpha * sum + beta * want;
      }
      ok &= std::abs(out[i * ldc + j] - want) <= 1e-4 * (1 + std::abs(want));
    }
  return ok;
}

}  // namespace

TEST_CASE("blas.h: sgemm split into row or column blocks on the pool matches a float64 reference") {
  // Products of at least kSplitGemmMinFlops are split into blocks of C, one per thread: rows
  // (offsets into A and C) or, for a short C, columns (offsets into B and C). Every operand
  // layout, a padded C (ldc > n) and beta = 1 check that each block reads and writes its part.
  const int saved = cpu::num_threads();
  cpu::set_num_threads(2);
  // `conflict`: leading dims of A and B rounded up to a multiple of 1024 floats, which sgemm
  // copies to padded rows first (B always, A when transposed; blas.cpp).
  struct Case { int64_t m, n, k; bool ta, tb, conflict = false; };
  for (Case s : {Case{96, 80, 1100, false, false}, Case{96, 80, 1100, true, false},
                 Case{96, 80, 1100, false, true}, Case{96, 80, 1100, true, true},
                 Case{8, 4096, 256, false, true}, Case{8, 4096, 256, true, false},
                 Case{256, 256, 256, true, false, true}, Case{64, 512, 512, false, false, true},
                 Case{64, 512, 512, false, true, true}, Case{96, 80, 1100, true, true, true},
                 Case{8, 4096, 256, false, false, true}}) {
    CAPTURE(s.m, s.n, s.k, s.ta, s.tb, s.conflict);
    REQUIRE(2.0 * s.m * s.n * s.k >= cpu::kSplitGemmMinFlops);
    auto ld = [&](int64_t cols, int64_t pad) {
      return s.conflict ? (cols + 1023) / 1024 * 1024 : cols + pad;
    };
    const int64_t lda = ld(s.ta ? s.m : s.k, 3), ldb = ld(s.tb ? s.k : s.n, 5), ldc = s.n + 7;
    std::vector<double> ad = values((s.ta ? s.k : s.m) * lda, 6), bd = values((s.tb ? s.n : s.k) * ldb, 7),
                        cd = values(s.m * ldc, 8);
    std::vector<float> a(ad.begin(), ad.end()), b(bd.begin(), bd.end()), c(cd.begin(), cd.end());
    for (int threads : {1, 2}) {
      std::vector<float> out = c;
      REQUIRE(cpu::sgemm(s.ta, s.tb, s.m, s.n, s.k, 0.5f, a.data(), lda, b.data(), ldb, 1.f,
                         out.data(), ldc, threads));
      CHECK(matches_reference({s.m, s.n, s.k, s.ta, s.tb}, 0.5, 1.0, a, lda, b, ldb, c, out, ldc));
    }
  }
  cpu::set_num_threads(saved);
}

TEST_CASE("blas.h: narrow sgemm products (computed transposed) match a float64 reference") {
  // n < kNarrowN columns with A or B transposed run as Cᵀ = op(B)ᵀ·op(A)ᵀ and a transpose into
  // C (with oneDNN; kiln's own kernel otherwise); the other layouts directly. Every layout,
  // beta 0 (a NaN in C is overwritten) and 1, a padded C (ldc > n: the padding is left alone).
  if (!cpu::onednn_available()) WARN("oneDNN missing: the transposed path is not taken");
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (int64_t n : {1, 3, 10, 15})
        for (int64_t m : {32, 64})
          for (int64_t k : {7, 128})
            for (float beta : {0.0f, 1.0f}) {
              CAPTURE(ta, tb, n, m, k, beta);
              const int64_t lda = (ta ? m : k) + 3, ldb = (tb ? k : n) + 5, ldc = n + 2;
              std::vector<double> ad = values((ta ? k : m) * lda, 2);
              std::vector<double> bd = values((tb ? n : k) * ldb, 4), cd = values(m * ldc, 5);
              std::vector<float> a(ad.begin(), ad.end()), b(bd.begin(), bd.end());
              std::vector<float> c(cd.begin(), cd.end());
              if (beta == 0.0f) c[0] = NAN;
              std::vector<float> out = c;
              REQUIRE(cpu::sgemm(ta, tb, m, n, k, 0.5f, a.data(), lda, b.data(), ldb, beta,
                                 out.data(), ldc, 1));
              if (beta == 0.0f) c[0] = 0.0f;  // beta 0 overwrites: the reference adds nothing
              CHECK(matches_reference({m, n, k, ta, tb}, 0.5, beta, a, lda, b, ldb, c, out, ldc));
            }
}

TEST_CASE("gemm_time counts each matmul op once, a spread batch too, and none inside a region") {
  Tensor a = randn({64, 48}), b = randn({48, 32});
  Tensor qa = randn({16, 40, 32}), qb = randn({16, 32, 40});  // small products: spread
  cpu::GemmTime t0 = cpu::gemm_time();
  Tensor c = matmul(a, b);
  cpu::GemmTime t1 = cpu::gemm_time();
  CHECK(t1.ops == t0.ops + 1);
  CHECK(t1.ns > t0.ns);
  Tensor s = matmul(qa, qb);
  cpu::GemmTime t2 = cpu::gemm_time();
  CHECK(t2.ops == t1.ops + 1);
  // Inside a parallel region the calls overlap in time: not counted (the caller's wall time
  // is the region's).
  cpu::parallel_for(0, 4, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) (void)matmul(a, b).data<float>();
  });
  CHECK(cpu::gemm_time().ops == t2.ops);
  CHECK(c.shape() == Shape{64, 32});
  CHECK(s.shape() == Shape{16, 40, 40});
}

TEST_CASE("a float32 dot product (1x1 result) is accurate over a long k") {
  // Review (a new user's trial): matmul(v, w) of 4e6 floats was 1.8e-3 off the float64 value;
  // PyTorch's sdot 1.1e-6. Positive terms, so the float64 sum is a tight reference.
  const int64_t k = 4'000'000;
  manual_seed(0);
  Tensor v = rand({k}), w = rand({k});
  const double exact = matmul(v.to(Float64), w.to(Float64)).item<double>();
  auto error = [&](const Tensor& r) { return std::abs(r.item<double>() - exact) / exact; };
  CHECK(error(matmul(v, w)) < 1e-6);
  CHECK(error(matmul(v.view({1, k}), w.view({k, 1}))) < 1e-6);
  CHECK(error(linear(v, w.view({1, k}))) < 1e-6);
  CHECK(error(bmm(v.view({1, 1, k}), w.view({1, k, 1}))) < 1e-6);
  // Strided operands (a column of a transposed matrix) and beta / alpha through addmm.
  Tensor vt = v.view({k / 2, 2}).t();  // [2, k/2]: rows with stride 2
  Tensor col = w.view({k / 2, 2}).select(1, 0).view({k / 2, 1});
  const double row0 =
      matmul(vt.select(0, 1).to(Float64).view({1, k / 2}), col.to(Float64)).item<double>();
  CHECK(std::abs(matmul(vt.select(0, 1).view({1, k / 2}), col).item<double>() - row0) <
        1e-6 * row0);
  Tensor bias = tensor({2.0f}).view({1, 1});
  const double want = 3 * exact + 2 * 2.0;
  Tensor r = addmm(bias, v.view({1, k}), w.view({k, 1}), 2.0, 3.0);
  CHECK(std::abs(r.item<double>() - want) < 1e-6 * want);
}

// ---- Small products (blas.h, small_gemm): batches of tiny matrices go through kiln's
// small-matrix kernel instead of one BLAS call per product. Checked against a reference by
// index arithmetic, every dtype, at sizes around the kernel's bounds and its tile shapes.
namespace {

// NumPy matmul of x and y on their row-major values, in R: double for floating dtypes (with
// Σ|a·b|, the scale of the rounding error), uint64_t for integers (wraps as int64 does; int32
// wraps alike in the low 32 bits). Broadcast batch dims, 1-D operands as matmul takes them.
template <class R>
struct Products {
  std::vector<R> value;
  std::vector<double> size;
  Shape shape;
  int64_t k = 0;
};

template <class R, class E>
Products<R> products(const Tensor& x, const Tensor& y) {
  Shape xs = x.shape(), ys = y.shape();
  const std::vector<E> xv = x.to_vector<E>(), yv = y.to_vector<E>();
  const bool x1 = xs.size() == 1, y1 = ys.size() == 1;
  if (x1) xs = Shape{1, xs[0]};
  if (y1) ys = Shape{ys[0], 1};
  const int64_t m = xs[xs.size() - 2], k = xs.back(), n = ys.back();
  const int r = std::max(xs.size(), ys.size()) - 2;
  // Batch dims right-aligned; element strides of each row-major operand, 0 where broadcast.
  Shape batch = Dims::filled(r, 1);
  std::vector<int64_t> sx(r, 0), sy(r, 0);
  int64_t stride_x = m * k, stride_y = k * n;
  for (int i = r - 1; i >= 0; --i) {
    const int ix = i - (r - (xs.size() - 2)), iy = i - (r - (ys.size() - 2));
    const int64_t dx = ix >= 0 ? xs[ix] : 1, dy = iy >= 0 ? ys[iy] : 1;
    batch[i] = dx == 1 ? dy : dx;
    sx[i] = dx == 1 ? 0 : stride_x;
    sy[i] = dy == 1 ? 0 : stride_y;
    stride_x *= dx;
    stride_y *= dy;
  }
  Products<R> out;
  out.k = k;
  for (int64_t bi = 0; bi < numel(batch); ++bi) {
    int64_t ox = 0, oy = 0;
    int64_t rem = bi;
    for (int d = r - 1; d >= 0; --d) {
      ox += rem % batch[d] * sx[d];
      oy += rem % batch[d] * sy[d];
      rem /= batch[d];
    }
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        R s = 0;
        double size = 0;
        for (int64_t p = 0; p < k; ++p) {
          const R t = R(xv[ox + i * k + p]) * R(yv[oy + p * n + j]);
          s += t;
          if constexpr (std::is_floating_point_v<R>) size += std::abs(t);
        }
        out.value.push_back(s);
        out.size.push_back(size);
      }
  }
  out.shape = batch;
  if (!x1) out.shape.push_back(m);
  if (!y1) out.shape.push_back(n);
  return out;
}

// z == x @ y: exactly (with wraparound) for integers; for floats within the error bound of a
// k-term float sum, 2·(k + 2)·eps·Σ|a·b| (the kernel's and the float64 reference's).
void check_products(const Tensor& x, const Tensor& y, const Tensor& z) {
  INFO("x " << to_string(x.shape()) << " y " << to_string(y.shape()) << " "
            << name(x.dtype()));
  if (is_floating(x.dtype())) {
    const Products<double> want = products<double, double>(x, y);
    REQUIRE(z.shape() == want.shape);
    const std::vector<double> got = z.to_vector<double>();
    const double eps = x.dtype() == DType::Float32 ? 0x1p-24 : 0x1p-53;
    int64_t bad = -1;
    for (size_t i = 0; i < got.size() && bad < 0; ++i)
      if (!(std::abs(got[i] - want.value[i]) <= 2 * (want.k + 2) * eps * want.size[i]))
        bad = int64_t(i);
    INFO("first wrong element " << bad << ": "
                                << (bad >= 0 ? got[bad] : 0.0) << " vs "
                                << (bad >= 0 ? want.value[bad] : 0.0));
    CHECK(bad < 0);
  } else {
    const Products<uint64_t> want = products<uint64_t, int64_t>(x, y);
    REQUIRE(z.shape() == want.shape);
    const std::vector<int64_t> got = z.to_vector<int64_t>();
    int64_t bad = -1;
    for (size_t i = 0; i < got.size() && bad < 0; ++i) {
      const uint64_t w = want.value[i];
      const bool ok = z.dtype() == DType::Int32 ? got[i] == int64_t(int32_t(uint32_t(w)))
                                                : uint64_t(got[i]) == w;
      if (!ok) bad = int64_t(i);
    }
    INFO("first wrong element " << bad);
    CHECK(bad < 0);
  }
}

void check_products(const Tensor& x, const Tensor& y) { check_products(x, y, matmul(x, y)); }

constexpr DType kAllMatmulDTypes[] = {DType::Float32, DType::Float64, DType::Int32, DType::Int64};

}  // namespace

TEST_CASE("small products: every dtype and tile shape, sizes at small_gemm's bounds") {
  // Widths that use each strip of columns (full vectors, 1-4 at a time, a half vector, scalar
  // tails), heights that use each row tile and a last shorter one.
  for (DType t : kAllMatmulDTypes)
    for (int64_t m : {1, 2, 3, 5, 6, 7, 8, 9, 13, 17})
      for (int64_t n : {1, 2, 3, 4, 5, 7, 8, 9, 12, 15, 16, 17, 24, 31, 32, 33, 40, 63, 64})
        for (int64_t k : {1, 3, 8, 16}) {
          REQUIRE(cpu::small_gemm_fits(m, n, k));
          check_products(make({3, m, k}, t, int(m + n)), make({3, k, n}, t, int(k)));
        }
  // The bounds: k and n at most 64, m·n·k at most 64³; just past them the products go to BLAS
  // (float32) or kiln's blocked gemm.
  struct Mnk { int64_t m, n, k; bool fits; };
  for (Mnk s : {Mnk{64, 64, 64, true}, Mnk{65, 64, 64, false}, Mnk{4096, 8, 8, true},
                Mnk{4097, 8, 8, false}, Mnk{8, 64, 8, true}, Mnk{8, 65, 8, false},
                Mnk{8, 8, 64, true}, Mnk{8, 8, 65, false}, Mnk{1, 1, 64, true},
                Mnk{1, 1, 65, false}}) {
    CAPTURE(s.m, s.n, s.k);
    CHECK(cpu::small_gemm_fits(s.m, s.n, s.k) == s.fits);
    for (DType t : kAllMatmulDTypes)
      check_products(make({2, s.m, s.k}, t, 1), make({2, s.k, s.n}, t, 2));
  }
}

TEST_CASE("small products: transposed, strided, broadcast and 1-D operands") {
  for (DType t : kAllMatmulDTypes) {
    // Operands transposed in their matrix dims (B transposed is copied into a k x n block),
    // both, and step-2 slices with no unit stride in either matrix dim.
    Tensor a = make({5, 7, 6}, t, 1), b = make({5, 6, 9}, t, 2);
    Tensor at = make({5, 6, 7}, t, 3).transpose(1, 2), bt = make({5, 9, 6}, t, 4).transpose(1, 2);
    check_products(a, b);
    check_products(at, b);
    check_products(a, bt);
    check_products(at, bt);
    Tensor as = make({5, 14, 12}, t, 5).slice(1, 0, 14, 2).slice(2, 0, 12, 2);  // [5, 7, 6]
    Tensor bs = make({5, 12, 18}, t, 6).slice(1, 0, 12, 2).slice(2, 0, 18, 2);  // [5, 6, 9]
    check_products(as, bs);
    check_products(bs.transpose(1, 2), as.transpose(1, 2));
    check_products(make({6, 5, 6}, t, 7).transpose(0, 1),  // [5, 6, 6]: batch stride 6
                   make({5, 6, 3}, t, 8));
    // A strided batch (every other matrix) and an expanded (stride-0) batch on either side.
    check_products(make({10, 7, 6}, t, 9).slice(0, 0, 10, 2), b);
    check_products(make({7, 6}, t, 10).expand({5, 7, 6}), bt);
    check_products(at, make({6, 9}, t, 11).expand({5, 6, 9}));
    // Broadcast batch dims: [64, 1, 8, 8] @ [1, 32, 8, 8], and with a transposed side.
    check_products(make({64, 1, 8, 8}, t, 12), make({1, 32, 8, 8}, t, 13));
    check_products(make({4, 1, 8, 5}, t, 14).transpose(-1, -2), make({1, 6, 8, 3}, t, 15));
    check_products(make({3, 4, 2, 5}, t, 16), make({4, 5, 3}, t, 17));
    // A batch that folds into the rows of one small product, and 1-D operands.
    check_products(make({4, 3, 5}, t, 18), make({5, 6}, t, 19));
    check_products(make({5}, t, 20), make({3, 5, 4}, t, 21));
    check_products(make({3, 4, 5}, t, 22).transpose(1, 2), make({4}, t, 23));
    check_products(make({10}, t, 24).slice(0, 0, 10, 2), make({5, 3}, t, 25));
    check_products(make({5}, t, 26), make({5}, t, 27));
  }
}

TEST_CASE("small products: integer products wrap as two's complement (PyTorch)") {
  // Values near 2^62 (int64) and 2^30 (int32): every product and sum overflows.
  for (DType t : {DType::Int64, DType::Int32}) {
    const int64_t big = t == DType::Int64 ? (int64_t{1} << 62) - 12345 : (int64_t{1} << 30) - 77;
    std::vector<int64_t> av(4 * 5 * 7), bv(4 * 7 * 3);
    for (size_t i = 0; i < av.size(); ++i) av[i] = (i % 3 == 0 ? -big : big) + int64_t(i * 31);
    for (size_t i = 0; i < bv.size(); ++i) bv[i] = (i % 2 == 0 ? big : 7 - big) - int64_t(i);
    Tensor a = from_vector(av, {4, 5, 7}).to(t), b = from_vector(bv, {4, 7, 3}).to(t);
    check_products(a, b);
    check_products(a, b.transpose(1, 2).contiguous().transpose(1, 2));
  }
}

TEST_CASE("small products: addmm's alpha and beta, beta 0 ignores the bias's NaNs") {
  for (DType t : {DType::Float32, DType::Float64, DType::Int64}) {
    INFO(name(t));
    Tensor a = make({5, 7}, t, 1), b = make({7, 6}, t, 2), bias = make({6}, t, 3);
    const std::vector<double> ab = products<double, double>(a, b).value;
    const std::vector<double> bv = bias.to_vector<double>();
    const std::vector<double> got = addmm(bias, a, b, 3, 2).to_vector<double>();
    const std::vector<double> got_t =
        addmm(bias, a.t().contiguous().t(), b, 3, 2).to_vector<double>();
    for (int64_t i = 0; i < 30; ++i) {
      CHECK(got[i] == Approx(3 * bv[i % 6] + 2 * ab[i]).margin(1e-5));
      CHECK(got_t[i] == got[i]);
    }
    if (is_floating(t)) {
      Tensor nan_bias = full({5, 6}, std::nan("")).to(t);
      const std::vector<double> z = addmm(nan_bias, a, b, 0, 1).to_vector<double>();
      for (int64_t i = 0; i < 30; ++i) CHECK(z[i] == Approx(ab[i]).margin(1e-5));
    }
  }
  // beta·bias + alpha·product is fma(beta, bias, alpha·product), as compiled code adds it:
  // -1.5 · -3e38 alone overflows float32, the fused sum 4.5e38 - 2e38 does not.
  Tensor r = addmm(full({2, 3}, -3e38), full({2, 1}, 1e19), full({1, 3}, -2e19), -1.5, 1);
  const float product = 1e19f * -2e19f;
  CHECK(std::isfinite(std::fma(-1.5f, -3e38f, product)));
  for (float v : r.to_vector<float>()) CHECK(v == std::fma(-1.5f, -3e38f, product));
}

TEST_CASE("small products: the same bits on 1 or 2 threads, and alone or in a batch") {
  const int saved = cpu::num_threads();
  struct Case { Shape a, b; };
  // Batches big enough to be spread over the pool (kSmallGemmGrainFlops per chunk).
  for (Case c : {Case{{4096, 4, 16}, {4096, 16, 4}}, Case{{64, 32, 32}, {64, 32, 32}},
                 Case{{64, 1, 8, 8}, {1, 64, 8, 8}}})
    for (DType t : {DType::Float32, DType::Float64}) {
      INFO(to_string(c.a) << " " << name(t));
      Tensor a = make(c.a, t, 1), b = make(c.b, t, 2);
      cpu::set_num_threads(1);
      const std::vector<double> one = matmul(a, b).to_vector<double>();
      Tensor b_t = b.transpose(-1, -2).contiguous().transpose(-1, -2);  // B column-major
      const std::vector<double> one_t = matmul(a, b_t).to_vector<double>();
      cpu::set_num_threads(2);
      Tensor z = matmul(a, b);
      cpu::set_num_threads(saved);
      CHECK(z.to_vector<double>() == one);
      CHECK(one_t == one);  // B transposed is copied, then the same tiles
      // One product of the batch computed alone: the same bits.
      Tensor a0 = a.dim() == 3 ? a.select(0, 17) : a.select(0, 5).select(0, 0);
      Tensor b0 = b.dim() == 3 ? b.select(0, 17) : b.select(0, 0).select(0, 9);
      Tensor z0 = z.dim() == 3 ? z.select(0, 17) : z.select(0, 5).select(0, 9);
      CHECK(matmul(a0, b0).to_vector<double>() == z0.to_vector<double>());
      check_products(a, b, z);
    }
}

TEST_CASE("small products: bmm's backward (g·Bᵀ, Aᵀ·g) against a float64 reference") {
  for (DType t : {DType::Float32, DType::Float64}) {
    INFO(name(t));
    // bmm of [16, 5, 7] @ [16, 7, 6], and a broadcast matmul whose gradients sum over batches.
    for (bool broadcast : {false, true}) {
      const Shape as = broadcast ? Shape{4, 1, 5, 7} : Shape{16, 5, 7};
      const Shape bs = broadcast ? Shape{1, 3, 7, 6} : Shape{16, 7, 6};
      Tensor a = make(as, t, 1).requires_grad_(), b = make(bs, t, 2).requires_grad_();
      Tensor y = broadcast ? matmul(a, b) : bmm(a, b);
      Tensor g = make(y.shape(), t, 3);
      std::vector<Tensor> grads = kiln::grad({y}, {a, b}, {g});
      Tensor a64 = a.detach().to(DType::Float64), b64 = b.detach().to(DType::Float64);
      Tensor g64 = g.to(DType::Float64);
      // The reference products in float64, summed over the broadcast batch dims.
      Tensor da = from_vector(products<double, double>(g64, b64.transpose(-1, -2)).value,
                              y.shape().size() == 4 ? Shape{4, 3, 5, 7} : Shape{16, 5, 7});
      Tensor db = from_vector(products<double, double>(a64.transpose(-1, -2), g64).value,
                              y.shape().size() == 4 ? Shape{4, 3, 7, 6} : Shape{16, 7, 6});
      if (broadcast) {
        da = da.sum({1}, true);
        db = db.sum({0}, true);
      }
      const double tol = t == DType::Float32 ? 1e-5 : 1e-13;
      CHECK((grads[0].to(DType::Float64) - da).abs().max().item<double>() < tol);
      CHECK((grads[1].to(DType::Float64) - db).abs().max().item<double>() < tol);
      // The gradients' products are small products too.
      check_products(g, b.detach().transpose(-1, -2));
      check_products(a.detach().transpose(-1, -2), g);
    }
  }
}
