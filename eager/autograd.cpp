// The autograd engine: recording hook, graph nodes, backward execution, Tensor's autograd methods.
#include "eager/autograd.h"

#include <algorithm>
#include <atomic>
#include <optional>
#include <pthread.h>
#include <queue>
#include <unordered_map>
#include <unordered_set>

#include "backends/cpu/allocator.h"
#include "eager/autograd_graph.h"
#include "eager/derivatives.h"
#include "eager/dispatch.h"
#include "eager/factories.h"
#include "eager/ops.h"

namespace kiln {
namespace autograd {
namespace {

thread_local bool t_grad_enabled = true;
// Guards what threads running backward concurrently share: a leaf's .grad and its
// AccumulateGrad node (PyTorch locks gradient accumulation the same way). Recursive: under
// create_graph, accumulating records ops (clone, add), whose inputs' gradient_edge locks again.
// A compiled replay holds it for the whole replay (hold_leaf_grads), after the generator's.
std::recursive_mutex g_leaf_mu;
// fork() waits for it (and for the generator's lock, which replays take first), so the child's
// copy is not held by a thread that does not exist there: its first recorded op hung. The
// handler is registered when this lock or a replay's generator lock is first taken, after the
// allocator's (created first if need be). fork() runs prepare handlers in reverse order of
// registration, so this one waits for a replay before the allocator's handler takes the
// allocator's lock, which the replay may still need (registered earlier, fork held the
// allocator's lock and waited for this one, held by a replay waiting for the allocator).
std::recursive_mutex* g_fork_generator = nullptr;
void register_fork_handlers() {
  cpu::allocator();  // the allocator's handler first, whatever allocated before
  pthread_atfork(
      [] {
        g_fork_generator = hold_generator().release();
        g_leaf_mu.lock();
      },
      [] {
        g_leaf_mu.unlock();
        g_fork_generator->unlock();
      },
      // The generator's own handler (eager/factories.cpp) makes the child's generator lock anew.
      [] { new (&g_leaf_mu) std::recursive_mutex(); });
}
std::atomic<uint64_t> g_sequence{0};

// Deep graphs (100k nodes) must not be destroyed recursively: a dying node moves what it
// owns here, and the outermost destructor frees it iteratively.
thread_local std::vector<std::shared_ptr<void>>* t_graveyard = nullptr;

bool is_differentiable_dtype(DType t) { return is_floating(t); }

}  // namespace

// ---------------------------------- SavedTensor ----------------------------------

SavedTensor::SavedTensor(const Tensor& t, bool is_output, const std::shared_ptr<Node>& node)
    : version_(t.version()), is_output_(is_output) {
  Meta* m = meta(t);
  requires_grad_ = is_output || (m && m->requires_grad);  // a recorded op's output requires grad
  if (is_output) {
    data_ = t.detach();  // no autograd state: the node must not own itself
    output_nr_ = 0;      // every recorded op has one output
  } else {
    data_ = t;
  }
}

namespace {
thread_local std::optional<Loc> t_backward_site;

// Sets backward_call_site() for the duration of a backward() or grad() call.
class BackwardSite {
 public:
  explicit BackwardSite(Loc loc) : previous_(t_backward_site) { t_backward_site = loc; }
  ~BackwardSite() { t_backward_site = previous_; }

