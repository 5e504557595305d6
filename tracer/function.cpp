#include "tracer/function.h"

#include <pthread.h>

#include <algorithm>
#include <set>
#include <bit>
#include <atomic>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <optional>
#include <thread>
#include <shared_mutex>
#include <tuple>
#include <unordered_set>

#include "core/env.h"
#include "core/precision.h"
#include "eager/autograd.h"
#include "eager/autograd_graph.h"
#include "eager/dispatch.h"
#include "tracer/backward.h"
#include "tracer/generalize.h"
#include "tracer/plan.h"
#include "tracer/recorder.h"
#include "tracer/state_journal.h"

namespace kiln::tracer {

bool compile_disabled() {
  static const bool off = !env_flag("KILN_COMPILE", true);
  return off;
}

namespace {

// Host reads (elements) one trace may make; a function that reads more runs eagerly.
constexpr size_t kMaxHostReads = 256;

// Internal: the replay reached a decision outcome the trace tree has no branch for.
struct MissingBranch {
  Scalar value;
  Loc loc;           // the host read's
  size_t depth = 0;  // how many host reads of the trace tree the replay passed before it
  /// The traced branches (two or more) ran no op after the read and returned the value read:
  /// likely `return loss.item();` (a branch per value, which returning the tensor avoids).
  bool returned_as_is = false;
};
// Internal: a symbolic entry's replay reached a branch no trace confirmed for these sizes.
struct UncheckedBranch {};
// Internal: a shape-only run did not confirm the entry (other ops, or a trace that would not
// be cached): the call is traced.
struct ShapeOnlyUnfit {
  std::string why;  // for KILN_LOGS=recompiles
};
bool log_enabled(std::string_view topic);
// Internal: a replay raised kiln::Error (a value check: an index out of range) before it
// changed anything the caller sees: the call runs eagerly instead, so that the function's own
// code meets the error (a try/catch in it takes its other path; else eager raises it).
struct ReplayRaised {
  std::string message;  // the replay's error
};

bool same_scalar(const Scalar& a, const Scalar& b) {
  if (a.kind() != b.kind()) return false;
  if (a.is_floating()) {
    double x = a.to<double>(), y = b.to<double>();
    return std::memcmp(&x, &y, sizeof x) == 0 || (std::isnan(x) && std::isnan(y));
  }
  return a.to<int64_t>() == b.to<int64_t>();
}

bool is_arg_or_captured(const Program& p, int v) {
  const int src = p.values[v].source;
  return src >= 0 && (p.sources[src].kind == SourceKind::Arg ||
                      p.sources[src].kind == SourceKind::Captured);
}

// Whether `t`'s autograd graph reaches a leaf the function made require grad itself
// (requires_grad_ on a tensor it made): not one of the trace's arguments or captured tensors,
// nor a tensor behind a non-leaf argument's grad_fn (made before the call).
bool reaches_made_inside_leaf(const Recorder& rec, const Program& p, const Tensor& t) {
  std::vector<const TensorImpl*> sources;
  std::set<const autograd::Node*> source_nodes;  // a non-leaf argument's grad_fn
  for (size_t u = 0; u < p.values.size(); ++u) {
    if (!is_arg_or_captured(p, int(u))) continue;
    if (Tensor s = rec.tensor(int(u)); s.defined() && s.requires_grad()) {
      sources.push_back(s.impl_ptr().get());
      if (!s.is_leaf()) source_nodes.insert(autograd::gradient_edge(s).fn.get());
    }
  }
  std::vector<std::shared_ptr<autograd::Node>> stack{autograd::gradient_edge(t).fn};
  std::set<const autograd::Node*> seen;
  while (!stack.empty()) {
    std::shared_ptr<autograd::Node> n = std::move(stack.back());
    stack.pop_back();
    if (!n || source_nodes.count(n.get()) || !seen.insert(n.get()).second) continue;
    if (auto* acc = dynamic_cast<autograd::AccumulateGrad*>(n.get()))
      if (std::ranges::find(sources, acc->leaf().get()) == sources.end()) return true;
    for (const autograd::Edge& e : n->next_edges) stack.push_back(e.fn);
  }
  return false;
}

bool retains_grad(const Tensor& t) {
  const autograd::Meta* m = autograd::meta(t);
  return m && m->retains_grad;
}

struct ArgGuard {
  ArgValue::Kind kind = ArgValue::Kind::Other;
  // tensors
  DType dtype = DType::Float32;
  Device device = Device::cpu();
  Shape shape;
  Strides strides;  // checked only when !contiguous
  bool contiguous = true;
  bool requires_grad = false;
  // Whether it is a leaf, where the function's backward() sets leaves' .grad (-1: not guarded):
  // a non-leaf passes its gradient on to its own leaves instead (break-it pass: the replay
  // set a non-leaf argument's .grad).
  int leaf = -1;
  int alias_of = -1;        // alias_index: an earlier tensor argument sharing the storage
  uint64_t dyn_mask = 0;    // symbolic dims
  uint64_t any_size = 0;    // symbolic dims that accept sizes 0 and 1 too (marked dynamic)
  // host scalars
  Scalar value;
  bool dynamic_scalar = false;
  // Dynamic, and symbolic sizes are made of it (SymInt::scalar): values below 2 are
  // specialised, as tensor sizes 0 and 1 are.
  bool size_scalar = false;
  bool fixed = false;  // list length / enum: never dynamic
  const void* type = nullptr;  // ArgValue::type
  // other values guarded by equality
  std::shared_ptr<const void> other;
  bool (*other_equal)(const void*, const void*) = nullptr;
  // A passed-through argument (a struct): the byte offsets at which it held a tensor the trace
  // captured, with that tensor's TensorImpl address. A replay of another struct, or of one
  // whose member was assigned another tensor, would use the traced tensor instead.
  std::vector<std::pair<size_t, const void*>> embedded;
  // A polymorphic object's address (ArgValue::by_identity), or null, and its lifetime token.
  const void* identity = nullptr;
  std::weak_ptr<const void> lifetime;
};

// The first earlier tensor argument sharing argument i's storage, as 2·j, or 2·k + 1 for the
// first with the same elements (offset, shape, strides, dtype): a trace takes such arguments
// (f(t, t), f(t, t.view(...))) as one value, so it must not replay for two different views of
// one buffer (f(u[0:4], u[4:8])).
int alias_index(const std::vector<ArgValue>& args, size_t i) {
  const Tensor& t = args[i].tensor;
  for (size_t j = 0; j < i; ++j)
    if (args[j].kind == ArgValue::Kind::Tensor && args[j].tensor.storage() == t.storage()) {
      for (size_t k = j; k < i; ++k) {
        if (args[k].kind != ArgValue::Kind::Tensor) continue;
        const Tensor& u = args[k].tensor;
        if (u.storage() == t.storage() && u.offset() == t.offset() && u.dtype() == t.dtype() &&
            u.shape() == t.shape() && u.strides() == t.strides())
          return static_cast<int>(2 * k + 1);
      }
      return static_cast<int>(2 * j);
    }
  return -1;
}

// Empty when `a` passes guard `g`, else why not (the first check that failed; `failed`, when
// given, is set to the number of a tensor's checks that fail, for closest_entry_failure).
std::string guard_failure(const ArgGuard& g, const std::vector<ArgValue>& args, size_t i,
                          int* failed = nullptr) {
  if (failed) *failed = 1;
  const ArgValue& a = args[i];
  if (a.kind != g.kind) {
    if (a.kind == ArgValue::Kind::Undefined || g.kind == ArgValue::Kind::Undefined)
      return fmt::format("argument {} is {} undefined tensor", i,
                         a.kind == ArgValue::Kind::Undefined ? "now an" : "no longer an");
    return fmt::format("argument {} changed kind", i);
  }
  if (a.type != g.type) return fmt::format("argument {} has another C++ type than when traced", i);
  if (a.kind == ArgValue::Kind::Undefined) return {};
  if (a.kind == ArgValue::Kind::Scalar) {
    if (a.scalar.kind() != g.value.kind())
      return fmt::format("argument {} (host scalar) changed type", i);
    if (!g.dynamic_scalar && !same_scalar(a.scalar, g.value))
      return fmt::format("argument {} (host scalar) is {}, expected {}", i, a.scalar.str(),
                         g.value.str());
    if (g.size_scalar && a.scalar.to<int64_t>() < 2)
      return fmt::format("argument {} (host integer that sizes follow) is {}, expected >= 2", i,
                         a.scalar.str());
    return {};
  }
  if (a.kind == ArgValue::Kind::Other) {
    if (g.other_equal && (!a.other || !g.other_equal(g.other.get(), a.other)))
      return fmt::format("argument {} (a host value) changed", i);
    // The token too: a module built where the traced one was destroyed has its address (a
    // break-it pass: a sweep that emplaced each new model into one std::optional replayed the
    // first model's weights while they were kept alive).
    const bool same_token = !g.lifetime.owner_before(a.lifetime) &&
                            !a.lifetime.owner_before(g.lifetime);
    if (g.identity && (a.other != g.identity || !same_token))
      return fmt::format("argument {} is another object (a module, or another polymorphic class) "
                         "than when traced", i);
    for (auto [offset, impl] : g.embedded) {
      const void* now = nullptr;
      if (a.other && offset + sizeof now <= a.other_size)
        std::memcpy(&now, static_cast<const char*>(a.other) + offset, sizeof now);
      if (now != impl)
        return fmt::format("argument {} (passed through) holds another tensor at byte {} than "
                           "when traced", i, offset);
    }
    return {};
  }
  const Tensor& t = a.tensor;
  if (!t.defined()) return fmt::format("argument {} is an undefined tensor", i);
  std::string first;  // the first failure; the rest are only counted
  int count = 0;
  auto fail = [&](std::string why) {
    if (count++ == 0) first = std::move(why);
    return !failed;  // stop at the first unless counting
  };
  if (t.dtype() != g.dtype &&
      fail(fmt::format("argument {}: dtype is {}, expected {}", i, name(t.dtype()), name(g.dtype))))
    return first;
  if (t.device() != g.device && fail(fmt::format("argument {}: device changed", i))) return first;
  if (t.dim() != g.shape.size()) {
    if (fail(fmt::format("argument {}: rank is {}, expected {}", i, t.dim(), g.shape.size())))
      return first;
  } else {
    for (int d = 0; d < t.dim(); ++d) {
      int64_t s = t.shape()[d];
      std::string why;
      if (g.dyn_mask >> d & 1) {
        if (!(g.any_size >> d & 1) && s < 2)
          why = fmt::format("argument {}: size of dim {} is {}, the symbolic dim needs >= 2", i,
                            d, s);
      } else if (s != g.shape[d]) {
        why = fmt::format("argument {}: size of dim {} is {}, expected {}", i, d, s, g.shape[d]);
      }
      if (!why.empty() && fail(std::move(why))) return first;
    }
  }
  if (t.is_contiguous() != g.contiguous) {
    if (fail(fmt::format("argument {}: {} contiguous", i, g.contiguous ? "no longer" : "now")))
      return first;
  } else if (!g.contiguous && t.strides() != g.strides &&
             fail(fmt::format("argument {}: strides are {}, expected {}", i,
                              to_string(t.strides()), to_string(g.strides)))) {
    return first;
  }
  if (t.requires_grad() != g.requires_grad &&
      fail(fmt::format("argument {}: requires_grad is {}, expected {}", i, t.requires_grad(),
                       g.requires_grad)))
    return first;
  if (g.leaf >= 0 && t.is_leaf() != bool(g.leaf) &&
      fail(fmt::format("argument {}: {} a leaf", i, g.leaf ? "no longer" : "now")))
    return first;
  if (alias_index(args, i) != g.alias_of &&
      fail(fmt::format("argument {}: aliasing with other arguments changed", i)))
    return first;
  if (failed) *failed = count;
  return first;
}

std::string describe_guard(const ArgGuard& g, size_t i) {
  switch (g.kind) {
    case ArgValue::Kind::Scalar:
      return g.dynamic_scalar
                 ? fmt::format("arg {}: host scalar of kind {} (dynamic{})", i,
                               g.value.is_floating() ? "float" : g.value.is_bool() ? "bool" : "int",
                               g.size_scalar ? ", >= 2: sizes follow it" : "")
                 : fmt::format("arg {}: host scalar == {}", i, g.value.str());
    case ArgValue::Kind::Tensor: {
      std::string dims;
      for (int d = 0; d < g.shape.size(); ++d) {
        if (d) dims += ", ";
        dims += (g.dyn_mask >> d & 1) ? fmt::format("s{}.{}{}", i, d, (g.any_size >> d & 1) ? "" : ">=2")
                                      : std::to_string(g.shape[d]);
      }
      return fmt::format("arg {}: Tensor {} [{}] {}{}, requires_grad={}{}{}", i, name(g.dtype),
                         dims, g.device.str(),
                         g.contiguous ? ", contiguous" : ", strides " + to_string(g.strides),
                         g.requires_grad, g.leaf < 0 ? "" : g.leaf ? ", a leaf" : ", not a leaf",
                         g.alias_of < 0    ? ""
                         : g.alias_of % 2 ? fmt::format(", the same elements as arg {}", g.alias_of / 2)
                                          : fmt::format(", same storage as arg {}", g.alias_of / 2));
    }
    case ArgValue::Kind::Undefined:
      return fmt::format("arg {}: undefined Tensor", i);
    default:
      if (g.other_equal)
        return fmt::format("arg {}: host value == the traced one (by operator==)", i);
      if (g.identity)
        return fmt::format("arg {}: the traced object (a module: by address)", i);
      if (!g.embedded.empty())
        return fmt::format("arg {}: its {} Tensor member(s) the function read are the traced ones "
                           "(by identity)", i, g.embedded.size());
      return fmt::format("arg {}: not guarded (not a tensor, number or comparable value)", i);
  }
}

// A stretch of a trace between host reads; children by the value read at its end.
struct Segment {
  std::shared_ptr<const Program> program;
  size_t begin = 0, end = 0;
  bool leaf = false;
  std::unique_ptr<Plan> plan;
  std::vector<std::pair<Scalar, std::unique_ptr<Segment>>> children;
  // Float values a replay's compiled code read where the trace of a child read another (its
  // own rounding of the same sum, say): the same inputs, so the child eager took for them.
  std::vector<std::pair<Scalar, Segment*>> rounded;
  // Symbolic entries: size sets (sizes_key) a trace took this branch at. A trace confirms only
  // the branches it takes; another branch, traced at other sizes, may hold a size-derived
  // constant of those sizes.
  std::vector<std::vector<int64_t>> checked_sizes;
  // Leaf only: the traced backward.
  std::shared_ptr<Plan> backward;
  std::vector<int> saved;  // values the backward reads from the forward
  // Found once: the per-call checks visit these instead of every value of the program.
  std::vector<int> captured_values, arg_values;  // values_from(*program, Captured / Arg)
  // The captured tensors, .grads and host values this segment reads: their guards are checked
  // before it runs (check_sources), not at first use, after in-place writes.
  std::vector<int> guarded_reads;
  // Per output (leaf only): the values from the output back through the view ops that made it
  // (chain[0] the output; node i made chain[i] from chain[i + 1]) (alias_written_outputs).
  struct ViewChain {
    std::vector<int> values;
    std::vector<const Node*> nodes;
  };
  std::vector<ViewChain> output_chains;

