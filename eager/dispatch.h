#pragma once
/// The dispatcher: the one path every op call takes.
///
///   validate + infer shapes/dtypes (core/meta.h)
///   → tracer hook (thread-local; used by compile())
///   → view construction, or input dtype conversion + output allocation + backend kernel
///   → version-counter bump for in-place ops
///   → autograd hook (records a backward node when an input requires grad)
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/meta.h"

namespace kiln {

namespace autograd {
class Node;
struct Edge;
}

/// Reads a host value for a compiled function at call time; std::nullopt when the state it
/// reads is gone (its owner was destroyed): the compiled function then traces again.
using HostReader = std::function<std::optional<Scalar>()>;

/// Host state a traced function's result depends on (see dispatch::note_host_value).
struct HostValue {
  const void* key = nullptr;  ///< identifies the state (one guard per key and `what`)
  HostReader reader;          ///< reads it again on every call
  Scalar value;               ///< the value seen while tracing
  std::string what;           ///< for explain(): "kiln::guarded", "Dropout.is_training()"
  Loc loc;
};

/// An extension point on the dispatch path. Hooks see every op with its validated metadata.
class DispatchHook {
 public:
  virtual ~DispatchHook() = default;
  /// Called before the kernel. Return true if the hook produced `outs` itself (e.g. a tracer
  /// computing with symbolic values); the kernel is then skipped.
  virtual bool before_kernel(const OpCall& call, const InferredMeta& meta,
                             std::vector<Tensor>& outs) {
    return false;
  }
  /// Called once the outputs exist.
  virtual void after_kernel(const OpCall& call, const InferredMeta& meta,
                            std::vector<Tensor>& outs) {}
  /// Called (tracer hook only) after autograd changed the .grad of leaf tensor `leaf`
  /// (backward accumulating into it, set_grad, zero_grad).
  virtual void on_grad_assigned(const Tensor& leaf) {}
  /// Called (tracer hook only) when backward is about to give leaf tensor `leaf` its first
  /// .grad, or when `leaf.grad()` is read and undefined: the result depends on the .grad being
  /// undefined (else backward would accumulate, an optimizer would not skip the parameter).
  virtual void on_grad_found_undefined(const Tensor& leaf) {}
  /// Called (tracer hook only) when `leaf.grad()` returns a defined `grad`: the function reads
  /// that leaf's current .grad (re-read on every replay), not a fixed tensor.
  virtual void on_grad_read(const Tensor& leaf, const Tensor& grad) {}
  /// Called (tracer hook only) before backward() or grad() runs `node` (not the tracer's own
  /// partial derivatives): the tracer sees whether backward ran history made before the trace.
  virtual void on_backward_node(const autograd::Node& node) {}
  /// Asked (tracer hook only) by a backward() without create_graph before it runs `node`:
  /// true defers the node. The engine then runs no deferred node nor any node behind one, and
  /// passes the gradients that reached them to run_deferred_backward() at the end. The tracer
  /// defers the autograd history made before the trace (an argument's grad_fn), which the
  /// next call may bring anew: a replay runs that part on eager autograd (a graph break).
  virtual bool defers_backward_node(const autograd::Node& node) { return false; }
  /// Called (tracer hook only) at the end of a backward() that deferred nodes: `edges[i]` got
  /// gradient `grads[i]`. The hook must run that backward (autograd::backward_from_edges).
  virtual void run_deferred_backward(const std::vector<autograd::Edge>& edges,
                                     const std::vector<Tensor>& grads, bool retain_graph) {}
  /// Called (tracer hook only) when the traced function's result depends on host state read
  /// through `reader` (kiln::guarded, Module::is_training(), an optimizer's host branches); the
  /// tracer guards the value read now, re-read at every call (dispatch::note_host_value).
  virtual void on_host_value(const HostValue& value) {}
  /// Called (tracer hook only) when the traced function itself writes the host state `key`
  /// (Module::train / eval): `apply` makes the same write, on every call
  /// (dispatch::note_host_write).
  virtual void on_host_write(const void* key, const std::string& what,
                             const std::function<void()>& apply, Loc loc) {}
  /// Called (tracer hook only) for `t`, a 0-d wrapped host number made by
  /// dispatch::host_input: the tracer makes it a runtime input read by `reader` on every call.
  virtual void on_host_input(const Tensor& t, const HostReader& reader, Loc loc) {}
  /// True when this hook would neither check nor record `call` nor the copy of its result into
  /// call.inputs[0] (dispatch::call_in_place then runs without it).
  virtual bool ignores_in_place(const OpCall& call) const { return false; }
};

/// Sees writes to tensors that may hold state the caller owns, before they happen: in-place ops
/// (copy_, fill_ and every op written with them) and changes of a tensor's .grad (backward,
/// set_grad, zero_grad). tracer::StateJournal uses it to undo a run of a function.
class WriteObserver {
 public:
  virtual ~WriteObserver() = default;
  /// `call.inputs[0]` is about to be written in place by `call` (its other inputs are what
  /// the op reads; call.loc is its line).
  virtual void before_write(const OpCall& call) = 0;
  /// The .grad of `t` is about to change (the old .grad tensor itself is not written).
  virtual void before_grad_change(const Tensor& t) = 0;
};

namespace dispatch {

/// Installs the write observer for the calling thread (nullptr removes it); returns the old one.
WriteObserver* set_write_observer(WriteObserver* observer);
/// The calling thread's write observer (nullptr when none).
WriteObserver* write_observer();

/// Installs the tracer hook for the calling thread (nullptr removes it); returns the old one.
DispatchHook* set_tracer_hook(DispatchHook* hook);

/// While alive, the calling thread's ops run for their metadata only: checks, shape/dtype
/// inference, hooks (tracer, autograd), views and version counters as usual, but outputs are
/// allocated uninitialised and no kernel runs, so nothing is written. The tracer confirms a
/// symbolic specialisation for new sizes this way (tracer/README.md, "shape-only runs").
/// `ShapeOnlyScope(false)` turns kernels back on inside one (the tracer's own computations).
class ShapeOnlyScope {
 public:
  explicit ShapeOnlyScope(bool shape_only = true);
  ~ShapeOnlyScope();
  ShapeOnlyScope(const ShapeOnlyScope&) = delete;
  ShapeOnlyScope& operator=(const ShapeOnlyScope&) = delete;

