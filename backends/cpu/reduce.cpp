// Reductions: sum, mean, prod, amax, amin, var, std, logsumexp, all, any, argmax, argmin.
//
// Every reduction is planned as a dense [outer..., R, K2] layout: the input's dims are put in
// memory order (a dense input, e.g. a transpose, needs no copy), adjacent dims of the same kind
// are merged, and what remains is
//   * K2 == 1: rows — each output reduces one contiguous run of R elements (vectorised);
//   * K2 > 1 : columns — each output column accumulates R rows of a contiguous [R, K2] block,
//              vectorised across K2 in stripes of kStripe columns.
// Any other pattern (reduced dims interleaved with kept ones in memory, non-dense inputs) is
// first copied into a [kept..., reduced...] contiguous buffer, which is a rows problem.
// Work is split over outputs; a few long outputs are split along R into fixed chunks (so the
// result does not depend on the number of threads) whose partials are combined in order.
#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>
#include <type_traits>

#include "backends/cpu/allocator.h"
#include "backends/cpu/kernels.h"
#include "backends/cpu/parallel.h"
#include "backends/cpu/reduce_simd.h"

namespace kiln::cpu {

namespace simd {

Tensor empty_cpu(const Shape& shape, DType dtype) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::make_shared<StorageImpl>(static_cast<size_t>(numel(shape)) * itemsize(dtype),
                                                allocator());
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

Tensor contiguous_cpu(const Tensor& x, DType dtype) {
  if (x.is_contiguous() && x.dtype() == dtype) return x;
  Tensor t = empty_cpu(x.shape(), dtype);
  copy_cast(t, x);
  return t;
}

}  // namespace simd

namespace {

using namespace simd;

constexpr int64_t kChunk = 65536;   // elements of R per task when a few long outputs are split
constexpr int64_t kFewOutputs = 8;  // below this many row/stripe tasks, split along R
constexpr int64_t kStripe = 1024;   // columns per task in the column path
constexpr int64_t kColBlock = 64;   // rows summed in T before adding into double

// A view of x's storage with another shape and strides (no copy).
Tensor restride(const Tensor& x, const Shape& shape, const Strides& strides) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = x.storage();
  impl->shape = shape;
  impl->strides = strides;
  impl->offset = x.offset();
  impl->dtype = x.dtype();
  return Tensor(std::move(impl));
}

struct DimInfo {
  int64_t size, istride, ostride;  // elements; ostride only for kept dims
  bool red;
};

// The dense [outer..., R, K2] layout of one reduction (see the file comment).
struct Plan {
  const char* base = nullptr;
  int64_t r = 1, k2 = 1, os2 = 0, k1 = 1;
  int nouter = 0;
  int64_t osize[kMaxRank], istride[kMaxRank], ostride[kMaxRank];
  Tensor keep;  // the copy `base` points into, if any