  Segment* child(const Scalar& v) const {
    for (auto& [k, s] : children)
      if (same_scalar(k, v)) return s.get();
    for (auto& [k, s] : rounded)
      if (same_scalar(k, v)) return s;
    return nullptr;
  }
  int leaves() const {
    if (leaf) return 1;
    int n = 0;
    for (auto& c : children) n += c.second->leaves();
    return n;
  }
};

// Whether each branch after `seg`'s read runs no op and returns the value read as a host
// number (`return loss.item<float>();`): then only that value differs between its branches.
bool returns_value_read(const Segment& seg) {
  if (seg.children.size() < 2) return false;  // one value says little
  for (const auto& [key, child] : seg.children) {
    if (!child->leaf || child->begin != child->end) return false;
    const Program& p = *child->program;
    bool returned = false;
    for (size_t k = 0; k < p.outputs.size(); ++k)
      returned |= p.outputs[k] < 0 && same_scalar(p.output_constants[k], key);
    if (!returned) return false;
  }
  return true;
}

struct Entry {
  int id = 0;
  std::vector<ArgGuard> guards;
  bool grad_enabled = true;
  DType default_dtype = DType::Float32;
  // eager/autograd.h's count when this was traced or last found current (parameters_current)
  mutable std::atomic<uint64_t> parameter_rebinds{0};
  bool dynamic = false;
  bool draws_random = false;  // a trace of its tree has random ops: replays hold the generator
  bool touches_grads = false;  // a trace of its tree reads or sets a .grad: replays hold the
                               // leaves' .grad lock (hold_leaf_grads)
  bool effects_while_run = false;  // a trace of its tree writes arguments or captured tensors,
                                   // or runs host callbacks (a replay may do so as it runs)
  // Duck sizing: argument dims ((arg, dim) pairs) that were equal in the traces a symbolic
  // entry was made from; one symbol stands for both, so they must stay equal.
  std::vector<std::pair<std::pair<int, int>, std::pair<int, int>>> equal_dims;
  // Symbolic entries: size sets (sizes_key) a fresh trace confirmed, or refuted (those calls
  // go on to other entries). Written under the function's lock; bounded.
  std::vector<std::vector<int64_t>> checked_sizes, refuted_sizes;
  // Host state the traces read (kiln::guarded, Module::is_training(), optimizer branches),
  // with the values they saw: checked before a replay.
  std::vector<HostValue> host_values;
  // Symbolic entries: the traces at other sizes their formulas were inferred from (generalize
  // picks among formulas that two traces both fit); the few most recent.
  std::vector<Witness> witnesses;
  std::string reason;
  std::unique_ptr<Segment> root;
  std::atomic<int64_t> hits{0};
};

// The sizes of the symbolic dims of the call's tensor arguments, in order.
std::vector<int64_t> sizes_key(const Entry& e, const std::vector<ArgValue>& args) {
  std::vector<int64_t> key;
  for (size_t i = 0; i < args.size() && i < e.guards.size(); ++i) {
    if (e.guards[i].dyn_mask && args[i].kind == ArgValue::Kind::Tensor)
      for (int d = 0; d < args[i].tensor.dim(); ++d)
        if (e.guards[i].dyn_mask >> d & 1) key.push_back(args[i].tensor.shape()[d]);
    // A symbolic host scalar's value too: host code may branch on it (`std::max(s, 3.0)`),
    // which no trace of another value can vouch for, so each new value is confirmed once.
    if (e.guards[i].dynamic_scalar && args[i].kind == ArgValue::Kind::Scalar) {
      const Scalar& v = args[i].scalar;
      key.push_back(v.is_floating() ? 1 : 0);
      key.push_back(v.is_floating() ? std::bit_cast<int64_t>(v.to<double>()) : v.to<int64_t>());
    }
  }
  return key;
}

bool contains(const std::vector<std::vector<int64_t>>& sets, const std::vector<int64_t>& key) {
  return std::find(sets.begin(), sets.end(), key) != sets.end();
}

void remember(std::vector<std::vector<int64_t>>& sets, std::vector<int64_t> key) {
  if (sets.size() >= 64) sets.erase(sets.begin());  // bounded: memory must not grow per size
  sets.push_back(std::move(key));
}

// The view chains of p's outputs (Segment::output_chains): from each output back through the
// forward's view ops (not in place) to the first value a view op did not make.
std::vector<Segment::ViewChain> output_view_chains(const Program& p) {
  std::vector<const Node*> producer(p.values.size(), nullptr);  // the last forward node
  for (size_t i = 0; i < std::min(p.backward_begin, p.nodes.size()); ++i)
    for (int o : p.nodes[i].out)
      if (o >= 0 && o < static_cast<int>(producer.size())) producer[o] = &p.nodes[i];
  std::vector<Segment::ViewChain> chains;
  for (int out : p.outputs) {
    Segment::ViewChain c;
    for (int v = out; v >= 0;) {
      c.values.push_back(v);
      const Node* n = producer[v];
      if (!n || n->kind != Node::Kind::Op || n->in_place || n->in.empty() ||
          op_info(n->op).category != OpCategory::View)
        break;
      c.nodes.push_back(n);
      v = n->in[0];
    }
    chains.push_back(std::move(c));
  }
  return chains;
}

// Whether new value `v` is an index_copy / index_add / scatter_add of `old_value` (written back
// into it by copy_, as `x.index_copy_(dim, pos, src)` records): x changed in a few slices.
bool scatter_into(const Program& p, int v, int old_value) {
  auto producer = [&](int value) -> const Node* {
    for (const Node& n : p.nodes)
      if (n.kind == Node::Kind::Op && !n.out.empty() && n.out[0] == value) return &n;
    return nullptr;
  };
  const Node* n = producer(v);
  if (n && n->in_place && n->op == OpKind::CopyInto && n->in.size() == 2) n = producer(n->in[1]);
  return n && !n->in_place && !n->in.empty() && n->in[0] == old_value &&
         (n->op == OpKind::IndexCopy || n->op == OpKind::IndexAdd ||
          n->op == OpKind::ScatterAdd);
}

// The (new value, old value) pairs of the tensors `p` writes back that compiled code may
// compute in place (PlanOptions::donate): a new value written back once, not an output or a
// .grad; an old value (the tensor as the call found it) that is not an output, a .grad, or
// another write-back's value, so nothing reads its elements after the update. Without
// CompileOptions::donate_buffers only scatters into the tensor itself (scatter_into): computed
// apart, a one-slot write of a KV cache copied the whole cache twice per call (a decode step
// 2.6-5.6x slower than eager with caches [1, 2048-4096, 256-1024]).
std::vector<std::pair<int, int>> donations(const Program& p, bool donate_buffers) {
  auto used = [&](int v) {
    if (std::find(p.outputs.begin(), p.outputs.end(), v) != p.outputs.end()) return true;
    for (auto& [leaf, g] : p.grad_assignments)
      if (g == v) return true;
    return false;
  };
  std::vector<std::pair<int, int>> out;
  for (auto& [src, v] : p.write_backs) {
    int writes = 0, old_value = -1;
    for (auto& wb : p.write_backs) writes += wb.second == v;
    for (size_t u = 0; u < p.values.size() && old_value < 0; ++u)
      if (p.values[u].source == src) old_value = static_cast<int>(u);
    if (writes != 1 || old_value < 0 || old_value == v || used(v) || used(old_value)) continue;
    bool written = false;
    for (auto& wb : p.write_backs) written = written || wb.second == old_value;
    if (!written && (donate_buffers || scatter_into(p, v, old_value)))
      out.push_back({v, old_value});
  }
  return out;
}

// The values with a guarded source (a captured tensor, a .grad, a host value read at run
// time) that nodes [begin, end) read, and for a leaf segment what it hands back or writes.
std::vector<int> guarded_reads(const Program& p, size_t begin, size_t end, bool leaf) {
  std::vector<bool> used(p.values.size(), false);
  for (size_t i = begin; i < end; ++i)
    for (int v : p.nodes[i].in)
      if (v >= 0) used[v] = true;
  if (leaf) {
    for (int v : p.outputs)
      if (v >= 0) used[v] = true;
    for (auto& [src, v] : p.write_backs) used[v] = true;
    for (auto& [leaf_value, g] : p.grad_assignments)
      if (g >= 0) used[g] = true;
  }
  std::vector<int> out;
  for (size_t v = 0; v < p.values.size(); ++v) {
    int s = p.values[v].source;
    if (!used[v] || s < 0) continue;
    SourceKind k = p.sources[s].kind;
    if (k == SourceKind::Captured || k == SourceKind::GradOf || k == SourceKind::HostInput)
      out.push_back(static_cast<int>(v));
  }
  return out;
}

// Segments of `p` from node `from`: a chain split after each Read node.
std::unique_ptr<Segment> make_chain(const std::shared_ptr<const Program>& p, size_t from,
                                    const CompileOptions& o) {
  size_t fwd_end = std::min(p->backward_begin, p->nodes.size());
  size_t end = from;
  while (end < fwd_end && p->nodes[end].kind != Node::Kind::Read) ++end;
  auto seg = std::make_unique<Segment>();
  seg->program = p;
  seg->captured_values = values_from(*p, SourceKind::Captured);
  seg->arg_values = values_from(*p, SourceKind::Arg);
  seg->begin = from;
  seg->leaf = end == fwd_end;
  if (seg->leaf) seg->output_chains = output_view_chains(*p);
  seg->end = seg->leaf ? end : end + 1;
  seg->guarded_reads = guarded_reads(*p, seg->begin, seg->end, seg->leaf);
  PlanOptions po;
  po.compile = o.backend == Backend::Cpu;
  // A segment that ends at a host read is followed by segments (of branches traced now or
  // later) that may read any value it computed: every value stays live after it, so a value a
  // compiled region computes is one of the region's outputs (the fuzzer's "branch keeps an
  // earlier value": a value computed before a read and used after it was never set).
  po.live_after.assign(p->values.size(), !seg->leaf);
  po.free_dead = seg->leaf;
  if (seg->leaf) {
    for (int v : p->outputs) if (v >= 0) po.live_after[v] = true;
    for (auto& [src, v] : p->write_backs) po.live_after[v] = true;
    for (auto& [leaf, g] : p->grad_assignments) {
      po.live_after[leaf] = true;
      if (g >= 0) po.live_after[g] = true;
    }
    for (const Program::HistoryBackward& h : p->history_backwards)
      for (const std::vector<int>* list : {&h.grads, &h.owners})
        for (int v : *list) po.live_after[v] = true;
    // A traced backward with no ops (the gradient passes through unchanged: contiguous, a
    // same-dtype `to`, a 0-d transpose) still needs its plan: without it replays attached no
    // grad_fn and the outputs did not require grad (found by tests/conformance).
    bool traced_backward = false;
    for (int v : p->grad_outputs) traced_backward |= v >= 0;
    if (p->backward_begin < p->nodes.size() || traced_backward) {
      std::vector<bool> def(p->values.size(), false);
      for (size_t i = p->backward_begin; i < p->nodes.size(); ++i)
        for (int v : p->nodes[i].out) def[v] = true;
      std::vector<bool> seen(p->values.size(), false);
      for (size_t i = p->backward_begin; i < p->nodes.size(); ++i)
        for (int v : p->nodes[i].in)
          if (v >= 0 && !def[v] && !seen[v] &&
              !(p->values[v].source >= 0 &&
                p->sources[p->values[v].source].kind == SourceKind::GradOutput)) {
            seen[v] = true;
            seg->saved.push_back(v);
            po.live_after[v] = true;
          }
      for (int v : p->grad_inputs) po.live_after[v] = true;
      PlanOptions bo;
      bo.compile = po.compile;
      bo.live_after.assign(p->values.size(), false);
      for (int v : p->grad_results) if (v >= 0) bo.live_after[v] = true;
      // The backward's regions compile on another thread while the forward's compile here:
      // each plan alone may not have enough regions to keep every core busy (the Transformer
      // layer's forward is one region).
      std::exception_ptr backward_error;
      std::thread backward_builder([&, bo = std::move(bo)] {
        try {
          seg->backward = std::make_shared<Plan>(p, p->backward_begin, p->nodes.size(), bo);
        } catch (...) {
          backward_error = std::current_exception();
        }
      });
      try {
        seg->plan = std::make_unique<Plan>(p, seg->begin, seg->end, po);
      } catch (...) {
        backward_builder.join();
        throw;
      }
      backward_builder.join();
      if (backward_error) std::rethrow_exception(backward_error);
    }
  }
  // Buffer donation into compiled code: a leaf segment with no traced backward (nothing reads
  // the forward's values after it) whose arguments share no memory with captured tensors.
  if (!seg->plan && seg->leaf && p->args_sharing_captured.empty())
    po.donate = donations(*p, o.donate_buffers);
  if (!seg->plan) seg->plan = std::make_unique<Plan>(p, seg->begin, seg->end, po);
  if (!seg->leaf) {
    const Node& read = p->nodes[end];
    seg->children.push_back({read.read_value, make_chain(p, end + 1, o)});
  }
  return seg;
}

// The tensor value `v` of `p` stands for at this call: its source's, or for the new value of
// an argument / captured tensor the function wrote (an optimizer's step), that tensor.
Tensor caller_tensor(const Program& p, RunState& st, int v) {
  int src = p.values[v].source;
  for (size_t k = 0; k < p.write_backs.size() && src < 0; ++k)
    if (p.write_backs[k].second == v) src = p.write_backs[k].first;
  if (src < 0) return Tensor();
  for (size_t u = 0; u < p.values.size(); ++u)
    if (p.values[u].source == src) return st.value(p, static_cast<int>(u));
  return Tensor();
}

// The edges of the autograd history a replay's arguments / captured tensors bring, for each
// HistoryBackward's owners in order (invalid for an owner that now has no history: a leaf that
// does not require grad). Runs before the replay changes anything, and throws GuardFailure,
// so that the call is traced (run eagerly) instead, where that history would set a .grad the
// program reads, sets or found undefined (it would add to it after the program's own use),
// where it saved a tensor the program writes in place (it would find it changed), or where it
// would raise (freed by an earlier backward: eager raises at the backward(), before the
// function's later writes).
std::vector<autograd::Edge> check_history_reach(const Program& p, RunState& st) {
  std::vector<autograd::Edge> edges;
  for (const Program::HistoryBackward& h : p.history_backwards)
    for (int v : h.owners) edges.push_back(autograd::gradient_edge(st.value(p, v)));
  if (edges.empty()) return edges;
  const HistoryReach reach = history_reach(edges);
  if (reach.raises)
    throw GuardFailure{"the autograd history an argument brings would raise in backward() "
                       "(freed by an earlier backward, or a saved tensor changed in place)"};
  std::vector<int> leaves = p.grad_undefined_at_call;
  for (auto& [leaf, g] : p.grad_assignments) leaves.push_back(leaf);
  for (int v : values_from(p, SourceKind::GradOf))
    leaves.push_back(p.sources[p.values[v].source].index);
  for (int leaf : leaves)
    if (Tensor t = caller_tensor(p, st, leaf); t.defined() && reach.grads.count(t.impl()))
      throw GuardFailure{fmt::format(
          "the autograd history an argument brings sets the .grad of a tensor (shape {}) that "
          "the function reads or sets itself",
          to_string(t.shape()))};
  for (auto& [src, v] : p.write_backs)
    if (Tensor t = caller_tensor(p, st, v); t.defined() && reach.saved.count(t.storage().get()))
      throw GuardFailure{fmt::format(
          "the autograd history an argument brings saved a tensor (shape {}) that the function "
          "changes in place",
          to_string(t.shape()))};
  return edges;
}

void describe_tree(const Segment& s, int depth, std::string& out) {
  std::string pad(2 * depth, ' ');
  out += fmt::format("{}  segment: {} ops -> {} compiled region(s), {} kernel(s), {} eager op(s)\n",
                     pad, s.plan->num_ops(), s.plan->num_regions(), s.plan->num_kernels(),
                     s.plan->num_eager_ops());
  std::string steps = s.plan->describe();
  for (size_t a = 0; a < steps.size();) {
    size_t b = steps.find('\n', a);
    out += pad + steps.substr(a, b - a + 1);
    a = b + 1;
  }
  for (const Program::HistoryBackward& h : s.leaf ? s.program->history_backwards
                                                  : std::vector<Program::HistoryBackward>{})
    out += fmt::format("{}  then the backward() at {}:{} into autograd history made before the "
                       "call, on eager autograd (a graph break)\n",
                       pad, h.loc.file_name(), h.loc.line());
  if (s.backward)
    out += fmt::format("{}  backward: {} ops -> {} compiled region(s), {} kernel(s), {} eager op(s)\n",
                       pad, s.backward->num_ops(), s.backward->num_regions(),
                       s.backward->num_kernels(), s.backward->num_eager_ops());
  for (auto& [v, c] : s.children) {
    out += fmt::format("{}  on host value {}:\n", pad, v.str());
    describe_tree(*c, depth + 1, out);
  }
}

}  // namespace

namespace {

// Every live compiled function's lock, for fork(): a replay holds its function's lock (shared)
// for the whole replay, and a trace holds it (exclusive) while it compiles, so a child forked
// meanwhile inherited it held by a thread that does not exist there, and its first trace of
// that function hung (found by review).
struct LiveFunction {
  std::shared_mutex* mu;
  std::atomic<bool>* forked_while_busy;
  bool held_at_fork = false;
};
std::mutex g_live_mu;
std::vector<LiveFunction*> g_live;

// Before fork() (and, registered before these, the generator's and the leaves' locks, which
// replays take after their function's): each function's lock is tried, not waited for, so a
// fork does not wait for another thread's compile (seconds) or replay. In the child every lock
// is made anew (a pthread_rwlock may not be unlocked by the child, whose thread id differs from
// the owner's); a function whose lock was held there may have been mid-update, so the child
// runs it eagerly.
void register_function_fork_handlers() {
  static std::once_flag once;
  std::call_once(once, [] {
    register_replay_fork_handlers();
    pthread_atfork(
        [] {
          g_live_mu.lock();
          for (LiveFunction* f : g_live) f->held_at_fork = f->mu->try_lock();
        },
        [] {
          for (LiveFunction* f : g_live)
            if (f->held_at_fork) f->mu->unlock();
          g_live_mu.unlock();
        },
        [] {
          for (LiveFunction* f : g_live) {
            new (f->mu) std::shared_mutex();
            if (!f->held_at_fork) f->forked_while_busy->store(true);
          }
          new (&g_live_mu) std::mutex();
        });
  });
}

}  // namespace

struct CompiledFunction::Impl {
  const std::string& name;
  const CompileOptions& options;
  Impl(const std::string& n, const CompileOptions& o) : name(n), options(o) {
    register_function_fork_handlers();
    std::lock_guard lock(g_live_mu);
    g_live.push_back(&live);
  }
  ~Impl() {
    std::lock_guard lock(g_live_mu);
    std::erase(g_live, &live);
  }
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;

