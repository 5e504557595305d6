#include "backends/cuda/copy.h"

#include <algorithm>
#include <array>
#include <mutex>
#include <utility>
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

std::optional<PitchedView> pitched_view(const Shape& shape, const Strides& strides) {
  // (size, stride) levels from the innermost out, size-1 dims dropped, nesting dims merged.
  std::vector<std::pair<int64_t, int64_t>> levels;
  for (int d = static_cast<int>(shape.size()) - 1; d >= 0; --d) {
    if (shape[d] == 0) return std::nullopt;
    if (shape[d] == 1) continue;
    if (strides[d] <= 0) return std::nullopt;
    if (!levels.empty() && strides[d] == levels.back().first * levels.back().second)
      levels.back().first *= shape[d];
    else
      levels.push_back({shape[d], strides[d]});
  }
  if (levels.empty() || levels.front().second != 1) levels.insert(levels.begin(), {1, 1});
  if (levels.size() > 3) return std::nullopt;
  PitchedView v;
  v.width = levels[0].first;
  if (levels.size() > 1) std::tie(v.height, v.pitch) = levels[1];
  else v.pitch = v.width;
  if (levels.size() > 2) std::tie(v.planes, v.plane_stride) = levels[2];
  // Rows and planes must not overlap (a later one would overwrite an earlier one's elements).
  if (v.pitch < v.width) return std::nullopt;
  if (v.planes > 1 && v.plane_stride < v.pitch * (v.height - 1) + v.width) return std::nullopt;
  return v;
}

PitchedCalls pitched_calls(const PitchedView& v) {
  const int64_t plane = v.width * v.height;  // a plane's elements in the source
  if (v.planes <= v.height) return {v.planes, v.height, v.pitch, v.plane_stride, v.width, plane};
  return {v.height, v.planes, v.plane_stride, v.pitch, plane, v.width};
}

bool copy_into_pitched(void* dst, const PitchedView& v, const void* src, size_t elem_size,
                       int device, Loc loc) {
  const PitchedCalls d = pitched_calls(v);
  if (d.calls > kMaxPitchedCalls) return false;
  CUstream s = kiln_stream(device, loc);
  const DriverApi& api = driver("copy_", loc);
  Memcpy2D c;
  c.srcMemoryType = c.dstMemoryType = kMemoryTypeDevice;
  c.WidthInBytes = static_cast<size_t>(v.width) * elem_size;
  c.srcPitch = static_cast<size_t>(d.src_row_pitch) * elem_size;
  c.dstPitch = static_cast<size_t>(d.row_pitch) * elem_size;
  c.Height = static_cast<size_t>(d.rows);
  for (int64_t k = 0; k < d.calls; ++k) {
    c.dstDevice = device_address(dst) + static_cast<size_t>(k * d.call_stride) * elem_size;
    c.srcDevice = device_address(src) + static_cast<size_t>(k * d.src_call_stride) * elem_size;
    CUresult r = api.cuMemcpy2DAsync(&c, s);
    if (k == 0 && r == kCudaErrorInvalidValue) return false;
    check(r, "cuMemcpy2DAsync", loc);
  }
  return true;
}

bool fill_pitched(void* dst, const PitchedView& v, uint64_t bits, size_t elem_size, int device,
                  Loc loc) {
  if (elem_size != 1 && elem_size != 2 && elem_size != 4 && elem_size != 8) return false;
  const bool two_words = elem_size == 8 && (bits >> 32) != (bits & 0xffffffffu);
  // An 8-byte pattern of two different words: each word by its own 32-bit memsets of one word
  // per 8-byte "row", along each row of the view or down each of its columns (fewer calls),
  // plane by plane.
  const PitchedCalls d =
      two_words ? PitchedCalls{v.planes, v.height, v.pitch, v.plane_stride, 0, 0}
                : pitched_calls(v);
  const int64_t lines = two_words ? std::min(v.height, v.width) : 1;
  if (d.calls * lines > kMaxPitchedCalls) return false;
  CUstream s = kiln_stream(device, loc);
  const DriverApi& api = driver("fill_", loc);
  const size_t pitch = static_cast<size_t>(d.row_pitch) * elem_size;
  const size_t width = static_cast<size_t>(v.width), rows = static_cast<size_t>(d.rows);
  auto word = [&](int half) { return static_cast<unsigned>(bits >> (32 * half)); };
  for (int64_t k = 0; k < d.calls; ++k) {
    CUdeviceptr at = device_address(dst) + static_cast<size_t>(k * d.call_stride) * elem_size;
    CUresult r = kCudaSuccess;
    if (elem_size == 1) {
      r = api.cuMemsetD2D8Async(at, pitch, static_cast<unsigned char>(bits), width, rows, s);
    } else if (elem_size == 2) {
      r = api.cuMemsetD2D16Async(at, pitch, static_cast<unsigned short>(bits), width, rows, s);
    } else if (!two_words) {
      r = api.cuMemsetD2D32Async(at, pitch, word(0), width * (elem_size / 4), rows, s);
    } else {
      const bool by_rows = v.height <= v.width;
      for (int64_t line = 0; line < lines && r == kCudaSuccess; ++line)
        for (int half = 0; half < 2 && r == kCudaSuccess; ++half) {
          CUdeviceptr first = at + (by_rows ? line * pitch : line * 8) + 4 * half;
          r = api.cuMemsetD2D32Async(first, by_rows ? 8 : pitch, word(half), 1,
                                     by_rows ? width : rows, s);
        }
    }
    if (k == 0 && r == kCudaErrorInvalidValue) return false;
    check(r, "cuMemsetD2D", loc);
  }
  return true;
}

}  // namespace kiln::cuda
