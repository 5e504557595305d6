// Regressions found by the differential fuzzer (tests/fuzz): each is the fuzzer's shrunk repro,
// named after what went wrong, run eagerly and compiled (trace, replay, other sizes).
#include <catch2/catch.hpp>

#include <cmath>

#include "kiln/kiln.h"
#include "tracer/util.h"

using namespace kiln;
using kiln::testing::vec;

TEST_CASE("fuzz: a value computed before a host read and returned after it", "[compile][fuzz]") {
  // The segment before the read kept none of its compiled region's values: "internal error:
  // value %1 used before it was computed" on replay.
  auto f = [](const Tensor& a) {
    Tensor v1 = kiln::eq(a, a);
    Tensor v2 = v1.sum().item<double>() > 0 ? kiln::sin(v1) : kiln::neg(v1);
    return std::vector<Tensor>{v1, a * 2.0, v2};
  };
  auto cf = compile(f);
  for (int i = 0; i < 3; ++i) {
    Tensor x = from_vector<float>({0.625f}, {});
    std::vector<Tensor> c = cf(x), e = f(x);
    REQUIRE(c.size() == 3);
    for (int k = 0; k < 3; ++k) CHECK(vec(c[k]) == vec(e[k]));
  }
}

TEST_CASE("fuzz: fill_ of a value with symbolic sizes keeps the traced size", "[compile][fuzz]") {
  // `neg(x).fill_(2)`: the functional fill was an expand to the traced shape, so the symbolic
  // entry (sizes 2, 5, then 7) returned 5 elements for an input of 7.
  auto f = [](const Tensor& a) {
    Tensor v = kiln::neg(a);
    v.fill_(2.0);
    Tensor w = kiln::neg(a);
    w.copy_(from_vector<float>({3.f}, {1}));  // copy_ broadcasting a source
    return std::vector<Tensor>{v, w};
  };
  auto cf = compile(f);
  for (int n : {2, 5, 5, 7, 7, 9}) {
    Tensor x = kiln::arange(n, kiln::Float32);
    std::vector<Tensor> c = cf(x);
    CHECK(c[0].numel() == n);
    CHECK(vec(c[0]) == std::vector<float>(n, 2.f));
    CHECK(vec(c[1]) == std::vector<float>(n, 3.f));
  }
}

TEST_CASE("fuzz: fill_ of an int64 value with a fractional scalar, then read", "[compile][fuzz]") {
  // The codegen rejects the constant -1.5 as int64, the region ran eagerly and then dropped
  // the values it computed: "value %3 used before it was computed".
  auto f = [](Tensor a) {
    a.fill_(-1.5);
    a += a;
    return a * 1;
  };
  auto cf = compile(f);
  for (int i = 0; i < 3; ++i) {
    Tensor x = from_vector<int64_t>({3}, {}), y = from_vector<int64_t>({3}, {});
    Tensor c = cf(x), e = f(y);
    CHECK(c.to_vector<int64_t>() == e.to_vector<int64_t>());
    CHECK(x.to_vector<int64_t>() == y.to_vector<int64_t>());
  }
}

TEST_CASE("fuzz: an in-place write through a view of an argument reaches the argument",
          "[compile][fuzz]") {
  // `x.view({1}) += 2` with x not read afterwards: the replay lost the write to x.
  auto f = [](const Tensor& a) {
    Tensor v = a.view({1});
    v += 2.0;
    return v;
  };
  auto cf = compile(f);
  for (int i = 0; i < 3; ++i) {
    Tensor x = from_vector<float>({1.875f}, {}), y = from_vector<float>({1.875f}, {});
    Tensor c = cf(x), e = f(y);
    CHECK(vec(c) == vec(e));
    CHECK(vec(x) == std::vector<float>{3.875f});
  }
  auto g = [](const Tensor& a) {  // a row written through select, the rest untouched
    a.select(0, 1).fill_(7.0);
    return a.sum();
  };
  auto cg = compile(g);
  for (int i = 0; i < 3; ++i) {
    Tensor x = kiln::zeros({3, 2});
    CHECK(vec(cg(x)) == std::vector<float>{14.f});
    CHECK(vec(x) == std::vector<float>{0, 0, 7, 7, 0, 0});
  }
}