  // `ran` (when given) is set to the trace that ran: the leaf of the entry's trace tree.
  std::vector<OutValue> replay(Entry& e, const std::vector<ArgValue>& args,
                               std::shared_ptr<const Program>* ran = nullptr);
  /// Traces the call. `failed`: the entry whose replay failed (`missing_branch`: for want of
  /// a branch). `unchecked`: a symbolic entry the call passes with sizes not yet confirmed;
  /// the trace confirms them (then nothing is compiled) or refutes them (a new entry).
  /// `marked`: CompileOptions::dynamic_dims of this call, as positions in the flattened
  /// arguments and dims in range. Called with `lock` held; the function itself runs without
  /// it (it may call this function on another thread, or explain()); when another trace or a
  /// reset() changed the cache meanwhile, this trace's result is returned and not cached.
  /// `shape_only_confirmed` (with `unchecked`): a shape-only run (CompileOptions::
  /// shape_only_checks) that sets it when it confirms `unchecked` for these sizes; its
  /// outputs are garbage, and it throws (ShapeOnlyUnfit, ShapeOnlyAbort, the function's own
  /// errors) where the call must be traced instead, having given the caller's state back.
  std::vector<OutValue> trace(std::unique_lock<std::shared_mutex>& lock,
                              const std::vector<ArgValue>& args, const Invoke& invoke, Loc loc,
                              const std::vector<std::pair<int, int>>& marked, Entry* failed,
                              bool missing_branch, const std::string& miss_reason,
                              Entry* unchecked = nullptr, const MissingBranch* missed = nullptr,
                              bool* shape_only_confirmed = nullptr);
  /// Whether a call at unconfirmed sizes of symbolic entry `e` is checked shape-only first.
  bool checks_shape_only(const Entry& e) const;
  /// Adds the tensors that the trace of `p` captured to captured_tensors, then records which
  /// of its arguments share memory with one (the guard Program::args_sharing_captured).
  void remember_captured(Program& p, Recorder& rec);
  /// The entries the call passes, in order, each with whether its sizes still need a
  /// confirming trace (the list ends at the first such one).
  std::vector<std::pair<std::shared_ptr<Entry>, bool>> find_entries(
      const std::vector<ArgValue>& args) const;

  mutable std::shared_mutex mu;
  /// In a child forked while another thread held `mu`: its entries may be mid-update, so every
  /// call runs the function eagerly (register_function_fork_handlers).
  std::atomic<bool> forked_while_busy{false};
  LiveFunction live{&mu, &forked_while_busy};
  std::vector<std::shared_ptr<Entry>> entries;
  /// Moves entry `e` just before `refuted` in `entries` when it comes after it. Entries are
  /// tried in order and the first unconfirmed one decides: one that holds at sizes where
  /// `refuted` failed is tried first from then on, so new sizes are checked against it
  /// shape-only (kept behind, `refuted` matched first at every new size and ran a full trace
  /// to refute itself: a slice to `n / 2` traced at every size).
  void place_before(const Entry* e, const Entry* refuted) {
    auto at = [&](const Entry* x) {
      return std::ranges::find_if(entries, [&](const auto& y) { return y.get() == x; });
    };
    auto from = at(e), to = at(refuted);
    if (from != entries.end() && to < from) std::rotate(to, from, from + 1);
  }
  std::vector<std::string> recompiles;  // each trace after the first, with its reason
  size_t recompiles_dropped = 0;         // the oldest ones, beyond kMaxRecompilesKept
  // Entries dropped because their guards can no longer pass (a captured tensor freed or
  // resized): each was a compile, so they count toward cache_size_limit, as PyTorch counts
  // every recompile (a captured tensor rebound on every call traced on every call, forever).
  int dropped_entries = 0;
  static constexpr size_t kMaxRecompilesKept = 64;
  void log_recompile(std::string why) {
    recompiles.push_back(std::move(why));
    if (recompiles.size() > kMaxRecompilesKept) {
      recompiles.erase(recompiles.begin());
      ++recompiles_dropped;
    }
  }
  std::atomic<int> traces{0};      // traces that made a cache entry (compile_count())
  std::atomic<int> traces_run{0};  // every trace, also those not cached (explain())
  std::atomic<bool> eager_only{false};
  std::atomic<bool> limit_reached{false};  // cache_size_limit: no more traces (see trace())
  std::string limit_reason;
  // Counts the traces that finished and the resets: a trace that ran the function while
  // another changed the cache is not cached (see trace()).
  uint64_t generation = 0;
  std::string eager_reason;
  // Makes every later call run eagerly, saying why once on stderr (and in explain()).
  // Said once: threads that started a trace before the first decided do not repeat it.
  void run_eagerly_from_now_on(std::string why) {
    if (eager_only.exchange(true)) return;
    eager_reason = std::move(why);
    fmt::print(stderr, "kiln.compile: '{}' runs eagerly from now on: {}\n", name, eager_reason);
  }
  int next_id = 0;
  // Automatic dynamic: dims / scalars that changed and caused a recompile.
  std::vector<std::pair<int, int>> auto_dims;
  std::vector<int> auto_scalars;
  std::atomic<int64_t> eager_calls{0};
  int uncached_in_a_row = 0;
  /// The tensors any trace captured (Program::args_sharing_captured).
  std::vector<std::weak_ptr<TensorImpl>> captured_tensors;
  int size_checks = 0;  // traces that confirmed a symbolic entry for new sizes
  int shape_only_checks = 0;  // shape-only runs that did so (CompileOptions::shape_only_checks)
};

CompiledFunction::CompiledFunction(std::string name, CompileOptions options, Loc loc)
    : name_(std::move(name)), options_(std::move(options)) {
  // Enums cast from integers and tolerances that no difference could pass (check = true):
  // accepted silently before (a break-it pass).
  KILN_CHECK(static_cast<unsigned>(options_.dynamic) <= static_cast<unsigned>(Dynamic::Never),
             "compile", loc, "invalid Dynamic value {}", static_cast<int>(options_.dynamic));
  KILN_CHECK(static_cast<unsigned>(options_.backend) <= static_cast<unsigned>(Backend::Eager),
             "compile", loc, "invalid Backend value {}", static_cast<int>(options_.backend));
  KILN_CHECK(options_.rtol >= 0 && options_.atol >= 0, "compile", loc,
             "rtol and atol must be >= 0, got rtol {} and atol {}", options_.rtol, options_.atol);
  KILN_CHECK(options_.cache_size_limit >= 1, "compile", loc,
             "cache_size_limit is {}; it must be at least 1 (specialisations kept before the "
             "function runs eagerly)", options_.cache_size_limit);
  impl_ = std::make_unique<Impl>(name_, options_);
}
CompiledFunction::~CompiledFunction() = default;

int CompiledFunction::compile_count() const { return impl_->traces.load(); }
int CompiledFunction::cache_entries() const {
  std::shared_lock lock(impl_->mu);
  int n = 0;
  for (auto& e : impl_->entries) n += e->root->leaves();
  return n;
}
void CompiledFunction::reset() {
  std::unique_lock lock(impl_->mu);
  ++impl_->generation;
  impl_->entries.clear();
  impl_->recompiles.clear();
  impl_->recompiles_dropped = 0;
  impl_->dropped_entries = 0;
  impl_->auto_dims.clear();
  impl_->auto_scalars.clear();
  impl_->traces = 0;
  impl_->traces_run = 0;
  impl_->size_checks = 0;
  impl_->eager_only = false;
  impl_->eager_reason.clear();
  impl_->limit_reached = false;
  impl_->limit_reason.clear();
}

namespace {

// Empty when host value `h` still reads as traced, else why not.
std::string host_value_failure(const HostValue& h) {
  std::optional<Scalar> now = h.reader();
  if (now && same_scalar(*now, h.value)) return {};
  return fmt::format("{} at {}:{} is {}, expected {}", h.what, h.loc.file_name(), h.loc.line(),
                     now ? now->str() : std::string("gone"), h.value.str());
}

// Calls f(segment) for `s` and every segment below it.
template <class F>
void for_each_segment(const Segment& s, const F& f) {
  f(s);
  for (const auto& c : s.children) for_each_segment(*c.second, f);
}

// No module parameter or buffer that entry `e`'s traces captured was replaced in its module,
// nor a submodule, since the entry was traced (eager/autograd.h): the process-wide count
// first, then, where another module's tensors were swapped meanwhile, the tensors this entry
// captured, after which the count is taken as seen. Comparing the count alone made every
// compiled function retrace whenever any module anywhere refreshed a buffer, until each hit
// its cache limit and ran eagerly (a break-it pass).
bool parameters_current(const Entry& e) {
  const uint64_t now = parameter_rebinds(), seen = e.parameter_rebinds.load();
  if (now == seen) return true;
  if (submodule_replaced_at() > seen) return false;
  bool current = true;
  for_each_segment(*e.root, [&](const Segment& s) {
    for (const Source& src : s.program->sources)
      if (current && src.kind == SourceKind::Captured)
        if (auto impl = src.captured.lock()) current = parameter_unbound_at(impl) <= seen;
  });
  if (current) e.parameter_rebinds.store(now);
  return current;
}

// The entry's argument count, global state (grad mode, default dtype) and guarded host
// values match the call.
bool globals_match(const Entry& e, const std::vector<ArgValue>& args) {
  if (e.guards.size() != args.size() || is_grad_enabled() != e.grad_enabled ||
      default_dtype() != e.default_dtype || !parameters_current(e))
    return false;
  for (const HostValue& h : e.host_values) {
    std::optional<Scalar> now = h.reader();
    if (!now || !same_scalar(*now, h.value)) return false;
  }
  return true;
}

// Adds the host values of trace `p` that entry `e` does not guard yet.
void add_host_values(Entry& e, const Program& p) {
  for (const HostValue& h : p.host_values) {
    bool known = false;
    for (const HostValue& k : e.host_values)
      known |= k.key == h.key && k.what == h.what;
    if (!known) e.host_values.push_back(h);
  }
}

bool passes(const Entry& e, const std::vector<ArgValue>& args) {
  if (!globals_match(e, args)) return false;
  for (size_t i = 0; i < args.size(); ++i) {
    const ArgGuard& g = e.guards[i];
    const ArgValue& a = args[i];
    if (a.kind != g.kind) return false;
    if (a.kind == ArgValue::Kind::Tensor) {
      // The common case inline; guard_failure() has the full set.
      const Tensor& t = a.tensor;
      if (!t.defined() || t.dtype() != g.dtype || t.dim() != g.shape.size()) return false;
      if (g.dyn_mask == 0 && t.shape() != g.shape) return false;
    }
    if (!guard_failure(g, args, i).empty()) return false;
  }
  for (auto [x, y] : e.equal_dims)
    if (args[x.first].tensor.shape()[x.second] != args[y.first].tensor.shape()[y.second])
      return false;
  return true;
}

// Every guard of entry `e` that the call fails (one per argument at most), global state first;
// `checks_failed` counts each failed check of a tensor argument (its dtype and requires_grad).
std::vector<std::string> entry_failures(const Entry& e, const std::vector<ArgValue>& args,
                                        int* checks_failed) {
  *checks_failed = 1;
  if (e.guards.size() != args.size()) return {"number of arguments changed"};
  std::vector<std::string> out;
  int more = 0;  // failed checks beyond the first of each argument
  if (is_grad_enabled() != e.grad_enabled)
    out.push_back(fmt::format("grad mode is {}, expected {}", is_grad_enabled(), e.grad_enabled));
  if (default_dtype() != e.default_dtype)
    out.push_back(fmt::format("default dtype is {}, expected {}", name(default_dtype()),
                              name(e.default_dtype)));
  if (!parameters_current(e))
    out.push_back("a module's parameter or buffer was replaced (register_parameter / "
                  "register_buffer of an existing name) after this was traced");
  for (const HostValue& h : e.host_values)
    if (std::string f = host_value_failure(h); !f.empty()) out.push_back(std::move(f));
  for (size_t i = 0; i < args.size(); ++i) {
    int failed = 0;
    if (std::string f = guard_failure(e.guards[i], args, i, &failed); !f.empty()) {
      out.push_back(std::move(f));
      more += failed - 1;
    }
  }
  if (out.empty())  // the dims below are only compared between defined tensors
    for (auto [x, y] : e.equal_dims)
      if (args[x.first].tensor.shape()[x.second] != args[y.first].tensor.shape()[y.second])
        out.push_back(fmt::format("argument {} dim {} and argument {} dim {} are no longer equal",
                                  x.first, x.second, y.first, y.second));
  *checks_failed = static_cast<int>(out.size()) + more;
  return out;
}

// Why the call matches no entry, told against the entry it comes closest to (the fewest failed
// checks; the latest on ties): the latest entry may be of another shape family or branch.
std::string closest_entry_failure(const std::vector<std::shared_ptr<Entry>>& entries,
                                  const std::vector<ArgValue>& args) {
  const Entry* closest = nullptr;
  std::vector<std::string> failures;
  int fewest = 0;
  for (const auto& e : entries) {
    int checks = 0;
    std::vector<std::string> f = entry_failures(*e, args, &checks);
    if (f.empty()) continue;  // passes its guards: the replay reported why it did not run
    if (!closest || checks <= fewest) closest = e.get(), failures = std::move(f), fewest = checks;
  }
  if (!closest) return {};
  std::string reason = failures.front();
  if (fewest > 1) reason += fmt::format(" (and {} more failed check(s))", fewest - 1);
  if (entries.size() == 1) return reason;
  return fmt::format("closest is specialisation #{}: {}", closest->id, reason);
}

// The dims and scalars in which `args` differ from entry `e` when nothing else differs.
// `strided` (when given) is set to the position of a strided argument that alone kept them
// from differing only in sizes.
bool only_sizes_differ(const Entry& e, const std::vector<ArgValue>& args,
                       std::vector<std::pair<int, int>>& dims, std::vector<int>& scalars,
                       int* strided = nullptr) {
  if (!globals_match(e, args)) return false;
  for (size_t i = 0; i < args.size(); ++i) {
    const ArgGuard& g = e.guards[i];
    const ArgValue& a = args[i];
    if (a.kind != g.kind) return false;
    if (a.kind == ArgValue::Kind::Scalar) {
      if (a.scalar.kind() != g.value.kind()) return false;
      if (!g.dynamic_scalar && !same_scalar(a.scalar, g.value)) {
        if (g.fixed) return false;
        scalars.push_back(i);
      }
    } else if (a.kind == ArgValue::Kind::Other) {
      if (!guard_failure(g, args, i).empty()) return false;
    } else if (a.kind == ArgValue::Kind::Tensor) {
      const Tensor& t = a.tensor;
      if (t.dtype() != g.dtype || t.dim() != g.shape.size() ||
          t.requires_grad() != g.requires_grad || alias_index(args, i) != g.alias_of ||
          (g.leaf >= 0 && t.is_leaf() != bool(g.leaf)))
        return false;
      // A strided argument takes part when its strides are the entry's (x[:, :5] of rows of
      // 8 as the batch changes: [8, 1]); strides that change with the sizes (a transpose)
      // keep it specialised per size, since the guard checks them exactly.
      if (t.is_contiguous() != g.contiguous || (!g.contiguous && t.strides() != g.strides)) {
        if (strided && !t.is_contiguous() && t.shape() != g.shape) *strided = int(i);
        return false;
      }
      for (int d = 0; d < t.dim(); ++d)
        if (!(g.dyn_mask >> d & 1) && t.shape()[d] != g.shape[d]) dims.push_back({int(i), d});
    }
  }
  return !dims.empty() || !scalars.empty();
}

}  // namespace

std::vector<std::pair<std::shared_ptr<Entry>, bool>> CompiledFunction::Impl::find_entries(
    const std::vector<ArgValue>& args) const {
  std::vector<std::pair<std::shared_ptr<Entry>, bool>> out;
  // Entries that hold for these sizes come first; the first symbolic one not yet confirmed
  // for them last (an earlier entry may be unconfirmed where a later one was confirmed).
  std::shared_ptr<Entry> unchecked;
  for (const std::shared_ptr<Entry>& e : entries) {
    if (!passes(*e, args)) continue;
    if (!e->dynamic) {
      out.push_back({e, false});
      continue;
    }
    std::vector<int64_t> key = sizes_key(*e, args);
    if (contains(e->refuted_sizes, key)) continue;
    if (contains(e->checked_sizes, key))
      out.push_back({e, false});
    else if (!unchecked)
      unchecked = e;
  }
  if (unchecked) out.push_back({unchecked, true});
  return out;
}

namespace {
thread_local std::shared_ptr<const Program> t_last_replayed;
}  // namespace

std::shared_ptr<const Program> last_replayed_program() { return t_last_replayed; }

std::vector<OutValue> CompiledFunction::call(const std::vector<ArgValue>& given,
                                             const Invoke& invoke, Loc loc) {
  Impl& im = *impl_;
  // What last_replayed_program() gives after this call (CompileOptions::check only): calls
  // nested in its trace or eager run do not answer for it.
  struct LastReplayed {
    std::shared_ptr<const Program> program;
    ~LastReplayed() { t_last_replayed = std::move(program); }
  } replayed;
  // Tensor lists are flattened: their length (guarded by value), then one tensor per element.
  bool has_list = false;
  for (const ArgValue& a : given) has_list |= a.kind == ArgValue::Kind::TensorList;
  std::vector<ArgValue> flat;
  if (has_list) {
    for (const ArgValue& a : given) {
      if (a.kind != ArgValue::Kind::TensorList) {
        flat.push_back(a);
        continue;
      }
      ArgValue n;
      n.kind = ArgValue::Kind::Scalar;
      n.scalar = Scalar(static_cast<int64_t>(a.list.size()));
      n.fixed = true;
      flat.push_back(n);
      for (const Tensor& t : a.list) {
        ArgValue e;
        e.kind = t.defined() ? ArgValue::Kind::Tensor : ArgValue::Kind::Undefined;
        e.tensor = t;
        flat.push_back(e);
      }
    }
  }
  const std::vector<ArgValue>& args = has_list ? flat : given;
  // mark_dynamic's argument positions are the caller's (a list is one argument).
  std::vector<std::pair<int, int>> marked;
  for (auto [a, d] : options_.dynamic_dims) {
    KILN_CHECK(a >= 0 && a < int(given.size()) && given[a].kind != ArgValue::Kind::Scalar &&
                   given[a].kind != ArgValue::Kind::Other &&
                   given[a].kind != ArgValue::Kind::TensorList,
               "compile", loc, "mark_dynamic({}, {}): argument {} is not a tensor (the function "
               "'{}' takes {} argument(s))", a, d, a, name_, given.size());
    if (given[a].kind != ArgValue::Kind::Tensor) continue;  // undefined in this call
    int rank = given[a].tensor.dim();
    // Out of range on the first call: a mistake in the options. On a later call the argument
    // changed rank, and is traced for that rank without the mark (as PyTorch retraces).
    KILN_CHECK(d >= -rank && d < rank || im.traces.load() > 0, "compile", loc,
               "mark_dynamic({}, {}): dim {} is out of range for argument {} of rank {}", a, d,
               d, a, rank);
    if (d < -rank || d >= rank) continue;
    int at = a;
    for (int i = 0; i < a; ++i)
      if (given[i].kind == ArgValue::Kind::TensorList) at += static_cast<int>(given[i].list.size());
    marked.push_back({at, d < 0 ? d + rank : d});
  }
  // Inside another function's trace, this function's ops become part of that trace.
  if (compile_disabled() || Recorder::current() != nullptr) return invoke();
  PrintScope prints;
  if (im.forked_while_busy.load(std::memory_order_relaxed)) {
    ++im.eager_calls;
    return invoke();
  }
  if (im.eager_only.load(std::memory_order_relaxed)) {
    ++im.eager_calls;
    return invoke();
  }
  // An argument that lost a gradient history in place raises where eager uses it in a
  // recorded op; a replay records nothing, so such a call runs eagerly.
  // So does a view made under no_grad of a tensor that requires grad: eager raises if the
  // function writes into it with grad mode on, which a replay would do silently.
  if (is_grad_enabled())
    for (const ArgValue& a : args) {
      if (a.kind != ArgValue::Kind::Tensor) continue;
      if (lost_in_place_history(a.tensor)) return invoke();
      const auto& base = a.tensor.impl()->base;
      if (base && !a.tensor.requires_grad() && Tensor(base).requires_grad()) return invoke();
    }
  std::string miss_reason;
  bool missing_branch = false;  // the replay reached a host value no branch was traced for
  std::optional<MissingBranch> missed;  // where (a specialised entry's replay)
  bool run_eagerly = false;     // a replay raised before it changed anything (ReplayRaised)
  std::string replay_error;     // what it raised
  for (int attempt = 0; attempt < 3 && !run_eagerly; ++attempt) {
    missing_branch = false;
    missed.reset();
    std::vector<std::pair<std::shared_ptr<Entry>, bool>> found;
    std::shared_ptr<Entry> entry;  // the entry the trace below extends, confirms or drops
    std::shared_ptr<Entry> lacks_branch;  // a symbolic entry without this call's path
    std::string lacks_reason;
    bool unchecked = false;
    uint64_t seen_generation = 0;  // traces finished before this attempt's replays
    {
      std::shared_lock lock(im.mu);
      seen_generation = im.generation;
      found = im.find_entries(args);
      // Entries that differ only in guards checked while replaying (a captured tensor's
      // requires_grad, a .grad defined or not) are tried in turn: gradient accumulation and
      // freeze/unfreeze alternate between two of them.
      for (auto& [e, e_unchecked] : found) {
        if (e_unchecked) {
          entry = e, unchecked = true;
          break;
        }
        try {
          // One precision for all its products, compiled or run on eager kernels, whatever
          // another thread sets meanwhile.
          MatmulPrecisionScope precision;
          std::vector<OutValue> outs =
              im.replay(*e, args, options_.check ? &replayed.program : nullptr);
          ++e->hits;  // a call that traced a new branch instead is not a replay
          return outs;
        } catch (const MissingBranch& m) {
          std::string why = fmt::format("host read at {}:{} gave {}, a value not seen before",
                                        m.loc.file_name(), m.loc.line(), m.value.str());
          // Each value of a float read is a branch of its own: a comparison read as a bool
          // has two.
          if (m.returned_as_is)
            why += " (each value read is a branch of its own, and each branch traced so far "
                   "ran no op after this read and returned the value read: if the function "
                   "returns it, return the tensor instead, e.g. loss.detach(), and call item() "
                   "on it after the call)";
          else if (m.value.is_floating())
            why += " (each value read is a branch of its own: branch on a comparison made on "
                   "the tensor, read as a bool, e.g. (x.sum() > 0).item<bool>())";
          // A symbolic entry holds one path of a trace tree: another entry may hold this one.
          if (e->dynamic) {
            if (!lacks_branch) lacks_branch = e, lacks_reason = why;
            continue;
          }
          miss_reason = why;
          missing_branch = true;
          missed = m;
          entry = e;
          break;
        } catch (const UncheckedBranch&) {
          entry = e, unchecked = true;
          break;
        } catch (const ReplayRaised& raised) {
          run_eagerly = true;
          replay_error = raised.message;
          break;
        } catch (const GuardFailure& g) {
          miss_reason = g.reason;
          if (g.permanent && !entry) entry = e;  // dropped by the trace
        } catch (const Error& err) {
          // A value check at sizes a trace confirmed: eager raises it too (review: dropping the
          // entry for it made the function eager after 8 such calls).
          if (!e->dynamic || contains(e->checked_sizes, sizes_key(*e, args))) throw;
          // A symbolic specialisation could not run these sizes: drop it and specialise.
          miss_reason = fmt::format("symbolic replay failed ({}); specialising", err.message());
          entry = e;
          break;
        }
      }
    }
    if (run_eagerly) break;  // outside the lock: the function may call this one again
    if (!entry && lacks_branch) {
      entry = lacks_branch, missing_branch = true;
      miss_reason = lacks_reason;
    }
    std::unique_lock lock(im.mu);
    // Another thread may have traced or confirmed this guard set meanwhile, or added the
    // branch this replay missed to its entry (two threads missing one branch both traced it,
    // and the second, finding the branch there, made a duplicate entry).
    if (im.generation != seen_generation || im.find_entries(args) != found) continue;
    if (unchecked && im.checks_shape_only(*entry)) {
      bool confirmed = false;
      std::string why;  // the call is traced below (the run gave the caller's state back)
      try {
        im.trace(lock, args, invoke, loc, marked, nullptr, false, {}, entry.get(), nullptr,
                 &confirmed);
      } catch (const ShapeOnlyUnfit& u) {
        why = u.why;
      } catch (const ShapeOnlyAbort&) {
        why = "it reads a tensor value, takes a pointer to tensor memory, runs autograd history "
              "made before the call or writes with autograd history into a tensor it did not "
              "make";
      } catch (const Error& e) {
        why = e.what();
      } catch (...) {
        why = "it threw";
      }
      if (confirmed) continue;  // replays
      if (log_enabled("recompiles"))
        fmt::print(stderr, "kiln.compile: '{}': new sizes checked shape-only: not confirmed "
                   "({}); traced\n", im.name, why);
      if (!lock.owns_lock()) lock.lock();
    }
    if (unchecked)
      return im.trace(lock, args, invoke, loc, marked, nullptr, false, {}, entry.get());
    return im.trace(lock, args, invoke, loc, marked, entry.get(), missing_branch, miss_reason,
                    nullptr, missed ? &*missed : nullptr);
  }
  const uint64_t op_errors_before = dispatch::op_errors();
  PrintScope::restart();
  std::vector<OutValue> outs = invoke();
  // Eager did not raise where the replay did, nor caught an op's error itself (a try around
  // index_select): the replay's error was no check of values that eager makes too but a fault
  // of the replay, which ran every call eagerly without a word (a .grad guard on a value the
  // replay had not computed yet). Said, and not replayed again; running out of memory may not
  // happen again.
  if (run_eagerly && dispatch::op_errors() == op_errors_before &&
      replay_error.find("out of memory") == std::string::npos)
    im.run_eagerly_from_now_on(fmt::format(
        "a replay raised where eager did not (a kiln bug, please report it): {}", replay_error));
  return outs;
}

}  // namespace kiln::tracer

