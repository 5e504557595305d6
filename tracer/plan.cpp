#include "tracer/plan.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <limits>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "backends/cuda/driver.h"
#include "codegen/codegen.h"
#include "core/env.h"
#include "eager/autograd.h"
#include "eager/dispatch.h"
#include "eager/factories.h"
#include "eager/value_checks.h"
#include "eager/view.h"
#include "ir/graph.h"
#include "tracer/recorder.h"

namespace kiln::tracer {
namespace {

/// Waits for the kernels queued on `d` (CUDA launches are asynchronous), so a time taken after
/// it includes them.
void wait_for(Device d) {
  if (d.is_cuda()) cuda::synchronize(d.index);
}

/// Waits for every CUDA device (KILN_PROFILE's step times).
void wait_for_all_devices() {
  if (!cuda::is_available()) return;
  for (int i = 0; i < cuda::device_count(); ++i) cuda::synchronize(i);
}

}  // namespace

// ------------------------------------ RunState ------------------------------------

const Tensor& RunState::value(const Program& p, int v) {
  Tensor& slot = slots[v];
  if (slot.defined()) return slot;
  int si = p.values[v].source;
  KILN_CHECK(si >= 0, "compile", Loc::current(),
             "internal error: value %{} used before it was computed", v);
  const Source& s = p.sources[si];
  switch (s.kind) {
    case SourceKind::Arg: slot = args[s.index]; break;
    case SourceKind::ScalarArg:
    case SourceKind::Constant:
    case SourceKind::HostInput:
    case SourceKind::SizeOf: slot = dispatch::wrap_scalar(*host_scalar(p, v)); break;
    case SourceKind::Captured: {
      auto impl = s.captured.lock();
      if (!impl) throw GuardFailure{"a tensor the function captured was freed", true};
      slot = Tensor(std::move(impl));
      const ValueInfo& vi = p.values[v];
      if (slot.dtype() != vi.dtype || slot.shape() != vi.shape)
        throw GuardFailure{fmt::format("a captured tensor changed from {} {} to {} {}",
                                       name(vi.dtype), to_string(vi.shape), name(slot.dtype()),
                                       to_string(slot.shape())),
                           true};
      if (slot.device() != vi.device)  // module.to(device) after compiling
        throw GuardFailure{fmt::format("a captured tensor ({} {}) moved from {} to {}",
                                       name(vi.dtype), to_string(vi.shape), vi.device.str(),
                                       slot.device().str()),
                           true};
      if (slot.requires_grad() != s.requires_grad)
        throw GuardFailure{fmt::format("requires_grad of a captured tensor ({} {}) is now {}",
                                       name(vi.dtype), to_string(vi.shape), slot.requires_grad())};
      break;
    }
    case SourceKind::GradOf: {
      Tensor g = value(p, s.index).grad();
      if (!g.defined()) throw GuardFailure{"the .grad the function read is no longer defined"};
      if (g.is_contiguous() != s.contiguous)
        throw GuardFailure{fmt::format("the .grad the function read ({} {}) is {} contiguous",
                                       name(g.dtype()), to_string(g.shape()),
                                       s.contiguous ? "no longer" : "now")};
      if (!s.contiguous && g.strides() != s.strides)
        throw GuardFailure{fmt::format("the .grad the function read ({} {}) has strides {}, "
                                       "traced with {}", name(g.dtype()), to_string(g.shape()),
                                       to_string(g.strides()), to_string(s.strides))};
      slot = g;
      break;
    }
    case SourceKind::Snapshot: {
      const ValueInfo& vi = p.values[v];
      if (s.overwritten)
        slot = untraced([&] { return empty(shape_of(vi), {vi.dtype, vi.device}); });
      else if (s.ramp)
        slot = untraced([&] {
          int64_t n = shape_of(vi)[0];
          return arange(s.ramp_start, s.ramp_start + n * s.ramp_step, s.ramp_step,
                        {vi.dtype, vi.device});
        });
      else
        slot = in_place || s.reaches_caller ? untraced([&] { return s.snapshot.clone(); })
                                            : s.snapshot;
      break;
    }
    case SourceKind::GradOutput:
      KILN_CHECK(false, "compile", Loc::current(), "internal error: missing incoming gradient");
  }
  return slot;
}

std::optional<Scalar> RunState::host_scalar(const Program& p, int v) {
  int si = p.values[v].source;
  if (si < 0) return std::nullopt;
  const Source& s = p.sources[si];
  switch (s.kind) {
    case SourceKind::ScalarArg: return scalars[s.index];
    case SourceKind::Constant: return s.scalar;
    case SourceKind::HostInput: {
      // Read once per call, at its first use, like the tensor value() makes of it.
      for (auto& [value, read] : host_reads)
        if (value == v) return read;
      // A reader raises when its value cannot be used now but may be again (an optimizer's
      // options made invalid): the entry is kept and the call traces, raising as eagerly.
      std::optional<Scalar> now;
      try {
        now = s.host();
      } catch (const Error& e) {
        throw GuardFailure{fmt::format("a host value the function reads at run time cannot be "
                                       "read now ({})", e.message())};
      }
      if (!now) throw GuardFailure{"the host value the function reads at run time is gone", true};
      if (now->kind() != s.scalar.kind())
        throw GuardFailure{"a host value the function reads at run time changed type"};
      if (host_reads.empty()) host_reads.reserve(16);
      host_reads.emplace_back(v, *now);
      return now;
    }
    case SourceKind::SizeOf: return size_value(s.size, eval(s.size.sym), s.scalar);
    default: return std::nullopt;
  }
}

Shape RunState::shape_of(const ValueInfo& v) const {
  Shape out = v.shape;
  for (int d = 0; d < int(v.sym.size()) && d < out.size(); ++d)
    if (v.sym[d].arg >= 0) out[d] = eval(v.sym[d]);
  return out;
}

uint64_t RunState::rng_offset(const Program& p, size_t node) const {
  if (!p.rng_symbolic) {  // the offset of the first random node from `node` on
    for (size_t i = node; i < p.nodes.size(); ++i) {
      const Node& n = p.nodes[i];
      if (n.kind == Node::Kind::Op && op_info(n.op).category == OpCategory::Random)
        return n.rng_delta;
    }
    return p.rng_consumed;
  }
  return rng_offset_before(p, node, [&](int v) { return numel(shape_of(p.values[v])); });
}

// ------------------------------------ steps ------------------------------------

namespace {

// Ops whose attributes hold sizes or counters that the region's MLIR would bake in.
OpAttrs resolved_attrs(const Program& p, const Node& n, const RunState& st) {
  OpAttrs a = n.attrs;
  for (const SymAttr& s : n.sym_attrs) {
    int64_t v = st.eval(s.sym);
    switch (s.field) {
      case SymAttr::Dims: a.dims[s.index] = v; break;
      case SymAttr::Start: a.start = v; break;
      case SymAttr::End: a.end = v; break;
    }
  }
  if (op_info(n.op).category == OpCategory::Random) {
    a.seed = st.rng.seed;
    a.offset = st.rng.offset + st.rng_offset(p, static_cast<size_t>(&n - p.nodes.data()));
  }
  return a;
}

bool lowerable(const Program& p, const Node& n) {
  if (n.kind != Node::Kind::Op || !n.sym_attrs.empty()) return false;
  if (n.op == OpKind::Contiguous) return true;  // a copy: the same value in a functional graph
  if (n.in_place) {
    // Functional copy_/fill_: broadcast the source to the destination (same dtype only).
    if (n.op == OpKind::Fill) return true;
    return p.values[n.in[0]].dtype == p.values[n.in[1]].dtype;
  }
  if (n.op == OpKind::Cat) {
    // Lowered as slices written into the result (codegen/lower.cpp): inputs of the result's
    // dtype only (eager's cat promotes).
    const DType t = p.values[n.out[0]].dtype;
    for (int v : n.in)
      if (v < 0 || p.values[v].wrapped || p.values[v].dtype != t) return false;
  }
  if (n.op == OpKind::IndexSelect || n.op == OpKind::Gather || n.op == OpKind::Embedding ||
      n.op == OpKind::IndexAdd || n.op == OpKind::IndexCopy || n.op == OpKind::ScatterAdd) {
    // Compiled code clamps an index into the indexed dim (codegen/lower_index.cpp): the dim
    // must be static, its traced size the run's, and not 0 (nothing to clamp into). Bool
    // index_add / scatter_add (a logical or) are not lowered.
    const ValueInfo& x = p.values[n.in[0]];
    if (x.shape.size() == 0) return false;
    if ((n.op == OpKind::IndexAdd || n.op == OpKind::ScatterAdd) && x.dtype == DType::Bool)
      return false;
    const int axis = n.op == OpKind::Embedding ? 0 : wrap_dim(n.attrs.dim, x.shape.size(), "");
    if (x.shape[axis] == 0 || (axis < static_cast<int>(x.sym.size()) && x.sym[axis].arg >= 0))
      return false;
  }
  return ir::supports(n.op);
}

std::vector<int64_t> dims_of(const ValueInfo& v, bool dynamic) {
  std::vector<int64_t> d(v.shape.data(), v.shape.data() + v.shape.size());
  if (dynamic)
    for (size_t i = 0; i < v.sym.size() && i < d.size(); ++i)
      if (v.sym[i].arg >= 0) d[i] = ir::kDynamic;
  return d;
}

// Whether a value has a symbolic dim.
bool has_symbolic(const ValueInfo& v) {
  for (const SymInt& s : v.sym)
    if (s.arg >= 0) return true;
  return false;
}

// Whether two values of the same traced shape have the same symbolic dims.
bool same_symbols(const ValueInfo& a, const ValueInfo& b) {
  for (size_t i = 0; i < std::max(a.sym.size(), b.sym.size()); ++i) {
    SymInt x = i < a.sym.size() ? a.sym[i] : SymInt{}, y = i < b.sym.size() ? b.sym[i] : SymInt{};
    if (x.arg != y.arg || (x.arg >= 0 && !(x == y))) return false;
  }
  return true;
}

// `src` broadcast to `dst`'s (possibly symbolic) shape: where(dst == dst, src, src). A
// functional fill_/copy_ in a graph with `?` dims, where an expand would bake in the traced
// shape (the fuzzer's "fill_ of a dynamic-size value keeps the size it was traced with").
ir::Value broadcast_like(ir::Graph& g, ir::Value dst, ir::Value src, Loc loc) {
  ir::Value cond = g.op(OpKind::Eq, {dst, dst}, {}, loc);
  return g.op(OpKind::Where, {cond, src, src}, {}, loc);
}

}  // namespace

struct Plan::Region {
  std::vector<size_t> nodes;
  struct Input {
    int value;
    DType dtype;  // wrapped scalars enter in their op's compute dtype
  };
  std::vector<Input> inputs;
  std::vector<int> outputs;                   // graph outputs, in order
  std::vector<std::pair<int, int>> aliases;   // (value, value it equals) resolved after the run
  // Outputs that are views of the region's inputs (a weight's W.t() saved for backward): not
  // graph outputs (a materialised copy per call, and an output without rows stops the row
  // split), but these view nodes, run on eager kernels after the compiled code (free views);
  // also contiguous() of an input (a copy only when the input is strided).
  std::vector<size_t> views;
  std::shared_ptr<codegen::Executable> exe;   // compiled with symbolic dims (or static)
  Device device = Device::cpu();              // where exe runs: its inputs' device
  bool static_only = false;                   // exe only valid for the traced shapes
  bool eager_fallback = false;  // neither build worked: run the nodes eagerly
  // Measured choice between the compiled code and the region's ops on eager kernels: eager
  // kernels are kept if 5 % faster (kiln's eager kernels are fused and multi-threaded too, and
  // win for some shapes, e.g. a lone reduction over rows). The first kTrials / 2 calls run both
  // ways, eager kernels first, and return the compiled code's results, so a call's results do
  // not depend on which way it timed (the two round differently: FMA contraction, polynomial
  // exp, summation order). Once eager kernels are kept, results switch to theirs once. Calls
  // whose values alias as in the user's code (RunState::in_place) cannot run twice: the first
  // kTrials calls alternate. The first call (pair) only warms up. When the first timed pair
  // differs by 30 % or more the choice is made there: each eager-kernel trial of the
  // Transformer step's region cost 30 ms over the compiled code's 66, and two of them fell in
  // the benchmark's timed steps.
  static constexpr int kTrials = 8;
  static constexpr double kClearMargin = 1.3;
  mutable std::atomic<int> trials{0};
  // Fastest timed run each way: the machine's other load only ever adds time, so the minimum
  // estimates a way's own cost better than a sum (3 runs each way; with sums, other jobs on a
  // shared 2-vCPU machine made the transformer step keep the slower way: 0.82x eager).
  static constexpr int64_t kNotTimed = std::numeric_limits<int64_t>::max();
  mutable std::atomic<int64_t> compiled_ns{kNotTimed}, eager_ns{kNotTimed};
  mutable std::atomic<int> choice{-1};  // -1 measuring, 0 compiled, 1 eager kernels
  // Whether both ways were timed (other threads may still be running their trials) and their
  // fastest runs differ by kClearMargin or more.
  bool clear_winner() const {
    const int64_t e = eager_ns.load(), c = compiled_ns.load();
    if (e == kNotTimed || c == kNotTimed) return false;
    return static_cast<double>(std::max(e, c)) >= kClearMargin * static_cast<double>(std::min(e, c));
  }
  std::string fallback_reason;  // eager_fallback, or static_only: why the symbolic build failed
  // Nodes whose eager kernels reject input values that their compiled code computes through
  // (see data_checked_inputs): their inputs are scanned after a compiled run (run_compiled).
  std::vector<size_t> data_checked;
  // Buffer donation: candidate (new value, old value) pairs (PlanOptions::donate), and the
  // (output, input) indices whose output the compiled code computes in the input's buffer.
  std::vector<std::pair<int, int>> donate;
  std::vector<std::pair<int, int>> in_place;
  // For the region's ops on eager kernels: free_after_node[k], the values defined here and not
  // needed after the region whose last reader is nodes[k] (or nodes[k] itself, if nothing reads
  // them). Freed there, as eager frees an intermediate after its last use: kept to the end of
  // the region, a chain of 20 ops held 40 times eager's memory in its trial runs.
  std::vector<std::vector<int>> free_after_node;
};

struct Plan::Step {
  enum class Kind { Region, Eager, Read, Callback } kind;
  size_t node = 0;
  std::unique_ptr<Region> region;
  std::vector<int> free_after;
  // KILN_PROFILE=1: wall time of this step summed over runs (shown by explain()).
  struct Profile {
    std::atomic<int64_t> ns{0}, runs{0};
  };
  std::unique_ptr<Profile> profile = std::make_unique<Profile>();
};

namespace {

// Inputs of `n` whose values eager's kernel checks but compiled code does not
// (eager/value_checks.h: class indices and indices, integer divisors, integer pow).
std::vector<int> data_checked_inputs(const Node& n) {
  std::vector<int> out;
  for (int k : value_checked_inputs(n.op, n.attrs, n.meta.compute_dtype)) out.push_back(n.in[k]);
  return out;
}

// The values of `v` as int64 (a copy).
std::vector<int64_t> int_values(const Program& p, RunState& st, int v) {
  Tensor t = st.value(p, v).to(DType::Int64).contiguous().cpu();
  const int64_t* d = t.data<int64_t>();
  return std::vector<int64_t>(d, d + t.numel());
}

// Whether eager's kernel raises for the inputs `n` got in this run (data_checked_inputs). The
// shapes are the traced ones: a compiled run has the program's shapes, or a symbolic graph in
// which the dims these checks read are static (nll_loss's class dim, ir/decompose.cpp; the
// indexed dim of index_select / gather / embedding, lowerable()).
bool eager_rejects(const Program& p, const Node& n, RunState& st) {
  std::vector<Shape> shapes;
  for (int v : n.in) shapes.push_back(v >= 0 ? p.values[v].shape : Shape{});
  std::vector<std::vector<int64_t>> values;
  for (int v : data_checked_inputs(n)) values.push_back(int_values(p, st, v));
  return eager_rejects_values(n.op, n.attrs, shapes, values);
}

// Builds the region's graph; `dynamic` puts `?` where the program has symbolic dims.
// Returns the graph and fills inputs/outputs/aliases/views.
// `checked`: values the run checks after the region (data_checked_inputs), made outputs too.
ir::Graph region_graph(const Program& p, const std::vector<size_t>& nodes,
                       const std::vector<bool>& used_outside, const std::vector<int>& checked,
                       bool dynamic,
                       std::vector<int>& inputs_v, std::vector<DType>& inputs_t,
                       std::vector<int>& outputs, std::vector<std::pair<int, int>>& aliases,
                       std::vector<size_t>& views) {
  ir::Graph g;
  std::unordered_map<int, ir::Value> val;
  std::unordered_map<int32_t, int> input_value;  // graph input id -> program value
  std::map<std::pair<int, DType>, ir::Value> consts, wrapped_inputs;
  inputs_v.clear(), inputs_t.clear(), outputs.clear(), aliases.clear(), views.clear();
  auto get = [&](int v, const Node& n) -> ir::Value {
    if (v < 0) return ir::Value{};
    if (auto it = val.find(v); it != val.end()) return it->second;
    const ValueInfo& vi = p.values[v];
    DType dt = vi.wrapped ? n.meta.compute_dtype : vi.dtype;
    if (n.op == OpKind::Where && v == n.in[0]) dt = vi.dtype;
    if (vi.source >= 0 && p.sources[vi.source].kind == SourceKind::Constant) {
      auto key = std::make_pair(v, dt);
      if (auto it = consts.find(key); it != consts.end()) return it->second;
      return consts[key] = g.constant(p.sources[vi.source].scalar, dt);
    }
    // A wrapped host number (a dynamic scalar, an optimizer option) enters once per compute
    // dtype it is used in.
    auto key = std::make_pair(v, dt);
    if (vi.wrapped)
      if (auto it = wrapped_inputs.find(key); it != wrapped_inputs.end()) return it->second;
    ir::Value in = g.input(dt, dims_of(vi, dynamic));
    inputs_v.push_back(v), inputs_t.push_back(dt);
    input_value[in.id] = v;
    if (!vi.wrapped) val[v] = in;
    else wrapped_inputs[key] = in;
    return in;
  };
  for (size_t i : nodes) {
    const Node& n = p.nodes[i];
    std::vector<ir::Value> ins;
    for (int v : n.in) ins.push_back(get(v, n));
    int out = n.out[0];
    if (n.op == OpKind::Contiguous) {
      val[out] = ins[0];
    } else if (n.in_place && n.op == OpKind::Fill) {
      const ValueInfo& d = p.values[out];
      OpAttrs a;
      a.dims = d.shape;
      ir::Value c = g.constant(n.attrs.alpha, d.dtype);
      if (dynamic && has_symbolic(d))  // expand's shape would be the traced one: broadcast
        val[out] = broadcast_like(g, ins[0], c, n.loc);
      else
        val[out] = d.shape.size() == 0 ? c : g.op(OpKind::Expand, {c}, a, n.loc);
    } else if (n.in_place) {  // copy_(dst, src), same dtype
      const ValueInfo& d = p.values[out];
      const ValueInfo& s = p.values[n.in[1]];
      if (s.shape == d.shape && !s.wrapped && (!dynamic || same_symbols(s, d))) {
        val[out] = ins[1];
      } else if (dynamic && has_symbolic(d)) {
        val[out] = broadcast_like(g, ins[0], ins[1], n.loc);
      } else {
        OpAttrs a;
        a.dims = d.shape;
        val[out] = g.op(OpKind::Expand, {ins[1]}, a, n.loc);
      }
    } else {
      val[out] = g.op(n.op, ins, n.attrs, n.loc);
    }
  }
  // Views (chains of them) of values the region reads: node of each, else none.
  std::unordered_map<int, size_t> producer;
  for (size_t i : nodes) producer[p.nodes[i].out[0]] = i;
  std::vector<size_t> view_nodes;
  auto view_chain = [&](int v) {
    view_nodes.clear();
    for (auto it = producer.find(v); it != producer.end(); it = producer.find(p.nodes[it->second].in[0])) {
      const Node& n = p.nodes[it->second];
      if (op_info(n.op).category != OpCategory::View || n.in_place || n.in.empty() || n.in[0] < 0)
        return false;
      view_nodes.push_back(it->second);
    }
    return !view_nodes.empty();
  };
  // A function result that is a view (transpose, slice, expand, ...) of a value computed here:
  // eager returns that view, sharing the value's memory (with other results, strides and all),
  // so the region outputs the value and the view runs after it (a contiguous copy made
  // `out.view(...)` pass compiled where eager raises, and results that are views of one
  // another stopped sharing memory: an in-place write to one missed the other). The value it
  // views, or -1.
  auto layout_view_of = [&](int v) {
    view_nodes.clear();
    if (std::find(p.outputs.begin(), p.outputs.end(), v) == p.outputs.end()) return -1;
    int cur = v;
    for (auto it = producer.find(cur); it != producer.end(); it = producer.find(cur)) {
      const Node& n = p.nodes[it->second];
      if (op_info(n.op).category != OpCategory::View) break;
      if (n.in_place || n.in.empty() || n.in[0] < 0) return -1;
      view_nodes.push_back(it->second);
      cur = n.in[0];
    }
    return view_nodes.empty() || !producer.count(cur) ? -1 : cur;
  };
  auto add_output = [&](int v) {
    if (std::find(outputs.begin(), outputs.end(), v) != outputs.end()) return;
    g.output(val[v]);
    outputs.push_back(v);
  };
  std::vector<bool> in_views(p.nodes.size(), false);
  // Graph inputs passed straight through (copy_ of an input) are aliases, not outputs.
  for (size_t i : nodes) {
    int out = p.nodes[i].out[0];
    if (!used_outside[out]) continue;
    if (view_chain(out)) {
      for (size_t k : view_nodes) in_views[k] = true;
      continue;
    }
    if (int base = layout_view_of(out); base >= 0) {
      for (size_t k : view_nodes) in_views[k] = true;
      add_output(base);
      continue;
    }
    ir::Value v = val[out];
    if (auto it = input_value.find(v.id); it != input_value.end()) {
      // contiguous() of an input: run it (the input may be a strided view, e.g. from the
      // rule above in an earlier region, and a later view() needs the contiguous value), and
      // the contiguous() calls it reads (`a.clone().clone()`: the values in between were never
      // computed, the fuzzer's "value used before it was computed"); a pass-through copy_ in
      // the chain is an alias of the input.
      if (p.nodes[i].op != OpKind::Contiguous) {
        aliases.push_back({out, it->second});
        continue;
      }
      for (size_t k = i;;) {
        in_views[k] = true;
        auto pr = producer.find(p.nodes[k].in[0]);
        if (pr == producer.end()) break;
        if (p.nodes[pr->second].op != OpKind::Contiguous) {
          aliases.push_back({p.nodes[k].in[0], it->second});
          break;
        }
        k = pr->second;
      }
      continue;
    }
    add_output(out);
  }
  // Last, so that they do not change which output decides the row split (codegen/row_split.cpp).
  for (int v : checked) {
    auto it = val.find(v);
    if (it == val.end() || std::find(outputs.begin(), outputs.end(), v) != outputs.end())
      continue;  // already an output
    if (auto in = input_value.find(it->second.id); in != input_value.end()) {
      // A region input, or a clone() / contiguous() of one, which has its values: the check
      // reads the input (the clone is never computed; it read "used before it was computed").
      if (in->second != v && std::find_if(aliases.begin(), aliases.end(), [&](auto& a) {
                               return a.first == v; }) == aliases.end())
        aliases.push_back({v, in->second});
      continue;
    }
    g.output(it->second);
    outputs.push_back(v);
  }
  for (size_t i : nodes)
    if (in_views[i]) views.push_back(i);
  return g;
}

}  // namespace

Plan::Plan(std::shared_ptr<const Program> program, size_t begin, size_t end,
           const PlanOptions& options)
    : p_(std::move(program)), begin_(begin), end_(end) {
  const Program& p = *p_;
  // Last step using each value, to free intermediates early.
  std::vector<bool> used_later = options.live_after;
  used_later.resize(p.values.size(), false);

  std::unique_ptr<Region> open;
  // A region pays a JIT compile (tens of ms per kernel); one with a single op that computes
  // (views are free on eager kernels) has nothing to fuse, so its ops run on eager kernels.
  auto close = [&] {
    if (!open) return;
    int computing = 0;
    for (size_t i : open->nodes)
      computing += op_info(p.nodes[i].op).category != OpCategory::View &&
                   p.nodes[i].op != OpKind::Contiguous;
    if (computing >= 2) {
      steps_.push_back({Step::Kind::Region, 0, std::move(open), {}});
    } else {
      for (size_t i : open->nodes) steps_.push_back({Step::Kind::Eager, i, nullptr, {}});
    }
    open.reset();
  };
  // Random ops that read no value (dropout masks, rand/randn): first, so they do not split the
  // compiled regions. Each replays at its own generator offset, so the order does not matter.
  auto hoisted = [&](const Node& n) {
    return n.kind == Node::Kind::Op && n.in.empty() &&
           op_info(n.op).category == OpCategory::Random;
  };
  for (size_t i = begin; i < end; ++i)
    if (hoisted(p.nodes[i])) steps_.push_back({Step::Kind::Eager, i, nullptr, {}});
  for (size_t i = begin; i < end; ++i) {
    const Node& n = p.nodes[i];
    if (hoisted(n)) continue;
    if (n.kind == Node::Kind::Op && options.compile && !p.aliased_mutation && lowerable(p, n)) {
      if (!open) open = std::make_unique<Region>();
      open->nodes.push_back(i);
      continue;
    }
    close();
    Step::Kind k = n.kind == Node::Kind::Read       ? Step::Kind::Read
                   : n.kind == Node::Kind::Callback ? Step::Kind::Callback
                                                    : Step::Kind::Eager;
    steps_.push_back({k, i, nullptr, {}});
  }
  close();
  pull_in_views(begin, end);

  // Donation into the last step only: nothing in the range runs after it.
  if (!options.donate.empty() && !steps_.empty() && steps_.back().region)
    steps_.back().region->donate = options.donate;

  // Values each step reads, and which values are needed outside each region.
  auto reads = [&](const Step& s, auto&& f) {
    if (s.region) {
      for (size_t i : s.region->nodes)
        for (int v : p.nodes[i].in) if (v >= 0) f(v);
    } else {
      for (int v : p.nodes[s.node].in) if (v >= 0) f(v);
    }
  };
  std::vector<int> last_use(p.values.size(), -1);
  for (size_t k = 0; k < steps_.size(); ++k)
    reads(steps_[k], [&](int v) { last_use[v] = static_cast<int>(k); });
  // A value a region defines is a graph output if anything outside the region reads it (a
  // view pulled into a later region is defined in both).
  std::vector<std::vector<int>> defined_in(p.values.size());
  for (size_t k = 0; k < steps_.size(); ++k)
    if (steps_[k].region)
      for (size_t i : steps_[k].region->nodes)
        for (int v : p.nodes[i].out) defined_in[v].push_back(static_cast<int>(k));
  std::vector<bool> used_outside_region = used_later;
  for (size_t k = 0; k < steps_.size(); ++k)
    reads(steps_[k], [&](int v) {
      const std::vector<int>& d = defined_in[v];
      if (std::find(d.begin(), d.end(), static_cast<int>(k)) == d.end())
        used_outside_region[v] = true;
    });
  // Regions compile independently (each its own MLIR context and JIT), so compile them on
  // all cores: LLVM's optimiser and code generator dominate the time of a first call.
  std::vector<Region*> regions;
  for (Step& s : steps_)
    if (s.region) regions.push_back(s.region.get());
  PlanOptions region_options{options.compile, used_outside_region, false, {}, options.build_for};
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i; (i = next.fetch_add(1)) < regions.size();) {
      try {
        build_region(*regions[i], region_options);
      } catch (const std::exception& e) {  // not a kiln::Error: still never lose the call
        regions[i]->eager_fallback = true;
        regions[i]->fallback_reason = e.what();
      }
    }
  };
  size_t workers = std::min<size_t>(std::max(1u, std::thread::hardware_concurrency()), regions.size());
  std::vector<std::thread> threads;
  for (size_t k = 1; k < workers; ++k) threads.emplace_back(work);
  work();
  for (std::thread& t : threads) t.join();
  for (Region* r : regions) plan_eager_frees(*r, used_outside_region);
  for (Step& s : steps_) {
    if (s.region) {
      ++num_regions_;
      num_kernels_ += s.region->exe ? s.region->exe->num_kernels()
                                    : static_cast<int>(s.region->nodes.size());
      if (s.region->eager_fallback) num_eager_ += s.region->nodes.size();
    } else if (s.kind == Step::Kind::Eager) {
      ++num_eager_;
      ++num_kernels_;
    }
  }
  if (options.free_dead) {
    for (size_t v = 0; v < p.values.size(); ++v)
      if (last_use[v] >= 0 && !used_later[v] && p.values[v].source < 0)
        steps_[last_use[v]].free_after.push_back(static_cast<int>(v));
  }
}

