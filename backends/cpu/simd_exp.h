#pragma once
// Internal to the CPU kernels: float32 SIMD batches take kiln's full-range exp / exp2 / expm1
// (core/formulas.h, exp_f32) instead of xsimd's, which overflow from 88.38 and flush results
// below e^-88.38 to 0; float64 batches take the full-range forms of exp, exp2, expm1, erf and
// erfc (F64Range), float64 sin / cos / erf / erfc, and atan2 / pow of both from glibc's libmvec
// where the build targets AVX2 (VecMath, F64Range), and an exact SIMD fmod where the target
// has a fused multiply-add (VecMath). Include this before any kernel instantiates a formula on
// a batch.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <xsimd/xsimd.hpp>

#include "core/formulas.h"

#if XSIMD_WITH_AVX512F
#include <type_traits>

// xsimd 8.1 has no AVX-512 fma: batches of avx512f and its descendants fell back to x * y + z,
// two roundings and two instructions for each step of every polynomial (exp, erf, ...), so eager
// float kernels were slower than and 1 ulp apart from compiled code, whose fma is fused. These
// overloads (more specialised than xsimd's generic template, found by argument-dependent lookup
// and by xsimd::fma) fuse them.
namespace xsimd {
template <class A, class = std::enable_if_t<std::is_base_of_v<avx512f, A>>>
batch<float, A> fma(const batch<float, A>& x, const batch<float, A>& y, const batch<float, A>& z) {
  return _mm512_fmadd_ps(x, y, z);
}
template <class A, class = std::enable_if_t<std::is_base_of_v<avx512f, A>>>
batch<double, A> fma(const batch<double, A>& x, const batch<double, A>& y,
                     const batch<double, A>& z) {
  return _mm512_fmadd_pd(x, y, z);
}
}  // namespace xsimd
#endif


