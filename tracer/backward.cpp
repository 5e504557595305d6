#include "tracer/backward.h"

#include "eager/autograd.h"
#include "eager/autograd_graph.h"
#include "eager/factories.h"

namespace kiln::tracer {

void record_backward(Recorder& rec, Program& p, const std::vector<OutValue>& outs) {
  if (!is_grad_enabled()) return;
  std::vector<Tensor> req_outs;
  std::vector<size_t> req_pos;
  for (size_t k = 0; k < outs.size(); ++k) {
    const Tensor& t = outs[k].tensor;
    if (outs[k].is_tensor && t.defined() && t.requires_grad() && !t.is_leaf()) {
      req_outs.push_back(t);
      req_pos.push_back(k);
    }
  }
  if (req_outs.empty()) return;
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
    std::vector<Tensor> grads = kiln::grad(req_outs, inputs, placeholders, /*create_graph=*/false,
                                           /*retain_graph=*/true, /*allow_unused=*/true);
    p.grad_inputs = input_values;
    for (const Tensor& g : grads) p.grad_results.push_back(g.defined() ? rec.lookup(g) : -1);
  } catch (const Error&) {
    // The function already ran backward() on these outputs (a whole training step).
    p.nodes.resize(mark);
    p.backward_begin = SIZE_MAX;
    p.grad_outputs.clear();
  }
}

namespace {

class CompiledBackward final : public autograd::Node {
 public:
  CompiledBackward(std::shared_ptr<const Program> p, std::shared_ptr<Plan> plan, RunState saved,
                   std::vector<Shape> out_shapes, std::vector<DType> out_dtypes,
                   std::vector<Device> out_devices)
      : p_(std::move(p)),
        plan_(std::move(plan)),
        saved_(std::move(saved)),
        out_shapes_(std::move(out_shapes)),
        out_dtypes_(std::move(out_dtypes)),
        out_devices_(std::move(out_devices)) {}

  std::string name() const override { return "CompiledFunctionBackward"; }
  int num_outputs() const override { return static_cast<int>(p_->outputs.size()); }

  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override {
    // As eager's nodes: a second backward needs retain_graph on the first.
    KILN_CHECK(!released_, "backward", autograd::backward_call_site(), "{}",
               autograd::kGraphFreedMessage);
    const Program& p = *p_;
    RunState st = saved_;
    for (size_t k = 0; k < p.grad_outputs.size() && k < grads.size(); ++k) {
      int gv = p.grad_outputs[k];
      if (gv < 0) continue;
      if (grads[k].defined()) {
        st.slots[gv] = grads[k];
      } else {
        TensorOptions o(out_dtypes_[k]);
        o.device = out_devices_[k];
        st.slots[gv] = zeros(out_shapes_[k], o);
      }
    }
    if (is_grad_enabled()) {
      // create_graph: the saved forward values carry no history, so recompute the forward
      // and the backward on eager kernels from the real inputs (exact higher-order grads).
      RunState e;
      e.args = saved_.args;
      e.scalars = saved_.scalars;
      e.rng = saved_.rng;
      e.slots.resize(p.values.size());
      for (int gv : p.grad_outputs)
        if (gv >= 0) e.slots[gv] = st.slots[gv];
      for (size_t i = 0; i < p.nodes.size(); ++i)
        if (p.nodes[i].kind == tracer::Node::Kind::Op) run_node_eagerly(p, p.nodes[i], e);
      return results(e);
    }
    plan_->run(st);
    return results(st);
  }

 private:
  std::vector<Tensor> results(RunState& st) const {
    std::vector<Tensor> out;
    for (int v : p_->grad_results) out.push_back(v >= 0 ? st.value(*p_, v) : Tensor());
    return out;
  }

  void release() override {
    saved_ = RunState{};
    released_ = true;
  }

  std::shared_ptr<const Program> p_;
  std::shared_ptr<Plan> plan_;
  RunState saved_;
  bool released_ = false;
  std::vector<Shape> out_shapes_;
  std::vector<DType> out_dtypes_;
  std::vector<Device> out_devices_;
};

}  // namespace

void attach_backward(const std::shared_ptr<const Program>& pp,
                     const std::shared_ptr<Plan>& backward, const std::vector<int>& saved,
                     RunState& st, std::vector<OutValue>& outs) {
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
                                                 devices);
  for (int v : p.grad_inputs) node->next_edges.push_back(autograd::gradient_edge(st.value(p, v)));
  for (size_t k = 0; k < outs.size(); ++k) {
    int v = p.grad_outputs.empty() ? -1 : p.grad_outputs[k];
    if (v < 0 || !outs[k].tensor.defined()) continue;
    if (p.values[p.outputs[k]].source >= 0) continue;  // an argument returned as is
    autograd::Meta& m = autograd::ensure_meta(outs[k].tensor);
    m.requires_grad = true;
    m.grad_fn = node;
    m.output_nr = static_cast<uint32_t>(k);
  }
}

}  // namespace kiln::tracer