Plan::~Plan() = default;

void Plan::plan_eager_frees(Region& r, const std::vector<bool>& used_outside_region) const {
  const Program& p = *p_;
  std::vector<bool> keep = used_outside_region;
  for (int v : r.outputs) keep[v] = true;
  for (auto& [v, src] : r.aliases) keep[v] = true;
  for (size_t i : r.views) keep[p.nodes[i].out[0]] = true;
  std::unordered_map<int, size_t> last;  // value defined here -> position of its last use
  for (size_t k = 0; k < r.nodes.size(); ++k) {
    const Node& n = p.nodes[r.nodes[k]];
    for (int v : n.in)
      if (auto at = last.find(v); at != last.end()) at->second = k;
    for (int v : n.out)
      if (!keep[v]) last[v] = k;
  }
  r.free_after_node.assign(r.nodes.size(), {});
  for (auto [v, k] : last) r.free_after_node[k].push_back(v);
}

void Plan::run_nodes_eagerly(const Region& r, RunState& st) const {
  for (size_t k = 0; k < r.nodes.size(); ++k) {
    run_eager(p_->nodes[r.nodes[k]], st);
    for (int v : r.free_after_node[k]) st.slots[v] = Tensor();
  }
}

// A region that reads a view made outside it (a weight's W.t() saved for the backward, made in
// the forward's region or by an eager step) takes the view's base instead and repeats the view
// ops in its graph, where they are free: the matmul reads the transpose through its trans flag.
// Given the strided view itself, the compiled code would copy it to a contiguous tensor on
// every call (codegen::Executable's inputs are contiguous): 5 copies of 1 MiB per Transformer
// step. Nodes [begin, end) are in program order, so the pulled chains precede the region's
// nodes and read only values from before it.
void Plan::pull_in_views(size_t begin, size_t end) {
  const Program& p = *p_;
  std::vector<int> producer(p.values.size(), -1);
  for (size_t i = begin; i < end; ++i)
    for (int v : p.nodes[i].out) producer[v] = static_cast<int>(i);
  auto is_view = [&](int node) {
    const Node& n = p.nodes[node];
    return n.kind == Node::Kind::Op && op_info(n.op).category == OpCategory::View &&
           !n.in_place && n.in.size() == 1 && n.in[0] >= 0 && n.out.size() == 1 &&
           lowerable(p, n);
  };
  for (Step& s : steps_) {
    if (!s.region) continue;
    std::vector<size_t>& nodes = s.region->nodes;
    std::unordered_set<int> defined;
    for (size_t i : nodes)
      for (int v : p.nodes[i].out) defined.insert(v);
    std::vector<size_t> pulled;
    std::unordered_set<size_t> seen(nodes.begin(), nodes.end());
    for (size_t i : nodes)
      for (int v : p.nodes[i].in)
        for (int at = v; at >= 0 && !defined.count(at) && producer[at] >= 0 &&
                         is_view(producer[at]);
             at = p.nodes[producer[at]].in[0])
          if (seen.insert(static_cast<size_t>(producer[at])).second)
            pulled.push_back(static_cast<size_t>(producer[at]));
    if (pulled.empty()) continue;
    nodes.insert(nodes.end(), pulled.begin(), pulled.end());
    std::sort(nodes.begin(), nodes.end());
  }
}

