#pragma once
/// CPU kernels, one entry point per op category. The dispatcher (eager/dispatch.cpp) has
/// already validated the call with infer_meta, converted the inputs to meta.compute_dtype
/// where the category needs it (see eager/dispatch.cpp), and allocated `outs` (contiguous,
/// with meta's shapes and dtypes). Kernels write `outs` and never throw inside parallel
/// regions; anything that can fail on data (an out-of-range index) is checked first and
/// raises kiln::Error naming the op and call.loc.
#include <span>

#include "core/meta.h"

namespace kiln::cpu {

using Kernel = void (*)(const OpCall& call, const InferredMeta& meta, std::span<Tensor> outs);

/// The kernel for `op`, or nullptr when the CPU backend has none.
Kernel kernel_for(OpKind op);

// Per-category entry points (each switches on call.op).
void unary_kernel(const OpCall&, const InferredMeta&, std::span<Tensor>);    // incl. clamp
void binary_kernel(const OpCall&, const InferredMeta&, std::span<Tensor>);
void where_kernel(const OpCall&, const InferredMeta&, std::span<Tensor>);
void reduction_kernel(const OpCall&, const InferredMeta&, std::span<Tensor>);  // incl. argmax
void normalization_kernel(const OpCall&, const InferredMeta&, std::span<Tensor>);
void matmul_kernel(const OpCall&, const InferredMeta&, std::span<Tensor>);
void copy_kernel(const OpCall&, const InferredMeta&, std::span<Tensor>);  // contiguous/to/copy_/fill_
void cat_kernel(const OpCall&, const InferredMeta&, std::span<Tensor>);
void index_kernel(const OpCall&, const InferredMeta&, std::span<Tensor>);
void scatter_kernel(const OpCall&, const InferredMeta&, std::span<Tensor>);  // index_add, index_copy, scatter_add
void random_kernel(const OpCall&, const InferredMeta&, std::span<Tensor>);
void loss_kernel(const OpCall&, const InferredMeta&, std::span<Tensor>);
void scan_kernel(const OpCall&, const InferredMeta&, std::span<Tensor>);  // argsort, cumsum
void window_kernel(const OpCall&, const InferredMeta&, std::span<Tensor>);  // unfold, fold

/// The gradients of y = layer_norm(x, w, b) (normalised over the trailing dims
/// `normalized_shape`, m elements per row) given dL/dy = g, computed in one pass over x and g:
///   dx = rstd·(ĝ − mean(ĝ) − x̂·mean(ĝ·x̂)),  ĝ = g·w,  x̂ = (x − mean)·rstd,
///   dw = Σ_rows g·x̂,  db = Σ_rows g          (Ba, Kiros & Hinton, "Layer Normalization", 2016),
/// with mean and rstd = 1/sqrt(var + eps) from the same row statistics as the forward kernel.
/// x: any shape ending in normalized_shape; g: x's shape; w: normalized_shape or undefined (1).
/// All CPU, float32 or float64, in g's dtype. The gradients not asked for are left undefined;
/// dw and db have normalized_shape. The sums over rows add partial sums of 32 rows in block
/// order: results do not depend on the thread count. eager/derivatives.cpp uses it for eager
/// backward without create_graph; traces and double backward use the differentiable formula.
struct LayerNormGrads {
  Tensor dx, dw, db;
};
LayerNormGrads layer_norm_backward(const Tensor& x, const Tensor& w, const Tensor& g,
                                   const Shape& normalized_shape, double eps, bool need_dx,
                                   bool need_dw, bool need_db);

/// g · d gelu(x)/dx (formulas::GeluErfBackward, or GeluTanhBackward for approximate == 1) as
/// a new contiguous tensor of g's shape. x and g: CPU, same shape, float32 or float64, in g's
/// dtype. eager/derivatives.cpp uses it for eager backward without create_graph.
Tensor gelu_backward(const Tensor& x, const Tensor& g, int approximate);

/// Strided copy with dtype conversion: dst[i] = static_cast<dst type>(src[i]) for every
/// logical index i; `src` is broadcast to dst's shape. Both on CPU. Parallel for large sizes.
void copy_cast(const Tensor& dst, const Tensor& src);

/// A contiguous copy of `in` when an elementwise kernel writing the contiguous `out` would read
/// it across its memory order (same shape, stride 1 in a dim before the last but not in the
/// last: x.t() + 1), made by copy_cast's blocked transpose; else an undefined Tensor. Read
/// element by element such an input missed the caches and the TLB on every element: x.t() + 1
/// of [4096, 2048] float32 took 43 ms, 30x a contiguous add. Small inputs (the caches hold them)
/// are not copied.
Tensor copy_if_read_across(const Tensor& in, const Tensor& out);

}  // namespace kiln::cpu
