#pragma once
/// How float32 matrix products may compute inside: PyTorch's
/// torch.set_float32_matmul_precision / get_float32_matmul_precision, with the same names.
///
/// The setting is process-wide and read at each product, by eager matmul (CPU and CUDA) and by
/// the GEMM calls of compiled code, so eager and compiled runs always use the same precision
/// and changing it never recompiles. Inputs, outputs and accumulation stay float32 in every
/// mode; only the products of elements may be rounded first:
///   - Highest (the default): float32 products (oneDNN sgemm; cuBLAS CUBLAS_COMPUTE_32F).
///   - High: on NVIDIA GPUs from Ampere on, TensorFloat-32 tensor cores
///     (CUBLAS_COMPUTE_32F_FAST_TF32: inputs rounded to 10 mantissa bits, relative error of a
///     product about 2^-11); on the CPU as Highest.
///   - Medium: bfloat16 inputs (8 mantissa bits, relative error of a product about 2^-8) with
///     float32 accumulation, where the hardware has bfloat16 dot-product kernels: on the CPU
///     oneDNN's AVX512-BF16/AMX matmul for products of at least cpu::kBf16GemmMinFlops (about
///     1.7x the float32 rate on a Zen 4 core, including the conversion), elsewhere as High;
///     on NVIDIA GPUs CUBLAS_COMPUTE_32F_FAST_16BF.
/// float64 and integer products are never affected.
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
/// The current setting (MatmulPrecision::Highest unless set).
MatmulPrecision float32_matmul_precision();

}  // namespace kiln
