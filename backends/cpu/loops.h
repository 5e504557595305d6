#pragma once
/// StridedLoop: walks N operands of one logical shape (broadcast inputs have stride 0) as runs
/// of the innermost dim, after merging dims that are contiguous for every operand. Elementwise
/// kernels write the inner run once (with a fast path for stride 1 / stride 0) and get any
/// strides, broadcasting and threading from here.
#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstdint>

#include "backends/cpu/parallel.h"
#include "core/tensor.h"

namespace kiln::cpu {

template <int N> class StridedLoop {
 public:
  /// operands[k] is viewed with `shape` (it must broadcast to it). Operand 0 is usually the output.
  StridedLoop(const Shape& shape, const std::array<const Tensor*, N>& operands) {
    rank_ = shape.size();
    for (int k = 0; k < N; ++k) {
      const Tensor& t = *operands[k];
      base_[k] = static_cast<char*>(t.raw_data());
      int64_t isz = static_cast<int64_t>(t.itemsize());
      int lead = rank_ - t.dim();
      for (int d = 0; d < rank_; ++d) {
        int td = d - lead;
        bool bcast = td < 0 || (t.shape()[td] == 1 && shape[d] != 1);
        stride_[k][d] = bcast ? 0 : t.strides()[td] * isz;
      }
    }
    for (int d = 0; d < rank_; ++d) shape_[d] = shape[d];
    coalesce();
    numel_ = 1;
    for (int d = 0; d < rank_; ++d) numel_ *= shape_[d];
  }

  /// Permutes the dims so that operand k's strides decrease, as PyTorch's TensorIterator
  /// orders them: work whose output is a transposed view (x.t().mul_(2), dT.t().fill_(1))
  /// then walks its memory in order, not across it (35 ms for [4096, 2048] float32 instead of
  /// 2.5). Only for work whose elements are independent (not a kernel that counts logical
  /// indices, as one_hot's).
  void order_by(int k) {
    int perm[kMaxRank];
    for (int d = 0; d < rank_; ++d) perm[d] = d;
    std::stable_sort(perm, perm + rank_, [&](int a, int b) {
      return std::abs(stride_[k][a]) > std::abs(stride_[k][b]);
    });
    int64_t shape[kMaxRank], strides[N][kMaxRank];
    for (int d = 0; d < rank_; ++d) {
      shape[d] = shape_[perm[d]];
      for (int j = 0; j < N; ++j) strides[j][d] = stride_[j][perm[d]];
    }
    for (int d = 0; d < rank_; ++d) {
      shape_[d] = shape[d];
      for (int j = 0; j < N; ++j) stride_[j][d] = strides[j][d];
    }
    coalesce();
  }

  int64_t numel() const { return numel_; }
  /// Byte stride of operand k along the innermost (merged) dim.
  int64_t inner_stride(int k) const { return rank_ ? stride_[k][rank_ - 1] : 0; }

  /// Calls fn(ptrs, n) for runs of n elements along the inner dim, covering the flat logical
  /// index range [begin, end); ptrs[k] points at operand k's first element of the run.
  template <class Fn> void run(int64_t begin, int64_t end, Fn&& fn) const {
    if (begin >= end) return;
    if (rank_ == 0) {
      std::array<char*, N> p = base_;
      fn(p, int64_t{1});
      return;
    }
    int64_t idx[kMaxRank];
    int64_t rem = begin;
    for (int d = rank_ - 1; d >= 0; --d) {
      idx[d] = rem % shape_[d];
      rem /= shape_[d];
    }
    std::array<char*, N> p;
    for (int k = 0; k < N; ++k) {
      p[k] = base_[k];
      for (int d = 0; d < rank_; ++d) p[k] += idx[d] * stride_[k][d];
    }
    int64_t inner = shape_[rank_ - 1];
    int64_t pos = begin;
    while (pos < end) {
      int64_t n = std::min(inner - idx[rank_ - 1], end - pos);
      fn(p, n);
      pos += n;
      if (pos >= end) break;
      // Advance to the next row start.
      for (int k = 0; k < N; ++k) p[k] += (n - 1) * stride_[k][rank_ - 1];
      idx[rank_ - 1] += n - 1;
      for (int d = rank_ - 1; d >= 0; --d) {
        if (++idx[d] < shape_[d]) {
          for (int k = 0; k < N; ++k) p[k] += stride_[k][d];
          break;
        }
        for (int k = 0; k < N; ++k) p[k] -= (shape_[d] - 1) * stride_[k][d];
        idx[d] = 0;
      }
    }
  }

  /// run() over the whole range, split across the thread pool when large.
  template <class Fn> void parallel_run(Fn&& fn, int64_t grain = kGrainSize) const {
    parallel_for(0, numel_, grain, [&](int64_t b, int64_t e) { run(b, e, fn); });
  }

 private:
  void coalesce() {
    // Drop size-1 dims, then merge dim d into d+1 when contiguous for every operand.
    int r = 0;
    for (int d = 0; d < rank_; ++d) {
      if (shape_[d] == 1 && rank_ > 1) continue;
      shape_[r] = shape_[d];
      for (int k = 0; k < N; ++k) stride_[k][r] = stride_[k][d];
      ++r;
    }
    rank_ = r == 0 && rank_ > 0 ? 1 : r;
    if (r == 0 && rank_ == 1) {
      shape_[0] = 1;
      for (int k = 0; k < N; ++k) stride_[k][0] = 0;
    }
    int out = 0;
    for (int d = 1; d < rank_; ++d) {
      bool mergeable = true;
      for (int k = 0; k < N; ++k)
        mergeable &= stride_[k][out] == stride_[k][d] * shape_[d];
      if (mergeable) {
        shape_[out] *= shape_[d];
        for (int k = 0; k < N; ++k) stride_[k][out] = stride_[k][d];
      } else {
        ++out;
        shape_[out] = shape_[d];
        for (int k = 0; k < N; ++k) stride_[k][out] = stride_[k][d];
      }
    }
    if (rank_ > 0) rank_ = out + 1;
  }

  int rank_;
  int64_t numel_;
  int64_t shape_[kMaxRank];
  int64_t stride_[N][kMaxRank];
  std::array<char*, N> base_;
};

}  // namespace kiln::cpu