  // Input / output element offsets of outer index a.
  int64_t in_off(int64_t a) const {
    if (nouter == 1) return a * istride[0];
    int64_t off = 0;
    for (int d = nouter - 1; d >= 0; --d) {
      off += (a % osize[d]) * istride[d];
      a /= osize[d];
    }
    return off;
  }
  int64_t out_off(int64_t a) const {
    if (nouter == 1) return a * ostride[0];
    int64_t off = 0;
    for (int d = nouter - 1; d >= 0; --d) {
      off += (a % osize[d]) * ostride[d];
      a /= osize[d];
    }
    return off;
  }
};

// Merges dims d[0..n) (outermost first in memory) and fills p; false if the pattern is not
// [kept..., reduced, kept?] with one reduced and at most one inner kept group.
bool try_plan(Plan& p, const DimInfo* d, int n) {
  DimInfo g[kMaxRank];
  int m = 0;
  for (int i = 0; i < n; ++i) {
    if (m && g[m - 1].red == d[i].red && g[m - 1].istride == d[i].istride * d[i].size &&
        (d[i].red || g[m - 1].ostride == d[i].ostride * d[i].size)) {
      g[m - 1].size *= d[i].size;
      g[m - 1].istride = d[i].istride;
      g[m - 1].ostride = d[i].ostride;
    } else {
      g[m++] = d[i];
    }
  }
  int nred = 0, pr = m;
  for (int i = 0; i < m; ++i)
    if (g[i].red) ++nred, pr = i;
  if (nred > 1) return false;
  int inner = -1;  // index of the K2 group
  if (nred == 0) {
    inner = m - 1;
    pr = m - 1;  // outer groups are [0, pr)
  } else {
    if (m - pr - 1 > 1) return false;
    if (pr + 1 < m) inner = pr + 1;
    p.r = g[pr].size;
    int64_t want = inner >= 0 ? g[inner].size : 1;
    if (g[pr].istride != want) return false;
  }
  if (inner >= 0) {
    if (g[inner].istride != 1) return false;
    p.k2 = g[inner].size;
    p.os2 = g[inner].ostride;
  }
  p.nouter = 0;
  p.k1 = 1;
  for (int i = 0; i < pr && i < m; ++i) {
    if (i == inner) break;
    p.osize[p.nouter] = g[i].size;
    p.istride[p.nouter] = g[i].istride;
    p.ostride[p.nouter] = g[i].ostride;
    p.k1 *= g[i].size;
    ++p.nouter;
  }
  return true;
}

// Plans reducing the dims in `mask` of x (numel > 0). `logical` keeps the logical element
// order within the reduced dims (argmax over all dims returns a flat logical index).
Plan make_plan(const Tensor& x, uint32_t mask, bool logical) {
  int rank = x.dim();
  int64_t ostr[kMaxRank];
  int64_t os = 1;
  for (int i = rank - 1; i >= 0; --i) {
    ostr[i] = (mask >> i & 1) ? 0 : os;
    if (!(mask >> i & 1)) os *= x.shape()[i];
  }
  Plan p;
  bool dense = logical ? x.is_contiguous() : x.is_non_overlapping_and_dense();
  if (dense) {
    DimInfo d[kMaxRank];
    int n = 0;
    for (int i = 0; i < rank; ++i)
      if (x.shape()[i] != 1)
        d[n++] = {x.shape()[i], x.strides()[i], ostr[i], static_cast<bool>(mask >> i & 1)};
    // Memory order, outermost first (insertion sort: stable, at most kMaxRank dims).
    for (int i = 1; i < n; ++i)
      for (int j = i; j > 0 && d[j - 1].istride < d[j].istride; --j) std::swap(d[j - 1], d[j]);
    p.base = static_cast<const char*>(x.raw_data());
    if (try_plan(p, d, n)) return p;
  }
  // Copy into [kept..., reduced...] order, contiguous.
  Shape shape;
  Strides strides;
  DimInfo d[kMaxRank];
  int n = 0;
  for (int pass = 0; pass < 2; ++pass) {
    for (int i = 0; i < rank; ++i) {
      bool red = mask >> i & 1;
      if (red != (pass == 1)) continue;
      shape.push_back(x.shape()[i]);
      strides.push_back(x.strides()[i]);
      if (x.shape()[i] != 1) d[n++] = {x.shape()[i], 0, ostr[i], red};
    }
  }
  Tensor tmp = empty_cpu(shape, x.dtype());
  copy_cast(tmp, restride(x, shape, strides));
  int64_t st = 1;
  for (int i = n - 1; i >= 0; --i) {
    d[i].istride = st;
    st *= d[i].size;
  }
  p = Plan();
  p.keep = tmp;
  p.base = static_cast<const char*>(tmp.raw_data());
  bool ok = try_plan(p, d, n);
  (void)ok;  // [kept..., reduced...] contiguous always plans
  return p;
}

// Runs one reduction pass over the plan.
//   row(x, n, o, base) -> Acc         reduces a contiguous run of n elements for output o
//                                      (plan order); base = index of x[0] within R
//   col(x, rows, stride, k, o, base, acc)  combines rows of a [rows, k] block (row stride
//                                      `stride`) into acc[0..k) for outputs o..o+k
//   comb(a, b) -> Acc                  combines partials (a before b)
//   fin(o, out_index, Acc)             writes output o at element out_index
template <class T, class Acc, class Row, class Col, class Comb, class Fin>
void run_plan(const Plan& p, Acc ident, const Row& row, const Col& col, const Comb& comb,
              const Fin& fin) {
  const T* base = reinterpret_cast<const T*>(p.base);
  const int64_t r = p.r, k1 = p.k1, k2 = p.k2;
  if (k2 == 1) {
    if (k1 < kFewOutputs && r >= 2 * kChunk) {
      int64_t nc = ceil_div(r, kChunk);
      std::unique_ptr<Acc[]> part(new Acc[k1 * nc]);
      parallel_for(0, k1 * nc, 1, [&](int64_t b, int64_t e) {
        for (int64_t t = b; t < e; ++t) {
          int64_t a = t / nc, r0 = (t % nc) * kChunk;
          part[t] = row(base + p.in_off(a) + r0, std::min(kChunk, r - r0), a, r0);
        }
      });
      for (int64_t a = 0; a < k1; ++a) {
        Acc v = part[a * nc];
        for (int64_t c = 1; c < nc; ++c) v = comb(v, part[a * nc + c]);
        fin(a, p.out_off(a), v);
      }
    } else {
      int64_t grain = std::max<int64_t>(1, kGrainSize / r);
      parallel_for(0, k1, grain, [&](int64_t b, int64_t e) {
        for (int64_t a = b; a < e; ++a) {
          if (a + 1 < e) prefetch(base + p.in_off(a + 1), r);
          fin(a, p.out_off(a), row(base + p.in_off(a), r, a, 0));
        }
      });
    }
    return;
  }
  const int64_t ns = ceil_div(k2, kStripe), tasks = k1 * ns, width = std::min(k2, kStripe);
  int64_t rpc = r, nrc = 1;  // rows per chunk, chunks
  if (tasks < kFewOutputs && r * width >= 2 * kChunk) {
    rpc = ceil_div(std::max(kColBlock, kChunk / width), kColBlock) * kColBlock;
    nrc = ceil_div(r, rpc);
  }
  auto stripe = [&](int64_t t, int64_t& a, int64_t& j0, int64_t& kw) {
    a = t / ns;
    j0 = (t % ns) * kStripe;
    kw = std::min(kStripe, k2 - j0);
  };
  if (nrc == 1) {
    int64_t grain = std::max<int64_t>(1, kGrainSize / (r * width));
    parallel_for(0, tasks, grain, [&](int64_t b, int64_t e) {
      Acc loc[kStripe];
      for (int64_t t = b; t < e; ++t) {
        int64_t a, j0, kw;
        stripe(t, a, j0, kw);
        std::fill_n(loc, kw, ident);
        col(base + p.in_off(a) + j0, r, k2, kw, a * k2 + j0, int64_t{0}, loc);
        int64_t oo = p.out_off(a);
        for (int64_t j = 0; j < kw; ++j) fin(a * k2 + j0 + j, oo + (j0 + j) * p.os2, loc[j]);
      }
    });
    return;
  }
  const int64_t nout = k1 * k2;
  std::unique_ptr<Acc[]> part(new Acc[nrc * nout]);
  std::fill_n(part.get(), nrc * nout, ident);
  parallel_for(0, nrc * tasks, 1, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      int64_t c = t / tasks, a, j0, kw;
      stripe(t % tasks, a, j0, kw);
      int64_t r0 = c * rpc;
      col(base + p.in_off(a) + r0 * k2 + j0, std::min(rpc, r - r0), k2, kw, a * k2 + j0, r0,
          part.get() + c * nout + a * k2 + j0);
    }
  });
  for (int64_t o = 0; o < nout; ++o) {
    Acc v = part[o];
    for (int64_t c = 1; c < nrc; ++c) v = comb(v, part[c * nout + o]);
    fin(o, p.out_off(o / k2) + (o % k2) * p.os2, v);
  }
}