TEST_CASE("fuzz: layer_norm of a constant row is exactly 0 eagerly and compiled",
          "[compile][fuzz]") {
  // Eager computed x·rstd − mean·rstd: 3.05e-5 instead of 0 for layer_norm([3.0]).
  Tensor x = from_vector<float>({3.f, 5.f, 5.f, 5.f}, {4, 1});
  Tensor e = kiln::layer_norm(x, {1});
  CHECK(vec(e) == std::vector<float>{0, 0, 0, 0});
  auto cf = compile([](const Tensor& a) { return kiln::layer_norm(a + 2.0, {a.size(-1)}); });
  for (int i = 0; i < 2; ++i) CHECK(vec(cf(x)) == std::vector<float>{0, 0, 0, 0});
  Tensor r = from_vector<float>({100.f, 100.f, 100.f, 100.f}, {1, 4});
  CHECK(vec(kiln::layer_norm(r, {4})) == std::vector<float>{0, 0, 0, 0});
}

TEST_CASE("fuzz: a GEMM over two dynamic batch dims does not crash the process", "[compile][fuzz]") {
  // MLIR 22's expand-strided-metadata segfaulted on the expand_shape back to [?, ?, 1, 1]; the
  // codegen now refuses that graph and the region runs compiled for the traced shapes only.
  auto f = [](const Tensor& a) {
    Tensor v = kiln::add(a, 2.0);
    return kiln::matmul(v, v.transpose(-2, -1));
  };
  auto cf = compile(f);
  for (int64_t n : {2, 3, 4}) {
    Tensor a = kiln::ones({n, n, 1, 1}, {DType::Int64});
    Tensor c = cf(a);
    CHECK(c.shape() == Shape{n, n, 1, 1});
    CHECK(vec(c) == vec(f(a)));
    CHECK(vec(c)[0] == 9.f);
  }
}

TEST_CASE("fuzz: a clone of an argument changed in place afterwards keeps the old values",
          "[compile][fuzz]") {
  // Seed 4 program 1933: the compiled clone was the argument itself (a copy is the same value
  // in a functional graph), so the write-back of `a += a` changed the returned tensor too.
  auto f = [](Tensor a) {
    Tensor c = a.clone();
    a += a;
    return c;
  };
  auto g = [](Tensor a) {
    Tensor d = a.contiguous().clone();
    a *= 3.0;
    return std::vector<Tensor>{d, a.clone()};
  };
  auto cf = compile(f);
  auto cg = compile(g);
  for (int i = 0; i < 3; ++i) {
    Tensor x = kiln::scalar_tensor(0.5f);
    CHECK(cf(x).item<float>() == 0.5f);
    CHECK(x.item<float>() == 1.f);
    Tensor y = from_vector<float>({0.5f, -1.f}, {2});
    std::vector<Tensor> d = cg(y);
    CHECK(vec(d[0]) == std::vector<float>{0.5f, -1.f});
    CHECK(vec(d[1]) == std::vector<float>{1.5f, -3.f});
    CHECK(vec(y) == std::vector<float>{1.5f, -3.f});
  }
}

TEST_CASE("fuzz: a slice bound computed from a size is not taken for a constant",
          "[compile][fuzz]") {
  // Sizes 2 and 3 both give the bound 1 for `x.size(0) / 2`; the symbolic specialisation made
  // from those two traces sliced [0, 1) for every size (a silent wrong shape).
  auto f = [](const Tensor& x) { return x.slice(0, 0, x.size(0) / 2) * 2.0; };
  auto cf = compile(f);
  for (int n : {2, 3, 6, 6, 7, 3, 10, 7}) {
    Tensor x = kiln::arange(n, kiln::Float32);
    Tensor c = cf(x), e = f(x);
    REQUIRE(c.shape() == e.shape());
    CHECK(vec(c) == vec(e));
  }
}

TEST_CASE("fuzz: two argument dims equal in both traces are not confused", "[compile][fuzz]") {
  // Seed 3 program 460: sizes [0, 2, 2] then [0, 5, 5] made one symbol of both dims, so
  // [0, 6, 8] gave shape [1, 0, 6, 6].
  auto f = [](const Tensor& a) { return a.view({1, a.size(0), a.size(1), a.size(2)}) + 1.0; };
  auto cf = compile(f);
  std::vector<Shape> shapes = {{0, 2, 2}, {0, 5, 5}, {0, 6, 8}, {0, 6, 8}, {0, 7, 9}, {0, 3, 3}};
  for (const Shape& s : shapes) {
    Tensor x = kiln::arange(s[0] * s[1] * s[2], kiln::Float32).view(s);
    Tensor c = cf(x), e = f(x);
    REQUIRE(c.shape() == e.shape());
    CHECK(vec(c) == vec(e));
  }
}

