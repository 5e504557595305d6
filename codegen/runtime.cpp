// The table of runtime symbols (codegen/runtime.h). Each extern kernel adds its entry here.
#include "codegen/runtime.h"

#include <cstddef>
#include <utility>

#include "backends/cpu/allocator.h"

namespace kiln::codegen {
namespace {

// Buffers that compiled code allocates for intermediates (memref.alloc lowers to malloc/free)
// are reused: a fresh malloc of a few hundred KiB per call (one call per row block) would
// page-fault on every call. Each thread keeps its last few freed blocks; a 64-byte header in
// front of each block keeps its capacity. Larger or surplus blocks go to kiln's CPU allocator
// (itself caching from 1 MiB up).
struct Block {
  size_t capacity;  // bytes after the header
};
constexpr size_t kSlots = 8;
constexpr size_t kPage = 4096;
constexpr size_t kMaxCachedBlock = size_t{16} << 20;

struct ThreadCache {
  void* slots[kSlots] = {};
  ~ThreadCache() {
    for (void* b : slots)
      if (b) cpu::allocator()->deallocate(b, static_cast<Block*>(b)->capacity + kAlignment);
  }
};
thread_local ThreadCache t_cache;

void* rt_malloc(size_t nbytes) {
  size_t capacity = (nbytes + kPage - 1) / kPage * kPage;
  for (void*& b : t_cache.slots) {
    if (b && static_cast<Block*>(b)->capacity == capacity) {
      void* hit = b;
      b = nullptr;
      return static_cast<char*>(hit) + kAlignment;
    }
  }
  void* base;
  try {
    base = cpu::allocator()->allocate(capacity + kAlignment);
  } catch (...) {  // no exceptions through JIT-compiled frames
    return nullptr;
  }
  static_cast<Block*>(base)->capacity = capacity;
  return static_cast<char*>(base) + kAlignment;
}

void rt_free(void* ptr) {
  if (!ptr) return;
  void* base = static_cast<char*>(ptr) - kAlignment;
  size_t capacity = static_cast<Block*>(base)->capacity;
  if (capacity > kMaxCachedBlock) {
    cpu::allocator()->deallocate(base, capacity + kAlignment);
    return;
  }
  for (void*& b : t_cache.slots) {
    if (!b) {
      b = base;
      return;
    }
  }
  // Full: evict the first slot (blocks of a graph are freed in a fixed order).
  std::swap(base, t_cache.slots[0]);
  cpu::allocator()->deallocate(base, static_cast<Block*>(base)->capacity + kAlignment);
}

void* rt_aligned_alloc(size_t alignment, size_t nbytes) {
  return alignment <= kAlignment ? rt_malloc(nbytes) : nullptr;
}

}  // namespace

const std::vector<RuntimeSymbol>& runtime_symbols() {
  static const std::vector<RuntimeSymbol> symbols = {
      {"malloc", reinterpret_cast<void*>(&rt_malloc)},
      {"free", reinterpret_cast<void*>(&rt_free)},
      {"aligned_alloc", reinterpret_cast<void*>(&rt_aligned_alloc)},
  };
  return symbols;
}

}  // namespace kiln::codegen
