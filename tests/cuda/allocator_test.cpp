// The caching allocator's logic over a fake device memory.
#include <catch2/catch.hpp>

#include <functional>
#include <map>
#include <memory>
#include <thread>

#include "backends/cuda/allocator.h"

using namespace kiln;
using namespace kiln::cuda;

namespace {

constexpr size_t KiB = 1024, MiB = 1024 * 1024;

// Hands out increasing addresses up to `capacity` bytes and records every call.
class FakeMemory final : public DeviceMemory {
 public:
  explicit FakeMemory(size_t capacity) : capacity(capacity) {}
  ~FakeMemory() override {
    if (on_destroy) on_destroy();
  }
  std::function<void()> on_destroy;
  uint64_t alloc(size_t nbytes) override {
    ++allocs;
    if (in_use + nbytes > capacity) return 0;
    uint64_t a = next;
    next += nbytes + 4096;
    in_use += nbytes;
    blocks[a] = nbytes;
    return a;
  }
  void free(uint64_t address) override {
    ++frees;
    REQUIRE(blocks.count(address) == 1);
    in_use -= blocks[address];
    blocks.erase(address);
  }
  size_t capacity, in_use = 0;
  uint64_t next = 0x10000;
  int allocs = 0, frees = 0;
  std::map<uint64_t, size_t> blocks;
};

struct Fixture {
  explicit Fixture(size_t capacity = 1024 * MiB) {
    auto m = std::make_unique<FakeMemory>(capacity);
    memory = m.get();
    cache = std::make_unique<CachingAllocator>(std::move(m), "cuda:0");
  }
  FakeMemory* memory;
  std::unique_ptr<CachingAllocator> cache;
};

}  // namespace

TEST_CASE("sizes round to 512 B below 1 MiB and to 2 MiB from 1 MiB on") {
  CHECK(CachingAllocator::round_size(0) == 512);
  CHECK(CachingAllocator::round_size(1) == 512);
  CHECK(CachingAllocator::round_size(512) == 512);
  CHECK(CachingAllocator::round_size(513) == 1024);
  CHECK(CachingAllocator::round_size(1 * MiB - 1) == 1 * MiB);
  CHECK(CachingAllocator::round_size(1 * MiB) == 2 * MiB);
  CHECK(CachingAllocator::round_size(2 * MiB) == 2 * MiB);
  CHECK(CachingAllocator::round_size(2 * MiB + 1) == 4 * MiB);
  CHECK(CachingAllocator::round_size(100 * MiB + 3) == 102 * MiB);
}

TEST_CASE("freed blocks are reused for requests of the same rounded size") {
  Fixture f;
  uint64_t a = f.cache->allocate(1000);
  CHECK(f.memory->blocks.at(a) == 1024);
  f.cache->deallocate(a);
  uint64_t b = f.cache->allocate(900);  // rounds to 1024 too
  CHECK(b == a);
  CHECK(f.memory->allocs == 1);
  uint64_t c = f.cache->allocate(2000);  // another size class: a new block
  CHECK(c != a);
  CHECK(f.memory->allocs == 2);
  AllocatorStats s = f.cache->stats();
  CHECK(s.cache_hits == 1);
  CHECK(s.cache_misses == 2);
  CHECK(s.allocated_bytes == 1024 + 2048);
  CHECK(s.reserved_bytes == 1024 + 2048);
  CHECK(s.cached_bytes == 0);
}

