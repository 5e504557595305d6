// Random ops on counter-based Philox4x32-10 (core/philox.h).
//
// Counter layout — the contract compiled code follows too. `w(j)` is 32-bit word j of the
// op's draw: w(j) = philox::bits(attrs.seed, attrs.offset, j), i.e. word j % 4 of the Philox
// block at counter attrs.offset + j / 4. Element i is the i-th element in row-major order.
//   rand    float32: u = to_uniform_float(w(2i))                    (w(2i+1) unused)
//           float64: u = to_uniform_double(w(2i), w(2i+1))          (w(2i) high bits)
//           value   = low + (high - low) · u, computed in the output type
//   randn   u1 = to_uniform_double(w(4i), w(4i+1)), u2 = to_uniform_double(w(4i+2), w(4i+3)),
//           z = sqrt(-2 log(1 - u1)) · cos(2π u2) in double (Box–Muller; 1 - u1 ∈ (0, 1]),
//           value = mean + std · z (mean = attrs.low, std = attrs.high), then cast. log and
//           cos may come from a vectorised math library (glibc's libmvec, see CMakeLists.txt),
//           so z matches the formula to a few ulp, not bit for bit.
//   randint x = (w(2i) << 32) | w(2i+1) (64 bits), value = low + ⌊x · (high - low) / 2^64⌋
//           (the high half of a 64×64-bit product: no division, bias < range / 2^64)
//   dropout keep element i iff to_uniform_float(w(i)) >= p (compared in double); kept: x · (1 / (1 - p)) with the
//           scale rounded to x's dtype; dropped (and everything when p == 1): x · 0, as PyTorch's
//           x · mask (NaN and inf stay NaN, so dropout does not hide them; -0 for negative x)
//   dropout_mask  the same with x = 1: the scale where dropout keeps element i, else 0; as
//           bool: true where dropout keeps element i
// The eager factories reserve 2, 4, 2 and 1 words per element respectively (eager/factories.cpp,
// eager/ops.cpp), so consecutive draws never share counters.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "backends/cpu/kernels.h"
#include "backends/cpu/loops.h"
#include "core/philox.h"

