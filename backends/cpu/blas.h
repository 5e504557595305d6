#pragma once
/// GEMM for the CPU backend: float32 through oneDNN's dnnl_sgemm, and kiln's own cache-blocked
/// kernel for every numeric dtype (and for float32 when oneDNN is missing).
///
/// oneDNN is not linked: libdnnl.so.2 is dlopen'ed on the first call, after
/// setenv("OMP_WAIT_POLICY", "PASSIVE", 0). Debian's oneDNN runs on GNU OpenMP, whose default
/// wait policy spins and made 2 threads slower than 1 on 2-vCPU machines
/// (notes/cpu-performance.md); the variable only takes effect if it is set before libgomp
/// initialises, i.e. before libdnnl (which pulls libgomp in) is loaded. A value the user set
/// wins (overwrite = 0).
#include <algorithm>
#include <cstdint>

#include "core/precision.h"

namespace kiln::cpu {

/// Row-major C = alpha · op(A) · op(B) + beta · C with op(A) m×k, op(B) k×n, C m×n, where
/// op(X) = X, or Xᵀ when trans_x is set (BLAS sgemm conventions in row-major storage: A is
/// stored with leading dimension lda ≥ k, or ≥ m when transposed; B with ldb ≥ n, or ≥ k
/// when transposed; ldc ≥ n). beta == 0 overwrites C (NaNs already in C do not propagate);
/// k == 0 gives C = beta · C.
///
/// Calls dnnl_sgemm directly (this is the call kiln::matmul makes for a 2-D float32 product,
/// so benchmarks can time it as the "direct BLAS" reference). oneDNN runs single-threaded;
/// products of at least kSplitGemmMinFlops are split into `threads` row blocks of C (column
/// blocks when m is small) on kiln's pool (0: num_threads(); 1: no split). In such products a
/// B, or a transposed A, whose leading dimension is a multiple of 256 floats is first copied
/// with padded rows: oneDNN reads it in place, and rows 1 KiB-multiples apart share cache sets
/// (on Zen 3 the weight gradients of the transformer's FFN ran 2x slower). Without oneDNN it
/// runs kiln's blocked kernel (gemm<float>). A narrow single-threaded product (n < kNarrowN
/// columns, m >= 2n rows, m·n <= kNarrowMaxElements, A or B transposed: a classifier's
/// [64, 128]·Wᵀ with W [10, 128]) is computed as Cᵀ = op(B)ᵀ·op(A)ᵀ into a scratch block and
/// transposed into C. Returns false, writing nothing, if oneDNN rejects the arguments (a bad
/// leading dimension).
/// Products below this many flops (2·m·n·k) run on one thread. In a loop over the same warm
/// operands a 2-way split already pays from ~2 MFLOP (2 vCPUs: 64x128x128 11.2 us on 1 thread,
/// 8.0 us split), but in a training step the calling thread has just written A and B, and the
/// other thread's cache misses on them made the digits MLP step (64x128x128 products) 27-48 %
/// slower. From 16 MFLOP on the split matched oneDNN's own 2 OpenMP threads (1024x768x256 about
/// 1.0 ms either way), beat them on transposed operands (256x1024x1024, A transposed:
/// 1.41-1.49 ms split, 1.73-1.97 ms OpenMP) and lost on 1024x1024x256 (1.55-1.75 ms against
/// 1.41-1.48 ms).
inline constexpr double kSplitGemmMinFlops = 16e6;
/// Products with fewer columns than this run transposed (see sgemm). oneDNN 2.6 on this Zen 4,
/// one thread: [64, 128]·[10, 128]ᵀ 4.3 -> 2.7 us, [256, 512]·[8, 512]ᵀ 57 -> 25 us,
/// [128, 64]ᵀ·[128, 10] 3.6 -> 2.2 us; but with neither operand transposed 3.6 -> 5.3 us, and
/// at 16 columns 4.3 -> 6.3 us.
inline constexpr int64_t kNarrowN = 16;
/// The transposed result goes through a per-thread scratch block of at most this many floats
/// (256 KiB); larger narrow products run directly.
inline constexpr int64_t kNarrowMaxElements = int64_t{1} << 16;
/// Fewest rows (or columns) of C in one block of a split product.
inline constexpr int64_t kSplitGemmMinRows = 16;
/// A batch of products each below this many flops is spread over the pool one product per
/// thread (attention's per-head products) instead of splitting each product.
inline constexpr double kSpreadGemmBatchMaxFlops = kSplitGemmMinFlops;

/// How sgemm rounds its inputs: bfloat16 (bf16_gemm.h) or not at all, decided by the caller
/// once for a whole op (gemm_rounding), or by sgemm for its own product (Auto).
enum class GemmRounding : uint8_t { Auto, None, BFloat16 };

/// The rounding of a float32 matmul op under `precision`: BFloat16 under MatmulPrecision::Medium
/// where bf16_gemm_available() and bf16_gemm_pays(rows, n, k), else None. `rows` counts the rows
/// of C computed with one B (n columns, depth k): every row block of a product, and every
/// batch element that shares its B by shape (a Linear on [B, T, K]); products with a B of
/// their own (attention's per-head products, an expanded B) count one each. An op reads the
/// precision once and decides once, so that its products never mix precisions (another
/// thread may change the setting meanwhile), and eager and compiled code, which fold batches
/// and split rows differently, decide alike.
GemmRounding gemm_rounding(MatmulPrecision precision, double rows, double n, double k);

bool sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
           const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
           int64_t ldc, int threads = 0, GemmRounding rounding = GemmRounding::Auto) noexcept;
