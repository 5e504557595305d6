#pragma once
/// Memory held by kiln's caching allocators, per device: torch.cuda.memory_allocated,
/// max_memory_allocated, reset_peak_memory_stats and empty_cache, for the CPU too. Freed
/// tensor memory is kept for reuse (a fresh buffer costs page faults on the CPU and a
/// synchronising cuMemAlloc on a GPU): on the CPU at most twice as many bytes as tensors ever held
/// at once, at least 256 MiB and at most 2 GiB; on a GPU until empty_cache() or an allocation
/// that would otherwise fail.
#include <cstddef>

#include "core/device.h"
#include "core/error.h"

namespace kiln {

struct MemoryStats {
  size_t allocated_bytes = 0;       ///< bytes of tensor storage in use now
  size_t peak_allocated_bytes = 0;  ///< the most in use at once since start or the last reset
  size_t cached_bytes = 0;          ///< freed bytes the allocator keeps for reuse
};

/// The allocator's figures for `device`. On a GPU, sizes are the allocator's rounded block
/// sizes (512 bytes below 1 MiB, 2 MiB multiples above); on the CPU, the bytes requested.
/// Throws kiln::Error for a CUDA device that is not present.
MemoryStats memory_stats(Device device = Device::cpu(), Loc loc = Loc::current());
/// Starts `device`'s peak_allocated_bytes again from the bytes in use now.
void reset_peak_memory_stats(Device device = Device::cpu(), Loc loc = Loc::current());
/// Gives `device`'s cached free blocks back to the system (tensors in use are untouched).
void empty_cache(Device device = Device::cpu(), Loc loc = Loc::current());

}  // namespace kiln
