// kiln::compare and kiln::print.
#include <cmath>
#include <unordered_map>

#include "eager/autograd.h"
#include "tracer/compile.h"
#include "tracer/generalize.h"
#include "tracer/plan.h"
#include "tracer/recorder.h"
#include "tracer/state_journal.h"

namespace kiln {

void print(const Tensor& t, const std::string& label, Loc loc) {
  // An undefined tensor is printed as eager prints it, with no value to record (a trace
  // raised looking it up: a break-it pass).
  auto show = [label](const std::vector<Tensor>& ts) {
    tracer::untraced([&] {
      const std::string text = ts.empty() ? Tensor().str() : ts[0].str();
      if (label.empty()) fmt::print("{}\n", text);
      else fmt::print("{}: {}\n", label, text);
      std::fflush(stdout);
    });
  };
  const std::vector<Tensor> shown = t.defined() ? std::vector<Tensor>{t} : std::vector<Tensor>{};
  if (auto* rec = tracer::Recorder::current()) rec->on_callback("print", show, shown, loc);
  // A shape-only run's values are garbage: the replay that follows shows them.
  if (!dispatch::shape_only() && tracer::PrintScope::show_next()) show(shown);
}

std::string CompareReport::str() const {
  std::string s;
  for (size_t k = 0; k < outputs.size(); ++k)
    s += fmt::format("output {}: max abs diff {:.3g}, max rel diff {:.3g}{}\n", k,
                     outputs[k].max_abs, outputs[k].max_rel, outputs[k].ok ? "" : "  <- beyond tolerance");
  s += ok ? "compiled matches eager\n" : "first divergence: " + first_divergence + "\n";
  return s;
}

namespace tracer {

std::vector<ArgValue> fresh_copies(const std::vector<ArgValue>& args) {
  std::vector<ArgValue> out = args;
  std::vector<Tensor*> tensors;
  for (ArgValue& a : out) {
    if (a.kind == ArgValue::Kind::Tensor && a.tensor.defined()) tensors.push_back(&a.tensor);
    if (a.kind == ArgValue::Kind::TensorList)
      for (Tensor& t : a.list)
        if (t.defined()) tensors.push_back(&t);
  }
  // Each argument's memory is copied with its layout (strides, offset, a 0 stride of expand),
  // so the function sees what it sees in the call: view() of a transposed argument fails,
  // in-place writes into an expanded one raise. Arguments that share memory (one tensor passed
  // twice, x with x.t()) are views of one copy of the span they cover, so a write through one
  // shows through the others. A non-leaf that requires grad is copied alone (below), with a
  // history of its own.
  auto copied_with_layout = [](const Tensor& t) { return !(t.requires_grad() && !t.is_leaf()); };
  std::unordered_map<const StorageImpl*, std::pair<int64_t, int64_t>> spans;  // [lo, hi)
  for (Tensor* t : tensors) {
    if (!copied_with_layout(*t)) continue;
    int64_t lo = t->offset(), hi = t->offset() + (t->numel() > 0);
    if (t->numel() > 0)
      for (int d = 0; d < t->dim(); ++d) {
        int64_t reach = (t->size(d) - 1) * t->stride(d);
        (reach < 0 ? lo : hi) += reach;
      }
    auto [it, fresh] = spans.try_emplace(t->storage().get(), lo, hi);
    if (!fresh) it->second = {std::min(it->second.first, lo), std::max(it->second.second, hi)};
  }
  std::unordered_map<const StorageImpl*, Tensor> span_copy;
  for (Tensor* t : tensors) {
    const bool rg = t->requires_grad(), leaf = t->is_leaf();
    if (copied_with_layout(*t)) {
      const auto [lo, hi] = spans[t->storage().get()];
      Tensor& copy = span_copy[t->storage().get()];
      if (!copy.defined()) {
        auto span = std::make_shared<TensorImpl>();
        span->storage = t->storage();
        span->dtype = t->dtype();
        span->shape = {hi - lo};
        span->strides = {1};
        span->offset = lo;
        copy = untraced([&] { return Tensor(std::move(span)).clone(); });
      }
      auto impl = std::make_shared<TensorImpl>();
      impl->storage = copy.storage();
      impl->dtype = t->dtype();
      impl->shape = t->shape();
      impl->strides = t->strides();
      impl->offset = t->offset() - lo;
      impl->base = copy.impl_ptr();
      *t = Tensor(std::move(impl));
    } else {
      // A copy of a non-leaf that requires grad stays one, so the copy allows in-place ops
      // exactly when the argument does; its history is its own (a clone of a fresh leaf): a
      // backward() in the eager run must not run, and free, the caller's graph (a break-it
      // pass: check=true then failed every call of a head fed by an eager encoder).
      *t = untraced([&] {
        EnableGradGuard grad_mode;
        return t->detach().clone().requires_grad_(true).clone();
      });
    }
    if (rg && leaf) t->requires_grad_(true);
  }
  return out;
}

namespace {

// Max abs / rel difference of two tensors of one shape; `ok` within atol + rtol * |e|, with
// NaN at the same positions.
CompareReport::Output diff(const Tensor& eager, const Tensor& compiled, double rtol, double atol) {
  CompareReport::Output o;
  if (!eager.defined() || !compiled.defined()) {
    o.ok = eager.defined() == compiled.defined();
    return o;
  }
  if (eager.shape() != compiled.shape()) {
    o.ok = false;
    o.max_abs = o.max_rel = INFINITY;
    return o;
  }
  std::vector<double> e = untraced([&] { return eager.to_vector<double>(); });
  std::vector<double> c = untraced([&] { return compiled.to_vector<double>(); });
  for (size_t i = 0; i < e.size(); ++i) {
    if (std::isnan(e[i]) || std::isnan(c[i])) {
      if (std::isnan(e[i]) != std::isnan(c[i])) o.ok = false;
      continue;
    }
    if (e[i] == c[i]) continue;  // equal infinities included
    double d = std::fabs(e[i] - c[i]);
    if (std::isinf(e[i]) || std::isinf(c[i])) {  // inf against a finite value: no tolerance
      o.ok = false;
      o.max_abs = o.max_rel = INFINITY;
      continue;
    }
    o.max_abs = std::max(o.max_abs, d);
    if (e[i] != 0) o.max_rel = std::max(o.max_rel, d / std::fabs(e[i]));
    if (!(d <= atol + rtol * std::fabs(e[i]))) o.ok = false;
  }
  return o;
}

// kiln::compare; for CompileOptions::check, `replayed` is the trace the compiled call replayed,
// which may be stale where a fresh trace is not (a host number read in C++ that changed).
CompareReport compare_runs(
    const std::vector<ArgValue>& args,
    const std::function<std::vector<OutValue>(const std::vector<ArgValue>&)>& call,
    const CompileOptions& options, const Program* replayed) {
  // Both runs start from the caller's state, which the call leaves as it found it: what a run
  // writes (a training step's parameters, optimizer state, .grad) is given back after each,
  // and the generator is where it was (both runs draw the same random numbers from there).
  StateJournal journal;
  struct GiveBack {
    StateJournal& j;
    GeneratorState rng = generator_state();
    ~GiveBack() {
      j.restore();
      set_generator_state(rng);
    }
  } give_back{journal};
  // The eager run, recorded: the recorder's tensors are eager's value of every op.
  auto prog = std::make_shared<Program>();
  std::vector<ArgValue> eager_args = fresh_copies(args);
  std::vector<ArgValue> compiled_args = fresh_copies(args);
  std::vector<OutValue> eager_outs;
  const GeneratorState rng_start = give_back.rng;
  Recorder rec(*prog, /*keep_values=*/true);
  // Arguments in one flat list, a tensor list's elements one by one (as compile() numbers
  // them): the compiled run reads each element from its own copy, not from eager's, which the
  // eager run may have written.
  auto flatten = [](const std::vector<ArgValue>& in) {
    std::vector<ArgValue> flat;
    for (const ArgValue& a : in) {
      if (a.kind != ArgValue::Kind::TensorList) {
        flat.push_back(a);
        continue;
      }
      for (const Tensor& t : a.list) {
        ArgValue e;
        e.kind = t.defined() ? ArgValue::Kind::Tensor : ArgValue::Kind::Undefined;
        e.tensor = t;
        flat.push_back(e);
      }
    }
    return flat;
  };
  const std::vector<ArgValue> eager_flat = flatten(eager_args);
  const std::vector<ArgValue> compiled_flat = flatten(compiled_args);
  for (size_t i = 0; i < eager_flat.size(); ++i)
    if (eager_flat[i].kind == ArgValue::Kind::Tensor) rec.add_arg(eager_flat[i].tensor, int(i));
  rec.install();
  eager_outs = call(eager_args);
  rec.finish();
  for (const OutValue& o : eager_outs)
    prog->outputs.push_back(o.is_tensor && o.tensor.defined() ? rec.lookup(o.tensor) : -1);
  rec.uninstall();
  // Eager's values, copies of those in state it wrote: the compiled run writes that again.
  std::vector<Tensor> eager_value(prog->values.size());
  for (size_t v = 0; v < prog->values.size(); ++v) {
    const Tensor t = rec.tensor(static_cast<int>(v));
    eager_value[v] = journal.wrote(t) ? untraced([&] { return t.detach().clone(); }) : t;
  }
  journal.restore();

  // The compiled run of the same program, every value kept, segment by segment.
  RunState st;
  st.args.resize(compiled_flat.size());
  st.scalars.resize(compiled_flat.size());
  for (size_t i = 0; i < compiled_flat.size(); ++i) {
    st.args[i] = compiled_flat[i].tensor;
    st.scalars[i] = compiled_flat[i].scalar;
  }
  st.rng = rng_start;
  st.in_place = prog->aliased_mutation;
  st.slots.resize(prog->values.size());
  CompareReport report;
  PlanOptions po;
  po.compile = options.backend == Backend::Cpu;
  po.live_after.assign(prog->values.size(), true);
  po.free_dead = false;
  // An eager value whose memory a later in-place op wrote (z = a * 2; z += 1) no longer holds
  // that op's result: its op is not compared (only the last write's value is).
  std::unordered_map<const void*, size_t> last_write;
  for (size_t i = 0; i < prog->nodes.size(); ++i) {
    const Node& n = prog->nodes[i];
    if (n.kind == Node::Kind::Op && n.in_place && !n.out.empty() && rec.tensor(n.out[0]).defined())
      last_write[rec.tensor(n.out[0]).storage().get()] = i;
  }
  auto overwritten_later = [&](const Tensor& t, size_t i) {
    auto it = last_write.find(t.storage().get());
    return it != last_write.end() && it->second > i;
  };
  size_t begin = 0;
  while (begin < prog->nodes.size()) {
    size_t end = begin;
    while (end < prog->nodes.size() && prog->nodes[end].kind != Node::Kind::Read) ++end;
    if (end < prog->nodes.size()) ++end;
    Plan plan(prog, begin, end, po);
    std::optional<Scalar> read = plan.run(st);
    for (size_t i = begin; i < end && report.first_divergence.empty(); ++i) {
      const Node& n = prog->nodes[i];
      if (n.kind != Node::Kind::Op) continue;
      for (int v : n.out) {
        if (!st.slots[v].defined()) continue;  // fused away (not needed outside its region)
        const Tensor& eager = eager_value[v];
        if (!eager.defined() || overwritten_later(rec.tensor(v), i)) continue;
        CompareReport::Output d = diff(eager, st.slots[v], options.rtol, options.atol);
        if (!d.ok) {
          report.first_divergence = fmt::format(
              "op '{}' at {}:{}: max abs diff {:.3g}, max rel diff {:.3g}", op_name(n.op),
              n.loc.file_name(), n.loc.line(), d.max_abs, d.max_rel);
          break;
        }
      }
    }
    if (read && prog->nodes[end - 1].kind == Node::Kind::Read) {
      const Node& r = prog->nodes[end - 1];
      if (read->to<double>() != r.read_value.to<double>()) {
        if (report.first_divergence.empty())
          report.first_divergence = fmt::format("host read at {}:{}: compiled {} vs eager {}",
                                                r.loc.file_name(), r.loc.line(), read->str(),
                                                r.read_value.str());
        break;
      }
    }
    begin = end;
  }
  for (size_t k = 0; k < prog->outputs.size(); ++k) {
    if (k < eager_outs.size() && eager_outs[k].is_length) continue;
    int v = prog->outputs[k];
    CompareReport::Output o;
    if (v >= 0 && st.slots[v].defined())
      o = diff(eager_value[v], st.slots[v], options.rtol, options.atol);
    report.outputs.push_back(o);
    report.ok &= o.ok;
  }
  if (replayed && report.first_divergence.empty())
    report.first_divergence = stale_trace_difference(*replayed, *prog);
  report.ok &= report.first_divergence.empty();
  return report;
}

}  // namespace

CompareReport compare(
    const std::vector<ArgValue>& args,
    const std::function<std::vector<OutValue>(const std::vector<ArgValue>&)>& call,
    const CompileOptions& options) {
  return compare_runs(args, call, options, nullptr);
}


namespace {

// The tensors of `args` in order (list arguments' elements included).
std::vector<Tensor> tensors_of(const std::vector<ArgValue>& args) {
  std::vector<Tensor> out;
  for (const ArgValue& a : args) {
    if (a.kind == ArgValue::Kind::Tensor) out.push_back(a.tensor);
    if (a.kind == ArgValue::Kind::TensorList) out.insert(out.end(), a.list.begin(), a.list.end());
  }
  return out;
}

// " (shape [4] compiled, [1] eager)" where the shapes differ, else "".
std::string shape_note(const Tensor& eager, const Tensor& compiled) {
  if (!eager.defined() || !compiled.defined() || eager.shape() == compiled.shape()) return {};
  return fmt::format(" (shape {} compiled, {} eager)", to_string(compiled.shape()),
                     to_string(eager.shape()));
}

}  // namespace

std::vector<OutValue> checked_call(
    const std::vector<ArgValue>& args, const std::function<std::vector<OutValue>()>& compiled,
    const std::function<std::vector<OutValue>(const std::vector<ArgValue>&)>& eager,
    const CompileOptions& options, Loc where) {
  // Every run starts from the caller's generator state (the same random numbers) and the
  // caller's tensors; the call leaves the generator where the compiled run did. Eager runs on
  // copies of the arguments (made after the journal started: not state it gives back).
  StateJournal journal;
  std::vector<ArgValue> eager_args = fresh_copies(args), spare = fresh_copies(args);
  const GeneratorState rng_start = generator_state();
  std::vector<OutValue> eager_outs;
  try {
    eager_outs = eager(eager_args);
  } catch (...) {
    // The function raised (its own exception or kiln's): nothing to compare. The call runs as
    // without `check`, from the caller's state, and raises as eager does, leaving what eager
    // leaves (a break-it pass: the arguments were left unwritten, the captured tensors written).
    journal.restore();
    set_generator_state(rng_start);
    return compiled();
  }
  std::vector<Tensor> eager_state = journal.current();
  for (OutValue& o : eager_outs)  // an output in written state (a returned parameter) is kept
    if (o.is_tensor && journal.wrote(o.tensor))
      o.tensor = untraced([&] { return o.tensor.detach().clone(); });
  journal.restore();
  set_generator_state(rng_start);
  std::vector<OutValue> outs = compiled();
  const GeneratorState rng_end = generator_state();
  const std::shared_ptr<const Program> replayed = last_replayed_program();

  std::string what;
  CompareReport::Output d;
  for (size_t k = 0, number = 0; k < outs.size() && k < eager_outs.size() && what.empty(); ++k) {
    const bool length = eager_outs[k].is_length;
    if (length && outs[k].scalar.to<int64_t>() == eager_outs[k].scalar.to<int64_t>()) continue;
    if (outs[k].is_tensor) {
      d = diff(eager_outs[k].tensor, outs[k].tensor, options.rtol, options.atol);
    } else {  // a host number
      double e = eager_outs[k].scalar.to<double>(), c = outs[k].scalar.to<double>();
      d = {};
      d.max_abs = std::fabs(e - c);
      d.max_rel = e != 0 ? d.max_abs / std::fabs(e) : 0;
      d.ok = e == c || d.max_abs <= options.atol + options.rtol * std::fabs(e) ||
             (std::isnan(e) && std::isnan(c));
    }
    if (!d.ok)
      what = length ? fmt::format("the length of a returned vector (compiled {}, eager {})",
                               outs[k].scalar.str(), eager_outs[k].scalar.str())
                 : fmt::format("output {}{}", number,
                               outs[k].is_tensor ? shape_note(eager_outs[k].tensor, outs[k].tensor)
                                                 : "");
    number += !length;
  }
  // What the function wrote into its tensor arguments (eager wrote the copies).
  std::vector<Tensor> arg_eager = tensors_of(eager_args), arg_compiled = tensors_of(args);
  for (size_t i = 0; i < arg_eager.size() && what.empty(); ++i) {
    d = diff(arg_eager[i], arg_compiled[i], options.rtol, options.atol);
    if (!d.ok)
      what = fmt::format("tensor argument {} after the call{}", i,
                         shape_note(arg_eager[i], arg_compiled[i]));
  }
  // The state both runs wrote: a parameter the step updates, an optimizer's moments.
  std::vector<Tensor> compiled_state = journal.current();
  for (size_t i = 0; i < eager_state.size() && what.empty(); ++i) {
    d = diff(eager_state[i], compiled_state[i], options.rtol, options.atol);
    const Loc& at = journal.written()[i].loc;
    if (!d.ok)
      what = fmt::format("the tensor written at {}:{} ({} elements)", at.file_name(), at.line(),
                         eager_state[i].numel());
  }
  if (what.empty()) {
    set_generator_state(rng_end);
    return outs;
  }
  // The failed call has no effect: the state and the arguments get their old values back.
  journal.restore();
  std::vector<Tensor> arg_before = tensors_of(spare);
  untraced([&] {
    NoGradGuard no_grad;
    for (size_t i = 0; i < arg_before.size(); ++i)
      if (!diff(arg_before[i], arg_compiled[i], 0, 0).ok) arg_compiled[i].copy_(arg_before[i]);
  });
  set_generator_state(rng_start);
  CompareReport r = compare_runs(spare, eager, options, replayed.get());
  set_generator_state(rng_start);
  throw Error("compile",
              fmt::format("check: {} differs from eager (max abs diff {:.3g}, max rel diff "
                          "{:.3g}); first divergence: {}",
                          what, d.max_abs, d.max_rel,
                          r.first_divergence.empty() ? "not found" : r.first_divergence),
              where);
}

}  // namespace tracer
}  // namespace kiln
