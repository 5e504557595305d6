#pragma once
/// The CUDA caching allocator. cuMemAlloc/cuMemFree synchronise the device and cost tens of
/// microseconds, so freed blocks are kept by (rounded) size and handed out again, as PyTorch
/// does. Sizes are rounded up to 512 B below 1 MiB and to 2 MiB from 1 MiB on. A block is
/// reused only for a request of the same rounded size (no splitting).
///
/// A freed block may be handed out again while kernels queued before the free still read it:
/// that is safe because all of kiln's device work on a device runs on its one kiln stream
/// (copy.h), in order (as with PyTorch's per-stream caching). Work on other streams must
/// synchronise before freeing.
///
/// The caching logic (CachingAllocator) sits over a small backing interface (DeviceMemory) so
/// that tests drive it with a fake; cuda::allocator(i) is the real one over cuMemAlloc.
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/error.h"
#include "core/storage.h"

namespace kiln::cuda {

/// Where the caching allocator gets memory from.
class DeviceMemory {
 public:
  virtual ~DeviceMemory() = default;
  /// A device address of `nbytes` bytes, or 0 when the device is out of memory. Other
  /// failures throw kiln::Error.
  virtual uint64_t alloc(size_t nbytes) = 0;
  virtual void free(uint64_t address) = 0;
};

struct AllocatorStats {
  size_t allocated_bytes = 0;       // rounded bytes of blocks in use
  size_t reserved_bytes = 0;        // bytes obtained from the device (in use + cached)
  size_t cached_bytes = 0;          // reserved but free, kept for reuse
  size_t peak_allocated_bytes = 0;
  uint64_t cache_hits = 0;          // allocations served from the cache
  uint64_t cache_misses = 0;        // allocations that went to the device
  uint64_t cache_flushes = 0;       // times the cache was emptied to retry after OOM
};

class CachingAllocator {
 public:
  /// `device_name` ("cuda:0") appears in error messages.
  CachingAllocator(std::unique_ptr<DeviceMemory> memory, std::string device_name);
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  /// Rounded size of a request: 512-byte multiples below 1 MiB, 2 MiB multiples from 1 MiB on;
  /// 0 bytes count as 512 (every allocation has a distinct address).
  static size_t round_size(size_t nbytes);

  /// A block of at least `nbytes` bytes. When the device is out of memory the cache is
  /// emptied and the allocation retried once; then kiln::Error("cuda allocate", "out of
  /// memory: tried to allocate X MiB; N MiB allocated, M MiB reserved ...").
  uint64_t allocate(size_t nbytes, Loc loc = Loc::current());
  /// Returns a block from allocate() to the cache. Throws kiln::Error for an unknown address.
  void deallocate(uint64_t address);
  /// Gives every cached (free) block back to the device.
  void empty_cache();
  AllocatorStats stats() const;
  /// Starts peak_allocated_bytes again from allocated_bytes.
  void reset_peak_stats();

 private:
  void release_cached_locked();

  std::unique_ptr<DeviceMemory> memory_;
  std::string device_name_;
  mutable std::mutex mutex_;
  std::map<size_t, std::vector<uint64_t>> free_blocks_;  // rounded size -> free addresses
  std::unordered_map<uint64_t, size_t> live_blocks_;     // address -> rounded size
  AllocatorStats stats_;
};

/// core's Allocator for device `device` (process-wide, thread-safe): allocate() returns a
/// device pointer as void*. Throws kiln::Error "no CUDA device: ..." when CUDA is unavailable
/// and for a device index out of range.
Allocator* allocator(int device = 0);
/// The caching allocator behind allocator(device) (for stats and empty_cache).
CachingAllocator& caching_allocator(int device = 0);

}  // namespace kiln::cuda