namespace kiln::tracer {
namespace {

// KILN_LOGS topics of the tracer: recompiles, guards, graph, breaks (read once; names are
// separated by commas, spaces around them ignored, as the codegen's parser does).
bool log_enabled(std::string_view topic) {
  static const std::vector<std::string> topics = [] {
    const char* v = std::getenv("KILN_LOGS");
    std::string all(v ? v : "");
    std::vector<std::string> names;
    for (size_t pos = 0; pos <= all.size();) {
      size_t end = std::min(all.find(',', pos), all.size());
      std::string_view name = std::string_view(all).substr(pos, end - pos);
      while (!name.empty() && std::isspace(static_cast<unsigned char>(name.front())))
        name.remove_prefix(1);
      while (!name.empty() && std::isspace(static_cast<unsigned char>(name.back())))
        name.remove_suffix(1);
      // Said once, as TORCH_LOGS rejects unknown names (the codegen reads ir and codegen).
      if (!name.empty() && name != "recompiles" && name != "guards" && name != "graph" &&
          name != "breaks" && name != "ir" && name != "codegen")
        fmt::print(stderr, "kiln: KILN_LOGS: unknown topic '{}' (known: recompiles, guards, "
                   "graph, breaks, ir, codegen)\n", name);
      if (!name.empty()) names.emplace_back(name);
      pos = end + 1;
    }
    return names;
  }();
  return std::find(topics.begin(), topics.end(), topic) != topics.end();
}

// An output the function made, with the handles on it that the call's outputs account for.
struct OutputHandles {
  std::weak_ptr<TensorImpl> impl;
  long handles = 0;  // the outputs holding it, and views among the outputs' bases holding it
  int output = 0;
};

// Outputs the function made from its ops (not arguments, captured tensors, .grad, views of
// their memory) that nothing but the outputs should hold once the recording is dropped: a
// handle beyond OutputHandles::handles is host state that kept the output (`losses.push_back(
// loss)`, `last = y`), which a replay would not update. Skipped when outputs carry eager
// autograd history (its graph may hold them), as escape_candidates does.
void output_handles(const Recorder& rec, const Program& p, const std::vector<OutValue>& outs,
                    std::vector<OutputHandles>& out) {
  for (const OutValue& o : outs)
    if (o.is_tensor && o.tensor.defined() && o.tensor.requires_grad()) return;
  std::unordered_map<const TensorImpl*, long> handles;
  std::unordered_set<const TensorImpl*> chains;  // the outputs and their bases
  for (const OutValue& o : outs) {
    if (!o.is_tensor || !o.tensor.defined()) continue;
    ++handles[o.tensor.impl()];
    for (const TensorImpl* t = o.tensor.impl(); t; t = t->base.get()) chains.insert(t);
  }
  for (const TensorImpl* t : chains)
    if (t->base) ++handles[t->base.get()];
  std::unordered_set<const StorageImpl*> not_made;  // arguments', captured tensors', .grad's
  auto not_made_by_ops = [&](int v) {
    if (Tensor t = rec.tensor(v); t.defined()) not_made.insert(t.storage().get());
  };
  for (size_t v = 0; v < p.values.size(); ++v)
    if (p.values[v].source >= 0) not_made_by_ops(int(v));
  for (auto [leaf, g] : p.grad_assignments)
    if (g >= 0) not_made_by_ops(g);
  std::unordered_set<const TensorImpl*> seen;
  for (size_t k = 0; k < outs.size(); ++k) {
    const Tensor& t = outs[k].tensor;
    if (!outs[k].is_tensor || !t.defined() || k >= p.outputs.size() || p.outputs[k] < 0 ||
        !t.is_same(rec.tensor(p.outputs[k])) || not_made.count(t.storage().get()) ||
        !seen.insert(t.impl()).second)
      continue;
    out.push_back({t.impl_ptr(), handles[t.impl()], int(k)});
  }
}

// Tensors the function created (op results, tensors made from host data) that nothing the
// tracer knows of should hold once the recording is dropped: not outputs, not arguments or
// captured tensors written in place, not .grad of leaves, not other handles on an argument's
// or captured tensor's memory (a parameter written through its state_dict() entry or
// detach(): the write-back reaches them). Skipped when outputs carry eager autograd history
// (the eager graph then holds intermediates).
void escape_candidates(const Recorder& rec, const Program& p, const std::vector<OutValue>& outs,
                       std::vector<std::pair<std::weak_ptr<TensorImpl>, int>>& out) {
  for (const OutValue& o : outs)
    if (o.is_tensor && o.tensor.defined() && o.tensor.requires_grad()) return;
  std::unordered_set<const TensorImpl*> known;
  for (const OutValue& o : outs)
    if (o.is_tensor && o.tensor.defined())  // an output view holds its base alive: known too
      for (const TensorImpl* t = o.tensor.impl(); t; t = t->base.get()) known.insert(t);
  std::unordered_set<const StorageImpl*> host_memory;
  for (size_t v = 0; v < p.values.size(); ++v) {
    int s = p.values[v].source;
    if (s >= 0 && p.sources[s].kind != SourceKind::Snapshot) known.insert(rec.tensor(v).impl());
    if (s >= 0 &&
        (p.sources[s].kind == SourceKind::Arg || p.sources[s].kind == SourceKind::Captured))
      host_memory.insert(rec.tensor(v).storage().get());
  }
  for (auto& [leaf, g] : p.grad_assignments) {
    if (g >= 0) known.insert(rec.tensor(g).impl());
    // The .grad itself, which a second backward accumulated into in place (its recorded value
    // is the sum, another handle on the same memory): a replay assigns the leaf's .grad anew.
    if (Tensor held = rec.tensor(leaf).grad(); held.defined()) known.insert(held.impl());
  }
  std::unordered_set<const TensorImpl*> seen;
  for (size_t v = 0; v < p.values.size(); ++v) {
    int s = p.values[v].source;
    if (s >= 0 && p.sources[s].kind != SourceKind::Snapshot) continue;
    const Tensor t = rec.tensor(v);
    if (!t.defined()) continue;  // dropped by the function: it cannot outlive the call
    if (t.impl()->wrapped_number || known.count(t.impl()) || !seen.insert(t.impl()).second ||
        host_memory.count(t.storage().get()))
      continue;
    out.push_back({t.impl_ptr(), static_cast<int>(v)});
  }
}

// The segments a trace `t` took through the tree at `root` (root first); stops where `t`
// takes a branch the tree lacks.
std::vector<Segment*> path_of(Segment& root, const Program& t) {
  std::vector<Segment*> path{&root};
  while (!path.back()->leaf) {
    size_t r = path.back()->end - 1;
    if (r >= t.nodes.size() || t.nodes[r].kind != Node::Kind::Read) break;
    Segment* c = path.back()->child(t.nodes[r].read_value);
    if (!c) break;
    path.push_back(c);
  }
  return path;
}

// The program of the leaf that trace `t` reaches in `root`'s tree (the trace of that path, at
// the entry's sizes), or null when the tree lacks t's branch.
std::shared_ptr<const Program> path_program(Segment& root, const Program& t) {
  Segment* last = path_of(root, t).back();
  return last->leaf ? last->program : nullptr;
}

// Records that a trace at size set `key` took `t`'s path through `e` (symbolic entries).
void confirm_path(Entry& e, const Program& t, const std::vector<int64_t>& key) {
  if (!e.dynamic) return;
  remember(e.checked_sizes, key);
  for (Segment* s : path_of(*e.root, t)) remember(s->checked_sizes, key);
}

// One line per guard of entry `e`, each after `indent` (explain(), KILN_LOGS=guards).
std::string describe_guards(const Entry& e, std::string_view indent) {
  std::string out;
  for (size_t i = 0; i < e.guards.size(); ++i)
    out += fmt::format("{}{}\n", indent, describe_guard(e.guards[i], i));
  for (auto [x, y] : e.equal_dims)
    out += fmt::format("{}arg {} dim {} == arg {} dim {} (equal in the traces)\n", indent,
                       x.first, x.second, y.first, y.second);
  for (const HostValue& h : e.host_values)
    out += fmt::format("{}guarded host value {} == {} (at {}:{})\n", indent, h.what,
                       h.value.str(), h.loc.file_name(), h.loc.line());
  out += fmt::format("{}grad mode == {}; default dtype == {}\n", indent, e.grad_enabled,
                     kiln::name(e.default_dtype));
  return out;
}

bool draws_random(const Program& p) {
  return std::any_of(p.nodes.begin(), p.nodes.end(), [](const Node& n) {
    return n.kind == Node::Kind::Op && op_info(n.op).category == OpCategory::Random;
  });
}

bool touches_grads(const Program& p) {
  return !p.grad_assignments.empty() ||
         std::any_of(p.sources.begin(), p.sources.end(),
                     [](const Source& s) { return s.kind == SourceKind::GradOf; });
}

// Write-backs happen after every segment ran (a replay that raises has made none), unless
// donated buffers are computed in place while it runs (break-it pass: a function that writes
// an argument and catches an op's error itself got the error on replay). Not for the scatters
// donated by default (donations): the last region writes them only when every value check
// passed (run_region scans first, else it runs on copies), so a replay that raises has changed
// nothing and runs eagerly, catch blocks and writes before the error included (break-it pass:
// counted, the error reached the caller past the function's own catch, and a write eager made
// before a failing index_select was lost). Memory running out inside that region's code may
// leave some slices written, which the eager run then writes again.
bool effects_while_run(const Program& p, bool donate_buffers) {
  return (donate_buffers && !p.write_backs.empty()) || p.aliased_mutation ||
         std::any_of(p.nodes.begin(), p.nodes.end(),
                     [](const Node& n) { return n.kind == Node::Kind::Callback; });
}

bool insert_branch(Segment& root, const std::shared_ptr<const Program>& p,
                   const CompileOptions& o, const MissingBranch* missed) {
  Segment* seg = &root;
  for (size_t depth = 0; !seg->leaf; ++depth) {
    size_t r = seg->end - 1;
    if (r >= p->nodes.size() || p->nodes[r].kind != Node::Kind::Read) return false;
    const Scalar& read = p->nodes[r].read_value;
    Segment* c = seg->child(read);
    const bool added = !c;
    if (added) {
      seg->children.push_back({read, make_chain(p, r + 1, o)});
      c = seg->children.back().second.get();
    }
    // Where the replay missed, this trace (eager, the same inputs) read another float: the
    // compiled code rounded it otherwise. Replays reading that value take eager's branch, else
    // each call traced again until the cache limit (a break-it pass: x.sum().item<float>()).
    if (missed && depth == missed->depth && read.is_floating() && missed->value.is_floating() &&
        !seg->child(missed->value)) {
      seg->rounded.push_back({missed->value, c});
      return true;
    }
    if (added) return true;
    seg = c;
  }
  return false;
}

// The pointer-aligned byte offsets at which passed-through argument `a` holds the TensorImpl
// address of a tensor `p` captured (a Tensor member of a struct), with that address.
std::vector<std::pair<size_t, const void*>> embedded_tensors(const Program& p,
                                                             const ArgValue& a) {
  std::vector<const void*> captured;
  for (const Source& s : p.sources)
    if (s.kind == SourceKind::Captured)
      if (auto impl = s.captured.lock()) captured.push_back(impl.get());
  std::vector<std::pair<size_t, const void*>> out;
  for (size_t offset = 0; offset + sizeof(void*) <= a.other_size; offset += alignof(void*)) {
    const void* word = nullptr;
    std::memcpy(&word, static_cast<const char*>(a.other) + offset, sizeof word);
    if (std::find(captured.begin(), captured.end(), word) != captured.end())
      out.push_back({offset, word});
  }
  return out;
}

std::vector<Shape> arg_shapes(const Program& p, size_t n) {
  std::vector<Shape> out(n);
  for (size_t v = 0; v < p.values.size(); ++v) {
    int s = p.values[v].source;
    if (s >= 0 && p.sources[s].kind == SourceKind::Arg) out[p.sources[s].index] = p.values[v].shape;
  }
  return out;
}

// check_symbolic's answer when the trace took a branch the entry has not traced.
constexpr std::string_view kMissingBranch = "no branch traced for a host value";

// Empty when trace `t` of the call is what symbolic entry `e` computes for its sizes.
std::string check_symbolic(const Entry& e, const Program& t, const std::vector<ArgValue>& args) {
  const Segment* seg = e.root.get();
  std::vector<const Program*> programs{seg->program.get()};
  while (!seg->leaf) {
    size_t r = seg->end - 1;
    if (r >= t.nodes.size() || t.nodes[r].kind != Node::Kind::Read)
      return "the trace has no host read where the specialisation has one";
    seg = seg->child(t.nodes[r].read_value);
    if (!seg) return std::string(kMissingBranch);
    programs.push_back(seg->program.get());
  }
  // conforms() compares the trace with the leaf's program; segments before it replay their
  // own program's ops, which a branch inserted from another trace does not share.
  for (const Program* p : programs)
    if (p != seg->program.get())
      return "its branches were traced at other sizes, which this trace cannot vouch for";
  std::vector<Scalar> scalars(args.size());
  for (size_t i = 0; i < args.size(); ++i)
    if (args[i].kind == ArgValue::Kind::Scalar) scalars[i] = args[i].scalar;
  return conforms(t, *seg->program, arg_shapes(t, args.size()), scalars);
}

// Duck sizing (as TorchDynamo does): symbolic dims of equal size in the traces the entry was
// made from (`now`, and `before` when it was generalised from two) cannot be told apart by
// the sizes the traces recorded, so the entry requires them equal.
void duck_size(Entry& e, const std::vector<std::pair<int, int>>& dims,
               const std::vector<Shape>& now, const std::vector<Shape>& before) {
  auto size = [](const std::vector<Shape>& s, std::pair<int, int> ad) -> int64_t {
    auto [a, d] = ad;
    return a < int(s.size()) && d < s[a].size() ? s[a][d] : -1;
  };
  for (size_t i = 0; i < dims.size(); ++i)
    for (size_t j = i + 1; j < dims.size(); ++j) {
      if (dims[i] == dims[j] || size(now, dims[i]) != size(now, dims[j]) || size(now, dims[i]) < 2)
        continue;
      if (!before.empty() && (size(before, dims[i]) != size(before, dims[j]) ||
                              size(before, dims[i]) == size(now, dims[i])))
        continue;
      // Once per pair: `dims` may name a dim twice (changed now and symbolic in the base).
      const std::pair<int, int> x = std::min(dims[i], dims[j]), y = std::max(dims[i], dims[j]);
      if (std::ranges::find(e.equal_dims, std::pair{x, y}) == e.equal_dims.end())
        e.equal_dims.push_back({x, y});
    }
}

// CompileOptions::donate_buffers: whether the new value `v` of a tensor the function changes in
// place can become that tensor's storage instead of being copied into it (an optimizer's
// parameters and moments: the copies were a third of a compiled AdamW step). Only when nothing
// else can see either buffer: the
// target's storage has no other tensor (no views, no second handle), the value's buffer is
// this call's own (not returned, not saved for backward, not a .grad, not written back twice),
// and both are dense with the same shape and dtype.
bool can_adopt(const Program& p, const Segment& seg, int v, const Tensor& target,
               const RunState& st) {
  if (v < 0 || v >= static_cast<int>(st.slots.size())) return false;
  const Tensor& value = st.slots[v];
  if (!value.defined() || value.impl_ptr().use_count() != 1 ||
      value.storage().use_count() != 1 || target.storage().use_count() != 1)
    return false;
  if (value.dtype() != target.dtype() || value.shape() != target.shape() ||
      value.device() != target.device() || !value.is_contiguous() || !target.is_contiguous() ||
      value.offset() != 0 || target.offset() != 0 ||
      value.storage()->nbytes() != target.storage()->nbytes())
    return false;
  int writes = 0;
  for (auto& wb : p.write_backs) writes += wb.second == v;
  if (writes != 1 || std::find(p.outputs.begin(), p.outputs.end(), v) != p.outputs.end() ||
      std::find(seg.saved.begin(), seg.saved.end(), v) != seg.saved.end())
    return false;
  for (auto& [leaf, g] : p.grad_assignments)
    if (g == v) return false;
  return true;
}

// `target` takes over `value`'s buffer, as if copied into (its version counter moves on).
void adopt(Tensor& target, Tensor& value) {
  uint64_t version = target.version() + 1;
  target.impl()->storage = value.storage();
  target.storage()->set_version(version);
  value = Tensor();
}

}  // namespace

namespace {

// The guards that replay checks on the tensors themselves (a captured tensor alive and
// unchanged, a .grad undefined as when traced), all before the segment runs: a GuardFailure
// after an in-place write or a write-back would apply the function's mutations twice (the
// call is traced again from the mutated arguments).
void check_sources(const Segment& seg, RunState& st,
                   const std::vector<std::weak_ptr<TensorImpl>>& captured) {
  const Program& p = *seg.program;
  // RunState::value checks a captured tensor, a .grad or a host value when it first fetches
  // it: fetched here, a failing guard raises before the segment changes anything (it raised
  // after an in-place write, and the retrace ran the function again on the written tensors).
  for (int v : seg.guarded_reads) {
    if (p.sources[p.values[v].source].kind == SourceKind::HostInput)
      st.host_scalar(p, v);
    else
      st.value(p, v);
  }
  // Eager raises where such a tensor is used in a recorded op (lost_in_place_history); a
  // replay records nothing, so the call traces again, which runs the function eagerly.
  if (is_grad_enabled())
    for (int v : seg.captured_values)
      if (lost_in_place_history(st.value(p, v)))
        throw GuardFailure{"a captured tensor shares memory with a tensor that gained a gradient "
                           "history in place, which it does not carry"};
  for (int v : p.grad_undefined_at_call)
    if (st.value(p, v).grad().defined())
      throw GuardFailure{"the .grad that backward set was undefined when traced and is now defined"};
  if (!p.grad_sharing.empty() &&
      grad_sharing(p, [&](int v) -> const Tensor& { return st.value(p, v); }) != p.grad_sharing)
    throw GuardFailure{"the .grads the function reads share memory with each other or with "
                       "its tensors otherwise than when traced"};
  for (auto [leaf, v] : p.grad_same_as) {
    const Tensor g = st.value(p, leaf).grad();
    const Tensor& o = st.value(p, v);
    if (!g.defined() || g.storage() != o.storage() || g.offset() != o.offset() ||
        g.strides() != o.strides())
      throw GuardFailure{"a .grad that was another parameter's .grad (or an argument) when "
                         "traced is now a tensor of its own"};
  }
  if (!p.write_backs.empty() || p.aliased_mutation) {
    auto now = args_sharing(seg.arg_values, captured,
                            [&](int v) -> const Tensor& { return st.value(p, v); });
    if (now != p.args_sharing_captured)
      throw GuardFailure{now.size() < p.args_sharing_captured.size()
                             ? "an argument no longer shares memory with a captured tensor"
                             : "an argument shares memory with a captured tensor"};
  }
}

}  // namespace

void CompiledFunction::Impl::remember_captured(Program& p, Recorder& rec) {
  std::erase_if(captured_tensors, [](const auto& w) { return w.expired(); });
  for (size_t v = 0; v < p.values.size(); ++v) {
    int s = p.values[v].source;
    if (s < 0 || p.sources[s].kind != SourceKind::Captured) continue;
    const std::shared_ptr<TensorImpl> impl = rec.tensor(static_cast<int>(v)).impl_ptr();
    bool known = std::any_of(captured_tensors.begin(), captured_tensors.end(),
                             [&](const auto& w) { return w.lock() == impl; });
    if (!known) captured_tensors.push_back(impl);
  }
  if (!p.write_backs.empty() || p.aliased_mutation)
    p.args_sharing_captured = args_sharing(values_from(p, SourceKind::Arg), captured_tensors,
                                           [&](int v) { return rec.tensor(v); });
}

namespace {

// Copies of the arguments and captured tensors the call is about to write back (by their
// source value ids): a create_graph backward re-runs the forward from them.
std::vector<std::pair<int, Tensor>> values_before_write_backs(const Program& p, RunState& st) {
  std::vector<std::pair<int, Tensor>> out;
  for (auto& [src, v] : p.write_backs)
    for (size_t u = 0; u < p.values.size(); ++u)
      if (p.values[u].source == src) {
        const Tensor& t = st.value(p, static_cast<int>(u));
        out.push_back({static_cast<int>(u), untraced([&] { return t.detach().clone(); })});
        break;
      }
  return out;
}

// Outputs that are an argument or captured tensor the function changed in place, or views of
// one, are that tensor or the same views of it, as in eager (`x *= 3; return x;` returns x
// itself): their slots become the written-to tensor and the view ops run again on it.
void alias_written_outputs(const Segment& seg, const std::vector<std::pair<int, Tensor>>& written,
                           RunState& st) {
  for (const Segment::ViewChain& c : seg.output_chains)
    for (size_t i = 0; i < c.values.size(); ++i) {
      auto w = std::find_if(written.begin(), written.end(),
                            [&](auto& e) { return e.first == c.values[i]; });
      if (w == written.end()) continue;
      st.slots[c.values[i]] = w->second;
      bool was_in_place = st.in_place;
      st.in_place = true;  // real views, not copies
      for (size_t k = i; k-- > 0;) run_node_eagerly(*seg.program, *c.nodes[k], st);
      st.in_place = was_in_place;
      break;
    }
}

}  // namespace

std::vector<OutValue> CompiledFunction::Impl::replay(Entry& e, const std::vector<ArgValue>& args,
                                                     std::shared_ptr<const Program>* ran) {
  PrintScope::restart();
  RunState st;
  st.args.resize(args.size());
  st.scalars.resize(args.size());
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i].kind == ArgValue::Kind::Tensor) st.args[i] = args[i].tensor;
    if (args[i].kind == ArgValue::Kind::Scalar) st.scalars[i] = args[i].scalar;
  }
  // The counters a replay draws are known after it ran: holding the generator meanwhile keeps
  // other threads from drawing them too (concurrent replays repeated each other's dropout).
  std::unique_lock<std::recursive_mutex> generator;
  if (e.draws_random) generator = hold_generator();
  st.rng = generator_state();
  // A .grad read and its sum written back by one replay (a backward inside the function) must
  // not interleave with another thread's accumulation into it, eager or compiled: held to the
  // end of the replay. Always after the generator's lock (generator_state() above takes it
  // too), never the other way round: a replay holding this lock and waiting for the generator
  // deadlocked with one holding the generator (with dropout) and waiting for this.
  std::unique_lock<std::recursive_mutex> grads;
  if (e.touches_grads) grads = hold_leaf_grads();
  Segment* seg = e.root.get();
  st.in_place = seg->program->aliased_mutation;
  size_t depth = 0;
  try {
    for (;; ++depth) {
      if (st.slots.size() < seg->program->values.size())
        st.slots.resize(seg->program->values.size());
      check_sources(*seg, st, captured_tensors);
      std::optional<Scalar> read = seg->plan->run(st);
      if (seg->leaf) break;
      Segment* c = seg->child(*read);
      if (!c)
        throw MissingBranch{*read, seg->program->nodes[seg->end - 1].loc, depth,
                            returns_value_read(*seg)};
      if (e.dynamic && !contains(c->checked_sizes, sizes_key(e, args))) throw UncheckedBranch{};
      seg = c;
    }
  } catch (const Error& err) {
    // At sizes a trace confirmed, the error is a check of values (an index out of range). A
    // function that writes no argument or captured tensor and runs no host callback has then
    // changed nothing the caller sees: it runs eagerly (its draws then come from the generator
    // as it was). Other replays may have written some already (in place, or into a donated
    // buffer): the error reaches the caller, and eager's ops before the failing one drew their
    // numbers (review: the generator was left unmoved, and the next call redrew this one's
    // dropout masks). At unconfirmed sizes a symbolic entry's call is traced instead.
    const bool confirmed = !e.dynamic || contains(e.checked_sizes, sizes_key(e, args));
    if (confirmed && !e.effects_while_run) throw ReplayRaised{err.what()};
    if (generator && confirmed) advance_generator(st.rng_offset(*seg->program, st.node));
    throw;
  }
  const Program& p = *seg->program;
  // Before anything the caller sees changes: the autograd history this call's arguments bring
  // (a graph break at a backward() into it) must be one the end of the replay can run.
  const std::vector<autograd::Edge> history_edges = check_history_reach(p, st);
  if (ran) *ran = seg->program;
  if (uint64_t used = st.rng_offset(p, p.nodes.size())) advance_generator(used);
  if (generator) generator.unlock();
  std::vector<std::pair<int, Tensor>> originals;
  // The entry's grad mode is guarded, so a traced backward means the outputs required grad
  // (also under no_grad, when the function enabled grad inside).
  const bool attach = seg->backward != nullptr;
  {
    NoGradGuard no_grad;
    // A leaf the function changed in place (an optimizer's parameter) is recorded by its final
    // value; its .grad belongs to the real tensor that value is written back to, not to the
    // value (replays left parameters' .grad as the trace set it).
    std::vector<std::pair<int, Tensor>> written;
    if (!st.in_place && attach) originals = values_before_write_backs(p, st);
    if (!st.in_place) {
      written.reserve(p.write_backs.size());
      std::vector<Tensor> targets;
      targets.reserve(p.write_backs.size());
      for (auto& [src, v] : p.write_backs) {
        const Source& s = p.sources[src];
        targets.push_back(s.kind == SourceKind::Arg      ? st.args[s.index]
                          : s.kind == SourceKind::GradOf ? st.value(p, s.index).grad()
                                                         : Tensor(s.captured.lock()));
      }
      // A new value in the memory of another written tensor (`b.copy_(a)`, then `a += 5`: b's
      // new value is a's old one, which compiled code may hand back as `a` itself) is read
      // before any write-back can change it.
      std::vector<const StorageImpl*> target_storage(targets.size(), nullptr);
      for (size_t j = 0; j < targets.size(); ++j)
        if (targets[j].defined()) target_storage[j] = targets[j].storage().get();
      std::vector<Tensor> read_first(p.write_backs.size());
      for (size_t k = 0; k < p.write_backs.size(); ++k) {
        const Tensor& value = st.value(p, p.write_backs[k].second);
        if (!value.defined()) continue;
        const StorageImpl* storage = value.storage().get();
        if (!storage) continue;
        for (size_t j = 0; j < targets.size(); ++j)
          if (j != k && target_storage[j] == storage) {
            read_first[k] = untraced([&] { return value.detach().clone(); });
            break;
          }
      }
      for (size_t k = 0; k < p.write_backs.size(); ++k) {
        auto [src, v] = p.write_backs[k];
        Tensor target = targets[k];
        if (!target.defined()) continue;
        written.push_back({v, target});
        const bool in_own_buffer = st.value(p, v).is_same(target);  // PlanOptions::donate
        if (in_own_buffer) {
          // Computed in the target's buffer by the compiled code: already written there.
        } else if (read_first[k].defined()) {
          target.copy_(read_first[k]);
        } else if (options.donate_buffers && p.args_sharing_captured.empty() &&
                   can_adopt(p, *seg, v, target, st)) {
          // Not when an argument is a captured tensor too: other values may still read its
          // buffer.
          adopt(target, st.slots[v]);
        } else {
          target.copy_(st.value(p, v));
        }
        // The trace recorded this write with gradient history (eager bumps the count in the
        // autograd hook; this copy runs under no_grad): views of the target taken before the
        // call are stale. A leaf's write (an optimizer step) leaves its views usable.
        if (target.requires_grad() && !target.is_leaf()) target.storage()->bump_history_version();
      }
    }
    for (auto& [leaf, g] : p.grad_assignments) {
      // A .grad accumulated in place keeps its tensor, as in eager.
      auto in_place = std::find_if(written.begin(), written.end(),
                                   [&](auto& e) { return g >= 0 && e.first == g; });
      Tensor grad = in_place != written.end() ? in_place->second
                    : g >= 0                  ? st.value(p, g)
                                              : Tensor();
      auto w = std::find_if(written.begin(), written.end(), [&](auto& e) { return e.first == leaf; });
      (w != written.end() ? w->second : st.value(p, leaf)).set_grad(grad);
    }
    if (!written.empty()) alias_written_outputs(*seg, written, st);
  }
  std::vector<OutValue> outs(p.outputs.size());
  for (size_t k = 0; k < outs.size(); ++k) {
    if (p.outputs[k] >= 0) {
      outs[k].tensor = st.value(p, p.outputs[k]);
    } else if (!p.output_undefined[k]) {
      outs[k].is_tensor = false;
      outs[k].scalar = p.output_constants[k];
    }
  }
  if (attach) {
    attach_backward(seg->program, seg->backward, seg->saved, st, outs, std::move(originals));
    for (int k : p.retained_outputs)
      if (outs[k].tensor.requires_grad() && !outs[k].tensor.is_leaf()) outs[k].tensor.retain_grad();
  }
  for (int i : p.retained_args)
    if (const Tensor& t = args[i].tensor; t.requires_grad() && !t.is_leaf()) t.retain_grad();
  // The graph break: the caller's history behind the arguments, on eager autograd.
  size_t next_edge = 0;
  for (const Program::HistoryBackward& h : p.history_backwards) {
    std::vector<autograd::Edge> edges;
    std::vector<Tensor> grads;
    for (size_t i = 0; i < h.owners.size(); ++i, ++next_edge)
      if (history_edges[next_edge].valid()) {
        edges.push_back(history_edges[next_edge]);
        grads.push_back(st.value(p, h.grads[i]));
      }
    if (!edges.empty()) autograd::backward_from_edges(edges, grads, h.retain_graph, h.loc);
  }
  for (auto [k, leaf_requires_grad] : p.detached_outputs) {
    outs[k].tensor = outs[k].tensor.detach();
    if (leaf_requires_grad) outs[k].tensor.requires_grad_(true);
  }
  return outs;
}