TEST_CASE("stats follow allocations, frees and empty_cache") {
  Fixture f;
  uint64_t a = f.cache->allocate(3 * MiB);  // 4 MiB
  uint64_t b = f.cache->allocate(10 * KiB);
  AllocatorStats s = f.cache->stats();
  CHECK(s.allocated_bytes == 4 * MiB + 10 * KiB);
  CHECK(s.reserved_bytes == 4 * MiB + 10 * KiB);
  CHECK(s.peak_allocated_bytes == 4 * MiB + 10 * KiB);
  f.cache->deallocate(a);
  s = f.cache->stats();
  CHECK(s.allocated_bytes == 10 * KiB);
  CHECK(s.reserved_bytes == 4 * MiB + 10 * KiB);
  CHECK(s.cached_bytes == 4 * MiB);
  CHECK(s.peak_allocated_bytes == 4 * MiB + 10 * KiB);
  CHECK(f.memory->frees == 0);
  f.cache->empty_cache();
  s = f.cache->stats();
  CHECK(f.memory->frees == 1);
  CHECK(s.reserved_bytes == 10 * KiB);
  CHECK(s.cached_bytes == 0);
  CHECK(f.memory->blocks.count(a) == 0);
  CHECK(f.memory->blocks.count(b) == 1);  // blocks in use stay
  f.cache->deallocate(b);
  // The destructor returns cached blocks (to the fake memory, which it owns and destroys next:
  // count the frees on the way).
  int frees_before = f.memory->frees;
  auto seen = std::make_shared<std::pair<int, bool>>(0, false);  // frees, all blocks returned
  f.memory->on_destroy = [seen, m = f.memory] { *seen = {m->frees, m->blocks.empty()}; };
  f.cache.reset();
  CHECK(seen->first == frees_before + 1);
  CHECK(seen->second);
}

TEST_CASE("freeing an unknown address or twice is an error") {
  Fixture f;
  uint64_t a = f.cache->allocate(64);
  f.cache->deallocate(a);
  CHECK_THROWS_WITH(f.cache->deallocate(a), Catch::Contains("was not allocated by the cuda:0"));
  CHECK_THROWS_AS(f.cache->deallocate(12345), Error);
}

TEST_CASE("out of memory: the cache is emptied and the allocation retried once") {
  Fixture f(10 * MiB);
  uint64_t a = f.cache->allocate(4 * MiB);
  uint64_t b = f.cache->allocate(4 * MiB);
  f.cache->deallocate(a);
  f.cache->deallocate(b);  // 8 MiB cached in the 4 MiB class
  uint64_t c = f.cache->allocate(6 * MiB);  // device has 2 MiB left: flush, then it fits
  CHECK(c != 0);
  AllocatorStats s = f.cache->stats();
  CHECK(s.cache_flushes == 1);
  CHECK(s.cached_bytes == 0);
  CHECK(s.reserved_bytes == 6 * MiB);
  CHECK(s.allocated_bytes == 6 * MiB);
  CHECK(f.memory->in_use == 6 * MiB);
}

TEST_CASE("out of memory after the retry is a clear error and leaves the allocator usable") {
  Fixture f(10 * MiB);
  uint64_t a = f.cache->allocate(5 * MiB);  // 6 MiB
  uint64_t small = f.cache->allocate(1000);
  f.cache->deallocate(small);  // something cached, so a retry happens
  try {
    f.cache->allocate(7 * MiB);
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(e.op() == "cuda allocate");
    INFO(e.message());
    CHECK(e.message().rfind("out of memory: tried to allocate 8.00 MiB on cuda:0; 6.00 MiB "
                            "allocated, 6.00 MiB reserved",
                            0) == 0);
  }
  AllocatorStats s = f.cache->stats();
  CHECK(s.cache_flushes == 1);
  CHECK(s.allocated_bytes == 6 * MiB);
  // Without anything cached there is nothing to flush: no retry.
  int allocs = f.memory->allocs;
  CHECK_THROWS_WITH(f.cache->allocate(7 * MiB), Catch::Contains(": out of memory: tried to allocate 8.00 MiB"));
  CHECK(f.memory->allocs == allocs + 1);
  f.cache->deallocate(a);
  CHECK(f.cache->allocate(7 * MiB) != 0);  // flushes the cached 6 MiB and fits
}

TEST_CASE("the caching allocator is thread-safe") {
  Fixture f;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < 500; ++i) {
        uint64_t a = f.cache->allocate(512 * (1 + (i + t) % 4));
        uint64_t b = f.cache->allocate(3 * MiB);
        f.cache->deallocate(a);
        f.cache->deallocate(b);
      }
    });
  for (auto& th : threads) th.join();
  AllocatorStats s = f.cache->stats();
  CHECK(s.allocated_bytes == 0);
  CHECK(s.cache_hits + s.cache_misses == 4 * 500 * 2);
  CHECK(s.reserved_bytes == s.cached_bytes);
  CHECK(s.reserved_bytes == f.memory->in_use);
}