 private:
  std::optional<Loc> previous_;
};
}  // namespace

Loc backward_call_site(Loc fallback) { return t_backward_site.value_or(fallback); }

Tensor SavedTensor::unpack(const std::shared_ptr<Node>& node, const char* op) const {
  KILN_CHECK(!released_, op, backward_call_site(), "{}", kGraphFreedMessage);
  if (!data_.defined()) return data_;
  KILN_CHECK(data_.version() == version_, op, backward_call_site(),
             "one of the tensors needed for gradient computation has been modified by an "
             "in-place operation: the saved {} tensor of shape {} is at version {}, expected "
             "version {}",
             is_output_ ? "output" : "input", to_string(data_.shape()), data_.version(), version_);
  if (!is_output_ || !requires_grad_) return data_;
  // Re-attach the output to its node so a create_graph backward can differentiate through it.
  Tensor t(std::make_shared<TensorImpl>(*data_.impl()));
  t.impl()->autograd.reset();
  Meta& m = ensure_meta(t);
  m.requires_grad = true;
  m.grad_fn = node;
  m.output_nr = output_nr_;
  return t;
}

// ------------------------------------- Node -------------------------------------

Node::Node() : sequence_nr(g_sequence.fetch_add(1, std::memory_order_relaxed)) {}

uint64_t next_sequence_nr() { return g_sequence.load(std::memory_order_relaxed); }

Node::~Node() {
  std::vector<std::shared_ptr<void>> local;
  bool outermost = t_graveyard == nullptr;
  if (outermost) t_graveyard = &local;
  for (Edge& e : next_edges)
    if (e.fn) t_graveyard->push_back(std::move(e.fn));
  if (auto* op = dynamic_cast<OpNode*>(this)) {
    for (auto* list : {&op->saved_inputs, &op->saved_outputs})
      for (SavedTensor& s : *list)
        if (auto p = s.impl()) {
          s = SavedTensor();
          t_graveyard->push_back(std::move(p));
        }
  }
  if (outermost) {
    while (!local.empty()) {
      std::shared_ptr<void> p = std::move(local.back());
      local.pop_back();
      p.reset();  // may run nested destructors, which push here instead of recursing
    }
    t_graveyard = nullptr;
  }
}

// A .grad's own copy of an incoming gradient (as PyTorch): the gradient may be the caller's
// tensor, another .grad's, or flow on unchanged to other nodes. Under create_graph (grad mode
// on during backward) the copy is recorded, so the .grad keeps its history.
namespace {
Tensor private_grad_copy(const Tensor& g) {
  return is_grad_enabled() ? g.clone() : g.detach().clone();
}
}  // namespace

std::vector<Tensor> AccumulateGrad::apply(std::vector<Tensor>&& grads) {
  auto impl = leaf_.lock();
  if (!impl || !grads[0].defined()) return {};
  register_replay_fork_handlers();
  std::lock_guard<std::recursive_mutex> lock(g_leaf_mu);
  Tensor leaf(impl);
  Meta& m = ensure_meta(leaf);
  Tensor g = grads[0];
  if (auto* o = dispatch::write_observer()) o->before_grad_change(leaf);
  if (!m.grad.defined()) {
    if (auto* hook = dispatch::tracer_hook()) hook->on_grad_found_undefined(leaf);
    m.grad = private_grad_copy(g);
    if (auto* hook = dispatch::tracer_hook()) hook->on_grad_assigned(leaf);
    return {};
  }
  // The sum reads this leaf's .grad: a trace re-reads it at each call, and guards that it is
  // the tensor it was (two leaves may share one .grad).
  if (auto* hook = dispatch::tracer_hook()) hook->on_grad_read(leaf, m.grad);
  if (is_grad_enabled()) {
    m.grad = add(m.grad, g);  // create_graph: the sum keeps the history of both
  } else if (m.grad.is_non_overlapping_and_dense()) {
    // In place, as PyTorch's AccumulateGrad: a .grad the caller holds sees the new sum.
    Tensor held = m.grad.detach();
    held += g;
  } else {
    m.grad = add(m.grad.detach(), g);  // a .grad set to an expanded view cannot take the sum
  }
  if (auto* hook = dispatch::tracer_hook()) hook->on_grad_assigned(leaf);
  return {};
}

// ------------------------------------ OpNode ------------------------------------

OpNode::OpNode(const OpCall& call, const InferredMeta&) : op(call.op), attrs(call.attrs), loc(call.loc) {
  for (const Tensor& t : call.inputs) {
    input_defined.push_back(t.defined());
    input_meta.push_back(t.defined() ? TensorMeta::of(t) : TensorMeta{});
    next_edges.push_back(t.defined() ? gradient_edge(t) : Edge{});
  }
}

void OpNode::save(const OpCall& call, const std::vector<Tensor>& outs) {
  const SaveSpec& spec = save_spec(op);
  auto self = shared_from_this();
  uint8_t mask = spec.inputs_mask;
  // Save only what the wanted gradients read, so that e.g. `h *= 3` (mul, then an in-place
  // write into h) does not invalidate a saved copy of h that no formula needs.
  bool need_a = next_edges[0].valid(), need_b = next_edges.size() > 1 && next_edges[1].valid();
  if (op == OpKind::Mul) mask = (need_b ? 1 : 0) | (need_a ? 2 : 0);
  if (op == OpKind::Div) mask = 2 | (need_b ? 1 : 0);
  if (op == OpKind::Remainder) mask = need_b ? 3 : 0;  // da = g; db = -g·floor(a / b)
  if (op == OpKind::FloorDivide) mask = 0;             // zero gradients
  if (op == OpKind::Matmul) mask = (need_b ? 1 : 0) | (need_a ? 2 : 0);  // dA = g·Bᵀ, dB = Aᵀ·g
  if (op == OpKind::Addmm) {  // addmm(bias, m1, m2): dm1 reads m2, dm2 reads m1
    bool need_m1 = next_edges[1].valid(), need_m2 = next_edges[2].valid();
    mask = (need_m1 ? 4 : 0) | (need_m2 ? 2 : 0);
  }
  saved_inputs.resize(call.inputs.size());
  for (size_t i = 0; i < call.inputs.size(); ++i)
    if (i < 8 && (mask >> i & 1) && call.inputs[i].defined())  // a cat has more inputs
      saved_inputs[i] = SavedTensor(call.inputs[i], false, self);
  // pow's output serves only d/d(exponent): y = x^2; y += 1 is fine, as in PyTorch.
  bool save_output = spec.output && !(op == OpKind::Pow && !need_b);
  if (save_output) saved_outputs.push_back(SavedTensor(outs[0], true, self));
}

std::string OpNode::name() const {
  std::string n(op_name(op));
  // snake_case op name → "SnakeCaseBackward"
  std::string out;
  bool up = true;
  for (char c : n) {
    if (c == '_') {
      up = true;
      continue;
    }
    out += up ? static_cast<char>(std::toupper(c)) : c;
    up = false;
  }
  return out + "Backward";
}

std::vector<Tensor> OpNode::apply(std::vector<Tensor>&& grads) {
  auto self = shared_from_this();
  const char* nm = op_name(op).data();
  BackwardContext ctx{op, attrs, loc, input_meta, {}, {}, {}};
  for (size_t i = 0; i < saved_inputs.size(); ++i)
    ctx.inputs.push_back(saved_inputs[i].unpack(self, nm));
  if (!saved_outputs.empty()) ctx.output = saved_outputs[0].unpack(self, nm);
  for (const Edge& e : next_edges) ctx.needs_grad.push_back(e.valid());
  if (!grads[0].defined()) return std::vector<Tensor>(next_edges.size());
  std::vector<Tensor> out;
  try {
    out = derivative(ctx, grads[0]);
  } catch (const Error& e) {
    // Memory running out in a derivative named kiln's allocator and its source line (break-it
    // pass): name the op differentiated, where it was recorded, and the backward() call.
    if (e.message().find("out of memory") == std::string::npos) throw;
    throw Error(nm, fmt::format("{} (computing its gradient; the op was recorded at {}:{})",
                                e.message(), loc.file_name(), loc.line()),
                backward_call_site(loc));
  }
  out.resize(next_edges.size());
  // A gradient takes its input's dtype (a float32 input of a float64 product gets a float32
  // gradient, as PyTorch's engine casts), so a leaf's .grad has the leaf's dtype.
  for (size_t i = 0; i < out.size() && i < input_meta.size(); ++i)
    if (out[i].defined() && next_edges[i].valid() && out[i].dtype() != input_meta[i].dtype &&
        is_floating(input_meta[i].dtype))
      out[i] = out[i].to(input_meta[i].dtype);
  return out;
}

void OpNode::release() {
  for (auto& s : saved_inputs)
    if (s.defined()) s.release();
  for (auto& s : saved_outputs) s.release();
}

// ---------------------------------- CopySlices ----------------------------------

namespace {

// Where a view's elements sit in its base: offset from the base's first element and strides,
// valid for any tensor laid out like the base (a contiguous one, see rebase_history).
struct ViewGeometry {
  Shape shape;
  Strides strides;
  int64_t offset = 0;
  Shape base_shape;