bool CompiledFunction::Impl::checks_shape_only(const Entry& e) const {
  // Once a trace confirmed it at sizes besides those it was made at (its checked_sizes then
  // hold both): a wrong formula is refuted by then as a rule, and a run that does not confirm
  // makes the function's host code run twice. Not under check = true (which compares
  // every call with eager) nor for trace trees (their host reads need values).
  return options.shape_only_checks && !options.check && e.dynamic && e.root->leaf &&
         e.checked_sizes.size() >= 2;
}

std::vector<OutValue> CompiledFunction::Impl::trace(
    std::unique_lock<std::shared_mutex>& lock, const std::vector<ArgValue>& args,
    const Invoke& invoke, Loc loc, const std::vector<std::pair<int, int>>& marked_dims,
    Entry* failed, bool missing_branch, const std::string& miss_reason, Entry* unchecked,
    const MissingBranch* missed, bool* shape_only_confirmed) {
  const bool shape_only = shape_only_confirmed != nullptr;
  PrintScope::restart();
  // A failed entry whose guards no longer hold (a captured tensor freed, a symbolic replay that
  // failed) is dropped; one that only lacks a branch gets the new branch below.
  if (failed && !missing_branch)
    dropped_entries += static_cast<int>(
        std::erase_if(entries, [&](const std::shared_ptr<Entry>& e) { return e.get() == failed; }));
  int leaves = dropped_entries;
  for (auto& e : entries) leaves += e->root->leaves();
  std::string reason = miss_reason;
  if (reason.empty()) reason = closest_entry_failure(entries, args);
  // Past the limit no call traces: one that matches no entry runs eagerly, and those that
  // match one still replay it (they all ran eagerly, as torch.compile's do not: a function
  // alternating between 9 shapes lost its 8 compiled ones).
  if (leaves >= options.cache_size_limit && !unchecked) {
    if (!limit_reached.exchange(true)) {
      limit_reason = fmt::format("the guard that kept failing: {}", reason);
      fmt::print(stderr,
                 "kiln.compile: '{}' reached cache_size_limit ({}); calls that match none of "
                 "its entries run eagerly from now on (those that match one still replay it). "
                 "The guard that keeps failing: {}\n",
                 name, options.cache_size_limit, reason);
    }
    ++eager_calls;
    lock.unlock();
    return invoke();
  }

  // Automatic dynamic: a recompile caused only by sizes / scalar values makes them symbolic.
  // Entries that differ from this call only in sizes / scalar values; the one compared with is
  // chosen after the trace (below), among those whose trace tree has the trace's path.
  struct BaseCandidate {
    Entry* entry;
    std::vector<std::pair<int, int>> dims;
    std::vector<int> scalars;
  };
  std::vector<BaseCandidate> base_candidates;
  int strided_arg = -1;  // a strided argument that kept an entry from being a base
  // Always marks every dim at the first trace; what it cannot mark (host scalars, a dim
  // first seen at size 1) still becomes symbolic as under Auto.
  if (options.dynamic != Dynamic::Never && (!missing_branch || failed->dynamic))
    for (auto it = entries.rbegin(); it != entries.rend(); ++it) {
      BaseCandidate c{it->get(), {}, {}};
      if (only_sizes_differ(**it, args, c.dims, c.scalars, &strided_arg))
        base_candidates.push_back(std::move(c));
    }

  auto prog = std::make_shared<Program>();
  std::vector<OutValue> outs;
  std::vector<std::pair<std::weak_ptr<TensorImpl>, int>> candidates;
  std::vector<OutputHandles> held_outputs;
  std::string caught_op_error;  // an op's error the function caught while traced
  const uint64_t view_writes = in_place_view_writes();
  const uint64_t double_backwards = create_graph_backwards();
  uint64_t reseeds = generator_reseeds().count;
  const uint64_t precision_changes = matmul_precision_changes().count;
  const uint64_t rebinds_before = parameter_rebinds();
  const DType dtype_before = default_dtype();
  const uint64_t dtype_changes = default_dtype_changes();
  const uint64_t generation_before = generation;
  // fullgraph = true: a call that raises at a graph break leaves the caller's tensors, their
  // .grad and the random generator as they were (as check = true's calls that diverge), since
  // the trace runs the function before it knows (torch.compile raises before running it).
  std::optional<StateJournal> journal;
  GeneratorState rng_at_call{};
  uint64_t own_draws = 0;  // counters this thread drew while traced (Recorder::own_draws)
  // Gives the call's effects back; else says why not (appended to the error).
  auto undo_call = [&]() -> std::string {
    if (!journal) return "";
    if (std::optional<Loc> at = journal->history_changed())
      return fmt::format(" (not undone: the in-place write at {}:{} gave a tensor that existed "
                         "before the call a new gradient history, which cannot be given back; "
                         "tensors are as the function left them)",
                         at->file_name(), at->line());
    journal->restore(/*versions=*/true);
    // Only when the function reseeded it, or no other thread drew or reseeded meanwhile:
    // another thread's counters are not drawn again.
    const GeneratorState now = generator_state();
    const bool moved = now.seed != rng_at_call.seed || now.offset != rng_at_call.offset;
    if (moved && (generator_reseeds().count != reseeds ||
                  (now.seed == rng_at_call.seed && now.offset == rng_at_call.offset + own_draws)))
      set_generator_state(rng_at_call);
    return "";
  };
  // fullgraph = true: a graph break raises, naming its line, and the call has no effect.
  auto raise_fullgraph = [&](const Loc& at, std::string what) {
    if (shape_only) throw ShapeOnlyUnfit{what};
    const std::string not_undone = undo_call();
    throw Error("compile", fmt::format("fullgraph=true, but '{}' {}{}", name, what, not_undone),
                at);
  };
  auto raise_at_fullgraph_break = [&] {
    if (!options.fullgraph) return;
    for (const Node& node : prog->nodes)
      if (node.kind == Node::Kind::Read)
        raise_fullgraph(node.loc, "reads a tensor value to the host here (item() / to_vector() "
                                  "/ item<bool>() of a comparison), which splits the graph");
    if (prog->raw_access)
      raise_fullgraph(*prog->raw_access, "takes a pointer to tensor memory here (data<T>() / "
                                         "raw_data()), which a compiled replay cannot run");
    if (!caught_op_error.empty())
      raise_fullgraph(loc, fmt::format("caught an error an op raised while it was traced ({}); "
                                       "the values that op checks decide the function's path, "
                                       "which a replay cannot follow", caught_op_error));
    const std::string& history =
        prog->outside_backward.empty() ? prog->history_backward : prog->outside_backward;
    if (!history.empty())
      raise_fullgraph(loc, fmt::format("runs, at its backward(), autograd history made "
                                       "before the call ({}), which runs outside the compiled "
                                       "code", history));
  };
  {
    Recorder rec(*prog);
    for (size_t i = 0; i < args.size(); ++i)
      if (args[i].kind == ArgValue::Kind::Tensor) rec.add_arg(args[i].tensor, static_cast<int>(i));
    lock.unlock();
    if (options.fullgraph || shape_only) {
      journal.emplace(/*keep_values=*/!shape_only);  // (a shape-only run writes no values)
      rng_at_call = generator_state();
    }
    if (options.fullgraph && !shape_only) rec.raise_at_graph_break(name);
    // A shape-only run gives the caller's state back however it ends (after the kernels are
    // back on: the scope below is left first).
    struct GiveBack {
      std::function<void()> undo;
      ~GiveBack() {
        if (undo) undo();
      }
    } give_back;
    std::optional<dispatch::ShapeOnlyScope> no_kernels;
    if (shape_only) {
      journal->refuse_history_writes();
      rec.shape_only();
      give_back.undo = [&] {
        own_draws = rec.own_draws();
        const bool reseeded = generator_reseeds().count != reseeds;
        undo_call();
        if (!reseeded) reseeds = generator_reseeds().count;  // (undo_call's rewind is none)
      };
      no_kernels.emplace();
    }
    rec.install();
    const uint64_t op_errors_before = dispatch::op_errors();
    std::vector<int> retaining;  // non-leaf arguments that retain grad already
    for (size_t i = 0; i < args.size(); ++i)
      if (args[i].kind == ArgValue::Kind::Tensor && retains_grad(args[i].tensor))
        retaining.push_back(int(i));
    try {
      outs = invoke();
    } catch (const Error& e) {
      own_draws = rec.own_draws();
      if (!rec.raised_at_graph_break()) throw;
      const std::string not_undone = undo_call();
      if (not_undone.empty()) throw;
      throw Error(e.op(), e.message() + not_undone, e.where());
    } catch (...) {  // the function may have turned that error into another one
      own_draws = rec.own_draws();
      if (rec.raised_at_graph_break()) undo_call();
      throw;
    }
    own_draws = rec.own_draws();
    // The function caught that error and went on: its trace lacks the history's backward.
    if (rec.raised_at_graph_break())
      raise_fullgraph(loc, "caught the error its backward() or grad() raised at a graph break "
                           "(autograd history made before the call)");
    if (rec.aborted()) throw ShapeOnlyUnfit{"it caught the run's end (a value read)"};
    if (!shape_only) ++traces_run;
    for (size_t i = 0; i < args.size(); ++i)
      if (args[i].kind == ArgValue::Kind::Tensor && retains_grad(args[i].tensor) &&
          std::ranges::find(retaining, int(i)) == retaining.end())
        prog->retained_args.push_back(int(i));
    if (dispatch::op_errors() != op_errors_before) caught_op_error = dispatch::last_op_error();
    record_backward(rec, *prog, outs);
    if (rec.aborted()) throw ShapeOnlyUnfit{"its outputs' backward reaches history"};
    no_kernels.reset();
    rec.finish();
    for (const OutValue& o : outs) {
      bool undefined = o.is_tensor && !o.tensor.defined();
      prog->outputs.push_back(o.is_tensor && !undefined ? rec.lookup(o.tensor) : -1);
      const int k = int(prog->outputs.size()) - 1, v = prog->outputs.back();
      // Another tensor than its value's (x.detach()), or a leaf the function made require grad
      // (p = x.clone(); p.requires_grad_()): replays return the value as such a leaf.
      auto made_inside = [&] {  // not an argument or captured tensor (updated in place)
        for (size_t u = 0; u < prog->values.size(); ++u)
          if (is_arg_or_captured(*prog, int(u)) && rec.tensor(int(u)).is_same(o.tensor))
            return false;
        return true;
      };
      if (v >= 0 && o.tensor.is_leaf() &&
          (!o.tensor.is_same(rec.tensor(v)) || (o.tensor.requires_grad() && made_inside())))
        prog->detached_outputs.push_back({k, o.tensor.requires_grad()});
      // Gradient history through a tensor the function made require grad: the replay's
      // backward reaches the arguments and captured tensors only.
      if (v >= 0 && o.tensor.requires_grad() && !o.tensor.is_leaf() &&
          prog->output_dependency.empty() && reaches_made_inside_leaf(rec, *prog, o.tensor))
        prog->output_dependency = fmt::format(
            "its output {} has gradient history through a tensor it made require grad itself "
            "(requires_grad_), which a replay would not give it", k);
      prog->output_constants.push_back(o.is_tensor ? Scalar() : o.scalar);
      prog->output_undefined.push_back(undefined);
    }
    mark_snapshots_reaching_caller(*prog);
    rec.uninstall();
    escape_candidates(rec, *prog, outs, candidates);
    output_handles(rec, *prog, outs, held_outputs);
    lock.lock();
    // Another thread's trace or a reset() changed the cache meanwhile: this result is not
    // cached, but a fullgraph function's break still raises.
    if (generation++ != generation_before) {
      if (shape_only) throw ShapeOnlyUnfit{"another thread traced meanwhile"};
      raise_at_fullgraph_break();
      return outs;
    }
    remember_captured(*prog, rec);
  }
  // Whatever makes the trace unfit for replays: the function runs eagerly from now on, or
  // raises under fullgraph = true (it would not be one compiled graph).
  auto cannot_compile = [&](std::string why) {
    if (shape_only) throw ShapeOnlyUnfit{why};
    if (options.fullgraph) raise_fullgraph(loc, "cannot be compiled: " + why);
    run_eagerly_from_now_on(std::move(why));
  };
  raise_at_fullgraph_break();
  // A guard read by kiln's own code (a module's is_training() or setting() called through
  // forward(), outside a module call on a user's line) is named by the compile() call.
  for (HostValue& h : prog->host_values)
    if (inside_kiln(h.loc)) h.loc = loc;
  // Its gradients flow through a base rebased onto an in-place write into a view, which the
  // replay does not record (another thread's such write only costs this function its speed).
  if (in_place_view_writes() != view_writes) {
    cannot_compile("it writes in place into a view of a tensor, giving the base a gradient "
                   "history (CopySlices) that a replay would not record");
    return outs;
  }
  for (const std::string* why : {&prog->output_dependency, &prog->grad_alias_reason})
    if (!why->empty()) {
      cannot_compile(*why);
      return outs;
    }
  // The function went on after an op raised: its path depends on what the op checked (an
  // index in range), which no guard covers, and a replay would take this path for any values.
  if (!caught_op_error.empty()) {
    cannot_compile(fmt::format(
        "it caught an error an op raised while it was traced ({}); the values that op checks "
        "(indices in range, ...) decide the function's path, which no guard covers",
        caught_op_error));
    return outs;
  }
  if (prog->raw_access) {
    const Loc& at = *prog->raw_access;
    cannot_compile(fmt::format(
        "it takes a pointer to tensor memory (data<T>() or raw_data() at {}:{}); a replay of "
        "its recorded ops would skip what it reads and writes through it",
        at.file_name(), at.line()));
    return outs;
  }
  if (!prog->foreign_thread_reason.empty()) {
    cannot_compile(prog->foreign_thread_reason);
    return outs;
  }
  // Memory running out while the backward was recorded may not happen again: this trace is not
  // cached, and the next call traces again (review: it turned the function eager for good).
  if (prog->backward_error.find("out of memory") != std::string::npos) {
    if (shape_only) throw ShapeOnlyUnfit{prog->backward_error};
    log_recompile(fmt::format("a trace not cached: recording its outputs' backward ran out of "
                              "memory ({}); the next call traces again", prog->backward_error));
    return outs;
  }
  if (!prog->backward_error.empty()) {
    cannot_compile(fmt::format("its outputs' backward fails ({})", prog->backward_error));
    return outs;
  }
  // set_default_dtype while this ran (another thread's, or the function's own): its ops may
  // have seen either dtype, which no guard value describes (the entry recorded the one after
  // the trace, and 15 of 200 such functions returned float64 for good, a break-it pass); the
  // next call traces again.
  if (default_dtype_changes() != dtype_changes) {
    if (shape_only) throw ShapeOnlyUnfit{"set_default_dtype was called"};
    log_recompile("a trace not cached: set_default_dtype was called while it was traced; "
                  "the next call traces again");
    return outs;
  }
  if (GeneratorReseeds r = generator_reseeds(); r.count != reseeds) {
    cannot_compile(fmt::format(
        "it reseeds kiln's random generator (manual_seed or set_generator_state, last at "
        "{}:{}); a replay would draw from the caller's generator state instead",
        r.last.file_name(), r.last.line()));
    return outs;
  }
  if (MatmulPrecisionChanges c = matmul_precision_changes(); c.count != precision_changes) {
    cannot_compile(fmt::format(
        "it changes the float32 matmul precision (set_float32_matmul_precision, last at "
        "{}:{}); a replay would compute at the caller's setting and leave it unchanged",
        c.last.file_name(), c.last.line()));
    return outs;
  }
  if (create_graph_backwards() != double_backwards) {
    cannot_compile("it runs a backward with create_graph=true; a replay would return "
                            "those gradients without their own gradient history");
    return outs;
  }
  // The entries to compare with, best first: those whose trace tree holds this trace's path
  // (a tree is compared along it), whose sizes differ from this call's in the most dims (dims
  // that change one at a time then become symbolic together), the most recent first. Each is
  // tried until one generalises: the best by sizes may differ in state the guards on sizes do
  // not see (a .grad defined or not, a frozen layer, a size-1 trace), and comparing only with
  // it made every new size of such a function an entry of its own, up to the cache limit.
  std::vector<const BaseCandidate*> bases;
  for (const BaseCandidate& c : base_candidates)
    if (path_program(*c.entry->root, *prog)) bases.push_back(&c);
  // Ties keep base_candidates' order (the bases point into it).
  std::sort(bases.begin(), bases.end(), [](const BaseCandidate* a, const BaseCandidate* b) {
    size_t na = a->dims.size() + a->scalars.size(), nb = b->dims.size() + b->scalars.size();
    return na != nb ? na > nb : std::less<>()(a, b);
  });
  std::optional<BaseCandidate> refuted_base;  // the symbolic case below
  bool formula_refuted = false;  // ... by a size or constant on the path it traced
  if (unchecked) {
    // The symbolic entry's formulas were inferred from two traces; this trace of new sizes
    // confirms them, or the call gets an entry of its own (the trace already gave its result).
    std::string why = check_symbolic(*unchecked, *prog, args);
    std::vector<int64_t> key = sizes_key(*unchecked, args);
    if (shape_only) {
      // A tensor made in the run (its values garbage) kept in host state: traced, which may
      // store a real one there.
      const bool escaped =
          std::ranges::any_of(candidates, [](const auto& c) { return !c.first.expired(); }) ||
          std::ranges::any_of(held_outputs, [](const OutputHandles& h) {
            return h.impl.use_count() > h.handles;
          });
      if (!why.empty() || escaped)
        throw ShapeOnlyUnfit{escaped ? "a tensor it made outlives the call in host state" : why};
      if (log_enabled("recompiles"))
        fmt::print(stderr, "kiln.compile: '{}': new sizes [{}] checked shape-only (no kernels) "
                   "for specialisation #{} (symbolic): confirmed\n", name, fmt::join(key, ", "),
                   unchecked->id);
      confirm_path(*unchecked, *prog, key);
      ++shape_only_checks;
      *shape_only_confirmed = true;
      return {};
    }
    // Such a trace runs the function as every trace does: said under KILN_LOGS=recompiles and
    // counted in explain(), which reported only the traces that made entries (break-it pass).
    auto confirmed = [&](Entry& e, std::vector<int64_t> k) {
      if (log_enabled("recompiles"))
        fmt::print(stderr, "kiln.compile: '{}': traced at new sizes [{}] to confirm "
                   "specialisation #{} (symbolic): confirmed\n", name, fmt::join(k, ", "), e.id);
      confirm_path(e, *prog, k);
      ++size_checks;
    };
    if (why.empty()) {
      confirmed(*unchecked, std::move(key));
      return outs;
    }
    // A branch the tree lacks is not inserted: nothing checked the tree's prefix, traced at
    // other sizes, against this trace; the sizes get an entry of their own.
    remember(unchecked->refuted_sizes, std::move(key));
    // A later symbolic entry whose guards pass may hold instead: two traces in which only the
    // length changed give `batch * length` as a multiple of the length, and the entry inferred
    // when both changed has the product.
    // Refuted by a size or constant on the path it traced (not another path): what holds here
    // instead is tried before it from then on (place_before).
    auto unchecked_path = path_program(*unchecked->root, *prog);
    formula_refuted = unchecked_path && same_ops(*unchecked_path, *prog);
    std::vector<Entry*> refuted{unchecked};
    for (const std::shared_ptr<Entry>& e : entries) {
      if (e.get() == unchecked || !e->dynamic || !passes(*e, args)) continue;
      std::vector<int64_t> k = sizes_key(*e, args);
      if (contains(e->refuted_sizes, k) || contains(e->checked_sizes, k)) continue;
      std::string other = check_symbolic(*e, *prog, args);
      if (other.empty()) {
        confirmed(*e, std::move(k));
        if (formula_refuted) place_before(e.get(), unchecked);
        return outs;
      }
      if (other != kMissingBranch) {
        remember(e->refuted_sizes, std::move(k));
        refuted.push_back(e.get());
      }
    }
    // This trace is generalised against a refuted entry, as after a size change: a
    // mark_dynamic entry's formulas were guessed from one trace (a mean's count, zeros, a
    // dropout offset are not marked), and a third trace can tell what two could not. The most
    // recent one traced at sizes >= 2 where this call's differ (generalize() cannot compare
    // with a size 0 or 1: a marked dim first traced at size 1 settled never). Tried after
    // the size-change candidates, which alone had it: a cat from an empty cache under
    // Dynamic::Always compared each new length with the size-1 entry only, and every later
    // length got an entry of its own until the cache limit (break-it pass).
    if (options.dynamic != Dynamic::Never) {
      refuted_base = BaseCandidate{unchecked, {}, {}};
      std::vector<Shape> now = arg_shapes(*prog, args.size());
      for (auto it = refuted.rbegin(); it != refuted.rend(); ++it) {
        std::vector<Shape> then = arg_shapes(*(*it)->root->program, args.size());
        bool comparable = true;
        for (size_t a = 0; a < now.size() && a < then.size(); ++a)
          for (int d = 0; d < now[a].size() && d < then[a].size(); ++d)
            if (now[a][d] != then[a][d]) comparable &= now[a][d] >= 2 && then[a][d] >= 2;
        if (comparable) {
          refuted_base->entry = *it;
          break;
        }
      }
      if (std::ranges::none_of(bases, [&](const BaseCandidate* b) {
            return b->entry == refuted_base->entry;
          }))
        bases.push_back(&*refuted_base);
    }
    reason = fmt::format("specialisation #{} (symbolic) does not hold for these sizes: {}",
                         unchecked->id, why);
    if (log_enabled("recompiles"))
      fmt::print(stderr, "kiln.compile: '{}': {}\n", name, reason);
    if (leaves >= options.cache_size_limit) {
      // Said on stderr too, as the limit reached by failing guards (a symbolic entry whose
      // size formulas keep failing was silent: found by a fresh-user trial).
      run_eagerly_from_now_on(fmt::format(
          "cache limit reached (cache_size_limit {}); the guard that kept failing: {}",
          options.cache_size_limit, reason));
      return outs;
    }
  }
  int n = ++traces;
  // Its backward() ran autograd history made before the call (an argument's grad_fn, a
  // captured tensor's), which the next call may bring anew (break-it pass: a tanh argument's
  // backward replayed for a sigmoid argument's gave wrong gradients). Replays run that part on
  // eager autograd (Program::history_backward, a graph break) unless the recorder could not
  // split it off (outside_backward): such a trace is not cached.
  if (!prog->outside_backward.empty()) {
    std::string why = fmt::format(
        "trace #{} not cached: its backward() runs autograd history made before the call ({}), "
        "which a replay cannot run apart from the compiled part",
        n, prog->outside_backward);
    log_recompile(why);
    if (log_enabled("recompiles")) fmt::print(stderr, "kiln.compile: '{}': {}\n", name, why);
    if (++uncached_in_a_row >= 3) cannot_compile(why);
    return outs;
  }
  // A tensor created by the function that outlives the call was stored in host state (e.g. an
  // optimizer's lazily created moments): a replay would not recreate it there, so this trace
  // is not cached; the next call traces with that state as a captured tensor.
  for (auto& [weak, v] : candidates) {
    if (weak.expired()) continue;
    std::string where = "?";
    for (const Node& node : prog->nodes)
      for (int o : node.out)
        if (o == v) where = fmt::format("{} at {}:{}", op_name(node.op), node.loc.file_name(), node.loc.line());
    std::string why = fmt::format(
        "trace #{} not cached: a tensor it created ({}) outlives the call in host state; "
        "update such state in place", n, where);
    log_recompile(why);
    if (log_enabled("recompiles")) fmt::print(stderr, "kiln.compile: '{}': {}\n", name, why);
    if (++uncached_in_a_row >= 3) cannot_compile(why);
    return outs;
  }
  for (const OutputHandles& h : held_outputs) {
    // (lock() adds a handle of its own)
    if (std::shared_ptr<TensorImpl> t = h.impl.lock(); !t || t.use_count() - 1 <= h.handles)
      continue;
    std::string why = fmt::format(
        "trace #{} not cached: its output {} is also kept in host state (a container or "
        "variable outside the function holds it), which a replay would not update; store the "
        "returned tensor after the call instead", n, h.output);
    log_recompile(why);
    if (log_enabled("recompiles")) fmt::print(stderr, "kiln.compile: '{}': {}\n", name, why);
    if (++uncached_in_a_row >= 3) cannot_compile(why);
    return outs;
  }
  uncached_in_a_row = 0;
  // A non-leaf argument or captured tensor that requires grad and is changed in place gets a
  // new autograd history in eager (the function's ops, then its old history); a replay writes
  // the new value back without it, so gradients would skip the function. Runs eagerly.
  for (auto& [src, v] : prog->write_backs) {
    const Source& s = prog->sources[src];
    Tensor t = s.kind == SourceKind::Arg ? args[s.index].tensor : Tensor(s.captured.lock());
    if (!t.defined() || !t.requires_grad() || t.is_leaf()) continue;
    cannot_compile(fmt::format(
        "it changes in place {} that requires grad and has autograd history after the call "
        "({} {}; an in-place write of values that require grad gives it one), whose new "
        "history a replay would not record",
        s.kind == SourceKind::Arg ? fmt::format("an argument ({})", s.index) : "a captured tensor",
        kiln::name(t.dtype()), to_string(t.shape())));
    return outs;
  }
  bool has_reads = false;
  size_t reads = 0;
  for (const Node& node : prog->nodes) {
    if (node.kind != Node::Kind::Read) continue;
    has_reads = true;
    if (++reads > kMaxHostReads) {
      cannot_compile(fmt::format(
          "it reads more than {} tensor elements to the host (to_vector() or printing at "
          "{}:{}); each is a graph break, so it is faster run eagerly",
          kMaxHostReads, node.loc.file_name(), node.loc.line()));
      return outs;
    }
    if (node.read_index > 0) continue;  // the rest of the same to_vector()
    if (log_enabled("breaks"))
      fmt::print(stderr, "kiln.compile: '{}': graph break at {}:{} (host read, value {})\n", name,
                 node.loc.file_name(), node.loc.line(), node.read_value.str());
  }
  journal.reset();  // no fullgraph error from here on: nothing to give back
  // Logged with what became of the trace (made symbolic or not, a new branch).
  auto note_recompile = [&](std::string what) {
    if (log_enabled("recompiles"))
      fmt::print(stderr, "kiln.compile: '{}' recompiling (trace #{}): {}\n", name, n, what);
    log_recompile(fmt::format("trace #{}: {}", n, what));
  };
  if (prog->aliased_mutation && has_reads) {
    // A replay would have changed the real tensors before finding an unseen branch.
    note_recompile(fmt::format("not cached: {} and host reads", prog->aliased_mutation_reason));
    return outs;
  }

  // A symbolic entry does not take branches traced at one size: the path gets an entry of its
  // own, which the path's trace at other sizes makes symbolic.
  if (missing_branch && !failed->dynamic && insert_branch(*failed->root, prog, options, missed)) {
    confirm_path(*failed, *prog, sizes_key(*failed, args));
    add_host_values(*failed, *prog);
    failed->draws_random |= draws_random(*prog);
    failed->touches_grads |= touches_grads(*prog);
    failed->effects_while_run |= effects_while_run(*prog, options.donate_buffers);
    note_recompile("new branch: " + reason);
    if (log_enabled("graph")) fmt::print(stderr, "kiln.compile: '{}' branch added\n", name);
    return outs;
  }

  auto e = std::make_shared<Entry>();
  e->id = next_id++;
  e->grad_enabled = is_grad_enabled();
  e->default_dtype = dtype_before;
  e->parameter_rebinds = rebinds_before;  // a swap during the trace fails its guard
  add_host_values(*e, *prog);
  e->guards.resize(args.size());
  for (size_t i = 0; i < args.size(); ++i) {
    ArgGuard& g = e->guards[i];
    g.kind = args[i].kind;
    g.type = args[i].type;
    g.fixed = args[i].fixed;
    if (g.kind == ArgValue::Kind::Scalar) g.value = args[i].scalar;
    if (g.kind == ArgValue::Kind::Other && args[i].other_copy) {
      g.other = args[i].other_copy(args[i].other);
      g.other_equal = args[i].other_equal;
    }
    if (g.kind == ArgValue::Kind::Other && args[i].other && args[i].other_size)
      g.embedded = embedded_tensors(*prog, args[i]);
    if (g.kind == ArgValue::Kind::Other && args[i].by_identity) {
      g.identity = args[i].other;
      g.lifetime = args[i].lifetime;
    }
    if (g.kind != ArgValue::Kind::Tensor) continue;
    const Tensor& t = args[i].tensor;
    g.dtype = t.dtype();
    g.device = t.device();
    g.shape = t.shape();
    g.contiguous = t.is_contiguous();
    if (!g.contiguous) g.strides = t.strides();
    g.requires_grad = t.requires_grad();
    // Leaf or not, where it requires grad: the function's backward() sets a leaf's .grad, and
    // the function may read x.is_leaf() (a break-it pass: a non-leaf replayed a leaf's branch).
    if (g.requires_grad) g.leaf = t.is_leaf();
    g.alias_of = alias_index(args, i);
  }
  // Symbolic dims: marked ones (optimistic: checked by replay, see call()), then automatic.
  std::vector<std::pair<int, int>> marked = marked_dims;  // this call's, see call()
  if (options.dynamic == Dynamic::Always)
    for (size_t a = 0; a < args.size(); ++a)
      if (args[a].kind == ArgValue::Kind::Tensor && e->guards[a].contiguous)
        for (int d = 0; d < args[a].tensor.dim(); ++d)
          if (args[a].tensor.size(d) >= 2) marked.push_back({int(a), d});  // as automatic
  // A marked dim traced at size 1 that the trace may have broadcast (or squeezed) stays
  // specialised.
  std::string unmarked;  // marks not applied to this trace, for its reason
  if (broadcasts_size_one(*prog))
    std::erase_if(marked, [&](std::pair<int, int> ad) {
      const Tensor& t = args[ad.first].tensor;
      bool size_one = ad.second < t.dim() && t.size(ad.second) < 2;
      if (size_one)
        unmarked += fmt::format("; mark_dynamic({}, {}) is not applied to this trace: its size "
                                "is {}, which the trace broadcast or squeezed",
                                ad.first, ad.second, t.size(ad.second));
      return size_one;
    });
  std::string how;
  const Entry* generalized_from = nullptr;
  for (size_t try_index = 0; try_index < bases.size() && !e->dynamic; ++try_index) {
    const Entry* base = bases[try_index]->entry;
    for (auto d : bases[try_index]->dims)
      if (std::find(auto_dims.begin(), auto_dims.end(), d) == auto_dims.end()) auto_dims.push_back(d);
    for (int s : bases[try_index]->scalars)
      if (std::find(auto_scalars.begin(), auto_scalars.end(), s) == auto_scalars.end())
        auto_scalars.push_back(s);
    std::vector<std::pair<int, int>> dims = auto_dims;
    for (size_t a = 0; a < base->guards.size(); ++a)
      for (int d = 0; d < 64; ++d)
        if (base->guards[a].dyn_mask >> d & 1) dims.push_back({int(a), d});
    // Likewise the base's dynamic host scalars: sizes that follow one keep following it.
    std::vector<int> scalars = auto_scalars;
    for (size_t a = 0; a < base->guards.size(); ++a)
      if (base->guards[a].dynamic_scalar && std::ranges::find(scalars, int(a)) == scalars.end())
        scalars.push_back(int(a));
    std::vector<Scalar> old_scalars, new_scalars;
    for (size_t i = 0; i < args.size(); ++i) {
      old_scalars.push_back(base->guards[i].value);
      new_scalars.push_back(args[i].scalar);
    }
    // A trace tree (host reads) is compared along this trace's path: the new entry holds that
    // path, symbolic; another branch gets an entry of its own (see the missing-branch case).
    std::shared_ptr<const Program> old_program = path_program(*base->root, *prog);
    const Program& old = old_program ? *old_program : *prog;
    // A dim that changed in an earlier recompile but is 0 or 1 in both traces stays static:
    // made symbolic (>= 2) it failed the very call it was traced for, and every later one.
    const std::vector<Shape> new_shapes = arg_shapes(*prog, args.size());
    const std::vector<Shape> old_shapes = arg_shapes(old, args.size());
    std::erase_if(dims, [&](std::pair<int, int> ad) {
      auto [a, d] = ad;
      return a < int(new_shapes.size()) && a < int(old_shapes.size()) &&
             d < int(new_shapes[a].size()) && d < int(old_shapes[a].size()) &&
             new_shapes[a][d] < 2 && new_shapes[a][d] == old_shapes[a][d];
    });
    std::vector<Witness> earlier = base->witnesses;
    auto traced_scalars = [](const Entry& x) {
      std::vector<Scalar> out;
      for (const ArgGuard& g : x.guards) out.push_back(g.value);
      return out;
    };
    // The traces of the other entries (and of what an entry refuted at these sizes was
    // inferred from) tell formulas apart that fit the base and this trace: `n / 2` from
    // `(n + 1) / 2` at n = 3; entries specialised at 8 and 10 let 12 take `n / 2`.
    if (refuted_base && refuted_base->entry != base)
      for (const Witness& w : refuted_base->entry->witnesses) earlier.push_back(w);
    for (const std::shared_ptr<Entry>& x : entries)
      if (x.get() != base)
        if (auto xp = path_program(*x->root, *prog))
          earlier.push_back({xp, arg_shapes(*xp, args.size()), traced_scalars(*x)});
    std::string why = old_program ? generalize(*prog, old, new_shapes, old_shapes, new_scalars,
                                               old_scalars, dims, scalars, earlier)
                                  : "the trace took a branch not traced at the other sizes";
    if (why.empty()) {
      earlier.push_back({old_program, old_shapes, old_scalars});
      constexpr size_t kMaxWitnesses = 4;
      if (earlier.size() > kMaxWitnesses)
        earlier.erase(earlier.begin(), earlier.end() - kMaxWitnesses);
      e->witnesses = std::move(earlier);
      duck_size(*e, dims, new_shapes, old_shapes);
      for (auto [a, d] : dims) e->guards[a].dyn_mask |= uint64_t(1) << d;
      for (int s : scalars)
        if (e->guards[s].kind == ArgValue::Kind::Scalar) e->guards[s].dynamic_scalar = true;
      for (int s : size_scalars(*prog)) e->guards[s].size_scalar = true;
      e->dynamic = true;
      generalized_from = base;
      how = fmt::format("; the changed sizes/scalars are symbolic from now on (compared with "
                        "specialisation #{})", base->id);
    } else if (try_index == 0) {  // the best candidate's reason: the others are alternatives
      how = fmt::format("; not made symbolic: {} (compared with specialisation #{}{})", why,
                        base->id, bases.size() > 1 ? " and the other candidates" : "");
    } else if (refuted_base && base == refuted_base->entry) {
      // Often the one that tells: the best candidate differs in a size 0 or 1 (a cat from an
      // empty cache), and this one names the host value that keeps the sizes specialised.
      how += fmt::format("; with the refuted specialisation #{}: {}", base->id, why);
    }
  }
  if (bases.empty() && strided_arg >= 0 && options.dynamic == Dynamic::Auto)
    how = fmt::format("; not made symbolic: argument {} is strided with strides that change "
                      "with its sizes (a transpose), and such arguments are specialised per "
                      "size (pass .contiguous() to let its sizes vary)",
                      strided_arg);
  if (!e->dynamic && !marked.empty()) {
    if (!bases.empty()) how += "; the marked dims are symbolic all the same";
    mark_symbolic(*prog, arg_shapes(*prog, args.size()), marked);
    duck_size(*e, marked, arg_shapes(*prog, args.size()), {});
    for (auto [a, d] : marked) {
      e->guards[a].dyn_mask |= uint64_t(1) << d;
      if (options.dynamic != Dynamic::Always) e->guards[a].any_size |= uint64_t(1) << d;
    }
    e->dynamic = true;
  }
  how += unmarked;
  e->reason = n == 1 ? "first call" + unmarked : reason + how;
  if (n > 1) note_recompile(reason + how);
  e->root = make_chain(prog, 0, options);
  e->draws_random = draws_random(*prog);
  e->touches_grads = touches_grads(*prog);
  e->effects_while_run = effects_while_run(*prog, options.donate_buffers);
  confirm_path(*e, *prog, sizes_key(*e, args));  // the trace itself is at these sizes
  if (log_enabled("guards"))
    fmt::print(stderr, "kiln.compile: '{}' guards of specialisation #{}:\n{}", name, e->id,
               describe_guards(*e, "  "));
  if (log_enabled("graph")) {
    std::string tree;
    describe_tree(*e->root, 0, tree);
    fmt::print(stderr, "kiln.compile: '{}' specialisation #{}:\n{}", name, e->id, tree);
  }
  // A refuted entry guessed from one trace (marked dims: no witnesses) that this one was
  // generalised from is replaced: the new formulas fit its trace too, and kept, it matched
  // first at every new size and refuted itself there once more by a full trace (no shape-only
  // check ever). One inferred from two traces stays: it still holds at other sizes (a
  // `size / 3 * 3` fits 6, 9 and 12 but not 10).
  if (refuted_base && generalized_from == refuted_base->entry &&
      generalized_from->witnesses.empty() && generalized_from->root->leaf) {
    e->reason += fmt::format("; replaces specialisation #{}", generalized_from->id);
    dropped_entries += static_cast<int>(std::erase_if(  // frees *generalized_from
        entries, [&](const std::shared_ptr<Entry>& x) { return x.get() == generalized_from; }));
  }
  const Entry* made = e.get();
  entries.push_back(std::move(e));
  if (formula_refuted && made->dynamic) place_before(made, unchecked);
  return outs;
}

