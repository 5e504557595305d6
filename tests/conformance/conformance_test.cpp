// Op-table conformance (like PyTorch's OpInfo): for EVERY op in core/ops.def, the samples of
// samples.cpp (per category: the dtypes, 0-d, empty, size-1 broadcasting, transposed and
// expanded (stride 0) inputs, ±0, ±inf, NaN, denormals, INT_MIN/INT_MAX) are checked four ways:
//
//  1. eager vs reference.cpp's independent reference (double / exact 64-bit integers, naive
//     loops, explicit index logic): dtype, shape, values; views must alias their input, in-place
//     ops must write their destination.
//  2. compiled vs eager: kiln::compile of a one-op function, called three times (the trace, then
//     two replays: compiled regions alternate compiled code and eager kernels on their first
//     runs), each compared with a fresh eager call: NaN positions identical, infinities equal.
//     Also "fused": the op followed by neg(neg(.)) (bitwise identity), so that it lands in a
//     native compiled region where the IR covers it (a lone op runs on eager kernels). Ops the
//     IR does not cover run on eager kernels inside compiled functions and must still equal
//     eager; tests/codegen/conformance_test.cpp compares the lowered ops' code too.
//  3. gradients (ops classed Yes in grad_class): gradcheck (tests/gradcheck.h: central finite
//     differences in float64) on float64 samples with smooth values, then compiled backward
//     (outputs of a compiled function, .backward(w)) vs eager backward. Ops classed No: their
//     output must not require grad when the float inputs do.
//  4. every sample the reference rejects (unsupported dtype, mismatched shapes, bad dims, ...)
//     and a generic wrong-arity call must raise kiln::Error, eagerly and compiled, whose message
//     names the op, every input dtype and every input shape (value errors raised by kernels,
//     such as an index out of range, name the op); any other exception or a crash fails.
//
// Tolerances (eager vs reference; integer and bool results always exact, NaN positions exact):
//   Exact  — float32: the double result rounded once to float32 must match exactly (correctly
//            rounded ops: + - * / sqrt, rounding, min/max, comparisons, views, copies, casts,
//            index ops); float64: exact.
//   Approx — transcendentals (exp, log, sin, tanh, erf, gelu, pow, atan2, softmax, logsumexp,
//            add/sub with alpha != 1): float32 rtol 1e-5, atol 1e-30; float64 rtol 1e-12.
//   Accum  — sums (sum, mean, prod, var, std, matmul, addmm, layer_norm, losses, index_add,
//            scatter_add): |eager − ref| ≤ rtol · Σ|terms|; float32 rtol 1e-5, float64 1e-12.
// Compiled vs eager: Exact exact; Approx and Accum float32 rtol 1e-5 atol 1e-6, float64
// rtol 1e-10 atol 1e-12 (as tests/codegen/conformance_test.cpp).
//
// Table-driven: a new line in core/ops.def is picked up by the loop over kNumOps; an op with
// no sampler, no reference or no gradient class FAILS, naming the file and function to extend.
#include <catch2/catch.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>

#include "eager/dispatch.h"
#include "gradcheck.h"
#include "kiln/kiln.h"
#include "reference.h"
#include "samples.h"

using namespace conf;
using kiln::Error;