  // The elements of contiguous tensor `t` (of base_shape) that the view covers: a view made by
  // hand, not by a recorded op, so it is only used with grad mode off.
  Tensor region_of(const Tensor& t) const {
    auto impl = std::make_shared<TensorImpl>();
    impl->storage = t.storage();
    impl->dtype = t.dtype();
    impl->shape = shape;
    impl->strides = strides;
    impl->offset = t.offset() + offset;
    impl->base = t.impl_ptr();
    return Tensor(std::move(impl));
  }
};

thread_local uint64_t t_copy_slices = 0;
thread_local uint64_t t_create_graph_backwards = 0;
std::atomic<bool> g_create_graph_warned{false};  // Tensor::backward's reference-cycle warning

void check_first_order(const char* node) {
  KILN_CHECK(!t_grad_enabled, node, backward_call_site(),
             "a double backward (create_graph) through an in-place write into a view is not "
             "supported; build the result out of place (cat, stack, where) to differentiate twice");
}

// The base's new history after an in-place op `fn` on one of its views (PyTorch's CopySlices):
// the base's gradient outside the view passes to the base's old history; inside it, it is the
// gradient of the view's new value, which `fn` takes back to the view's old value (to the
// base's old history, in that region) and to fn's other inputs.
class CopySlices final : public Node {
 public:
  CopySlices(ViewGeometry view, std::shared_ptr<OpNode> fn) : view_(std::move(view)), fn_(std::move(fn)) {}
  std::string name() const override { return "CopySlices"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override {
    check_first_order("CopySlices");
    std::vector<Tensor> out(next_edges.size());
    if (!grads[0].defined()) return out;
    Tensor base_grad = grads[0].contiguous();
    if (base_grad.is_same(grads[0])) base_grad = base_grad.clone();
    Tensor region = view_.region_of(base_grad);
    // A copy: fn's gradients may alias their input (copy_'s is the gradient itself), and the
    // region is overwritten next.
    std::vector<Tensor> fn_grads = fn_->apply({region.clone()});
    if (fn_grads[0].defined()) region.copy_(fn_grads[0]);
    else region.fill_(0);
    out[0] = base_grad;
    for (size_t i = 1; i < out.size() && i < fn_grads.size(); ++i) out[i] = fn_grads[i];
    return out;
  }
  void release() override { fn_->release(); }

 private:
  ViewGeometry view_;
  std::shared_ptr<OpNode> fn_;
};

// A view's history after the in-place op: its gradient goes to its region of the base.
class ViewOfBase final : public Node {
 public:
  explicit ViewOfBase(ViewGeometry view) : view_(std::move(view)) {}
  std::string name() const override { return "AsStridedBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override {
    check_first_order("AsStridedBackward");
    if (!grads[0].defined()) return {Tensor()};
    Tensor base_grad = zeros(view_.base_shape, {grads[0].dtype()});
    view_.region_of(base_grad).copy_(grads[0]);
    return {base_grad};
  }

