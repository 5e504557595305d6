#include "backends/cuda/copy.h"

#include <array>
#include <mutex>
#include <vector>

namespace kiln::cuda {
namespace {

constexpr int kMaxDevices = 64;
constexpr unsigned kStreamNonBlocking = 1;

std::mutex g_stream_mutex;
std::array<CUstream, kMaxDevices> g_streams{};

CUdeviceptr device_address(const void* p) { return reinterpret_cast<CUdeviceptr>(p); }

}  // namespace

CUstream kiln_stream(int device, Loc loc) {
  set_current_device(device, loc);  // also rejects a bad index and a missing driver
  KILN_CHECK(device < kMaxDevices, "cuda stream", loc, "device index {} above the supported {}",
             device, kMaxDevices - 1);
  std::lock_guard<std::mutex> lock(g_stream_mutex);
  CUstream& s = g_streams[device];
  if (!s) check(driver("cuStreamCreate", loc).cuStreamCreate(&s, kStreamNonBlocking),
                "cuStreamCreate", loc);
  return s;
}

void copy_to_device(void* dst, const void* src, size_t nbytes, int device, Loc loc) {
  if (nbytes == 0) return;
  CUstream s = kiln_stream(device, loc);
  const DriverApi& api = driver("copy_to_device", loc);
  check(api.cuMemcpyHtoDAsync(device_address(dst), src, nbytes, s), "cuMemcpyHtoDAsync", loc);
  check(api.cuStreamSynchronize(s), "cuStreamSynchronize", loc);
}

void copy_to_host(void* dst, const void* src, size_t nbytes, int device, Loc loc) {
  if (nbytes == 0) return;
  CUstream s = kiln_stream(device, loc);
  const DriverApi& api = driver("copy_to_host", loc);
  check(api.cuMemcpyDtoHAsync(dst, device_address(src), nbytes, s), "cuMemcpyDtoHAsync", loc);
  check(api.cuStreamSynchronize(s), "cuStreamSynchronize", loc);
}

void copy_device_to_device(void* dst, int dst_device, const void* src, int src_device,
                           size_t nbytes, Loc loc) {
  if (nbytes == 0) return;
  if (dst_device != src_device) {
    std::vector<unsigned char> staging(nbytes);
    copy_to_host(staging.data(), src, nbytes, src_device, loc);
    copy_to_device(dst, staging.data(), nbytes, dst_device, loc);
    return;
  }
  CUstream s = kiln_stream(dst_device, loc);
  const DriverApi& api = driver("copy_device_to_device", loc);
  check(api.cuMemcpyDtoDAsync(device_address(dst), device_address(src), nbytes, s),
        "cuMemcpyDtoDAsync", loc);
  check(api.cuStreamSynchronize(s), "cuStreamSynchronize", loc);
}

void memset_device(void* dst, unsigned char value, size_t nbytes, int device, Loc loc) {
  if (nbytes == 0) return;
  CUstream s = kiln_stream(device, loc);
  const DriverApi& api = driver("memset_device", loc);
  // Ordered after earlier work on the kiln stream: a synchronous cuMemsetD8 would run on the
  // legacy stream, which does not wait for a non-blocking one.
  check(api.cuStreamSynchronize(s), "cuStreamSynchronize", loc);
  check(api.cuMemsetD8(device_address(dst), value, nbytes), "cuMemsetD8", loc);
  check(api.cuCtxSynchronize(), "cuCtxSynchronize", loc);
}

}  // namespace kiln::cuda
