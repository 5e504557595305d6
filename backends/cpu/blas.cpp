// GEMM: oneDNN's sgemm loaded at run time, and kiln's own blocked kernel (see blas.h).
#include "backends/cpu/blas.h"

#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <type_traits>
#include <vector>

#include "backends/cpu/allocator.h"
#include "backends/cpu/bf16_gemm.h"
#include "backends/cpu/parallel.h"
#include "core/env.h"

namespace kiln::cpu {
namespace {

// ---------------------------------------------------------------------------------------------
// oneDNN, loaded lazily. Only the two symbols kiln calls are declared (no dnnl.h needed).
using DnnlSgemmFn = int (*)(char transa, char transb, int64_t m, int64_t n, int64_t k,
                            float alpha, const float* a, int64_t lda, const float* b,
                            int64_t ldb, float beta, float* c, int64_t ldc);
using OmpSetNumThreadsFn = void (*)(int);

struct Dnnl {
  void* library = nullptr;  // the dlopen handle, for the matmul primitive (bf16_gemm.cpp)
  DnnlSgemmFn sgemm = nullptr;
  OmpSetNumThreadsFn omp_set_num_threads = nullptr;  // from libgomp, which libdnnl pulls in
};

const Dnnl& dnnl() {
  static const Dnnl lib = [] {
    Dnnl d;
    if (!env_flag("KILN_ONEDNN", true)) {
      std::fprintf(stderr, "kiln: KILN_ONEDNN is off: float32 matmul uses kiln's own GEMM "
                   "kernel\n");
      return d;
    }
    // Must precede the first load of libgomp, which reads it once at start-up.
    setenv("OMP_WAIT_POLICY", "PASSIVE", /*overwrite=*/0);
    void* h = dlopen("libdnnl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      std::fprintf(stderr,
                   "kiln: could not load libdnnl.so.2 (%s); float32 matmul uses kiln's own "
                   "GEMM kernel, which is several times slower (install oneDNN: libdnnl2)\n",
                   dlerror());
      return d;
    }
    d.library = h;
    d.sgemm = reinterpret_cast<DnnlSgemmFn>(dlsym(h, "dnnl_sgemm"));
    d.omp_set_num_threads = reinterpret_cast<OmpSetNumThreadsFn>(dlsym(h, "omp_set_num_threads"));
    if (!d.sgemm)
      std::fprintf(stderr,
                   "kiln: libdnnl.so.2 has no dnnl_sgemm; float32 matmul uses kiln's own GEMM "
                   "kernel\n");
    return d;
  }();
  return lib;
}

// OpenMP's thread count is a per-thread setting; remember what this thread last asked for.
thread_local int t_omp_threads = 0;

std::atomic<uint64_t> g_gemm_ns{0}, g_gemm_ops{0};
thread_local bool t_in_gemm_timer = false;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// ---------------------------------------------------------------------------------------------
// kiln's blocked GEMM (the BLIS loop structure): for each NC-column block and KC-deep slice,
// pack B into NR-wide panels, then for each MR-row panel pack A and run an MR×NR register tile.

// Integers accumulate in the unsigned type so that overflow wraps instead of being UB.
template <class T> struct Accum { using type = T; };
template <> struct Accum<int32_t> { using type = uint32_t; };
template <> struct Accum<int64_t> { using type = uint64_t; };

template <class T> struct Blocking {
  using U = typename Accum<T>::type;
  static constexpr int kMR = 6;
  static constexpr int kNR = 128 / sizeof(T);  // two 64-byte vectors per tile row
  static constexpr int64_t kKC = 256;
  // A packed KC×NC block of B fills about half of a 1 MiB L2.
  static constexpr int64_t kNC = (512 * 1024 / (kKC * sizeof(T))) / kNR * kNR;
};

// acc = Σ_p ap[p·MR + r] · bp[p·NR + c] over an MR×NR tile, written with explicit 64-byte
// vectors (the GCC/Clang vector extension): left to the auto-vectoriser, the integer
// instantiations came out as gathers at ~2 GOP/s.
template <class U, int MR, int NR>
inline void micro_kernel(int64_t kc, const U* __restrict ap, const U* __restrict bp,
                         U (&out)[MR][NR]) {
  typedef U V __attribute__((vector_size(64)));
  constexpr int kVL = 64 / sizeof(U), kNV = NR / kVL;
  static_assert(NR % kVL == 0);
  V acc[MR][kNV];
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < kNV; ++v) acc[r][v] = V{};
  for (int64_t p = 0; p < kc; ++p) {
    V b[kNV];
    for (int v = 0; v < kNV; ++v) std::memcpy(&b[v], bp + p * NR + v * kVL, sizeof(V));
    for (int r = 0; r < MR; ++r) {
      const U av = ap[p * MR + r];
      for (int v = 0; v < kNV; ++v) acc[r][v] += av * b[v];
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < kNV; ++v) std::memcpy(&out[r][v * kVL], &acc[r][v], sizeof(V));
}

template <class T>
void scale_c(int64_t m, int64_t n, T beta, T* c, int64_t ldc) {
  using U = typename Blocking<T>::U;
  for (int64_t i = 0; i < m; ++i) {
    T* row = c + i * ldc;
    if (beta == T(0)) {
      std::fill(row, row + n, T(0));
    } else {
      for (int64_t j = 0; j < n; ++j) row[j] = static_cast<T>(U(beta) * U(row[j]));
    }
  }
}

// An operand whose rows lie a multiple of 4 KiB apart maps them onto the same cache sets, and
// oneDNN's sgemm reads such a B (and a transposed A) in place: on one Zen 3 core,
// 256x1024x1024 with ldb = 1024 ran at 39-41 GFLOP/s against 69-87 with ldb = 1040, and
// 1024x1024x256 with A transposed (lda = 1024) at 29-32 against 79 with lda = 1040. Such an
// operand of a large product is copied with its rows kPaddedLd floats further apart first:
// the copy reads and writes the operand once, a few per cent of the product's time. Rows
// 1 KiB apart (ld = 256, d_model of the Transformer benchmark) are read in place: copying them
// made each of its GEMM shapes 5-40 % slower on 2 Zen cores with AVX-512 (x @ W.t() with
// 1024x256x256: 308 us in place, 370 us with the copy; dW = dYᵀ @ X, 256x256x1024: 328 vs 460;
// best of 40, scratch probe), where ld = 1024 still gained 5-12 %.
constexpr int64_t kConflictingLd = 1024;  // floats: 4 KiB
constexpr int64_t kPaddedLd = 16;        // floats: one cache line

bool conflicting_ld(int64_t ld) { return ld >= kConflictingLd && ld % kConflictingLd == 0; }

// A rows x cols matrix (rows `ld` floats apart) copied with rows cols + kPaddedLd apart; the
// copy lives in kiln's CPU allocator until the object goes.
class PaddedCopy {
 public:
  PaddedCopy(const float* src, int64_t rows, int64_t cols, int64_t ld)
      : ld_(cols + kPaddedLd), bytes_(static_cast<size_t>(rows * ld_) * sizeof(float)) {
    data_ = static_cast<float*>(allocator()->allocate(bytes_));
    parallel_for(0, rows, std::max<int64_t>(1, (64 << 10) / std::max<int64_t>(cols, 1)),
                 [&](int64_t lo, int64_t hi) {
                   for (int64_t r = lo; r < hi; ++r)
                     std::memcpy(data_ + r * ld_, src + r * ld, cols * sizeof(float));
                 });
  }
  ~PaddedCopy() { allocator()->deallocate(data_, bytes_); }
  PaddedCopy(const PaddedCopy&) = delete;
  PaddedCopy& operator=(const PaddedCopy&) = delete;
  const float* data() const { return data_; }
  int64_t ld() const { return ld_; }