// The (graph output, graph input) index pairs of region `r` whose donated pair (Region::donate)
// the compiled code may compute in place: the old value is read by nothing that runs after the
// compiled code (a view node, an alias). The data checks' inputs are all region inputs, so
// run_region scans them before the code writes anything, and a rejected call donates copies:
// the node's eager re-run, which raises eager's error, then reads the caller's old value (a
// KV cache written by index_copy_ at a position tensor is such an input).
std::vector<std::pair<int, int>> Plan::donation_requests(const Region& r,
                                                         const std::vector<int>& in_v) const {
  const Program& p = *p_;
  std::vector<std::pair<int, int>> out;
  for (size_t i : r.data_checked)
    for (int v : data_checked_inputs(p.nodes[i]))
      if (std::find(in_v.begin(), in_v.end(), v) == in_v.end()) return out;
  for (auto [v, u] : r.donate) {
    auto k = std::find(r.outputs.begin(), r.outputs.end(), v);
    auto j = std::find(in_v.begin(), in_v.end(), u);
    if (k == r.outputs.end() || j == in_v.end()) continue;
    bool read_after = false;
    for (auto [a, b] : r.aliases) read_after = read_after || a == u || b == u || a == v || b == v;
    for (size_t i : r.views)
      for (int x : p.nodes[i].in) read_after = read_after || x == u;
    if (!read_after)
      out.push_back({static_cast<int>(k - r.outputs.begin()), static_cast<int>(j - in_v.begin())});
  }
  return out;
}

