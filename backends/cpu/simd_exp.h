#pragma once
// Internal to the CPU kernels: float32 SIMD batches take kiln's full-range exp / exp2 / expm1
// (core/formulas.h, exp_f32) instead of xsimd's, which overflow from 88.38 and flush results
// below e^-88.38 to 0; float64 batches take the full-range forms of exp, exp2, expm1, erf and
// erfc (F64Range). Include this before any kernel instantiates a formula on a batch.
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

namespace kiln::formulas {

template <> struct F32Exp<xsimd::batch<float>> {
  static constexpr bool kEnabled = true;
  /// 2^n for an integral-valued n in [-126, 127]: n + 127 in the exponent bits.
  static xsimd::batch<float> pow2i(xsimd::batch<float> n) {
    xsimd::batch<int32_t> e = (xsimd::to_int(n) + 127) << 23;
    return xsimd::bitwise_cast<xsimd::batch<float>>(e);
  }
};

template <> struct F64Range<xsimd::batch<double>> {
  static constexpr bool kEnabled = true;
  using B = xsimd::batch<double>;
  /// libm per lane: correctly rounded to ~1 ulp over the whole range (float64 erf is rare
  /// enough in models that exactness wins over SIMD speed).
  template <double (*F)(double)> static B per_lane(B x) {
    alignas(B::arch_type::alignment()) double v[B::size];
    x.store_aligned(v);
    for (double& e : v) e = F(e);
    return B::load_aligned(v);
  }
  static B erf(B x) { return per_lane<std::erf>(x); }
  static B erfc(B x) { return per_lane<std::erfc>(x); }
  /// The SIMD library's float64 sin / cos / tan reduce the argument with too few bits of π/2:
  /// cos(45.553...) near 29π/2 was 25,533 ulp off, sin(π) 6.9 (found by a break-it pass);
  /// libm reduces exactly, as compiled float64 code (libm calls) does.
  static B sin(B x) { return per_lane<std::sin>(x); }
  static B cos(B x) { return per_lane<std::cos>(x); }
  static B tan(B x) { return per_lane<std::tan>(x); }
};

}  // namespace kiln::formulas
