#pragma once
/// Shape and dtype inference for every op in the table — the one place that validates an
/// op's inputs. Eager dispatch, the tracer and the IR verifier all call infer_meta, so a bad
/// input raises the same kiln::Error in every mode.
#include <span>
#include <vector>

#include "core/op.h"

namespace kiln {

struct OutputMeta {
  DType dtype;
  Shape shape;
};

struct InferredMeta {
  /// The dtype inputs are converted to before the kernel runs (e.g. float32 for
  /// `int32 < float32`); outputs are in `outputs[i].dtype`.
  DType compute_dtype;
  std::vector<OutputMeta> outputs;
};

/// Infers the outputs of `op` applied to `inputs` (undefined entries are absent optional
/// inputs). Throws kiln::Error naming the op, the offending shapes/dtypes and `loc`.
InferredMeta infer_meta(OpKind op, std::span<const TensorMeta> inputs, const OpAttrs& attrs,
                        Loc loc);

/// Throws kiln::Error naming `op` and `loc` when host value `v` cannot be stored in `dtype`
/// without overflow, as PyTorch checks (fill_, full, masked_fill, tensor(..., dtype)): integer
/// dtypes take integers and floating values within their range (2.5 is stored as 2);
/// float32 takes values up to its largest finite one, ±inf and NaN; bool and float64 take any.
void check_scalar_fits(const Scalar& v, DType dtype, const char* op, Loc loc);

/// NumPy/PyTorch broadcasting of two shapes. Throws kiln::Error naming `op` on mismatch.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op, Loc loc);

/// PyTorch's result_type: dim>0 tensors, then 0-d tensors, then wrapped host scalars, each
/// tier taking part only if it is of a higher category than the tiers before it.
DType result_type(std::span<const TensorMeta> inputs);

/// The reduced dims of a reduction as a bitmask over the input's dims (all dims if
/// attrs.all_dims or attrs.dims is empty). Throws kiln::Error on an out-of-range or repeated dim.
uint32_t reduction_mask(const OpAttrs& attrs, int rank, const char* op, Loc loc);

}  // namespace kiln
