#include "tracer/backward.h"

#include <algorithm>
#include <unordered_map>
#include <unordered_set>

#include "eager/autograd.h"
#include "eager/autograd_graph.h"
#include "eager/factories.h"
#include "eager/ops.h"

namespace kiln::tracer {

namespace {

// reach[i]: a path of autograd edges leads from `root` to target edge i without passing
// another target (the inputs' own histories are not entered, as partial_grads does not).
std::vector<bool> reachable(const autograd::Edge& root, const std::vector<autograd::Edge>& targets) {
  std::vector<bool> reach(targets.size(), false);
  auto mark = [&](const autograd::Edge& e) {
    bool hit = false;
    for (size_t i = 0; i < targets.size(); ++i)
      if (e.fn == targets[i].fn && e.input_nr == targets[i].input_nr) reach[i] = hit = true;
    return hit;
  };
  std::vector<autograd::Node*> stack;
  std::unordered_set<autograd::Node*> seen;
  if (!mark(root) && root.valid()) stack.push_back(root.fn.get());
  while (!stack.empty()) {
    autograd::Node* n = stack.back();
    stack.pop_back();
    if (!seen.insert(n).second) continue;
    for (const autograd::Edge& e : n->next_edges)
      if (e.valid() && !mark(e)) stack.push_back(e.fn.get());
  }
  return reach;
}

}  // namespace

void record_backward(Recorder& rec, Program& p, const std::vector<OutValue>& outs) {
  // Outputs require grad where grad mode was on (under no_grad too, with enable_grad inside).
  std::vector<Tensor> req_outs;
  std::vector<size_t> req_pos, req_tensor_pos;  // in `outs`; among the tensor results
  size_t tensors = 0;
  for (size_t k = 0; k < outs.size(); ++k) {
    const Tensor& t = outs[k].tensor;
    if (!outs[k].is_tensor) continue;  // a vector's length or a number: not the user's count
    if (t.defined() && t.requires_grad() && !t.is_leaf()) {
      req_outs.push_back(t);
      req_pos.push_back(k);
      req_tensor_pos.push_back(tensors);
    }
    ++tensors;
  }
  if (req_outs.empty()) return;
  // Replayed outputs are siblings in the autograd graph (one node computes them all from the
  // inputs): an output computed from another output that requires grad would lose that link,
  // and gradients with respect to the first (grad(), retain_grad) would differ from eager's.
  for (size_t j = 0; j < req_outs.size() && p.output_dependency.empty(); ++j) {
    autograd::Edge ej = autograd::gradient_edge(req_outs[j]);
    for (size_t k = 0; k < req_outs.size(); ++k) {
      autograd::Edge ek = autograd::gradient_edge(req_outs[k]);
      if (k == j || (ek.fn == ej.fn && ek.input_nr == ej.input_nr)) continue;
      if (reachable(ek, {ej})[0]) {
        p.output_dependency = fmt::format(
            "output {} is computed from output {}, which requires grad; a replay's outputs are "
            "siblings in the autograd graph, so gradients with respect to output {} (grad(), "
            "retain_grad) would differ from eager's",
            req_tensor_pos[k], req_tensor_pos[j], req_tensor_pos[j]);
        break;
      }
    }
  }
  for (size_t j = 0; j < req_outs.size(); ++j)
    if (autograd::Meta* m = autograd::meta(req_outs[j]); m && m->retains_grad)
      p.retained_outputs.push_back(static_cast<int>(req_pos[j]));
  std::vector<Tensor> inputs;
  std::vector<int> input_values;
  for (size_t v = 0; v < p.values.size(); ++v) {
    int s = p.values[v].source;
    if (s < 0) continue;
    SourceKind k = p.sources[s].kind;
    if ((k == SourceKind::Arg || k == SourceKind::Captured) && rec.tensor(v).requires_grad()) {
      inputs.push_back(rec.tensor(v));
      input_values.push_back(static_cast<int>(v));
    }
  }
  if (inputs.empty()) return;
  size_t mark = p.nodes.size();
  p.grad_outputs.assign(outs.size(), -1);
  std::vector<autograd::Edge> input_edges;
  for (const Tensor& t : inputs) input_edges.push_back(autograd::gradient_edge(t));
  p.grad_reach.assign(outs.size(), std::vector<bool>(inputs.size(), false));
  for (size_t j = 0; j < req_outs.size(); ++j)
    p.grad_reach[req_pos[j]] = reachable(autograd::gradient_edge(req_outs[j]), input_edges);
  // The eager nodes with saved tensors each output's backward passes through.
  std::vector<std::unordered_set<const autograd::Node*>> saving(req_outs.size());
  for (size_t j = 0; j < req_outs.size(); ++j) {
    std::vector<const autograd::Node*> stack;
    if (autograd::Edge root = autograd::gradient_edge(req_outs[j]); root.valid())
      stack.push_back(root.fn.get());
    std::unordered_set<const autograd::Node*> seen;
    while (!stack.empty()) {
      const autograd::Node* n = stack.back();
      stack.pop_back();
      if (!seen.insert(n).second) continue;
      if (auto* op = dynamic_cast<const autograd::OpNode*>(n)) {
        auto any_saved = [](const std::vector<autograd::SavedTensor>& v) {
          return std::any_of(v.begin(), v.end(), [](const auto& t) { return t.defined(); });
        };
        if (any_saved(op->saved_inputs) || any_saved(op->saved_outputs)) saving[j].insert(n);
      }
      for (const autograd::Edge& e : n->next_edges)
        if (e.valid()) stack.push_back(e.fn.get());
    }
  }
  p.shares_saved.assign(outs.size(), std::vector<bool>(outs.size(), false));
  for (size_t j = 0; j < req_outs.size(); ++j)
    for (size_t l = j + 1; l < req_outs.size(); ++l)
      if (std::any_of(saving[j].begin(), saving[j].end(),
                      [&](const autograd::Node* n) { return saving[l].count(n) > 0; }))
        p.shares_saved[req_pos[j]][req_pos[l]] = p.shares_saved[req_pos[l]][req_pos[j]] = true;
  std::vector<Tensor> placeholders;
  for (size_t j = 0; j < req_outs.size(); ++j) {
    Tensor g = untraced([&] { return ones_like(req_outs[j].detach()); });
    Source s;
    s.kind = SourceKind::GradOutput;
    s.index = static_cast<int>(req_pos[j]);
    p.grad_outputs[req_pos[j]] = rec.add_source(g, std::move(s));
    placeholders.push_back(g);
  }
  p.backward_begin = mark;
  try {
    std::vector<Tensor> grads = autograd::partial_grads(req_outs, inputs, placeholders);
    p.grad_inputs = input_values;
    for (const Tensor& g : grads) p.grad_results.push_back(g.defined() ? rec.lookup(g) : -1);
  } catch (const Error& e) {
    // The function already ran backward() on these outputs (a whole training step): no
    // backward to record. Any other error (a saved tensor the function then changed in place)
    // is eager's at the caller's backward: the function runs eagerly, so that it raises there.
    if (e.message() != autograd::kGraphFreedMessage) p.backward_error = e.message();
    p.nodes.resize(mark);
    p.backward_begin = SIZE_MAX;
    p.grad_outputs.clear();
    p.grad_reach.clear();
  }
}

namespace {

class CompiledBackward final : public autograd::Node {
 public:
  CompiledBackward(std::shared_ptr<const Program> p, std::shared_ptr<Plan> plan, RunState saved,
                   std::vector<Shape> out_shapes, std::vector<DType> out_dtypes,
                   std::vector<Device> out_devices, std::vector<std::pair<int, Tensor>> originals)
      : originals_(std::move(originals)),
        p_(std::move(p)),
        plan_(std::move(plan)),
        saved_(std::move(saved)),
        out_shapes_(std::move(out_shapes)),
        out_dtypes_(std::move(out_dtypes)),
        out_devices_(std::move(out_devices)) {
    for (size_t v = 0; v < saved_.slots.size(); ++v)
      if (saved_.slots[v].defined())
        saved_versions_.push_back({static_cast<int>(v), saved_.slots[v].version()});
    for (size_t i = 0; i < p_->sources.size(); ++i)
      if (Tensor t = source_tensor(i); t.defined())
        input_versions_.push_back({static_cast<int>(i), t.version()});
  }

