#pragma once
/// The host-side runtime functions that MLIR's `gpu-to-llvm` lowering calls (mgpuModuleLoad,
/// mgpuLaunchKernel, mgpuMemAlloc, ...), with the signatures of MLIR 22's
/// CudaRuntimeWrappers.cpp, implemented over kiln's driver loader, caching allocator and kiln
/// stream (Debian ships no libmlir_cuda_runtime).
///
/// Streams: mgpuStreamCreate returns the device's kiln stream (so compiled kernels are ordered
/// with kiln's copies and cuBLAS calls) and mgpuStreamDestroy leaves it alive.
/// Memory: mgpuMemAlloc/mgpuMemFree go through cuda::caching_allocator(device).
///
/// Errors: these functions are called from JIT-compiled frames, through which a C++ exception
/// must not unwind. They never throw; the first failure on the calling thread is recorded
/// and the function returns a null handle (or does nothing). The caller of a compiled
/// function must call take_runtime_error() after it returns and throw what it gets.
#include <optional>
#include <utility>
#include <vector>

#include "core/error.h"

namespace kiln::cuda {

/// Name → address of every mgpu* function, for registering with the JIT's symbol map.
std::vector<std::pair<const char*, void*>> mlir_runtime_symbols();

/// The first error recorded by an mgpu* function on the calling thread since the last call
/// (and clears it); nullopt when none.
std::optional<Error> take_runtime_error();
/// Whether an error is recorded on the calling thread (launches, copies and memsets are then
/// skipped: after a failed allocation they would write through null pointers).
bool runtime_error_pending();

}  // namespace kiln::cuda