 private:
  ViewGeometry view_;
};

// `view`'s history becomes that of its region of its base's current history (the base is
// contiguous and has a grad_fn).
void view_base_history(const Tensor& view) {
  Tensor base(view.impl()->base);
  auto as_view = std::make_shared<ViewOfBase>(
      ViewGeometry{view.shape(), view.strides(), view.offset() - base.offset(), base.shape()});
  as_view->next_edges = {gradient_edge(base)};
  Meta& m = ensure_meta(view);
  m.requires_grad = true;
  m.grad_fn = as_view;
  m.output_nr = 0;
  m.is_view_of_grad_tensor = true;
  m.view_version = view.storage()->history_version();
}

// A view whose base's memory was written in place with history after the view was taken
// (through another view, or through this one's own view) gets its region of the base's new
// history, as PyTorch regenerates a view's grad_fn; returns whether it did. So does a view that
// had no history when the memory gained one in place (`h.slice(0, 0, 2).copy_(x)` with h
// zeros). A base that is not contiguous (ViewGeometry) leaves the view stale: using it raises.
bool regenerate_view_history(const Tensor& t) {
  if (!t.defined() || !t.impl()->base) return false;
  Meta* m = meta(t);
  if (m && m->detached) return false;
  // A view taken of a tensor with history; not a leaf made from a view (no grad_fn).
  const bool stale_history = m && m->is_view_of_grad_tensor && m->grad_fn &&
                             t.storage()->history_version() != m->view_version;
  const bool gained = (!m || (!m->requires_grad && !m->no_grad_view_of_grad_tensor)) &&
                      t.storage()->gained_history_in_place(t.impl()->lineage);
  if (!stale_history && !gained) return false;
  Tensor base(t.impl()->base);
  Meta* bm = meta(base);
  if (!bm || !bm->requires_grad || !bm->grad_fn || !base.is_contiguous()) return false;
  view_base_history(t);
  return true;
}

// The in-place op `node` wrote view `out`: its base takes the new history, and `out` becomes a
// view of that (PyTorch rebases the same way). before_kernel checked the base (contiguous, not a
// leaf that requires grad).
void rebase_history(const std::shared_ptr<OpNode>& node, Tensor& out) {
  Tensor base(out.impl()->base);
  ViewGeometry view{out.shape(), out.strides(), out.offset() - base.offset(), base.shape()};
  auto copy = std::make_shared<CopySlices>(std::move(view), node);
  copy->next_edges = node->next_edges;
  copy->next_edges[0] = gradient_edge(base);  // the base's old history
  Meta& bm = ensure_meta(base);
  bm.requires_grad = true;
  bm.grad_fn = copy;
  bm.output_nr = 0;
  view_base_history(out);
  ++t_copy_slices;
}

}  // namespace

// ------------------------------------- meta -------------------------------------

Meta* meta(const Tensor& t) {
  if (!t.defined()) return nullptr;
  return static_cast<Meta*>(t.impl()->autograd.get());
}

Meta& ensure_meta(const Tensor& t) {
  auto& a = t.impl()->autograd;
  if (!a) a = std::make_shared<Meta>();
  return *static_cast<Meta*>(a.get());
}

Edge gradient_edge(const Tensor& t) {
  Meta* m = meta(t);
  if (!m || !m->requires_grad) return {};
  if (m->grad_fn) return {m->grad_fn, m->output_nr};
  register_replay_fork_handlers();
  std::lock_guard<std::recursive_mutex> lock(g_leaf_mu);
  auto acc = m->accumulator.lock();
  if (!acc) {
    acc = std::make_shared<AccumulateGrad>(t.impl_ptr());
    m->accumulator = acc;
  }
  return {acc, 0};
}

// ------------------------------------- hook -------------------------------------

namespace {

bool any_requires_grad(const OpCall& c) {
  for (const Tensor& t : c.inputs)
    if (Meta* m = meta(t); m && m->requires_grad) return true;
  return false;
}

bool is_in_place(OpKind op) { return op == OpKind::CopyInto || op == OpKind::Fill; }

constexpr const char* kLeafInPlace =
    "a leaf tensor that requires grad is being used in an in-place operation; wrap parameter "
    "updates in kiln::no_grad";

class RecordHook final : public DispatchHook {
 public:
  // Grad mode off, or no tensor involved (nor a view's base) has autograd state and no memory
  // gained a history in place: before_kernel and after_kernel would do nothing.
  bool ignores_in_place(const OpCall& c) const override {
    if (!t_grad_enabled) return true;
    for (const Tensor& t : c.inputs) {
      if (!t.defined()) continue;
      const auto& base = t.impl()->base;
      if (meta(t) || (base && base->autograd) ||
          t.storage()->gained_history_in_place(t.impl()->lineage))
        return false;
    }
    return true;
  }

  bool before_kernel(const OpCall& c, const InferredMeta&, std::vector<Tensor>&) override {
    if (!t_grad_enabled) return false;
    for (const Tensor& t : c.inputs) {
      regenerate_view_history(t);
      Meta* vm = meta(t);
      KILN_CHECK(!vm || !vm->is_view_of_grad_tensor ||
                     t.storage()->history_version() == vm->view_version,
                 c.name(), c.loc,
                 "an input is a view (shape {}) whose base was modified in place with gradient "
                 "history after the view was taken; its recorded history is stale, so take the "
                 "view again after the in-place op",
                 to_string(t.shape()));
      KILN_CHECK(!lost_in_place_history(t), c.name(), c.loc,
                 "an input (shape {}) shares memory with another tensor (a view of it, or its "
                 "base) that an in-place op gave a gradient history; this tensor does not carry "
                 "that history, so its gradient would be lost. Use the tensor the in-place op "
                 "wrote, build the result out of place (cat, stack, where), or read it under "
                 "kiln::no_grad",
                 to_string(t.shape()));
    }
    if (!is_in_place(c.op)) return false;
    const Tensor& target = c.inputs[0];
    const auto& base = target.impl()->base;
    Meta* bm = base ? static_cast<Meta*>(base->autograd.get()) : nullptr;
    if (Meta* tm = meta(target);
        base && ((bm && bm->requires_grad) || (tm && tm->no_grad_view_of_grad_tensor))) {
      // A view of a tensor that requires grad was made under no_grad: the write would change the
      // base (a leaf, or values its history saved) behind autograd's back (PyTorch raises too).
      KILN_CHECK(tm && tm->requires_grad, c.name(), c.loc,
                 "a view made under no_grad (shape {}) of a tensor that requires grad is modified "
                 "in place with grad mode on; autograd would not see the write (PyTorch raises "
                 "too): write under no_grad as well, or take the view with grad mode on",
                 to_string(target.shape()));
    }
    if (base && any_requires_grad(c)) {
      // The base will take the new history (rebase_history). A view that requires grad while
      // its base has no history views a leaf that requires grad: the base itself, or a view
      // of the base made a leaf by requires_grad_() (`arange(4).view({2, 2})`), which the base
      // cannot stand for (PyTorch's "view of a leaf" test: requires_grad and _base.is_leaf).
      Meta* tm = meta(target);
      // A target without a grad_fn of its own is that leaf itself (PyTorch then says "a leaf
      // Variable", not "a view of a leaf").
      const bool views_grad_leaf = (tm && tm->requires_grad && !(bm && bm->grad_fn)) ||
                                   (bm && bm->requires_grad && !bm->grad_fn);
      KILN_CHECK(!views_grad_leaf || !tm || !tm->requires_grad || tm->grad_fn, c.name(), c.loc,
                 kLeafInPlace);
      KILN_CHECK(!views_grad_leaf, c.name(), c.loc,
                 "a view (shape {}) of a leaf tensor that requires grad is being used in an "
                 "in-place operation; wrap parameter updates in kiln::no_grad",
                 to_string(target.shape()));
      KILN_CHECK(Tensor(base).is_contiguous(), c.name(), c.loc,
                 "an in-place write into a view (shape {}) of a non-contiguous tensor (shape {}, "
                 "strides {}) with gradient history is not supported; write into a view of a "
                 "contiguous() copy, or build the result out of place",
                 to_string(target.shape()), to_string(base->shape), to_string(base->strides));
    }
    Meta* m = meta(target);
    if (!m) return false;
    KILN_CHECK(!(m->requires_grad && !m->grad_fn), c.name(), c.loc, kLeafInPlace);
    KILN_CHECK(!m->detached || !any_requires_grad(c), c.name(), c.loc,
               "a view made under no_grad of memory that gained a gradient history is modified "
               "in place with grad mode on; its history would be lost (PyTorch raises too): "
               "take the view with grad mode on, or clone() it");
    return false;
  }

