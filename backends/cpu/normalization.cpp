// softmax, log_softmax (along any dim) and layer_norm (over the trailing dims).
//
// Softmax views the input as [A, N, B] with N the softmax dim. B == 1 (the last dim) is the
// row path: per row one max pass, one fused exp/store/sum pass, one scale pass, all on data
// that stays in L1/L2 for the row. B > 1 vectorises across B in stripes of columns.
#include "backends/cpu/kernels.h"
#include "backends/cpu/parallel.h"
#include "backends/cpu/reduce_simd.h"

namespace kiln::cpu {
namespace {

using namespace simd;

// layer_norm near the float32 limits: a row whose (biased, double) variance exceeds
// kLayerNormScaledVar is normalised as (x·s − mean·s)·(rstd/s), s = kLayerNormScale. Below it
// |x − mean| ≤ sqrt(n·var) stays far under FLT_MAX and rstd ≥ 2^-95 is a normal float32; above
// it x − mean (up to 2·FLT_MAX) would overflow and rstd (down to 2^-129) be subnormal, while
// s = 1/16 keeps both in range. ir/decompose.cpp (layer_norm) uses the same two constants.
constexpr double kLayerNormScaledVar = 0x1p190;
constexpr double kLayerNormScale = 0x1p-4;
constexpr int64_t kStripe = 1024;  // max columns per task when the softmax dim is not the last

template <class T>
void softmax_rows(const T* x, T* y, int64_t n, bool log) {
  using V = Vec<T>;
  constexpr int64_t L = V::size;
  const T m = extreme_run<true>(x, n, pick_identity<true, T>());
  if (log) {
    double s = sum_run(x, n, [m](auto v, int64_t) { return vexp(v - m); });
    // (x − m) − log s: subtracting m first keeps the precision of large-magnitude logits.
    const T ls = static_cast<T>(std::log(s));
    int64_t i = 0;
    for (; i + L <= n; i += L) ((V::load_unaligned(x + i) - m) - ls).store_unaligned(y + i);
    for (; i < n; ++i) y[i] = (x[i] - m) - ls;
    return;
  }
  double s = sum_run(x, n, [m, y](auto v, int64_t i) {
    auto e = vexp(v - m);
    vstore(y + i, e);
    return e;
  });
  const T inv = static_cast<T>(1.0 / s);
  int64_t i = 0;
  for (; i + L <= n; i += L) (V::load_unaligned(y + i) * inv).store_unaligned(y + i);
  for (; i < n; ++i) y[i] *= inv;
}

// Softmax over rows shorter than 4 batches (n < 4 * lanes: a classifier's 10 classes, a
// router's 8 experts), which the row path would run almost all through its scalar tails: one
// exp per element at scalar speed and a log or a division per row (softmax [1048576, 8] took
// about 90 ms, 8 ms with [524288, 16]). Here a block of rows is done in steps that each run
// over the whole block: x − max per row, exp of the flat block in full batches, the sums per
// row in double with their logs or reciprocals, then the scaling per row.
template <class T>
void softmax_short_rows(const T* x, T* y, int64_t rows, int64_t n, bool log) {
  constexpr int64_t kBlockElems = 2048;
  using V = Vec<T>;
  constexpr int64_t L = V::size;
  const int64_t per = std::max<int64_t>(1, kBlockElems / n);  // rows per block
  alignas(64) T ex[kBlockElems + 64];                          // the block's exps (log_softmax)
  alignas(64) double row_s[kBlockElems];                       // Σ exp per row, then 1/Σ or log Σ
  for (int64_t r0 = 0; r0 < rows; r0 += per) {
    const int64_t nr = std::min(per, rows - r0), cnt = nr * n;
    const T* xb = x + r0 * n;
    T* yb = y + r0 * n;
    T* e = log ? ex : yb;  // softmax keeps the exps in y, scaled there below
    for (int64_t r = 0; r < nr; ++r) {
      const T* xr = xb + r * n;
      T m = pick_identity<true, T>();
      for (int64_t i = 0; i < n; ++i) m = pick<true>(m, xr[i]);
      for (int64_t i = 0; i < n; ++i) yb[r * n + i] = xr[i] - m;  // (x − m): exact order of ops
    }
    // Every element through the batch formula, the block's tail too: a scalar exp (libm's
    // for float64) rounded some elements differently, so a row's bits depended on where the
    // block started, and on the thread count (a break-it pass).
    int64_t k = 0;
    for (; k + L <= cnt; k += L) vexp(V::load_unaligned(yb + k)).store_unaligned(e + k);
    if (k < cnt) {
      alignas(64) T tail[L] = {};
      std::copy(yb + k, yb + cnt, tail);
      vexp(V::load_aligned(tail)).store_aligned(tail);
      std::copy(tail, tail + (cnt - k), e + k);
    }
    for (int64_t r = 0; r < nr; ++r) {
      double s = 0;
      for (int64_t i = 0; i < n; ++i) s += static_cast<double>(e[r * n + i]);
      row_s[r] = log ? std::log(s) : 1.0 / s;  // per row, as the row path: no batch/tail split
    }
    for (int64_t r = 0; r < nr; ++r) {
      const T f = static_cast<T>(row_s[r]);
      T* yr = yb + r * n;
      if (log)
        for (int64_t i = 0; i < n; ++i) yr[i] -= f;  // (x − m) − log Σ, as the row path
      else
        for (int64_t i = 0; i < n; ++i) yr[i] *= f;
    }
  }
}

// Softmax over the rows of a [n, stride] block, for columns [0, k) (k <= kStripe).
template <class T>
void softmax_cols(const T* x, T* y, int64_t n, int64_t stride, int64_t k, bool log) {
  using V = Vec<T>;
  constexpr int64_t L = V::size;
  T m[kStripe], s[kStripe];
  std::fill_n(m, k, pick_identity<true, T>());
  std::fill_n(s, k, T(0));
  // Applies f(j, batch-or-scalar offset) over columns [0, k).
  auto cols = [k](auto&& f) {
    int64_t j = 0;
    for (; j + L <= k; j += L) f(j, V());
    for (; j < k; ++j) f(j, T());
  };
  for (int64_t r = 0; r < n; ++r) {
    const T* xr = x + r * stride;
    cols([&](int64_t j, auto tag) {
      using W = decltype(tag);
      vstore(m + j, pick<true>(vload<W>(m + j), vload<W>(xr + j)));
    });
  }
  // The sums add kSumBlock rows in T, then each block's sum in double: summed in float row
  // after row, 65536 rows lost 9.5e-5 relative (a fresh user's trial; the last-dim path sums
  // in double).
  constexpr int64_t kSumBlock = 256;
  double total[kStripe];
  std::fill_n(total, k, 0.0);
  for (int64_t r0 = 0; r0 < n; r0 += kSumBlock) {
    for (int64_t r = r0; r < std::min(n, r0 + kSumBlock); ++r) {
      const T* xr = x + r * stride;
      T* yr = y + r * stride;
      cols([&](int64_t j, auto tag) {
        using W = decltype(tag);
        W e = vexp(vload<W>(xr + j) - vload<W>(m + j));
        if (!log) vstore(yr + j, e);
        vstore(s + j, vload<W>(s + j) + e);
      });
    }
    for (int64_t j = 0; j < k; ++j) total[j] += s[j];
    std::fill_n(s, k, T(0));
  }
  // softmax: y *= 1/s;  log_softmax: y = (x − m) − log s.
  for (int64_t j = 0; j < k; ++j)
    s[j] = static_cast<T>(log ? std::log(total[j]) : 1.0 / total[j]);
  for (int64_t r = 0; r < n; ++r) {
    const T* xr = x + r * stride;
    T* yr = y + r * stride;
    cols([&](int64_t j, auto tag) {
      using W = decltype(tag);
      if (log)
        vstore(yr + j, (vload<W>(xr + j) - vload<W>(m + j)) - vload<W>(s + j));
      else
        vstore(yr + j, vload<W>(yr + j) * vload<W>(s + j));
    });
  }
}

template <class T>
void softmax(const OpCall& call, Tensor& out) {
  const Tensor x = contiguous_cpu(call.inputs[0], out.dtype());
  const bool log = call.op == OpKind::LogSoftmax;
  const int rank = x.dim();
  const int d = wrap_dim(call.attrs.dim, rank, call.name());
  int64_t a = 1, n = 1, b = 1;
  for (int i = 0; i < rank; ++i) (i < d ? a : i == d ? n : b) *= x.shape()[i];
  const T* xp = x.data<T>();
  T* yp = out.data<T>();
  if (b == 1 && n < 4 * static_cast<int64_t>(Vec<T>::size)) {
    parallel_for(0, a, std::max<int64_t>(1, kGrainSize / n), [&](int64_t lo, int64_t hi) {
      softmax_short_rows(xp + lo * n, yp + lo * n, hi - lo, n, log);
    });
    return;
  }
  if (b == 1) {
    parallel_for(0, a, std::max<int64_t>(1, kGrainSize / n), [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) {
        if (i + 1 < hi) prefetch(xp + (i + 1) * n, n);
        softmax_rows(xp + i * n, yp + i * n, n, log);
      }
    });
    return;
  }
  // Wide stripes stream whole rows: on [4096, 1024] over dim 0, stripes of 1024 / 512 / 256
  // columns took 1.9 / 3.8 / 4-10 ms (short strided segments defeat the prefetchers), so
  // stripes are not narrowed to feed a second thread.
  const int64_t width = std::min(b, kStripe);
  const int64_t ns = ceil_div(b, width);
  const int64_t grain = std::max<int64_t>(1, kGrainSize / (n * std::min(b, width)));
  parallel_for(0, a * ns, grain, [&](int64_t lo, int64_t hi) {
    for (int64_t t = lo; t < hi; ++t) {
      int64_t i = t / ns, j0 = (t % ns) * width;
      int64_t off = i * n * b + j0;
      softmax_cols(xp + off, yp + off, n, b, std::min(width, b - j0), log);
    }
  });
}

// The mean and (biased) variance of a layer_norm row of m values, and the mean as T's
// mean_t + mean_lo: x − mean is computed as (x − mean_t) − mean_lo, exact in its first step for
// x within a factor 2 of the mean (Sterbenz). With mean_t alone, rows on a large offset with a
// small spread (1e4 + 0.01·U(−3, 3)) were off by up to 0.1 after the division by their std:
// mean_t's rounding (ulp(1e4) / 2) was ~3 % of the spread.
template <class T>
struct RowMoments {
  double mean, var;
  T mean_t, mean_lo;
};

// Statistics: the float fast path (sum_run), redone in double where it lost range
// (needs_exact_moments). The mean is summed shifted by the first value, as var
// (backends/cpu/reduce.cpp): float partial sums of a row on a large offset put the mean off by
// more than the spread.
template <class T>
RowMoments<T> row_moments(const T* xr, int64_t m) {
  const T x0 = xr[0];
  double mean = static_cast<double>(x0) + sum_run(xr, m, [x0](auto v, int64_t) {
                  return v - x0;
                }) / m;
  if (!std::isfinite(mean)) mean = mean_without_overflow(xr, m, 1);
  T mt = static_cast<T>(mean);
  double m2 = sum_run(xr, m, [mt](auto v, int64_t) {
    auto d = v - mt;
    return d * d;
  });
  if (needs_exact_moments<T>(m2, m, mean)) {
    exact_moments(xr, m, 1, mean, m2);
    mt = static_cast<T>(mean);
  } else {
    m2 = without_mean_rounding(m2, m, mean, static_cast<double>(mt));
  }
  return {mean, m2 / m, mt, static_cast<T>(mean - static_cast<double>(mt))};
}

template <class T>
void layer_norm(const OpCall& call, Tensor& out) {
  const DType dt = out.dtype();
  const Tensor x = contiguous_cpu(call.inputs[0], dt);
  Tensor w, bias;
  if (call.inputs.size() > 1 && call.inputs[1].defined()) w = contiguous_cpu(call.inputs[1], dt);
  if (call.inputs.size() > 2 && call.inputs[2].defined()) bias = contiguous_cpu(call.inputs[2], dt);
  const int64_t m = numel(call.attrs.dims);
  const int64_t rows = x.numel() / m;
  const T* xp = x.data<T>();
  T* yp = out.data<T>();
  const T* wp = w.defined() ? w.data<T>() : nullptr;
  const T* bp = bias.defined() ? bias.data<T>() : nullptr;
  const double eps = call.attrs.eps;
  // y = (x − mean)·rstd·w + b, with the weight/bias variant chosen outside the loop. Not
  // x·rstd − mean·rstd: that cancels catastrophically when var ≈ 0 (rstd ≈ 1/sqrt(eps)), so a
  // constant row gave ±ulp(|x|·316) instead of 0 (found by tests/fuzz); the compiled
  // decomposition (ir/decompose.cpp) computes (x − mean)·rstd too.
  // Statistics from row_moments; rows past kLayerNormScaledVar are normalised scaled (above).
  //
  // Rows shorter than 4 batches are done in blocks, statistics of the whole block first: one
  // row's steps (two short sums, sqrt, division, normalisation) are a chain of dependent
  // latencies, which rows of a block overlap (layer_norm [1048576, 8] took 45-50 ms row by
  // row). Longer rows go one at a time, the next one prefetched.
  constexpr int64_t kShortRowBlock = 256;
  const int64_t block = m < 4 * static_cast<int64_t>(Vec<T>::size) ? kShortRowBlock : 1;
  auto run = [&](auto has_w, auto has_b) {
    // y = (x − mean)·rstd [·w] [+ b] for one row.
    auto normalize = [&](const T* xr, T* yr, T mt, T mlo, double var, double rstd) {
      using V = Vec<T>;
      constexpr int64_t L = V::size;
      auto with_scale = [&](auto scaled) {
        constexpr bool kScaled = decltype(scaled)::value;
        const T s = kScaled ? T(kLayerNormScale) : T(1);
        const T ms = mt * s, mlo_s = mlo * s;
        const T rs = static_cast<T>(kScaled ? rstd / kLayerNormScale : rstd);
        auto body = [&](auto v, int64_t i) {
          using W = decltype(v);
          W z;
          if constexpr (kScaled)
            z = ((v * s - ms) - mlo_s) * rs;
          else
            z = ((v - mt) - mlo) * rs;
          if constexpr (decltype(has_w)::value) z = z * vload<W>(wp + i);
          if constexpr (decltype(has_b)::value) z = z + vload<W>(bp + i);
          vstore(yr + i, z);
        };
        int64_t i = 0;
        for (; i + L <= m; i += L) body(V::load_unaligned(xr + i), i);
        for (; i < m; ++i) body(xr[i], i);
      };
      if (var > kLayerNormScaledVar)
        with_scale(std::true_type());
      else
        with_scale(std::false_type());
    };
    parallel_for(0, rows, std::max<int64_t>(1, kGrainSize / m), [&](int64_t lo, int64_t hi) {
      T mean_t[kShortRowBlock], mean_lo[kShortRowBlock];
      double var[kShortRowBlock], rstd[kShortRowBlock];
      for (int64_t r0 = lo; r0 < hi; r0 += block) {
        const int64_t nr = std::min(block, hi - r0);
        if (block == 1 && r0 + 1 < hi) prefetch(xp + (r0 + 1) * m, m);
        for (int64_t r = 0; r < nr; ++r) {
          const RowMoments<T> st = row_moments(xp + (r0 + r) * m, m);
          mean_t[r] = st.mean_t;
          mean_lo[r] = st.mean_lo;
          var[r] = st.var;
        }
        for (int64_t r = 0; r < nr; ++r) rstd[r] = 1.0 / std::sqrt(var[r] + eps);
        for (int64_t r = 0; r < nr; ++r)
          normalize(xp + (r0 + r) * m, yp + (r0 + r) * m, mean_t[r], mean_lo[r], var[r],
                    rstd[r]);
      }
    });
  };
  using Yes = std::true_type;
  using No = std::false_type;
  if (wp && bp)
    run(Yes(), Yes());
  else if (wp)
    run(Yes(), No());
  else if (bp)
    run(No(), Yes());
  else
    run(No(), No());
}

// Rows per block of layer_norm_backward's weight/bias partial sums: each block sums its rows in
// T, and the blocks are added in double in block order, so the result does not depend on the
// thread count.
constexpr int64_t kRowsPerBlock = 32;

// One row of layer_norm_backward in double throughout: rows with non-finite or huge variance
// (past kLayerNormScaledVar), where float32 x − mean or rstd would leave float range.
template <class T>
void layer_norm_backward_row_exact(const T* xr, const T* wp, const T* gr, int64_t m, double mean,
                                   double rstd, T* dxr, T* pw, T* pb) {
  auto xhat = [&](int64_t i) { return (static_cast<double>(xr[i]) - mean) * rstd; };
  auto gx = [&](int64_t i) { return static_cast<double>(gr[i]) * (wp ? wp[i] : T(1)); };
  double a = 0, b = 0;
  for (int64_t i = 0; i < m; ++i) {
    a += gx(i);
    b += gx(i) * xhat(i);
  }
  a /= m;
  b /= m;
  for (int64_t i = 0; i < m; ++i) {
    if (dxr) dxr[i] = static_cast<T>(rstd * (gx(i) - a - xhat(i) * b));
    if (pw) pw[i] += static_cast<T>(gr[i] * xhat(i));
    if (pb) pb[i] += gr[i];
  }
}

template <class T>
void layer_norm_backward(const T* xp, const T* wp, const T* gp, int64_t rows, int64_t m,
                         double eps, T* dxp, T* dwp, T* dbp) {
  const int64_t blocks = ceil_div(rows, kRowsPerBlock);
  std::vector<T> part_w(dwp ? blocks * m : 0), part_b(dbp ? blocks * m : 0);
  const int64_t grain = std::max<int64_t>(1, kGrainSize / (kRowsPerBlock * m));
  parallel_for(0, blocks, grain, [&](int64_t lo, int64_t hi) {
    using V = Vec<T>;
    constexpr int64_t L = V::size;
    for (int64_t blk = lo; blk < hi; ++blk) {
      T* pw = dwp ? part_w.data() + blk * m : nullptr;
      T* pb = dbp ? part_b.data() + blk * m : nullptr;
      for (int64_t r = blk * kRowsPerBlock; r < std::min(rows, (blk + 1) * kRowsPerBlock); ++r) {
        const T* xr = xp + r * m;
        const T* gr = gp + r * m;
        T* dxr = dxp ? dxp + r * m : nullptr;
        const RowMoments<T> st = row_moments(xr, m);
        const double rstd = 1.0 / std::sqrt(st.var + eps);
        if (!(st.var <= kLayerNormScaledVar)) {
          layer_norm_backward_row_exact(xr, wp, gr, m, st.mean, rstd, dxr, pw, pb);
          continue;
        }
        const T mt = st.mean_t, mlo = st.mean_lo, rs = static_cast<T>(rstd);
        auto gx = [&](auto g, int64_t i) {
          using W = decltype(g);
          return wp ? W(g * vload<W>(wp + i)) : g;
        };
        auto xhat = [&](auto g, int64_t i) {
          using W = decltype(g);
          return W(((vload<W>(xr + i) - mt) - mlo) * rs);
        };
        // dx = rstd·(ĝ − mean(ĝ) − x̂·mean(ĝ·x̂)), ĝ = g·w.
        const T a = static_cast<T>(sum_run(gr, m, gx) / m);
        const T b = static_cast<T>(
            sum_run(gr, m, [&](auto g, int64_t i) { return gx(g, i) * xhat(g, i); }) / m);
        auto body = [&](auto g, int64_t i) {
          using W = decltype(g);
          const W xh = xhat(g, i);
          if (dxr) vstore(dxr + i, W(((gx(g, i) - a) - xh * b) * rs));
          if (pw) vstore(pw + i, W(vload<W>(pw + i) + g * xh));
          if (pb) vstore(pb + i, W(vload<W>(pb + i) + g));
        };
        int64_t i = 0;
        for (; i + L <= m; i += L) body(V::load_unaligned(gr + i), i);
        for (; i < m; ++i) body(gr[i], i);
      }
    }
  });
  // Σ over blocks, in double and in block order.
  for (auto [part, dst] : {std::pair{&part_w, dwp}, std::pair{&part_b, dbp}}) {
    if (!dst) continue;
    std::vector<double> acc(m, 0.0);
    for (int64_t blk = 0; blk < blocks; ++blk)
      for (int64_t j = 0; j < m; ++j) acc[j] += (*part)[blk * m + j];
    for (int64_t j = 0; j < m; ++j) dst[j] = static_cast<T>(acc[j]);
  }
}

}  // namespace

