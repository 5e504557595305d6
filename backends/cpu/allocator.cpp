#include "backends/cpu/allocator.h"

#include <pthread.h>
#include <sys/mman.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdlib>
#include <map>
#include <mutex>
#include <optional>
#include <vector>

#include "core/error.h"
#include "core/sanitizers.h"

namespace kiln::cpu {
namespace {

constexpr size_t kLargeBlock = size_t{1} << 20;   // cache blocks from 1 MiB up
constexpr size_t kHugePage = size_t{2} << 20;
// Free blocks kept: at most twice the most bytes blocks in use ever took at once (at least 256
// MiB, at most 2 GiB). A fixed 2 GiB let eager ops on tensors of varied sizes (at most 200 MB
// in use) grow the process to 1.5 GB of idle cached blocks, one size class each; the peak
// alone was too little for a loop whose phases use different sizes (600 MiB, then 4 x 200 MiB:
// a review measured 4 of 5 blocks missed a step, 1.9x slower), as blocks are reused by class.
constexpr size_t kMinCacheLimit = size_t{256} << 20;
constexpr size_t kMaxCached = size_t{2} << 30;
// Blocks from 4 KiB to 1 MiB are kept too, per size class. glibc's malloc and free of such
// blocks (not in its per-thread cache; they split and merge chunks) were 15-18 % of the eager
// digits MLP step, and its frees shrink the heap: each shrink flushes the TLB of every CPU
// running the process with an inter-processor interrupt, which with kiln's second thread
// awake took 20-40 % of that step (265 us on 1 thread, 600 us on 2, in brk ->
// flush_tlb_mm_range). Telling glibc to keep freed memory instead (mallopt) made small ops
// after a large workload 3x slower (eager add of 1 element: 308 -> 904 ns). At most
// kSmallPerClass blocks of each class are kept (under 200 MiB over all classes).
constexpr size_t kSmallBlock = size_t{4} << 10;
constexpr size_t kSmallPerClass = 16;
// Blocks under 4 KiB (parameters and activations of small models, 0-d tensors) are kept in
// classes of 64 bytes: glibc serves kiln's 64-byte-aligned requests through memalign, which
// skips its per-thread cache, so they cost a trip through its bins (with consolidation
// passes) on every allocation. 64 per class: about 8 MiB at most over all classes.
constexpr size_t kTinyStep = kAlignment;
constexpr size_t kTinyClasses = kSmallBlock / kTinyStep;
constexpr size_t kTinyPerClass = 64;
// Recycled blocks would hide use-after-free from AddressSanitizer.
constexpr bool kCacheSmall = !kAddressSanitizer;

size_t size_class(size_t n) {
  // Round up to 1/8 steps of the next power of two, so reuse wastes at most ~12 %.
  size_t p = 1;
  while (p < n) p <<= 1;
  size_t step = std::max<size_t>(p / 8, kAlignment);
  return (n + step - 1) / step * step;
}

// Index of a small block's class: 8 classes per power of two from kSmallBlock up.
size_t small_index(size_t cls) {
  size_t octave = 0, base = kSmallBlock;
  while (base * 2 < cls) base *= 2, ++octave;
  return octave * 8 + (cls - base + base / 8 - 1) / (base / 8);
}
constexpr size_t kSmallClasses = 8 * 9;  // 4 KiB .. 1 MiB

// A block under 4 KiB: its size rounded up to 64 bytes (64 for 0 bytes).
size_t tiny_class(size_t n) {
  return std::max<size_t>((n + kTinyStep - 1) / kTinyStep, 1) * kTinyStep;
}

class CachingAllocator final : public Allocator {
 public:
  void* allocate(size_t nbytes) override {
    void* p = take_block(nbytes);
    raise_mark(peak_, allocated_.fetch_add(nbytes, std::memory_order_relaxed) + nbytes);
    const size_t block = block_bytes(nbytes);
    raise_mark(high_water_, held_.fetch_add(block, std::memory_order_relaxed) + block);
    return p;
  }

  void deallocate(void* p, size_t nbytes) override {
    allocated_.fetch_sub(nbytes, std::memory_order_relaxed);
    held_.fetch_sub(block_bytes(nbytes), std::memory_order_relaxed);
    return_block(p, nbytes);
  }

  Device device() const override { return Device::cpu(); }

  // fork() handlers (instance()).
  void lock() { mu_.lock(); }
  void unlock() { mu_.unlock(); }

  AllocatorStats stats() {
    std::lock_guard<std::mutex> lock(mu_);
    return {cached_,
            hits_,
            misses_,
            allocated_.load(std::memory_order_relaxed),
            peak_.load(std::memory_order_relaxed),
            high_water_.load(std::memory_order_relaxed),
            cache_limit()};
  }
  void reset_peak() { peak_.store(allocated_.load(std::memory_order_relaxed)); }
  void empty() {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [cls, p] : free_) std::free(p);
    free_.clear();
    for (std::vector<void*>& list : small_) {
      for (void* p : list) std::free(p);
      list.clear();
    }
    for (std::vector<void*>& list : tiny_) {
      for (void* p : list) std::free(p);
      list.clear();
    }
    cached_ = 0;
    large_cached_ = 0;
  }

 private:
  static void raise_mark(std::atomic<size_t>& mark, size_t now) {
    size_t seen = mark.load(std::memory_order_relaxed);
    while (now > seen && !mark.compare_exchange_weak(seen, now, std::memory_order_relaxed)) {
    }
  }
  // The bytes a block of `nbytes` counts in the cache: its size class where it is cached.
  size_t block_bytes(size_t nbytes) {
    if (std::optional<ListSlot> slot = list_slot(nbytes)) return slot->cls;
    return nbytes < kLargeBlock ? nbytes : size_class(nbytes);
  }
  size_t cache_limit() const {
    return std::clamp(2 * high_water_.load(std::memory_order_relaxed), kMinCacheLimit,
                      kMaxCached);
  }

