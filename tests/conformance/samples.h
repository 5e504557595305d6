#pragma once
// Sample inputs per op category for the conformance suite (tests/conformance/README.md).
#include <functional>
#include <string>
#include <vector>

#include "reference.h"

namespace conf {

/// One call of an op: `make` builds fresh inputs each time (in-place ops mutate them).
struct Sample {
  std::string what;
  std::function<std::vector<Tensor>()> make;
  OpAttrs attrs;
  bool compiled = false;  // also run through kiln::compile (a subset, for CI time)
};

/// Which values a sample holds.
enum class Pool {
  Special,   // ±0, ±inf, NaN, denormals (float32 and float64), 1e10, -3e38, INT_MIN/INT_MAX
  Finite,    // moderate finite values (and ±0), small integers
  NegInf,    // Finite plus -inf (softmax masks)
  Smooth,    // ±[0.2, 1.4], distinct, away from kinks and integers (gradcheck)
  Positive,  // [0.3, 1.5], distinct (gradcheck of log, sqrt, pow, ...)
  Index,     // integers in [0, bound)
  Mask,      // bool pattern
};
enum class Layout { Contiguous, Transposed, Expanded };

/// A tensor of `shape` (the logical shape of the result) with values from `pool`.
Tensor make(DType dt, const Ix& shape, int salt, Pool pool, Layout layout = Layout::Contiguous,
            int64_t bound = 0);

/// The samples of op `k` (empty with `missing` set when the op's category has no sampler).
/// grad = true: float64 samples with smooth values, for gradcheck and compiled backward.
std::vector<Sample> samples(OpKind k, bool grad, std::string& missing);

}  // namespace conf
