#pragma once
/// float32 GEMM with bfloat16 inputs, for MatmulPrecision::Medium (core/precision.h): oneDNN's
/// matmul primitive on bfloat16 copies of the operands, accumulating in float32. On a Zen 4
/// core (AVX512-BF16, oneDNN 2.6, one thread) 512x1024x1024 took 3.1 ms including both
/// conversions against 5.7 ms for float32; 512x256x768 0.50 against 0.94 ms.
#include <cstdint>

namespace kiln::cpu {

/// Products of fewer flops (2·m·n·k) than this stay float32 under Medium: converting the
/// operands and setting up the primitive (about 2 us) would cost more than the kernel saves.
inline constexpr double kBf16GemmMinFlops = 16e6;
/// ... and so do products with fewer flops per converted element, 2·m·n·k / (m·k + k·n) =
/// 2·m·n / (m + n), than this: with n = k = 4096 on one thread, m = 64 took 12.1 ms in
/// bfloat16 against 13.1 ms in float32 (converting B is most of it), m = 128 16.6 against
/// 23.4 ms; on two threads m = 64 was slower (10.1 against 9.3 ms), m = 128 faster.
inline constexpr double kBf16GemmMinFlopsPerElement = 192;

/// Whether an m x n x k product is worth bfloat16 under Medium: both bounds above. Callers
/// pass the rows of the whole op (cpu::gemm_rounding in blas.h; compiled code's row blocks
/// through codegen::GemmRunScope), so that compiled and eager products decide alike.
inline bool bf16_gemm_pays(double m, double n, double k) {
  return 2 * m * n * k >= kBf16GemmMinFlops && 2 * m * n >= kBf16GemmMinFlopsPerElement * (m + n);
}

/// Whether oneDNN is loaded and has bfloat16 matmul kernels on this CPU (AVX512-BF16 or AMX,
/// as dnnl_get_effective_cpu_isa reports, so ONEDNN_MAX_CPU_ISA can turn them off).
bool bf16_gemm_available() noexcept;

/// float32 to bfloat16, rounding to nearest even; NaN stays NaN (quietened), ±Inf stays ±Inf,
/// and finite values from the midpoint between bfloat16's largest (3.3895e38) and 2^128 on
/// round to ±Inf.
uint16_t to_bfloat16(float x) noexcept;

/// C = alpha · bf16(op(A)) · bf16(op(B)) + beta · C, with sgemm's arguments and conventions
/// (blas.h), float32 accumulation. Products of at least kSplitGemmMinFlops are split into
/// `threads` blocks of C on kiln's pool (0: num_threads()). Returns false, writing nothing to
/// C, when bf16_gemm_available() is false, alpha is 0 (float32 then gives beta · C, where
/// oneDNN's output scale would make 0 · Inf a NaN), a leading dimension is too small, oneDNN
/// rejects the arguments or the bfloat16 copies cannot be allocated; the caller then runs
/// float32.
bool bf16_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
               const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
               int64_t ldc, int threads = 0) noexcept;

/// The dlopen handle of libdnnl.so.2 (loaded as blas.h describes), or nullptr without oneDNN.
void* onednn_library() noexcept;
/// Makes oneDNN run on one OpenMP thread when called from this thread (kiln's pool splits).
void onednn_single_thread() noexcept;

}  // namespace kiln::cpu
