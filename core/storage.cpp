#include "core/storage.h"

namespace kiln {
StorageImpl::StorageImpl(size_t nbytes, Allocator* allocator)
    : data_(allocator->allocate(nbytes)), nbytes_(nbytes), allocator_(allocator) {}
StorageImpl::~StorageImpl() { allocator_->deallocate(data_, nbytes_); }
}  // namespace kiln
