#pragma once
/// Internal: backward formulas, one per differentiable op (eager/derivatives.cpp).
#include <vector>

#include "core/op.h"

namespace kiln::autograd {

/// What a formula sees: the forward call's attributes and (saved) tensors.
struct BackwardContext {
  OpKind op;
  const OpAttrs& attrs;
  Loc loc;
  const std::vector<TensorMeta>& input_meta;
  std::vector<Tensor> inputs;   // saved inputs (undefined if the formula does not save them)
  Tensor output;                // saved output (undefined if not saved)
  std::vector<bool> needs_grad; // per input: whether its gradient is wanted
};

/// Which tensors the formula of `op` needs saved.
struct SaveSpec {
  bool differentiable = false;
  uint8_t inputs_mask = 0;  // bit i: save input i
  bool output = false;
};
const SaveSpec& save_spec(OpKind op);

/// Gradients for each input of the forward op given the output gradient `grad` (undefined
/// entries for inputs that need none). Written with kiln ops, so they are themselves
/// differentiable (create_graph) and a trace records them. Eager backward without create_graph
/// on the CPU runs fused kernels instead for layer_norm and gelu (cpu::layer_norm_backward,
/// cpu::gelu_backward): one pass over the data instead of about a dozen ops.
std::vector<Tensor> derivative(const BackwardContext& ctx, const Tensor& grad);

/// Sums `g` down to `shape` (undoing broadcasting).
Tensor sum_to(const Tensor& g, const Shape& shape);

}  // namespace kiln::autograd
