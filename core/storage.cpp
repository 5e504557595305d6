#include "core/storage.h"

namespace kiln {
namespace {
std::atomic<uint64_t> g_storage_serial{1};
std::atomic<uint32_t> g_thread_numbers{1};
std::atomic<uint64_t> g_write_epoch{1};
thread_local uint32_t t_thread_number = 0;
}  // namespace
uint32_t StorageImpl::current_thread_number() {
  if (t_thread_number == 0) t_thread_number = g_thread_numbers.fetch_add(1);
  return t_thread_number;
}
StorageImpl::StorageImpl(size_t nbytes, Allocator* allocator)
    : data_(allocator->allocate(nbytes)),
      nbytes_(nbytes),
      allocator_(allocator),
      serial_(g_storage_serial.fetch_add(1, std::memory_order_relaxed)),
      creator_thread_(current_thread_number()) {}
uint64_t StorageImpl::begin_write_epoch() {
  return g_write_epoch.fetch_add(1, std::memory_order_relaxed) + 1;
}
void StorageImpl::note_write() {
  const uint32_t me = current_thread_number();
  const uint64_t epoch = g_write_epoch.load(std::memory_order_relaxed);
  // Another thread wrote last: its write becomes the latest one not by this thread.
  if (last_writer_.load(std::memory_order_relaxed) != me) {
    other_write_epoch_.store(last_write_epoch_.load(std::memory_order_relaxed),
                             std::memory_order_relaxed);
    last_writer_.store(me, std::memory_order_relaxed);
  }
  last_write_epoch_.store(epoch, std::memory_order_relaxed);
}
uint64_t StorageImpl::next_serial() { return g_storage_serial.load(std::memory_order_relaxed); }
StorageImpl::~StorageImpl() { allocator_->deallocate(data_, nbytes_); }
}  // namespace kiln
