#include "backends/cuda/blas.h"

#include <dlfcn.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <limits>
#include <mutex>
#include <optional>
#include <vector>

#include "backends/cuda/copy.h"
#include "backends/cuda/driver.h"
#include "backends/cuda/profile.h"
#include "core/precision.h"

namespace kiln::cuda {
namespace {

using Status = int;  // cublasStatus_t
struct HandleStruct;
using Handle = HandleStruct*;  // cublasHandle_t
constexpr int kOpN = 0, kOpT = 1;
// library_types.h (cudaDataType) and cublas_api.h (cublasComputeType_t, cublasGemmAlgo_t)
constexpr int kDataF32 = 0, kDataBf16 = 14, kGemmDefault = -1;
constexpr int kComputeF32 = 68, kComputeF32FastBf16 = 75, kComputeF32FastTf32 = 77;
constexpr int kMaxDevices = 64;

template <class T>
using GemmStridedBatched = Status (*)(Handle, int transa, int transb, int m, int n, int k,
                                      const T* alpha, const T* A, int lda, long long stride_a,
                                      const T* B, int ldb, long long stride_b, const T* beta,
                                      T* C, int ldc, long long stride_c, int batch);

struct Blas {
  bool loaded = false;
  std::string reason;
  Status (*create)(Handle*) = nullptr;
  Status (*set_stream)(Handle, CUstream) = nullptr;
  const char* (*status_string)(Status) = nullptr;  // absent in old versions
  GemmStridedBatched<float> sgemm = nullptr;
  GemmStridedBatched<double> dgemm = nullptr;
  Status (*gemm_ex)(Handle, int transa, int transb, int m, int n, int k, const void* alpha,
                    const void* A, int a_type, int lda, const void* B, int b_type, int ldb,
                    const void* beta, void* C, int c_type, int ldc, int compute_type,
                    int algo) = nullptr;  // optional: only gemm_bf16 needs it
  // Optional: float32 products under MatmulPrecision::High or Medium (TF32 / bfloat16 inputs).
  Status (*gemm_strided_batched_ex)(Handle, int transa, int transb, int m, int n, int k,
                                    const void* alpha, const void* A, int a_type, int lda,
                                    long long stride_a, const void* B, int b_type, int ldb,
                                    long long stride_b, const void* beta, void* C, int c_type,
                                    int ldc, long long stride_c, int batch, int compute_type,
                                    int algo) = nullptr;
  std::mutex handle_mutex;
  std::array<Handle, kMaxDevices> handles{};
};

Blas& blas() {
  static Blas* b = [] {
    auto* out = new Blas();  // never freed: handles stay valid until exit
    std::vector<std::string> candidates;
    if (const char* env = std::getenv("KILN_CUBLAS"); env && *env) candidates = {env};
    else candidates = {"libcublas.so.13", "libcublas.so.12", "libcublas.so"};
    void* lib = nullptr;
    std::string errors;
    for (const std::string& path : candidates) {
      lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (lib) break;
      const char* e = dlerror();
      errors += (errors.empty() ? "" : "; ") + std::string(e ? e : path + ": dlopen failed");
    }
    if (!lib) {
      out->reason = errors;
      return out;
    }
    out->create = reinterpret_cast<decltype(out->create)>(dlsym(lib, "cublasCreate_v2"));
    out->set_stream = reinterpret_cast<decltype(out->set_stream)>(dlsym(lib, "cublasSetStream_v2"));
    out->status_string =
        reinterpret_cast<decltype(out->status_string)>(dlsym(lib, "cublasGetStatusString"));
    out->sgemm = reinterpret_cast<decltype(out->sgemm)>(dlsym(lib, "cublasSgemmStridedBatched"));
    out->dgemm = reinterpret_cast<decltype(out->dgemm)>(dlsym(lib, "cublasDgemmStridedBatched"));
    out->gemm_ex = reinterpret_cast<decltype(out->gemm_ex)>(dlsym(lib, "cublasGemmEx"));
    out->gemm_strided_batched_ex = reinterpret_cast<decltype(out->gemm_strided_batched_ex)>(
        dlsym(lib, "cublasGemmStridedBatchedEx"));
    if (!out->create || !out->set_stream || !out->sgemm || !out->dgemm) {
      out->reason = "the cuBLAS library lacks cublasCreate_v2/cublasSetStream_v2/"
                    "cublas[SD]gemmStridedBatched";
      return out;
    }
    out->loaded = true;
    return out;
  }();
  return *b;
}

std::string status_text(const Blas& b, Status s) {
  const char* text = b.status_string ? b.status_string(s) : nullptr;
  return fmt::format("{} ({})", text ? text : "cuBLAS error", s);
}

Handle handle_for(int device, Loc loc) {
  CUstream stream = kiln_stream(device, loc);  // checks driver and index
  Blas& b = blas();
  KILN_CHECK(b.loaded, "cuda gemm", loc, "cuBLAS not found: {}", b.reason);
  std::lock_guard<std::mutex> lock(b.handle_mutex);
  Handle& h = b.handles[device];
  if (!h) {
    set_current_device(device, loc);
    Status s = b.create(&h);
    KILN_CHECK(s == 0, "cublasCreate", loc, "{}", status_text(b, s));
    s = b.set_stream(h, stream);
    KILN_CHECK(s == 0, "cublasSetStream", loc, "{}", status_text(b, s));
  }
  return h;
}

void check_sizes(int64_t m, int64_t n, int64_t k, int64_t batch, int64_t max_ld, Loc loc) {
  KILN_CHECK(m >= 0 && n >= 0 && k >= 0 && batch >= 0, "cuda gemm", loc,
             "negative size: m={} n={} k={} batch={}", m, n, k, batch);
  constexpr int64_t kIntMax = std::numeric_limits<int>::max();
  KILN_CHECK(m <= kIntMax && n <= kIntMax && k <= kIntMax && batch <= kIntMax && max_ld <= kIntMax,
             "cuda gemm", loc, "sizes beyond int32 are not supported: m={} n={} k={} batch={}", m,
             n, k, batch);
}

}  // namespace

int cublas_compute_type(MatmulPrecision p) {
  switch (p) {
    case MatmulPrecision::High: return kComputeF32FastTf32;
    case MatmulPrecision::Medium: return kComputeF32FastBf16;
    case MatmulPrecision::Highest: break;
  }
  return kComputeF32;
}

bool blas_available() noexcept {
  try {
    return is_available() && blas().loaded;
  } catch (...) {
    return false;
  }
}

std::string blas_unavailable_reason() noexcept {
  try {
    if (!is_available()) return "no CUDA device: " + unavailable_reason();
    return blas().loaded ? "" : "cuBLAS not found: " + blas().reason;
  } catch (...) {
    return "cuBLAS state could not be read";
  }
}

void gemm_strided_batched(DType dtype, bool trans_a, bool trans_b, int64_t m, int64_t n,
                          int64_t k, double alpha, const void* a, int64_t lda, int64_t stride_a,
                          const void* b, int64_t ldb, int64_t stride_b, double beta, void* c,
                          int64_t ldc, int64_t stride_c, int64_t batch,
                          std::optional<MatmulPrecision> precision_wanted, int device, Loc loc) {
  KILN_CHECK(dtype == DType::Float32 || dtype == DType::Float64, "cuda gemm", loc,
             "dtype {} is not supported (float32, float64)", name(dtype));
  check_sizes(m, n, k, batch, std::max({lda, ldb, ldc}), loc);
  KILN_CHECK(ldc >= std::max<int64_t>(n, 1) && lda >= std::max<int64_t>(trans_a ? m : k, 1) &&
                 ldb >= std::max<int64_t>(trans_b ? k : n, 1),
             "cuda gemm", loc, "leading dimensions too small: lda={} ldb={} ldc={} for m={} n={} "
             "k={} trans_a={} trans_b={}", lda, ldb, ldc, m, n, k, trans_a, trans_b);
  Handle h = handle_for(device, loc);
  if (m == 0 || n == 0 || batch == 0) return;
  set_current_device(device, loc);
  Blas& lib = blas();
  // Row-major C (m x n) is column-major C^T (n x m) = op(B)^T (n x k) @ op(A)^T (k x m): pass B
  // first with the column-major view of each stored matrix (leading dimension = row stride).
  int op_first = trans_b ? kOpT : kOpN, op_second = trans_a ? kOpT : kOpN;
  // float32 under High / Medium: TF32 or bfloat16 tensor cores (core/precision.h), where this
  // cuBLAS has cublasGemmStridedBatchedEx; float32 otherwise.
  const MatmulPrecision precision =
      dtype == DType::Float32 && lib.gemm_strided_batched_ex
          ? precision_wanted.value_or(float32_matmul_precision())
          : MatmulPrecision::Highest;
  std::optional<ProfileScope> timed;  // KILN_CUDA_PROFILE
  if (profiling())
    timed.emplace(fmt::format("cuBLAS {}gemm {}x{}x{} (batch {}){}",
                              dtype == DType::Float32 ? 's' : 'd', m, n, k, batch,
                              precision == MatmulPrecision::Highest
                                  ? ""
                                  : fmt::format(", precision {}", name(precision))),
                  kiln_stream(device, loc), device);
  Status s;
  if (precision != MatmulPrecision::Highest) {
    float alpha_f = static_cast<float>(alpha), beta_f = static_cast<float>(beta);
    const int compute = cublas_compute_type(precision);
    s = lib.gemm_strided_batched_ex(h, op_first, op_second, int(n), int(m), int(k), &alpha_f, b,
                                    kDataF32, int(ldb), stride_b, a, kDataF32, int(lda),
                                    stride_a, &beta_f, c, kDataF32, int(ldc), stride_c,
                                    int(batch), compute, kGemmDefault);
  } else if (dtype == DType::Float32) {
    float alpha_f = static_cast<float>(alpha), beta_f = static_cast<float>(beta);
    s = lib.sgemm(h, op_first, op_second, int(n), int(m), int(k), &alpha_f,
                  static_cast<const float*>(b), int(ldb), stride_b, static_cast<const float*>(a),
                  int(lda), stride_a, &beta_f, static_cast<float*>(c), int(ldc), stride_c,
                  int(batch));
  } else {
    s = lib.dgemm(h, op_first, op_second, int(n), int(m), int(k), &alpha,
                  static_cast<const double*>(b), int(ldb), stride_b,
                  static_cast<const double*>(a), int(lda), stride_a, &beta,
                  static_cast<double*>(c), int(ldc), stride_c, int(batch));
  }
  KILN_CHECK(s == 0, "cuda gemm", loc, "{}(m={}, n={}, k={}, batch={}): {}",
             precision != MatmulPrecision::Highest ? "cublasGemmStridedBatchedEx"
             : dtype == DType::Float32            ? "cublasSgemmStridedBatched"
                                                  : "cublasDgemmStridedBatched",
             m, n, k, batch, status_text(lib, s));
}

void gemm_bf16(int64_t m, int64_t n, int64_t k, const void* a, const void* b, void* c, int device,
               Loc loc) {
  check_sizes(m, n, k, 1, std::max({m, n, k}), loc);
  Handle h = handle_for(device, loc);
  Blas& lib = blas();
  KILN_CHECK(lib.gemm_ex, "cuda gemm", loc, "the cuBLAS library lacks cublasGemmEx (bfloat16)");
  if (m == 0 || n == 0) return;
  set_current_device(device, loc);
  float alpha = 1, beta = 0;
  // Column-major C^T (n x m) = B^T (n x k) @ A^T (k x m), as in gemm_strided_batched.
  // Leading dimensions of at least 1, as cuBLAS requires even for k == 0 (then C = 0).
  const int ld_b = int(std::max<int64_t>(n, 1)), ld_a = int(std::max<int64_t>(k, 1));
  std::optional<ProfileScope> timed;  // KILN_CUDA_PROFILE
  if (profiling())
    timed.emplace(fmt::format("cuBLAS bf16 gemm {}x{}x{}", m, n, k), kiln_stream(device, loc),
                  device);
  Status s = lib.gemm_ex(h, kOpN, kOpN, int(n), int(m), int(k), &alpha, b, kDataBf16, ld_b, a,
                         kDataBf16, ld_a, &beta, c, kDataBf16, ld_b, kComputeF32, kGemmDefault);
  KILN_CHECK(s == 0, "cuda gemm", loc, "cublasGemmEx(bf16, m={}, n={}, k={}): {}", m, n, k,
             status_text(lib, s));
}

}  // namespace kiln::cuda
