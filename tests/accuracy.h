#pragma once
// Accuracy helpers shared by the tests: errors in units in the last place.
#include <cmath>

#include "core/dtype.h"

namespace kiln::testing {

/// |got − want| in units in the last place of want rounded to dt (float32 or float64).
inline double ulps(double got, long double want, DType dt) {
  const bool f32 = dt == DType::Float32;
  const double w = f32 ? static_cast<double>(static_cast<float>(want)) : static_cast<double>(want);
  const double next = f32 ? static_cast<double>(std::nextafter(static_cast<float>(w), 1e30f))
                          : std::nextafter(w, 1e300);
  return static_cast<double>(std::fabs(static_cast<long double>(got) - want)) / (next - w);
}

}  // namespace kiln::testing