  void* take_block(size_t nbytes) {
    if (std::optional<ListSlot> slot = list_slot(nbytes)) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        std::vector<void*>& list = *slot->list;
        if (!list.empty()) {
          void* p = list.back();
          list.pop_back();
          cached_ -= slot->cls;
          return p;
        }
      }
      return system_alloc(kAlignment, slot->cls, nbytes);
    }
    if (nbytes < kLargeBlock) {
      return system_alloc(kAlignment, std::max<size_t>((nbytes + 63) & ~size_t{63}, 64), nbytes);
    }
    size_t cls = size_class(nbytes);
    {
      std::lock_guard<std::mutex> lock(mu_);
      // The block of the class freed last (multimap keeps equal keys in insertion order): it is
      // the one most likely still in cache and mapped. Taking the oldest instead rotated a
      // training step's updated parameters through every cached block of their size; in the
      // Transformer benchmark each compiled AdamW loop over a 1 MiB weight then took 0.9 ms
      // instead of 0.09 ms (median of 55 steps), and the eager step 47 ms instead of 45.
      auto [first, last] = free_.equal_range(cls);
      if (first != last) {
        auto it = std::prev(last);
        void* p = it->second;
        free_.erase(it);
        cached_ -= cls;
        large_cached_ -= cls;
        ++hits_;
        return p;
      }
      ++misses_;
    }
    void* p = system_alloc(kHugePage, (cls + kHugePage - 1) / kHugePage * kHugePage, nbytes);
    madvise(p, cls, MADV_HUGEPAGE);  // best effort; ignored where THP is off
    return p;
  }

  void return_block(void* p, size_t nbytes) {
    if (std::optional<ListSlot> slot = list_slot(nbytes)) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        std::vector<void*>& list = *slot->list;
        if (list.size() < slot->capacity && cached_ + slot->cls <= cache_limit()) {
          list.push_back(p);
          cached_ += slot->cls;
          return;
        }
      }
      std::free(p);
      return;
    }
    if (nbytes < kLargeBlock) {
      std::free(p);
      return;
    }
    size_t cls = size_class(nbytes);
    std::lock_guard<std::mutex> lock(mu_);
    // The block freed now is the likeliest to be asked for again: larger cached blocks go
    // back to the OS to make room for it.
    const size_t limit = cache_limit();
    // (Only if that makes room: the lists of blocks under 1 MiB are not evicted.)
    while (cached_ + cls > limit && cached_ - large_cached_ + cls <= limit) {
      auto largest = std::prev(free_.end());
      std::free(largest->second);
      cached_ -= largest->first;
      large_cached_ -= largest->first;
      free_.erase(largest);
    }
    if (cached_ + cls > limit) {
      std::free(p);
      return;
    }
    free_.emplace(cls, p);
    cached_ += cls;
    large_cached_ += cls;
  }

  // Memory from the system; when there is none, the cached free blocks are given back and the
  // request tried once more (as PyTorch's CUDA allocator does), so memory this cache holds
  // never makes an allocation fail.
  void* system_alloc(size_t alignment, size_t size, size_t nbytes) {
    void* p = std::aligned_alloc(alignment, size);
    if (!p) {
      empty();
      p = std::aligned_alloc(alignment, size);
    }
    if (!p) throw Error("allocate", fmt::format("out of memory allocating {} bytes", nbytes));
    return p;
  }

  // The free list of a block under 1 MiB: its class's size, the list and its bound.
  struct ListSlot {
    size_t cls;
    std::vector<void*>* list;
    size_t capacity;
  };
  std::optional<ListSlot> list_slot(size_t nbytes) {
    if (!kCacheSmall || nbytes >= kLargeBlock) return std::nullopt;
    if (nbytes < kSmallBlock) {
      const size_t cls = tiny_class(nbytes);
      return ListSlot{cls, &tiny_[cls / kTinyStep - 1], kTinyPerClass};
    }
    const size_t cls = size_class(nbytes);
    return ListSlot{cls, &small_[small_index(cls)], kSmallPerClass};
  }

  std::mutex mu_;
  std::multimap<size_t, void*> free_;
  std::array<std::vector<void*>, kSmallClasses> small_;  // free blocks of 4 KiB .. 1 MiB
  std::array<std::vector<void*>, kTinyClasses> tiny_;    // free blocks under 4 KiB
  size_t cached_ = 0, large_cached_ = 0, hits_ = 0, misses_ = 0;  // large: in free_
  // Bytes requested by blocks in use now and the most since reset_peak(); the blocks' bytes
  // (size classes) in use now and the most ever (the cache's limit).
  std::atomic<size_t> allocated_{0}, peak_{0}, held_{0}, high_water_{0};
};

CachingAllocator& instance() {
  static auto* a = [] {
    auto* created = new CachingAllocator();  // never destroyed: tensors may outlive statics
    // fork() waits for the lock, so that a thread that was allocating when another forked
    // (absent in the child) does not leave it held there: the child's first op deadlocked.
    pthread_atfork([] { instance().lock(); }, [] { instance().unlock(); },
                   [] { instance().unlock(); });
    return created;
  }();
  return *a;
}

}  // namespace

Allocator* allocator() { return &instance(); }
AllocatorStats allocator_stats() { return instance().stats(); }
void empty_cache() { instance().empty(); }
void reset_peak_stats() { instance().reset_peak(); }

}  // namespace kiln::cpu
