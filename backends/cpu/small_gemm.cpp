// kiln's kernel for small matrix products (blas.h, small_gemm): register tiles read straight
// from the operands, no packing, no allocation, one thread per product.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <utility>

#include "backends/cpu/blas.h"

namespace kiln::cpu {
namespace {

// Integers multiply and add in the unsigned type, so that overflow wraps (two's complement, as
// PyTorch) instead of being undefined.
template <class T> struct Wrap { using type = T; };
template <> struct Wrap<int32_t> { using type = uint32_t; };
template <> struct Wrap<int64_t> { using type = uint64_t; };

// L lanes of U: a GCC/Clang vector, or U itself for L == 1 (the scalar tail columns).
template <class U, int L> struct Lanes {
  typedef U type __attribute__((vector_size(L * sizeof(U))));
};
template <class U> struct Lanes<U, 1> { using type = U; };

// Widest vector: 32 bytes (one AVX register; on Zen 4 a 64-byte one is two halves anyway).
template <class T> inline constexpr int kLanes = 32 / sizeof(T);
// Tiles: MR rows of C by NV vectors of columns, MR·NV accumulators in registers next to the NV
// B vectors and A's broadcast (AVX-512 has 32 vector registers, AVX2 16). A tile of few
// columns takes more rows, so that enough independent multiply-adds are in flight: an FMA's
// latency is 4 cycles at 2 a cycle, 8 chains keep it busy ([8, 8] · [8, 8] float32 is one
// 8 x 1 tile).
constexpr int kMaxRows = 8;
#if defined(__AVX512F__)
constexpr int kMaxVecs = 4, kMaxAccumulators = 24;
#else
constexpr int kMaxVecs = 2, kMaxAccumulators = 12;
#endif
constexpr int max_rows(int nv) { return std::min(kMaxRows, kMaxAccumulators / nv); }

// C[0:MR, 0:NV·L] = alpha · Σ_p A[r, p] · B[p, 0:NV·L] + beta · C, B with unit column stride.
// Every element of C is one chain of multiply-adds over p in order (fused where the target has
// FMA), whatever the tile: the result does not depend on the tiling, the batch or the threads.
template <class T, int L, int MR, int NV>
void tile(int64_t k, const T* a, int64_t rsa, int64_t csa, const T* b, int64_t rsb, T alpha,
          T beta, T* c, int64_t ldc) {
  using U = typename Wrap<T>::type;
  using V = typename Lanes<U, L>::type;
  V acc[MR][NV];
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v) acc[r][v] = V{};
  for (int64_t p = 0; p < k; ++p) {
    V bv[NV];
    for (int v = 0; v < NV; ++v) std::memcpy(&bv[v], b + p * rsb + v * L, sizeof(V));
    for (int r = 0; r < MR; ++r) {
      const U av = static_cast<U>(a[r * rsa + p * csa]);
      for (int v = 0; v < NV; ++v) acc[r][v] += av * bv[v];
    }
  }
  const U ua = static_cast<U>(alpha), ub = static_cast<U>(beta);
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v) {
      T* cp = c + r * ldc + v * L;
      V out = acc[r][v];
      if (ub != U(0)) {  // beta == 0 overwrites C: NaNs there do not propagate
        V old;
        std::memcpy(&old, cp, sizeof(V));
        if constexpr (std::is_floating_point_v<U>) {
          // fma(beta, C, alpha · sum), as compiled code adds a bias (and eager addmm with
          // alpha 0): beta · C alone may overflow where the fused sum does not.
          const V scaled = ua * out;
          if constexpr (L == 1) {
            out = std::fma(ub, old, scaled);
          } else {
            for (int l = 0; l < L; ++l) out[l] = std::fma(ub, old[l], scaled[l]);
          }
        } else {
          out = ub * old + ua * out;
        }
      } else if (ua != U(1)) {
        out = ua * out;
      }
      std::memcpy(cp, &out, sizeof(V));
    }
}

template <class T>
using TileFn = void (*)(int64_t, const T*, int64_t, int64_t, const T*, int64_t, T, T, T*,
                        int64_t);

// kTiles<T, L>.fn[MR - 1][NV - 1], for MR <= max_rows(NV)
template <class T, int L, int... I>
constexpr auto make_tiles(std::integer_sequence<int, I...>) {
  struct Table {
    TileFn<T> fn[kMaxRows][kMaxVecs];
  } t{};
  auto add = [&]<int MR, int NV>() {
    if constexpr (MR <= max_rows(NV)) t.fn[MR - 1][NV - 1] = &tile<T, L, MR, NV>;
  };
  (add.template operator()<I / kMaxVecs + 1, I % kMaxVecs + 1>(), ...);
  return t;
}
template <class T, int L>
inline constexpr auto kTiles =
    make_tiles<T, L>(std::make_integer_sequence<int, kMaxRows * kMaxVecs>{});

// One vertical strip of C: columns [j, j + width) of every row, in tiles of `rows` rows
// (`full`) and a last tile of m % rows rows (`last`; none when m % rows == 0).
template <class T>
struct Strip {
  int64_t j;
  int rows;
  TileFn<T> full, last;
};