/// sgemm in float32 whatever float32_matmul_precision() says. sgemm itself computes with
/// bfloat16 inputs where `rounding` is BFloat16, or, for Auto, where
/// gemm_rounding(float32_matmul_precision(), m, n, k) says so; it calls this otherwise.
bool sgemm_float32(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                   const float* a, int64_t lda, const float* b, int64_t ldb, float beta,
                   float* c, int64_t ldc, int threads = 0) noexcept;

/// Wall time of the GEMM ops run so far in this process (eager matmul of every dtype and the
/// GEMM calls of compiled CPU code), in nanoseconds, and their count. Only an op started
/// outside a parallel region counts, once (a batch of products spread over the pool is one
/// op), so `ns` is wall time, not CPU time, and GEMMs inside a row-parallel compiled graph
/// are not counted. Benchmarks subtract two readings to show how much of a training step is
/// the BLAS library's, the part that compile() leaves as it is.
struct GemmTime {
  uint64_t ns = 0, ops = 0;
};
GemmTime gemm_time();

/// Adds the wall time of its lifetime to gemm_time(), unless it is nested in another
/// GemmTimer or runs inside a parallel region. Put one at the top of each GEMM op's entry.
class GemmTimer {
 public:
  GemmTimer();
  ~GemmTimer();
  GemmTimer(const GemmTimer&) = delete;
  GemmTimer& operator=(const GemmTimer&) = delete;

 private:
  int64_t start_ns_ = -1;  // -1: not counted
};

/// Whether float32 GEMM goes through oneDNN. Loads libdnnl.so.2 on the first call; if that
/// fails, says so once on stderr and returns false from then on.
bool onednn_available();

/// kiln's cache-blocked GEMM on arbitrary element strides (0 allowed, e.g. broadcasts):
///   C[i·ldc + j] = alpha · Σ_p A[i·rsa + p·csa] · B[p·rsb + j·csb] + beta · C[i·ldc + j]
/// for i < m, j < n. beta == 0 overwrites C. T is float, double, int32_t or int64_t; integer
/// products wrap (two's complement). Packs panels of A and B, computes MR×NR register tiles,
/// and splits rows across the thread pool when the product is large.
template <class T>
void gemm(int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t rsa, int64_t csa,
          const T* b, int64_t rsb, int64_t csb, T beta, T* c, int64_t ldc);

/// Bounds of small_gemm: products with k <= kSmallGemmMaxK, n <= kSmallGemmMaxN and
/// m·n·k <= kSmallGemmMaxMnk (small_gemm_fits). The attention-style batches of tiny products
/// ([1024, 8, 8] @ [1024, 8, 8]) spent nearly all their time in a per-product BLAS call
/// (about 0.3 us for oneDNN's sgemm, more for gemm's allocation and packing).
inline constexpr int64_t kSmallGemmMaxK = 64;
inline constexpr int64_t kSmallGemmMaxN = 64;
inline constexpr int64_t kSmallGemmMaxMnk = 64 * 64 * 64;
inline bool small_gemm_fits(int64_t m, int64_t n, int64_t k) {
  return k <= kSmallGemmMaxK && n <= kSmallGemmMaxN && m * n * k <= kSmallGemmMaxMnk;
}
/// Flops of small products that one thread takes at least when a batch of them is spread over
/// the pool (eager matmul, compiled code's GEMM calls): small_gemm_grain products.
inline constexpr double kSmallGemmGrainFlops = 1 << 20;
inline int64_t small_gemm_grain(int64_t m, int64_t n, int64_t k) {
  const double flops = 2.0 * double(m) * double(n) * double(std::max<int64_t>(k, 1));
  return std::max<int64_t>(1, static_cast<int64_t>(kSmallGemmGrainFlops / flops + 1));
}

/// gemm's contract for one small product (small_gemm_fits(m, n, k)): register tiles of C read
/// A and B in place (a B without unit column stride is first copied into a k x n block on the
/// stack), with no packing, allocation or threading. Each element of C is one chain of
/// multiply-adds (fused where the target has FMA) over p in order, in T (integers wrap), then
/// alpha · sum + beta · C: float32 and float64 accumulate in their own type, like oneDNN's
/// sgemm and gemm, and the result does not depend on where the product sits in a batch or on
/// the thread count.
template <class T>
void small_gemm(int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t rsa, int64_t csa,
                const T* b, int64_t rsb, int64_t csb, T beta, T* c, int64_t ldc);
/// small_gemm for `count` products of one shape at uniform distances: product q reads A at
/// a + q·bsa, B at b + q·bsb (either may be 0: a broadcast operand) and writes C at c + q·bsc,
/// in order, on the calling thread. The tiles are chosen once for the whole run.
template <class T>
void small_gemm_batch(int64_t count, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
                      int64_t bsa, int64_t rsa, int64_t csa, const T* b, int64_t bsb,
                      int64_t rsb, int64_t csb, T beta, T* c, int64_t bsc, int64_t ldc);

}  // namespace kiln::cpu