 private:
  int64_t ld_;
  size_t bytes_;
  float* data_;
};

}  // namespace

GemmTime gemm_time() {
  return {g_gemm_ns.load(std::memory_order_relaxed), g_gemm_ops.load(std::memory_order_relaxed)};
}

GemmTimer::GemmTimer() {
  if (t_in_gemm_timer || in_parallel_region()) return;
  t_in_gemm_timer = true;
  start_ns_ = now_ns();
}

GemmTimer::~GemmTimer() {
  if (start_ns_ < 0) return;
  g_gemm_ns.fetch_add(static_cast<uint64_t>(now_ns() - start_ns_), std::memory_order_relaxed);
  g_gemm_ops.fetch_add(1, std::memory_order_relaxed);
  t_in_gemm_timer = false;
}

template <class T>
void gemm(int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t rsa, int64_t csa,
          const T* b, int64_t rsb, int64_t csb, T beta, T* c, int64_t ldc) {
  using B = Blocking<T>;
  using U = typename B::U;
  constexpr int MR = B::kMR, NR = B::kNR;
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {
    scale_c(m, n, beta, c, ldc);
    return;
  }
  const U ua = U(alpha), ub = U(beta);
  const int64_t m_panels = (m + MR - 1) / MR;
  // One buffer for a packed KC×NC block of B, shared by all threads.
  const int64_t nc_max = std::min<int64_t>(B::kNC, (n + NR - 1) / NR * NR);
  const int64_t kc_max = std::min<int64_t>(B::kKC, k);
  U* bpack = static_cast<U*>(std::aligned_alloc(64, ((kc_max * nc_max * sizeof(U)) + 63) / 64 * 64));
  if (!bpack) throw std::bad_alloc();

  for (int64_t jc = 0; jc < n; jc += B::kNC) {
    const int64_t nc = std::min<int64_t>(B::kNC, n - jc);
    const int64_t n_panels = (nc + NR - 1) / NR;
    for (int64_t pc = 0; pc < k; pc += B::kKC) {
      const int64_t kc = std::min<int64_t>(B::kKC, k - pc);
      const bool first = pc == 0;
      // Pack B[pc:pc+kc, jc:jc+nc] as NR-wide panels, zero-padded on the right.
      for (int64_t jp = 0; jp < n_panels; ++jp) {
        U* dst = bpack + jp * kc * NR;
        const int64_t j0 = jc + jp * NR, nr = std::min<int64_t>(NR, n - j0);
        for (int64_t p = 0; p < kc; ++p) {
          const T* src = b + (pc + p) * rsb + j0 * csb;
          U* d = dst + p * NR;
          if (csb == 1) {
            for (int64_t q = 0; q < nr; ++q) d[q] = U(src[q]);
          } else {
            for (int64_t q = 0; q < nr; ++q) d[q] = U(src[q * csb]);
          }
          for (int64_t q = nr; q < NR; ++q) d[q] = U(0);
        }
      }
      // Row panels [mlo, mhi) of this block.
      auto block = [&](int64_t mlo, int64_t mhi) {
        alignas(64) U apack[B::kKC * MR];
        alignas(64) U acc[MR][NR];
        for (int64_t ip = mlo; ip < mhi; ++ip) {
          const int64_t i0 = ip * MR, mr = std::min<int64_t>(MR, m - i0);
          for (int64_t p = 0; p < kc; ++p) {
            const T* src = a + i0 * rsa + (pc + p) * csa;
            U* d = apack + p * MR;
            for (int64_t r = 0; r < mr; ++r) d[r] = U(src[r * rsa]);
            for (int64_t r = mr; r < MR; ++r) d[r] = U(0);
          }
          for (int64_t jp = 0; jp < n_panels; ++jp) {
            const int64_t j0 = jc + jp * NR, nr = std::min<int64_t>(NR, n - j0);
            micro_kernel<U, MR, NR>(kc, apack, bpack + jp * kc * NR, acc);
            for (int64_t r = 0; r < mr; ++r) {
              T* crow = c + (i0 + r) * ldc + j0;
              if (!first) {
                for (int64_t q = 0; q < nr; ++q) crow[q] = T(U(crow[q]) + ua * acc[r][q]);
              } else if (ub == U(0)) {
                for (int64_t q = 0; q < nr; ++q) crow[q] = T(ua * acc[r][q]);
              } else {
                for (int64_t q = 0; q < nr; ++q) crow[q] = T(ub * U(crow[q]) + ua * acc[r][q]);
              }
            }
          }
        }
      };
      // Small blocks run inline; large ones split their row panels across the pool.
      if (m * nc * kc < (int64_t{1} << 23) || num_threads() == 1) {  // 16 MFLOP, as matmul.cpp
        block(0, m_panels);
      } else {
        parallel_for(0, m_panels, 1, [&](int64_t lo, int64_t hi) { block(lo, hi); });
      }
    }
  }
  std::free(bpack);
}