void Plan::build_region(Region& r, const PlanOptions& o) {
  const Program& p = *p_;
  bool has_sym = false;
  for (size_t i : r.nodes)
    for (int v : p.nodes[i].in)
      if (v >= 0)
        for (const SymInt& s : p.values[v].sym) has_sym |= s.arg >= 0;
  std::vector<int> in_v;
  std::vector<DType> in_t;
  std::vector<int> checked;
  for (size_t i : r.nodes) {
    const Node& n = p.nodes[i];
    if (data_checked_inputs(n).empty()) continue;
    r.data_checked.push_back(i);
    // All its inputs: a rejected value re-runs the node on eager kernels.
    for (int v : n.in)
      if (v >= 0) checked.push_back(v);
  }
  std::string first_error;
  for (bool dynamic : {true, false}) {
    if (dynamic && !has_sym) continue;
    try {
      ir::Graph g = region_graph(p, r.nodes, o.live_after, checked, dynamic, in_v, in_t,
                                 r.outputs, r.aliases, r.views);
      r.inputs.clear();
      for (size_t k = 0; k < in_v.size(); ++k) r.inputs.push_back({in_v[k], in_t[k]});
      // The region runs on its inputs' device (compile() picks the backend per region).
      r.device = Device::cpu();
      for (int v : in_v)
        if (!p.values[v].wrapped && p.values[v].device.is_cuda()) r.device = p.values[v].device;
      if (o.build_for) r.device = *o.build_for;
      codegen::CompileOptions co;
      co.device = r.device;
      co.check_dynamic_sizes = false;  // the entry's guards check the sizes before a replay
      if (r.device.is_cuda()) co.gpu = codegen::GpuTarget::from_env();
      co.in_place_outputs = donation_requests(r, in_v);
      if (g.num_outputs() > 0) r.exe = std::make_shared<codegen::Executable>(g, co);
      r.in_place.clear();
      for (auto [k, j] : co.in_place_outputs)
        if (r.exe && r.exe->output_alias(k) == j) r.in_place.push_back({k, j});
      r.static_only = has_sym && !dynamic;
      if (r.static_only) r.fallback_reason = first_error.substr(0, first_error.find('\n'));
      return;
    } catch (const Error& e) {
      if (first_error.empty()) first_error = e.what();
    }
  }
  r.eager_fallback = true;
  r.fallback_reason = first_error;
}

