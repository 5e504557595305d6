#pragma once
/// Construction of view outputs (they alias the input's storage): strides and offset for
/// view, transpose, permute, slice, select, expand, squeeze, unsqueeze.
#include "core/meta.h"

namespace kiln {

/// The view of call.inputs[0] that `call` describes; meta holds the validated output shape.
/// Throws kiln::Error when `view` is asked for a shape the strides cannot express.
Tensor make_view(const OpCall& call, const InferredMeta& meta);

/// Strides for viewing a tensor of (shape, strides) as `new_shape` without copying, or false
/// when impossible (PyTorch's computeStride).
bool view_strides(const Shape& shape, const Strides& strides, const Shape& new_shape,
                  Strides& out);

}  // namespace kiln
