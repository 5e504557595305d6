// The table of runtime symbols (codegen/runtime.h). Each extern kernel adds its entry here.
#include "codegen/runtime.h"

#include <cstddef>

#include "backends/cpu/allocator.h"

namespace kiln::codegen {
namespace {

// Buffers that compiled code allocates for intermediates (memref.alloc lowers to malloc/free)
// come from kiln's caching CPU allocator: a fresh multi-MiB malloc per call would page-fault on
// every call. A 64-byte header in front of each block keeps its size for free().
void* rt_malloc(size_t nbytes) {
  size_t total = nbytes + kAlignment;
  void* base;
  try {
    base = cpu::allocator()->allocate(total);
  } catch (...) {  // no exceptions through JIT-compiled frames
    return nullptr;
  }
  *static_cast<size_t*>(base) = total;
  return static_cast<char*>(base) + kAlignment;
}

void rt_free(void* ptr) {
  if (!ptr) return;
  char* base = static_cast<char*>(ptr) - kAlignment;
  cpu::allocator()->deallocate(base, *reinterpret_cast<size_t*>(base));
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