  void after_kernel(const OpCall& c, const InferredMeta& meta_info,
                    std::vector<Tensor>& outs) override {
    // A view that asks for no gradient (of a detached tensor, or made under no_grad) keeps
    // asking, should its memory have gained a history in place (gained_history_in_place).
    const bool view = op_info(c.op).category == OpCategory::View && !c.inputs.empty() &&
                      !outs.empty() && outs[0].defined();
    if (Meta* in = view ? meta(c.inputs[0]) : nullptr;
        in && ((!t_grad_enabled && in->requires_grad) || in->no_grad_view_of_grad_tensor))
      ensure_meta(outs[0]).no_grad_view_of_grad_tensor = true;
    if (op_info(c.op).category == OpCategory::View && !outs.empty() && outs[0].defined() &&
        outs[0].storage()->gained_history_in_place(outs[0].impl()->lineage)) {
      Meta* in = meta(c.inputs[0]);
      if (!t_grad_enabled || (in && in->detached)) ensure_meta(outs[0]).detached = true;
    }
    if (!t_grad_enabled || !any_requires_grad(c)) return;
    // Integer/bool outputs (argmax, comparisons) carry no gradient.
    if (!save_spec(c.op).differentiable || !is_differentiable_dtype(meta_info.outputs[0].dtype))
      return;
    auto node = std::make_shared<OpNode>(c, meta_info);
    Tensor& out = outs[0];  // views come with their own TensorImpl (eager/view.cpp)
    node->save(c, outs);
    if (is_in_place(c.op)) out.storage()->bump_history_version();
    // Other tensors of this memory made before the write (a view of the base taken earlier) do
    // not get the new history: using them is an error (lost_in_place_history).
    if (is_in_place(c.op))
      if (Meta* before = meta(out); !before || !before->requires_grad)
        out.storage()->set_gained_history_in_place(out.impl()->lineage);
    if (is_in_place(c.op) && out.impl()->base) {
      rebase_history(node, out);
      return;
    }
    Meta& m = ensure_meta(out);
    // retain_grad() follows the tensor's new value (PyTorch 1.13): the old node stops filling
    // .grad and the in-place op's node fills it.
    if (m.retains_grad && m.grad_fn && is_in_place(c.op)) {
      std::erase_if(m.grad_fn->retained,
                    [&](const auto& r) { return r.second.lock() == out.impl_ptr(); });
      node->retained.emplace_back(0, out.impl_ptr());
    }
    m.requires_grad = true;
    m.grad_fn = node;
    m.output_nr = 0;
    m.is_view_of_grad_tensor = op_info(c.op).category == OpCategory::View;
    m.view_version = out.storage()->history_version();
  }
};

RecordHook g_hook;

}  // namespace

void install_hook() {
  static bool installed = [] {
    dispatch::set_autograd_hook(&g_hook);
    return true;
  }();
  (void)installed;
}

// Registered at start-up so that recording works from the first op.
static const bool g_hook_installed = (install_hook(), true);

// ------------------------------------ engine ------------------------------------

namespace {

struct NodeState {
  std::vector<Tensor> buffer;  // gradient per node output
  int dependencies = 0;
};

// Runs the graph from `roots` (with their gradients). When `capture` is non-empty, the
// gradients arriving at those edges are returned instead of being accumulated into leaves.
// `stop_at_capture`: the captured edges' nodes do not run either (partial derivatives, see
// partial_grads).
std::vector<Tensor> run_backward(const std::vector<Edge>& roots, const std::vector<Tensor>& root_grads,
                                 bool retain_graph, bool create_graph,
                                 const std::vector<Edge>& capture, bool stop_at_capture = false) {
  if (create_graph) ++t_create_graph_backwards;
  // 1. Dependencies (iterative DFS).
  std::unordered_map<Node*, NodeState> state;
  std::unordered_map<Node*, std::vector<Node*>> parents;  // only with `capture`
  std::vector<Node*> stack;
  for (const Edge& r : roots) {
    if (state.emplace(r.fn.get(), NodeState{}).second) stack.push_back(r.fn.get());
  }
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (const Edge& e : n->next_edges) {
      if (!e.fn) continue;
      auto [it, inserted] = state.emplace(e.fn.get(), NodeState{});
      it->second.dependencies++;
      if (!capture.empty()) parents[e.fn.get()].push_back(n);
      if (inserted) stack.push_back(e.fn.get());
    }
  }
  // With `capture` (grad()), only the nodes on a path to a captured edge run, as in PyTorch:
  // the history behind the inputs (the graph that made them) is neither run nor freed.
  std::unordered_set<Node*> on_path;
  std::vector<Node*> work;
  for (const Edge& c : capture)
    if (c.fn) work.push_back(c.fn.get());
  while (!work.empty()) {
    Node* n = work.back();
    work.pop_back();
    for (Node* p : parents[n])
      if (on_path.insert(p).second) work.push_back(p);
  }
  for (auto& [n, s] : state) s.buffer.resize(n->num_outputs());