namespace kiln::cpu {
namespace {

// Elements per parallel chunk. With 4096, the digits step's two [64, 128] masks ran on both
// threads and took 20-27 us against 9-13 us on one: waking the other thread costs more than
// the 8 us of Philox it takes over (kiln-bench digits, KILN_PROFILE=1 KILN_BENCH_EXPLAIN=1).
constexpr int64_t kRandomGrain = 16384;

#if defined(__AVX512F__) || defined(__AVX2__)
// Philox on vectors of 32-bit lanes. vpmuludq multiplies the even lanes into 64-bit products,
// so mul_hi_lo shifts the odd lanes down and multiplies them separately; store_blocks turns
// word-major lanes (c0[l] = word 0 of block l) into block-major output (4 words per block).
#if defined(__AVX512F__)
struct Simd {
  using V = __m512i;
  static constexpr int kLanes = 16;
  static V set1(uint32_t x) { return _mm512_set1_epi32(static_cast<int>(x)); }
  static V load(const uint32_t* p) { return _mm512_load_si512(p); }
  static V zero() { return _mm512_setzero_si512(); }
  static V xor3(V a, V b, V c) { return _mm512_xor_si512(_mm512_xor_si512(a, b), c); }
  static void mul_hi_lo(V a, V m, V& hi, V& lo) {
    const V even = _mm512_mul_epu32(a, m);
    const V odd = _mm512_mul_epu32(_mm512_srli_epi64(a, 32), m);
    lo = _mm512_mask_blend_epi32(0xAAAA, even, _mm512_slli_epi64(odd, 32));
    hi = _mm512_mask_blend_epi32(0xAAAA, _mm512_srli_epi64(even, 32), odd);
  }
  static void store_blocks(V c0, V c1, V c2, V c3, uint32_t* dst) {
    // Within each 128-bit lane k the unpacks give whole blocks: b0..b3 hold blocks 4k..4k+3.
    const V a = _mm512_unpacklo_epi32(c0, c1), b = _mm512_unpackhi_epi32(c0, c1);
    const V c = _mm512_unpacklo_epi32(c2, c3), d = _mm512_unpackhi_epi32(c2, c3);
    const V b0 = _mm512_unpacklo_epi64(a, c), b1 = _mm512_unpackhi_epi64(a, c);
    const V b2 = _mm512_unpacklo_epi64(b, d), b3 = _mm512_unpackhi_epi64(b, d);
    // Output vector j (blocks 4j..4j+3) is lane j of b0, b1, b2, b3: a 4x4 transpose of lanes.
    const V t0 = _mm512_shuffle_i64x2(b0, b1, 0x44), t1 = _mm512_shuffle_i64x2(b2, b3, 0x44);
    const V t2 = _mm512_shuffle_i64x2(b0, b1, 0xEE), t3 = _mm512_shuffle_i64x2(b2, b3, 0xEE);
    _mm512_storeu_si512(dst, _mm512_shuffle_i64x2(t0, t1, 0x88));
    _mm512_storeu_si512(dst + 16, _mm512_shuffle_i64x2(t0, t1, 0xDD));
    _mm512_storeu_si512(dst + 32, _mm512_shuffle_i64x2(t2, t3, 0x88));
    _mm512_storeu_si512(dst + 48, _mm512_shuffle_i64x2(t2, t3, 0xDD));
  }
};
#else
struct Simd {
  using V = __m256i;
  static constexpr int kLanes = 8;
  static V set1(uint32_t x) { return _mm256_set1_epi32(static_cast<int>(x)); }
  static V load(const uint32_t* p) { return _mm256_load_si256(reinterpret_cast<const V*>(p)); }
  static V zero() { return _mm256_setzero_si256(); }
  static V xor3(V a, V b, V c) { return _mm256_xor_si256(_mm256_xor_si256(a, b), c); }
  static void mul_hi_lo(V a, V m, V& hi, V& lo) {
    const V even = _mm256_mul_epu32(a, m);
    const V odd = _mm256_mul_epu32(_mm256_srli_epi64(a, 32), m);
    lo = _mm256_blend_epi32(even, _mm256_slli_epi64(odd, 32), 0xAA);
    hi = _mm256_blend_epi32(_mm256_srli_epi64(even, 32), odd, 0xAA);
  }
  static void store_blocks(V c0, V c1, V c2, V c3, uint32_t* dst) {
    const V a = _mm256_unpacklo_epi32(c0, c1);  // blocks 0, 1 | 4, 5: words 0, 1
    const V b = _mm256_unpackhi_epi32(c0, c1);  // blocks 2, 3 | 6, 7
    const V c = _mm256_unpacklo_epi32(c2, c3);  // words 2, 3
    const V d = _mm256_unpackhi_epi32(c2, c3);
    const V b0 = _mm256_unpacklo_epi64(a, c), b1 = _mm256_unpackhi_epi64(a, c);
    const V b2 = _mm256_unpacklo_epi64(b, d), b3 = _mm256_unpackhi_epi64(b, d);
    _mm256_storeu_si256(reinterpret_cast<V*>(dst), _mm256_permute2x128_si256(b0, b1, 0x20));
    _mm256_storeu_si256(reinterpret_cast<V*>(dst + 8), _mm256_permute2x128_si256(b2, b3, 0x20));
    _mm256_storeu_si256(reinterpret_cast<V*>(dst + 16), _mm256_permute2x128_si256(b0, b1, 0x31));
    _mm256_storeu_si256(reinterpret_cast<V*>(dst + 24), _mm256_permute2x128_si256(b2, b3, 0x31));
  }
};
#endif

// Philox blocks for counters ctr0, ctr0 + 1, ... (high counter word 0): out[4b + w] is word w
// of block b, the same rounds as philox::philox4x32. Written by hand in AVX2 / AVX-512: 4
// vectors of blocks go through the rounds together, so one vector's multiply latency hides
// behind the others'. Per word: on an AMD EPYC (Zen 3, AVX2) 0.92 ns, one vector at a time
// 1.22 ns, the compiler's vectorisation of the portable loop below 2.0 ns; on a Xeon with
// AVX-512 (one thread, scratch probe timing both widths on 1024-block runs, same words)
// 0.73-0.78 ns for 16 lanes against 0.99-1.09 ns for 8.
void philox_blocks(uint64_t seed, uint64_t ctr0, int64_t nblocks, uint32_t* out) {
  using V = Simd::V;
  constexpr int kLanes = Simd::kLanes, kVecs = 4, kBlocks = kLanes * kVecs;
  const V m0 = Simd::set1(philox::kM0), m1 = Simd::set1(philox::kM1);
  for (int64_t base = 0; base < nblocks; base += kBlocks) {
    V c0[kVecs], c1[kVecs], c2[kVecs], c3[kVecs];
    alignas(64) uint32_t lo[kBlocks], hi[kBlocks];
    for (int l = 0; l < kBlocks; ++l) {
      const uint64_t ctr = ctr0 + static_cast<uint64_t>(base + l);
      lo[l] = static_cast<uint32_t>(ctr);
      hi[l] = static_cast<uint32_t>(ctr >> 32);
    }
    for (int v = 0; v < kVecs; ++v) {
      c0[v] = Simd::load(lo + kLanes * v);
      c1[v] = Simd::load(hi + kLanes * v);
      c2[v] = c3[v] = Simd::zero();
    }
    uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
    for (int r = 0; r < 10; ++r) {
      const V key0 = Simd::set1(k0), key1 = Simd::set1(k1);
      for (int v = 0; v < kVecs; ++v) {
        V hi0, lo0, hi1, lo1;
        Simd::mul_hi_lo(c0[v], m0, hi0, lo0);
        Simd::mul_hi_lo(c2[v], m1, hi1, lo1);
        c0[v] = Simd::xor3(hi1, c1[v], key0);
        c2[v] = Simd::xor3(hi0, c3[v], key1);
        c1[v] = lo1;
        c3[v] = lo0;
      }
      k0 += philox::kW0;
      k1 += philox::kW1;
    }
    for (int v = 0; v < kVecs; ++v) {
      alignas(64) uint32_t words[4 * kLanes];
      const int64_t first = base + kLanes * v;  // first block of this vector
      const bool whole = first + kLanes <= nblocks;
      Simd::store_blocks(c0[v], c1[v], c2[v], c3[v], whole ? out + 4 * first : words);
      if (!whole && first < nblocks)
        std::copy(words, words + 4 * (nblocks - first), out + 4 * first);
    }
  }
}
#else
// Philox blocks for counters ctr0, ctr0 + 1, ... (high counter word 0): out[4b + w] is word w
// of block b. The same rounds as philox::philox4x32, laid out over 16 lanes so that the
// compiler vectorises them (about 10x faster than one block at a time).
void philox_blocks(uint64_t seed, uint64_t ctr0, int64_t nblocks, uint32_t* out) {
  constexpr int kLanes = 16;
  for (int64_t base = 0; base < nblocks; base += kLanes) {
    uint32_t c0[kLanes], c1[kLanes], c2[kLanes], c3[kLanes];
    for (int l = 0; l < kLanes; ++l) {
      const uint64_t ctr = ctr0 + static_cast<uint64_t>(base + l);
      c0[l] = static_cast<uint32_t>(ctr);
      c1[l] = static_cast<uint32_t>(ctr >> 32);
      c2[l] = 0;
      c3[l] = 0;
    }
    uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
    for (int r = 0; r < 10; ++r) {
      for (int l = 0; l < kLanes; ++l) {
        const uint64_t p0 = static_cast<uint64_t>(philox::kM0) * c0[l];
        const uint64_t p1 = static_cast<uint64_t>(philox::kM1) * c2[l];
        const uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1[l] ^ k0;
        const uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c3[l] ^ k1;
        c1[l] = static_cast<uint32_t>(p1);
        c3[l] = static_cast<uint32_t>(p0);
        c0[l] = n0;
        c2[l] = n2;
      }
      k0 += philox::kW0;
      k1 += philox::kW1;
    }
    const int n = static_cast<int>(std::min<int64_t>(kLanes, nblocks - base));
    for (int l = 0; l < n; ++l) {
      uint32_t* o = out + 4 * (base + l);
      o[0] = c0[l], o[1] = c1[l], o[2] = c2[l], o[3] = c3[l];
    }
  }
}
#endif

// The words of one tile of a draw: w[j] is word j.
class WordTile {
 public:
  static constexpr int64_t kWords = 4096;  // 1024 Philox blocks, 16 KiB
  WordTile(uint64_t seed, uint64_t offset) : seed_(seed), offset_(offset) {}
  // Computes the words [first, last); `first` is a multiple of 4 (a block boundary).
  void fill(uint64_t first, uint64_t last) {
    block0_ = first / 4;
    philox_blocks(seed_, offset_ + block0_, static_cast<int64_t>((last + 3) / 4 - block0_), buf_);
  }
  uint32_t operator[](uint64_t j) const { return buf_[j - 4 * block0_]; }
  /// Word j onwards, as an array (the tile holds words up to the `last` of fill()).
  const uint32_t* from(uint64_t j) const { return buf_ + (j - 4 * block0_); }

