// A strided view as a contiguous block and view ops (codegen/strided_read.h).
#include "codegen/strided_read.h"

#include <algorithm>
#include <numeric>

namespace kiln::codegen {

std::optional<StridedRead> strided_read(const Shape& shape, const Strides& strides) {
  const int r = shape.size();
  std::vector<int> dims;  // the dims of size > 1, by decreasing stride
  for (int d = 0; d < r; ++d) {
    if (shape[d] == 0) return std::nullopt;
    if (shape[d] > 1) dims.push_back(d);
  }
  if (dims.empty()) return std::nullopt;  // one element: contiguous already
  // Room for the extra inner dim.
  if (dims.size() + 1 > static_cast<size_t>(kMaxRank)) return std::nullopt;
  std::sort(dims.begin(), dims.end(), [&](int a, int b) {  // ties in dim order
    return strides[a] != strides[b] ? strides[a] > strides[b] : a < b;
  });
  StridedRead out;
  for (size_t k = 0; k < dims.size(); ++k) {
    const int64_t s = strides[dims[k]], n = shape[dims[k]];
    if (s <= 0) return std::nullopt;
    if (k == 0) {
      out.block.push_back(n);
    } else {
      const int64_t outer = strides[dims[k - 1]];
      // Nested: the outer stride is a whole number of this dim's rows, at least n of them.
      if (outer % s != 0 || outer / s < n) return std::nullopt;
      out.block.push_back(outer / s);
    }
    out.kept.push_back(n);
  }
  const int64_t inner = strides[dims.back()];
  if (inner > 1) {
    out.block.push_back(inner);
    out.kept.push_back(1);
    out.extra_inner = true;
  }
  // Kept dim k (sorted) is view dim dims[k]: the permutation puts them back in view order.
  std::vector<int> order(dims.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int a, int b) { return dims[a] < dims[b]; });
  out.permute = Dims(std::vector<int64_t>(order.begin(), order.end()));
  for (int d = 0; d < r; ++d)
    if (shape[d] == 1) out.unsqueeze.push_back(d);
  return out;
}

ir::Value apply_strided_read(ir::Graph& g, ir::Value block, const StridedRead& r) {
  ir::Value v = block;
  for (int k = 0; k < r.block.size(); ++k) {
    if (r.kept[k] == r.block[k]) continue;
    OpAttrs a;
    a.dim = k;
    a.start = 0;
    a.end = r.kept[k];
    a.step = 1;
    v = g.op(OpKind::Slice, {v}, a);
  }
  if (r.extra_inner) {
    OpAttrs a;
    a.dim = r.block.size() - 1;
    a.start = 0;
    v = g.op(OpKind::Select, {v}, a);
  }
  bool identity = true;
  for (int k = 0; k < r.permute.size(); ++k) identity = identity && r.permute[k] == k;
  if (!identity) {
    OpAttrs a;
    a.dims = r.permute;
    v = g.op(OpKind::Permute, {v}, a);
  }
  for (int64_t d : r.unsqueeze) {
    OpAttrs a;
    a.dim = d;
    v = g.op(OpKind::Unsqueeze, {v}, a);
  }
  return v;
}

}  // namespace kiln::codegen
