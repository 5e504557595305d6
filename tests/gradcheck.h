#pragma once
// gradcheck: analytic gradients (kiln::grad) against central finite differences in float64.
#include <catch2/catch.hpp>

#include <cmath>
#include <functional>

#include "eager/autograd.h"
#include "kiln/kiln.h"

namespace kiln::testing {

using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

/// Checks d(sum(fn(inputs) * w))/d(inputs) for a fixed random weighting w of the output.
/// Inputs must be contiguous float64 leaves; fn may view them in any way (transpose, slice,
/// broadcast) to exercise non-contiguous paths.
inline void gradcheck(const Fn& fn, std::vector<Tensor> inputs, double eps = 1e-6,
                      double atol = 1e-5, double rtol = 1e-4) {
  for (Tensor& x : inputs) {
    REQUIRE(x.dtype() == DType::Float64);
    x = x.contiguous().detach().requires_grad_();
  }
  Tensor out = fn(inputs);
  manual_seed(1234);
  Tensor w = randn(out.shape(), {DType::Float64});
  auto scalar = [&](const std::vector<Tensor>& xs) { return sum(fn(xs) * w); };
  std::vector<Tensor> analytic = grad({scalar(inputs)}, inputs, {}, false, std::nullopt, true);
  for (size_t k = 0; k < inputs.size(); ++k) {
    Tensor x = inputs[k];
    double* p = x.data<double>();
    for (int64_t i = 0; i < x.numel(); ++i) {
      double orig = p[i];
      double plus, minus;
      {
        NoGradGuard ng;
        p[i] = orig + eps;
        plus = scalar(inputs).item<double>();
        p[i] = orig - eps;
        minus = scalar(inputs).item<double>();
        p[i] = orig;
      }
      double numeric = (plus - minus) / (2 * eps);
      double a = analytic[k].defined() ? analytic[k].reshape({-1}).select(0, i).item<double>() : 0.0;
      INFO("input " << k << " element " << i << ": analytic " << a << " numeric " << numeric);
      CHECK(std::fabs(a - numeric) <= atol + rtol * std::fabs(numeric));
    }
  }
}

/// A float64 tensor of `shape` with values in [lo, hi), deterministic.
inline Tensor uniform(const Shape& shape, double lo = -1, double hi = 1, uint64_t seed = 7) {
  manual_seed(seed);
  return rand(shape, {DType::Float64}) * (hi - lo) + lo;
}

}  // namespace kiln::testing