  auto accumulate = [](Tensor& slot, const Tensor& g) {
    if (!g.defined()) return;
    slot = slot.defined() ? add(slot, g) : g;
  };
  for (size_t i = 0; i < roots.size(); ++i)
    accumulate(state[roots[i].fn.get()].buffer[roots[i].input_nr], root_grads[i]);

  std::vector<Tensor> captured(capture.size());
  std::unordered_map<Node*, std::vector<size_t>> capture_at;
  for (size_t i = 0; i < capture.size(); ++i) capture_at[capture[i].fn.get()].push_back(i);

  // 2. Execute in order of decreasing sequence number among ready nodes.
  auto later_first = [](const std::shared_ptr<Node>& a, const std::shared_ptr<Node>& b) {
    return a->sequence_nr < b->sequence_nr;
  };
  std::priority_queue<std::shared_ptr<Node>, std::vector<std::shared_ptr<Node>>,
                      decltype(later_first)>
      ready(later_first);
  for (const Edge& r : roots)
    if (state[r.fn.get()].dependencies == 0) {
      state[r.fn.get()].dependencies = -1;  // queued
      ready.push(r.fn);
    }

  // A trace defers the history made before it (DispatchHook::defers_backward_node): those
  // nodes run after the others, in a backward of their own that the replays repeat.
  DispatchHook* defer_hook = capture.empty() && !create_graph ? dispatch::tracer_hook() : nullptr;
  std::vector<Edge> deferred;
  std::vector<Tensor> deferred_grads;
  bool prev_mode = t_grad_enabled;
  t_grad_enabled = create_graph;
  try {
    while (!ready.empty()) {
      std::shared_ptr<Node> node = ready.top();
      ready.pop();
      NodeState& st = state[node.get()];
      std::vector<Tensor> grads = std::move(st.buffer);
      if (auto it = capture_at.find(node.get()); it != capture_at.end()) {
        for (size_t i : it->second) captured[i] = grads[capture[i].input_nr];
      }
      std::vector<Tensor> next;
      bool run = capture.empty() ||
                 (on_path.count(node.get()) && !(stop_at_capture && capture_at.count(node.get())));
      if (defer_hook && defer_hook->defers_backward_node(*node)) {
        // Neither run nor freed; the nodes behind it get no gradient from it here.
        for (size_t nr = 0; nr < grads.size(); ++nr)
          if (grads[nr].defined()) {
            deferred.push_back(Edge{node, static_cast<uint32_t>(nr)});
            deferred_grads.push_back(std::move(grads[nr]));
          }
        run = false;
      } else {
        std::lock_guard lock(node->run_mutex);  // another thread's backward may run it too
        // Not for the tracer's partial derivatives (partial_grads): only a user's backward or
        // grad() fills retained .grads.
        // The tracer hears of it as of a leaf's (AccumulateGrad::apply): a replay sets the
        // retained .grad too, summed with the one at the call (it was left unset, or kept its
        // second call's value: break-it pass).
        for (auto& [nr, weak] : node->retained)
          if (auto impl = weak.lock(); impl && grads[nr].defined() && !stop_at_capture) {
            Tensor t(impl);
            Meta& m = ensure_meta(t);
            auto* hook = dispatch::tracer_hook();
            if (auto* o = dispatch::write_observer()) o->before_grad_change(t);
            if (hook) {
              if (m.grad.defined())
                hook->on_grad_read(t, m.grad);
              else
                hook->on_grad_found_undefined(t);
            }
            m.grad = m.grad.defined() ? add(m.grad, grads[nr]) : private_grad_copy(grads[nr]);
            if (hook) hook->on_grad_assigned(t);
          }
        if (run && !stop_at_capture)
          if (auto* hook = dispatch::tracer_hook()) hook->on_backward_node(*node);
        if (run) next = node->apply(std::move(grads));
        if (!retain_graph && run) node->release();
      }
      for (size_t i = 0; i < node->next_edges.size(); ++i) {
        const Edge& e = node->next_edges[i];
        if (!e.fn) continue;
        NodeState& ns = state[e.fn.get()];
        if (i < next.size()) accumulate(ns.buffer[e.input_nr], next[i]);
        if (--ns.dependencies == 0) {
          ns.dependencies = -1;
          ready.push(e.fn);
        }
      }
    }
  } catch (...) {
    t_grad_enabled = prev_mode;
    throw;
  }
  t_grad_enabled = prev_mode;
  if (!deferred.empty()) defer_hook->run_deferred_backward(deferred, deferred_grads, retain_graph);
  return captured;
}

Tensor default_grad(const Tensor& out, const char* op, Loc loc) {
  KILN_CHECK(out.numel() == 1, op, loc,
             "grad can be implicitly created only for one-element outputs, got shape {}; pass "
             "a gradient",
             to_string(out.shape()));
  return ones_like(out);
}

}  // namespace
}  // namespace autograd

// --------------------------------- public API ----------------------------------

using namespace autograd;

bool is_grad_enabled() { return t_grad_enabled; }
void set_grad_enabled(bool enabled) { t_grad_enabled = enabled; }

void register_replay_fork_handlers() {
  static std::once_flag once;
  std::call_once(once, register_fork_handlers);
}

std::unique_lock<std::recursive_mutex> hold_leaf_grads() {
  register_replay_fork_handlers();
  return std::unique_lock<std::recursive_mutex>(g_leaf_mu);
}

bool Tensor::requires_grad() const {
  Meta* m = meta(*this);
  return m && m->requires_grad;
}

Tensor& Tensor::requires_grad_(bool enabled, Loc loc) {
  KILN_CHECK(defined(), "requires_grad_", loc, "tensor is undefined");
  Meta* m = meta(*this);
  // A non-leaf requires grad already: asking for it again is a no-op (PyTorch); turning it off
  // is an error.
  KILN_CHECK(!(m && m->grad_fn) || enabled, "requires_grad_", loc,
             "can only change requires_grad of leaf tensors; use detach() for a non-leaf");
  if (m && m->grad_fn) return *this;
  KILN_CHECK(!enabled || is_floating(dtype()), "requires_grad_", loc,
             "only floating-point tensors can require gradients, got {}", name(dtype()));
  KILN_CHECK(!enabled || !lost_in_place_history(*this), "requires_grad_", loc,
             "this tensor (shape {}) shares memory with another tensor (a view of it, or its "
             "base) that an in-place op gave a gradient history; as a leaf it would drop that "
             "history. Use the tensor the in-place op wrote, or detach() it first",
             to_string(shape()));
  Meta& own = ensure_meta(*this);
  own.requires_grad = enabled;
  // A leaf made from a view (`base.view({2, 2}).requires_grad_()`) goes stale, as views do,
  // when an in-place op later gives its memory a history (`base.add_(w)`): PyTorch turns it
  // into a non-leaf carrying w's gradient; kiln raises instead of losing it.
  if (enabled && impl()->base) {
    own.is_view_of_grad_tensor = true;
    own.view_version = storage()->history_version();
  }
  return *this;
}

Tensor Tensor::grad() const {
  Meta* m = meta(*this);
  // A compiled function that branches on a .grad being undefined (an optimizer skipping a
  // parameter) depends on it: the tracer guards it.
  if (!m || !m->grad.defined()) {
    if (auto* hook = dispatch::tracer_hook(); hook && defined()) hook->on_grad_found_undefined(*this);
    return Tensor();
  }
  if (auto* hook = dispatch::tracer_hook()) hook->on_grad_read(*this, m->grad);
  return m->grad;
}
void Tensor::set_grad(const Tensor& g, Loc loc) const {
  KILN_CHECK(defined(), "set_grad", loc, "tensor is undefined");
  KILN_CHECK(!g.defined() || (g.shape() == shape() && g.dtype() == dtype()), "set_grad",
             loc, "gradient {} {} does not match the tensor's {} {}",
             g.defined() ? std::string(name(g.dtype())) : "", g.defined() ? to_string(g.shape()) : "",
             name(dtype()), to_string(shape()));
  if (auto* o = dispatch::write_observer()) o->before_grad_change(*this);
  ensure_meta(*this).grad = g;
  if (auto* hook = dispatch::tracer_hook()) hook->on_grad_assigned(*this);
}
bool Tensor::is_leaf() const {
  Meta* m = meta(*this);
  return !m || !m->grad_fn;
}
std::string Tensor::grad_fn_name() const {
  Meta* m = meta(*this);
  return m && m->grad_fn ? m->grad_fn->name() : "";
}
void Tensor::retain_grad(Loc loc) const {
  KILN_CHECK(defined(), "retain_grad", loc, "tensor is undefined");
  Meta* m = meta(*this);
  KILN_CHECK(m && m->requires_grad, "retain_grad", loc,
             "can't retain_grad on a tensor that doesn't require grad");
  if (!m->grad_fn || m->retains_grad) return;  // leaves keep .grad anyway; once is enough
  m->retains_grad = true;
  m->grad_fn->retained.emplace_back(m->output_nr, impl_ptr());
}

uint64_t create_graph_backwards() { return autograd::t_create_graph_backwards; }
bool create_graph_warning_shown() { return autograd::g_create_graph_warned.load(); }

namespace {
std::atomic<uint64_t> g_parameter_rebinds{0};
// Tensors replaced in a module, with the count at their last replacement. Dead ones are
// pruned whenever the map has doubled since the last pruning; an address reused by a new
// tensor is told apart by its weak pointer.
struct Unbound {
  std::weak_ptr<TensorImpl> impl;
  uint64_t at;
};
std::mutex g_unbound_mu;
std::unordered_map<const TensorImpl*, Unbound> g_unbound;
size_t g_unbound_pruned_at = 64;
std::atomic<uint64_t> g_submodule_replaced_at{0};
}  // namespace
uint64_t parameter_rebinds() { return g_parameter_rebinds.load(std::memory_order_relaxed); }
void note_parameter_rebind(const Tensor& old) {
  std::lock_guard lock(g_unbound_mu);
  const uint64_t at = g_parameter_rebinds.fetch_add(1, std::memory_order_relaxed) + 1;
  if (!old.defined()) {
    g_submodule_replaced_at.store(at, std::memory_order_relaxed);
    return;
  }
  g_unbound[old.impl()] = {old.impl_ptr(), at};
  if (g_unbound.size() >= 2 * g_unbound_pruned_at) {
    std::erase_if(g_unbound, [](const auto& kv) { return kv.second.impl.expired(); });
    g_unbound_pruned_at = std::max<size_t>(64, g_unbound.size());
  }
}
uint64_t submodule_replaced_at() {
  return g_submodule_replaced_at.load(std::memory_order_relaxed);
}
uint64_t parameter_unbound_at(const std::shared_ptr<TensorImpl>& impl) {
  std::lock_guard lock(g_unbound_mu);
  auto it = g_unbound.find(impl.get());
  if (it == g_unbound.end() || it->second.impl.lock() != impl) return 0;
  return it->second.at;
}

uint64_t in_place_view_writes() { return autograd::t_copy_slices; }

bool lost_in_place_history(const Tensor& t) {
  if (!t.defined() || regenerate_view_history(t)) return false;
  Meta* m = meta(t);
  // A view whose base was written in place after it was taken: its history is stale.
  if (m && m->is_view_of_grad_tensor && t.storage()->history_version() != m->view_version)
    return true;
  if (m && (m->requires_grad || m->detached)) return false;
  return t.storage()->gained_history_in_place(t.impl()->lineage);
}

Tensor Tensor::detach(Loc loc) const {
  KILN_CHECK(defined(), "detach", loc, "tensor is undefined");
  static std::atomic<uint64_t> next_lineage{1};
  auto impl = std::make_shared<TensorImpl>(*this->impl());
  impl->autograd.reset();
  impl->base.reset();  // not a view for autograd: an in-place write into it rebases nothing
  // Its own lineage: history its alias gains in place is not its (and the other way round).
  impl->lineage = next_lineage.fetch_add(1, std::memory_order_relaxed);
  return Tensor(std::move(impl));
}

void Tensor::backward(const Tensor& gradient, bool retain_graph, bool create_graph, Loc loc) const {
  KILN_CHECK(defined(), "backward", loc, "tensor is undefined");
  KILN_CHECK(requires_grad(), "backward", loc,
             "the tensor does not require grad and has no grad_fn (did an input call "
             "requires_grad_()? was it computed under no_grad?)");
  Tensor g = gradient.defined() ? gradient : default_grad(*this, "backward", loc);
  KILN_CHECK(g.shape() == shape(), "backward", loc, "gradient has shape {}, expected {}",
             to_string(g.shape()), to_string(shape()));
  g = g.to(dtype(), loc);  // gradients take the tensor's dtype (an integer one too), as PyTorch
  // Said once per process, as PyTorch does (a break-it loop grew 72 KB a step, unwarned).
  if (create_graph && !autograd::g_create_graph_warned.exchange(true)) {
    fmt::print(stderr,
               "kiln: warning: backward(create_graph=true) at {}:{} gives each leaf's .grad the "
               "history that computed it, a reference cycle (leaf -> .grad -> graph -> leaf) "
               "that keeps the graph alive until the .grad is cleared (set_grad(Tensor()) or an "
               "optimizer's zero_grad); kiln::grad() returns the gradients without it\n",
               loc.file_name(), loc.line());
  }
  BackwardSite site(loc);
  run_backward({gradient_edge(*this)}, {g}, retain_graph || create_graph, create_graph, {});
}

std::vector<Tensor> grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                         const std::vector<Tensor>& grad_outputs, bool create_graph,
                         std::optional<bool> retain_graph, bool allow_unused, Loc loc) {
  KILN_CHECK(grad_outputs.empty() || grad_outputs.size() == outputs.size(), "grad", loc,
             "got {} grad_outputs for {} outputs", grad_outputs.size(), outputs.size());
  std::vector<Edge> roots;
  std::vector<Tensor> root_grads;
  for (size_t i = 0; i < outputs.size(); ++i) {
    KILN_CHECK(outputs[i].defined() && outputs[i].requires_grad(), "grad", loc,
               "output {} does not require grad", i);
    roots.push_back(gradient_edge(outputs[i]));
    if (grad_outputs.empty() || !grad_outputs[i].defined()) {
      root_grads.push_back(default_grad(outputs[i], "grad", loc));
      continue;
    }
    const Tensor& g = grad_outputs[i];
    KILN_CHECK(g.shape() == outputs[i].shape(), "grad", loc,
               "grad_outputs[{}] has shape {}, but output {} has shape {}", i,
               to_string(g.shape()), i, to_string(outputs[i].shape()));
    root_grads.push_back(g.to(outputs[i].dtype(), loc));  // as backward(): the output's dtype
  }
  std::vector<Edge> capture;
  for (size_t i = 0; i < inputs.size(); ++i) {
    KILN_CHECK(inputs[i].defined() && inputs[i].requires_grad(), "grad", loc,
               "input {} does not require grad", i);
    capture.push_back(gradient_edge(inputs[i]));
  }
  BackwardSite site(loc);
  std::vector<Tensor> out =
      run_backward(roots, root_grads, retain_graph.value_or(create_graph), create_graph, capture);
  for (size_t i = 0; i < out.size(); ++i) {
    KILN_CHECK(out[i].defined() || allow_unused, "grad", loc,
               "input {} was not used to compute the outputs (pass allow_unused=true)", i);
    if (out[i].defined() && !create_graph) out[i] = out[i].detach();
  }
  return out;
}