namespace {

void run_op_node(const Program& p, const Node& n, RunState& st) {
  std::vector<Tensor> ins;
  for (int v : n.in) ins.push_back(v >= 0 ? st.value(p, v) : Tensor());
  if (st.detach_as_traced)
    for (size_t k = 0; k < ins.size() && k < n.in_required_grad.size(); ++k)
      if (!n.in_required_grad[k] && ins[k].defined() && ins[k].requires_grad())
        ins[k] = ins[k].detach();
  OpAttrs attrs = resolved_attrs(p, n, st);
  // A value can have another layout than while tracing (compiled regions return contiguous
  // tensors where eager returned views, and the other way round): a functional `view` of a
  // strided value its strides cannot express copies first, as reshape does, instead of failing
  // on strides it never saw. One they can express stays a view, as eager's (writes through the
  // result reach the argument).
  if (n.op == OpKind::View && !st.in_place && !ins.empty() && ins[0].defined() &&
      !ins[0].is_contiguous()) {
    InferredMeta m = infer_meta(OpKind::View, std::array{TensorMeta::of(ins[0])}, attrs, n.loc);
    Strides unused;
    if (!view_strides(ins[0].shape(), ins[0].strides(), m.outputs[0].shape, unused))
      ins[0] = ins[0].contiguous();
  }
  OpCall c{n.op, std::move(ins), std::move(attrs), n.loc};
  if (n.in_place && !st.in_place) {
    // Functional: the new value is a fresh tensor; the old one stays as it was.
    const Tensor& dst = c.inputs[0];
    Tensor fresh = dispatch::empty(dst.shape(), dst.dtype(), dst.device());
    if (n.op == OpKind::CopyInto) fresh.copy_(c.inputs[1], n.loc);
    else fresh.fill_(n.attrs.alpha, n.loc);
    st.slots[n.out[0]] = fresh;
    return;
  }
  std::vector<Tensor> outs = dispatch::call(std::move(c));
  for (size_t k = 0; k < n.out.size() && k < outs.size(); ++k) st.slots[n.out[k]] = outs[k];
}

}  // namespace

