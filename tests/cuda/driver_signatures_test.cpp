// DriverApi declares the driver's types itself; when cuda.h is at hand (tests/CMakeLists.txt
// adds its folder for this file only), check at compile time that every entry point has the
// prototype of the symbol it is loaded from. Integers and enums are compared by size: the
// driver's CUresult is an enum, ours an int.
#include <catch2/catch.hpp>

#if defined(KILN_HAVE_CUDA_H) && __has_include(<cuda.h>)
#include <cuda.h>
#define KILN_CHECKED_AGAINST_CUDA_H 1
#endif

#include <cstddef>
#include <type_traits>

#include "backends/cuda/driver.h"

#ifdef KILN_CHECKED_AGAINST_CUDA_H
namespace {
template <int N> struct Int {};
template <class T, class = void> struct norm { using type = T; };
template <class T>
struct norm<T, std::enable_if_t<std::is_enum_v<T> || std::is_integral_v<T>>> {
  using type = Int<sizeof(T)>;
};
template <class T>
struct norm<T*, std::enable_if_t<std::is_enum_v<T> || std::is_integral_v<T>>> {
  using type = Int<sizeof(T)>*;
};
template <class F> struct normalised;
template <class R, class... A> struct normalised<R (*)(A...)> {
  using type = typename norm<R>::type (*)(typename norm<A>::type...);
};
template <class A, class B>
constexpr bool same_abi = std::is_same_v<typename normalised<A>::type, typename normalised<B>::type>;

using Api = kiln::cuda::DriverApi;
#define KILN_SAME_PROTOTYPE(field, symbol) \
  static_assert(same_abi<decltype(Api::field), decltype(&::symbol)>, #field " != " #symbol)
KILN_SAME_PROTOTYPE(cuInit, cuInit);
KILN_SAME_PROTOTYPE(cuGetErrorName, cuGetErrorName);
KILN_SAME_PROTOTYPE(cuGetErrorString, cuGetErrorString);
KILN_SAME_PROTOTYPE(cuDeviceGetCount, cuDeviceGetCount);
KILN_SAME_PROTOTYPE(cuDeviceGet, cuDeviceGet);
KILN_SAME_PROTOTYPE(cuDeviceGetAttribute, cuDeviceGetAttribute);
KILN_SAME_PROTOTYPE(cuDeviceGetName, cuDeviceGetName);
KILN_SAME_PROTOTYPE(cuDeviceTotalMem, cuDeviceTotalMem_v2);
KILN_SAME_PROTOTYPE(cuDevicePrimaryCtxRetain, cuDevicePrimaryCtxRetain);
KILN_SAME_PROTOTYPE(cuCtxSetCurrent, cuCtxSetCurrent);
KILN_SAME_PROTOTYPE(cuCtxSynchronize, cuCtxSynchronize);
KILN_SAME_PROTOTYPE(cuMemAlloc, cuMemAlloc_v2);
KILN_SAME_PROTOTYPE(cuMemFree, cuMemFree_v2);
KILN_SAME_PROTOTYPE(cuMemGetInfo, cuMemGetInfo_v2);
KILN_SAME_PROTOTYPE(cuMemcpyHtoD, cuMemcpyHtoD_v2);
KILN_SAME_PROTOTYPE(cuMemcpyDtoH, cuMemcpyDtoH_v2);
KILN_SAME_PROTOTYPE(cuMemcpyDtoD, cuMemcpyDtoD_v2);
KILN_SAME_PROTOTYPE(cuMemsetD8, cuMemsetD8_v2);
KILN_SAME_PROTOTYPE(cuMemcpyHtoDAsync, cuMemcpyHtoDAsync_v2);
KILN_SAME_PROTOTYPE(cuMemcpyDtoHAsync, cuMemcpyDtoHAsync_v2);
KILN_SAME_PROTOTYPE(cuMemcpyDtoDAsync, cuMemcpyDtoDAsync_v2);
KILN_SAME_PROTOTYPE(cuMemcpyAsync, cuMemcpyAsync);
KILN_SAME_PROTOTYPE(cuMemsetD32Async, cuMemsetD32Async);
KILN_SAME_PROTOTYPE(cuMemsetD16Async, cuMemsetD16Async);
KILN_SAME_PROTOTYPE(cuMemsetD2D8Async, cuMemsetD2D8Async);
KILN_SAME_PROTOTYPE(cuMemsetD2D16Async, cuMemsetD2D16Async);
KILN_SAME_PROTOTYPE(cuMemsetD2D32Async, cuMemsetD2D32Async);
// cuMemcpy2DAsync_v2 takes cuda.h's CUDA_MEMCPY2D: the same fields at the same offsets.
static_assert(std::is_same_v<decltype(Api::cuMemcpy2DAsync),
                             kiln::cuda::CUresult (*)(const kiln::cuda::Memcpy2D*,
                                                      kiln::cuda::CUstream)>);
static_assert(std::is_same_v<decltype(&::cuMemcpy2DAsync_v2),
                             ::CUresult (*)(const CUDA_MEMCPY2D*, ::CUstream)>);
#define KILN_SAME_FIELD(field)                                                        \
  static_assert(offsetof(kiln::cuda::Memcpy2D, field) == offsetof(CUDA_MEMCPY2D, field) && \
                sizeof(kiln::cuda::Memcpy2D::field) == sizeof(CUDA_MEMCPY2D::field), #field)
KILN_SAME_FIELD(srcXInBytes);
KILN_SAME_FIELD(srcY);
KILN_SAME_FIELD(srcMemoryType);
KILN_SAME_FIELD(srcHost);
KILN_SAME_FIELD(srcDevice);
KILN_SAME_FIELD(srcArray);
KILN_SAME_FIELD(srcPitch);
KILN_SAME_FIELD(dstXInBytes);
KILN_SAME_FIELD(dstY);
KILN_SAME_FIELD(dstMemoryType);
KILN_SAME_FIELD(dstHost);
KILN_SAME_FIELD(dstDevice);
KILN_SAME_FIELD(dstArray);
KILN_SAME_FIELD(dstPitch);
KILN_SAME_FIELD(WidthInBytes);
KILN_SAME_FIELD(Height);
static_assert(sizeof(kiln::cuda::Memcpy2D) == sizeof(CUDA_MEMCPY2D));
static_assert(kiln::cuda::kMemoryTypeDevice == CU_MEMORYTYPE_DEVICE);
KILN_SAME_PROTOTYPE(cuModuleLoadData, cuModuleLoadData);
KILN_SAME_PROTOTYPE(cuModuleLoadDataEx, cuModuleLoadDataEx);
KILN_SAME_PROTOTYPE(cuModuleUnload, cuModuleUnload);
KILN_SAME_PROTOTYPE(cuModuleGetFunction, cuModuleGetFunction);
KILN_SAME_PROTOTYPE(cuLaunchKernel, cuLaunchKernel);
KILN_SAME_PROTOTYPE(cuStreamCreate, cuStreamCreate);
KILN_SAME_PROTOTYPE(cuStreamSynchronize, cuStreamSynchronize);
KILN_SAME_PROTOTYPE(cuStreamDestroy, cuStreamDestroy_v2);
KILN_SAME_PROTOTYPE(cuStreamWaitEvent, cuStreamWaitEvent);
KILN_SAME_PROTOTYPE(cuEventCreate, cuEventCreate);
KILN_SAME_PROTOTYPE(cuEventDestroy, cuEventDestroy_v2);
KILN_SAME_PROTOTYPE(cuEventRecord, cuEventRecord);
KILN_SAME_PROTOTYPE(cuEventSynchronize, cuEventSynchronize);
KILN_SAME_PROTOTYPE(cuEventElapsedTime, cuEventElapsedTime);
static_assert(kiln::cuda::kCudaErrorInvalidValue == CUDA_ERROR_INVALID_VALUE);
static_assert(kiln::cuda::kCudaErrorOutOfMemory == CUDA_ERROR_OUT_OF_MEMORY);
static_assert(kiln::cuda::kCudaErrorStubLibrary == CUDA_ERROR_STUB_LIBRARY);
static_assert(sizeof(kiln::cuda::CUdeviceptr) == sizeof(::CUdeviceptr));
}  // namespace
#endif

TEST_CASE("the driver entry points match cuda.h's prototypes (checked at compile time)") {
#ifdef KILN_CHECKED_AGAINST_CUDA_H
  SUCCEED("checked against cuda.h");
#else
  WARN("skipped: cuda.h was not found at build time");
#endif
}

// cuBLAS's compute types are passed as plain ints (backends/cuda/blas.cpp): the values for each
// matmul precision, against cublas_api.h where the toolkit is at hand.
#if defined(KILN_HAVE_CUDA_H) && __has_include(<cublas_api.h>)
#include <cublas_api.h>
#define KILN_CHECKED_AGAINST_CUBLAS_H 1
#endif
#include "backends/cuda/blas.h"

TEST_CASE("cuBLAS compute types per matmul precision match cublas_api.h") {
  using kiln::MatmulPrecision;
  using kiln::cuda::cublas_compute_type;
#ifdef KILN_CHECKED_AGAINST_CUBLAS_H
  CHECK(cublas_compute_type(MatmulPrecision::Highest) == CUBLAS_COMPUTE_32F);
  CHECK(cublas_compute_type(MatmulPrecision::High) == CUBLAS_COMPUTE_32F_FAST_TF32);
  CHECK(cublas_compute_type(MatmulPrecision::Medium) == CUBLAS_COMPUTE_32F_FAST_16BF);
#else
  WARN("skipped: cublas_api.h was not found at build time");
#endif
}
