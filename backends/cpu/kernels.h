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
void scatter_kernel(const OpCall&, const InferredMeta&, std::span<Tensor>);  // index_add, scatter_add
void random_kernel(const OpCall&, const InferredMeta&, std::span<Tensor>);
void loss_kernel(const OpCall&, const InferredMeta&, std::span<Tensor>);

/// Strided copy with dtype conversion: dst[i] = static_cast<dst type>(src[i]) for every
/// logical index i; `src` is broadcast to dst's shape. Both on CPU. Parallel for large sizes.
void copy_cast(const Tensor& dst, const Tensor& src);

}  // namespace kiln::cpu
