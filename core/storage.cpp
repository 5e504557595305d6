#include "core/storage.h"

namespace kiln {
namespace {
std::atomic<uint64_t> g_storage_serial{1};
}
StorageImpl::StorageImpl(size_t nbytes, Allocator* allocator)
    : data_(allocator->allocate(nbytes)),
      nbytes_(nbytes),
      allocator_(allocator),
      serial_(g_storage_serial.fetch_add(1, std::memory_order_relaxed)) {}
uint64_t StorageImpl::next_serial() { return g_storage_serial.load(std::memory_order_relaxed); }
StorageImpl::~StorageImpl() { allocator_->deallocate(data_, nbytes_); }
}  // namespace kiln
