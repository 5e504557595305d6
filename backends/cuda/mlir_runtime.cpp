#include "backends/cuda/mlir_runtime.h"

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <optional>
#include <string>

#include "backends/cuda/allocator.h"
#include "backends/cuda/copy.h"
#include "backends/cuda/driver.h"
#include "backends/cuda/profile.h"
#include "core/env.h"

namespace kiln::cuda {
namespace {

// MLIR's mgpuSetDefaultDevice is per thread; so is this.
thread_local int32_t t_default_device = 0;
thread_local std::optional<Error> t_first_error;

void record(Error e) {
  if (!t_first_error) t_first_error = std::move(e);
}

/// KILN_CUDA_LAUNCH_BLOCKING=1 (read once): every launch waits for its kernel.
bool launch_blocking() {
  static const bool blocking = env_flag("KILN_CUDA_LAUNCH_BLOCKING");
  return blocking;
}

// Runs `body`, turning any exception into a recorded error and `fallback`.
template <class F, class R = std::invoke_result_t<F>>
R guarded(const char* op, R fallback, F&& body) noexcept {
  try {
    return body();
  } catch (const Error& e) {
    record(e);
  } catch (const std::exception& e) {
    record(Error(op, e.what()));
  } catch (...) {
    record(Error(op, "unknown exception"));
  }
  return fallback;
}

template <class F>
void guarded_void(const char* op, F&& body) noexcept {
  guarded(op, 0, [&] {
    body();
    return 0;
  });
}

void check_runtime(CUresult r, const char* op) {
  if (r != kCudaSuccess) throw Error(op, error_text(r));
}

const DriverApi& current(const char* op) {
  set_current_device(t_default_device);
  return driver(op);
}

}  // namespace

std::optional<Error> take_runtime_error() { return std::exchange(t_first_error, std::nullopt); }
bool runtime_error_pending() { return t_first_error.has_value(); }

}  // namespace kiln::cuda

using namespace kiln::cuda;