  std::string name() const override { return "CompiledFunctionBackward"; }
  int num_outputs() const override { return static_cast<int>(p_->outputs.size()); }

  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override {
    // As eager's nodes: a second backward through an output needs retain_graph on the first.
    // The outputs share this node, so each may be back-propagated once on its own (eager's
    // x * 2 and exp(x) have a node each) unless eager's backward of the two shares a node that
    // saved tensors: the node is freed when every output has been. The
    // saved outputs are other handles to their memory (attach_backward), so an output never
    // back-propagated does not keep the node alive through them.
    applied_.assign(p_->grad_outputs.size(), false);
    for (size_t k = 0; k < applied_.size() && k < grads.size(); ++k)
      applied_[k] = p_->grad_outputs[k] >= 0 && grads[k].defined();
    // A backward without retain_graph through an output, or through one computed with it
    // through an eager node that saved tensors (shares_saved: it freed them, as eager's).
    bool again = released_;
    for (size_t k = 0; k < applied_.size() && k < consumed_.size(); ++k)
      for (size_t l = 0; l < consumed_.size() && applied_[k]; ++l)
        again |= consumed_[l] && (l == k || (k < p_->shares_saved.size() &&
                                             l < p_->shares_saved[k].size() &&
                                             p_->shares_saved[k][l]));
    KILN_CHECK(!again, "backward", autograd::backward_call_site(), "{}",
               autograd::kGraphFreedMessage);
    // As eager's saved tensors: a saved value (an output, say) changed in place since the call
    // would give a wrong gradient.
    for (auto& [v, version] : saved_versions_) {
      const Tensor& t = saved_.slots[v];
      KILN_CHECK(t.version() == version, producer_name(v), autograd::backward_call_site(),
                 "one of the tensors needed for gradient computation has been modified by an "
                 "in-place operation: a tensor of shape {} saved by the compiled function is at "
                 "version {}, expected version {}",
                 to_string(t.shape()), t.version(), version);
    }
    const Program& p = *p_;
    RunState st = saved_;
    // Outputs that got no gradient (unused by the loss) run the traced backward with zeros.
    std::vector<bool> no_grad(p.grad_outputs.size(), false);
    for (size_t k = 0; k < p.grad_outputs.size() && k < grads.size(); ++k) {
      int gv = p.grad_outputs[k];
      if (gv < 0) continue;
      if (grads[k].defined()) {
        st.slots[gv] = grads[k];
      } else {
        no_grad[k] = true;
        TensorOptions o(out_dtypes_[k]);
        o.device = out_devices_[k];
        st.slots[gv] = zeros(out_shapes_[k], o);
      }
    }
    bool partial = std::find(no_grad.begin(), no_grad.end(), true) != no_grad.end();
    // create_graph: the saved forward values carry no history, so the forward runs again on
    // eager kernels from the real inputs and eager autograd differentiates it. (The traced
    // backward was recorded with grad mode off: it read a saved x.detach() as x, and lacked
    // the graph that formulas add only under create_graph, e.g. relu's.)
    if (is_grad_enabled()) return eager_backward(grads, /*create_graph=*/true);
    plan_->run(st);
    std::vector<Tensor> out = results(st);
    if (partial && !without_unreached(out, no_grad)) return eager_backward(grads);
    return out;
  }