// ---- column helpers ----

// acc[j] += Σ_r f(x[r, j], j), summed in T over kColBlock rows, then in double.
template <class T, class F>
void sum_cols(const T* x, int64_t rows, int64_t stride, int64_t k, const F& f, double* acc) {
  using V = Vec<T>;
  constexpr int64_t L = V::size;
  T tmp[kStripe];
  for (int64_t r0 = 0; r0 < rows; r0 += kColBlock) {
    int64_t r1 = std::min(rows, r0 + kColBlock);
    std::fill_n(tmp, k, T(0));
    for (int64_t r = r0; r < r1; ++r) {
      const T* row = x + r * stride;
      int64_t j = 0;
      for (; j + L <= k; j += L)
        (V::load_unaligned(tmp + j) + f(V::load_unaligned(row + j), j)).store_unaligned(tmp + j);
      for (; j < k; ++j) tmp[j] += f(row[j], j);
    }
    for (int64_t j = 0; j < k; ++j) acc[j] += static_cast<double>(tmp[j]);
  }
}

// acc[j] = op(acc[j], x[r, j]) for every row r; op works on batches and scalars.
template <class T, class Op>
void apply_cols(const T* x, int64_t rows, int64_t stride, int64_t k, T* acc, const Op& op) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* row = x + r * stride;
    int64_t j = 0;
    if constexpr (kIsFloat<T>) {
      using V = Vec<T>;
      constexpr int64_t L = V::size;
      for (; j + L <= k; j += L)
        op(V::load_unaligned(acc + j), V::load_unaligned(row + j)).store_unaligned(acc + j);
    }
    for (; j < k; ++j) acc[j] = op(acc[j], row[j]);
  }
}

// ---- the ops ----

struct Ctx {
  const OpCall& call;
  const Plan& p;
  Tensor& out;
};

// Sums of a float32 row as the row path computes them: its running sum in T converted to
// double, redone in double if it overflowed.
template <class T>
double finish_row_sum(T t, const T* x, int64_t n) {
  double s = static_cast<double>(t);
  if (std::is_same_v<T, float> && !std::isfinite(s)) s = std::accumulate(x, x + n, 0.0);
  return s;
}

// Whether the plan's rows are dense and shorter than `batches` batches of T (a point's xyz, a
// router's 8 scores): the short-row paths below take them a batch of rows at a time, lane i
// gathering row i's elements in order, where the row path paid a call, a prefetch and a scalar
// chain per row ([1048576, 8].sum(1): ~10 ns a row; argmax over [262144, 16]: ~54 ns a row).
// `batches`: the most batches a row may span (sum: 1, where sum_run's lanes would add in
// another order; max and argmax: 4, below which extreme_run picks in order too).
template <class T>
bool dense_short_rows(const Plan& p, int64_t batches) {
  return kIsFloat<T> && p.k2 == 1 && p.nouter == 1 && p.istride[0] == p.r && p.r >= 1 &&
         p.r < batches * static_cast<int64_t>(Vec<T>::size);
}

// Row a's result into put(a, value, x) for each row of the plan (x: the row's first element):
// batch(x, off) gives a whole batch of rows' results as a batch of T (off: the lanes' offsets
// for V::gather), one_row(x) the result of a row of the tail; spread over the pool.
template <class T, class Batch, class Row, class Put>
void for_short_rows(const Plan& p, const Batch& batch, const Row& one_row, const Put& put) {
  using I = xsimd::batch<std::conditional_t<sizeof(T) == 4, int32_t, int64_t>>;
  constexpr int64_t L = Vec<T>::size;
  const int64_t r = p.r;
  const T* x = reinterpret_cast<const T*>(p.base);
  alignas(64) typename I::value_type lane_off[L];
  for (int64_t i = 0; i < L; ++i) lane_off[i] = static_cast<typename I::value_type>(i * r);
  const I off = I::load_aligned(lane_off);
  parallel_for(0, p.k1, std::max<int64_t>(L, kGrainSize / r), [&](int64_t lo, int64_t hi) {
    int64_t a = lo;
    for (; a + L <= hi; a += L) {
      const T* xb = x + a * r;
      alignas(64) T lanes[L];
      batch(xb, off).store_aligned(lanes);
      for (int64_t i = 0; i < L; ++i) put(a + i, lanes[i], xb + i * r);
    }
    for (; a < hi; ++a) put(a, one_row(x + a * r), x + a * r);
  });
}

