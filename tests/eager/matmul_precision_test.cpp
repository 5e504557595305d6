// set_float32_matmul_precision (core/precision.h): the setting, bfloat16 rounding, and float32
// products under Medium against a float64 reference of the bfloat16-rounded inputs.
#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "backends/cpu/bf16_gemm.h"
#include "backends/cpu/blas.h"
#include "kiln/kiln.h"

using namespace kiln;

namespace {

// Restores the process-wide setting when a test ends, passed or not.
struct PrecisionScope {
  MatmulPrecision saved = float32_matmul_precision();
  explicit PrecisionScope(MatmulPrecision p) { set_float32_matmul_precision(p); }
  ~PrecisionScope() { set_float32_matmul_precision(saved); }
};

// The float32 value of a bfloat16 bit pattern.
float widen(uint16_t h) { return std::bit_cast<float>(uint32_t{h} << 16); }
double rounded(float x) { return widen(cpu::to_bfloat16(x)); }
double max_diff_f(const Tensor& a, const Tensor& b) {
  return (a.to(DType::Float64) - b.to(DType::Float64)).abs().max().item<double>();
}

std::vector<float> filled(int64_t n, int salt) {  // deterministic values in [-1, 1)
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    v[i] = static_cast<float>(std::fmod(0.6180339887 * double(i * 7 + salt), 2.0) - 1.0);
  return v;
}

// What sgemm computes, in float64: alpha · Σ_p A(i,p)·B(p,j) + beta · C(i,j), with each input
// element passed through `in` first; `size` gets Σ |A(i,p)·B(p,j)| (the error scale).
struct Reference {
  std::vector<double> value, size;
};
template <class In>
Reference reference(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                    const std::vector<float>& a, int64_t lda, const std::vector<float>& b,
                    int64_t ldb, float beta, const std::vector<float>& c, int64_t ldc, In in) {
  Reference r{std::vector<double>(m * n), std::vector<double>(m * n)};
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0, abs = 0;
      for (int64_t p = 0; p < k; ++p) {
        const double x = in(a[ta ? p * lda + i : i * lda + p]);
        const double y = in(b[tb ? j * ldb + p : p * ldb + j]);
        s += x * y;
        abs += std::abs(x * y);
      }
      r.value[i * n + j] = double(alpha) * s + double(beta) * c[i * ldc + j];
      r.size[i * n + j] = std::abs(double(alpha)) * abs + std::abs(double(beta) * c[i * ldc + j]);
    }
  return r;
}

}  // namespace

TEST_CASE("set_float32_matmul_precision: PyTorch's names, highest by default, bad values raise") {
  CHECK(float32_matmul_precision() == MatmulPrecision::Highest);
  PrecisionScope scope(MatmulPrecision::Highest);
  for (const char* s : {"high", "medium", "highest"}) {
    set_float32_matmul_precision(s);
    CHECK(name(float32_matmul_precision()) == s);
  }
  set_float32_matmul_precision("medium");
  try {
    set_float32_matmul_precision("fast");
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(e.op() == "set_float32_matmul_precision");
    CHECK_THAT(e.message(), Catch::Contains("\"fast\"") && Catch::Contains("\"highest\""));
    CHECK_THAT(e.what(), Catch::Contains("matmul_precision_test.cpp"));  // the caller's line
  }
  CHECK_THROWS_AS(set_float32_matmul_precision(static_cast<MatmulPrecision>(7)), Error);
  CHECK(float32_matmul_precision() == MatmulPrecision::Medium);  // unchanged by the errors
}

TEST_CASE("to_bfloat16 rounds to nearest even and keeps NaN, Inf and signs") {
  auto bits = [](uint32_t u) { return cpu::to_bfloat16(std::bit_cast<float>(u)); };
  CHECK(bits(0x3f800000u) == 0x3f80);  // 1
  CHECK(bits(0x3f808000u) == 0x3f80);  // 1 + 2^-8: a tie, to the even 1
  CHECK(bits(0x3f818000u) == 0x3f82);  // 1 + 3·2^-8: a tie, to the even 1 + 2^-6
  CHECK(bits(0x3f808001u) == 0x3f81);  // just above the tie
  CHECK(bits(0xc0200000u) == 0xc020);  // -2.5
  CHECK(bits(0x80000000u) == 0x8000);  // -0
  CHECK(bits(0x7f7fffffu) == 0x7f80);  // FLT_MAX rounds past bfloat16's largest: Inf
  CHECK(bits(0x7f7f0000u) == 0x7f7f);  // bfloat16's largest stays
  CHECK(bits(0xff800000u) == 0xff80);  // -Inf
  for (uint32_t nan : {0x7fc00000u, 0x7fffffffu, 0xffffffffu, 0x7f800001u}) {
    const uint16_t h = bits(nan);
    CHECK(std::isnan(widen(h)));
    CHECK((h >> 15) == (nan >> 31));  // the sign stays
  }
}

