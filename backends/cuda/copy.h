#pragma once
/// Copies of contiguous bytes between host and device memory, and the per-device kiln stream
/// they (and kiln's kernels, cuBLAS and the MLIR runtime functions) run on.
///
/// Every copy is synchronous: it is queued on the device's kiln stream and waited for, so
/// the host buffer may be reused as soon as the call returns. All functions throw kiln::Error
/// ("no CUDA device: ..." without a driver; the driver's error otherwise).
#include <cstddef>
#include <cstdint>

#include "backends/cuda/driver.h"

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

}  // namespace kiln::cuda
