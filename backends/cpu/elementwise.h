#pragma once
// Internal to the CPU elementwise kernels (elementwise_*.cpp): the loop engine that applies an
// op's formula (core/formulas.h) to every element of a StridedLoop.
//
// A functor F wraps one formula: `template <class S> auto operator()(S...) const`, plus
//   static constexpr bool kSimd      — may run on xsimd batches (float/double in and out);
//   static constexpr bool kExpensive — scalar libm calls (~10 ns/element): smaller grain.
// map<O, T>(out, {inputs}, f) computes out[i] = O(f(in[i]...)) with inputs stored as T:
//   * float/double with kSimd: xsimd batches. Contiguous operands and broadcast scalars
//     (stride 0) are loaded directly; any other layout is gathered into a batch-sized buffer,
//     and so is the tail, so every element goes through the same SIMD code whatever the layout.
//   * everything else (integers, bool, comparisons): scalar loops, with typed contiguous and
//     broadcast-scalar variants that the compiler vectorises.
// bool is computed as int32 (so add = or, mul = and, max = or, ...) and stored back as != 0.
#include <array>
#include <cstring>
#include <type_traits>
#include <utility>
#include <xsimd/xsimd.hpp>

#include "backends/cpu/kernels.h"
#include "backends/cpu/loops.h"
#include "backends/cpu/simd_exp.h"
#include "core/formulas.h"