// sum / mean over short rows: each lane adds its row in order, as sum_run adds a row shorter
// than a batch, so the results are the same bits.
template <class T>
bool sum_short_rows(const Plan& p, T* out, bool mean) {
  if (!dense_short_rows<T>(p, 1)) return false;
  const int64_t r = p.r, os = p.ostride[0];
  const double n = static_cast<double>(r);
  for_short_rows<T>(
      p,
      [&](const T* xb, const auto& off) {
        Vec<T> acc(T(0));
        for (int64_t j = 0; j < r; ++j) acc += Vec<T>::gather(xb + j, off);
        return acc;
      },
      [&](const T* xr) {
        T t(0);
        for (int64_t j = 0; j < r; ++j) t += xr[j];
        return t;
      },
      [&](int64_t a, T t, const T* xr) {
        double v = finish_row_sum(t, xr, r);
        out[a * os] = static_cast<T>(mean ? v / n : v);
      });
  return true;
}

// sum / mean (floating): Σ in double.
template <class T>
void sum_float(const Ctx& c, bool mean) {
  T* out = c.out.data<T>();
  if (sum_short_rows(c.p, out, mean)) return;
  double n = static_cast<double>(c.p.r);
  auto id = [](auto v, int64_t) { return v; };
  // float32 partial sums (SIMD lanes) that overflowed are summed again in double, as compiled
  // code sums: the mean of [3e38, 3e38] is 3e38 in both (it was inf here, 3e38 compiled).
  constexpr bool kFloat32 = std::is_same_v<T, float>;
  run_plan<T, double>(
      c.p, 0.0,
      [&](const T* x, int64_t n, int64_t, int64_t) {
        double s = sum_run(x, n, id);
        if (kFloat32 && !std::isfinite(s)) s = std::accumulate(x, x + n, 0.0);
        return s;
      },
      [&](const T* x, int64_t rows, int64_t st, int64_t k, int64_t, int64_t, double* acc) {
        if constexpr (!kFloat32) {
          sum_cols(x, rows, st, k, id, acc);
        } else {
          double part[kStripe];
          std::fill_n(part, k, 0.0);
          sum_cols(x, rows, st, k, id, part);
          for (int64_t j = 0; j < k; ++j) {
            if (!std::isfinite(part[j])) {
              part[j] = 0;
              for (int64_t r = 0; r < rows; ++r) part[j] += x[r * st + j];
            }
            acc[j] += part[j];
          }
        }
      },
      [](double a, double b) { return a + b; },
      [&](int64_t, int64_t oi, double v) { out[oi] = static_cast<T>(mean ? v / n : v); });
}

// sum / prod of integers (inputs already int64).
template <class T>
void sum_prod_int(const Ctx& c, bool prod) {
  int64_t* out = c.out.data<int64_t>();
  int64_t ident = prod ? 1 : 0;
  auto comb = [prod](int64_t a, int64_t b) -> int64_t {
    // Wrap around on overflow like PyTorch (unsigned arithmetic is defined).
    return prod ? static_cast<int64_t>(static_cast<uint64_t>(a) * static_cast<uint64_t>(b))
                : static_cast<int64_t>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
  };
  run_plan<T, int64_t>(
      c.p, ident,
      [&](const T* x, int64_t n, int64_t, int64_t) {
        uint64_t s = static_cast<uint64_t>(ident);
        if (prod) {
          for (int64_t i = 0; i < n; ++i) s *= static_cast<uint64_t>(x[i]);
        } else {
          for (int64_t i = 0; i < n; ++i) s += static_cast<uint64_t>(x[i]);
        }
        return static_cast<int64_t>(s);
      },
      [&](const T* x, int64_t rows, int64_t st, int64_t k, int64_t, int64_t, int64_t* acc) {
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t j = 0; j < k; ++j)
            acc[j] = comb(acc[j], static_cast<int64_t>(x[r * st + j]));
      },
      comb, [&](int64_t, int64_t oi, int64_t v) { out[oi] = v; });
}