// ---------------------------------------------------------------- libmvec
// glibc's vector math library (linked by backends/cpu/CMakeLists.txt, which defines
// KILN_HAVE_LIBMVEC where the build targets AVX2), called by its vector-ABI names: 'e' variants
// take AVX-512 registers, 'd' variants AVX2 ones, matching xsimd's batch width. Every lane is
// computed on its own (special lanes go through libm inside libmvec), so a result depends only
// on its inputs, never on its neighbours, the tail padding or the thread count.
namespace kiln::cpu::mvec {
/// F (libm) on each lane of a float64 batch.
template <double (*F)(double)> xsimd::batch<double> per_lane(xsimd::batch<double> x) {
  alignas(xsimd::batch<double>::arch_type::alignment()) double v[xsimd::batch<double>::size];
  x.store_aligned(v);
  for (double& e : v) e = F(e);
  return xsimd::batch<double>::load_aligned(v);
}

// Declares the variants of one ISA letter (e: AVX-512, d: AVX2) with NF float / ND double
// lanes, and wraps them for the vector types VF / VD.
#define KILN_LIBMVEC_FUNCTIONS(ISA, NF, ND)                                      \
  extern "C" {                                                                   \
  VD _ZGV##ISA##N##ND##vv_atan2(VD, VD);                                         \
  VF _ZGV##ISA##N##NF##vv_powf(VF, VF);                                          \
  VD _ZGV##ISA##N##ND##vv_pow(VD, VD);                                           \
  VD _ZGV##ISA##N##ND##v_sin(VD);                                                \
  VD _ZGV##ISA##N##ND##v_cos(VD);                                                \
  VD _ZGV##ISA##N##ND##v_erf(VD);                                                \
  VD _ZGV##ISA##N##ND##v_erfc(VD);                                               \
  VD _ZGV##ISA##N##ND##v_tan(VD);                                                \
  }                                                                              \
  inline VD atan2(VD a, VD b) { return _ZGV##ISA##N##ND##vv_atan2(a, b); }       \
  inline VF pow(VF a, VF b) { return _ZGV##ISA##N##NF##vv_powf(a, b); }          \
  inline VD pow(VD a, VD b) { return _ZGV##ISA##N##ND##vv_pow(a, b); }           \
  inline VD sin(VD x) { return _ZGV##ISA##N##ND##v_sin(x); }                     \
  inline VD cos(VD x) { return _ZGV##ISA##N##ND##v_cos(x); }                     \
  inline VD erf(VD x) { return _ZGV##ISA##N##ND##v_erf(x); }                     \
  inline VD erfc(VD x) { return _ZGV##ISA##N##ND##v_erfc(x); }                   \
  inline VD tan(VD x) { return _ZGV##ISA##N##ND##v_tan(x); }
#if defined(KILN_HAVE_LIBMVEC) && defined(__AVX512F__)
inline constexpr size_t kBytes = 64;
using VF = __m512;
using VD = __m512d;
KILN_LIBMVEC_FUNCTIONS(e, 16, 8)
#elif defined(KILN_HAVE_LIBMVEC) && defined(__AVX2__)
inline constexpr size_t kBytes = 32;
using VF = __m256;
using VD = __m256d;
KILN_LIBMVEC_FUNCTIONS(d, 8, 4)
#else
inline constexpr size_t kBytes = 0;
// Declared only: named where kEnabled = false leaves them uncalled.
template <class V> V atan2(V, V);
template <class V> V pow(V, V);
// libm per lane, correctly rounded to ~1 ulp over the whole range.
template <class V> V sin(V x) { return per_lane<std::sin>(x); }
template <class V> V cos(V x) { return per_lane<std::cos>(x); }
template <class V> V erf(V x) { return per_lane<std::erf>(x); }
template <class V> V erfc(V x) { return per_lane<std::erfc>(x); }
template <class V> V tan(V x) { return per_lane<std::tan>(x); }
#endif
#undef KILN_LIBMVEC_FUNCTIONS
/// Whether the batches are libmvec's vectors (an AVX2 build whose xsimd picked SSE is not).
inline constexpr bool kEnabled = kBytes == sizeof(xsimd::batch<float>);

/// f (of float64 batches) on float batches: each lane widened, f applied, rounded once. For
/// float atan2 (libmvec's atan2f is 3.2 ulp off; its atan2, 1.7 ulp of a double, is within 0.5
/// ulp of a float once rounded: 2.5x atan2f's time) and sin / cos / tan (xsimd's float32 forms
/// pick one argument reduction for the whole batch, so a lane's result changed with its
/// neighbours, and with the thread count).
template <class F, class... BF> xsimd::batch<float> in_double(F f, BF... args) {
  using BD = xsimd::batch<double>;
  constexpr size_t W = xsimd::batch<float>::size, H = BD::size, N = sizeof...(BF);
  alignas(64) float fin[N][W];
  alignas(64) double din[N][W];
  alignas(64) double dr[W];
  alignas(64) float fr[W];
  size_t k = 0;
  (args.store_aligned(fin[k++]), ...);
  for (size_t j = 0; j < N; ++j)
    for (size_t i = 0; i < W; ++i) din[j][i] = fin[j][i];
  for (size_t h = 0; h < W; h += H)
    [&]<size_t... J>(std::index_sequence<J...>) {
      BD(f(BD::load_aligned(din[J] + h)...)).store_aligned(dr + h);
    }(std::make_index_sequence<N>{});
  for (size_t i = 0; i < W; ++i) fr[i] = static_cast<float>(dr[i]);
  return xsimd::batch<float>::load_aligned(fr);
}

/// fmod(a, b), exactly, for batches of float or double, where the target fuses a·b + c.
/// q = trunc(a / b) is the true quotient's integer part or one more in magnitude (the division
/// rounds monotonically and every integer up to 2^p is representable, p = 24 / 53), so while
/// |q| < 2^p the exact a − q·b is a multiple of b's quantum under |b| in magnitude (of a's sign,
/// or of the other sign when q overshot): representable, so the fma gives it unrounded; one
/// step of |b| towards a's sign then gives the remainder, also exact. Lanes beyond that
/// (|a / b| >= 2^p, b = ±0 or ±inf, NaN or infinite a) take libm's fmod, which is exact too:
/// the result is fmod's whatever the lane.
#if defined(__FMA__)
inline constexpr bool kExactFmod = true;
#else
inline constexpr bool kExactFmod = false;
#endif
template <class T> xsimd::batch<T> fmod(xsimd::batch<T> a, xsimd::batch<T> b) {
  using B = xsimd::batch<T>;
  constexpr T kLimit = sizeof(T) == 4 ? T(16777216.0) : T(9007199254740992.0);
  B q = xsimd::trunc(a / b);
  B r = xsimd::fma(-q, b, a);
  B sa = xsimd::bitwise_and(a, B(T(-0.0)));  // a's sign bit
  // (a = ±0 gives r = ±0: never an overshoot.)
  auto overshot = (r < B(0) && a > B(0)) || (r > B(0) && a < B(0));
  r = xsimd::select(overshot, r + xsimd::bitwise_or(xsimd::abs(b), sa), r);
  r = xsimd::bitwise_or(xsimd::abs(r), sa);  // a zero remainder has a's sign, as fmod's
  auto slow = !(xsimd::abs(q) < B(kLimit)) || xsimd::isinf(b);
  if (xsimd::any(slow)) [[unlikely]] {
    alignas(B::arch_type::alignment()) T va[B::size], vb[B::size], vr[B::size];
    a.store_aligned(va);
    b.store_aligned(vb);
    r.store_aligned(vr);
    alignas(B::arch_type::alignment()) T vs[B::size];
    xsimd::select(slow, B(1), B(0)).store_aligned(vs);
    for (size_t i = 0; i < B::size; ++i)
      if (vs[i] != 0) vr[i] = std::fmod(va[i], vb[i]);
    r = B::load_aligned(vr);
  }
  return r;
}
}  // namespace kiln::cpu::mvec

namespace kiln::formulas {

template <> struct F32Exp<xsimd::batch<float>> {
  static constexpr bool kEnabled = true;
  /// 2^n for an integral-valued n in [-126, 127]: n + 127 in the exponent bits.
  static xsimd::batch<float> pow2i(xsimd::batch<float> n) {
    xsimd::batch<int32_t> e = (xsimd::to_int(n) + 127) << 23;
    return xsimd::bitwise_cast<xsimd::batch<float>>(e);
  }
};

/// The rounding error of a product (formulas.h): one fma where the target fuses it, else
/// Dekker's exact product of Veltkamp halves (12 / 27 bits; exact while the splits do not
/// overflow, |a|, |b| below ~1e34 in float32: formulas.h selects other values beyond).
template <class T> struct ProductError<xsimd::batch<T>> {
  using B = xsimd::batch<T>;
  static B of(B a, B b, B p) {
#if defined(__FMA__)
    return xsimd::fma(a, b, -p);
#else
    const B split(sizeof(T) == 4 ? T(4097) : T(134217729));  // 2^12 + 1, 2^27 + 1
    auto halves = [&split](B v, B& hi, B& lo) {
      B c = v * split;
      hi = c - (c - v);
      lo = v - hi;
    };
    B ah, al, bh, bl;
    halves(a, ah, al);
    halves(b, bh, bl);
    return ((ah * bh - p) + ah * bl + al * bh) + al * bl;
#endif
  }
};

template <> struct F64Range<xsimd::batch<double>> {
  static constexpr bool kEnabled = true;
  using B = xsimd::batch<double>;
  /// erf / erfc: libmvec's where built (2.5 / 1.9 ulp against long double, 8-10x faster than
  /// libm per lane), else libm's per lane (~1 ulp).
  static B erf(B x) { return kiln::cpu::mvec::erf(x); }
  static B erfc(B x) { return kiln::cpu::mvec::erfc(x); }
  /// xsimd's float64 sin / cos / tan reduce the argument with too few bits of π/2:
  /// cos(45.553...) near 29π/2 was 25,533 ulp off, sin(π) 6.9 (found by a break-it pass).
  /// libmvec's sin / cos / tan reduce exactly (3.2 / 3.4 ulp for sin / cos, measured as
  /// above); builds without libmvec: libm per lane.
  static B sin(B x) { return kiln::cpu::mvec::sin(x); }
  static B cos(B x) { return kiln::cpu::mvec::cos(x); }
  static B tan(B x) { return kiln::cpu::mvec::tan(x); }
};

/// atan2 and pow from libmvec (float32 atan2 in float64; powf is within 0.62 ulp as it is),
/// fmod exact, float32 sin / cos / tan in float64 (kiln::cpu::mvec).
template <class T> struct VecMath<xsimd::batch<T>> {
  static constexpr bool kAtan2Pow = kiln::cpu::mvec::kEnabled;
  static constexpr bool kFmod = kiln::cpu::mvec::kExactFmod;
  static constexpr bool kTrig = kiln::cpu::mvec::kEnabled && std::is_same_v<T, float>;
  using B = xsimd::batch<T>;
  using BD = xsimd::batch<double>;
  static B atan2(B a, B b) {
    namespace mv = kiln::cpu::mvec;
    if constexpr (std::is_same_v<T, double>) return mv::atan2(a, b);
    else return mv::in_double([](BD y, BD x) { return BD(mv::atan2(y, x)); }, a, b);
  }
  static B sin(B x) {
    namespace mv = kiln::cpu::mvec;
    return mv::in_double([](BD v) { return BD(mv::sin(v)); }, x);
  }
  static B cos(B x) {
    namespace mv = kiln::cpu::mvec;
    return mv::in_double([](BD v) { return BD(mv::cos(v)); }, x);
  }
  static B tan(B x) {
    namespace mv = kiln::cpu::mvec;
    return mv::in_double([](BD v) { return BD(mv::tan(v)); }, x);
  }
  static B pow(B a, B b) { return kiln::cpu::mvec::pow(a, b); }
  static B fmod(B a, B b) { return kiln::cpu::mvec::fmod(a, b); }
};

}  // namespace kiln::formulas
