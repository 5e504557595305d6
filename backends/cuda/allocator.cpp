#include "backends/cuda/allocator.h"

#include <array>
#include <utility>

#include "backends/cuda/copy.h"
#include "backends/cuda/driver.h"

namespace kiln::cuda {
namespace {

constexpr size_t kSmallGranularity = 512;
constexpr size_t kLargeThreshold = size_t{1} << 20;
constexpr size_t kLargeGranularity = size_t{2} << 20;

double mib(size_t bytes) { return static_cast<double>(bytes) / (1 << 20); }

size_t round_up(size_t n, size_t multiple) { return (n + multiple - 1) / multiple * multiple; }

}  // namespace

CachingAllocator::CachingAllocator(std::unique_ptr<DeviceMemory> memory, std::string device_name)
    : memory_(std::move(memory)), device_name_(std::move(device_name)) {}

CachingAllocator::~CachingAllocator() {
  // Only cached blocks go back; blocks still in use belong to live storages.
  try {
    empty_cache();
  } catch (...) {
  }
}

size_t CachingAllocator::round_size(size_t nbytes) {
  if (nbytes == 0) return kSmallGranularity;
  if (nbytes < kLargeThreshold) return round_up(nbytes, kSmallGranularity);
  return round_up(nbytes, kLargeGranularity);
}

uint64_t CachingAllocator::allocate(size_t nbytes, Loc loc) {
  size_t size = round_size(nbytes);
  KILN_CHECK(size >= nbytes, "cuda allocate", loc, "size {} bytes overflows", nbytes);
  std::lock_guard<std::mutex> lock(mutex_);
  uint64_t address = 0;
  if (auto it = free_blocks_.find(size); it != free_blocks_.end() && !it->second.empty()) {
    address = it->second.back();
    it->second.pop_back();
    stats_.cached_bytes -= size;
    ++stats_.cache_hits;
  } else {
    ++stats_.cache_misses;
    address = memory_->alloc(size);
    if (address == 0 && stats_.cached_bytes > 0) {
      // Cached blocks of other sizes may be what the device lacks: give them back, retry once.
      ++stats_.cache_flushes;
      release_cached_locked();
      address = memory_->alloc(size);
    }
    if (address == 0)
      throw Error("cuda allocate",
                  fmt::format("out of memory: tried to allocate {:.2f} MiB on {}; {:.2f} MiB "
                              "allocated, {:.2f} MiB reserved by kiln (cached blocks were "
                              "freed and the allocation retried); free tensors or use smaller "
                              "batches",
                              mib(size), device_name_, mib(stats_.allocated_bytes),
                              mib(stats_.reserved_bytes)),
                  loc);
    stats_.reserved_bytes += size;
  }
  live_blocks_.emplace(address, size);
  stats_.allocated_bytes += size;
  stats_.peak_allocated_bytes = std::max(stats_.peak_allocated_bytes, stats_.allocated_bytes);
  return address;
}

void CachingAllocator::deallocate(uint64_t address) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = live_blocks_.find(address);
  KILN_CHECK(it != live_blocks_.end(), "cuda deallocate", Loc::current(),
             "address {:#x} was not allocated by the {} allocator (or was freed twice)", address,
             device_name_);
  size_t size = it->second;
  live_blocks_.erase(it);
  free_blocks_[size].push_back(address);
  stats_.allocated_bytes -= size;
  stats_.cached_bytes += size;
}

void CachingAllocator::release_cached_locked() {
  for (auto& [size, addresses] : free_blocks_) {
    for (uint64_t a : addresses) {
      memory_->free(a);
      stats_.reserved_bytes -= size;
      stats_.cached_bytes -= size;
    }
    addresses.clear();
  }
  free_blocks_.clear();
}

void CachingAllocator::empty_cache() {
  std::lock_guard<std::mutex> lock(mutex_);
  release_cached_locked();
}

AllocatorStats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

void CachingAllocator::reset_peak_stats() {
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.peak_allocated_bytes = stats_.allocated_bytes;
}

// ---- the real device ----

namespace {

constexpr int kMaxDevices = 64;

class DriverMemory final : public DeviceMemory {
 public:
  explicit DriverMemory(int device) : device_(device) {}
  uint64_t alloc(size_t nbytes) override {
    set_current_device(device_);
    CUdeviceptr p = 0;
    CUresult r = driver("cuda allocate").cuMemAlloc(&p, nbytes);
    if (r == kCudaErrorOutOfMemory) return 0;
    check(r, "cuMemAlloc");
    return p;
  }
  void free(uint64_t address) override {
    set_current_device(device_);
    // Kernels still queued on the kiln stream may use the block (launches are asynchronous).
    check(driver("cuda deallocate").cuStreamSynchronize(kiln_stream(device_)),
          "cuStreamSynchronize");
    check(driver("cuda deallocate").cuMemFree(address), "cuMemFree");
  }

 private:
  int device_;
};

class DeviceAllocator final : public Allocator {
 public:
  explicit DeviceAllocator(int device)
      : device_(device),
        cache_(std::make_unique<DriverMemory>(device), Device::cuda(device).str()) {}
  void* allocate(size_t nbytes) override {
    // The availability check comes first so that the message is "no CUDA device: ...".
    driver("cuda allocate");
    return reinterpret_cast<void*>(cache_.allocate(nbytes));
  }
  void deallocate(void* ptr, size_t) override {
    // Storages may die after the driver is gone (process exit); then there is nothing to free.
    if (!is_available()) return;
    cache_.deallocate(reinterpret_cast<uint64_t>(ptr));
  }
  Device device() const override { return Device::cuda(device_); }
  CachingAllocator& cache() { return cache_; }

 private:
  int device_;
  CachingAllocator cache_;
};

DeviceAllocator& device_allocator(int device, Loc loc) {
  driver("cuda allocator", loc);
  KILN_CHECK(device >= 0 && device < device_count() && device < kMaxDevices, "cuda allocator",
             loc, "device cuda:{} does not exist ({} CUDA device(s) found)", device,
             device_count());
  static std::mutex mutex;
  // Never destroyed: storages freed during static destruction still reach their allocator.
  static auto* allocators = new std::array<DeviceAllocator*, kMaxDevices>{};
  std::lock_guard<std::mutex> lock(mutex);
  DeviceAllocator*& a = (*allocators)[device];
  if (!a) a = new DeviceAllocator(device);
  return *a;
}

}  // namespace

Allocator* allocator(int device) { return &device_allocator(device, Loc::current()); }
CachingAllocator& caching_allocator(int device) {
  return device_allocator(device, Loc::current()).cache();
}

}  // namespace kiln::cuda
