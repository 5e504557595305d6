// The Scan-category kernels, each over lines of x along one dim ([outer, n, inner] of a
// contiguous copy): argsort (the first k indices of each line in sorted order) and cumsum.
// Parallel over lines; every line is computed by one thread in a fixed order, so results do
// not depend on the thread count.
#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

#include "backends/cpu/kernels.h"
#include "backends/cpu/parallel.h"

namespace kiln::cpu {
namespace {

struct Lines {
  int64_t outer = 1, n = 1, inner = 1;
};
Lines lines_along(const Shape& s, int d) {
  Lines l;
  if (s.size() == 0) return l;  // a 0-d tensor: one line of one element
  for (int i = 0; i < d; ++i) l.outer *= s[i];
  l.n = s[d];
  for (int i = d + 1; i < s.size(); ++i) l.inner *= s[i];
  return l;
}

// Runs fn(first line, end line) over the outer * inner lines, split across the pool.
template <class Fn> void for_line_ranges(const Lines& l, Fn&& fn) {
  const int64_t grain = std::max<int64_t>(1, kGrainSize / std::max<int64_t>(l.n, 1));
  parallel_for(0, l.outer * l.inner, grain, fn);
}

// ---- argsort ----

// An unsigned key whose order is x's sort order: NaN (any payload, either sign) above +inf,
// -0 equal to +0 (both sort by index, as PyTorch), bool false < true; `descending` reverses it.
template <class T> auto sort_key(T v, bool descending) {
  using U = std::conditional_t<sizeof(T) == 8, uint64_t, uint32_t>;
  constexpr U kSign = U{1} << (8 * sizeof(U) - 1);
  U u;
  if constexpr (std::is_floating_point_v<T>) {
    if (std::isnan(v)) v = std::numeric_limits<T>::quiet_NaN();
    if (v == 0) v = 0;  // -0 -> +0
    u = std::bit_cast<U>(v);
    u = (u & kSign) ? ~u : (u | kSign);  // negatives reversed below the positives
  } else if constexpr (std::is_same_v<T, bool>) {
    u = v;
  } else {
    u = static_cast<U>(v) ^ kSign;  // two's complement to offset binary
  }
  return descending ? static_cast<U>(~u) : u;
}

// The first k of n entries in ascending order: entries are distinct (they hold their index),
// so any sort gives the stable order.
template <class E> void sort_first(E* e, int64_t n, int64_t k) {
  if (k < n) {
    if (k > 0) std::nth_element(e, e + k, e + n);
    std::sort(e, e + k);
  } else {
    std::sort(e, e + n);
  }
}

template <class T>
void argsort_lines(const T* x, int64_t* out, const Lines& l, int64_t k, bool descending) {
  // 32-bit keys pack with a 32-bit index into one uint64 (key high, index low): a plain integer
  // sort. Wider keys or longer lines sort (key, index) pairs.
  constexpr bool packed = sizeof(T) <= 4;
  const bool fits = l.n <= (int64_t{1} << 32);
  for_line_ranges(l, [&](int64_t lo, int64_t hi) {
    std::vector<uint64_t> words;
    std::vector<std::pair<uint64_t, int64_t>> pairs;
    for (int64_t line = lo; line < hi; ++line) {
      const int64_t a = line / l.inner, c = line % l.inner;
      const T* in = x + a * l.n * l.inner + c;
      int64_t* to = out + a * k * l.inner + c;
      if (packed && fits) {
        words.resize(l.n);
        for (int64_t j = 0; j < l.n; ++j)
          words[j] = uint64_t{sort_key(in[j * l.inner], descending)} << 32 | uint64_t(j);
        sort_first(words.data(), l.n, k);
        for (int64_t j = 0; j < k; ++j) to[j * l.inner] = int64_t(words[j] & 0xffffffffu);
      } else {
        pairs.resize(l.n);
        for (int64_t j = 0; j < l.n; ++j) pairs[j] = {sort_key(in[j * l.inner], descending), j};
        sort_first(pairs.data(), l.n, k);
        for (int64_t j = 0; j < k; ++j) to[j * l.inner] = pairs[j].second;
      }
    }
  });
}

// ---- cumsum ----

// float32 sums in float64 (PyTorch's CPU acc_type); integers in uint64 (wrapping as int64
// addition does, without signed overflow).
template <class T>
using CumAcc = std::conditional_t<std::is_floating_point_v<T>, double, uint64_t>;

template <class T> void cumsum_lines(const T* x, T* out, const Lines& l, bool reverse) {
  const int64_t n = l.n, inner = l.inner;
  for_line_ranges(l, [&](int64_t lo, int64_t hi) {
    std::vector<CumAcc<T>> acc;
    for (int64_t line = lo; line < hi;) {
      // Lines c0 <= c < c1 of one outer block, walked together: contiguous reads along c.
      const int64_t a = line / inner, c0 = line % inner, c1 = std::min(inner, c0 + (hi - line));
      acc.assign(c1 - c0, CumAcc<T>{0});
      const int64_t base = a * n * inner;
      for (int64_t s = 0; s < n; ++s) {
        const int64_t j = reverse ? n - 1 - s : s;
        const T* in = x + base + j * inner;
        T* to = out + base + j * inner;
        for (int64_t c = c0; c < c1; ++c) {
          CumAcc<T>& sum = acc[c - c0];
          sum += static_cast<CumAcc<T>>(in[c]);
          to[c] = static_cast<T>(sum);
        }
      }
      line += c1 - c0;
    }
  });
}

}  // namespace

void scan_kernel(const OpCall& c, const InferredMeta&, std::span<Tensor> outs) {
  const Tensor x = c.inputs[0].contiguous();
  Tensor& out = outs[0];
  const int d = x.dim() ? wrap_dim(c.attrs.dim, x.dim(), c.name()) : 0;
  const Lines l = lines_along(x.shape(), d);
  if (c.op == OpKind::CumSum) {
    // x is in the result's dtype already (the dispatcher converts bool / int to int64).
    KILN_DISPATCH_NUMERIC(out.dtype(), T, {
      cumsum_lines<T>(x.data<T>(), out.data<T>(), l, c.attrs.descending);
    });
    return;
  }
  // A 0-d input's one index is 0, whatever k (0 or 1; PyTorch's topk).
  const int64_t k = x.dim() == 0 ? 1 : (c.attrs.mode < 0 ? l.n : c.attrs.mode);
  if (out.numel() == 0) return;
  KILN_DISPATCH_ALL(x.dtype(), T, {
    argsort_lines<T>(x.data<T>(), out.data<int64_t>(), l, k, c.attrs.descending);
  });
}

}  // namespace kiln::cpu