std::string CompiledFunction::explain() const {
  const Impl& im = *impl_;
  if (im.forked_while_busy)
    return fmt::format("compiled function '{}': runs eagerly in this process ({} eager call(s)): "
                       "it was forked while another thread was tracing or replaying it\n",
                       name_, im.eager_calls.load());
  std::shared_lock lock(im.mu);
  int leaves = 0;
  for (auto& e : im.entries) leaves += e->root->leaves();
  const int confirming = im.size_checks;
  // Traces that made no entry: the function ran eagerly from then on, or the next call traced
  // again (an explain() that said "0 trace(s)" for a function traced once confused users).
  const int not_cached = im.traces_run.load() - im.traces.load() - confirming;
  std::string out = fmt::format(
      "compiled function '{}': {} trace(s){}{}{}, {} cache entr{} (limit {}), backend {}, "
      "dynamic {}\n",
      name_, im.traces_run.load() - confirming,
      not_cached > 0 ? fmt::format(" ({} not cached)", not_cached) : "",
      confirming ? fmt::format(" and {} confirming new sizes (each ran the function)", confirming)
                 : "",
      im.shape_only_checks ? fmt::format(" and {} shape-only run(s) confirming new sizes (no "
                                         "kernels; then replayed)", im.shape_only_checks)
                           : "",
      leaves, leaves == 1 ? "y" : "ies", options_.cache_size_limit,
      options_.backend == Backend::Cpu ? "codegen (cpu / cuda per region)" : "eager",
      options_.dynamic == Dynamic::Auto ? "auto" : options_.dynamic == Dynamic::Always ? "always" : "never");
  if (compile_disabled())
    out += "  compilation is disabled (KILN_COMPILE=0): every call runs eagerly\n";
  if (im.eager_only)
    out += fmt::format("  runs eagerly from now on ({} eager call(s)): {}\n", im.eager_calls.load(),
                       im.eager_reason);
  else if (im.limit_reached)
    out += fmt::format("  cache limit reached: calls that match no entry run eagerly ({} so far), "
                       "the others replay their entry; {}\n",
                       im.eager_calls.load(), im.limit_reason);
  // By id: the order they are tried in changes (place_before).
  std::vector<std::shared_ptr<Entry>> by_id = im.entries;
  std::ranges::sort(by_id, {}, [](const std::shared_ptr<Entry>& e) { return e->id; });
  for (auto& e : by_id) {
    out += fmt::format("specialisation #{} ({}; {} replay(s)):\n  guards:\n", e->id, e->reason,
                       e->hits.load());
    out += describe_guards(*e, "    ");
    if (e->dynamic) {
      out += fmt::format("  symbolic: confirmed by a trace or shape-only run for {} size set(s) "
                         "(the last 64 kept), refuted for {}\n",
                         e->checked_sizes.size(), e->refuted_sizes.size());
      if (std::string f = describe_formulas(*e->root->program); !f.empty())
        out += "  size formulas: " + f + "\n";
      // Such traces run the function eagerly: say so where they come from scalar values.
      bool scalars = std::any_of(e->guards.begin(), e->guards.end(),
                                 [](const ArgGuard& g) { return g.dynamic_scalar; });
      if (scalars)
        out += "  each new value of a dynamic host scalar runs the function once more to "
               "confirm it, as host code may branch on it (shape-only once a trace confirmed "
               "one, else a trace at eager speed): pass a number that changes on every call (a "
               "learning rate) as a 0-d tensor\n";
    }
    const Program& p = *e->root->program;
    int captured = 0, host_inputs = 0;
    for (const Source& s : p.sources) {
      captured += s.kind == SourceKind::Captured;
      host_inputs += s.kind == SourceKind::HostInput;
    }
    if (host_inputs)
      out += fmt::format("    {} host value(s) read on every call as graph inputs (optimizer "
                         "hyperparameters; not guarded)\n", host_inputs);
    if (captured)
      out += fmt::format("    {} captured tensor(s): alive, same dtype, shape and device (lifted to graph inputs)\n",
                         captured);
    if (!p.grad_undefined_at_call.empty())
      out += fmt::format("    {} leaf .grad(s) that backward sets: undefined at the call\n",
                         p.grad_undefined_at_call.size());
    if (p.aliased_mutation)
      out += fmt::format("  runs on eager kernels with real aliasing: {}\n", p.aliased_mutation_reason);
    out += "  trace tree:\n";
    describe_tree(*e->root, 1, out);
  }
  if (!im.recompiles.empty()) {
    out += "recompiles:\n";
    if (im.recompiles_dropped)
      out += fmt::format("  ({} earlier ones not kept)\n", im.recompiles_dropped);
    for (const std::string& r : im.recompiles) out += "  " + r + "\n";
  }
  return out;
}

}  // namespace kiln::tracer
