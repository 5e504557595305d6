#pragma once
/// A strided view as a contiguous block of its storage and view ops (no MLIR here), so that a
/// one-op GPU kernel (codegen/cuda_kernels.cpp) reads a sliced or strided tensor (`x[:, 1:]`,
/// `x[..., ::2]`) in place instead of taking the host path.
#include <cstdint>
#include <optional>
#include <vector>

#include "core/shape.h"
#include "ir/graph.h"

namespace kiln::codegen {

/// How to read a view of shape `shape` and strides `strides` (elements) from the contiguous
/// block of its storage that starts at the view's first element:
///   block (contiguous, shape `block`, its dims the view's dims of size > 1 by decreasing
///   stride, then one more of size `strides.back()` when the smallest stride is above 1)
///   -> keep [0, n) of each dim, index 0 of the extra dim -> permute to the view's dim order
///   -> unsqueeze the size-1 dims.
/// The block may reach past the storage's end (its last row runs on to the full row length):
/// the ops read only the view's elements, all inside the storage. Not for bool blocks, which
/// the codegen converts from bytes whole at the graph's boundary (codegen/bool_bytes.cpp).
struct StridedRead {
  Shape block;
  Shape kept;          ///< per block dim: the leading elements kept (block[k] when all)
  bool extra_inner = false;  ///< the last block dim is the smallest stride, read at index 0
  Dims permute;        ///< the kept dims (sorted by stride) back to the view's order
  std::vector<int64_t> unsqueeze;  ///< the view's size-1 dims, ascending
};

/// The read of a view whose dims of size > 1 nest (each stride a multiple of the next
/// smaller one and at least that dim's extent: no overlap) and have no stride 0; nullopt
/// otherwise (an empty view, overlapping or broadcast dims, strides that do not divide).
std::optional<StridedRead> strided_read(const Shape& shape, const Strides& strides);

/// `block` (an input of the block's shape) read as the view (the ops above) in `g`.
ir::Value apply_strided_read(ir::Graph& g, ir::Value block, const StridedRead& r);

}  // namespace kiln::codegen