 private:
  uint64_t seed_, offset_, block0_ = 0;
  uint32_t buf_[kWords];
};

// Runs fn(lo, hi, words) over the elements [0, n) in tiles of kWords / words_per_element
// elements, tiles spread across the pool. Tiles sit at fixed positions, so each element is
// computed by the same code path (vector body or remainder) whatever the thread count: the
// results do not depend on it, even where a vectorised log/cos differs from the scalar one
// in the last bit.
template <class Fn> void for_tiles(const OpAttrs& a, int64_t n, int words_per_element, Fn&& fn) {
  const int64_t tile = WordTile::kWords / words_per_element;
  const int64_t tiles = (n + tile - 1) / tile;
  parallel_for(0, tiles, std::max<int64_t>(1, kRandomGrain / tile), [&](int64_t lo, int64_t hi) {
    WordTile w(a.seed, a.offset);
    for (int64_t t = lo; t < hi; ++t) {
      const int64_t t0 = t * tile, t1 = std::min(n, t0 + tile);
      w.fill(static_cast<uint64_t>(t0) * words_per_element,
             static_cast<uint64_t>(t1) * words_per_element);
      fn(t0, t1, w);
    }
  });
}

void uniform(const OpCall& call, const Tensor& out) {
  const OpAttrs& a = call.attrs;
  KILN_DISPATCH_FLOAT(out.dtype(), T, {
    const T low = a.low.to<T>(), span = a.high.to<T>() - low;
    T* p = out.data<T>();
    for_tiles(a, out.numel(), 2, [&](int64_t lo, int64_t hi, const WordTile& w) {
      for (int64_t i = lo; i < hi; ++i) {
        const uint64_t j = 2 * static_cast<uint64_t>(i);
        T u;
        if constexpr (std::is_same_v<T, float>) u = philox::to_uniform_float(w[j]);
        else u = static_cast<T>(philox::to_uniform_double(w[j], w[j + 1]));
        p[i] = low + span * u;
      }
    });
  });
}

void normal(const OpCall& call, const Tensor& out) {
  const OpAttrs& a = call.attrs;
  const double mean = a.low.to<double>(), std = a.high.to<double>();
  KILN_DISPATCH_FLOAT(out.dtype(), T, {
    T* p = out.data<T>();
    for_tiles(a, out.numel(), 4, [&](int64_t lo, int64_t hi, const WordTile& w) {
      for (int64_t i = lo; i < hi; ++i) {
        const uint64_t j = 4 * static_cast<uint64_t>(i);
        const double u1 = philox::to_uniform_double(w[j], w[j + 1]);
        const double u2 = philox::to_uniform_double(w[j + 2], w[j + 3]);
        const double z =
            std::sqrt(-2.0 * std::log(1.0 - u1)) * std::cos(2.0 * std::numbers::pi * u2);
        p[i] = static_cast<T>(mean + std * z);
      }
    });
  });
}

void randint(const OpCall& call, const Tensor& out) {
  const OpAttrs& a = call.attrs;
  const int64_t low = a.low.to<int64_t>(), high = a.high.to<int64_t>();
  if (out.dtype() == DType::Int32) {
    KILN_CHECK(philox::randint_fits_int32(low, high), call.name(), call.loc,
               "range [{}, {}) does not fit dtype int32", low, high);
  }
  // high - low as unsigned: correct even when it exceeds INT64_MAX.
  const uint64_t range = static_cast<uint64_t>(high) - static_cast<uint64_t>(low);
  KILN_DISPATCH_NUMERIC(out.dtype(), T, {
    T* p = out.data<T>();
    for_tiles(a, out.numel(), 2, [&](int64_t lo, int64_t hi, const WordTile& w) {
      for (int64_t i = lo; i < hi; ++i) {
        const uint64_t j = 2 * static_cast<uint64_t>(i);
        const uint64_t x = static_cast<uint64_t>(w[j]) << 32 | w[j + 1];
        const uint64_t r = static_cast<uint64_t>((static_cast<unsigned __int128>(x) * range) >> 64);
        p[i] = static_cast<T>(static_cast<int64_t>(static_cast<uint64_t>(low) + r));
      }
    });
  });
}

// u >= p with u a multiple of 2^-24 in [0, 1): dropout compares the 24-bit integer instead.
uint32_t dropout_threshold(double p) {
  return static_cast<uint32_t>(std::min(std::ceil(p * 0x1.0p24), 0x1.0p24));
}
template <class T> T dropout_scale(double p) { return p >= 1.0 ? T(0) : static_cast<T>(1.0 / (1.0 - p)); }

// out[e] = x[e] * scale (x = nullptr: scale) where word e's top 24 bits are >= threshold, else
// x[e] * 0 (NaN where x[e] is inf or NaN, as PyTorch's x * mask; x = nullptr: 0). Branch-free, with no-alias parameters, so it vectorises
// (the branchy form inside the tile lambdas compiled to scalar code: 1.7-3.4 ns per element).
template <class T>
void keep_where(const uint32_t* __restrict words, uint32_t threshold, const T* __restrict x,
                T scale, T* __restrict out, int64_t n) {
  for (int64_t e = 0; e < n; ++e) {
    const bool keep = (words[e] >> 8) >= threshold;
    out[e] = x ? x[e] * (keep ? scale : T(0)) : keep ? scale : T(0);
  }
}

void dropout_mask(const OpCall& call, const Tensor& out) {
  const OpAttrs& a = call.attrs;
  const uint32_t threshold = dropout_threshold(a.p);
  if (out.dtype() == DType::Bool) {  // 1 byte per element: what compiled dropout reads
    bool* o = out.data<bool>();
    for_tiles(a, out.numel(), 1, [&](int64_t lo, int64_t hi, const WordTile& w) {
      keep_where<bool>(w.from(static_cast<uint64_t>(lo)), threshold, nullptr, true, o + lo,
                       hi - lo);
    });
    return;
  }
  KILN_DISPATCH_FLOAT(out.dtype(), T, {
    const T scale = dropout_scale<T>(a.p);
    T* o = out.data<T>();
    for_tiles(a, out.numel(), 1, [&](int64_t lo, int64_t hi, const WordTile& w) {
      keep_where<T>(w.from(static_cast<uint64_t>(lo)), threshold, nullptr, scale, o + lo, hi - lo);
    });
  });
}

void dropout(const OpCall& call, const Tensor& out) {
  const OpAttrs& a = call.attrs;
  const Tensor& x = call.inputs[0];
  const uint32_t threshold = dropout_threshold(a.p);
  KILN_DISPATCH_FLOAT(out.dtype(), T, {
    const T scale = dropout_scale<T>(a.p);
    StridedLoop<2> loop(out.shape(), {&out, &x});
    const int64_t os = loop.inner_stride(0), xs = loop.inner_stride(1);
    for_tiles(a, loop.numel(), 1, [&](int64_t lo, int64_t hi, const WordTile& w) {
      uint64_t i = static_cast<uint64_t>(lo);  // flat index of the run's first element
      loop.run(lo, hi, [&](const std::array<char*, 2>& ptr, int64_t n) {
        if (os == sizeof(T) && xs == sizeof(T)) {
          keep_where<T>(w.from(i), threshold, reinterpret_cast<const T*>(ptr[1]), scale,
                        reinterpret_cast<T*>(ptr[0]), n);
        } else {
          for (int64_t e = 0; e < n; ++e) {
            const T v = *reinterpret_cast<const T*>(ptr[1] + e * xs);
            const T factor = (w[i + e] >> 8) >= threshold ? scale : T(0);
            *reinterpret_cast<T*>(ptr[0] + e * os) = v * factor;
          }
        }
        i += static_cast<uint64_t>(n);
      });
    });
  });
}

}  // namespace

void random_kernel(const OpCall& call, const InferredMeta& meta, std::span<Tensor> outs) {
  switch (call.op) {
    case OpKind::Uniform: uniform(call, outs[0]); break;
    case OpKind::Normal: normal(call, outs[0]); break;
    case OpKind::RandInt: randint(call, outs[0]); break;
    case OpKind::Dropout: dropout(call, outs[0]); break;
    case OpKind::DropoutMask: dropout_mask(call, outs[0]); break;
    default: throw Error(call.name(), "not a random op", call.loc);
  }
}

}  // namespace kiln::cpu