// prod (floating), multiplied in double as compiled code multiplies (lower.cpp): float32
// partial products overflowed or underflowed where the whole product did not (3e38 times
// factors below 1 gave inf; inf times underflowed lanes gave NaN). A row whose lane products
// end non-finite or zero is multiplied again in order, so the lane split never decides it.
template <class T>
void prod_float(const Ctx& c) {
  T* out = c.out.data<T>();
  auto in_order = [](const T* x, int64_t n) {
    double s = 1;
    for (int64_t i = 0; i < n; ++i) s *= static_cast<double>(x[i]);
    return s;
  };
  run_plan<T, double>(
      c.p, 1.0,
      [&](const T* x, int64_t n, int64_t, int64_t) {
        constexpr int64_t kLanes = 8;
        double lanes[kLanes] = {1, 1, 1, 1, 1, 1, 1, 1};
        int64_t i = 0;
        for (; i + kLanes <= n; i += kLanes)
          for (int64_t k = 0; k < kLanes; ++k) lanes[k] *= static_cast<double>(x[i + k]);
        double s = 1;
        for (double l : lanes) s *= l;
        for (; i < n; ++i) s *= static_cast<double>(x[i]);
        return std::isfinite(s) && s != 0 ? s : in_order(x, n);
      },
      [&](const T* x, int64_t rows, int64_t st, int64_t k, int64_t, int64_t, double* acc) {
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t j = 0; j < k; ++j) acc[j] *= static_cast<double>(x[r * st + j]);
      },
      [](double a, double b) { return a * b; },
      [&](int64_t, int64_t oi, double v) { out[oi] = static_cast<T>(v); });
}

// amax / amin (any dtype; NaN propagates). With `params`, writes the plan-order results there
// (logsumexp's first pass) instead of to the output.
template <bool kMax, class T>
void extreme(const Ctx& c, T* params = nullptr) {
  T* out = params ? nullptr : c.out.data<T>();
  constexpr T ident = pick_identity<kMax, T>();
  auto write = [&](int64_t o, T v) {
    if (params)
      params[o] = v;
    else
      out[c.p.out_off(o)] = v;
  };
  if constexpr (kIsFloat<T>) {
    if (dense_short_rows<T>(c.p, 4)) {  // each lane picks along its row in order, as extreme_run
      const int64_t r = c.p.r;
      for_short_rows<T>(
          c.p,
          [&](const T* xb, const auto& off) {
            Vec<T> acc(ident);
            for (int64_t j = 0; j < r; ++j) acc = pick<kMax>(acc, Vec<T>::gather(xb + j, off));
            return acc;
          },
          [&](const T* xr) { return extreme_run<kMax>(xr, r, ident); },
          [&](int64_t a, T v, const T*) { write(a, v); });
      return;
    }
  }
  run_plan<T, T>(
      c.p, ident,
      [&](const T* x, int64_t n, int64_t, int64_t) { return extreme_run<kMax>(x, n, ident); },
      [&](const T* x, int64_t rows, int64_t st, int64_t k, int64_t, int64_t, T* acc) {
        apply_cols(x, rows, st, k, acc, [](auto a, auto v) { return pick<kMax>(a, v); });
      },
      [](T a, T b) { return pick<kMax>(a, b); },
      [&](int64_t o, int64_t oi, T v) {
        if (params)
          params[o] = v;
        else
          out[oi] = v;
      });
}

// var / std: two passes (mean, then Σ(x − mean)²), both accumulated in double; a float32
// output whose fast path lost range (needs_exact_moments) is redone with every step in double,
// the others corrected for the rounding of the mean (without_mean_rounding).
template <class T>
void variance(const Ctx& c, bool is_std) {
  const Plan& p = c.p;
  const int64_t outputs = p.k1 * p.k2;
  // Output o's values: column o % k2 of outer block o / k2, k2 apart.
  auto first_of = [&](int64_t o) {
    return reinterpret_cast<const T*>(p.base) + p.in_off(o / p.k2) + o % p.k2;
  };
  // The mean is summed shifted by each output's first value: float partial sums of rows on a
  // large offset (1e4 + 0.01·N(0, 1)) put it off by more than the spread, and var off by 3 %.
  std::unique_ptr<T[]> shift(new T[outputs]), mean(new T[outputs]);
  std::unique_ptr<double[]> exact_mean(new double[outputs]);
  for (int64_t o = 0; o < outputs; ++o) shift[o] = p.r > 0 ? *first_of(o) : T(0);
  double n = static_cast<double>(p.r);
  auto add = [](double a, double b) { return a + b; };
  run_plan<T, double>(
      p, 0.0,
      [&](const T* x, int64_t n, int64_t o, int64_t) {
        T s = shift[o];
        return sum_run(x, n, [s](auto v, int64_t) { return v - s; });
      },
      [&](const T* x, int64_t rows, int64_t st, int64_t k, int64_t o, int64_t, double* acc) {
        const T* s = shift.get() + o;
        sum_cols(x, rows, st, k, [s](auto v, int64_t j) { return v - vload<decltype(v)>(s + j); },
                 acc);
      },
      add, [&](int64_t o, int64_t, double v) {
        exact_mean[o] = static_cast<double>(shift[o]) + v / n;
        if (!std::isfinite(exact_mean[o]))
          exact_mean[o] = mean_without_overflow(first_of(o), p.r, p.k2);
        mean[o] = static_cast<T>(exact_mean[o]);
      });
  T* out = c.out.data<T>();
  double denom = n - static_cast<double>(c.call.attrs.mode);
  run_plan<T, double>(
      p, 0.0,
      [&](const T* x, int64_t n, int64_t o, int64_t) {
        T m = mean[o];
        return sum_run(x, n, [m](auto v, int64_t) {
          auto d = v - m;
          return d * d;
        });
      },
      [&](const T* x, int64_t rows, int64_t st, int64_t k, int64_t o, int64_t, double* acc) {
        const T* m = mean.get() + o;
        sum_cols(
            x, rows, st, k,
            [m](auto v, int64_t j) {
              auto d = v - vload<decltype(v)>(m + j);
              return d * d;
            },
            acc);
      },
      add,
      [&](int64_t o, int64_t oi, double v) {
        if (needs_exact_moments<T>(v, p.r, static_cast<double>(mean[o]))) {
          double m;
          exact_moments(first_of(o), p.r, p.k2, m, v);
        } else {
          v = without_mean_rounding(v, p.r, exact_mean[o], static_cast<double>(mean[o]));
        }
        // n - correction <= 0 divides by 0 (PyTorch): inf, or NaN for a constant row.
        double var = v / std::max(denom, 0.0);
        out[oi] = static_cast<T>(is_std ? std::sqrt(var) : var);
      });
}

