#pragma once
/// Internal: a recorded trace. A Program is the list of ops one call of the user's function ran,
/// over numbered values, with where each value without a producing op comes from. It is the
/// tracer's own IR: shape-free enough to replay, and partitioned (tracer/plan.h) into compiled
/// regions (kiln MLIR -> codegen::Executable) and ops run on eager kernels.
#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/meta.h"
#include "core/philox.h"
#include "eager/dispatch.h"

namespace kiln::tracer {

/// Where a value that no recorded op produced comes from.
enum class SourceKind : uint8_t {
  Arg,         ///< tensor argument `index` of the call
  ScalarArg,   ///< host-scalar argument `index`, made a 0-d tensor at run time (dynamic scalar)
  Constant,    ///< a host scalar wrapped as a 0-d tensor (`x * 2.0`): `scalar`
  Captured,    ///< a tensor the function captured from outside (held weakly, guarded)
  GradOf,      ///< the .grad, at call time, of the leaf that is value `index`
  Snapshot,    ///< a tensor created inside the function outside the dispatcher (arange, from
               ///< data): a copy of its contents at first use, materialised fresh per run
  GradOutput,  ///< the incoming gradient of output `index` (backward programs)
  HostInput,   ///< a host number read by `host` on every call (dispatch::host_input: an
               ///< optimizer's lr), made a wrapped 0-d tensor; `scalar`: the traced value
  SizeOf,      ///< a host number computed from a symbolic size (a mean's element count in its
               ///< backward, a loss's 2/n): `size` evaluated by size_value(), a wrapped 0-d tensor
};

/// A dim or an attribute integer that follows a symbolic size: value = factor * size of
/// (arg, dim) at run time, times (the size of (arg2, dim2) + offset2) when arg2 >= 0 (a batch
/// times a sequence length: `x.reshape({B * T, V})`, `{B * (T - 1)}`), plus `bias`, divided by
/// `divisor` as C++ divides integers (`n / 2`, `(n + 1) / 2`, `(n * m) / 3`), times `multiple`,
/// plus `offset` (a shifted slice `x[:, :T - 1]`). Products are never negative where
/// divisor > 1.
struct SymInt {
  int arg = -1, dim = 0;
  int64_t factor = 1;
  int arg2 = -1, dim2 = 0;
  int64_t offset = 0;
  int64_t offset2 = 0;
  int64_t divisor = 1;
  int64_t bias = 0;
  int64_t multiple = 1;  ///< times the quotient: `3 * (n / 2)` (the count of [n / 2, 3])
  /// `arg` (`arg2`) is a host-scalar argument whose integer value stands for the size (`dim`
  /// unused): `x.slice(0, 0, n)` with `n` passed by value.
  bool scalar = false, scalar2 = false;
  bool operator==(const SymInt&) const = default;
};

/// SourceKind::SizeOf: `sym + offset` evaluated at run time, as the traced constant's kind (an
/// integer or a float), or `numerator / (sym + offset)` when `reciprocal`. Floats are formed
/// by one correctly rounded division, as the C++ that made the traced constant did, so the
/// value is exact whenever `numerator` is (conforms() confirms it for each new size set).
/// `root`: `numerator / sqrt(sym + offset)` (an attention scale `1 / std::sqrt(d)`), or
/// `numerator * sqrt(sym + offset)` when not `reciprocal`, formed by a correctly rounded square
/// root and division or product, as C++ forms it.
struct SizeFormula {
  SymInt sym;
  int64_t offset = 0;
  bool reciprocal = false;
  bool root = false;
  double numerator = 1;
};

struct Source {
  SourceKind kind = SourceKind::Arg;
  int index = 0;
  Scalar scalar;
  std::weak_ptr<TensorImpl> captured;
  bool requires_grad = false;  ///< Captured: guarded
  /// GradOf: the .grad's layout when traced (guarded like an argument's: strides only when not
  /// contiguous). A trace with a dense .grad accumulates into it in place; an expanded one
  /// (set_grad(b.expand(...))) is replaced, as eager does.
  bool contiguous = true;
  Strides strides;
  Tensor snapshot;
  /// Snapshot made symbolic by generalize(), materialised at the run's sizes: `overwritten`
  /// (an `empty` that fill_/copy_ writes whole before anything reads it: the inside of
  /// zeros/ones/full), or `ramp` (arange: ramp_start + i * ramp_step along its one dim).
  bool overwritten = false;
  bool ramp = false;
  int64_t ramp_start = 0, ramp_step = 1;
  /// Snapshot that reaches the caller (an output, a view of one, a .grad): a fresh copy per
  /// run, as eager makes a new tensor each call (the caller may change it in place).
  bool reaches_caller = false;
  HostReader host;  ///< HostInput
  SizeFormula size;  ///< SizeOf
};

/// A SizeOf source's value when its `sym` evaluates to `n` (factor times the size), of the same
/// kind (integer or float) as the traced constant `traced`.
Scalar size_value(const SizeFormula& f, int64_t n, const Scalar& traced);

/// Where a symbolic integer sits in an op's attributes.
struct SymAttr {
  enum Field : uint8_t { Dims, Start, End } field;
  int index = 0;  // element of attrs.dims
  SymInt sym;
};

struct Node {
  enum class Kind : uint8_t {
    Op,        ///< a dispatched op (in-place ops already functionalised, see `in_place`)
    Read,      ///< a tensor value read to the host (item()): a guarded decision
    Callback,  ///< a host callback (kiln::print) that runs on every call
  };
  Kind kind = Kind::Op;
  OpKind op = OpKind::Add;
  OpAttrs attrs;
  Loc loc;
  /// The public function that issued the op (kiln::as_op: `cross_entropy` for its nll_loss),
  /// or nullptr: replayed errors carry its name, as eager's do.
  const char* public_op = nullptr;
  std::vector<int> in;   ///< value ids; -1 for an absent optional input
  /// Per input: whether it carried gradient history into the op while tracing (grad mode on
  /// and the tensor requiring grad). Re-running the forward for a create_graph backward detaches
  /// the others (x.detach(), values made under no_grad), as eager's graph left them out.
  std::vector<bool> in_required_grad;
  std::vector<int> out;  ///< value ids
  InferredMeta meta;     ///< what the dispatcher inferred at trace time
  /// copy_/fill_: in the functional program `out[0]` is the new value of `in[0]`.
  bool in_place = false;
  /// Random ops: attrs.offset - the generator offset at the start of the call.
  uint64_t rng_delta = 0;
  /// Random ops of a program with symbolic sizes (generalize()): 32-bit draws per element of
  /// the output; the op's offset is then the blocks that earlier random ops drew at the
  /// run's sizes (RunState::rng_offset), not rng_delta. 0: rng_delta holds.
  int rng_draws = 0;
  std::vector<SymAttr> sym_attrs;
  Scalar read_value;  ///< Read: the value seen while tracing
  int64_t read_index = 0;  ///< Read: the element read (row-major), of a to_vector() say
  std::function<void(const std::vector<Tensor>&)> callback;
  std::string callback_name;
};

struct ValueInfo {
  DType dtype = DType::Float32;
  Shape shape;
  bool wrapped = false;     ///< a wrapped host scalar (type promotion like a Scalar)
  Device device = Device::cpu();
  int source = -1;          ///< index into Program::sources, or -1 if an op produced it
  std::vector<SymInt> sym;  ///< per dim: arg < 0 when static
};

struct Program {
  std::vector<ValueInfo> values;
  std::vector<Source> sources;
  std::vector<Node> nodes;
  /// Host state the trace depends on (kiln::guarded, Module::is_training(), optimizer
  /// branches): guards of the specialisation, checked before a replay starts.
  std::vector<HostValue> host_values;
  /// Nodes [0, backward_begin) are the forward, the rest the traced backward (joint trace).
  size_t backward_begin = SIZE_MAX;
  /// Outputs of the function: a value id, or -1 with `output_constants[i]` (a host value).
  std::vector<int> outputs;
  std::vector<Scalar> output_constants;
  std::vector<bool> output_undefined;
  /// Outputs that were another tensor than their value's own, found by its geometry: a
  /// `x.detach()` (and whether it was then made a leaf that requires grad). Replays return
  /// the value detached, as eager returned a new tensor without x's autograd history.
  std::vector<std::pair<int, bool>> detached_outputs;
  /// In-place writes to arguments / captured tensors: (source index, final value id).
  std::vector<std::pair<int, int>> write_backs;
  /// .grad of leaves at the end of the call: (value id of the leaf, value id or -1 = none).
  std::vector<std::pair<int, int>> grad_assignments;
  /// Leaves (value ids) whose .grad backward found undefined and set: a guard, since a .grad
  /// defined at the call would be accumulated into instead (checked before each replay).
  std::vector<int> grad_undefined_at_call;
  /// For each .grad read at the call (values_from(p, SourceKind::GradOf), in order): the tensor
  /// it shared memory with when traced (grad_sharing()). A guard: two parameters' .grads that
  /// were one tensor got each other's gradients when replayed for separate ones, and back.
  std::vector<int> grad_sharing;
  /// (leaf value, value): the leaf's .grad at the call was value's tensor (the same elements),
  /// which already stood for another leaf's .grad or an argument. A guard, as grad_sharing.
  std::vector<std::pair<int, int>> grad_same_as;
  /// Backward: for each forward output value (by output position), its GradOutput value id;
  /// for each value requiring grad (inputs/captured), the value id of its gradient or -1.
  std::vector<int> grad_inputs;     // value ids of the differentiable sources
  std::vector<int> grad_results;    // gradient value id per grad_inputs entry (-1 = none)
  std::vector<int> grad_outputs;    // GradOutput value id per output (-1 = not differentiable)
  /// grad_reach[k][i]: output k has a differentiable path to grad_inputs[i] (the eager autograd
  /// graph seen while tracing). A replay whose output k gets no gradient leaves input i
  /// without one unless another output with a gradient reaches it, as eager backward does.
  std::vector<std::vector<bool>> grad_reach;
  /// shares_saved[k][l]: outputs k and l were computed through one eager autograd node that
  /// saved tensors (`e = x.exp()`, then `e * 2` and `e * x`): a backward from one without
  /// retain_graph frees them, and a backward from the other then raises, as in eager.
  std::vector<std::vector<bool>> shares_saved;
  /// Generator offset consumed by one call (random ops).
  uint64_t rng_consumed = 0;
  /// The random ops' offsets follow the sizes (Node::rng_draws), set by generalize().
  bool rng_symbolic = false;
  /// A tensor was mutated while another view of its storage was in use: replay runs every
  /// op on eager kernels on the real tensors (exact aliasing), see plan.cpp.
  bool aliased_mutation = false;
  std::string aliased_mutation_reason;
  /// Set when the function read a tensor another thread created during the trace (its ops are
  /// not recorded): the function runs eagerly from then on.
  std::string foreign_thread_reason;
  /// Why the outputs' backward could not be recorded (not because the function already ran
  /// it): the function runs eagerly, whose backward raises that error where eager's would.
  std::string backward_error;
  /// Why replays cannot give the outputs eager's autograd graph (an output computed from
  /// another output that requires grad): the function runs eagerly.
  std::string output_dependency;
  /// Where the function's own code took a pointer to tensor memory (data<T>(), raw_data()):
  /// the function runs eagerly, since a replay would skip what it did through the pointer.
  std::optional<Loc> raw_access;
  /// The first autograd node made before the trace that the function's backward() or grad()
  /// ran (an argument's or a captured tensor's history), named; empty when none. The trace
  /// holds that node's formula with this call's saved tensors, so it is not cached.
  std::string outside_backward;
  /// A backward() that ran on into autograd history made before the call (an argument's
  /// grad_fn; Recorder::run_deferred_backward): the gradients (value ids) that reached the
  /// grad_fns of `owners` (value ids of arguments / captured tensors). A replay runs the
  /// history its own call brings from them on eager autograd at the end of the call, after its
  /// write-backs and .grad assignments (a graph break), in the order of the backward() calls.
  struct HistoryBackward {
    std::vector<int> grads, owners;
    bool retain_graph = false;
    Loc loc;
  };
  std::vector<HistoryBackward> history_backwards;
  /// The first such history node, named (explain(), fullgraph's error); empty when none.
  std::string history_backward;
  /// Why replays cannot set the .grads the function's backward() set: it runs eagerly.
  std::string grad_alias_reason;
  /// Outputs the function called retain_grad() on: their replayed tensors retain grad too.
  std::vector<int> retained_outputs;
  /// Tensor arguments (positions) the function called retain_grad() on: a replay calls it on
  /// the call's arguments too.
  std::vector<int> retained_args;
  /// Argument values whose memory is that of a tensor some trace of the function captured,
  /// in a program that changes memory in place: a guard. `f(w)` for a captured `w` that `f`
  /// mutates is traced as mutating its argument; replaying either trace for the other kind of
  /// call would mutate the wrong tensor.
  std::vector<int> args_sharing_captured;

