#pragma once
/// Storage: a ref-counted, 64-byte-aligned buffer shared by a tensor and all its views.
#include <algorithm>
#include <atomic>
#include <mutex>
#include <vector>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "core/device.h"

namespace kiln {

/// Allocator interface; backends provide one per device (backends/cpu: a caching allocator).
class Allocator {
 public:
  virtual ~Allocator() = default;
  /// Returns at least `nbytes` bytes aligned to kAlignment, or throws kiln::Error.
  virtual void* allocate(size_t nbytes) = 0;
  virtual void deallocate(void* ptr, size_t nbytes) = 0;
  virtual Device device() const = 0;
};

inline constexpr size_t kAlignment = 64;

class StorageImpl {
 public:
  /// Allocates `nbytes` bytes from `allocator`.
  StorageImpl(size_t nbytes, Allocator* allocator);
  ~StorageImpl();
  StorageImpl(const StorageImpl&) = delete;
  StorageImpl& operator=(const StorageImpl&) = delete;

  void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  Device device() const { return allocator_->device(); }

  /// Version counter shared by every view of this storage; bumped by in-place ops so that
  /// autograd can detect a saved tensor modified after it was saved.
  uint64_t version() const { return version_.load(std::memory_order_relaxed); }
  void bump_version() {
    version_.fetch_add(1, std::memory_order_relaxed);
    note_write();
  }
  /// The write epoch at the latest bump_version() by a thread other than `thread`
  /// (current_thread_number()), or 0: the tracer tells another thread's in-place write during
  /// a trace from the function's own, even when the function wrote the memory after it.
  uint64_t last_write_epoch_not_by(uint32_t thread) const {
    return last_writer_.load(std::memory_order_relaxed) == thread
               ? other_write_epoch_.load(std::memory_order_relaxed)
               : last_write_epoch_.load(std::memory_order_relaxed);
  }
  /// Starts a new write epoch and returns it: writes from then on are stamped with it or a
  /// later one (a trace starts one, then asks which writes are not its own). Writes only read
  /// the counter, so in-place ops on many threads do not contend for it.
  static uint64_t begin_write_epoch();
  /// Sets the counter (a storage that takes over another's role continues its count).
  void set_version(uint64_t v) { version_.store(v, std::memory_order_relaxed); }

  /// Counts the in-place ops autograd recorded on this memory (each gives some tensor on it a
  /// new gradient history). A view of a tensor that requires grad keeps the count it was taken
  /// at: a later recorded write makes its history stale. Writes autograd does not record (under
  /// no_grad: an optimizer step, load_state_dict) leave it, so such views stay usable, as in
  /// PyTorch.
  uint64_t history_version() const { return history_version_.load(std::memory_order_relaxed); }
  void bump_history_version() { history_version_.fetch_add(1, std::memory_order_relaxed); }

  /// Whether an in-place op recorded by autograd gave a tensor of `lineage` (TensorImpl) on
  /// this storage a gradient history it did not have (`h.slice(0, 0, 2).copy_(x)` for x that
  /// requires grad). The other views of that lineage take their region of the base's history
  /// when next used (eager/autograd.cpp, regenerate_view_history, as PyTorch); other tensors
  /// of it that cannot raise when used in a recorded op instead of losing a gradient silently.
  bool gained_history_in_place(uint64_t lineage) const {
    if (!any_gained_.load(std::memory_order_acquire)) return false;
    std::lock_guard<std::mutex> lock(gained_mu_);
    return std::find(gained_.begin(), gained_.end(), lineage) != gained_.end();
  }
  void set_gained_history_in_place(uint64_t lineage) {
    std::lock_guard<std::mutex> lock(gained_mu_);
    if (std::find(gained_.begin(), gained_.end(), lineage) == gained_.end())
      gained_.push_back(lineage);
    any_gained_.store(true, std::memory_order_release);
  }

  /// Creation order of storages in this process (strictly increasing). The tracer uses it to
  /// tell tensors created inside a traced function from tensors captured from outside.
  uint64_t serial() const { return serial_; }
  /// The serial the next storage will get.
  static uint64_t next_serial();
  /// A small number naming the thread that created this storage (current_thread_number() on
  /// it): the tracer tells a tensor made on another thread during a trace from the function's.
  uint32_t creator_thread() const { return creator_thread_; }
  /// The calling thread's number: unique among the process's threads, counted from 1.
  static uint32_t current_thread_number();

 private:
  void* data_;
  size_t nbytes_;
  Allocator* allocator_;
  std::atomic<uint64_t> version_{0};
  std::atomic<uint64_t> history_version_{0};
  std::atomic<bool> any_gained_{false};
  mutable std::mutex gained_mu_;
  std::vector<uint64_t> gained_;  // lineages, see gained_history_in_place
  void note_write();
  uint64_t serial_;
  uint32_t creator_thread_;
  // The latest writer thread and its epoch, and the latest epoch of a write by any other
  // thread: enough to answer last_write_epoch_not_by() for every thread.
  std::atomic<uint32_t> last_writer_{0};
  std::atomic<uint64_t> last_write_epoch_{0};
  std::atomic<uint64_t> other_write_epoch_{0};
};

using Storage = std::shared_ptr<StorageImpl>;

}  // namespace kiln