// logsumexp: m = max, then m + log Σ exp(x − m); an infinite m is replaced by 0 (PyTorch).
template <class T>
void logsumexp(const Ctx& c) {
  const Plan& p = c.p;
  std::unique_ptr<T[]> mx(new T[p.k1 * p.k2]);
  extreme<true, T>(c, mx.get());
  for (int64_t o = 0; o < p.k1 * p.k2; ++o)
    if (std::isinf(mx[o])) mx[o] = 0;
  T* out = c.out.data<T>();
  run_plan<T, double>(
      p, 0.0,
      [&](const T* x, int64_t n, int64_t o, int64_t) {
        T m = mx[o];
        return sum_run(x, n, [m](auto v, int64_t) { return vexp(v - m); });
      },
      [&](const T* x, int64_t rows, int64_t st, int64_t k, int64_t o, int64_t, double* acc) {
        const T* m = mx.get() + o;
        sum_cols(
            x, rows, st, k, [m](auto v, int64_t j) { return vexp(v - vload<decltype(v)>(m + j)); },
            acc);
      },
      [](double a, double b) { return a + b; },
      [&](int64_t o, int64_t oi, double v) {
        out[oi] = static_cast<T>(std::log(v) + static_cast<double>(mx[o]));
      });
}

// all / any of x != 0 (any dtype; NaN counts as true).
template <class T>
void all_any(const Ctx& c, bool all) {
  bool* out = c.out.data<bool>();
  run_plan<T, bool>(
      c.p, all,
      [&](const T* x, int64_t n, int64_t, int64_t) {
        for (int64_t i = 0; i < n; ++i)
          if ((x[i] != T(0)) != all) return !all;
        return all;
      },
      [&](const T* x, int64_t rows, int64_t st, int64_t k, int64_t, int64_t, bool* acc) {
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t j = 0; j < k; ++j) {
            bool nz = x[r * st + j] != T(0);
            acc[j] = all ? (acc[j] && nz) : (acc[j] || nz);
          }
      },
      [all](bool a, bool b) { return all ? a && b : a || b; },
      [&](int64_t, int64_t oi, bool v) { out[oi] = v; });
}

template <class T>
struct ArgAcc {
  T v;
  int64_t i;  // -1: nothing seen yet
};

// Whether value v (seen after cur) replaces cur: strictly better, or the first NaN.
template <bool kMax, class T>
bool arg_better(T v, const ArgAcc<T>& cur) {
  if (cur.i < 0) return true;
  if constexpr (kIsFloat<T>) {
    if (cur.v != cur.v) return false;
    if (v != v) return true;
  }
  return kMax ? v > cur.v : v < cur.v;
}

// Column argmax / argmin: acc[j] takes the first extreme of column j over `rows` rows (row
// indices offset by base). Floating types are vectorised across columns, keeping each lane's
// running extreme and row in L1 arrays; a lane switches only on a strictly better value or on
// its first NaN, so ties and NaNs resolve to the first row as in the scalar rule.
template <bool kMax, class T>
void arg_cols(const T* x, int64_t rows, int64_t st, int64_t k, int64_t base, ArgAcc<T>* acc) {
  int64_t j0 = 0;
  if constexpr (kIsFloat<T>) {
    using V = Vec<T>;
    using I = xsimd::as_integer_t<T>;  // int32 for float, int64 for double: same lane count
    using VI = xsimd::batch<I>;
    constexpr int64_t L = V::size;
    const int64_t kv = k / L * L;
    if (kv > 0 && rows < (int64_t{1} << 31)) {
      alignas(64) T best[kStripe];
      alignas(64) I row_of[kStripe];
      std::copy_n(x, kv, best);
      std::fill_n(row_of, kv, I(0));
      for (int64_t r = 1; r < rows; ++r) {
        const T* xr = x + r * st;
        const VI rv(static_cast<I>(r));
        for (int64_t j = 0; j < kv; j += L) {
          V v = V::load_unaligned(xr + j), b = V::load_aligned(best + j);
          auto nan_first = xsimd::isnan(v) & !xsimd::isnan(b);
          auto better = (kMax ? (v > b) : (v < b)) | nan_first;
          xsimd::select(better, v, b).store_aligned(best + j);
          VI cur = VI::load_aligned(row_of + j);
          xsimd::select(xsimd::bool_cast(better), rv, cur).store_aligned(row_of + j);
        }
      }
      for (int64_t j = 0; j < kv; ++j) {
        if (arg_better<kMax>(best[j], acc[j])) acc[j] = {best[j], base + row_of[j]};
      }
      j0 = kv;
    }
  }
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = j0; j < k; ++j) {
      T v = x[r * st + j];
      if (arg_better<kMax>(v, acc[j])) acc[j] = {v, base + r};
    }
}