namespace {

// ------------------------------------ calling ops ------------------------------------

bool is_random(OpKind k) { return kiln::op_info(k).category == kiln::OpCategory::Random; }

/// One op call through the dispatcher (the path every public op function takes). Random ops
/// draw from the global generator as the factories do.
Tensor call(OpKind k, const std::vector<Tensor>& in, OpAttrs a) {
  if (is_random(k)) {
    int64_t n = in.empty() ? std::max<int64_t>(0, kiln::numel(a.dims)) : in[0].numel();
    a.seed = kiln::generator_state().seed;
    a.offset = kiln::reserve_random(static_cast<uint64_t>(4 * n + 4));
  }
  return kiln::dispatch::call1(kiln::OpCall{k, in, a, kiln::Loc::current()});
}

bool in_place(OpKind k) { return k == OpKind::CopyInto || k == OpKind::Fill; }

// ------------------------------------ gradients ------------------------------------

enum class Grad { Yes, No, Unknown };

/// Whether an op is differentiable (w.r.t. its floating inputs). A new op must be added here.
Grad grad_class(OpKind k) {
  switch (k) {
    case OpKind::Neg: case OpKind::Abs: case OpKind::Sign: case OpKind::Exp: case OpKind::Exp2:
    case OpKind::Log: case OpKind::Log2: case OpKind::Log1p: case OpKind::Expm1:
    case OpKind::Sqrt: case OpKind::Rsqrt: case OpKind::Reciprocal: case OpKind::Sin:
    case OpKind::Cos: case OpKind::Tan: case OpKind::Tanh: case OpKind::Sigmoid:
    case OpKind::Relu: case OpKind::Gelu: case OpKind::Silu: case OpKind::Erf:
    case OpKind::Floor: case OpKind::Ceil: case OpKind::Round: case OpKind::Trunc:
    case OpKind::Clamp: case OpKind::Add: case OpKind::Sub: case OpKind::Mul: case OpKind::Div:
    case OpKind::Pow: case OpKind::Maximum: case OpKind::Minimum: case OpKind::Atan2:
    case OpKind::Where: case OpKind::Sum: case OpKind::Mean: case OpKind::Prod:
    case OpKind::Amax: case OpKind::Amin: case OpKind::Var: case OpKind::Std:
    case OpKind::LogSumExp: case OpKind::Softmax: case OpKind::LogSoftmax:
    case OpKind::LayerNorm: case OpKind::Matmul: case OpKind::Addmm: case OpKind::View:
    case OpKind::Transpose: case OpKind::Permute: case OpKind::Slice: case OpKind::Select:
    case OpKind::Expand: case OpKind::Squeeze: case OpKind::Unsqueeze:
    case OpKind::Contiguous: case OpKind::Cast: case OpKind::CopyInto: case OpKind::Cat:
    case OpKind::IndexSelect: case OpKind::Gather: case OpKind::Embedding:
    case OpKind::MaskedFill: case OpKind::IndexAdd: case OpKind::IndexCopy:
    case OpKind::ScatterAdd: case OpKind::Tril:
    case OpKind::Triu: case OpKind::Dropout: case OpKind::NllLoss: case OpKind::MseLoss:
    case OpKind::FloorDivide: case OpKind::Remainder: case OpKind::Fill: case OpKind::CumSum:
    case OpKind::Unfold: case OpKind::Fold:
      return Grad::Yes;
    case OpKind::LogicalNot: case OpKind::Eq:
    case OpKind::Ne: case OpKind::Lt: case OpKind::Le: case OpKind::Gt: case OpKind::Ge:
    case OpKind::LogicalAnd: case OpKind::LogicalOr: case OpKind::LogicalXor: case OpKind::All:
    case OpKind::Any: case OpKind::Argmax: case OpKind::Argmin: case OpKind::OneHot:
    case OpKind::Uniform: case OpKind::Normal: case OpKind::RandInt: case OpKind::DropoutMask:
    case OpKind::ArgSort:
      return Grad::No;
    default: return Grad::Unknown;
  }
}

// ------------------------------------ comparing ------------------------------------

struct Bounds {
  double rtol = 0, atol = 0;
  bool by_mag = false;  // atol + rtol * mag[j] instead of atol + rtol * |want|
};

Bounds vs_reference(Tol t, DType d) {
  bool f32 = d == DType::Float32;
  switch (t) {
    case Tol::Exact: return {};
    case Tol::Approx: return f32 ? Bounds{1e-5, 1e-30} : Bounds{1e-12, 1e-300};
    case Tol::Accum: return f32 ? Bounds{1e-5, 1e-30, true} : Bounds{1e-12, 1e-300, true};
  }
  return {};
}
Bounds vs_eager(Tol t, DType d) {
  bool f32 = d == DType::Float32;
  if (t == Tol::Exact) return {};
  return f32 ? Bounds{1e-5, 1e-6} : Bounds{1e-10, 1e-12};
}

std::string shape_str(const Ix& s) { return kiln::to_string(kiln::Shape(s)); }

/// "" when `got` has `want`'s dtype, shape and values (within `b`), else what differs.
std::string mismatch(const Arr& got, const Ref& want, Bounds b) {
  if (got.dtype != want.dtype)
    return "dtype " + std::string(kiln::name(got.dtype)) + ", expected " + std::string(kiln::name(want.dtype));
  if (got.shape != want.shape) return "shape " + shape_str(got.shape) + ", expected " + shape_str(want.shape);
  char buf[256];
  if (is_float(want.dtype)) {
    for (size_t j = 0; j < want.f.size(); ++j) {
      double g = got.f[j], w = want.f[j];
      double lim = b.atol + b.rtol * (b.by_mag && !want.mag.empty() ? want.mag[j] : std::fabs(w));
      bool ok = std::isnan(g) || std::isnan(w) ? std::isnan(g) && std::isnan(w)
                : g == w                       ? true
                : std::isinf(g) || std::isinf(w) ? false
                                                 : std::fabs(g - w) <= lim;
      if (!ok) {
        std::snprintf(buf, sizeof buf, "element %zu: got %.17g, expected %.17g (allowed %.3g)", j, g, w, lim);
        return buf;
      }
    }
    return "";
  }
  for (size_t j = 0; j < want.i.size(); ++j)
    if (got.i[j] != want.i[j]) {
      std::snprintf(buf, sizeof buf, "element %zu: got %lld, expected %lld", j,
                    static_cast<long long>(got.i[j]), static_cast<long long>(want.i[j]));
      return buf;
    }
  return "";
}

/// An eager result as the expectation of a compiled run.
Ref as_ref(const Tensor& t, Tol tol) {
  Arr a = read(t);
  Ref r;
  r.shape = a.shape;
  r.dtype = a.dtype;
  r.tol = tol;
  if (is_float(a.dtype)) r.f = a.f;
  else r.i = a.i;
  return r;
}

std::string describe(const std::vector<Tensor>& in) {
  std::string s;
  for (const Tensor& t : in)
    s += (s.empty() ? "" : ", ") +
         (t.defined() ? std::string(kiln::name(t.dtype())) + " " + kiln::to_string(t.shape()) +
                            (t.is_contiguous() ? "" : " (strided)")
                      : std::string("undefined"));
  return s.empty() ? "no inputs" : s;
}

bool value_error(const std::string& why) {
  for (const char* w : {"by zero", "negative power", "out of range", "num_classes -1"})
    if (why.find(w) != std::string::npos && why.find("dim out of range") == std::string::npos) return true;
  return false;
}

/// "" when `msg` is a good error message for op `k` on `in`: it names the op and (unless it is
/// a value error raised by a kernel) every input's dtype and shape.
std::string message_problem(const std::string& msg, OpKind k, const std::vector<Tensor>& in,
                            bool value_err) {
  std::string op(kiln::op_info(k).name);
  if (msg.rfind("kiln::" + op + ":", 0) != 0) return "does not start with \"kiln::" + op + ":\"";
  if (value_err) return "";
  for (const Tensor& t : in) {
    if (!t.defined()) continue;
    if (msg.find(std::string(kiln::name(t.dtype()))) == std::string::npos)
      return "does not name dtype " + std::string(kiln::name(t.dtype()));
    if (msg.find(kiln::to_string(t.shape())) == std::string::npos)
      return "does not name shape " + kiln::to_string(t.shape());
  }
  return "";
}

// ------------------------------------ bookkeeping ------------------------------------

struct Stats {
  int compared = 0, raised = 0, compiled = 0, compiled_raised = 0, lowered = 0, gradchecked = 0,
      compiled_backward = 0, no_grad_checked = 0, failures = 0;
};
std::map<std::string, Stats> g_stats;
int g_total_failures = 0;

/// Known kiln bugs this suite found and that are not fixed yet: a failure whose op matches and
/// whose message contains both strings is reported (printed) instead of failing. An entry that
/// no longer reproduces FAILS the test ("remove it"), so the list cannot go stale.
struct KnownBug {
  const char* op;
  const char* sample;  // substring of the failure message (sample label and check)
  const char* check;   // second substring
  const char* what;
  int hits = 0;
};
std::vector<KnownBug> g_known_bugs = {};  // none open

void failure(const std::string& op, const std::string& what) {
  for (KnownBug& b : g_known_bugs)
    if (op == b.op && what.find(b.sample) != std::string::npos && what.find(b.check) != std::string::npos) {
      if (b.hits++ == 0) std::printf("known bug (%s): %s\n  first case: %s\n", b.op, b.what, what.c_str());
      return;
    }
  ++g_stats[op].failures;
  ++g_total_failures;
  if (g_stats[op].failures <= 6) FAIL_CHECK(what);
  else if (g_stats[op].failures == 7) FAIL_CHECK(op << ": more failures not shown");
}

// ------------------------------------ random ops ------------------------------------

/// Random ops have no value reference: their values are checked by property (range, moments,
/// mask values, dropout = x * scale or 0) and compiled == eager for the same seed.
std::string check_random(OpKind k, const std::vector<Tensor>& in, const OpAttrs& a, const Tensor& out) {
  Arr o = read(out);
  char buf[200];
  double n = static_cast<double>(o.numel());
  if (k == OpKind::Dropout) {
    Arr x = read(in[0]);
    if (o.dtype != x.dtype || o.shape != x.shape) return "dtype/shape differ from the input";
    double scale = 1.0 / (1.0 - a.p);
    int64_t dropped = 0, counted = 0;
    for (size_t j = 0; j < o.f.size(); ++j) {
      double xv = x.f[j], v = o.f[j];
      // Dropped: x * 0, as PyTorch's x * mask (NaN for x = ±inf or NaN).
      bool zero = std::isfinite(xv) ? v == 0 : std::isnan(v);
      // x * scale in the dtype (scale itself rounded first: allow 2 ulp of float32/float64).
      double want = round_to(o.dtype, xv * scale), ulp = o.dtype == DType::Float32 ? 1.2e-7 : 2.3e-16;
      bool kept = want == v || std::fabs(v - want) <= 2 * ulp * std::fabs(want) ||
                  (std::isnan(xv) && std::isnan(v));
      if (!zero && !kept) {
        std::snprintf(buf, sizeof buf, "element %zu: x %.9g gave %.9g, neither x*0 nor x/(1-p)", j, xv, v);
        return buf;
      }
      if (std::isfinite(xv) && xv != 0) ++counted, dropped += zero;
    }
    double frac = counted ? static_cast<double>(dropped) / static_cast<double>(counted) : a.p;
    double sd = std::sqrt(a.p * (1 - a.p) / std::max<double>(1.0, static_cast<double>(counted)));
    if (std::fabs(frac - a.p) > 5 * sd + 1e-9) {
      std::snprintf(buf, sizeof buf, "dropped fraction %.4f, expected %.4f", frac, a.p);
      return buf;
    }
    return "";
  }
  Ix shape(a.dims.begin(), a.dims.end());
  if (o.dtype != a.dtype || o.shape != shape) return "dtype/shape differ from the attrs";
  if (o.numel() == 0) return "";
  double lo = a.low.to<double>(), hi = a.high.to<double>(), s = 0, s2 = 0;
  for (double v : o.f) s += v, s2 += v * v;
  double mean = s / n, var = s2 / n - mean * mean;
  auto near = [&](double got, double want, double sd, const char* what) -> std::string {
    if (std::fabs(got - want) <= 5 * sd) return "";
    std::snprintf(buf, sizeof buf, "%s %.5f, expected %.5f ± %.5f", what, got, want, 5 * sd);
    return buf;
  };
  switch (k) {
    case OpKind::Uniform:
      for (double v : o.f)
        if (!(v >= lo && v < hi)) return "value " + std::to_string(v) + " outside [low, high)";
      return near(mean, (lo + hi) / 2, (hi - lo) / std::sqrt(12 * n), "mean");
    case OpKind::Normal: {
      std::string m = near(mean, lo, hi / std::sqrt(n), "mean");
      if (!m.empty()) return m;
      return near(std::sqrt(var), hi, hi * 1.5 / std::sqrt(n), "std");
    }
    case OpKind::RandInt: {
      std::set<int64_t> seen(o.i.begin(), o.i.end());
      for (int64_t v : seen)
        if (v < a.low.to<int64_t>() || v >= a.high.to<int64_t>()) return "value " + std::to_string(v) + " outside [low, high)";
      if (static_cast<int64_t>(seen.size()) != a.high.to<int64_t>() - a.low.to<int64_t>()) return "not every value in [low, high) drawn";
      double span = hi - lo;
      return near(mean, (lo + hi - 1) / 2, std::sqrt((span * span - 1) / 12 / n), "mean");
    }
    case OpKind::DropoutMask: {
      double scale = round_to(o.dtype, 1.0 / (1.0 - a.p));
      double zeros = 0;
      for (double v : o.f) {
        if (v != 0 && v != scale) return "mask value " + std::to_string(v) + " is neither 0 nor 1/(1-p)";
        zeros += v == 0;
      }
      return near(zeros / n, a.p, std::sqrt(a.p * (1 - a.p) / n), "dropped fraction");
    }
    default: return "no property check for this random op in check_random()";
  }
}

// ------------------------------------ the four checks ------------------------------------

std::string label(OpKind k, const Sample& s) {
  return std::string(kiln::op_info(k).name) + " [" + s.what + "]";
}

/// Check 1 (and 4, eager): eager vs the reference, or the error the reference expects.
void check_eager(OpKind k, const Sample& s, const Ref& ref) {
  std::string op(kiln::op_info(k).name);
  Stats& st = g_stats[op];
  std::vector<Tensor> in = s.make();
  std::string lab = label(k, s) + " on " + describe(in);
  Tensor out;
  try {
    if (is_random(k)) kiln::manual_seed(11);
    out = call(k, in, s.attrs);
  } catch (const Error& e) {
    if (!ref.raises) return failure(op, lab + ": eager raised, the reference gives a result: " + e.what());
    std::string p = message_problem(e.what(), k, in, value_error(ref.why));
    if (!p.empty()) return failure(op, lab + ": error message " + p + ": " + e.what());
    ++st.raised;
    return;
  } catch (const std::exception& e) {
    return failure(op, lab + ": eager threw a non-kiln exception: " + e.what());
  }
  if (ref.raises) return failure(op, lab + ": eager returned a result, expected an error (" + ref.why + ")");
  std::string d;
  if (ref.property_only) {
    d = check_random(k, in, s.attrs, out);
  } else {
    d = mismatch(read(out), ref, vs_reference(ref.tol, ref.dtype));
    if (d.empty() && ref.aliases_input0 && !in.empty() && out.storage().get() != in[0].storage().get())
      d = "the result does not share the input's storage (a view / in-place op must)";
    if (d.empty() && in_place(k)) {
      d = mismatch(read(in[0]), ref, vs_reference(ref.tol, ref.dtype));
      if (!d.empty()) d = "destination after the in-place op: " + d;
    }
    if (d.empty() && k == OpKind::Contiguous && !out.is_contiguous()) d = "result is not contiguous";
  }
  if (!d.empty()) return failure(op, lab + ": eager vs reference: " + d);
  ++st.compared;
}

/// Check 2 (and 4, compiled): a one-op compiled function vs eager, trace and two replays.
/// A region with a single computing op runs on eager kernels (tracer/plan.cpp: nothing to
/// fuse), so `fused` compiles op followed by neg(neg(·)) (logical_not twice for bool), which is
/// bitwise the identity: the op is then part of a compiled region where the IR covers it.
void check_compiled(OpKind k, const Sample& s, const Ref& ref, bool fused) {
  std::string op(kiln::op_info(k).name);
  Stats& st = g_stats[op];
  OpAttrs a = s.attrs;
  auto cf = kiln::compile([k, a, fused](const std::vector<Tensor>& xs) {
    Tensor y = call(k, xs, a);
    if (!fused) return y;
    return y.dtype() == DType::Bool ? kiln::logical_not(kiln::logical_not(y)) : kiln::neg(kiln::neg(y));
  });
  for (int it = 0; it < 3; ++it) {
    std::vector<Tensor> in = s.make();
    std::string lab = label(k, s) + (fused ? " compiled (fused) call " : " compiled call ") +
                      std::to_string(it + 1) + " on " + describe(in);
    Tensor got;
    try {
      if (is_random(k)) kiln::manual_seed(23);
      std::vector<Tensor> args = in;  // trailing absent optional inputs (layer_norm) dropped
      while (!args.empty() && !args.back().defined()) args.pop_back();
      got = cf(args);
    } catch (const Error& e) {
      if (!ref.raises) return failure(op, lab + ": compiled raised: " + e.what());
      std::string p = message_problem(e.what(), k, in, value_error(ref.why));
      if (!p.empty()) return failure(op, lab + ": error message " + p + ": " + e.what());
      ++st.compiled_raised;
      continue;
    } catch (const std::exception& e) {
      return failure(op, lab + ": compiled threw a non-kiln exception: " + e.what());
    }
    if (ref.raises) return failure(op, lab + ": compiled returned a result, expected an error (" + ref.why + ")");
    std::vector<Tensor> ein = s.make();
    if (is_random(k)) kiln::manual_seed(23);
    Tensor want = call(k, ein, a);
    Ref w = as_ref(want, ref.tol);
    std::string d = mismatch(read(got), w, vs_eager(ref.tol, w.dtype));
    if (d.empty() && in_place(k)) {
      d = mismatch(read(in[0]), as_ref(ein[0], ref.tol), vs_eager(ref.tol, w.dtype));
      if (!d.empty()) d = "destination written back: " + d;
    }
    if (!d.empty()) return failure(op, lab + ": compiled vs eager: " + d);
    ++st.compiled;
  }
  // Whether the op ran as native code (a compiled region) or on eager kernels inside the plan.
  if (!ref.raises && cf.explain().find("compiled region:") != std::string::npos) ++st.lowered;
}

/// Positions of the inputs that are differentiated: the float64 inputs.
std::vector<size_t> grad_positions(const std::vector<Tensor>& in) {
  std::vector<size_t> p;
  for (size_t q = 0; q < in.size(); ++q)
    if (in[q].defined() && in[q].dtype() == DType::Float64) p.push_back(q);
  return p;
}

/// Check 3: gradcheck and compiled backward vs eager backward (Yes), or no grad (No).
void check_grad(OpKind k) {
  std::string op(kiln::op_info(k).name);
  Stats& st = g_stats[op];
  Grad g = grad_class(k);
  if (g == Grad::Unknown)
    return failure(op, op + ": no gradient class: add it to grad_class() in tests/conformance/conformance_test.cpp (Yes: differentiable, No: not)");
  std::string missing;
  std::vector<Sample> gs = samples(k, true, missing);
  if (g == Grad::No) {
    // Float64 inputs requiring grad (the first sample with one) must give an output that
    // does not require grad.
    std::vector<Sample> ss = gs.empty() ? samples(k, false, missing) : gs;
    for (const Sample& s : ss) {
      std::vector<Tensor> in = s.make();
      std::vector<size_t> pos;
      for (size_t q = 0; q < in.size(); ++q)
        if (in[q].defined() && is_float(in[q].dtype()) && !in_place(k)) pos.push_back(q);
      if (reference(k, in, s.attrs).raises) continue;
      for (size_t q : pos) in[q] = in[q].to(DType::Float64).detach().requires_grad_();
      Tensor out;
      try {
        out = call(k, in, s.attrs);
      } catch (const Error& e) {
        return failure(op, label(k, s) + ": raised with inputs requiring grad: " + e.what());
      }
      if (out.requires_grad())
        return failure(op, label(k, s) + ": classed not differentiable, but its output requires grad");
      ++st.no_grad_checked;
      return;
    }
    return failure(op, op + ": no sample to check that it is not differentiable");
  }
  if (gs.empty()) return failure(op, op + ": differentiable but no float64 gradient samples: add them in samples.cpp (grad = true)");
  int done = 0;
  for (const Sample& s : gs) {
    if (done >= 3) break;
    std::vector<Tensor> base = s.make();
    if (reference(k, base, s.attrs).raises) continue;
    std::vector<size_t> pos = grad_positions(base);
    if (pos.empty()) continue;
    ++done;
    OpAttrs a = s.attrs;
    // fn(float inputs) = op(inputs with those replaced); in-place ops write a clone of their
    // destination (differentiable: clone is `contiguous`), not the leaf.
    auto fn = [k, a, base, pos](const std::vector<Tensor>& xs) {
      std::vector<Tensor> full = base;
      for (size_t q = 0; q < pos.size(); ++q) full[pos[q]] = xs[q];
      if (in_place(k)) full[0] = full[0].clone();
      if (is_random(k)) kiln::manual_seed(5);
      return call(k, full, a);
    };
    std::vector<Tensor> xs;
    for (size_t q : pos) xs.push_back(base[q].contiguous());
    {
      INFO("gradcheck " << label(k, s));
      kiln::testing::gradcheck(fn, xs);
      ++st.gradchecked;
    }
    // Eager backward, then compiled backward (trace + 2 replays), same weights w.
    auto leaves = [&] {
      std::vector<Tensor> ls;
      for (const Tensor& x : xs) ls.push_back(x.clone().detach().requires_grad_());
      return ls;
    };
    std::vector<Tensor> el = leaves();
    Tensor eo = fn(el);
    if (!eo.requires_grad()) {
      failure(op, label(k, s) + ": classed differentiable, but the output does not require grad");
      continue;
    }
    Tensor w = make(eo.dtype(), Ix(eo.shape().begin(), eo.shape().end()), 9, Pool::Smooth);
    eo.backward(w);
    auto cf = kiln::compile([fn](const std::vector<Tensor>& ys) { return fn(ys); });
    for (int it = 0; it < 3; ++it) {
      std::vector<Tensor> cl = leaves();
      std::string lab = label(k, s) + " compiled backward call " + std::to_string(it + 1);
      try {
        if (is_random(k)) kiln::manual_seed(5);
        Tensor co = cf(cl);
        co.backward(w);
      } catch (const std::exception& e) {
        failure(op, lab + ": raised: " + e.what());
        break;
      }
      std::string d;
      for (size_t q = 0; q < cl.size() && d.empty(); ++q) {
        Tensor ge = el[q].grad(), gc = cl[q].grad();
        if (ge.defined() != gc.defined()) d = "grad of input " + std::to_string(q) + (ge.defined() ? " missing" : " unexpected");
        else if (ge.defined()) {
          d = mismatch(read(gc), as_ref(ge, Tol::Accum), vs_eager(Tol::Accum, DType::Float64));
          if (!d.empty()) d = "grad of input " + std::to_string(q) + ": " + d;
        }
      }
      if (!d.empty()) {
        failure(op, lab + ": compiled vs eager backward: " + d);
        break;
      }
      ++st.compiled_backward;
    }
  }
  if (done == 0) failure(op, op + ": differentiable but no usable float64 gradient sample: add one in samples.cpp (grad = true)");
}

}  // namespace

