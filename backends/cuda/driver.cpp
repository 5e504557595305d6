#include "backends/cuda/driver.h"

#include <dlfcn.h>

#include <atomic>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "backends/cuda/copy.h"

namespace kiln::cuda {
namespace {

// Device attribute numbers (cuda.h's CUdevice_attribute).
constexpr int kAttrMaxThreadsPerBlock = 1;
constexpr int kAttrWarpSize = 10;
constexpr int kAttrMultiprocessorCount = 16;
constexpr int kAttrComputeCapabilityMajor = 75;
constexpr int kAttrComputeCapabilityMinor = 76;

// One loaded driver library and what it reported at initialisation.
struct Driver {
  DriverApi api{};
  bool available = false;
  std::string reason;
  int count = 0;
  // Primary contexts, retained on first use of each device.
  std::mutex context_mutex;
  std::vector<CUcontext> contexts;
};

std::string dl_error_text() {
  const char* e = dlerror();
  return e ? e : "unknown dlopen error";
}

// Resolves every entry point; returns the first missing symbol's name, or "".
std::string resolve_symbols(void* lib, DriverApi& api) {
  std::string missing;
  auto bind = [&](auto& fn, const char* symbol) {
    void* p = dlsym(lib, symbol);
    if (!p && missing.empty()) missing = symbol;
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(p);
  };
  bind(api.cuInit, "cuInit");
  bind(api.cuGetErrorName, "cuGetErrorName");
  bind(api.cuGetErrorString, "cuGetErrorString");
  bind(api.cuDeviceGetCount, "cuDeviceGetCount");
  bind(api.cuDeviceGet, "cuDeviceGet");
  bind(api.cuDeviceGetAttribute, "cuDeviceGetAttribute");
  bind(api.cuDeviceGetName, "cuDeviceGetName");
  bind(api.cuDeviceTotalMem, "cuDeviceTotalMem_v2");
  bind(api.cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
  bind(api.cuCtxSetCurrent, "cuCtxSetCurrent");
  bind(api.cuCtxSynchronize, "cuCtxSynchronize");
  bind(api.cuMemAlloc, "cuMemAlloc_v2");
  bind(api.cuMemFree, "cuMemFree_v2");
  bind(api.cuMemGetInfo, "cuMemGetInfo_v2");
  bind(api.cuMemcpyHtoD, "cuMemcpyHtoD_v2");
  bind(api.cuMemcpyDtoH, "cuMemcpyDtoH_v2");
  bind(api.cuMemcpyDtoD, "cuMemcpyDtoD_v2");
  bind(api.cuMemsetD8, "cuMemsetD8_v2");
  bind(api.cuMemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2");
  bind(api.cuMemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2");
  bind(api.cuMemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2");
  bind(api.cuMemcpyAsync, "cuMemcpyAsync");
  bind(api.cuMemsetD32Async, "cuMemsetD32Async");
  bind(api.cuMemsetD16Async, "cuMemsetD16Async");
  bind(api.cuMemcpy2DAsync, "cuMemcpy2DAsync_v2");
  bind(api.cuMemsetD2D8Async, "cuMemsetD2D8Async");
  bind(api.cuMemsetD2D16Async, "cuMemsetD2D16Async");
  bind(api.cuMemsetD2D32Async, "cuMemsetD2D32Async");
  bind(api.cuModuleLoadData, "cuModuleLoadData");
  bind(api.cuModuleLoadDataEx, "cuModuleLoadDataEx");
  bind(api.cuModuleUnload, "cuModuleUnload");
  bind(api.cuModuleGetFunction, "cuModuleGetFunction");
  bind(api.cuLaunchKernel, "cuLaunchKernel");
  bind(api.cuStreamCreate, "cuStreamCreate");
  bind(api.cuStreamSynchronize, "cuStreamSynchronize");
  bind(api.cuStreamDestroy, "cuStreamDestroy_v2");
  bind(api.cuStreamWaitEvent, "cuStreamWaitEvent");
  bind(api.cuEventCreate, "cuEventCreate");
  bind(api.cuEventDestroy, "cuEventDestroy_v2");
  bind(api.cuEventRecord, "cuEventRecord");
  bind(api.cuEventSynchronize, "cuEventSynchronize");
  bind(api.cuEventElapsedTime, "cuEventElapsedTime");
  return missing;
}

std::string text_with(const DriverApi& api, CUresult result) {
  const char* name = nullptr;
  const char* description = nullptr;
  if (api.cuGetErrorName) api.cuGetErrorName(result, &name);
  if (api.cuGetErrorString) api.cuGetErrorString(result, &description);
  // The stub library answers neither; name the well-known code ourselves.
  if (!name && result == kCudaErrorStubLibrary) name = "CUDA_ERROR_STUB_LIBRARY";
  std::string out = fmt::format("{} ({})", name ? name : "CUDA error", result);
  if (description) out += fmt::format(": {}", description);
  else if (result == kCudaErrorStubLibrary)
    out += ": the CUDA driver is a stub library (no NVIDIA driver is installed)";
  return out;
}

// Every driver ever loaded (one, except in tests that swap drivers): kept alive, because
// modules, streams and storages made with one may outlive a swap.
std::mutex g_loaded_mutex;
std::vector<std::unique_ptr<Driver>>* g_loaded = new std::vector<std::unique_ptr<Driver>>();

Driver* load(const std::string& requested_path) {
  Driver* d;
  {
    std::lock_guard<std::mutex> lock(g_loaded_mutex);
    d = g_loaded->emplace_back(std::make_unique<Driver>()).get();
  }
  std::string path = requested_path;
  if (path.empty()) {
    const char* env = std::getenv("KILN_CUDA_DRIVER");
    path = env && *env ? env : "libcuda.so.1";
  }
  void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    d->reason = dl_error_text();
    // dlerror() names the file for a missing library; make sure the reason always does.
    if (d->reason.find(path) == std::string::npos) d->reason = path + ": " + d->reason;
    return d;
  }
  if (std::string missing = resolve_symbols(lib, d->api); !missing.empty()) {
    d->reason = fmt::format("{}: symbol {} not found (driver too old?)", path, missing);
    d->api = DriverApi{};
    return d;
  }
  if (CUresult r = d->api.cuInit(0); r != kCudaSuccess) {
    d->reason = fmt::format("cuInit failed: {} (driver {})", text_with(d->api, r), path);
    return d;
  }
  int count = 0;
  if (CUresult r = d->api.cuDeviceGetCount(&count); r != kCudaSuccess) {
    d->reason = fmt::format("cuDeviceGetCount failed: {}", text_with(d->api, r));
    return d;
  }
  if (count <= 0) {
    d->reason = fmt::format("the driver {} reports no CUDA devices", path);
    return d;
  }
  d->count = count;
  d->contexts.assign(count, nullptr);
  d->available = true;
  return d;
}

std::once_flag g_default_once;
std::atomic<Driver*> g_driver{nullptr};

Driver& state() {
  if (Driver* d = g_driver.load(std::memory_order_acquire)) return *d;
  std::call_once(g_default_once, [] {
    Driver* expected = nullptr;
    Driver* loaded = load("");
    // A test's replacement may have been stored first; it wins.
    g_driver.compare_exchange_strong(expected, loaded);
  });
  return *g_driver.load(std::memory_order_acquire);
}

Driver& available_state(std::string_view op, Loc loc) {
  Driver& d = state();
  if (!d.available) [[unlikely]]
    throw Error(std::string(op), "no CUDA device: " + d.reason, loc);
  return d;
}

}  // namespace

bool is_available() noexcept {
  try {
    return state().available;
  } catch (...) {
    return false;
  }
}

std::string unavailable_reason() noexcept {
  try {
    return state().reason;
  } catch (...) {
    return "CUDA driver state could not be read";
  }
}

int device_count() noexcept {
  try {
    return state().count;
  } catch (...) {
    return 0;
  }
}

const DriverApi& driver(std::string_view op, Loc loc) { return available_state(op, loc).api; }

std::string error_text(CUresult result) { return text_with(state().api, result); }

void check(CUresult result, std::string_view op, Loc loc) {
  if (result == kCudaSuccess) [[likely]]
    return;
  throw Error(std::string(op), error_text(result), loc);
}

void set_current_device(int index, Loc loc) {
  Driver& d = available_state("cuda", loc);
  KILN_CHECK(index >= 0 && index < d.count, "cuda", loc,
             "device cuda:{} does not exist ({} CUDA device(s) found)", index, d.count);
  CUcontext ctx;
  {
    std::lock_guard<std::mutex> lock(d.context_mutex);
    if (!d.contexts[index]) {
      CUdevice dev = 0;
      check(d.api.cuDeviceGet(&dev, index), "cuDeviceGet", loc);
      check(d.api.cuDevicePrimaryCtxRetain(&d.contexts[index], dev), "cuDevicePrimaryCtxRetain",
            loc);
    }
    ctx = d.contexts[index];
  }
  check(d.api.cuCtxSetCurrent(ctx), "cuCtxSetCurrent", loc);
}

DeviceProps device_props(int index, Loc loc) {
  set_current_device(index, loc);
  const DriverApi& api = driver("device_props", loc);
  CUdevice dev = 0;
  check(api.cuDeviceGet(&dev, index), "cuDeviceGet", loc);
  DeviceProps p;
  char name[256] = {};
  check(api.cuDeviceGetName(name, sizeof(name) - 1, dev), "cuDeviceGetName", loc);
  p.name = name;
  auto attr = [&](int which) {
    int v = 0;
    check(api.cuDeviceGetAttribute(&v, which, dev), "cuDeviceGetAttribute", loc);
    return v;
  };
  p.sm_major = attr(kAttrComputeCapabilityMajor);
  p.sm_minor = attr(kAttrComputeCapabilityMinor);
  p.multiprocessor_count = attr(kAttrMultiprocessorCount);
  p.max_threads_per_block = attr(kAttrMaxThreadsPerBlock);
  p.warp_size = attr(kAttrWarpSize);
  check(api.cuDeviceTotalMem(&p.total_memory, dev), "cuDeviceTotalMem", loc);
  return p;
}

void synchronize(int index, Loc loc) {
  set_current_device(index, loc);
  check(driver("synchronize", loc).cuCtxSynchronize(), "cuCtxSynchronize", loc);
}

// ---- modules ----

Module::~Module() {
  if (handle_ && is_available()) {
    // Errors cannot propagate from a destructor; an unload failure only leaks the module.
    try {
      set_current_device(device_);
      driver().cuModuleUnload(handle_);
    } catch (...) {
    }
  }
}

Module::Module(Module&& other) noexcept
    : handle_(std::exchange(other.handle_, nullptr)), device_(other.device_) {}

Module& Module::operator=(Module&& other) noexcept {
  if (this != &other) {
    Module old(std::move(*this));
    handle_ = std::exchange(other.handle_, nullptr);
    device_ = other.device_;
  }
  return *this;
}

Function Module::function(const std::string& name, Loc loc) const {
  KILN_CHECK(handle_ != nullptr, "cuda module", loc, "the module is not loaded");
  Function fn;
  fn.name = name;
  CUresult r = driver("cuModuleGetFunction", loc).cuModuleGetFunction(&fn.handle, handle_,
                                                                      name.c_str());
  KILN_CHECK(r == kCudaSuccess, "cuModuleGetFunction", loc, "kernel '{}': {}", name,
             error_text(r));
  return fn;
}

Module load_module(std::string_view image, int device, Loc loc) {
  set_current_device(device, loc);
  const DriverApi& api = driver("load_module", loc);
  // cuModuleLoadData reads PTX up to its NUL; a string_view need not have one.
  std::string text(image);
  constexpr int kErrorLogBuffer = 5, kErrorLogBufferSize = 6;
  char log[4096] = {};
  int options[] = {kErrorLogBuffer, kErrorLogBufferSize};
  void* values[] = {log, reinterpret_cast<void*>(static_cast<uintptr_t>(sizeof(log) - 1))};
  Module m;
  m.device_ = device;
  CUresult r = api.cuModuleLoadDataEx(&m.handle_, text.c_str(), 2, options, values);
  KILN_CHECK(r == kCudaSuccess, "load_module", loc, "{}{}{}", error_text(r),
             log[0] ? "; JIT log: " : "", log);
  return m;
}

void launch(const Function& fn, const LaunchConfig& c, void** args, CUstream stream, int device,
            Loc loc) {
  if (!c.needs_launch()) return;
  KILN_CHECK(fn.handle != nullptr, "launch", loc, "kernel handle is null");
  if (!stream) stream = kiln_stream(device, loc);
  set_current_device(device, loc);
  CUresult r = driver("launch", loc).cuLaunchKernel(fn.handle, c.grid_x, c.grid_y, c.grid_z,
                                                    c.block_x, c.block_y, c.block_z,
                                                    c.shared_bytes, stream, args, nullptr);
  KILN_CHECK(r == kCudaSuccess, "launch", loc, "kernel '{}' (grid {}x{}x{}, block {}x{}x{}): {}",
             fn.name, c.grid_x, c.grid_y, c.grid_z, c.block_x, c.block_y, c.block_z,
             error_text(r));
}

DriverStatus load_driver_for_testing(const std::string& path) {
  state();  // the default load must not overwrite the replacement later
  Driver* replacement = load(path);
  g_driver.store(replacement, std::memory_order_release);
  return {replacement->available, replacement->reason, replacement->count};
}

}  // namespace kiln::cuda