void run_node_eagerly(const Program& p, const Node& n, RunState& st) {
  st.node = static_cast<size_t>(&n - p.nodes.data());
  if (n.public_op) return as_op(n.public_op, [&] { run_op_node(p, n, st); });
  run_op_node(p, n, st);
}

void Plan::run_eager(const Node& n, RunState& st) const { run_node_eagerly(*p_, n, st); }

namespace {
/// KILN_ALWAYS_COMPILED=1: compiled regions always run their compiled code, never the measured
/// choice of eager kernels (to profile or debug the compiled code itself).
bool always_compiled() {
  static const bool on = env_flag("KILN_ALWAYS_COMPILED");
  return on;
}
}  // namespace

void Plan::run_region(const Region& r, RunState& st) const {
  const Program& p = *p_;
  // Values only the region itself used are not kept (the compiled code never made them). A
  // region whose graph was never built (eager_fallback) has no r.outputs; what is read after
  // it is still kept (the fuzzer's "fill_ of an int64 tensor with -1.5 then read": the codegen
  // rejects the constant).
  auto run_eagerly = [&] { run_nodes_eagerly(r, st); };
  if (r.eager_fallback) {
    run_eagerly();
    return;
  }
  if (int c = r.choice.load(std::memory_order_relaxed); c != 0) {
    if (c == 1) {
      run_eagerly();
      return;
    }
    int trial = r.trials.fetch_add(1, std::memory_order_relaxed);
    if (trial < Region::kTrials && !always_compiled()) {
      // Kernels run asynchronously: each run's time includes its own, not the last one's.
      auto timed = [&](bool eager) {
        wait_for(r.device);
        auto t0 = std::chrono::steady_clock::now();
        if (eager) run_eagerly();
        else run_compiled(r, st);
        wait_for(r.device);
        return std::chrono::duration_cast<std::chrono::nanoseconds>(
                   std::chrono::steady_clock::now() - t0).count();
      };
      auto record = [&](bool eager, int64_t ns) {
        std::atomic<int64_t>& best = eager ? r.eager_ns : r.compiled_ns;
        int64_t seen = best.load(std::memory_order_relaxed);
        while (ns < seen && !best.compare_exchange_weak(seen, ns, std::memory_order_relaxed)) {
        }
      };
      try {
        if (!st.in_place) {
          // Both ways on this call's inputs, the compiled code last: its results are the
          // call's, so calls on one input do not alternate between two roundings (a break-it
          // pass saw a compiled float32 sum give 999999.4375 and 1000000 on alternate calls).
          // The region's eager run is functional (run_op_node) and draws its random numbers at
          // the call's offsets, so running it first changes nothing the compiled run reads.
          const int64_t eager_ns = timed(true);
          // Its results (and the autograd graph they hold) go first: the compiled run then
          // needs no more memory than on its own (a training step's activations, twice).
          for (size_t i : r.nodes)
            for (int v : p.nodes[i].out) st.slots[v] = Tensor();
          const int64_t compiled_ns = timed(false);
          if (trial >= 1) record(true, eager_ns), record(false, compiled_ns);
          if (trial == Region::kTrials / 2 - 1 || (trial == 1 && r.clear_winner()))
            r.choice.store(r.eager_ns.load() < r.compiled_ns.load() * 0.95 ? 1 : 0);
          return;
        }
        // Values alias as in the user's code (in-place ops write their inputs): one way a call.
        const bool eager = trial % 2 == 1;
        const int64_t ns = timed(eager);
        if (trial >= 2) record(eager, ns);
      } catch (...) {
        // A run that raised (an index out of range) measured nothing: its trial is run again.
        r.trials.fetch_sub(1, std::memory_order_relaxed);
        throw;
      }
      if (trial == Region::kTrials - 1 || (trial == 3 && r.clear_winner()))
        r.choice.store(r.eager_ns.load() < r.compiled_ns.load() * 0.95 ? 1 : 0);
      return;
    }
  }
  run_compiled(r, st);
}

