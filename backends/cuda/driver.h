#pragma once
/// The CUDA driver API, loaded at run time with dlopen (never linked: a machine without an
/// NVIDIA driver must still run every CPU program, and linking the toolkit's stub makes a
/// program die at start-up). Only the handful of types kiln needs are declared here, so
/// building kiln does not need cuda.h either.
///
/// Loading happens once, lazily, on the first call that needs the driver. The library is
/// `libcuda.so.1` unless env KILN_CUDA_DRIVER names another path. Without a usable driver
/// every operation throws kiln::Error whose message starts with "no CUDA device: " followed
/// by unavailable_reason(); is_available() never throws.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "backends/cuda/launch.h"
#include "core/error.h"

namespace kiln::cuda {

// ---- the driver's types (ABI-compatible with cuda.h) ----
using CUresult = int;
using CUdevice = int;
using CUdeviceptr = uint64_t;
using CUcontext = struct CUctx_st*;
using CUmodule = struct CUmod_st*;
using CUfunction = struct CUfunc_st*;
using CUstream = struct CUstream_st*;
using CUevent = struct CUevent_st*;

/// cuda.h's CUDA_MEMCPY2D (cuMemcpy2D's description of a pitched copy).
struct Memcpy2D {
  size_t srcXInBytes = 0, srcY = 0;
  int srcMemoryType = 0;  // CUmemorytype: kMemoryTypeDevice
  const void* srcHost = nullptr;
  CUdeviceptr srcDevice = 0;
  void* srcArray = nullptr;
  size_t srcPitch = 0;
  size_t dstXInBytes = 0, dstY = 0;
  int dstMemoryType = 0;
  void* dstHost = nullptr;
  CUdeviceptr dstDevice = 0;
  void* dstArray = nullptr;
  size_t dstPitch = 0;
  size_t WidthInBytes = 0, Height = 0;
};
inline constexpr int kMemoryTypeDevice = 2;  // CU_MEMORYTYPE_DEVICE

inline constexpr CUresult kCudaSuccess = 0;
inline constexpr CUresult kCudaErrorInvalidValue = 1;
inline constexpr CUresult kCudaErrorOutOfMemory = 2;
inline constexpr CUresult kCudaErrorStubLibrary = 34;

/// Entry points resolved from the driver library (the `_v2` symbols where cuda.h's macros
/// map to them). Null only while the driver is unavailable.
struct DriverApi {
  CUresult (*cuInit)(unsigned flags);
  CUresult (*cuGetErrorName)(CUresult, const char**);
  CUresult (*cuGetErrorString)(CUresult, const char**);
  CUresult (*cuDeviceGetCount)(int*);
  CUresult (*cuDeviceGet)(CUdevice*, int ordinal);
  CUresult (*cuDeviceGetAttribute)(int*, int attribute, CUdevice);
  CUresult (*cuDeviceGetName)(char*, int len, CUdevice);
  CUresult (*cuDeviceTotalMem)(size_t*, CUdevice);                      // _v2
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext*, CUdevice);
  CUresult (*cuCtxSetCurrent)(CUcontext);
  CUresult (*cuCtxSynchronize)();
  CUresult (*cuMemAlloc)(CUdeviceptr*, size_t);                         // _v2
  CUresult (*cuMemFree)(CUdeviceptr);                                   // _v2
  CUresult (*cuMemGetInfo)(size_t* free, size_t* total);                // _v2
  CUresult (*cuMemcpyHtoD)(CUdeviceptr, const void*, size_t);           // _v2
  CUresult (*cuMemcpyDtoH)(void*, CUdeviceptr, size_t);                 // _v2
  CUresult (*cuMemcpyDtoD)(CUdeviceptr, CUdeviceptr, size_t);           // _v2
  CUresult (*cuMemsetD8)(CUdeviceptr, unsigned char, size_t);           // _v2
  CUresult (*cuMemcpyHtoDAsync)(CUdeviceptr, const void*, size_t, CUstream);  // _v2
  CUresult (*cuMemcpyDtoHAsync)(void*, CUdeviceptr, size_t, CUstream);        // _v2
  CUresult (*cuMemcpyDtoDAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream);  // _v2
  CUresult (*cuMemcpyAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream);      // unified
  CUresult (*cuMemsetD32Async)(CUdeviceptr, unsigned, size_t, CUstream);
  CUresult (*cuMemsetD16Async)(CUdeviceptr, unsigned short, size_t, CUstream);
  CUresult (*cuMemcpy2DAsync)(const Memcpy2D*, CUstream);                     // _v2
  CUresult (*cuMemsetD2D8Async)(CUdeviceptr, size_t pitch, unsigned char, size_t width,
                                size_t height, CUstream);
  CUresult (*cuMemsetD2D16Async)(CUdeviceptr, size_t pitch, unsigned short, size_t width,
                                 size_t height, CUstream);
  CUresult (*cuMemsetD2D32Async)(CUdeviceptr, size_t pitch, unsigned, size_t width,
                                 size_t height, CUstream);
  CUresult (*cuModuleLoadData)(CUmodule*, const void*);
  CUresult (*cuModuleLoadDataEx)(CUmodule*, const void*, unsigned, int* options, void** values);
  CUresult (*cuModuleUnload)(CUmodule);
  CUresult (*cuModuleGetFunction)(CUfunction*, CUmodule, const char*);
  CUresult (*cuLaunchKernel)(CUfunction, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                             unsigned by, unsigned bz, unsigned shared_bytes, CUstream,
                             void** params, void** extra);
  CUresult (*cuStreamCreate)(CUstream*, unsigned flags);
  CUresult (*cuStreamSynchronize)(CUstream);
  CUresult (*cuStreamDestroy)(CUstream);                                // _v2
  CUresult (*cuStreamWaitEvent)(CUstream, CUevent, unsigned flags);
  CUresult (*cuEventCreate)(CUevent*, unsigned flags);
  CUresult (*cuEventDestroy)(CUevent);                                  // _v2
  CUresult (*cuEventRecord)(CUevent, CUstream);
  CUresult (*cuEventSynchronize)(CUevent);
  CUresult (*cuEventElapsedTime)(float* ms, CUevent start, CUevent end);  // v1: every driver
};