// argmax / argmin: index of the first extreme value (the first NaN if any).
template <bool kMax, class T>
void arg_extreme(const Ctx& c) {
  int64_t* out = c.out.data<int64_t>();
  if constexpr (kIsFloat<T>) {
    if (dense_short_rows<T>(c.p, 4)) {
      // Each lane keeps its row's first extreme (arg_better: strictly better, or the first
      // NaN), which is what extreme_run then find_first give the row path.
      using V = Vec<T>;
      const int64_t r = c.p.r;
      for_short_rows<T>(
          c.p,
          [&](const T* xb, const auto& off) {
            V best = V::gather(xb, off), at(T(0));
            for (int64_t j = 1; j < r; ++j) {
              V v = V::gather(xb + j, off);
              auto better = !xsimd::isnan(best) &
                            (xsimd::isnan(v) | (kMax ? v > best : v < best));
              best = xsimd::select(better, v, best);
              at = xsimd::select(better, V(static_cast<T>(j)), at);
            }
            return at;  // the index as T: exact, being under 64
          },
          [&](const T* xr) {
            const T m = extreme_run<kMax>(xr, r, pick_identity<kMax, T>());
            return static_cast<T>(find_first(xr, r, m));
          },
          [&](int64_t a, T index, const T*) {
            out[c.p.out_off(a)] = static_cast<int64_t>(index);
          });
      return;
    }
  }
  run_plan<T, ArgAcc<T>>(
      c.p, ArgAcc<T>{T(0), -1},
      [&](const T* x, int64_t n, int64_t, int64_t base) {
        T m = extreme_run<kMax>(x, n, pick_identity<kMax, T>());
        return ArgAcc<T>{m, base + find_first(x, n, m)};
      },
      [&](const T* x, int64_t rows, int64_t st, int64_t k, int64_t, int64_t base, ArgAcc<T>* acc) {
        arg_cols<kMax>(x, rows, st, k, base, acc);
      },
      [](const ArgAcc<T>& a, const ArgAcc<T>& b) { return arg_better<kMax>(b.v, a) ? b : a; },
      [&](int64_t, int64_t oi, const ArgAcc<T>& v) { out[oi] = v.i; });
}

// The value of a reduction over an empty set.
void fill_identity(OpKind op, Tensor& out) {
  double v = 0;
  switch (op) {
    case OpKind::Prod:
    case OpKind::All:
      v = 1;
      break;
    case OpKind::Mean:
    case OpKind::Var:
    case OpKind::Std:
      v = std::numeric_limits<double>::quiet_NaN();
      break;
    case OpKind::LogSumExp:
      v = -std::numeric_limits<double>::infinity();
      break;
    default:
      break;
  }
  int64_t n = out.numel();
  KILN_DISPATCH_ALL(out.dtype(), O, {
    O* o = out.data<O>();
    O val = is_floating(out.dtype()) || !std::isnan(v) ? static_cast<O>(v) : O(0);
    std::fill_n(o, n, val);
  });
}

// An expanded view (stride-0 dims: x.expand({100000, 100000}).sum()) is reduced through its
// base, as PyTorch does, instead of being copied whole by make_plan: each stride-0 dim is
// reduced at size 1, the result corrected for the repeats (a sum times their count, a product
// to their power, logsumexp plus their log, var / std rescaled from the base's population
// variance; mean, amax, amin, all and any unchanged), and a kept stride-0 dim broadcast back.
// Only for views of more than kExpandedCopyMax elements: smaller ones are copied, which keeps
// their sums the sequential ones that compiled code computes.
constexpr int64_t kExpandedCopyMax = int64_t{1} << 24;

template <class T>
void scale_repeats(const OpCall& call, Tensor& part, double repeats, double base_count) {
  T* v = part.data<T>();
  const int64_t n = part.numel();
  switch (call.op) {
    case OpKind::Sum:
      if constexpr (std::is_floating_point_v<T>) {
        for (int64_t i = 0; i < n; ++i) v[i] = static_cast<T>(v[i] * repeats);
      } else {  // int64 sums wrap, as eager's do
        const auto r = static_cast<uint64_t>(repeats);
        for (int64_t i = 0; i < n; ++i) v[i] = static_cast<T>(static_cast<uint64_t>(v[i]) * r);
      }
      break;
    case OpKind::Prod:
      if constexpr (std::is_floating_point_v<T>) {
        for (int64_t i = 0; i < n; ++i) v[i] = static_cast<T>(std::pow(double(v[i]), repeats));
      } else {  // wrapping power by squaring
        for (int64_t i = 0; i < n; ++i) {
          uint64_t base = static_cast<uint64_t>(v[i]), acc = 1;
          for (auto e = static_cast<uint64_t>(repeats); e; e >>= 1, base *= base)
            if (e & 1) acc *= base;
          v[i] = static_cast<T>(acc);
        }
      }
      break;
    case OpKind::LogSumExp:
      for (int64_t i = 0; i < n; ++i) v[i] = static_cast<T>(v[i] + std::log(repeats));
      break;
    case OpKind::Var:
    case OpKind::Std: {
      // Σ over the view = repeats · Σ over the base; N − correction ≤ 0 gives inf (nan for 0).
      const double count = repeats * base_count;
      const double denom = std::max(count - static_cast<double>(call.attrs.mode), 0.0);
      const double scale = repeats * base_count / denom;
      const double factor = call.op == OpKind::Std ? std::sqrt(scale) : scale;
      for (int64_t i = 0; i < n; ++i) v[i] = static_cast<T>(v[i] * factor);
      break;
    }
    default:
      break;
  }
}

