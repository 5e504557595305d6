#pragma once
/// How float32 matrix products may compute inside: PyTorch's
/// torch.set_float32_matmul_precision / get_float32_matmul_precision (float32_matmul_precision).
///
/// The setting is process-wide and read at each call, by eager matmul (CPU and CUDA) and by the
/// GEMM calls of compiled code, so eager and compiled runs use the same precision and changing
/// it never recompiles. Inputs, outputs and accumulation stay float32 in every
/// mode; only the products of elements may be rounded first:
///   - Highest (the default): float32 products (oneDNN sgemm; cuBLAS CUBLAS_COMPUTE_32F).
///   - High: on NVIDIA GPUs from Ampere on, TensorFloat-32 tensor cores
///     (CUBLAS_COMPUTE_32F_FAST_TF32: inputs rounded to 10 mantissa bits, relative error of a
///     product about 2^-11); on the CPU as Highest.
///   - Medium: bfloat16 inputs (8 mantissa bits, relative error of a product about 2^-8) with
///     float32 accumulation, where the hardware has bfloat16 dot-product kernels: on the CPU
///     oneDNN's AVX512-BF16/AMX matmul (about 1.6-2x the float32 rate on Zen 4, including the
///     conversion) for matmul ops large enough to repay converting their operands
///     (cpu::bf16_gemm_pays: at least 16 MFLOP and 192 flops per converted element, decided
///     once per op from the rows of C that share one B, cpu::gemm_rounding, so eager and
///     compiled runs, which fold batches and split rows differently, decide alike; one known
///     exception: a B whose batch dims are all 1, [1, K, N], which compiled code computes as
///     loops in float32); the dot-product instruction also flushes denormal inputs to zero.
///     Elsewhere as High. On NVIDIA GPUs CUBLAS_COMPUTE_32F_FAST_16BF (cuBLAS may
///     take TF32 instead of bfloat16 inputs).
/// float64 and integer products are never affected. One op reads the setting once: its
/// products never mix precisions when another thread changes it meanwhile (a compiled run
/// reads it once for all its GEMMs).
#include <cstdint>
#include <string_view>

#include "core/error.h"

namespace kiln {

enum class MatmulPrecision : uint8_t { Highest, High, Medium };

/// "highest", "high" or "medium".
std::string_view name(MatmulPrecision p);

/// Sets the precision of float32 matrix products (see above). Safe to call from any thread;
/// a product already running keeps the precision it started with. Throws kiln::Error for a
/// value outside the enum (static_cast<MatmulPrecision>(7)).
void set_float32_matmul_precision(MatmulPrecision p, Loc loc = Loc::current());
/// As above, by name: "highest", "high" or "medium" (PyTorch's strings). Throws kiln::Error
/// naming the value and the valid names for anything else, and leaves the setting as it was.
void set_float32_matmul_precision(std::string_view p, Loc loc = Loc::current());
/// The current setting (MatmulPrecision::Highest unless set), or the one a
/// MatmulPrecisionScope on the calling thread pinned.
MatmulPrecision float32_matmul_precision();
/// Pins float32_matmul_precision() on the calling thread to the setting at construction until
/// destroyed (nested scopes keep the outermost one's), so that another thread's change does
/// not reach part of a run: a compiled function's replay holds one, for the GEMMs of its
/// compiled code and the ops it runs on eager kernels alike. The thread's own
/// set_float32_matmul_precision still takes effect at once. Not copyable.
class MatmulPrecisionScope {
 public:
  MatmulPrecisionScope();
  ~MatmulPrecisionScope();
  MatmulPrecisionScope(const MatmulPrecisionScope&) = delete;
  MatmulPrecisionScope& operator=(const MatmulPrecisionScope&) = delete;
};
/// How many times set_float32_matmul_precision changed the setting on this thread, and where it
/// last did: compile() runs a function that changes it eagerly (a replay would compute at the
/// caller's setting and leave it unchanged), as it does one that reseeds the generator.
struct MatmulPrecisionChanges {
  uint64_t count = 0;
  Loc last;
};
MatmulPrecisionChanges matmul_precision_changes();

}  // namespace kiln