 private:
  bool previous_;
};
/// Whether the calling thread is inside a ShapeOnlyScope (kernels off).
bool shape_only();
/// The calling thread's tracer hook (nullptr when not tracing).
DispatchHook* tracer_hook();
/// Installs the process-wide autograd hook (nullptr removes it); returns the old one.
DispatchHook* set_autograd_hook(DispatchHook* hook);

/// Runs `call` and returns its outputs. Throws kiln::Error for invalid inputs.
std::vector<Tensor> call(OpCall&& call);

/// Runs the elementwise `call` (a Unary or Binary op) and writes its result into its first
/// input x, as `x.copy_(call1(call))` would, without the temporary: `x += y` and the optimizers'
/// updates use it. Does nothing and returns false when it cannot, and the caller then computes
/// out of place and copies: the result's shape or dtype, or the compute dtype, differ from x's;
/// x is not a contiguous CPU tensor; another input overlaps x other than exactly; a tracer is
/// recording; autograd would check or record the write; or the op checks input values (its
/// error must leave x untouched). index_copy (Tensor::index_copy_) is taken too, when its
/// index and source share no storage with x: its kernel checks the indices before writing and
/// writes only the indexed slices. Throws kiln::Error as call() does for invalid inputs.
bool call_in_place(OpCall&& call);

/// How many calls of ops that check input values (value_checks.h: indices, class indices,
/// integer divisors) raised kiln::Error on this thread so far, and the last one's text. The
/// tracer compares the count around a trace: a function that caught such an error took a path
/// that no guard of a trace covers.
uint64_t op_errors();
const std::string& last_op_error();
/// call() for single-output ops.
Tensor call1(OpCall&& call);

/// A new contiguous tensor with uninitialised elements, from the device's allocator
/// (cuda::allocator(i) for Device::cuda(i)). Throws kiln::Error "no CUDA device: ..." for a
/// CUDA device when CUDA is unavailable.
Tensor empty(const Shape& shape, DType dtype, Device device = Device::cpu());

/// The kernels of a non-cpu device: computes op `call` into `outs`, which the dispatcher has
/// allocated on the inputs' device with the shapes/dtypes of `meta` (for in-place ops, outs[0]
/// is inputs[0]). Unlike cpu kernels, device kernels see the inputs in their own dtypes (the
/// dispatcher converts nothing; meta.compute_dtype says what to compute in) and may see 0-d
/// cpu "wrapped number" inputs (Python-style scalars). Views never reach the kernel.
using DeviceKernel = void (*)(const OpCall& call, const InferredMeta& meta,
                              std::span<Tensor> outs);
/// Registers the kernel provider for `type` (nullptr removes it); returns the old one. For
/// CUDA it is installed by kiln's codegen; without one, every non-view op on CUDA tensors
/// throws kiln::Error "<op>: no CUDA kernels registered ...".
DeviceKernel set_device_kernel(DeviceType type, DeviceKernel kernel);

/// A 0-d tensor holding host scalar `s` marked as a wrapped number (promotes like a Scalar).
Tensor wrap_scalar(Scalar s);

/// Inside a traced (compiled) function, makes its specialisation depend on host state: the
/// value `reader` gives now is guarded and `reader` is called again on every call of the
/// compiled function (before it replays anything); a different value traces again (or picks
/// the entry traced for it), and explain() names `what` and `loc`. No-op, without calling
/// `reader`, when nothing is being traced. `key` identifies the state: a function reading the
/// same key (and `what`) twice gets one guard. kiln::guarded, Module::is_training() and the
/// optimisers' host branches use it.
void note_host_value(const void* key, std::string_view what,
                     const std::function<HostReader()>& make, Loc loc);

/// Inside a traced (compiled) function, a write of host state `key` that the function makes
/// itself (Module::train / eval at the start of a training step): `apply`, which makes the same
/// write, runs on every call at this point of the function, and reads of `key` later in the
/// same trace are not guarded, their value being the function's own. A guard on the value at
/// the call could never hold after an epoch's eval() and traced every epoch again (a break-it
/// pass filled the cache with 8 identical entries). No-op when nothing is being traced.
void note_host_write(const void* key, std::string_view what, std::function<void()> apply,
                     Loc loc);

/// `value` as a 0-d wrapped host number (type promotion like a Scalar operand) that, inside a
/// traced function, is a runtime input of the compiled graph read by `reader` on every call
/// instead of a constant of the trace: a change between calls takes effect without a
/// recompile. Outside a trace it is just wrap_scalar(value). The optimisers' hyperparameters
/// use it (nn/optim.h). `reader` must give a value of `value`'s kind (floating, integer, bool).
Tensor host_input(Scalar value, const std::function<HostReader()>& make, Loc loc);

}  // namespace dispatch
}  // namespace kiln