bool reduce_expanded(const OpCall& call, const InferredMeta& meta, const Tensor& x, Tensor& out,
                     uint32_t mask) {
  if (x.numel() <= kExpandedCopyMax) return false;
  const int rank = x.dim();
  Shape base_shape = x.shape();
  double repeats = 1, base_count = 1;
  for (int i = 0; i < rank; ++i) {
    const bool expanded = x.strides()[i] == 0 && x.shape()[i] > 1;
    if (expanded) base_shape[i] = 1;
    if (mask >> i & 1) (expanded ? repeats : base_count) *= static_cast<double>(x.shape()[i]);
  }
  if (base_shape == x.shape()) return false;
  // The base's result: out's shape with size 1 where a kept dim is expanded.
  Shape part_shape;
  for (int i = 0; i < rank; ++i)
    if (!(mask >> i & 1)) part_shape.push_back(base_shape[i]);
    else if (call.attrs.keepdim) part_shape.push_back(1);
  OpCall base_call = call;
  base_call.inputs = {restride(x, base_shape, x.strides())};
  if (call.op == OpKind::Var || call.op == OpKind::Std) base_call.attrs.mode = 0;
  Tensor part = empty_cpu(part_shape, out.dtype());
  Tensor parts[1] = {part};
  reduction_kernel(base_call, meta, parts);
  if (repeats > 1)
    KILN_DISPATCH_ALL(part.dtype(), T, { scale_repeats<T>(call, part, repeats, base_count); });
  Strides broadcast = contiguous_strides(part_shape);
  for (int j = 0; j < part_shape.size(); ++j)
    if (part_shape[j] != out.shape()[j]) broadcast[j] = 0;
  copy_cast(out, restride(part, out.shape(), broadcast));
  return true;
}

}  // namespace

void reduction_kernel(const OpCall& call, const InferredMeta& meta, std::span<Tensor> outs) {
  const Tensor& x = call.inputs[0];
  Tensor& out = outs[0];
  if (out.numel() == 0) return;
  const OpKind op = call.op;
  const bool arg = op == OpKind::Argmax || op == OpKind::Argmin;
  const int rank = x.dim();
  uint32_t mask;
  if (arg) {
    if (call.attrs.all_dims)
      mask = rank ? (1u << rank) - 1 : 0;
    else
      mask = rank ? 1u << wrap_dim(call.attrs.dim, rank, call.name()) : 0;
  } else {
    mask = reduction_mask(call.attrs, rank, call.name(), call.loc);
  }
  if (x.numel() == 0) {
    fill_identity(op, out);
    return;
  }
  if (!arg && reduce_expanded(call, meta, x, out, mask)) return;
  Plan p = make_plan(x, mask, arg && call.attrs.all_dims);
  Ctx c{call, p, out};
  const DType t = x.dtype();
  switch (op) {
    case OpKind::Sum:
    case OpKind::Prod:
      if (is_floating(t)) {
        KILN_DISPATCH_FLOAT(t, T, {
          if (op == OpKind::Sum)
            sum_float<T>(c, false);
          else
            prod_float<T>(c);
        });
      } else {
        // bool / int32 / int64 read as they are, accumulated in int64 (dispatch.cpp
        // does not convert them: a bool tensor's int64 copy took 8 bytes per element).
        if (t == DType::Bool) sum_prod_int<bool>(c, op == OpKind::Prod);
        if (t == DType::Int32) sum_prod_int<int32_t>(c, op == OpKind::Prod);
        if (t == DType::Int64) sum_prod_int<int64_t>(c, op == OpKind::Prod);
      }
      break;
    case OpKind::Mean:
      KILN_DISPATCH_FLOAT(t, T, { sum_float<T>(c, true); });
      break;
    case OpKind::Var:
    case OpKind::Std:
      KILN_DISPATCH_FLOAT(t, T, { variance<T>(c, op == OpKind::Std); });
      break;
    case OpKind::LogSumExp:
      KILN_DISPATCH_FLOAT(t, T, { logsumexp<T>(c); });
      break;
    case OpKind::Amax:
      KILN_DISPATCH_ALL(t, T, { extreme<true, T>(c); });
      break;
    case OpKind::Amin:
      KILN_DISPATCH_ALL(t, T, { extreme<false, T>(c); });
      break;
    case OpKind::All:
    case OpKind::Any:
      KILN_DISPATCH_ALL(t, T, { all_any<T>(c, op == OpKind::All); });
      break;
    case OpKind::Argmax:
      KILN_DISPATCH_NUMERIC(t, T, { arg_extreme<true, T>(c); });
      break;
    case OpKind::Argmin:
      KILN_DISPATCH_NUMERIC(t, T, { arg_extreme<false, T>(c); });
      break;
    default:
      throw Error(call.name(), "not a reduction", call.loc);
  }
}

}  // namespace kiln::cpu