TEST_CASE("fuzz: softmax of int64 values with INT64_MIN matches eager", "[compile][fuzz]") {
  // Seed 5 program 92: the compiled decomposition subtracted the max in int64, where
  // INT64_MIN - 1 wraps, and gave 0 / NaN instead of eager's float softmax.
  auto f = [](const Tensor& a) {
    Tensor i = a.to(kiln::Int64);
    return std::vector<Tensor>{kiln::softmax(i, 0), kiln::log_softmax(i, 0)};
  };
  auto cf = compile(f);
  for (int k = 0; k < 3; ++k) {
    Tensor x = from_vector<double>({1.125, 1.5, 0.375, NAN}, {4});
    std::vector<Tensor> c = cf(x);
    double z = 2 + std::exp(-1.0);  // exp(1 - 1) twice, exp(0 - 1), exp(INT64_MIN - 1) = 0
    std::vector<float> sm = vec(c[0]), lsm = vec(c[1]);
    CHECK(sm[0] == Approx(1 / z));
    CHECK(sm[2] == Approx(std::exp(-1.0) / z));
    CHECK(sm[3] == 0.f);
    CHECK(lsm[0] == Approx(-std::log(z)));
  }
}

TEST_CASE("fuzz: sigmoid of the mean of an empty slice is NaN compiled too", "[compile][fuzz]") {
  // Seed 6 program 1673: the mean over 0 elements is 0/0, a constant NaN once the shape is
  // known; the compiled exp converted round(NaN / ln 2) to int (poison in LLVM) and returned
  // garbage (-6.7e-34, 1.2e22) instead of NaN.
  auto f = [](const Tensor& a) {
    Tensor v = kiln::mean(a.slice(0, 0, a.size(0) - 1), {}, false);
    return std::vector<Tensor>{kiln::sigmoid(v), kiln::exp(v), kiln::tanh(v), kiln::gelu(v)};
  };
  auto cf = compile(f);
  for (int k = 0; k < 3; ++k) {
    std::vector<Tensor> c = cf(from_vector<float>({1.625f}, {1}));
    for (const Tensor& t : c) CHECK(std::isnan(t.item<float>()));
  }
}

TEST_CASE("fuzz: a clone of a clone of an argument after a host read", "[compile][fuzz]") {
  // Seed 7 program 2965: the region made of `a.clone().clone()` (identities in the functional
  // graph) re-ran the outer contiguous() on eager kernels, reading the inner one's value, which
  // was never computed: "value %4 used before it was computed".
  auto f = [](const Tensor& a) {
    Tensor v = a.sum().item<double>() > 0 ? kiln::neg(a) : a * 2.0;  // unused, as in the repro
    Tensor d = kiln::matmul(a, a);                                     // unused
    (void)v, (void)d;
    return a.clone().clone();
  };
  auto cf = compile(f);
  for (int k = 0; k < 3; ++k) {
    Tensor x = from_vector<float>({1.5f, -0.5f}, {2});
    Tensor c = cf(x);
    CHECK(vec(c) == std::vector<float>{1.5f, -0.5f});
    CHECK(c.raw_data() != x.raw_data());
  }
}

