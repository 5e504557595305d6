#include "tracer/recorder.h"

#include <algorithm>
#include <optional>
#include <tuple>
#include <utility>

#include "eager/autograd.h"
#include "eager/autograd_graph.h"
#include "eager/factories.h"
#include "eager/ops.h"
#include "tracer/backward.h"

namespace kiln::tracer {
namespace {

thread_local Recorder* t_current = nullptr;

void observe_read(const Tensor& t, Loc loc) {
  if (t_current) t_current->on_read(t, loc);
}

// kiln's own kernels take pointers all the time; only the user's code counts.
void observe_raw_access(Loc loc) {
  if (t_current && !inside_kiln(loc)) t_current->on_raw_access(loc);
}

bool is_random(OpKind op) { return op_info(op).category == OpCategory::Random; }

// A tensor's .grad, without telling the recorder (Tensor::grad() reports undefined ones).
Tensor grad_of(const Tensor& t) {
  autograd::Meta* m = autograd::meta(t);
  return m ? m->grad : Tensor();
}

}  // namespace

Scalar read_scalar(const Tensor& t, int64_t index) {
  if (t.numel() == 1 || !t.device().is_cpu())  // item() raises for the rest
    return untraced([&]() -> Scalar {
      if (is_floating(t.dtype())) return t.item<double>();
      if (t.dtype() == DType::Bool) return t.item<bool>();
      return t.item<int64_t>();
    });
  int64_t at = 0;  // element `index` in row-major order, by the strides
  for (int d = t.dim() - 1; d >= 0; --d) {
    at += index % t.shape()[d] * t.strides()[d];
    index /= t.shape()[d];
  }
  Scalar out;
  KILN_DISPATCH_ALL(t.dtype(), S, {
    S e = static_cast<const S*>(t.raw_data())[at];
    if (is_floating(t.dtype())) out = Scalar(static_cast<double>(e));
    else if (t.dtype() == DType::Bool) out = Scalar(static_cast<bool>(e));
    else out = Scalar(static_cast<int64_t>(e));
  });
  return out;
}

namespace {
int compare_dims(const Dims& a, const Dims& b) {
  if (a.size() != b.size()) return a.size() < b.size() ? -1 : 1;
  for (int i = 0; i < a.size(); ++i)
    if (a[i] != b[i]) return a[i] < b[i] ? -1 : 1;
  return 0;
}
}  // namespace

bool Recorder::GeoKey::operator<(const GeoKey& o) const {
  if (std::tie(storage, offset, dtype) != std::tie(o.storage, o.offset, o.dtype))
    return std::tie(storage, offset, dtype) < std::tie(o.storage, o.offset, o.dtype);
  if (int c = compare_dims(shape, o.shape)) return c < 0;
  return compare_dims(strides, o.strides) < 0;
}

Recorder::GeoKey Recorder::key_of(const Tensor& t) {
  return {t.storage()->serial(), t.offset(), t.dtype(), t.shape(), t.strides()};
}

Recorder::Recorder(Program& program, bool keep_values)
    : p_(program),
      keep_values_(keep_values),
      start_serial_(StorageImpl::next_serial()),
      thread_(StorageImpl::current_thread_number()),
      write_epoch_start_(StorageImpl::begin_write_epoch()),
      rng_start_(generator_state().offset),
      first_node_(autograd::next_sequence_nr()) {}

Recorder::~Recorder() { uninstall(); }

Recorder* Recorder::current() { return t_current; }

void Recorder::install() {
  if (installed_) return;
  prev_hook_ = dispatch::set_tracer_hook(this);
  prev_observer_ = set_host_read_observer(&observe_read);
  prev_raw_observer_ = set_raw_access_observer(&observe_raw_access);
  prev_current_ = std::exchange(t_current, this);
  prev_draw_log_ = set_draw_log(&draws_);
  installed_ = true;
}

void Recorder::uninstall() {
  if (!installed_) return;
  dispatch::set_tracer_hook(prev_hook_);
  set_host_read_observer(prev_observer_);
  set_raw_access_observer(prev_raw_observer_);
  t_current = prev_current_;
  set_draw_log(prev_draw_log_);
  installed_ = false;
}

uint64_t Recorder::own_draws() const {
  uint64_t blocks = 0;
  for (auto [at, n] : draws_) blocks += n;
  return blocks;
}

uint64_t Recorder::own_offset(uint64_t offset) const {
  // The latest reservation holding `offset`: another thread's reseed may have handed out the
  // same counters again since an earlier one.
  uint64_t before = 0;
  std::optional<uint64_t> found;
  for (auto [at, blocks] : draws_) {
    if (offset >= at && (offset < at + blocks || (blocks == 0 && offset == at)))
      found = before + (offset - at);
    before += blocks;
  }
  return found ? *found : offset - rng_start_;  // else reserved before the trace began
}

int Recorder::new_value(const Tensor& t, int source) {
  ValueInfo info;
  info.dtype = t.dtype();
  info.shape = t.shape();
  info.wrapped = t.impl()->wrapped_number;
  info.device = t.device();
  info.source = source;
  int v = p_.add_value(info);
  held_.push_back(source >= 0 || keep_values_ ? t : Tensor());
  impls_.push_back(t.impl_ptr());
  auto it = writes_.find(t.storage()->serial());
  write_count_.push_back(it == writes_.end() ? 0 : it->second);
  by_impl_[t.impl()] = v;
  by_geometry_[key_of(t)] = v;
  return v;
}

int Recorder::by_impl(const Tensor& t) const {
  auto it = by_impl_.find(t.impl());
  return it != by_impl_.end() && impls_[it->second].lock().get() == t.impl() ? it->second : -1;
}

int Recorder::add_arg(const Tensor& t, int index) {
  if (int v = by_impl(t); v >= 0) return v;  // same tensor twice
  Source s;
  s.kind = SourceKind::Arg;
  s.index = index;
  return add_source(t, std::move(s));
}

int Recorder::add_source(const Tensor& t, Source src) {
  p_.sources.push_back(std::move(src));
  return new_value(t, static_cast<int>(p_.sources.size()) - 1);
}

// A value recorded so far for `t`, or -1. A value made before its storage was last written
// in place is stale: the functional program has a newer value for that memory only if `t` has
// the written tensor's exact geometry; otherwise `t` is an alias that saw the write, which the
// functional program cannot express (Program::aliased_mutation).
int Recorder::find(const Tensor& t) {
  int v = by_impl(t);
  auto w = writes_.find(t.storage()->serial());
  uint64_t writes = w == writes_.end() ? 0 : w->second;
  if (v >= 0 && write_count_[v] == writes) return v;
  if (auto it = by_geometry_.find(key_of(t)); it != by_geometry_.end()) {
    if (write_count_[it->second] == writes) return it->second;
  }
  if (v >= 0 || writes > 0) {
    if (!p_.aliased_mutation)
      p_.aliased_mutation_reason = fmt::format(
          "a view (shape {}) of a tensor that was changed in place was used afterwards",
          to_string(t.shape()));
    p_.aliased_mutation = true;
    if (v >= 0) return v;
  }
  return -1;
}

void Recorder::check_foreign_write(const Tensor& t) {
  const StorageImpl* s = t.defined() ? t.storage().get() : nullptr;
  if (!s || s->last_write_epoch_not_by(thread_) < write_epoch_start_ ||
      !p_.foreign_thread_reason.empty())
    return;
  p_.foreign_thread_reason = fmt::format(
      "another thread wrote in place into a tensor it uses ({} {}) while it was traced; kiln "
      "records only the calling thread's ops",
      name(t.dtype()), to_string(t.shape()));
}

int Recorder::lookup(const Tensor& t) {
  int v = find(t);
  // Read after another thread wrote it: checked here, as the function may drop the tensor
  // before finish() could look at it.
  if (v >= 0) check_foreign_write(t);
  if (v >= 0) return v;
  Source s;
  if (t.storage()->serial() >= start_serial_) {
    // Only this thread's ops are recorded: a tensor another thread computed meanwhile (from
    // the arguments, or a new batch) is no constant of the trace.
    if (t.storage()->creator_thread() != thread_ && p_.foreign_thread_reason.empty())
      p_.foreign_thread_reason = fmt::format(
          "it reads a tensor ({} {}) that another thread made while it was traced; kiln records "
          "only the calling thread's ops",
          name(t.dtype()), to_string(t.shape()));
    if (t.impl()->wrapped_number) {
      s.kind = SourceKind::Constant;
      s.scalar = read_scalar(t);
    } else {
      s.kind = SourceKind::Snapshot;
      s.snapshot = untraced([&] { return t.detach().clone(); });
    }
    return add_source(t, std::move(s));
  }
  // The .grad of a leaf the function already uses: re-read from that leaf on every run.
  for (size_t i = 0; i < held_.size(); ++i) {
    int src = p_.values[i].source;
    if (src < 0) continue;
    SourceKind k = p_.sources[src].kind;
    if (k != SourceKind::Arg && k != SourceKind::Captured) continue;
    Tensor g = grad_of(held_[i]);
    if (g.defined() && (g.is_same(t) || (!(key_of(g) < key_of(t)) && !(key_of(t) < key_of(g))))) {
      s.kind = SourceKind::GradOf;
      s.index = static_cast<int>(i);
      s.contiguous = t.is_contiguous();
      if (!s.contiguous) s.strides = t.strides();
      return add_source(t, std::move(s));
    }
  }
  s.kind = SourceKind::Captured;
  s.captured = t.impl_ptr();
  s.requires_grad = t.requires_grad();
  return add_source(t, std::move(s));
}

// Dropout is recorded as where(mask, x * scale, 0) with mask = dropout_mask(same seed, offset
// and p) as bool (true where kept): the values of eager's dropout kernel (kept: x * scale with
// scale = 1 / (1 - p) in x's dtype; dropped: x * 0, NaN for x = inf/nan), but the multiply fuses
// into the compiled regions, which read one byte per element of the mask; the mask (a random
// op that reads no value) runs before them instead of splitting them (plan.cpp), and the
// backward's dropout, which eager autograd computes by drawing the same mask again, reuses the
// forward's.
bool Recorder::record_dropout_as_mask(const OpCall& call, const std::vector<Tensor>& outs) {
  const Tensor& x = call.inputs[0];
  const Tensor& out = outs[0];
  if (!x.defined() || x.dtype() != out.dtype() || call.attrs.p <= 0) return false;
  const Shape& shape = out.shape();
  Tensor& mask = dropout_masks_[{call.attrs.seed, call.attrs.offset, call.attrs.p,
                                 std::vector<int64_t>(shape.begin(), shape.end())}];
  // Whether x carried history into the dropout: the ops below run under no_grad, yet the
  // create_graph re-run must keep x's history through them (Node::in_required_grad).
  const bool x_history = is_grad_enabled() && x.requires_grad();
  const size_t first_node = p_.nodes.size();
  NoGradGuard no_grad;  // recorded ops only: the eager autograd graph already has the dropout
  if (!mask.defined()) {
    OpAttrs a = call.attrs;
    a.dims = shape;
    a.dtype = DType::Bool;
    a.device = x.device();
    mask = dispatch::call1({OpKind::DropoutMask, {}, a, call.loc});
  }
  // p == 1 keeps nothing, so the scale is never used.
  const double scale = call.attrs.p < 1 ? 1.0 / (1.0 - call.attrs.p) : 0.0;
  Tensor masked =
      kiln::where(mask, kiln::mul(x, scale, call.loc), kiln::mul(x, 0.0, call.loc), call.loc);
  std::unordered_set<int> from_x = {lookup(x)};
  for (size_t i = first_node; i < p_.nodes.size(); ++i) {
    Node& n = p_.nodes[i];
    bool reads_x = false;
    for (size_t k = 0; k < n.in.size(); ++k)
      if (from_x.count(n.in[k])) n.in_required_grad[k] = x_history, reads_x = true;
    if (reads_x) from_x.insert(n.out.begin(), n.out.end());
  }
  int v = lookup(masked);
  by_impl_[out.impl()] = v;
  by_geometry_[key_of(out)] = v;
  stand_ins_.push_back(out);  // keeps its impl and storage addresses from being reused
  return true;
}

void Recorder::after_kernel(const OpCall& call, const InferredMeta& meta,
                            std::vector<Tensor>& outs) {
  if (call.op == OpKind::Dropout && record_dropout_as_mask(call, outs)) return;
  Node n;
  n.kind = Node::Kind::Op;
  n.op = call.op;
  n.attrs = call.attrs;
  n.loc = user_facing(call.loc);  // replays and explain() name the user's line
  n.public_op = public_op();
  n.meta = meta;
  for (const Tensor& t : call.inputs) {
    n.in.push_back(t.defined() ? lookup(t) : -1);
    n.in_required_grad.push_back(is_grad_enabled() && t.defined() && t.requires_grad());
  }
  // In this thread's draws: other threads' draws meanwhile are not the function's.
  if (is_random(call.op)) n.rng_delta = own_offset(call.attrs.offset);
  n.in_place = call.op == OpKind::CopyInto || call.op == OpKind::Fill;
  if (n.in_place) {
    // The functional program gets a new value for the written tensor; older values of its
    // memory become stale (see find()).
    const Tensor& dst = outs[0];
    ++writes_[dst.storage()->serial()];
    n.out.push_back(new_value(dst, -1));
  } else {
    for (const Tensor& t : outs) n.out.push_back(new_value(t, -1));
  }
  p_.nodes.push_back(std::move(n));
}

void Recorder::check_history_grad(const Tensor& t) {
  grad_touched_.insert(t.impl());
  if (history_grads_.count(t.impl()) && p_.outside_backward.empty())
    p_.outside_backward = fmt::format(
        "{}, which sets the .grad of a tensor (shape {}) that the function reads or sets after",
        p_.history_backward, to_string(t.shape()));
}

void Recorder::on_grad_assigned(const Tensor& leaf) {
  check_history_grad(leaf);
  if (grad_leaf_set_.insert(leaf.impl()).second) grad_leaves_.push_back(leaf);
}

int Recorder::value_at_call(const Tensor& t) {
  for (size_t v = 0; v < p_.values.size(); ++v) {
    const int src = p_.values[v].source;
    if (src < 0) continue;
    const SourceKind k = p_.sources[src].kind;
    if ((k == SourceKind::Arg || k == SourceKind::Captured) && tensor(int(v)).is_same(t))
      return int(v);
  }
  return lookup(t);
}

// Backward gives `leaf` its first .grad. Unless the function itself reset that .grad before
// (zero_grad in a training step), the trace depends on the .grad being undefined at the call.
void Recorder::on_grad_found_undefined(const Tensor& leaf) {
  check_history_grad(leaf);
  // A tensor the function created has no .grad at any call (and no value before the run).
  if (grad_leaf_set_.count(leaf.impl()) || leaf.storage()->serial() >= start_serial_) return;
  int v = value_at_call(leaf);
  if (std::find(p_.grad_undefined_at_call.begin(), p_.grad_undefined_at_call.end(), v) ==
      p_.grad_undefined_at_call.end())
    p_.grad_undefined_at_call.push_back(v);
}

// A .grad the function reads is the leaf's .grad at each call (GradOf), even when the leaf is
// not used otherwise (yet): an optimizer reads g before updating p.
void Recorder::on_grad_read(const Tensor& leaf, const Tensor& grad) {
  check_history_grad(leaf);
  if (grad_leaf_set_.count(leaf.impl()) || leaf.storage()->serial() >= start_serial_ ||
      grad.storage()->serial() >= start_serial_)
    return;
  if (find(grad) >= 0) {
    // Already a value: another leaf's .grad, or an argument (p.grad and q.grad one tensor).
    // The guard compares with the tensor as the call passed it (the source value with its
    // elements), not with what the function has written into it since.
    const int lv = value_at_call(leaf);
    for (size_t v = 0; v < held_.size(); ++v) {
      const int src = p_.values[v].source;
      if (src < 0) continue;
      const Source& s = p_.sources[src];
      if (s.kind != SourceKind::Arg && s.kind != SourceKind::Captured &&
          s.kind != SourceKind::GradOf)
        continue;
      const Tensor& t = held_[v];
      if (t.storage() != grad.storage() || t.offset() != grad.offset() ||
          t.shape() != grad.shape() || t.strides() != grad.strides())
        continue;
      const std::pair<int, int> same{lv, static_cast<int>(v)};
      const bool own = s.kind == SourceKind::GradOf && s.index == lv;
      if (!own && std::find(p_.grad_same_as.begin(), p_.grad_same_as.end(), same) ==
                      p_.grad_same_as.end())
        p_.grad_same_as.push_back(same);
      break;
    }
    return;
  }
  Source s;
  s.kind = SourceKind::GradOf;
  s.index = value_at_call(leaf);
  s.contiguous = grad.is_contiguous();
  if (!s.contiguous) s.strides = grad.strides();
  add_source(grad, std::move(s));
}

void Recorder::abort_if_shape_only() {
  if (!shape_only_) return;
  aborted_ = true;
  throw ShapeOnlyAbort{};
}

void Recorder::on_read(const Tensor& t, Loc loc) {
  abort_if_shape_only();  // (the value is garbage)
  // A read of n elements (to_vector, printing) is n reads of one: the replay branches on each.
  int v = lookup(t);
  for (int64_t i = 0; i < t.numel(); ++i) {
    Node n;
    n.kind = Node::Kind::Read;
    n.loc = loc;
    n.in.push_back(v);
    n.read_index = i;
    n.read_value = read_scalar(t, i);
    p_.nodes.push_back(std::move(n));
  }
}

namespace {
std::string describe_node(const autograd::Node& node) {
  const auto* op = dynamic_cast<const autograd::OpNode*>(&node);
  return op ? fmt::format("{} (the backward of the {} at {}:{})", node.name(), op_name(op->op),
                          op->loc.file_name(), op->loc.line())
            : node.name();
}
}  // namespace

void Recorder::on_backward_node(const autograd::Node& node) {
  if (node.sequence_nr >= first_node_ || !p_.outside_backward.empty() ||
      dynamic_cast<const autograd::AccumulateGrad*>(&node))
    return;
  abort_if_shape_only();
  p_.outside_backward = describe_node(node);
  // grad() into that history (backward() defers it instead): raised before the node runs.
  raise_if_fullgraph(p_.outside_backward);
}

void Recorder::raise_if_fullgraph(const std::string& first_node) {
  if (fullgraph_name_.empty()) return;
  raised_at_graph_break_ = true;
  throw Error("compile",
              fmt::format("fullgraph=true, but the backward() or grad() in '{}' runs autograd "
                          "history made before the call ({}), which runs outside the compiled "
                          "code",
                          fullgraph_name_, first_node),
              autograd::backward_call_site());
}

bool Recorder::defers_backward_node(const autograd::Node& node) {
  return node.sequence_nr < first_node_ && !dynamic_cast<const autograd::AccumulateGrad*>(&node);
}

void Recorder::run_deferred_backward(const std::vector<autograd::Edge>& edges,
                                     const std::vector<Tensor>& grads, bool retain_graph) {
  abort_if_shape_only();  // (it would free the caller's graph, with garbage gradients)
  const Loc loc = autograd::backward_call_site();
  const std::string first = describe_node(*edges[0].fn);
  raise_if_fullgraph(first);
  // The arguments / captured tensors whose history each edge is: a replay finds the edges
  // again from the tensors of its own call.
  Program::HistoryBackward h{{}, {}, retain_graph, loc};
  for (const autograd::Edge& edge : edges) {
    int owner = -1;
    for (size_t v = 0; v < p_.values.size() && owner < 0; ++v) {
      const int src = p_.values[v].source;
      if (src < 0 || (p_.sources[src].kind != SourceKind::Arg &&
                      p_.sources[src].kind != SourceKind::Captured))
        continue;
      Tensor t = tensor(static_cast<int>(v));
      if (!t.defined() || !t.requires_grad() || t.is_leaf()) continue;
      const autograd::Edge e = autograd::gradient_edge(t);
      if (e.fn == edge.fn && e.input_nr == edge.input_nr) owner = static_cast<int>(v);
    }
    if (owner < 0 && p_.outside_backward.empty())
      p_.outside_backward = fmt::format("{}, the history of no argument or captured tensor",
                                        describe_node(*edge.fn));
    h.owners.push_back(owner);
  }
  HistoryReach reach = history_reach(edges);
  history_saved_.merge(reach.saved);
  for (const TensorImpl* t : reach.grads)
    if (grad_touched_.count(t) && p_.outside_backward.empty())
      p_.outside_backward = fmt::format(
          "{}, which sets a .grad that the function's own backward() or code reads or sets too",
          first);
  history_grads_.merge(reach.grads);
  if (p_.outside_backward.empty()) {
    if (p_.history_backward.empty()) p_.history_backward = first;
    for (const Tensor& g : grads) h.grads.push_back(lookup(g));
    p_.history_backwards.push_back(std::move(h));
  }
  // This call runs it now, as eager does; replays at their end (Program::history_backwards).
  untraced([&] { autograd::backward_from_edges(edges, grads, retain_graph, loc); });
}

void Recorder::on_raw_access(Loc loc) {
  abort_if_shape_only();
  if (!p_.raw_access) p_.raw_access = loc;
}

void Recorder::on_host_value(const HostValue& value) {
  if (host_written_.count(value.key)) return;  // the function's own write decides it
  for (const HostValue& h : p_.host_values)
    if (h.key == value.key && h.what == value.what) return;
  p_.host_values.push_back(value);
}

void Recorder::on_host_input(const Tensor& t, const HostReader& reader, Loc loc) {
  Source s;
  s.kind = SourceKind::HostInput;
  s.scalar = read_scalar(t);
  s.host = reader;
  add_source(t, std::move(s));
}

void Recorder::on_host_write(const void* key, const std::string& what,
                             const std::function<void()>& apply, Loc loc) {
  host_written_.insert(key);
  on_callback(what, [apply](const std::vector<Tensor>&) { apply(); }, {}, loc);
}

void Recorder::on_callback(const std::string& name,
                           std::function<void(const std::vector<Tensor>&)> fn,
                           const std::vector<Tensor>& tensors, Loc loc) {
  Node n;
  n.kind = Node::Kind::Callback;
  n.loc = loc;
  n.callback = std::move(fn);
  n.callback_name = name;
  for (const Tensor& t : tensors) n.in.push_back(lookup(t));
  p_.nodes.push_back(std::move(n));
}

void Recorder::finish() {
  // Only this thread's ops are recorded: another thread's in-place write meanwhile into memory
  // the function uses would be missing from every replay.
  // (A value the function dropped was checked at each read, lookup().)
  for (size_t v = 0; v < held_.size(); ++v) check_foreign_write(tensor(static_cast<int>(v)));
  // Arguments, captured tensors and .grads read at the call whose memory the function changed
  // in place (a compiled clip_grad_norm_ scales each .grad in place).
  size_t n_values = held_.size();
  for (size_t v = 0; v < n_values; ++v) {
    int src = p_.values[v].source;
    if (src < 0) continue;
    SourceKind k = p_.sources[src].kind;
    if (k != SourceKind::Arg && k != SourceKind::Captured && k != SourceKind::GradOf) continue;
    auto w = writes_.find(held_[v].storage()->serial());
    if (w == writes_.end()) continue;
    // A replay runs a deferred history's backward after its write-backs, which would find
    // this saved tensor changed (eager ran it before the write).
    if (history_saved_.count(held_[v].storage().get()) && p_.outside_backward.empty())
      p_.outside_backward = fmt::format(
          "{}, which saved a tensor (shape {}) that the function changes in place",
          p_.history_backward, to_string(held_[v].shape()));
    auto it = by_geometry_.find(key_of(held_[v]));
    if (it == by_geometry_.end() || write_count_[it->second] != w->second) {
      // Written through a view of another geometry (`x.view({n}) += 1`, `x.select(0, 1)
      // .fill_(7)`) and not read back whole: the functional program has no value of the whole
      // tensor after the write to copy back, so replay on the real tensors (the fuzzer's
      // "in-place write through a view of an argument is lost on replay").
      if (!p_.aliased_mutation)
        p_.aliased_mutation_reason = fmt::format(
            "an argument or captured tensor (shape {}) was changed in place through a view",
            to_string(held_[v].shape()));
      p_.aliased_mutation = true;
    } else if (it->second != static_cast<int>(v)) {
      p_.write_backs.push_back({src, it->second});
    }
  }
  for (const Tensor& leaf : grad_leaves_) {
    int lv = lookup(leaf);
    // A leaf the function made on an argument's memory (w = arg.detach().requires_grad_()):
    // the program knows only the argument, whose .grad a replay would set (break-it pass).
    if (const int src = p_.values[lv].source;
        src >= 0 && p_.grad_alias_reason.empty() && !tensor(lv).is_same(leaf) &&
        (p_.sources[src].kind == SourceKind::Arg || p_.sources[src].kind == SourceKind::Captured))
      p_.grad_alias_reason = fmt::format(
          "backward() set the .grad of a tensor it made on the memory of an argument or captured "
          "tensor (x.detach().requires_grad_(), shape {}), which a replay cannot tell from it",
          to_string(leaf.shape()));
    Tensor g = grad_of(leaf);
    p_.grad_assignments.push_back({lv, g.defined() ? lookup(g) : -1});
  }
  p_.grad_sharing = grad_sharing(p_, [&](int v) { return tensor(v); });
  p_.rng_consumed = 0;
  for (auto [at, blocks] : draws_) p_.rng_consumed += blocks;
}

std::vector<int> values_from(const Program& p, SourceKind kind) {
  std::vector<int> out;
  for (size_t v = 0; v < p.values.size(); ++v)
    if (int s = p.values[v].source; s >= 0 && p.sources[s].kind == kind)
      out.push_back(static_cast<int>(v));
  return out;
}

void mark_snapshots_reaching_caller(Program& p) {
  // alias[v]: the snapshot source whose memory value v shares (through view ops), or -1.
  std::vector<int> alias(p.values.size(), -1);
  for (size_t v = 0; v < p.values.size(); ++v) {
    int s = p.values[v].source;
    if (s >= 0 && p.sources[s].kind == SourceKind::Snapshot) alias[v] = s;
  }
  for (const Node& n : p.nodes)
    if (n.kind == Node::Kind::Op && op_info(n.op).category == OpCategory::View && !n.in.empty() &&
        n.in[0] >= 0 && alias[n.in[0]] >= 0)
      for (int o : n.out) alias[o] = alias[n.in[0]];
  auto reach = [&](int v) {
    if (v >= 0 && alias[v] >= 0) p.sources[alias[v]].reaches_caller = true;
  };
  for (int v : p.outputs) reach(v);
  for (auto [leaf, grad] : p.grad_assignments) reach(grad);
  for (auto [source, value] : p.write_backs) reach(value);
}

thread_local PrintScope::Positions PrintScope::t_positions;

PrintScope::PrintScope() : saved_(t_positions) { t_positions = {0, 0, true}; }
PrintScope::~PrintScope() { t_positions = saved_; }
void PrintScope::restart() { t_positions.next = 0; }
bool PrintScope::show_next() {
  Positions& p = t_positions;
  if (!p.active) return true;
  const bool show = p.next++ >= p.shown;
  if (show) p.shown = p.next;
  return show;
}

}  // namespace kiln::tracer