extern "C" {

CUmodule mgpuModuleLoad(void* data, size_t /*gpu_blob_size*/) {
  return guarded("mgpuModuleLoad", CUmodule{nullptr}, [&] {
    CUmodule m = nullptr;
    check_runtime(current("mgpuModuleLoad").cuModuleLoadData(&m, data), "mgpuModuleLoad");
    return m;
  });
}

// MLIR 22's gpu-to-llvm calls this with (data, opt_level) only: a third parameter would be
// whatever the caller left in its register. The PTX text ends with a NUL.
CUmodule mgpuModuleLoadJIT(void* data, int opt_level) {
  return guarded("mgpuModuleLoadJIT", CUmodule{nullptr}, [&] {
    constexpr int kErrorLogBuffer = 5, kErrorLogBufferSize = 6, kOptimizationLevel = 7;
    char log[4096] = {};
    int options[] = {kErrorLogBuffer, kErrorLogBufferSize, kOptimizationLevel};
    void* values[] = {log, reinterpret_cast<void*>(uintptr_t{sizeof(log) - 1}),
                      reinterpret_cast<void*>(static_cast<intptr_t>(opt_level))};
    CUmodule m = nullptr;
    CUresult r = current("mgpuModuleLoadJIT").cuModuleLoadDataEx(&m, data, 3, options, values);
    if (r != kCudaSuccess)
      throw kiln::Error("mgpuModuleLoadJIT",
                        error_text(r) + (log[0] ? std::string("; JIT log: ") + log : ""));
    profile_module_loaded(m, data, std::strlen(static_cast<const char*>(data)));
    return m;
  });
}

void mgpuModuleUnload(CUmodule module) {
  profile_forget_module(module);
  guarded_void("mgpuModuleUnload", [&] {
    check_runtime(current("mgpuModuleUnload").cuModuleUnload(module), "mgpuModuleUnload");
  });
}

CUfunction mgpuModuleGetFunction(CUmodule module, const char* name) {
  return guarded("mgpuModuleGetFunction", CUfunction{nullptr}, [&] {
    CUfunction f = nullptr;
    CUresult r = current("mgpuModuleGetFunction").cuModuleGetFunction(&f, module, name);
    if (r != kCudaSuccess)
      throw kiln::Error("mgpuModuleGetFunction",
                        fmt::format("kernel '{}': {}", name ? name : "", error_text(r)));
    profile_name_kernel(f, module, name ? name : "");
    return f;
  });
}

// Sizes are intptr_t, matching MLIR's index type (as in MLIR's own wrappers).
void mgpuLaunchKernel(CUfunction function, intptr_t grid_x, intptr_t grid_y, intptr_t grid_z,
                      intptr_t block_x, intptr_t block_y, intptr_t block_z, int32_t shared_bytes,
                      CUstream stream, void** params, void** extra, size_t /*params_count*/) {
  // After an earlier failure (an allocation that returned null) a launch would write through
  // bad pointers and poison the context for the whole process: skip it; the caller raises the
  // recorded error. An empty grid (a dim of size 0) has nothing to do.
  if (t_first_error) return;
  if (grid_x <= 0 || grid_y <= 0 || grid_z <= 0 || block_x <= 0 || block_y <= 0 || block_z <= 0)
    return;
  guarded_void("mgpuLaunchKernel", [&] {
    const DriverApi& api = current("mgpuLaunchKernel");  // the device's context is current
    std::optional<ProfileScope> timed;                     // KILN_CUDA_PROFILE
    if (profiling())
      timed.emplace(profile_kernel_name(function, grid_x * grid_y * grid_z,
                                        block_x * block_y * block_z),
                    stream, t_default_device);
    CUresult r = api.cuLaunchKernel(function, unsigned(grid_x), unsigned(grid_y), unsigned(grid_z),
                                    unsigned(block_x), unsigned(block_y), unsigned(block_z),
                                    unsigned(shared_bytes), stream, params, extra);
    if (r != kCudaSuccess)
      throw kiln::Error("mgpuLaunchKernel",
                        fmt::format("grid {}x{}x{}, block {}x{}x{}: {}", grid_x, grid_y, grid_z,
                                    block_x, block_y, block_z, error_text(r)));
  });
}

CUstream mgpuStreamCreate() {
  return guarded("mgpuStreamCreate", CUstream{nullptr},
                 [&] { return kiln_stream(t_default_device); });
}

void mgpuStreamDestroy(CUstream /*stream*/) {
  // The stream is the device's kiln stream, which lives for the whole process.
}

void mgpuStreamSynchronize(CUstream stream) {
  // MLIR's host code synchronises after every launch. kiln skips that, as PyTorch launches
  // asynchronously: all of kiln's device work is ordered on the one kiln stream, freed blocks
  // are only reused by work queued later on it, and every host read of device memory
  // synchronises first (copy.cpp). A kernel's fault then surfaces at the next synchronising
  // call or launch; KILN_CUDA_LAUNCH_BLOCKING=1 keeps the synchronisation, so errors name
  // their op.
  if (!launch_blocking()) return;
  guarded_void("mgpuStreamSynchronize", [&] {
    check_runtime(current("mgpuStreamSynchronize").cuStreamSynchronize(stream),
                  "mgpuStreamSynchronize");
  });
}

void mgpuStreamWaitEvent(CUstream stream, CUevent event) {
  guarded_void("mgpuStreamWaitEvent", [&] {
    check_runtime(current("mgpuStreamWaitEvent").cuStreamWaitEvent(stream, event, 0),
                  "mgpuStreamWaitEvent");
  });
}

CUevent mgpuEventCreate() {
  return guarded("mgpuEventCreate", CUevent{nullptr}, [&] {
    constexpr unsigned kDisableTiming = 2;
    CUevent e = nullptr;
    check_runtime(current("mgpuEventCreate").cuEventCreate(&e, kDisableTiming),
                  "mgpuEventCreate");
    return e;
  });
}

void mgpuEventDestroy(CUevent event) {
  guarded_void("mgpuEventDestroy", [&] {
    check_runtime(current("mgpuEventDestroy").cuEventDestroy(event), "mgpuEventDestroy");
  });
}

void mgpuEventSynchronize(CUevent event) {
  guarded_void("mgpuEventSynchronize", [&] {
    check_runtime(current("mgpuEventSynchronize").cuEventSynchronize(event),
                  "mgpuEventSynchronize");
  });
}

void mgpuEventRecord(CUevent event, CUstream stream) {
  guarded_void("mgpuEventRecord", [&] {
    check_runtime(current("mgpuEventRecord").cuEventRecord(event, stream), "mgpuEventRecord");
  });
}

void* mgpuMemAlloc(uint64_t size_bytes, CUstream /*stream*/, bool is_host_shared) {
  return guarded("mgpuMemAlloc", static_cast<void*>(nullptr), [&]() -> void* {
    if (is_host_shared)
      throw kiln::Error("mgpuMemAlloc", "host-shared (managed) allocations are not supported");
    // Reuse is safe: the block's earlier users and its next ones are ordered on the kiln stream.
    return reinterpret_cast<void*>(caching_allocator(t_default_device).allocate(size_bytes));
  });
}

void mgpuMemFree(void* ptr, CUstream /*stream*/) {
  guarded_void("mgpuMemFree", [&] {
    if (!ptr) return;
    // Kernels still queued may read the block; they are on the kiln stream, as is all work
    // that can reuse it (see mgpuStreamSynchronize).
    caching_allocator(t_default_device).deallocate(reinterpret_cast<uint64_t>(ptr));
  });
}

void mgpuMemcpy(void* dst, void* src, size_t size_bytes, CUstream stream) {
  if (t_first_error) return;  // see mgpuLaunchKernel
  guarded_void("mgpuMemcpy", [&] {
    // Unified addressing: the driver tells host from device pointers.
    check_runtime(current("mgpuMemcpy").cuMemcpyAsync(reinterpret_cast<CUdeviceptr>(dst),
                                                       reinterpret_cast<CUdeviceptr>(src),
                                                       size_bytes, stream),
                  "mgpuMemcpy");
  });
}

void mgpuMemset32(void* dst, unsigned int value, size_t count, CUstream stream) {
  if (t_first_error) return;  // see mgpuLaunchKernel
  guarded_void("mgpuMemset32", [&] {
    check_runtime(current("mgpuMemset32").cuMemsetD32Async(reinterpret_cast<CUdeviceptr>(dst),
                                                            value, count, stream),
                  "mgpuMemset32");
  });
}

void mgpuMemset16(void* dst, unsigned short value, size_t count, CUstream stream) {
  if (t_first_error) return;  // see mgpuLaunchKernel
  guarded_void("mgpuMemset16", [&] {
    check_runtime(current("mgpuMemset16").cuMemsetD16Async(reinterpret_cast<CUdeviceptr>(dst),
                                                            value, count, stream),
                  "mgpuMemset16");
  });
}

void mgpuSetDefaultDevice(int32_t device) { t_default_device = device; }

}  // extern "C"

