#pragma once
/// Input values that eager's CPU kernels reject and generated code (codegen) computes through:
/// class indices and indices out of range, integer division by zero, 0 to a negative integer
/// power. Code that runs generated kernels (compiled regions, eager ops on CUDA tensors) scans
/// these inputs and, where eager would raise, runs eager's kernel, which raises its own error.
#include <cstdint>
#include <vector>

#include "core/op.h"
#include "core/shape.h"

namespace kiln {

/// Positions of the inputs of a call of `op` whose values eager's kernel checks and generated
/// code does not: one_hot's indices (unless `a.indices_checked`), nll_loss's targets,
/// index_select's / gather's / embedding's indices, index_add's / scatter_add's (unless
/// `a.indices_checked`), the divisor of an integer floor_divide or
/// remainder, base and exponent of an integer pow. `compute` is the call's compute dtype.
std::vector<int> value_checked_inputs(OpKind op, const OpAttrs& a, DType compute);

/// Whether eager's kernel raises for a call of `op` with inputs of `shapes` whose checked
/// inputs hold `values` (values[k]: input value_checked_inputs(...)[k], as int64, row-major).
/// pow is judged conservatively (a 0 base anywhere and a negative exponent anywhere).
bool eager_rejects_values(OpKind op, const OpAttrs& a, const std::vector<Shape>& shapes,
                          const std::vector<std::vector<int64_t>>& values);

}  // namespace kiln
