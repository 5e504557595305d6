#pragma once
/// cuBLAS, loaded at run time: `libcublas.so.13`, then `libcublas.so.12`, then `libcublas.so`,
/// unless env KILN_CUBLAS names the library. One handle per device, bound to the device's
/// kiln stream (copy.h).
#include <cstdint>
#include <optional>
#include <string>

#include "core/dtype.h"
#include "core/error.h"
#include "core/precision.h"

namespace kiln::cuda {

/// Whether cuBLAS could be loaded (loads it on first call; never throws). False also when no
/// CUDA device is available.
bool blas_available() noexcept;
/// Why blas_available() is false ("" when true).
std::string blas_unavailable_reason() noexcept;

/// Batched matrix product with ROW-MAJOR semantics, for every b in [0, batch):
///   C[b] = alpha * op(A[b]) @ op(B[b]) + beta * C[b]
/// where op(X) = X, or X transposed when trans_x is set; op(A[b]) is m x k, op(B[b]) is k x n
/// and C[b] is m x n. All pointers are device memory on `device`; A[b] starts at
/// a + b * stride_a elements (likewise B, C). lda/ldb/ldc are the row strides (in elements) of
/// the matrices as stored: lda >= k for A stored m x k (trans_a false), >= m for A stored
/// k x m (trans_a true); ldc >= n. dtype is Float32 or Float64. With beta == 0, C need not be
/// initialised. Asynchronous on the kiln stream (copies to the host wait for it).
///
/// float32 follows `precision`, else float32_matmul_precision() (core/precision.h): Highest is
/// cublasSgemmStridedBatched (CUBLAS_COMPUTE_32F); High and Medium are
/// cublasGemmStridedBatchedEx with CUBLAS_COMPUTE_32F_FAST_TF32 and _FAST_16BF (TF32 or
/// bfloat16 tensor cores from Ampere on; cuBLAS computes in float32 where the GPU lacks them).
/// Implemented with column-major cuBLAS by swapping the operands (C^T = op(B)^T op(A)^T).
/// Throws kiln::Error: "no CUDA device: ..." without a driver, "cuBLAS not found: ..." without
/// the library, for other dtypes, for sizes beyond int32, and for cuBLAS errors.
void gemm_strided_batched(DType dtype, bool trans_a, bool trans_b, int64_t m, int64_t n,
                          int64_t k, double alpha, const void* a, int64_t lda, int64_t stride_a,
                          const void* b, int64_t ldb, int64_t stride_b, double beta, void* c,
                          int64_t ldc, int64_t stride_c, int64_t batch,
                          std::optional<MatmulPrecision> precision = std::nullopt, int device = 0,
                          Loc loc = Loc::current());

/// cuBLAS's compute type (cublasComputeType_t) for a float32 product under `p`:
/// CUBLAS_COMPUTE_32F (Highest), CUBLAS_COMPUTE_32F_FAST_TF32 (High),
/// CUBLAS_COMPUTE_32F_FAST_16BF (Medium).
int cublas_compute_type(MatmulPrecision p);

/// Row-major C = A @ B for contiguous bfloat16 A (m x k), B (k x n) and C (m x n), accumulated
/// in float32 (cublasGemmEx with CUBLAS_COMPUTE_32F). Device pointers on `device`; asynchronous
/// on the kiln stream. kiln has no bfloat16 dtype: this is the benchmarks' bf16 ceiling, used by
/// no Tensor op. Throws kiln::Error as gemm_strided_batched does, and when the loaded cuBLAS
/// lacks cublasGemmEx.
void gemm_bf16(int64_t m, int64_t n, int64_t k, const void* a, const void* b, void* c,
               int device = 0, Loc loc = Loc::current());

}  // namespace kiln::cuda