  int add_value(const ValueInfo& v) {
    values.push_back(v);
    return static_cast<int>(values.size()) - 1;
  }
};

/// Generator blocks that the random nodes before node `end` of `p` draw (Node::rng_draws per
/// element), when value v has numel_of(v) elements.
template <class NumelOf>
uint64_t rng_offset_before(const Program& p, size_t end, NumelOf numel_of) {
  uint64_t offset = 0;
  for (size_t i = 0; i < end && i < p.nodes.size(); ++i)
    if (const Node& n = p.nodes[i]; n.rng_draws)
      offset += philox::blocks(static_cast<uint64_t>(numel_of(n.out[0])) * n.rng_draws);
  return offset;
}

/// Value ids of `p` whose source has kind `kind`, in order.
std::vector<int> values_from(const Program& p, SourceKind kind);

/// The argument values among `arg_values` (values_from(p, SourceKind::Arg)) whose tensor
/// (`tensor_of(value id)`) shares memory with one of `captured` (tensors the function's traces
/// captured; compared by their storage now, which donate_buffers replaces on every call).
template <class TensorOf>
std::vector<int> args_sharing(const std::vector<int>& arg_values,
                              const std::vector<std::weak_ptr<TensorImpl>>& captured,
                              TensorOf&& tensor_of) {
  std::vector<int> out;
  if (arg_values.empty()) return out;
  std::vector<const StorageImpl*> storages;
  storages.reserve(captured.size());
  for (const auto& c : captured)
    if (auto impl = c.lock()) storages.push_back(impl->storage.get());
  for (int v : arg_values) {
    const Tensor& t = tensor_of(v);
    if (t.defined() && std::find(storages.begin(), storages.end(), t.storage().get()) != storages.end())
      out.push_back(v);
  }
  return out;
}

/// For each .grad value of `p` (values_from(p, SourceKind::GradOf)), the first other argument,
/// captured tensor or .grad value u whose tensor (`tensor_of(u)`) shares its memory, as 2·u, or
/// 2·u + 1 when it has the same elements (offset, shape, strides); -1 when none does. Empty when
/// the program reads no .grad.
template <class TensorOf>
std::vector<int> grad_sharing(const Program& p, TensorOf&& tensor_of) {
  std::vector<int> out;
  std::vector<int> candidates;
  for (size_t v = 0; v < p.values.size(); ++v) {
    const int s = p.values[v].source;
    if (s < 0) continue;
    const SourceKind k = p.sources[s].kind;
    if (k == SourceKind::Arg || k == SourceKind::Captured || k == SourceKind::GradOf)
      candidates.push_back(static_cast<int>(v));
  }
  // Each candidate's storage, fetched once: the pairs are compared by pointer.
  std::vector<const StorageImpl*> storage(candidates.size(), nullptr);
  bool any_grad = false;
  for (size_t i = 0; i < candidates.size(); ++i) {
    const Tensor& t = tensor_of(candidates[i]);
    if (t.defined()) storage[i] = t.storage().get();
    any_grad |= p.sources[p.values[candidates[i]].source].kind == SourceKind::GradOf;
  }
  if (!any_grad) return out;
  for (size_t i = 0; i < candidates.size(); ++i) {
    const int g = candidates[i];
    if (p.sources[p.values[g].source].kind != SourceKind::GradOf) continue;
    int shared = -1;
    for (size_t j = 0; j < candidates.size() && storage[i]; ++j) {
      if (j == i || storage[j] != storage[i]) continue;
      const Tensor& t = tensor_of(g);
      const Tensor& o = tensor_of(candidates[j]);
      const bool same = o.offset() == t.offset() && o.shape() == t.shape() &&
                        o.strides() == t.strides() && o.dtype() == t.dtype();
      shared = 2 * candidates[j] + (same ? 1 : 0);
      break;
    }
    out.push_back(shared);
  }
  return out;
}

/// Sets Source::reaches_caller of the snapshots that the caller gets back: an output, a .grad
/// or a write-back is the snapshot's value or a view of it (views share its memory on replay).
/// Call once the outputs are set.
void mark_snapshots_reaching_caller(Program& p);

}  // namespace kiln::tracer