template void gemm<float>(int64_t, int64_t, int64_t, float, const float*, int64_t, int64_t,
                          const float*, int64_t, int64_t, float, float*, int64_t);
template void gemm<double>(int64_t, int64_t, int64_t, double, const double*, int64_t, int64_t,
                           const double*, int64_t, int64_t, double, double*, int64_t);
template void gemm<int32_t>(int64_t, int64_t, int64_t, int32_t, const int32_t*, int64_t,
                            int64_t, const int32_t*, int64_t, int64_t, int32_t, int32_t*,
                            int64_t);
template void gemm<int64_t>(int64_t, int64_t, int64_t, int64_t, const int64_t*, int64_t,
                            int64_t, const int64_t*, int64_t, int64_t, int64_t, int64_t*,
                            int64_t);

bool onednn_available() { return dnnl().sgemm != nullptr; }

void* onednn_library() noexcept { return dnnl().library; }

namespace {
// sum x[i·incx]·y[i·incy] over i < k, accumulated in double and rounded once. oneDNN's 1×1
// sgemm summed in float, one term after another: 1.8e-3 relative error at k = 4e6 (PyTorch's
// BLAS sdot 1.1e-6; found by a new user's trial). Four accumulators keep the adds independent.
float dot_product(int64_t k, const float* x, int64_t incx, const float* y, int64_t incy) {
  double acc[4] = {0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 4 <= k; i += 4)
    for (int j = 0; j < 4; ++j)
      acc[j] += double(x[(i + j) * incx]) * double(y[(i + j) * incy]);
  for (; i < k; ++i) acc[0] += double(x[i * incx]) * double(y[i * incy]);
  return float((acc[0] + acc[1]) + (acc[2] + acc[3]));
}

// oneDNN runs on one OpenMP thread: a per-thread setting, made on whichever thread calls it.
void single_omp_thread(const Dnnl& d) {
  if (d.omp_set_num_threads && t_omp_threads != 1) {
    d.omp_set_num_threads(1);
    t_omp_threads = 1;
  }
}

// C = alpha·op(A)·op(B) + beta·C as Cᵀ = alpha·op(B)ᵀ·op(A)ᵀ (see kNarrowN): op(B)ᵀ is B as
// stored when trans_b, else Bᵀ; likewise op(A)ᵀ.
bool narrow_transposed(const Dnnl& d, bool trans_a, bool trans_b, int64_t m, int64_t n,
                       int64_t k, float alpha, const float* a, int64_t lda, const float* b,
                       int64_t ldb, float beta, float* c, int64_t ldc) {
  thread_local std::vector<float> scratch;  // n x m, row-major; at most kNarrowMaxElements
  scratch.resize(static_cast<size_t>(n * m));
  single_omp_thread(d);
  if (d.sgemm(trans_b ? 'N' : 'T', trans_a ? 'N' : 'T', n, m, k, alpha, b, ldb, a, lda, 0.0f,
              scratch.data(), m) != 0)
    return false;
  for (int64_t i = 0; i < m; ++i) {
    float* row = c + i * ldc;
    const float* col = scratch.data() + i;
    if (beta == 0.0f) {
      for (int64_t j = 0; j < n; ++j) row[j] = col[j * m];
    } else {
      for (int64_t j = 0; j < n; ++j) row[j] = col[j * m] + beta * row[j];
    }
  }
  return true;
}

}  // namespace

