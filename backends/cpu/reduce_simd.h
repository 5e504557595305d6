#pragma once
/// SIMD building blocks shared by the reduction, normalisation and loss kernels: accurate
/// float sums, NaN-propagating max/min, find-first, and helpers that work on both xsimd
/// batches and scalars so one lambda serves the vector body and the scalar tail.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <xsimd/xsimd.hpp>

#include "backends/cpu/simd_exp.h"
#include "core/tensor.h"

namespace kiln::cpu::simd {

template <class T>
using Vec = xsimd::batch<T>;
template <class V>
inline constexpr bool kIsBatch = !std::is_arithmetic_v<V>;
template <class T>
inline constexpr bool kIsFloat = std::is_floating_point_v<T>;

/// Elements summed in T (across 4 x lanes accumulators) before the partial sum is added into
/// a double: each lane sees kBlock / (4 * lanes) values, so float32 sums of millions of
/// elements stay within ~1e-7 relative of a float64 reference.
inline constexpr int64_t kBlock = 4096;

/// Loads a batch (V is an xsimd batch) or one value (V is a scalar) from p.
template <class V, class T>
inline V vload(const T* p) {
  if constexpr (kIsBatch<V>)
    return V::load_unaligned(p);
  else
    return *p;
}
/// Stores a batch or one value at p.
template <class V, class T>
inline void vstore(T* p, const V& v) {
  if constexpr (kIsBatch<V>)
    v.store_unaligned(p);
  else
    *p = v;
}
template <class V>
inline V vexp(const V& v) {
  return formulas::Exp::eval(v);  // float32: the full-range exp of the elementwise kernels
}

/// max (kMax) or min of acc and x; a NaN in x (or already in acc) wins, as in PyTorch.
template <bool kMax, class V>
inline V pick(const V& acc, const V& x) {
  if constexpr (kIsBatch<V>) {
    V m;
    if constexpr (kMax)
      m = xsimd::select(x > acc, x, acc);
    else
      m = xsimd::select(x < acc, x, acc);
    return xsimd::select(xsimd::isnan(x), x, m);
  } else if constexpr (kIsFloat<V>) {
    return (x != x || (kMax ? x > acc : x < acc)) ? x : acc;
  } else {
    return (kMax ? x > acc : x < acc) ? x : acc;
  }
}

/// The identity of pick<kMax> (-inf / +inf for floats, the extreme values for integers).
template <bool kMax, class T>
constexpr T pick_identity() {
  if constexpr (kIsFloat<T>)
    return kMax ? -std::numeric_limits<T>::infinity() : std::numeric_limits<T>::infinity();
  else
    return kMax ? std::numeric_limits<T>::lowest() : std::numeric_limits<T>::max();
}

/// Σ f(x[i], i) over a contiguous run, accumulated in double (see kBlock). f is called with a
/// batch loaded at x + i, or with the scalar x[i], and returns the same kind.
template <class T, class F>
double sum_run(const T* x, int64_t n, const F& f) {
  using V = Vec<T>;
  constexpr int64_t L = V::size;
  double total = 0;
  int64_t i = 0;
  while (i + 4 * L <= n) {
    int64_t end = std::min(n, i + kBlock);
    V a0(T(0)), a1(T(0)), a2(T(0)), a3(T(0));
    for (; i + 4 * L <= end; i += 4 * L) {
      a0 += f(V::load_unaligned(x + i), i);
      a1 += f(V::load_unaligned(x + i + L), i + L);
      a2 += f(V::load_unaligned(x + i + 2 * L), i + 2 * L);
      a3 += f(V::load_unaligned(x + i + 3 * L), i + 3 * L);
    }
    total += static_cast<double>(xsimd::hadd((a0 + a1) + (a2 + a3)));
  }
  V a(T(0));
  for (; i + L <= n; i += L) a += f(V::load_unaligned(x + i), i);
  T t = xsimd::hadd(a);
  for (; i < n; ++i) t += f(x[i], i);
  return total + static_cast<double>(t);
}

/// Whether a float32 fast-path Σ(x − mean)² (float squares and partial sums, see sum_run) may
/// have lost range: an overflowed square or partial sum (inf, or NaN through an overflowed
/// mean) or squares small enough to underflow. Such rows are redone by exact_moments: std of
/// [3e38, -3e38] was inf and layer_norm of [8.5e37, -2.8e19, ...] NaN, though both results are
/// representable. Also rows nearly constant relative to their magnitude (std < |mean|·2^-20):
/// there the float32 mean's rounding (an ulp of |mean|) is not small next to the spread, and a
/// constant row [2.731, 2.731, 2.731] gave var 1.9e-14 and layer_norm -7.5e-5 instead of 0
/// (found by tests/fuzz). Float64 inputs are summed in double throughout and never need it.
template <class T>
inline bool needs_exact_moments(double m2, int64_t n, double mean) {
  if constexpr (std::is_same_v<T, float>) {
    const double near_constant = mean * 0x1p-20;
    return !(m2 >= 0x1p-80) || m2 == std::numeric_limits<double>::infinity() ||
           m2 < static_cast<double>(n) * near_constant * near_constant;
  } else {
    return false;
  }
}

/// Σ(x − μ)² from `m2` = Σ(x − m)² about the rounded mean m of a row of n values whose mean is
/// μ: Σ(x − m)² = Σ(x − μ)² + n(μ − m)² exactly. Without it a float32 mean's rounding, up to
/// |μ|·2^-24, was n(μ − m)² of bias: var of rows 1e4 + 0.01·N(0, 1) was 4.4e-3 too large
/// (relative; found by review). The correction of Chan, Golub and LeVeque's "corrected two-pass
/// algorithm" (Algorithms for computing the sample variance, 1983), with μ from the double sum.
inline double without_mean_rounding(double m2, int64_t n, double mu, double m) {
  const double d = mu - m;
  return std::max(m2 - static_cast<double>(n) * d * d, 0.0);
}

/// Mean of the n values x[0], x[st], ..., x[(n-1)·st] as Σ(x / n) in double: no partial sum
/// overflows, each term being at most DBL_MAX / n. For float64 rows whose sum shifted by the
/// first value overflowed while their mean is finite: var of [1e308, 3e307, 0.25, 0.25] (the
/// shifted terms near -1e308) was NaN where the variance overflows to inf (found by a break-it
/// pass). Scalar and slow: only for rows whose shifted mean came out infinite or NaN.
template <class T>
double mean_without_overflow(const T* x, int64_t n, int64_t st) {
  const double inv = 1.0 / static_cast<double>(n);
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(x[i * st]) * inv;
  return s;
}

/// Mean and Σ(x − mean)² of the n values x[0], x[st], ..., x[(n-1)·st], with every operation
/// in double (a float32 value squared in double neither overflows nor underflows). Slow, scalar;
/// for the rows needs_exact_moments picks.
template <class T>
void exact_moments(const T* x, int64_t n, int64_t st, double& mean, double& m2) {
  double s0 = 0, s1 = 0;
  int64_t i = 0;
  for (; i + 2 <= n; i += 2) {
    s0 += static_cast<double>(x[i * st]);
    s1 += static_cast<double>(x[(i + 1) * st]);
  }
  if (i < n) s0 += static_cast<double>(x[i * st]);
  mean = (s0 + s1) / static_cast<double>(n);
  s0 = s1 = 0;
  for (i = 0; i + 2 <= n; i += 2) {
    double d0 = static_cast<double>(x[i * st]) - mean;
    double d1 = static_cast<double>(x[(i + 1) * st]) - mean;
    s0 += d0 * d0;
    s1 += d1 * d1;
  }
  if (i < n) {
    double d = static_cast<double>(x[i * st]) - mean;
    s0 += d * d;
  }
  m2 = s0 + s1;
}

/// NaN-propagating max (kMax) or min of x[0..n) combined with `init`.
template <bool kMax, class T>
T extreme_run(const T* x, int64_t n, T init) {
  T r = init;
  int64_t i = 0;
  if constexpr (kIsFloat<T>) {
    using V = Vec<T>;
    constexpr int64_t L = V::size;
    if (n >= 4 * L) {
      // Plain max/min in 4 independent chains, NaNs tracked in a separate mask (cheaper than
      // pick's two selects on the dependency chain).
      auto mm = [](const V& a, const V& b) {
        if constexpr (kMax)
          return xsimd::max(a, b);
        else
          return xsimd::min(a, b);
      };
      V a0(init), a1(init), a2(init), a3(init);
      typename V::batch_bool_type nan(false);
      for (; i + 4 * L <= n; i += 4 * L) {
        V v0 = V::load_unaligned(x + i), v1 = V::load_unaligned(x + i + L);
        V v2 = V::load_unaligned(x + i + 2 * L), v3 = V::load_unaligned(x + i + 3 * L);
        a0 = mm(a0, v0);
        a1 = mm(a1, v1);
        a2 = mm(a2, v2);
        a3 = mm(a3, v3);
        nan = nan | (xsimd::isnan(v0) | xsimd::isnan(v1)) | (xsimd::isnan(v2) | xsimd::isnan(v3));
      }
      if (xsimd::any(nan)) return std::numeric_limits<T>::quiet_NaN();
      alignas(64) T lanes[L];
      mm(mm(a0, a1), mm(a2, a3)).store_aligned(lanes);
      for (int64_t k = 0; k < L; ++k) r = pick<kMax>(r, lanes[k]);
    }
  }
  for (; i < n; ++i) r = pick<kMax>(r, x[i]);
  return r;
}

/// Index of the first element of x[0..n) equal to m (the first NaN if m is NaN); n if none.
template <class T>
int64_t find_first(const T* x, int64_t n, T m) {
  bool nan = m != m;
  int64_t i = 0;
  if constexpr (kIsFloat<T>) {
    using V = Vec<T>;
    constexpr int64_t L = V::size;
    V vm(m);
    for (; i + L <= n; i += L) {
      V v = V::load_unaligned(x + i);
      if (xsimd::any(nan ? xsimd::isnan(v) : (v == vm))) break;
    }
  }
  for (; i < n; ++i)
    if (nan ? x[i] != x[i] : x[i] == m) return i;
  return n;
}

/// Prefetches a short row (at most 16 KiB) into L1 while the previous one is processed: rows
/// of 4 KiB end on page boundaries, where hardware prefetchers stop (softmax over [4096, 1024]
/// went from 5-9 ms to 1.9 ms).
template <class T>
void prefetch(const T* p, int64_t n) {
  const int64_t bytes = n * static_cast<int64_t>(sizeof(T));
  if (bytes > 16384) return;
  const char* c = reinterpret_cast<const char*>(p);
  for (int64_t i = 0; i < bytes; i += 64) __builtin_prefetch(c + i, 0, 3);
}

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/// A contiguous CPU tensor (from the caching allocator).
Tensor empty_cpu(const Shape& shape, DType dtype);
/// `x` made contiguous in the compute dtype `dtype` (x itself when it already is).
Tensor contiguous_cpu(const Tensor& x, DType dtype);

}  // namespace kiln::cpu::simd