 private:
  // With some outputs' gradients missing, eager backward never runs their part of the graph:
  // inputs only they reach get no gradient, and their backward formulas never see a zero
  // gradient. The zeros give the same values (backward is linear in its gradient: J^T 0 = 0)
  // unless a formula is singular there (sqrt at 0: 0 * inf = NaN). Drops the gradients of the
  // unreached inputs; false when a result is not finite, so that eager_backward decides.
  bool without_unreached(std::vector<Tensor>& out, const std::vector<bool>& no_grad) const {
    const Program& p = *p_;
    for (size_t i = 0; i < out.size(); ++i) {
      bool reached = false;
      for (size_t k = 0; k < no_grad.size() && !reached; ++k)
        reached = p.grad_outputs[k] >= 0 && !no_grad[k] && k < p.grad_reach.size() &&
                  p.grad_reach[k][i];
      if (!reached) out[i] = Tensor();
    }
    for (const Tensor& g : out) {
      if (!g.defined() || !is_floating(g.dtype())) continue;
      // sum(g * 0) is 0 exactly when every element is finite, NaN otherwise.
      if (!(sum(mul(g, 0)).to(DType::Float64).item<double>() == 0)) return false;
    }
    return true;
  }

  // The op that made value `v` in the forward, or for an input the first op that read it (its
  // kiln::Error names it, as eager's names the op whose saved tensor changed).
  const char* producer_name(int v) const {
    const size_t end = std::min(p_->nodes.size(), p_->backward_begin);
    for (size_t i = 0; i < end; ++i)
      for (int o : p_->nodes[i].out)
        if (o == v && p_->nodes[i].kind == tracer::Node::Kind::Op)
          return op_name(p_->nodes[i].op).data();
    // An input (`a` of remainder(a, b)): the first op that read it saved it, as eager's error
    // names the op whose node saved the input.
    for (size_t i = 0; i < end; ++i)
      for (int in : p_->nodes[i].in)
        if (in == v && p_->nodes[i].kind == tracer::Node::Kind::Op)
          return op_name(p_->nodes[i].op).data();
    return "backward";
  }