TEST_CASE("Conformance over the op table: reference, compiled, gradients, errors", "[conformance]") {
  auto t0 = std::chrono::steady_clock::now();
  const char* only = std::getenv("KILN_CONFORMANCE_OP");  // e.g. KILN_CONFORMANCE_OP=softmax
  bool verbose = std::getenv("KILN_CONFORMANCE_VERBOSE") != nullptr;
  std::vector<std::string> order;
  for (int i = 0; i < kiln::kNumOps; ++i) {
    auto k = static_cast<OpKind>(i);
    const kiln::OpInfo& info = kiln::op_info(k);
    std::string op(info.name);
    if (only && op != only) continue;
    order.push_back(op);
    g_stats[op] = Stats{};
    if (verbose) std::fprintf(stderr, "conformance: %s\n", op.c_str());
    std::string missing;
    std::vector<Sample> ss = samples(k, false, missing);
    if (!missing.empty() || ss.empty()) {
      failure(op, op + ": " + (missing.empty() ? "no samples" : missing) +
                      ": add samples for it in tests/conformance/samples.cpp (samples())");
      continue;
    }
    // Check 4 for every op: one input too many (a list op: none at all).
    {
      Sample bad;
      bad.what = info.arity < 0 ? "empty list" : "wrong arity";
      int n = info.arity < 0 ? 0 : info.arity + 1;
      bad.make = [n] {
        std::vector<Tensor> v;
        for (int q = 0; q < n; ++q) v.push_back(make(DType::Float32, {2, 3}, q, Pool::Finite));
        return v;
      };
      ss.push_back(bad);
    }
    bool any_ok = false;
    for (const Sample& s : ss) {
      Ref ref;
      if (s.what == "wrong arity" || s.what == "empty list") ref = raises("wrong number of inputs");
      else ref = reference(k, s.make(), s.attrs);
      if (ref.raises && ref.why == "no reference") {
        failure(op, op + ": no reference: add one in tests/conformance/reference.cpp (reference())");
        break;
      }
      any_ok |= !ref.raises;
      if (verbose) std::fprintf(stderr, "  [%s]\n", s.what.c_str());
      try {
        check_eager(k, s, ref);
        if (s.compiled || ref.raises) check_compiled(k, s, ref, false);
        if (s.compiled && !ref.raises) check_compiled(k, s, ref, true);
      } catch (const std::exception& e) {
        failure(op, label(k, s) + ": threw: " + e.what());
      }
    }
    if (!any_ok) failure(op, op + ": no sample with a result: add one in tests/conformance/samples.cpp");
    try {
      check_grad(k);
    } catch (const std::exception& e) {
      failure(op, op + ": gradient checks threw: " + e.what());
    }
  }
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("\nOp-table conformance (tests/conformance): per op, samples equal to the reference /\n"
              "raising the expected error (eager) / compiled runs equal to eager / raising compiled /\n"
              "compiled samples that ran as native code (the rest: eager kernels in the plan) /\n"
              "gradchecks / compiled backward runs equal to eager / not-differentiable checks / failures\n");
  Stats tot;
  int ops_all4 = 0;
  for (const std::string& op : order) {
    const Stats& s = g_stats[op];
    std::printf("  %-14s %4d %4d %4d %4d %3d %3d %3d %2d %s\n", op.c_str(), s.compared, s.raised,
                s.compiled, s.compiled_raised, s.lowered, s.gradchecked, s.compiled_backward,
                s.no_grad_checked, s.failures ? ("FAILED " + std::to_string(s.failures)).c_str() : "");
    tot.compared += s.compared, tot.raised += s.raised, tot.compiled += s.compiled;
    tot.compiled_raised += s.compiled_raised, tot.gradchecked += s.gradchecked, tot.lowered += s.lowered;
    tot.compiled_backward += s.compiled_backward, tot.no_grad_checked += s.no_grad_checked;
    ops_all4 += s.compared > 0 && s.raised > 0 && s.compiled > 0 && s.compiled_raised > 0 &&
                (s.gradchecked > 0 ? s.compiled_backward > 0 : s.no_grad_checked > 0);
  }
  std::printf("ops: %zu, with all four checks: %d; reference %d, errors %d, compiled %d, compiled "
              "errors %d, native samples %d, gradchecks %d, compiled backward %d, not differentiable "
              "%d; %.1f s\n",
              order.size(), ops_all4, tot.compared, tot.raised, tot.compiled, tot.compiled_raised, tot.lowered,
              tot.gradchecked, tot.compiled_backward, tot.no_grad_checked, secs);
  for (const KnownBug& b : g_known_bugs) {
    INFO("known bug no longer reproduces (fixed?): remove it from g_known_bugs: " << b.op << ": " << b.what);
    if (!only || b.op == std::string(only)) CHECK(b.hits > 0);
  }
  CHECK(g_total_failures == 0);
  if (!only) CHECK(ops_all4 == kiln::kNumOps);
}

