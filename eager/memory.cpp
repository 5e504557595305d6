#include "eager/memory.h"

#include "backends/cpu/allocator.h"
#include "backends/cuda/allocator.h"

namespace kiln {
namespace {

// The GPU's allocator; "no CUDA device: ..." names the caller's op and line.
cuda::CachingAllocator& device_allocator(Device device, const char* op, Loc loc) {
  try {
    return cuda::caching_allocator(device.index);
  } catch (Error& e) {
    e.set_op(op);
    e.set_where(loc);
    throw;
  }
}

}  // namespace

MemoryStats memory_stats(Device device, Loc loc) {
  check_device(device, "memory_stats", loc);
  if (device.is_cpu()) {
    const cpu::AllocatorStats s = cpu::allocator_stats();
    return {s.allocated_bytes, s.peak_allocated_bytes, s.cached_bytes};
  }
  const cuda::AllocatorStats s = device_allocator(device, "memory_stats", loc).stats();
  return {s.allocated_bytes, s.peak_allocated_bytes, s.cached_bytes};
}

void reset_peak_memory_stats(Device device, Loc loc) {
  check_device(device, "reset_peak_memory_stats", loc);
  if (device.is_cpu()) {
    cpu::reset_peak_stats();
    return;
  }
  device_allocator(device, "reset_peak_memory_stats", loc).reset_peak_stats();
}

void empty_cache(Device device, Loc loc) {
  check_device(device, "empty_cache", loc);
  if (device.is_cpu()) {
    cpu::empty_cache();
    return;
  }
  device_allocator(device, "empty_cache", loc).empty_cache();
}

}  // namespace kiln
