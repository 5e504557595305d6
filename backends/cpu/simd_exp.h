#pragma once
// Internal to the CPU kernels: float32 SIMD batches take kiln's full-range exp / exp2 / expm1
// (core/formulas.h, exp_f32) instead of xsimd's, which overflow from 88.38 and flush results
// below e^-88.38 to 0. Include this before any kernel instantiates a formula on batch<float>.
#include <cstdint>
#include <xsimd/xsimd.hpp>

#include "core/formulas.h"

namespace kiln::formulas {

template <> struct F32Exp<xsimd::batch<float>> {
  static constexpr bool kEnabled = true;
  /// 2^n for an integral-valued n in [-126, 127]: n + 127 in the exponent bits.
  static xsimd::batch<float> pow2i(xsimd::batch<float> n) {
    xsimd::batch<int32_t> e = (xsimd::to_int(n) + 127) << 23;
    return xsimd::bitwise_cast<xsimd::batch<float>>(e);
  }
};

}  // namespace kiln::formulas