TEST_CASE("fuzz: layer_norm of float32 rows whose variance overflows float32", "[compile][fuzz]") {
  // The variance (1.8e75) overflows float32 while (x - mean)·rsqrt(var + eps) is O(1): eager
  // gave NaN, the compiled decomposition (float32 mean/var) 0; float64 says [1, -1, 1, -1].
  // The second row also has x - mean = 5.1e38 past FLT_MAX (float64: [√3, -1/√3, ...]); std
  // of [3e38, -3e38] (correction 0) is 3e38, and was inf.
  auto f = [](const Tensor& x, const Tensor& w, const Tensor& b) {
    return std::vector<Tensor>{kiln::layer_norm(x, {4}), kiln::layer_norm(x, {4}, w, b),
                               kiln::std(x, {1}, 0), kiln::var(x, {1}, 1)};
  };
  auto cf = compile(f);
  const float a = 8.5e37f, b = -2.8e19f, c = 3.4e38f, s = 3e38f;
  Tensor x = from_vector<float>({a, b, a, b, c, -c, -c, -c, s, -s, s, -s, 1, 2, 3, NAN}, {4, 4});
  Tensor w = from_vector<float>({2, 1, 1, 1}, {4}), bias = from_vector<float>({0, 0, 0, 1}, {4});
  const double r3 = std::sqrt(3.0);
  const std::vector<double> ln = {1, -1, 1, -1, r3, -1 / r3, -1 / r3, -1 / r3, 1, -1, 1, -1};
  for (int k = 0; k < 3; ++k) {
    std::vector<Tensor> c_out = cf(x, w, bias), e_out = f(x, w, bias);
    std::vector<float> ce = vec(c_out[0]), ee = vec(e_out[0]);
    std::vector<float> cw = vec(c_out[1]), ew = vec(e_out[1]);
    for (size_t i = 0; i < ln.size(); ++i) {
      double wi = i % 4 == 0 ? 2 : 1, bi = i % 4 == 3 ? 1 : 0;
      CHECK(ce[i] == Approx(ln[i]).epsilon(1e-5));
      CHECK(ee[i] == Approx(ln[i]).epsilon(1e-5));
      CHECK(cw[i] == Approx(ln[i] * wi + bi).epsilon(1e-5));
      CHECK(ew[i] == Approx(ln[i] * wi + bi).epsilon(1e-5));
    }
    for (int i = 12; i < 16; ++i) {  // a row with a NaN is NaN in both modes
      CHECK(std::isnan(ce[i]));
      CHECK(std::isnan(ee[i]));
    }
    // std: [4.25e37 (|a - b| / 2), 2.9e38 (c·√3 / 2), 3e38, NaN].
    for (const std::vector<Tensor>* o : {&c_out, &e_out}) {
      std::vector<float> sd = vec((*o)[2]), v = vec((*o)[3]);
      CHECK(sd[0] == Approx((static_cast<double>(a) - b) / 2).epsilon(1e-6));
      CHECK(sd[1] == Approx(c * r3 / 2).epsilon(1e-6));
      CHECK(sd[2] == s);
      CHECK(std::isnan(sd[3]));
      CHECK(std::isinf(v[0]));  // 2.4e75: not representable
      CHECK(std::isnan(v[3]));
    }
  }
}

TEST_CASE("fuzz: layer_norm and var of a constant float32 row are exactly 0", "[compile][fuzz]") {
  // Seed 7 program 8864: layer_norm(sigmoid(b) + 2) of a constant row [2.731, 2.731, 2.731]:
  // eager's float32 mean was an ulp off (3x rounds in float32), and (x - mean)·rstd with
  // rstd ≈ 1/sqrt(eps) made that -7.5e-5; the compiled (float64 statistics) gave 0.
  auto f = [](const Tensor& x) {
    return std::vector<Tensor>{kiln::layer_norm(x, {3}), kiln::var(x, {1}, 0, false)};
  };
  auto cf = compile(f);
  const float c = 1.f / (1.f + std::exp(-1.f)) + 2.f;
  for (int k = 0; k < 3; ++k) {
    Tensor x = from_vector<float>({c, c, c, 1.f, 2.f, 3.f}, {2, 3});
    for (const std::vector<Tensor>& r : {f(x), cf(x)}) {
      std::vector<float> ln = vec(r[0]), v = vec(r[1]);
      for (int i = 0; i < 3; ++i) CHECK(ln[i] == 0.f);
      CHECK(ln[3] == Approx(-1.2247357).epsilon(1e-5));  // (1 - 2) / sqrt(2/3 + 1e-5)
      CHECK(v[0] == 0.f);
      CHECK(v[1] == Approx(2.0 / 3.0));
    }
  }
}

TEST_CASE("fuzz: a slice's length 0, then 1 broadcast against 3, stays specialised",
          "[compile][fuzz]") {
  // Seed 2 program 175: the slice [1, n/2) has length 0 at n = 3 and 1 at n = 4, where the
  // function expands that size-1 dim to 3 and multiplies: the product broadcasts the slice.
  // Made symbolic (length n - 3), the compiled region read its `?` dim as not broadcasting,
  // and the replay at n = 4 returned [2, 4, 4, 1, 4] for eager's [2, 4, 4, 3, 4].
  auto f = [](const Tensor& a) {
    Tensor s = a.slice(2, 1, a.size(2) / 2, 1);
    Tensor e = s.expand({2, -1, -1, s.size(2) == 1 ? 3 : -1, -1});
    return std::vector<Tensor>{kiln::mul(kiln::add(s, 1.0), e)};
  };
  auto cf = compile(f);
  for (int64_t n : {3, 3, 4, 4, 4, 6, 6}) {
    INFO("n = " << n);
    Tensor x = kiln::randn({n, n, n, n});
    Tensor c = cf(x)[0], e = f(x)[0];
    REQUIRE(c.shape() == e.shape());
    CHECK(vec(c) == vec(e));
  }
  CHECK(cf.explain().find("is 1 where an op broadcasts it") != std::string::npos);
}
