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

/// The geometry of unfold / fold's windows over an NCHW tensor's two trailing dims.
struct Window2d {
  int64_t kh, kw;  // kernel
  int64_t dh, dw;  // dilation: window elements dh rows / dw columns apart
  int64_t ph, pw;  // padding added on both sides
  int64_t sh, sw;  // stride between windows
  /// The geometry in unfold's attrs.dims (fold's from dims[2] on, after its output size).
  static Window2d from(const OpAttrs& a) {
    const int o = a.dims.size() == 10 ? 2 : 0;
    const Dims& d = a.dims;
    return {d[o], d[o + 1], d[o + 2], d[o + 3], d[o + 4], d[o + 5], d[o + 6], d[o + 7]};
  }
  Dims dims() const { return {kh, kw, dh, dw, ph, pw, sh, sw}; }
};

/// The window positions along a dim of `size`: (size + 2·padding − dilation·(kernel − 1) − 1)
/// / stride + 1 (PyTorch's), or 0 or less where the dilated kernel exceeds the padded size.
inline int64_t window_positions(int64_t size, int64_t kernel, int64_t dilation, int64_t padding,
                                int64_t stride) {
  const int64_t span = size + 2 * padding - dilation * (kernel - 1) - 1;
  return span < 0 ? 0 : span / stride + 1;
}

}  // namespace kiln