TEST_CASE("bfloat16 GEMM: float32 products of rounded inputs, every transpose, split or not") {
  const bool bf16 = cpu::bf16_gemm_available();
  if (!bf16) WARN("skipped the bfloat16 values: no bfloat16 GEMM kernels on this CPU");
  struct Shape3 {
    int64_t m, n, k;
  };
  // Rows split on the pool; columns split (m < 32); k = 1000 for a long accumulation; blocks
  // of unequal size (a tail) on 3 threads.
  for (Shape3 s : {Shape3{300, 200, 150}, Shape3{20, 1000, 1000}, Shape3{257, 130, 300},
                   Shape3{20, 1201, 700}})
    for (int t = 0; t < 4; ++t)
      for (int threads : {1, 2, 3}) {
        const bool ta = t & 1, tb = t & 2;
        const int64_t lda = (ta ? s.m : s.k) + 3, ldb = (tb ? s.k : s.n) + 5, ldc = s.n + 7;
        const auto a = filled((ta ? s.k : s.m) * lda, 1), b = filled((tb ? s.n : s.k) * ldb, 2);
        const auto c0 = filled(s.m * ldc, 3);
        const float alpha = 0.5f, beta = 0.25f;
        CAPTURE(s.m, s.n, s.k, ta, tb, threads);
        std::vector<float> c = c0, c_f32 = c0;
        REQUIRE(cpu::sgemm(ta, tb, s.m, s.n, s.k, alpha, a.data(), lda, b.data(), ldb, beta,
                           c.data(), ldc, threads, cpu::GemmRounding::BFloat16));
        REQUIRE(cpu::sgemm_float32(ta, tb, s.m, s.n, s.k, alpha, a.data(), lda, b.data(), ldb,
                                   beta, c_f32.data(), ldc, threads));
        if (!bf16) {
          CHECK(std::memcmp(c.data(), c_f32.data(), c.size() * sizeof(float)) == 0);
          continue;
        }
        const Reference want = reference(ta, tb, s.m, s.n, s.k, alpha, a, lda, b, ldb, beta, c0,
                                         ldc, rounded);
        const Reference exact = reference(ta, tb, s.m, s.n, s.k, alpha, a, lda, b, ldb, beta, c0,
                                          ldc, [](float x) { return double(x); });
        double worst = 0, off_exact = 0;  // in units of the error scale
        for (int64_t i = 0; i < s.m; ++i)
          for (int64_t j = 0; j < s.n; ++j) {
            const double got = c[i * ldc + j], scale = want.size[i * s.n + j];
            worst = std::max(worst, std::abs(got - want.value[i * s.n + j]) / scale);
            off_exact = std::max(off_exact, std::abs(got - exact.value[i * s.n + j]) / scale);
          }
        // float32 accumulation of exact bfloat16 products: a few float32 ulps of the scale.
        CHECK(worst < 1e-5);
        // ... and not the float32 product: bfloat16 inputs are off by up to 2^-9 each.
        CHECK(off_exact > 1e-4);
        // The padding between rows of C is not written.
        for (int64_t i = 0; i < s.m; ++i)
          for (int64_t j = s.n; j < ldc && i * ldc + j < int64_t(c.size()); ++j)
            CHECK(c[i * ldc + j] == c0[i * ldc + j]);
      }
}

TEST_CASE("Medium: eager matmul follows the setting; small products and float64 stay exact") {
  auto tensor = [](const std::vector<float>& v, const Shape& s) {
    return from_vector(std::vector<double>(v.begin(), v.end()), s).to(DType::Float32);
  };
  const Tensor a = tensor(filled(256 * 512, 4), {256, 512});
  const Tensor b = tensor(filled(512 * 256, 5), {512, 256});
  const Tensor highest = matmul(a, b);
  Tensor medium, medium64, small, small_highest;
  {
    PrecisionScope scope(MatmulPrecision::Medium);
    medium = matmul(a, b);  // 67 MFLOP
    medium64 = matmul(a.to(DType::Float64), b.to(DType::Float64));
    small = matmul(a.slice(0, 0, 8), b);  // 2 MFLOP: below kBf16GemmMinFlops
  }
  small_highest = matmul(a.slice(0, 0, 8), b);
  const Tensor exact = matmul(a.to(DType::Float64), b.to(DType::Float64));
  const double scale = matmul(a.abs().to(DType::Float64), b.abs().to(DType::Float64))
                           .max().item<double>();
  auto err = [&](const Tensor& t) {
    return (t.to(DType::Float64) - exact).abs().max().item<double>() / scale;
  };
  CHECK(err(highest) < 1e-6);
  CHECK(err(medium64) < 1e-14);
  CHECK(equal(small, small_highest));
  if (cpu::bf16_gemm_available()) {
    CHECK(err(medium) > 1e-4);  // bfloat16 inputs
    CHECK(err(medium) < 1e-2);
  } else {
    CHECK(equal(medium, highest));
  }
}