void autograd::backward_from_edges(const std::vector<Edge>& edges,
                                   const std::vector<Tensor>& grads, bool retain_graph, Loc loc) {
  BackwardSite site(loc);
  run_backward(edges, grads, retain_graph, /*create_graph=*/false, {});
}

std::vector<Tensor> autograd::partial_grads(const std::vector<Tensor>& outputs,
                                  const std::vector<Tensor>& inputs,
                                  const std::vector<Tensor>& grad_outputs, bool create_graph) {
  std::vector<Edge> roots, capture;
  std::vector<Tensor> root_grads;
  // An output without history reaches no input: it adds nothing (run_backward needs a node).
  for (size_t i = 0; i < outputs.size(); ++i)
    if (Edge e = gradient_edge(outputs[i]); e.valid()) {
      roots.push_back(std::move(e));
      root_grads.push_back(grad_outputs[i]);
    }
  for (const Tensor& t : inputs) capture.push_back(gradient_edge(t));
  std::vector<Tensor> out = run_backward(roots, root_grads, /*retain_graph=*/true, create_graph,
                                         capture, /*stop_at_capture=*/true);
  if (!create_graph)
    for (Tensor& g : out)
      if (g.defined()) g = g.detach();
  return out;
}

void zero_grad(const std::vector<Tensor>& params) {
  for (const Tensor& p : params)
    if (Meta* m = meta(p)) {
      if (auto* o = dispatch::write_observer()) o->before_grad_change(p);
      m->grad = Tensor();
      if (auto* hook = dispatch::tracer_hook()) hook->on_grad_assigned(p);
    }
}

}  // namespace kiln