  // Tensor argument or captured tensor `i` of the program's sources (undefined for other
  // sources and for a captured tensor since freed).
  Tensor source_tensor(size_t i) const {
    const Source& s = p_->sources[i];
    if (s.kind == SourceKind::Arg)
      return static_cast<size_t>(s.index) < saved_.args.size() ? saved_.args[s.index] : Tensor();
    if (s.kind == SourceKind::Captured) return Tensor(s.captured.lock());
    return Tensor();
  }

  // The forward re-run reads the inputs as they are now: one changed in place since the call
  // (its values are not kept) would give a silently wrong gradient, so this raises instead.
  void check_inputs_unchanged() const {
    for (auto& [i, version] : input_versions_) {
      Tensor t = source_tensor(i);
      KILN_CHECK(!t.defined() || t.version() == version, "backward",
                 autograd::backward_call_site(),
                 "this backward through a compiled call (create_graph, or an output without a "
                 "gradient) runs its forward again from its inputs, but {} (shape {}) was "
                 "modified in place after the call (version {}, expected {}); take the gradient "
                 "before modifying it, or call the function uncompiled",
                 p_->sources[i].kind == SourceKind::Arg ? "an argument" : "a captured tensor",
                 to_string(t.shape()), t.version(), version);
    }
  }

  // The call's inputs as they were before it ran (arguments, scalars, generator state, the
  // originals of what it changed in place), for re-running its forward on eager kernels.
  RunState call_inputs() const {
    RunState e;
    e.args = saved_.args;
    e.scalars = saved_.scalars;
    e.rng = saved_.rng;
    e.slots.resize(p_->values.size());
    for (auto& [v, t] : originals_) e.slots[v] = t;
    return e;
  }

  // Eager's exact answer: the forward again on eager kernels, recording autograd, and a
  // backward from the outputs that have gradients only.
  std::vector<Tensor> eager_backward(const std::vector<Tensor>& grads,
                                     bool create_graph = false) const {
    const Program& p = *p_;
    check_inputs_unchanged();
    RunState e = call_inputs();
    e.detach_as_traced = true;
    std::vector<Tensor> roots, root_grads, inputs;
    {
      EnableGradGuard enable;
      for (size_t i = 0; i < p.nodes.size() && i < p.backward_begin; ++i)
        if (p.nodes[i].kind == tracer::Node::Kind::Op) run_node_eagerly(p, p.nodes[i], e);
      for (size_t k = 0; k < p.grad_outputs.size() && k < grads.size(); ++k) {
        if (p.grad_outputs[k] < 0 || !grads[k].defined()) continue;
        roots.push_back(e.value(p, p.outputs[k]));
        root_grads.push_back(grads[k]);
      }
      for (int v : p.grad_inputs) inputs.push_back(e.value(p, v));
    }
    return autograd::partial_grads(roots, inputs, root_grads, create_graph);
  }


