#pragma once
/// StateJournal: undoes what a run of a function did to tensors that existed before it, so that
/// the function can run again from the same state. CompileOptions::check and kiln::compare run
/// a function more than once (eagerly, compiled); a training step writes its parameters, its
/// optimizer's state and their .grad, and each run must start from the caller's state.
#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

#include "eager/dispatch.h"

namespace kiln::tracer {

/// All of `t`'s storage as a flat tensor of t's dtype: a view sharing it, made by hand (no
/// autograd view tracking), for copies and restores of whole storages.
Tensor whole_storage(const Tensor& t);

class StateJournal final : public WriteObserver {
 public:
  /// Installs itself as the calling thread's write observer until destroyed (the previous
  /// observer is then restored). Inside another journal, it passes every write on to it.
  /// `keep_values` false: a shape-only run (dispatch::ShapeOnlyScope) writes no values, so
  /// only version counters and .grad are kept and given back.
  explicit StateJournal(bool keep_values = true);
  ~StateJournal() override;
  StateJournal(const StateJournal&) = delete;
  StateJournal& operator=(const StateJournal&) = delete;

  /// A storage made before the journal started and written in place since, with its contents before the first
  /// write (`before`, a flat copy of the whole storage) and the op that first wrote it.
  struct Written {
    Tensor whole;   // every element of the storage, flat, in the dtype it was written as
    Tensor before;  // a copy of `whole` taken before the first write (unless !keep_values)
    Loc loc;        // that write's op
    uint64_t version = 0, history_version = 0;  // the storage's counters then
  };
  const std::vector<Written>& written() const { return written_; }
  /// Whether `t`'s storage was written in place since the journal started.
  bool wrote(const Tensor& t) const { return t.defined() && written_at_.count(t.storage().get()); }

  /// Copies of the journaled storages' current contents (in written() order).
  std::vector<Tensor> current() const;
  /// Writes every journaled storage back to its contents before the first write and gives
  /// every changed .grad back its old tensor. The journal keeps recording afterwards.
  /// `versions`: the storages' version counters too (a caller's graph that saved them before
  /// the first write can then run its backward).
  void restore(bool versions = false);
  /// Where an in-place write that autograd recorded gave a tensor on a journaled storage a
  /// new gradient history (restore() cannot give the old one back): that write's op.
  std::optional<Loc> history_changed() const;

  /// From now on, an in-place write that autograd would record (grad mode on and an input
  /// requiring grad) into a storage made before the journal throws ShapeOnlyAbort before it
  /// happens: its new gradient history could not be given back (history_changed()).
  void refuse_history_writes() { refuse_history_writes_ = true; }

  void before_write(const OpCall& call) override;
  void before_grad_change(const Tensor& t) override;

 private:
  WriteObserver* outer_;
  bool keep_values_;
  bool refuse_history_writes_ = false;
  uint64_t first_new_serial_;  // storages made since the journal started are not state
  std::vector<Written> written_;
  std::unordered_map<const void*, size_t> written_at_;  // StorageImpl -> index in written_
  struct Grad {
    Tensor tensor;  // the tensor whose .grad changed (kept alive to give it back)
    Tensor before;  // its .grad then (may be undefined)
  };
  std::unordered_map<const void*, Grad> grads_;  // TensorImpl -> its first change
};

}  // namespace kiln::tracer