namespace {

// A 0-d CPU tensor of `dtype` holding `value` converted as copy_ would (Scalar::to, a rounding
// cast; not for a float value and an integer dtype), for a region's input. The tensors are kept
// per thread and reused once nothing else holds them (the region's run has returned): the
// digits MLP's step passes 9 host scalars per call, 18 of its replay's 111 allocations when
// made afresh.
Tensor host_scalar_input(Scalar value, DType dtype, size_t& next) {
  thread_local std::vector<Tensor> pool;
  while (next < pool.size() &&
         (pool[next].impl_ptr().use_count() != 1 || pool[next].storage().use_count() != 1))
    ++next;  // still held: a nested replay's region input, or kept by its caller
  if (next == pool.size()) {
    if (pool.size() >= 256) pool.erase(pool.begin());  // bounded; a replaced one stays valid
    pool.push_back(Tensor());
    next = pool.size() - 1;
  }
  Tensor& t = pool[next++];
  if (!t.defined() || t.dtype() != dtype) t = dispatch::empty({}, dtype, Device::cpu());
  KILN_DISPATCH_ALL(dtype, T, { *t.data<T>() = value.to<T>(); });
  return t;
}

}  // namespace

void Plan::run_compiled(const Region& r, RunState& st) const {
  const Program& p = *p_;
  std::vector<Tensor> ins;
  ins.reserve(r.inputs.size());
  size_t next_scalar = 0;
  for (const Region::Input& in : r.inputs) {
    if (r.device.is_cpu() && !st.slots[in.value].defined()) {
      // A host scalar (an optimizer's lr or betas, a Python-style number) goes straight into a
      // tensor of the region's input dtype: not wrapped in a float64 tensor first and then
      // converted.
      std::optional<Scalar> host = st.host_scalar(p, in.value);
      // (A float entering an integer input goes through copy_, which defines NaN, inf and
      // out-of-range values; a static_cast does not.)
      if (host && !(host->is_floating() && !is_floating(in.dtype))) {
        ins.push_back(host_scalar_input(*host, in.dtype, next_scalar));
        continue;
      }
    }
    const Tensor& t = st.value(p, in.value);
    if (t.dtype() == in.dtype && t.device() == r.device) {
      ins.push_back(t);
    } else {  // a wrapped host scalar entering in its op's compute dtype, or a host value
      Tensor c = dispatch::empty(t.shape(), in.dtype, r.device);
      c.copy_(t);
      ins.push_back(c);
    }
  }
  std::vector<Tensor> outs;
  bool data_checked_before = false;
  if (r.exe) {
    const codegen::Executable* exe = r.exe.get();
    if (r.static_only) {
      // Compiled for the traced shapes only (the symbolic build failed): other shapes run the
      // region's ops on eager kernels.
      for (size_t k = 0; k < ins.size(); ++k)
        if (ins[k].shape() != p.values[r.inputs[k].value].shape) {
          run_nodes_eagerly(r, st);
          return;
        }
    }
    if (!r.in_place.empty()) {
      // Outputs computed in their inputs' buffers (buffer donation): a value eager rejects
      // raises after the run (below), when the caller's tensors must be as they were, so the
      // data checks' inputs (all region inputs) are scanned first; the code then writes copies.
      data_checked_before = true;
      for (size_t i : r.data_checked)
        data_checked_before = data_checked_before && !eager_rejects(p, p.nodes[i], st);
      if (!data_checked_before)
        for (auto [output, input] : r.in_place) {
          Tensor& donated = ins[static_cast<size_t>(input)];
          donated = donated.clone();
        }
    }
    if (!r.nodes.empty()) st.node = r.nodes.front();
    try {
      outs = exe->run(ins);
    } catch (const Error& e) {
      // Memory for the region's results or intermediates ran out: named by the region's first
      // op and the user's line, as eager names the op that allocates (review: it named kiln's
      // allocator, or Executable::run and its source line).
      const bool out_of_memory =
          e.op() == "allocate" || (e.op() == "codegen::Executable::run" &&
                                   e.message().find("out of memory") != std::string::npos);
      if (!out_of_memory || r.nodes.empty()) throw;
      const Node& first = p.nodes[r.nodes.front()];
      throw Error(std::string(op_name(first.op)),
                  fmt::format("{} (in a compiled region of {} ops starting here)", e.message(),
                              r.nodes.size()),
                  first.loc);
    }
  }
  for (size_t k = 0; k < r.outputs.size(); ++k) st.slots[r.outputs[k]] = std::move(outs[k]);
  for (auto& [v, src] : r.aliases) st.slots[v] = st.value(p, src);
  for (size_t i : r.views) run_eager(p.nodes[i], st);
  // A value eager rejects re-runs its node on eager kernels, which raises eager's error, with
  // the user's op name and line, before anything of the segment is written back (a scan of the
  // checked inputs, cheap next to the region). Nodes in program order: a forward's check
  // before its backward's.
  if (data_checked_before) return;  // scanned before the run: the same inputs passed
  for (size_t i : r.data_checked)
    if (eager_rejects(p, p.nodes[i], st)) run_eager(p.nodes[i], st);
}

bool profiling() {
  static const bool on = env_flag("KILN_PROFILE");
  return on;
}

std::optional<Scalar> Plan::run(RunState& st) const {
  const Program& p = *p_;
  NoGradGuard no_grad;
  const bool profile = profiling();
  for (const Step& s : steps_) {
    std::chrono::steady_clock::time_point t0;
    if (profile) {
      wait_for_all_devices();
      t0 = std::chrono::steady_clock::now();
    }
    switch (s.kind) {
      case Step::Kind::Region: run_region(*s.region, st); break;
      case Step::Kind::Eager: run_eager(p.nodes[s.node], st); break;
      case Step::Kind::Callback: {
        const Node& n = p.nodes[s.node];
        st.node = s.node;
        std::vector<Tensor> ins;
        for (int v : n.in) ins.push_back(st.value(p, v));
        if (n.callback_name != "print" || PrintScope::show_next()) n.callback(ins);
        break;
      }
      case Step::Kind::Read: {
        const Node& n = p.nodes[s.node];
        return read_scalar(st.value(p, n.in[0]), n.read_index);
      }
    }
    for (int v : s.free_after) st.slots[v] = Tensor();
    if (profile) {
      wait_for_all_devices();
      s.profile->ns.fetch_add(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                 std::chrono::steady_clock::now() - t0).count(),
                             std::memory_order_relaxed);
      s.profile->runs.fetch_add(1, std::memory_order_relaxed);
    }
  }
  return std::nullopt;
}