void onednn_single_thread() noexcept { single_omp_thread(dnnl()); }

GemmRounding gemm_rounding(MatmulPrecision precision, double rows, double n, double k) {
  return precision == MatmulPrecision::Medium && bf16_gemm_pays(rows, n, k) &&
                 bf16_gemm_available()
             ? GemmRounding::BFloat16
             : GemmRounding::None;
}

bool sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
           const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
           int64_t ldc, int threads, GemmRounding rounding) noexcept {
  if (rounding == GemmRounding::Auto)
    rounding = gemm_rounding(float32_matmul_precision(), double(m), double(n), double(k));
  if (rounding == GemmRounding::BFloat16 &&
      bf16_gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, threads))
    return true;
  return sgemm_float32(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, threads);
}

bool sgemm_float32(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                   const float* a, int64_t lda, const float* b, int64_t ldb, float beta,
                   float* c, int64_t ldc, int threads) noexcept {
  if (m <= 0 || n <= 0) return true;
  if (k <= 0) {
    scale_c(m, n, beta, c, ldc);
    return true;
  }
  if (m == 1 && n == 1) {  // a dot product: see dot_product
    const float r = alpha * dot_product(k, a, trans_a ? lda : 1, b, trans_b ? 1 : ldb);
    c[0] = beta == 0.0f ? r : beta * c[0] + r;
    return true;
  }
  const Dnnl& d = dnnl();
  if (!d.sgemm) {
    // Element strides of op(A) and op(B) for the fallback.
    int64_t rsa = trans_a ? 1 : lda, csa = trans_a ? lda : 1;
    int64_t rsb = trans_b ? 1 : ldb, csb = trans_b ? ldb : 1;
    gemm<float>(m, n, k, alpha, a, rsa, csa, b, rsb, csb, beta, c, ldc);
    return true;
  }
  // oneDNN runs on one OpenMP thread; kiln's pool supplies the parallelism by splitting C into
  // row (or column) blocks, so that one pool serves every kernel and no OpenMP team sleeps and
  // wakes beside it. Figures at kSplitGemmMinFlops in blas.h.
  auto call = [&](int64_t rows, int64_t cols, const float* pa, const float* pb, float* pc) {
    single_omp_thread(d);
    return d.sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', rows, cols, k, alpha, pa, lda, pb,
                   ldb, beta, pc, ldc) == 0;
  };
  const int want = threads > 0 ? threads : num_threads();
  const bool leading_dims_ok = lda >= (trans_a ? m : k) && ldb >= (trans_b ? k : n) && ldc >= n;
  const double flops = 2.0 * double(m) * double(n) * double(k);
  std::optional<PaddedCopy> padded_a, padded_b;
  if (flops >= kSplitGemmMinFlops && leading_dims_ok) {
    if (trans_a && conflicting_ld(lda)) {
      padded_a.emplace(a, k, m, lda);
      a = padded_a->data(), lda = padded_a->ld();
    }
    if (conflicting_ld(ldb)) {
      padded_b.emplace(b, trans_b ? n : k, trans_b ? k : n, ldb);
      b = padded_b->data(), ldb = padded_b->ld();
    }
  }
  if (n < kNarrowN && m >= 2 * n && n * m <= kNarrowMaxElements && (trans_a || trans_b) &&
      leading_dims_ok && (want <= 1 || flops < kSplitGemmMinFlops))
    return narrow_transposed(d, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  if (want <= 1 || flops < kSplitGemmMinFlops || !leading_dims_ok) return call(m, n, a, b, c);
  std::atomic<bool> ok{true};
  if (m >= 2 * kSplitGemmMinRows) {
    parallel_for(0, m, std::max<int64_t>(kSplitGemmMinRows, (m + want - 1) / want),
                 [&](int64_t lo, int64_t hi) {
                   if (!call(hi - lo, n, a + (trans_a ? lo : lo * lda), b, c + lo * ldc))
                     ok.store(false, std::memory_order_relaxed);
                 });
  } else {
    parallel_for(0, n, std::max<int64_t>(kSplitGemmMinRows, (n + want - 1) / want),
                 [&](int64_t lo, int64_t hi) {
                   if (!call(m, hi - lo, a, b + (trans_b ? lo * ldb : lo), c + lo))
                     ok.store(false, std::memory_order_relaxed);
                 });
  }
  return ok.load();
}

}  // namespace kiln::cpu
