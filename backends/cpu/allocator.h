#pragma once
/// The CPU allocator: 64-byte aligned; blocks of at least 1 MiB are cached and reused by size
/// class, and backed by transparent huge pages where the kernel allows, because first-touch
/// page faults on a fresh 64 MiB buffer cost ~25 ms here (notes/cpu-performance.md). Blocks of
/// 4 KiB to 1 MiB are cached too, up to 16 per size class, and smaller ones up to 64 per
/// 64-byte class (neither under AddressSanitizer, where recycling would hide use-after-free).
#include <cstddef>

#include "core/storage.h"

namespace kiln::cpu {

/// The process-wide CPU allocator (thread-safe).
Allocator* allocator();

struct AllocatorStats {
  size_t cached_bytes;          // bytes held in the cache, free for reuse
  size_t cache_hits;            // large allocations served from the cache
  size_t cache_misses;          // large allocations that went to the OS
  size_t allocated_bytes;       // bytes requested by blocks in use now
  size_t peak_allocated_bytes;  // the most in use at once since start or reset_peak_stats()
  size_t most_held_bytes;       // the most bytes blocks in use ever took at once (classes)
  size_t cache_limit;           // the most the cache keeps: 2x that, in [256 MiB, 2 GiB]
};
AllocatorStats allocator_stats();
/// Returns every cached block to the OS.
void empty_cache();
/// Starts peak_allocated_bytes again from allocated_bytes.
void reset_peak_stats();

}  // namespace kiln::cpu