TEST_CASE("Medium: a NaN or Inf in an input reaches the outputs that read it") {
  std::vector<float> a = filled(64 * 512, 6), b = filled(512 * 512, 7);
  a[3 * 512 + 10] = std::numeric_limits<float>::quiet_NaN();
  b[20 * 512 + 40] = std::numeric_limits<float>::infinity();
  for (int64_t p = 0; p < 512; ++p) a[5 * 512 + p] = 0;  // row 5 · Inf: NaN (0 · Inf)
  std::vector<float> c(64 * 512, 0.f);
  PrecisionScope scope(MatmulPrecision::Medium);
  REQUIRE(cpu::sgemm(false, false, 64, 512, 512, 1.f, a.data(), 512, b.data(), 512, 0.f,
                     c.data(), 512));
  for (int64_t j = 0; j < 512; ++j) CHECK(std::isnan(c[3 * 512 + j]));
  CHECK(std::isnan(c[5 * 512 + 40]));
  CHECK(std::isinf(c[0 * 512 + 40]));
  CHECK(std::isfinite(c[0 * 512 + 41]));
}

TEST_CASE("gemm_rounding: bfloat16 only under medium, for products large and deep enough") {
  using cpu::GemmRounding;
  const GemmRounding bf16 =
      cpu::bf16_gemm_available() ? GemmRounding::BFloat16 : GemmRounding::None;
  CHECK(cpu::gemm_rounding(MatmulPrecision::Highest, 1024, 1024, 1024) == GemmRounding::None);
  CHECK(cpu::gemm_rounding(MatmulPrecision::High, 1024, 1024, 1024) == GemmRounding::None);
  CHECK(cpu::gemm_rounding(MatmulPrecision::Medium, 1024, 1024, 1024) == bf16);
  // 0.5 MFLOP: below kBf16GemmMinFlops.
  CHECK(cpu::gemm_rounding(MatmulPrecision::Medium, 64, 64, 64) == GemmRounding::None);
  // 268 MFLOP, but 2·m·n / (m + n) = 63.5 flops per converted element: converting B dominates.
  CHECK(cpu::gemm_rounding(MatmulPrecision::Medium, 32, 4096, 1024) == GemmRounding::None);
  CHECK(cpu::gemm_rounding(MatmulPrecision::Medium, 256, 4096, 1024) == bf16);
}

TEST_CASE("Medium: a batched matmul decides once, from the rows that share one B") {
  // x [16, 64, 128] as a transposed view (its batch does not fold into rows) times one shared
  // w [128, 128]: 16 products of 2.1 MFLOP (float32 alone), 33.5 MFLOP and 1024 rows together.
  std::vector<float> xv = filled(64 * 16 * 128, 8), wv = filled(128 * 128, 9);
  const Tensor x = from_vector(std::vector<double>(xv.begin(), xv.end()), {64, 16, 128})
                       .to(DType::Float32)
                       .transpose(0, 1);
  const Tensor w = from_vector(std::vector<double>(wv.begin(), wv.end()), {128, 128})
                       .to(DType::Float32);
  // The same x with a B of its own per product (attention's shape): float32, each alone.
  const Tensor w_each = w.unsqueeze(0).expand({16, 128, 128}).contiguous();
  Tensor shared, own;
  {
    PrecisionScope scope(MatmulPrecision::Medium);
    shared = matmul(x, w);
    own = matmul(x, w_each);
  }
  auto round = [](const Tensor& t) {  // bfloat16-rounded values, in float64
    std::vector<float> v = t.contiguous().to_vector<float>();
    std::vector<double> r(v.size());
    for (size_t i = 0; i < v.size(); ++i) r[i] = rounded(v[i]);
    return from_vector(r, t.shape());
  };
  const bool bf16 = cpu::bf16_gemm_available();
  const Tensor want = bf16 ? matmul(round(x), round(w))
                           : matmul(x.to(DType::Float64), w.to(DType::Float64));
  const Tensor per_product = (shared.to(DType::Float64) - want).abs().amax({1, 2});
  CHECK(per_product.max().item<double>() < 1e-4);  // every product rounded alike
  CHECK(equal(own, matmul(x, w_each)));  // as under highest
  // An expanded B is a B per product whatever its strides: a stride-0 view and the copy of a
  // strided one (which eager materialises) round alike.
  const Tensor w_strided = w.t().contiguous().t();  // column-major
  Tensor expanded, copied;
  {
    PrecisionScope scope(MatmulPrecision::Medium);
    expanded = matmul(x, w.unsqueeze(0).expand({16, 128, 128}));
    copied = matmul(x, w_strided.unsqueeze(0).expand({16, 128, 128}));
  }
  CHECK(max_diff_f(expanded, copied) < 1e-5);
}

TEST_CASE("Medium: alpha = 0 gives beta · C, as float32 does, with Inf and NaN inputs") {
  std::vector<float> a = filled(256 * 256, 10), b = filled(256 * 256, 11);
  a[0] = std::numeric_limits<float>::infinity();
  b[5] = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> c(256 * 256, 2.f);
  REQUIRE(cpu::sgemm(false, false, 256, 256, 256, 0.f, a.data(), 256, b.data(), 256, 0.5f,
                     c.data(), 256, 0, cpu::GemmRounding::BFloat16));
  for (float v : c) REQUIRE(v == 1.f);
}
