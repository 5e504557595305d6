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
#include "backends/cpu/reduce_simd.h"

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

using Packed = uint64_t;                     // a 32-bit key (high half) and its index
using Pair = std::pair<uint64_t, int64_t>;  // a 64-bit key and its index

// A whole line in order. Packed words: an LSD radix sort of the key half, 8 bits a pass (a
// pass whose digit is the same in every word is skipped); stable, so words made in index order
// end in (key, index) order. [64, 32000] float32 took 102 ms with std::sort on one thread.
void sort_all(std::vector<Packed>& w, std::vector<Packed>& spare) {
  const size_t n = w.size();
  if (n < 256) return std::sort(w.begin(), w.end());
  spare.resize(n);
  for (int shift = 32; shift < 64; shift += 8) {
    size_t count[257] = {};
    for (Packed v : w) ++count[((v >> shift) & 0xff) + 1];
    if (count[((w[0] >> shift) & 0xff) + 1] == n) continue;
    for (int b = 0; b < 256; ++b) count[b + 1] += count[b];
    for (Packed v : w) spare[count[(v >> shift) & 0xff]++] = v;
    w.swap(spare);
  }
}
void sort_all(std::vector<Pair>& p, std::vector<Pair>&) { std::sort(p.begin(), p.end()); }

// The first k entries of a line of n, entry(j) for j < n, in ascending order in e[0, k).
// Entries are distinct (they hold their index), so the order is the stable sort's. A small k
// keeps a max-heap of the best k while reading the line once: most entries fail one comparison
// with its top ([64, 32000] float32, k = 50: 15 ms with nth_element on one thread).
template <class E, class Entry>
void first_k(std::vector<E>& e, std::vector<E>& spare, int64_t n, int64_t k, Entry&& entry) {
  if (k * 16 <= n) {
    e.resize(k);
    for (int64_t j = 0; j < k; ++j) e[j] = entry(j);
    std::make_heap(e.begin(), e.end());
    for (int64_t j = k; j < n; ++j) {
      const E v = entry(j);
      if (k == 0 || !(v < e.front())) continue;
      std::pop_heap(e.begin(), e.end());
      e.back() = v;
      std::push_heap(e.begin(), e.end());
    }
    std::sort_heap(e.begin(), e.end());
    return;
  }
  e.resize(n);
  for (int64_t j = 0; j < n; ++j) e[j] = entry(j);
  if (k < n) {
    std::nth_element(e.begin(), e.begin() + k, e.end());
    std::sort(e.begin(), e.begin() + k);
  } else {
    sort_all(e, spare);
  }
}

template <class T>
void argsort_lines(const T* x, int64_t* out, const Lines& l, int64_t k, bool descending) {
  // 32-bit keys pack with a 32-bit index into one uint64 (key high, index low): a plain integer
  // sort. Wider keys or longer lines sort (key, index) pairs.
  constexpr bool packed = sizeof(T) <= 4;
  const bool fits = l.n <= (int64_t{1} << 32);
  for_line_ranges(l, [&](int64_t lo, int64_t hi) {
    std::vector<Packed> words, spare_words;
    std::vector<Pair> pairs, spare_pairs;
    for (int64_t line = lo; line < hi; ++line) {
      const int64_t a = line / l.inner, c = line % l.inner;
      const T* in = x + a * l.n * l.inner + c;
      int64_t* to = out + a * k * l.inner + c;
      if (packed && fits) {
        first_k(words, spare_words, l.n, k, [&](int64_t j) {
          return Packed{sort_key(in[j * l.inner], descending)} << 32 | Packed(j);
        });
        for (int64_t j = 0; j < k; ++j) to[j * l.inner] = int64_t(words[j] & 0xffffffffu);
      } else {
        first_k(pairs, spare_pairs, l.n, k, [&](int64_t j) {
          return Pair{sort_key(in[j * l.inner], descending), j};
        });
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
    if (inner == 1) {
      // Lines along the last dim, 8 at a time: their sums are independent, so the adds overlap
      // (one line at a time waits out each add's latency: [64, 32000] float32 took 7.1 ms on
      // one thread).
      constexpr int64_t kGroup = 8;
      for (int64_t first = lo; first < hi; first += kGroup) {
        const int64_t g = std::min(kGroup, hi - first);
        CumAcc<T> sums[kGroup] = {};
        for (int64_t s = 0; s < n; ++s) {
          const int64_t j = reverse ? n - 1 - s : s;
          for (int64_t q = 0; q < g; ++q) {
            const int64_t at = (first + q) * n + j;
            sums[q] += static_cast<CumAcc<T>>(x[at]);
            out[at] = static_cast<T>(sums[q]);
          }
        }
      }
      return;
    }
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
  // A copy made here, not by x.contiguous(), which would dispatch an op (that a trace records).
  const Tensor x = simd::contiguous_cpu(c.inputs[0], c.inputs[0].dtype());
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