// Regression tests of the kiln bugs this suite found and that were fixed (each is also covered
// by the table-driven test above).
TEST_CASE("regressions: bugs found by the op-table conformance suite", "[conformance]") {
  using kiln::Tensor;
  SECTION("float64 log / log2 of denormals (xsimd)") {
    Tensor x = kiln::from_vector<double>({1e-310, 4.9e-324, 2e-308, 1.0}, {4});
    std::vector<double> l = kiln::log(x).to_vector<double>(), l2 = kiln::log2(x).to_vector<double>();
    std::vector<double> xs = x.to_vector<double>();
    for (size_t i = 0; i < xs.size(); ++i) {
      CHECK(std::fabs(l[i] - std::log(xs[i])) <= 1e-13 * std::fabs(std::log(xs[i])) + 1e-300);
      CHECK(std::fabs(l2[i] - std::log2(xs[i])) <= 1e-13 * std::fabs(std::log2(xs[i])) + 1e-300);
    }
  }
  SECTION("index_add / scatter_add on bool tensors") {
    Tensor x = kiln::from_vector<bool>({false, false, true}, {3});
    Tensor src = kiln::from_vector<bool>({true, true}, {2});
    Tensor idx = kiln::from_vector<int64_t>({0, 0}, {2});
    CHECK(kiln::index_add(x, 0, idx, src).to_vector<bool>() == std::vector<bool>{true, false, true});
    CHECK(kiln::scatter_add(x, 0, idx, src).to_vector<bool>() == std::vector<bool>{true, false, true});
  }
  SECTION("scatter_add: the gradient of src has src's shape when src is larger than index") {
    Tensor x = kiln::zeros({2, 3}, {DType::Float64});
    Tensor src = kiln::ones({2, 4}, {DType::Float64}).requires_grad_();
    Tensor idx = kiln::from_vector<int64_t>({2, 0, 1, 1}, {2, 2});
    kiln::scatter_add(x, 1, idx, src).sum().backward();
    REQUIRE(src.grad().defined());
    CHECK(src.grad().shape() == kiln::Shape({2, 4}));
    CHECK(src.grad().to_vector<double>() == std::vector<double>{1, 1, 0, 0, 1, 1, 0, 0});
  }
  SECTION("compiled backward: a strided slice, and a backward that passes the gradient through") {
    auto slice = kiln::compile([](const Tensor& x) { return x.slice(1, 1, 5, 2); });
    auto pass = kiln::compile([](const Tensor& x) {
      return kiln::dispatch::call1(kiln::OpCall{OpKind::Contiguous, {x}, {}, kiln::Loc::current()});
    });
    for (int call = 0; call < 3; ++call) {
      INFO("call " << call);
      Tensor x = kiln::ones({2, 6}, {DType::Float64}).requires_grad_();
      slice(x).backward(kiln::from_vector<double>({1, 2, 3, 4}, {2, 2}));
      CHECK(x.grad().to_vector<double>() == std::vector<double>{0, 1, 0, 2, 0, 0, 0, 3, 0, 4, 0, 0});
      Tensor z = kiln::ones({3}, {DType::Float64}).requires_grad_();
      Tensor y = pass(z);
      REQUIRE(y.requires_grad());
      y.backward(kiln::from_vector<double>({1, 2, 3}, {3}));
      CHECK(z.grad().to_vector<double>() == std::vector<double>{1, 2, 3});
    }
  }
  SECTION("shape / dtype errors name the op, the input dtypes and shapes") {
    try {
      kiln::matmul(kiln::ones({2, 3}), kiln::ones({4}, {DType::Float64}));
      FAIL("no error");
    } catch (const kiln::Error& e) {
      std::string m = e.what();
      CHECK(m.rfind("kiln::matmul:", 0) == 0);
      CHECK(m.find("float32 [2, 3]") != std::string::npos);
      CHECK(m.find("float64 [4]") != std::string::npos);
    }
  }
}