namespace kiln::cuda {

std::vector<std::pair<const char*, void*>> mlir_runtime_symbols() {
  return {
      {"mgpuModuleLoad", reinterpret_cast<void*>(&mgpuModuleLoad)},
      {"mgpuModuleLoadJIT", reinterpret_cast<void*>(&mgpuModuleLoadJIT)},
      {"mgpuModuleUnload", reinterpret_cast<void*>(&mgpuModuleUnload)},
      {"mgpuModuleGetFunction", reinterpret_cast<void*>(&mgpuModuleGetFunction)},
      {"mgpuLaunchKernel", reinterpret_cast<void*>(&mgpuLaunchKernel)},
      {"mgpuStreamCreate", reinterpret_cast<void*>(&mgpuStreamCreate)},
      {"mgpuStreamDestroy", reinterpret_cast<void*>(&mgpuStreamDestroy)},
      {"mgpuStreamSynchronize", reinterpret_cast<void*>(&mgpuStreamSynchronize)},
      {"mgpuStreamWaitEvent", reinterpret_cast<void*>(&mgpuStreamWaitEvent)},
      {"mgpuEventCreate", reinterpret_cast<void*>(&mgpuEventCreate)},
      {"mgpuEventDestroy", reinterpret_cast<void*>(&mgpuEventDestroy)},
      {"mgpuEventSynchronize", reinterpret_cast<void*>(&mgpuEventSynchronize)},
      {"mgpuEventRecord", reinterpret_cast<void*>(&mgpuEventRecord)},
      {"mgpuMemAlloc", reinterpret_cast<void*>(&mgpuMemAlloc)},
      {"mgpuMemFree", reinterpret_cast<void*>(&mgpuMemFree)},
      {"mgpuMemcpy", reinterpret_cast<void*>(&mgpuMemcpy)},
      {"mgpuMemset32", reinterpret_cast<void*>(&mgpuMemset32)},
      {"mgpuMemset16", reinterpret_cast<void*>(&mgpuMemset16)},
      {"mgpuSetDefaultDevice", reinterpret_cast<void*>(&mgpuSetDefaultDevice)},
  };
}

}  // namespace kiln::cuda
