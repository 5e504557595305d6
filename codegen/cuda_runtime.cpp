// Runtime functions that CUDA host code (codegen/gpu_lowering.cpp) calls besides MLIR's mgpu*
// ones (backends/cuda/mlir_runtime.cpp): intermediates' device memory and the GEMM on cuBLAS.
// Like every runtime function they must not throw through JIT-compiled frames: the first error
// is recorded per thread and Executable::run raises it (take_cuda_runtime_error).
#include <algorithm>
#include <optional>
#include <string>

#include "backends/cuda/blas.h"
#include "backends/cuda/mlir_runtime.h"
#include "codegen/runtime.h"
#include "core/error.h"

extern "C" {
void* mgpuMemAlloc(uint64_t size_bytes, void* stream, bool is_host_shared);
void mgpuMemFree(void* ptr, void* stream);
}

namespace kiln::codegen {
namespace {

thread_local std::optional<Error> t_error;
thread_local int t_device = 0;

void record(const Error& e) {
  if (!t_error) t_error = e;
}

void* rt_cuda_malloc(size_t nbytes) { return mgpuMemAlloc(nbytes, nullptr, false); }
void* rt_cuda_aligned_alloc(size_t alignment, size_t nbytes) {
  // Device allocations are 256-byte aligned (cuMemAlloc), more than compiled code asks for.
  if (alignment <= 256) return rt_cuda_malloc(nbytes);
  record(Error("kiln_rt_cuda_aligned_alloc", "alignment " + std::to_string(alignment) +
                                                 " above the device's 256 bytes"));
  return nullptr;
}
// Everything runs on the kiln stream, so a freed block reused by a later allocation is only
// touched by work queued after the work that used it.
void rt_cuda_free(void* ptr) { mgpuMemFree(ptr, nullptr); }

/// The CPU GEMM's calling convention (codegen/runtime.cpp, extern_calls.cpp) on cuBLAS:
/// C[i] = op(A[i]) · op(B[i]) + beta · C[i], row-major, pointers and offsets as integers.
template <DType D>
void rt_cuda_gemm(int64_t batch, int64_t m, int64_t n, int64_t k, int64_t a, int64_t off_a,
                  int64_t batch_a, int64_t lda, int64_t b, int64_t off_b, int64_t batch_b,
                  int64_t ldb, int64_t c, int64_t off_c, int64_t batch_c, int64_t ldc,
                  int64_t /*rows_split: GPU runs are not split into row blocks*/, int64_t beta,
                  int64_t trans_a, int64_t trans_b) {
  const int64_t size = static_cast<int64_t>(itemsize(D));
  if (t_error || cuda::runtime_error_pending()) return;  // operands may be null (a failed alloc)
  try {
    if (m == 0 || n == 0) return;
    if (k == 0) {  // an empty sum: C = beta C, which cuBLAS computes (its lda/ldb must be >= 1)
      lda = std::max<int64_t>(lda, 1);
      ldb = std::max<int64_t>(ldb, 1);
    }
    cuda::gemm_strided_batched(D, trans_a != 0, trans_b != 0, m, n, k, 1.0,
                               reinterpret_cast<const char*>(a) + off_a * size, lda, batch_a,
                               reinterpret_cast<const char*>(b) + off_b * size, ldb, batch_b,
                               static_cast<double>(beta),
                               reinterpret_cast<char*>(c) + off_c * size, ldc, batch_c, batch,
                               gemm_run_precision(), t_device);
  } catch (const Error& e) {
    record(e);
  }
}

}  // namespace

void set_cuda_runtime_device(int index) { t_device = index; }

std::optional<Error> take_cuda_runtime_error() {
  std::optional<Error> e = cuda::take_runtime_error();
  if (!e && t_error) e = std::move(t_error);
  t_error.reset();
  return e;
}

std::vector<RuntimeSymbol> cuda_runtime_symbols() {
  std::vector<RuntimeSymbol> out = {
      {"kiln_rt_cuda_malloc", reinterpret_cast<void*>(&rt_cuda_malloc)},
      {"kiln_rt_cuda_aligned_alloc", reinterpret_cast<void*>(&rt_cuda_aligned_alloc)},
      {"kiln_rt_cuda_free", reinterpret_cast<void*>(&rt_cuda_free)},
      {"kiln_rt_cuda_gemm_f32", reinterpret_cast<void*>(&rt_cuda_gemm<DType::Float32>)},
      {"kiln_rt_cuda_gemm_f64", reinterpret_cast<void*>(&rt_cuda_gemm<DType::Float64>)},
  };
  for (auto [name, address] : cuda::mlir_runtime_symbols()) out.push_back({name, address});
  return out;
}

}  // namespace kiln::codegen