int Plan::num_ops() const {
  int n = 0;
  for (size_t i = begin_; i < end_; ++i) n += p_->nodes[i].kind == Node::Kind::Op;
  return n;
}

namespace {
// KILN_PROFILE=1: "[avg 12.3 us]" at the end of the step's line.
template <class StepT>
void append_profile(std::string& out, size_t line_start, const StepT& s) {
  int64_t runs = s.profile->runs.load(std::memory_order_relaxed);
  if (runs == 0 || out.size() == line_start || out.back() != '\n') return;
  out.pop_back();
  out += fmt::format("  [avg {:.1f} us over {} runs]\n",
                     s.profile->ns.load(std::memory_order_relaxed) / 1e3 / runs, runs);
}
// KILN_PROFILE=1: a compiled region's kernel time by kind (codegen::Executable::kernel_times:
// "GEMM", "loop nest", "copy"), then the costliest kernels of each kind, one line each.
constexpr size_t kKernelsShownPerKind = 4;
void append_kernel_times(std::string& out, const codegen::Executable& exe) {
  if (exe.device().is_cuda() || exe.row_parallel()) {
    out += exe.device().is_cuda()
               ? "        no per-kernel times here (KILN_CUDA_PROFILE=1 times CUDA kernels)\n"
               : "        no per-kernel times (row-parallel: each row block runs every kernel)\n";
    return;
  }
  std::vector<codegen::KernelTime> times = exe.kernel_times();
  if (times.empty()) {
    out += "        no per-kernel times (no loop nests, or GPU loops emulated on the CPU)\n";
    return;
  }
  if (times.front().calls == 0) return;
  auto per_run_ms = [](const codegen::KernelTime& t) {
    return t.total_ms / std::max<int64_t>(t.calls, 1);
  };
  auto kind_of = [](const codegen::KernelTime& t) {
    for (const char* k : {"GEMM", "loop nest", "copy"})
      if (t.kernel.starts_with(k)) return std::string(k);
    return t.kernel.substr(0, t.kernel.find(" ("));
  };
  struct Kind {
    std::string name;
    int count = 0;
    double ms = 0;  // in one run
  };
  std::vector<Kind> kinds;
  double all_ms = 0;
  for (const codegen::KernelTime& t : times) {
    const std::string name = kind_of(t);
    auto it = std::find_if(kinds.begin(), kinds.end(),
                           [&](const Kind& k) { return k.name == name; });
    if (it == kinds.end()) it = kinds.insert(kinds.end(), Kind{name});
    it->count += 1;
    it->ms += per_run_ms(t);
    all_ms += per_run_ms(t);
  }
  std::stable_sort(kinds.begin(), kinds.end(),
                   [](const Kind& a, const Kind& b) { return a.ms > b.ms; });
  std::stable_sort(times.begin(), times.end(),
                   [](const auto& a, const auto& b) { return a.total_ms > b.total_ms; });
  // 3 significant digits: a small region's kernels take microseconds.
  auto time = [](double ms) {
    return ms >= 100 ? fmt::format("{:.0f} ms", ms)
           : ms >= 1 ? fmt::format("{:.3g} ms", ms)
                     : fmt::format("{:.3g} us", ms * 1e3);
  };
  std::string by_kind;
  for (const Kind& k : kinds)
    by_kind += fmt::format("{}{} x {} ({})", by_kind.empty() ? "" : ", ", k.count, k.name,
                           time(k.ms));
  out += fmt::format("        timed kernels, in one run: {}: {}\n", time(all_ms), by_kind);
  for (const Kind& k : kinds) {
    size_t shown = 0;
    for (const codegen::KernelTime& t : times) {
      if (kind_of(t) != k.name || shown == kKernelsShownPerKind) continue;
      ++shown;
      out += fmt::format("          {}  [avg {:.1f} us over {} runs, {:.1f} %]\n", t.kernel,
                         per_run_ms(t) * 1e3, t.calls,
                         all_ms > 0 ? 100 * per_run_ms(t) / all_ms : 0.0);
    }
  }
}
}  // namespace

std::string Plan::describe() const {
  const Program& p = *p_;
  std::string out;
  // ", runs on eager kernels (measured E vs compiled C us)" once the trials chose, with the
  // fastest timed trial each way; "" while measuring or where nothing was measured.
  auto measured_choice = [](const Region& r) -> std::string {
    const int choice = r.choice.load();
    if (choice < 0) return "";
    auto us = [](int64_t ns) {
      return ns == Region::kNotTimed ? std::string("(not timed)") : fmt::format("{:.0f}", ns / 1e3);
    };
    const std::string eager_us = us(r.eager_ns.load()), compiled_us = us(r.compiled_ns.load());
    return choice == 1
               ? fmt::format(", runs on eager kernels (measured {} vs compiled {} us)",
                             eager_us, compiled_us)
               : fmt::format(", runs compiled (measured {} vs eager kernels {} us)",
                             compiled_us, eager_us);
  };
  for (const Step& s : steps_) {
    size_t line_start = out.size();
    if (s.region) {
      const Region& r = *s.region;
      std::string ops;
      for (size_t i : r.nodes) ops += std::string(ops.empty() ? "" : " ") + op_name(p.nodes[i].op).data();
      if (r.eager_fallback)
        out += fmt::format("    eager region ({} ops: {}) - not compiled: {}\n", r.nodes.size(),
                           ops, r.fallback_reason);
      else
        out += fmt::format("    compiled region: {} ops -> {} kernel(s){}{}{}{}{}: {}\n",
                           r.nodes.size(), r.exe ? r.exe->num_kernels() : 0,
                           r.device.is_cuda() ? " on " + r.device.str() : "",
                           r.static_only ? fmt::format(" (traced shapes only; other shapes run "
                                                       "on eager kernels: {})", r.fallback_reason)
                                         : "",
                           r.exe ? fmt::format(", built in {:.0f} ms", r.exe->stats().total_ms) : "",
                           r.in_place.empty()
                               ? ""
                               : fmt::format(", {} result(s) computed in their tensors' buffers "
                                             "(donated)", r.in_place.size()),
                           measured_choice(r), ops);
      append_profile(out, line_start, s);
      if (r.exe && profiling()) append_kernel_times(out, *r.exe);
      continue;
    }
    const Node& n = p.nodes[s.node];
    switch (s.kind) {
      case Step::Kind::Eager:
        out += fmt::format("    eager op: {} ({}:{})\n", op_name(n.op), n.loc.file_name(),
                           n.loc.line());
        break;
      case Step::Kind::Read:
        out += fmt::format("    host read at {}:{} (value while tracing: {})\n",
                           n.loc.file_name(), n.loc.line(), n.read_value.str());
        break;
      case Step::Kind::Callback:
        out += fmt::format("    host callback {} ({}:{})\n", n.callback_name, n.loc.file_name(),
                           n.loc.line());
        break;
      default: break;
    }
    append_profile(out, line_start, s);
  }
  return out;
}

}  // namespace kiln::tracer