  std::vector<Tensor> results(RunState& st) const {
    std::vector<Tensor> out;
    for (int v : p_->grad_results) out.push_back(v >= 0 ? st.value(*p_, v) : Tensor());
    return out;
  }

  void release() override {
    consumed_.resize(p_->grad_outputs.size(), false);
    bool all = true;
    for (size_t k = 0; k < consumed_.size(); ++k) {
      consumed_[k] = consumed_[k] || applied_.empty() || (k < applied_.size() && applied_[k]);
      all &= consumed_[k] || p_->grad_outputs[k] < 0;
    }
    if (!all) return;
    saved_ = RunState{};
    saved_versions_.clear();
    released_ = true;
  }

  std::vector<std::pair<int, Tensor>> originals_;  // see attach_backward
  std::shared_ptr<const Program> p_;
  std::shared_ptr<Plan> plan_;
  RunState saved_;
  bool released_ = false;
  std::vector<bool> applied_;   // outputs the latest apply() had gradients for
  std::vector<bool> consumed_;  // outputs a backward without retain_graph went through
  std::vector<std::pair<int, uint64_t>> saved_versions_;  // (value id, version when saved)
  std::vector<std::pair<int, uint64_t>> input_versions_;  // (source, version after the call)
  std::vector<Shape> out_shapes_;
  std::vector<DType> out_dtypes_;
  std::vector<Device> out_devices_;
};

// Outputs that are views behave as eager's views do under later in-place ops.
// - A view of a tensor with gradient history (an argument's `w.t()`): an in-place op recorded
//   on its memory afterwards makes it stale, so using it raises instead of losing the gradient.
// - A view of a value the caller never sees (`(w * 2).t()`) has no base whose history an
//   in-place op on it could rebase (eager's CopySlices), which lost the gradient on replays: it
//   stands alone when it is the only output viewing that memory, as no one else can see a write.
//   Several outputs viewing one such value stay views, so an in-place op on one raises.
//   `caller_memory`: the storages of the arguments and captured tensors, which the caller sees
//   (a view of a leaf made by view().requires_grad_() has a base without history).
void mark_view_outputs(std::vector<OutValue>& outs,
                       const std::unordered_set<const StorageImpl*>& caller_memory) {
  std::unordered_map<const TensorImpl*, int> viewers;
  for (const OutValue& o : outs)
    if (o.is_tensor && o.tensor.defined() && o.tensor.impl()->base)
      ++viewers[o.tensor.impl()->base.get()];
  for (OutValue& o : outs) {
    autograd::Meta* m = o.is_tensor && o.tensor.defined() ? autograd::meta(o.tensor) : nullptr;
    if (!m || !m->requires_grad || !o.tensor.impl()->base) continue;
    const auto& base = o.tensor.impl()->base;
    auto* bm = static_cast<autograd::Meta*>(base->autograd.get());
    if (!(bm && (bm->requires_grad || bm->grad_fn)) && viewers[base.get()] == 1 &&
        !caller_memory.count(o.tensor.storage().get())) {
      o.tensor.impl()->base = nullptr;
      continue;
    }
    m->is_view_of_grad_tensor = true;
    m->view_version = o.tensor.storage()->history_version();
  }
}

}  // namespace

void attach_backward(const std::shared_ptr<const Program>& pp,
                     const std::shared_ptr<Plan>& backward, const std::vector<int>& saved,
                     RunState& st, std::vector<OutValue>& outs,
                     std::vector<std::pair<int, Tensor>> originals) {
  const Program& p = *pp;
  bool any = false;
  for (size_t k = 0; k < p.grad_outputs.size(); ++k) any |= p.grad_outputs[k] >= 0;
  if (!any) return;
  RunState keep;
  keep.args = st.args;
  keep.scalars = st.scalars;
  keep.rng = st.rng;
  keep.in_place = false;
  keep.slots.resize(p.values.size());
  for (int v : saved) keep.slots[v] = st.value(p, v);
  // An output saved for backward is kept as another handle to its memory: the output gets this
  // node as its grad_fn below, and holding the output itself would make a reference cycle that
  // kept every call whose outputs were not back-propagated (a forward under grad mode) alive:
  // 2000 such calls with 256 KiB outputs held 500 MB.
  for (int v : p.outputs)
    if (v >= 0 && v < int(keep.slots.size()) && keep.slots[v].defined())
      keep.slots[v] = keep.slots[v].detach();
  std::vector<Shape> shapes(outs.size());
  std::vector<DType> dtypes(outs.size(), DType::Float32);
  std::vector<Device> devices(outs.size(), Device::cpu());
  for (size_t k = 0; k < outs.size(); ++k)
    if (outs[k].is_tensor && outs[k].tensor.defined()) {
      shapes[k] = outs[k].tensor.shape();
      dtypes[k] = outs[k].tensor.dtype();
      devices[k] = outs[k].tensor.device();
    }
  auto node = std::make_shared<CompiledBackward>(pp, backward, std::move(keep), shapes, dtypes,
                                                 devices, std::move(originals));
  for (int v : p.grad_inputs) node->next_edges.push_back(autograd::gradient_edge(st.value(p, v)));
  for (size_t k = 0; k < outs.size(); ++k) {
    int v = p.grad_outputs.empty() ? -1 : p.grad_outputs[k];
    if (v < 0 || !outs[k].tensor.defined()) continue;
    if (p.values[p.outputs[k]].source >= 0) continue;  // an argument returned as is
    // The same value also returned without a gradient (`h` and `h.detach()`): this output gets
    // a handle of its own, so the other one stays detached, as in eager.
    for (size_t j = 0; j < outs.size(); ++j)
      if (j != k && outs[j].is_tensor && outs[j].tensor.is_same(outs[k].tensor) &&
          p.grad_outputs[j] < 0) {
        outs[k].tensor = outs[k].tensor.detach();
        break;
      }
    autograd::Meta& m = autograd::ensure_meta(outs[k].tensor);
    m.requires_grad = true;
    m.grad_fn = node;
    m.output_nr = static_cast<uint32_t>(k);
  }
  std::unordered_set<const StorageImpl*> caller_memory;
  for (const Tensor& a : st.args)
    if (a.defined()) caller_memory.insert(a.storage().get());
  for (const Source& s : p.sources)
    if (s.kind == SourceKind::Captured)
      if (auto impl = s.captured.lock()) caller_memory.insert(impl->storage.get());
  mark_view_outputs(outs, caller_memory);
}

HistoryReach history_reach(const std::vector<autograd::Edge>& edges) {
  HistoryReach r;
  std::vector<autograd::Node*> stack;
  std::unordered_set<const autograd::Node*> seen;
  for (const autograd::Edge& e : edges)
    if (e.valid()) stack.push_back(e.fn.get());
  while (!stack.empty()) {
    autograd::Node* n = stack.back();
    stack.pop_back();
    if (!seen.insert(n).second) continue;
    if (auto* acc = dynamic_cast<const autograd::AccumulateGrad*>(n))
      if (auto leaf = acc->leaf()) r.grads.insert(leaf.get());
    for (auto& [nr, weak] : n->retained)
      if (auto t = weak.lock()) r.grads.insert(t.get());
    if (auto* op = dynamic_cast<const autograd::OpNode*>(n))
      for (const auto* list : {&op->saved_inputs, &op->saved_outputs})
        for (const autograd::SavedTensor& t : *list) {
          if (auto impl = t.impl(); impl && impl->storage) r.saved.insert(impl->storage.get());
          r.raises = r.raises || !t.unpacks();
        }
    for (const autograd::Edge& e : n->next_edges)
      if (e.valid()) stack.push_back(e.fn.get());
  }
  return r;
}

}  // namespace kiln::tracer