namespace kiln::cpu::ew {

template <class T> inline constexpr bool kSimdType =
    std::is_same_v<T, float> || std::is_same_v<T, double>;

/// The type a stored T is computed in.
template <class T> using ComputeOf = std::conditional_t<std::is_same_v<T, bool>, int32_t, T>;

/// How one input is read along the inner run.
enum class In { Contig, Bcast, Strided };

// ---------------------------------------------------------------- SIMD sources
/// The first m (< the batch size) elements at p in a batch whose other lanes are 0, and the
/// store of a batch's first m lanes: AVX-512 masked moves (which do not touch the masked-off
/// memory), else through a buffer. Through memcpy, the 4-element tails of 100-element rows cost
/// three calls per row: x + b over [1000, 100] + [100] took 1.9x PyTorch's time on one thread.
template <class T> xsimd::batch<T> load_first(const T* p, int64_t m) {
  using B = xsimd::batch<T>;
#if defined(__AVX512F__)
  if constexpr (sizeof(B) == 64) {
    const auto mask = static_cast<uint16_t>((1u << m) - 1);
    if constexpr (std::is_same_v<T, float>) return B(_mm512_maskz_loadu_ps(mask, p));
    else return B(_mm512_maskz_loadu_pd(static_cast<__mmask8>(mask), p));
  }
#endif
  alignas(64) T buf[B::size] = {};
  std::memcpy(buf, p, m * sizeof(T));
  return B::load_aligned(buf);
}
template <class T> void store_first(T* p, const xsimd::batch<T>& v, int64_t m) {
  using B = xsimd::batch<T>;
#if defined(__AVX512F__)
  if constexpr (sizeof(B) == 64) {
    const auto mask = static_cast<uint16_t>((1u << m) - 1);
    if constexpr (std::is_same_v<T, float>) return _mm512_mask_storeu_ps(p, mask, v);
    else return _mm512_mask_storeu_pd(p, static_cast<__mmask8>(mask), v);
  }
#endif
  alignas(64) T buf[B::size];
  v.store_aligned(buf);
  std::memcpy(p, buf, m * sizeof(T));
}

template <class T, In M> struct VecSrc;

template <class T> struct VecSrc<T, In::Contig> {
  using B = xsimd::batch<T>;
  const T* p;
  explicit VecSrc(const char* raw, int64_t) : p(reinterpret_cast<const T*>(raw)) {}
  B load(int64_t i) const { return B::load_unaligned(p + i); }
  B load_part(int64_t i, int64_t m) const { return load_first(p + i, m); }
};

template <class T> struct VecSrc<T, In::Bcast> {
  using B = xsimd::batch<T>;
  B v;
  explicit VecSrc(const char* raw, int64_t) : v(*reinterpret_cast<const T*>(raw)) {}
  B load(int64_t) const { return v; }
  B load_part(int64_t, int64_t) const { return v; }
};

template <class T> struct VecSrc<T, In::Strided> {
  using B = xsimd::batch<T>;
  const char* p;
  int64_t s;
  VecSrc(const char* raw, int64_t stride) : p(raw), s(stride) {}
  B load_part(int64_t i, int64_t m) const {
    alignas(64) T buf[B::size] = {};
    for (int64_t j = 0; j < m; ++j) buf[j] = *reinterpret_cast<const T*>(p + (i + j) * s);
    return B::load_aligned(buf);
  }
  B load(int64_t i) const { return load_part(i, B::size); }
};

// Contiguous output.
template <class T, class F, class... Src>
void vec_loop(T* out, int64_t n, const F& f, const Src&... src) {
  using B = xsimd::batch<T>;
  constexpr int64_t W = B::size;
  int64_t i = 0;
  for (; i + W <= n; i += W) f(src.load(i)...).store_unaligned(out + i);
  if (i < n) store_first(out + i, f(src.load_part(i, n - i)...), n - i);
}

// Any output stride: compute a batch, scatter it.
template <class T, class F, class... Src>
void vec_loop_scatter(char* out, int64_t os, int64_t n, const F& f, const Src&... src) {
  using B = xsimd::batch<T>;
  constexpr int64_t W = B::size;
  alignas(64) T buf[W];
  for (int64_t i = 0; i < n; i += W) {
    int64_t m = std::min(W, n - i);
    f(src.load_part(i, m)...).store_aligned(buf);
    for (int64_t j = 0; j < m; ++j) *reinterpret_cast<T*>(out + (i + j) * os) = buf[j];
  }
}

// ---------------------------------------------------------------- scalar sources
template <class T, In M> struct ScalarSrc;
template <class T> struct ScalarSrc<T, In::Contig> {
  const T* p;
  ScalarSrc(const char* raw, int64_t) : p(reinterpret_cast<const T*>(raw)) {}
  ComputeOf<T> load(int64_t i) const { return static_cast<ComputeOf<T>>(p[i]); }
};
template <class T> struct ScalarSrc<T, In::Bcast> {
  ComputeOf<T> v;
  ScalarSrc(const char* raw, int64_t)
      : v(static_cast<ComputeOf<T>>(*reinterpret_cast<const T*>(raw))) {}
  ComputeOf<T> load(int64_t) const { return v; }
};
template <class T> struct ScalarSrc<T, In::Strided> {
  const char* p;
  int64_t s;
  ScalarSrc(const char* raw, int64_t stride) : p(raw), s(stride) {}
  ComputeOf<T> load(int64_t i) const {
    return static_cast<ComputeOf<T>>(*reinterpret_cast<const T*>(p + i * s));
  }
};

template <class O, class F, class... Src>
void scalar_loop(O* out, int64_t n, const F& f, const Src&... src) {
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<O>(f(src.load(i)...));
}
template <class O, class F, class... Src>
void scalar_loop_scatter(char* out, int64_t os, int64_t n, const F& f, const Src&... src) {
  for (int64_t i = 0; i < n; ++i)
    *reinterpret_cast<O*>(out + i * os) = static_cast<O>(f(src.load(i)...));
}

// ---------------------------------------------------------------- one run
template <class O, class T, class F> struct Runner {
  static constexpr bool kVec = kSimdType<T> && std::is_same_v<O, T> && F::kSimd;
  template <In M> using Src = std::conditional_t<kVec, VecSrc<T, M>, ScalarSrc<T, M>>;

  // Output contiguous, inputs in modes M...
  template <In... M, size_t... K> static void contig(const char* const* p, const int64_t* s,
                                                     int64_t n, const F& f,
                                                     std::index_sequence<K...>) {
    O* out = reinterpret_cast<O*>(const_cast<char*>(p[0]));
    if constexpr (kVec)
      vec_loop<T>(out, n, f, Src<M>(p[K + 1], s[K + 1])...);
    else
      scalar_loop<O>(out, n, f, Src<M>(p[K + 1], s[K + 1])...);
  }
  template <size_t... K> static void strided(const char* const* p, const int64_t* s, int64_t n,
                                             const F& f, std::index_sequence<K...>) {
    char* out = const_cast<char*>(p[0]);
    if constexpr (kVec)
      vec_loop_scatter<T>(out, s[0], n, f, Src<In::Strided>(p[K + 1], s[K + 1])...);
    else
      scalar_loop_scatter<O>(out, s[0], n, f, Src<In::Strided>(p[K + 1], s[K + 1])...);
  }

  // Picks the loop for one inner run of n elements: p[0]/s[0] output, then the inputs.
  template <int N> static void run(const char* const* p, const int64_t* s, int64_t n, const F& f) {
    constexpr int64_t ti = sizeof(T);
    using Seq = std::make_index_sequence<N>;
    if (s[0] == static_cast<int64_t>(sizeof(O))) {
      if constexpr (N == 1) {
        if (s[1] == ti) return contig<In::Contig>(p, s, n, f, Seq{});
      } else if constexpr (N == 2) {
        if (s[1] == ti && s[2] == ti) return contig<In::Contig, In::Contig>(p, s, n, f, Seq{});
        if (s[1] == ti && s[2] == 0) return contig<In::Contig, In::Bcast>(p, s, n, f, Seq{});
        if (s[1] == 0 && s[2] == ti) return contig<In::Bcast, In::Contig>(p, s, n, f, Seq{});
      }
    }
    strided(p, s, n, f, Seq{});
  }
};

/// out[i] = O(f(in_0[i], ..., in_{N-1}[i])) for every element, inputs stored as T and
/// broadcast to out's shape. Parallel above the grain (smaller for expensive functors).
template <class O, class T, int N, class F>
void map(const Tensor& out, const std::array<const Tensor*, N>& ins, const F& f) {
  int64_t grain = F::kExpensive ? kGrainSize / 8 : kGrainSize;
  // Fast path for the common case (inputs contiguous with out's shape): one flat run, no
  // StridedLoop setup, which matters for tiny tensors.
  bool flat = out.is_contiguous();
  for (int k = 0; k < N; ++k)
    flat = flat && ins[k]->shape() == out.shape() && ins[k]->is_contiguous();
  if (flat) {
    std::array<const char*, N + 1> base;
    std::array<int64_t, N + 1> s;
    base[0] = static_cast<const char*>(out.raw_data());
    s[0] = sizeof(O);
    for (int k = 0; k < N; ++k) {
      base[k + 1] = static_cast<const char*>(ins[k]->raw_data());
      s[k + 1] = sizeof(T);
    }
    int64_t n = out.numel();
    auto chunk = [&](int64_t b, int64_t e) {
      std::array<const char*, N + 1> p;
      for (int k = 0; k <= N; ++k) p[k] = base[k] + b * s[k];
      Runner<O, T, F>::template run<N>(p.data(), s.data(), e - b, f);
    };
    if (n < 2 * grain)
      chunk(0, n);
    else
      parallel_for(0, n, grain, chunk);
    return;
  }
  std::array<const Tensor*, N + 1> ops;
  ops[0] = &out;
  std::array<Tensor, N> copies;  // of inputs read across their memory order (kernels.h)
  for (int k = 0; k < N; ++k) {
    copies[k] = copy_if_read_across(*ins[k], out);
    ops[k + 1] = copies[k].defined() ? &copies[k] : ins[k];
  }
  StridedLoop<N + 1> loop(out.shape(), ops);
  if (loop.numel() == 0) return;
  if (!out.is_contiguous()) loop.order_by(0);
  std::array<int64_t, N + 1> s;
  for (int k = 0; k <= N; ++k) s[k] = loop.inner_stride(k);
  auto body = [&](const std::array<char*, N + 1>& p, int64_t n) {
    Runner<O, T, F>::template run<N>(p.data(), s.data(), n, f);
  };
  if (loop.numel() < 2 * grain)
    loop.run(0, loop.numel(), body);
  else
    loop.parallel_run(body, grain);
}

/// Wraps formula struct Fm as a functor (scalar or SIMD, cheap).
template <class Fm, bool Simd = true, bool Expensive = false> struct Fn {
  static constexpr bool kSimd = Simd;
  static constexpr bool kExpensive = Expensive;
  template <class... S> auto operator()(S... x) const { return Fm::eval(x...); }
};

}  // namespace kiln::cpu::ew
