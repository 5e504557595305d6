#pragma once
/// Copies of contiguous bytes between host and device memory, and the per-device kiln stream
/// they (and kiln's kernels, cuBLAS and the MLIR runtime functions) run on.
///
/// Every copy is synchronous: it is queued on the device's kiln stream and waited for, so
/// the host buffer may be reused as soon as the call returns. All functions throw kiln::Error
/// ("no CUDA device: ..." without a driver; the driver's error otherwise).
#include <cstddef>
#include <cstdint>
#include <optional>

#include "backends/cuda/driver.h"
#include "core/shape.h"

namespace kiln::cuda {

/// The stream kiln uses on device `device` (created on first use, non-blocking with respect
/// to the legacy default stream, never destroyed).
CUstream kiln_stream(int device = 0, Loc loc = Loc::current());

/// Copies `nbytes` bytes from host memory `src` to device memory `dst` on device `device`.
void copy_to_device(void* dst, const void* src, size_t nbytes, int device = 0,
                    Loc loc = Loc::current());
/// Copies `nbytes` bytes from device memory `src` (on device `device`) to host memory `dst`.
void copy_to_host(void* dst, const void* src, size_t nbytes, int device = 0,
                  Loc loc = Loc::current());
/// Copies `nbytes` bytes between two device buffers; with `src_device` != `dst_device` the
/// bytes go through the host (no peer access is assumed).
void copy_device_to_device(void* dst, int dst_device, const void* src, int src_device,
                           size_t nbytes, Loc loc = Loc::current());
/// Sets `nbytes` bytes of device memory `dst` to `value`.
void memset_device(void* dst, unsigned char value, size_t nbytes, int device = 0,
                   Loc loc = Loc::current());

/// A strided view of memory as what the driver's 2-D copies and memsets write: `planes`
/// times (`plane_stride` elements apart) `height` rows (`pitch` elements apart) of `width`
/// contiguous elements. All counts and strides are in elements.
struct PitchedView {
  int64_t width = 1, height = 1, pitch = 1, planes = 1, plane_stride = 0;
};

/// The pitched form of a non-empty view with `shape` and `strides` (elements): its dims of
/// size > 1 that nest contiguously merged, at most three levels left (a last stride above 1
/// is rows of width 1), with no two elements at the same address. nullopt otherwise. E.g. a
/// KV cache's slot [B, H, 1, D] of [B, H, T, D] is B * H rows of D with pitch T * D; a column
/// x[:, j] of [N, M] is N rows of 1 with pitch M.
std::optional<PitchedView> pitched_view(const Shape& shape, const Strides& strides);

/// A pitched view as 2-D driver operations: `calls` of them, the k-th at element
/// k * call_stride of the view (and k * src_call_stride of the contiguous source of a copy),
/// each `rows` rows of the view's width, `row_pitch` apart (src_row_pitch in the source). One
/// per plane; or, when the view has fewer rows than planes, one per row, running down the
/// planes (fewer host calls).
struct PitchedCalls {
  int64_t calls, rows, row_pitch, call_stride, src_row_pitch, src_call_stride;
};
PitchedCalls pitched_calls(const PitchedView& v);
/// At most this many 2-D driver copies or memsets (each a host call of a few microseconds,
/// queued without waiting) for one copy_ or fill_ (for fills of 8-byte values of two different
/// words: pairs of memsets); more take the host path.
inline constexpr int64_t kMaxPitchedCalls = 1024;

/// Queues on device `device`'s kiln stream (not waited for): copies `v`'s elements of
/// `elem_size` bytes from the contiguous device buffer `src` (in the view's element order) into
/// the strided view `v` of device memory starting at `dst`, one cuMemcpy2DAsync per plane (or
/// per row when there are fewer rows than planes). Returns false, having written nothing, for
/// more than kMaxPitchedCalls such calls or when the driver refuses the pitch
/// (CUDA_ERROR_INVALID_VALUE: cuMemcpy2D may refuse device pitches cuMemAllocPitch did not
/// give); throws kiln::Error for other driver errors.
bool copy_into_pitched(void* dst, const PitchedView& v, const void* src, size_t elem_size,
                       int device, Loc loc = Loc::current());
/// Queues on device `device`'s kiln stream: sets every element of the strided view `v` at
/// `dst` to the `elem_size`-byte pattern `bits` (1, 2, 4 or 8 bytes) with the driver's 2-D
/// memsets: one per plane (or row, as copies), or for 8-byte patterns of two different words
/// (float64 3.0) two per row or column of each plane. Returns false, doing nothing, for other
/// sizes, more than kMaxPitchedCalls memsets (pairs), or a pitch the driver refuses.
bool fill_pitched(void* dst, const PitchedView& v, uint64_t bits, size_t elem_size, int device,
                  Loc loc = Loc::current());

}  // namespace kiln::cuda
