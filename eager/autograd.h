#pragma once
/// Reverse-mode automatic differentiation, define-by-run (like PyTorch's autograd).
///
/// Every differentiable op called with grad mode on and an input that requires grad records a
/// backward node (eager/derivatives.cpp holds the formulas, one per op). Tensor::backward() and
/// kiln::grad() run the recorded graph in reverse topological order without recursion, and free
/// it as they go unless retain_graph is set.
#include <mutex>
#include <vector>

#include "core/tensor.h"

namespace kiln {

/// Whether ops record backward nodes on the calling thread (default on).
bool is_grad_enabled();
void set_grad_enabled(bool enabled);

/// Whether `t`'s recorded history no longer describes its memory: it shares memory with a
/// tensor of its lineage that an in-place op gave a gradient history
/// (`h.slice(0, 0, 2).copy_(x)`; StorageImpl::gained_history_in_place) without having that
/// history itself, or it is a view of a tensor with history whose memory was written in place
/// after the view was taken — and its history cannot be regenerated from its base's (it is not
/// a view, or a leaf made from one, or its base is not contiguous; a view that can is
/// regenerated here, as PyTorch does on access). Using it in a recorded op raises kiln::Error
/// (its gradient would be lost); compiled calls with such a tensor run eagerly, which raises.
/// False for detach() results and no_grad views.
bool lost_in_place_history(const Tensor& t);

/// How many in-place ops on views gave their base a new gradient history (CopySlices) on this
/// thread so far. The tracer compares it around a trace (which runs the function on the
/// calling thread): such a function runs eagerly. Per thread, so that another thread's eager
/// training loop does not turn functions traced meanwhile eager.
uint64_t in_place_view_writes();

/// How many times a module's parameter or buffer was replaced by another tensor under the same
/// name (Module::register_parameter / register_buffer of an existing name: a swap, a tied
/// weight; or a submodule replaced, for each of its tensors) in this process. Compiled
/// functions compare it first; where it moved they check the tensors they captured with
/// parameter_unbound_at (a replay would read the old tensor), so that one module's swaps do
/// not retrace every compiled function.
uint64_t parameter_rebinds();
/// Notes that `old` was replaced in its module: bumps parameter_rebinds() and records the new
/// count as old's. Undefined `old`: a submodule was replaced (Module::register_module of an
/// existing name), which every compiled function traced before retraces for, since one may
/// have run the old submodule's ops without capturing a tensor of it (an activation).
void note_parameter_rebind(const Tensor& old);
/// The parameter_rebinds() count at which `impl` was last replaced in a module; 0 if never.
uint64_t parameter_unbound_at(const std::shared_ptr<TensorImpl>& impl);
/// The parameter_rebinds() count at the last submodule replacement; 0 if none.
uint64_t submodule_replaced_at();

/// How many backward passes with create_graph = true this thread has started. The tracer
/// compares it around a trace: a function that runs one (a gradient penalty, a Hessian-vector
/// product) runs eagerly, as its replays would return those gradients without their history.
uint64_t create_graph_backwards();
/// Whether Tensor::backward(create_graph = true) has printed its warning (once per process, as
/// PyTorch's): each leaf's .grad then holds the graph that computed it, a reference cycle.
bool create_graph_warning_shown();

/// Holds the lock that makes a leaf's .grad accumulation atomic (eager backward takes it around
/// each sum, as PyTorch's AccumulateGrad does). A compiled replay that reads a .grad and writes
/// the sum back holds it across both: two threads' replays, or a replay and an eager backward,
/// then never add to the same old .grad and lose one sum. Recursive: the holding thread may
/// run backward. Lock order: a thread that needs the random generator's lock too
/// (hold_generator, generator_state) takes that one first.
std::unique_lock<std::recursive_mutex> hold_leaf_grads();
/// Registers (once) the fork() handler that waits for both locks a replay may hold, the
/// generator's and the leaves' .grad lock (hold_generator and hold_leaf_grads call it).
void register_replay_fork_handlers();

/// RAII: disables gradient recording in its scope (like torch.no_grad()).
class NoGradGuard {
 public:
  NoGradGuard() : prev_(is_grad_enabled()) { set_grad_enabled(false); }
  ~NoGradGuard() { set_grad_enabled(prev_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool prev_;
};
using no_grad = NoGradGuard;

/// RAII: enables gradient recording in its scope (like torch.enable_grad()).
class EnableGradGuard {
 public:
  EnableGradGuard() : prev_(is_grad_enabled()) { set_grad_enabled(true); }
  ~EnableGradGuard() { set_grad_enabled(prev_); }
  EnableGradGuard(const EnableGradGuard&) = delete;
  EnableGradGuard& operator=(const EnableGradGuard&) = delete;

 private:
  bool prev_;
};
using enable_grad = EnableGradGuard;

/// Gradients of `outputs` with respect to `inputs` (torch.autograd.grad): returns one tensor per
/// input (undefined when allow_unused and the input is not reached). `grad_outputs` defaults to
/// ones for one-element outputs. .grad of leaves is not touched. retain_graph defaults to
/// create_graph. Throws kiln::Error when an input is unreachable and allow_unused is false.
std::vector<Tensor> grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                         const std::vector<Tensor>& grad_outputs = {}, bool create_graph = false,
                         std::optional<bool> retain_graph = std::nullopt, bool allow_unused = false,
                         Loc loc = Loc::current());

/// Sets .grad of every tensor in `params` to undefined (set_to_none, PyTorch's default).
void zero_grad(const std::vector<Tensor>& params);

}  // namespace kiln