/// Whether a driver was loaded, initialised, and reports at least one device. Never throws.
bool is_available() noexcept;
/// Why is_available() is false ("" when it is true), e.g.
/// "libcuda.so.1: cannot open shared object file: No such file or directory" or
/// "cuInit failed: CUDA_ERROR_STUB_LIBRARY (34): ...". Never throws.
std::string unavailable_reason() noexcept;
/// Number of CUDA devices (0 when unavailable). Never throws.
int device_count() noexcept;

/// The loaded driver. Throws kiln::Error(op, "no CUDA device: <reason>") when unavailable.
const DriverApi& driver(std::string_view op = "cuda", Loc loc = Loc::current());

/// Throws kiln::Error(op, "<CUDA_ERROR_NAME> (<code>): <description>") unless `result` is
/// CUDA_SUCCESS.
void check(CUresult result, std::string_view op, Loc loc = Loc::current());
/// "<CUDA_ERROR_NAME> (<code>): <description>" for `result` (works without a driver too).
std::string error_text(CUresult result);

/// Makes device `index`'s primary context current on the calling thread (retaining it on
/// first use). Throws kiln::Error for an unavailable driver or an index out of range.
void set_current_device(int index, Loc loc = Loc::current());

struct DeviceProps {
  std::string name;                // e.g. "NVIDIA H200"
  int sm_major = 0, sm_minor = 0;  // compute capability, e.g. 9.0
  int multiprocessor_count = 0;
  int max_threads_per_block = 0;
  int warp_size = 32;
  size_t total_memory = 0;         // bytes
};
/// Properties of device `index`. Throws kiln::Error when unavailable or out of range.
DeviceProps device_props(int index, Loc loc = Loc::current());

/// Waits until all work on device `index` has finished (cuCtxSynchronize).
void synchronize(int index = 0, Loc loc = Loc::current());

// ---- modules and kernels ----

/// A kernel in a loaded module (valid while its Module lives).
struct Function {
  CUfunction handle = nullptr;
  std::string name;
};

/// A loaded PTX or cubin image (cuModuleLoadData), unloaded on destruction.
class Module {
 public:
  Module() = default;
  ~Module();
  Module(Module&& other) noexcept;
  Module& operator=(Module&& other) noexcept;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  /// The kernel `name` (its mangled .entry name). Throws kiln::Error if absent.
  Function function(const std::string& name, Loc loc = Loc::current()) const;
  CUmodule handle() const { return handle_; }

 private:
  friend Module load_module(std::string_view image, int device, Loc loc);
  CUmodule handle_ = nullptr;
  int device_ = 0;
};

/// Loads a PTX text (or cubin) into device `device`'s primary context. PTX is JIT-compiled by
/// the driver. Throws kiln::Error with the driver's message on failure.
Module load_module(std::string_view image, int device = 0, Loc loc = Loc::current());

/// Launches `fn` with `config` on `stream` (nullptr: the device's kiln stream). `args` holds
/// one pointer per kernel parameter. Does nothing when !config.needs_launch().
void launch(const Function& fn, const LaunchConfig& config, void** args, CUstream stream = nullptr,
            int device = 0, Loc loc = Loc::current());

// ---- for tests ----

struct DriverStatus {
  bool available = false;
  std::string reason;
  int device_count = 0;
};
/// Replaces the process-wide driver with the library at `path` ("" = the default: env
/// KILN_CUDA_DRIVER or libcuda.so.1) and returns its status. Not thread-safe with concurrent
/// CUDA use; tests only. The previous driver stays loaded (objects may still refer to it).
DriverStatus load_driver_for_testing(const std::string& path);

}  // namespace kiln::cuda