template <class T, int L>
Strip<T> strip(int64_t j, int nv, int64_t m) {
  const int rows = max_rows(nv);
  const int tail = static_cast<int>(m % rows);
  return {j, rows, kTiles<T, L>.fn[rows - 1][nv - 1],
          tail ? kTiles<T, L>.fn[tail - 1][nv - 1] : nullptr};
}

}  // namespace

template <class T>
void small_gemm_batch(int64_t count, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
                      int64_t bsa, int64_t rsa, int64_t csa, const T* b, int64_t bsb,
                      int64_t rsb, int64_t csb, T beta, T* c, int64_t bsc, int64_t ldc) {
  using U = typename Wrap<T>::type;
  if (count <= 0 || m <= 0 || n <= 0) return;
  if (k <= 0) {  // an empty sum: C = beta · C
    for (int64_t q = 0; q < count; ++q)
      for (int64_t i = 0; i < m; ++i) {
        T* row = c + q * bsc + i * ldc;
        for (int64_t j = 0; j < n; ++j)
          row[j] = beta == T(0) ? T(0) : static_cast<T>(U(beta) * U(row[j]));
      }
    return;
  }
  if (!small_gemm_fits(m, n, k)) {  // too large for the copy of B below: the blocked kernel
    for (int64_t q = 0; q < count; ++q)
      gemm<T>(m, n, k, alpha, a + q * bsa, rsa, csa, b + q * bsb, rsb, csb, beta, c + q * bsc,
              ldc);
    return;
  }
  // C's columns in strips: full vectors, kMaxVecs at a time, then a half vector, then scalars.
  Strip<T> strips[kSmallGemmMaxN / 2 + 4];
  int nstrips = 0;
  constexpr int L = kLanes<T>;
  int64_t j = 0;
  for (; n - j >= L; ++nstrips) {
    const int nv = static_cast<int>(std::min<int64_t>(kMaxVecs, (n - j) / L));
    strips[nstrips] = strip<T, L>(j, nv, m);
    j += nv * L;
  }
  if (n - j >= L / 2) {
    strips[nstrips++] = strip<T, L / 2>(j, 1, m);
    j += L / 2;
  }
  for (; j < n; ++nstrips) {
    const int nv = static_cast<int>(std::min<int64_t>(kMaxVecs, n - j));
    strips[nstrips] = strip<T, 1>(j, nv, m);
    j += nv;
  }
  // The tiles load rows of B as vectors: a B without unit column stride (a transposed view, as
  // the gradient g·Bᵀ reads it) is first copied into a k x n block.
  const bool pack = csb != 1 && n > 1;
  alignas(64) T packed[kSmallGemmMaxK * kSmallGemmMaxN];
  for (int64_t q = 0; q < count; ++q) {
    const T* aq = a + q * bsa;
    const T* bq = b + q * bsb;
    T* cq = c + q * bsc;
    int64_t ldb = rsb;
    if (pack) {
      if (q == 0 || bsb != 0) {
        if (rsb == 1) {  // B transposed: read its columns' elements in memory order
          for (int64_t jj = 0; jj < n; ++jj)
            for (int64_t p = 0; p < k; ++p) packed[p * n + jj] = bq[p + jj * csb];
        } else {
          for (int64_t p = 0; p < k; ++p)
            for (int64_t jj = 0; jj < n; ++jj) packed[p * n + jj] = bq[p * rsb + jj * csb];
        }
      }
      bq = packed, ldb = n;
    }
    for (int s = 0; s < nstrips; ++s) {
      const Strip<T>& st = strips[s];
      int64_t i = 0;
      for (; i + st.rows <= m; i += st.rows)
        st.full(k, aq + i * rsa, rsa, csa, bq + st.j, ldb, alpha, beta, cq + i * ldc + st.j, ldc);
      if (st.last)
        st.last(k, aq + i * rsa, rsa, csa, bq + st.j, ldb, alpha, beta, cq + i * ldc + st.j, ldc);
    }
  }
}

template <class T>
void small_gemm(int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t rsa, int64_t csa,
                const T* b, int64_t rsb, int64_t csb, T beta, T* c, int64_t ldc) {
  small_gemm_batch<T>(1, m, n, k, alpha, a, 0, rsa, csa, b, 0, rsb, csb, beta, c, 0, ldc);
}

#define KILN_SMALL_GEMM(T)                                                                      \
  template void small_gemm<T>(int64_t, int64_t, int64_t, T, const T*, int64_t, int64_t,         \
                              const T*, int64_t, int64_t, T, T*, int64_t);                      \
  template void small_gemm_batch<T>(int64_t, int64_t, int64_t, int64_t, T, const T*, int64_t,   \
                                    int64_t, int64_t, const T*, int64_t, int64_t, int64_t, T,   \
                                    T*, int64_t, int64_t);
KILN_SMALL_GEMM(float)
KILN_SMALL_GEMM(double)
KILN_SMALL_GEMM(int32_t)
KILN_SMALL_GEMM(int64_t)
#undef KILN_SMALL_GEMM

}  // namespace kiln::cpu
