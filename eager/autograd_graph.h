#pragma once
/// Internal: the autograd graph (nodes, edges, saved tensors, per-tensor autograd state).
#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/meta.h"

namespace kiln::autograd {

class Node;

/// Where a gradient goes: input slot `input_nr` of node `fn` (for a tensor: its grad_fn and
/// output number, or its leaf's AccumulateGrad node).
struct Edge {
  std::shared_ptr<Node> fn;
  uint32_t input_nr = 0;
  bool valid() const { return fn != nullptr; }
};

/// The error when a backward reaches a node whose saved tensors an earlier backward freed.
inline constexpr const char* kGraphFreedMessage =
    "trying to backward through the graph a second time (or to read saved tensors after they "
    "were freed); pass retain_graph=true to the first backward";

/// The user's line of the backward() or grad() call running on this thread (errors of the
/// backward pass name it), or `fallback` outside one.
Loc backward_call_site(Loc fallback = Loc::current());

/// A tensor saved for backward. Inputs are kept as they are; outputs are kept without their
/// autograd state (that would make a reference cycle through the node) and re-attached to the
/// node on unpack. The version at save time is checked on unpack.
class SavedTensor {
 public:
  SavedTensor() = default;
  SavedTensor(const Tensor& t, bool is_output, const std::shared_ptr<Node>& node);
  /// The saved tensor. Throws kiln::Error if it was freed by an earlier backward (without
  /// retain_graph) or modified in place since it was saved.
  Tensor unpack(const std::shared_ptr<Node>& node, const char* op) const;
  void release() { data_ = Tensor(); released_ = true; }
  bool defined() const { return data_.defined() || released_; }
  std::shared_ptr<TensorImpl> impl() const { return data_.impl_ptr(); }
  /// Whether unpack() would succeed now: not freed, not modified in place since saved.
  bool unpacks() const { return !released_ && (!data_.defined() || data_.version() == version_); }

 private:
  Tensor data_;
  uint64_t version_ = 0;
  bool is_output_ = false, requires_grad_ = false, released_ = false;
  uint32_t output_nr_ = 0;
};

/// A backward function: takes the gradient of each output, returns one gradient per next edge.
class Node : public std::enable_shared_from_this<Node> {
 public:
  Node();
  virtual ~Node();
  virtual std::string name() const = 0;
  /// grads[i] is the gradient of output i (undefined if none flowed).
  virtual std::vector<Tensor> apply(std::vector<Tensor>&& grads) = 0;
  /// Frees saved tensors after a backward without retain_graph.
  virtual void release() {}
  virtual int num_outputs() const { return 1; }

  std::vector<Edge> next_edges;
  /// Creation order; the engine runs later nodes first (like PyTorch's sequence numbers).
  uint64_t sequence_nr;
  /// Non-leaf tensors whose .grad should be kept (retain_grad), by output number.
  std::vector<std::pair<uint32_t, std::weak_ptr<TensorImpl>>> retained;
  /// Held while the engine runs the node, fills its retained .grads and releases it: threads
  /// running backward through one graph (a shared prefix) take a node one at a time, so the
  /// second finds its saved tensors released and raises, as PyTorch does. Both used to read
  /// and free them at once: heap corruption (found by a break-it pass).
  std::mutex run_mutex;
};

/// Accumulates the incoming gradient into a leaf tensor's .grad.
class AccumulateGrad final : public Node {
 public:
  explicit AccumulateGrad(std::weak_ptr<TensorImpl> leaf) : leaf_(std::move(leaf)) {}
  std::string name() const override { return "AccumulateGrad"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override;
  std::shared_ptr<TensorImpl> leaf() const { return leaf_.lock(); }

 private:
  std::weak_ptr<TensorImpl> leaf_;
};

/// The backward node of one recorded op: the op's formula from eager/derivatives.cpp.
class OpNode final : public Node {
 public:
  OpNode(const OpCall& call, const InferredMeta& meta);
  std::string name() const override;
  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override;
  void release() override;
  void save(const OpCall& call, const std::vector<Tensor>& outs);

  OpKind op;
  OpAttrs attrs;
  Loc loc;
  std::vector<TensorMeta> input_meta;   // shape/dtype of every input (undefined → empty)
  std::vector<bool> input_defined;
  std::vector<SavedTensor> saved_inputs, saved_outputs;
};

/// Autograd state of one tensor (core's AutogradMeta, filled in by eager/).
struct Meta final : AutogradMeta {
  bool requires_grad = false;
  bool retains_grad = false;
  Tensor grad;
  std::shared_ptr<Node> grad_fn;  // null for leaves
  uint32_t output_nr = 0;
  std::weak_ptr<AccumulateGrad> accumulator;  // leaves only, created on demand
  /// Set for views of tensors that require grad; in-place ops on them are rejected.
  bool is_view_of_grad_tensor = false;
  /// The storage's history_version when the view was made: if an in-place op recorded by
  /// autograd later changes the memory's history, the view's recorded history is stale: a
  /// recorded op using it first regenerates it from the base's (regenerate_view_history in
  /// autograd.cpp), or raises where it cannot (a leaf made from a view, a non-contiguous base).
  uint64_t view_version = 0;
  /// Asks for no gradient: a view made under no_grad (or a view of one) of memory that had
  /// gained a history in place; using it is then not an error (lost_in_place_history).
  bool detached = false;
  /// A view made under no_grad of a tensor that requires grad (or a view of such a view):
  /// writing it in place with grad mode on would change that tensor behind autograd's back.
  bool no_grad_view_of_grad_tensor = false;

  /// PyTorch's repr: the grad_fn of a non-leaf, else requires_grad=True on a leaf asking.
  std::string repr_suffix() const override {
    if (grad_fn) return "grad_fn=<" + grad_fn->name() + ">";
    return requires_grad ? "requires_grad=True" : "";
  }
};

/// The tensor's autograd Meta, or nullptr.
Meta* meta(const Tensor& t);
Meta& ensure_meta(const Tensor& t);
/// The edge a gradient for `t` flows into (invalid if t does not require grad).
Edge gradient_edge(const Tensor& t);

/// Gradients of `outputs` (each with its gradient in `grad_outputs`) that reach the edges of
/// `inputs`, without running the inputs' own histories: partial derivatives, every input taken
/// as a leaf, as AOTAutograd traces a compiled function's backward (the engine then carries
/// each gradient on through the input's history; flowing through it here as well would count
/// a path through an input that is computed from another twice). Undefined where no gradient
/// arrives. The graph is kept (retain_graph). With create_graph the gradients carry their own
/// history (double backward); without, they are detached.
std::vector<Tensor> partial_grads(const std::vector<Tensor>& outputs,
                                  const std::vector<Tensor>& inputs,
                                  const std::vector<Tensor>& grad_outputs,
                                  bool create_graph = false);
/// Runs the autograd graph from `edges`, with gradient `grads[i]` arriving at `edges[i]`
/// (without create_graph), accumulating into leaves as backward() does; errors name `loc` as
/// the backward() call. The part of a traced backward() that DispatchHook::
/// defers_backward_node held back, and its repetition on each replay.
void backward_from_edges(const std::vector<Edge>& edges, const std::vector<Tensor>& grads,
                         bool retain_graph, Loc loc);
/// The sequence_nr the next Node made (on any thread) will get: nodes with a smaller one
/// existed before.
uint64_t next_sequence_nr();
/// Installs the dispatcher hook that records backward nodes (idempotent).
void install_hook();

}  // namespace kiln::autograd