LayerNormGrads layer_norm_backward(const Tensor& x, const Tensor& w, const Tensor& g,
                                   const Shape& normalized_shape, double eps, bool need_dx,
                                   bool need_dw, bool need_db) {
  const DType dt = g.dtype();
  const int64_t m = numel(normalized_shape);
  LayerNormGrads out;
  if (need_dx) out.dx = empty_cpu(x.shape(), dt);
  if (need_dw) out.dw = empty_cpu(normalized_shape, dt);
  if (need_db) out.db = empty_cpu(normalized_shape, dt);
  if (m == 0) return out;
  const Tensor xc = contiguous_cpu(x, dt), gc = contiguous_cpu(g, dt);
  const Tensor wc = w.defined() ? contiguous_cpu(w, dt) : Tensor();
  KILN_DISPATCH_FLOAT(dt, T, {
    auto ptr = [](const Tensor& t) { return t.defined() ? t.data<T>() : nullptr; };
    layer_norm_backward<T>(xc.data<T>(), ptr(wc), gc.data<T>(), x.numel() / m, m, eps,
                           ptr(out.dx), ptr(out.dw), ptr(out.db));
  });
  return out;
}

void normalization_kernel(const OpCall& call, const InferredMeta& meta, std::span<Tensor> outs) {
  Tensor& out = outs[0];
  if (out.numel() == 0) return;
  KILN_DISPATCH_FLOAT(out.dtype(), T, {
    if (call.op == OpKind::LayerNorm)
      layer_norm<T>(call, out);
    else
      softmax<T>(call, out);
  });
}

}  // namespace kiln::cpu
