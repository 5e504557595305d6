// Unary elementwise kernels (incl. clamp): each op is its formula from core/formulas.h run by
// the loop engine in elementwise.h.
#include <limits>

#include "backends/cpu/elementwise.h"
#include "backends/cpu/kernels.h"
#include "backends/cpu/reduce_simd.h"

namespace kiln::cpu {
namespace {

namespace fm = formulas;
using ew::Fn;

/// Ops that give floats (compute dtype float32/float64 only).
template <class F> void run_float(const Tensor& out, const Tensor& x, const F& f) {
  KILN_DISPATCH_FLOAT(out.dtype(), T, { ew::map<T, T, 1>(out, {&x}, f); });
}
/// A float op from its formula. SIMD transcendentals cost ~0.3-0.5 ns/element with AVX-512,
/// so they keep the default grain (measured: two threads lose below ~64K elements).
template <class Fm> void float_op(const Tensor& out, const Tensor& x) {
  run_float(out, x, Fn<Fm>{});
}
/// log / log2 safe for denormal inputs: xsimd's float64 log and log2 are off by up to 5 % for
/// denormals (found by tests/conformance), so inputs below the smallest normal double are
/// scaled by 2^54 first and 54·ln 2 (54) subtracted. float32 is unaffected (the threshold
/// converts to 0 there: only negatives take the branch, and their log is NaN either way).
template <class Fm, bool kIsLog2> struct DenormalSafeLog {
  template <class S> static S eval(S x) {
    using fm::select;
    auto small = x < S(std::numeric_limits<double>::min());
    S r = Fm::eval(select(small, x * S(18014398509481984.0), x));
    return select(small, r - S(kIsLog2 ? 54.0 : 37.429947750237046), r);
  }
};

/// Ops defined on every dtype; the output has the input's dtype.
template <class F> void run_any(const Tensor& out, const Tensor& x, const F& f) {
  KILN_DISPATCH_ALL(out.dtype(), T, { ew::map<T, T, 1>(out, {&x}, f); });
}

/// clamp with bounds in the compute type C (absent bounds are the type's extremes).
template <class C> struct ClampFn {
  static constexpr bool kSimd = true;
  static constexpr bool kExpensive = false;
  C low, high;
  template <class S> S operator()(S x) const { return fm::Clamp::eval(x, S(low), S(high)); }
};

// A bound converted to C; integer bounds saturate to C's range (x is inside it anyway).
template <class C> C bound(const Scalar& s, bool present, bool is_low) {
  using L = std::numeric_limits<C>;
  if (!present) {
    if constexpr (std::is_floating_point_v<C>)
      return is_low ? -L::infinity() : L::infinity();
    else
      return is_low ? L::lowest() : L::max();
  }
  if constexpr (std::is_integral_v<C>) {
    int64_t v = s.to<int64_t>();
    if (v < static_cast<int64_t>(L::lowest())) return L::lowest();
    if (v > static_cast<int64_t>(L::max())) return L::max();
    return static_cast<C>(v);
  } else {
    return s.to<C>();
  }
}

template <class T> void run_clamp(const Tensor& out, const Tensor& x, const OpAttrs& a) {
  using C = ew::ComputeOf<T>;
  ClampFn<C> f{bound<C>(a.alpha, a.has_low, true), bound<C>(a.beta, a.has_high, false)};
  ew::map<T, T, 1>(out, {&x}, f);
}

}  // namespace

void unary_kernel(const OpCall& call, const InferredMeta& meta, std::span<Tensor> outs) {
  const Tensor& x = call.inputs[0];
  const Tensor& out = outs[0];
  if (out.numel() == 0) return;
  switch (call.op) {
    case OpKind::Neg: return run_any(out, x, Fn<fm::Neg>{});
    case OpKind::Abs: return run_any(out, x, Fn<fm::Abs>{});
    case OpKind::Sign: return run_any(out, x, Fn<fm::Sign>{});
    case OpKind::Relu: return run_any(out, x, Fn<fm::Relu>{});
    case OpKind::Floor: return run_any(out, x, Fn<fm::Floor>{});
    case OpKind::Ceil: return run_any(out, x, Fn<fm::Ceil>{});
    case OpKind::Round: return run_any(out, x, Fn<fm::Round>{});
    case OpKind::Trunc: return run_any(out, x, Fn<fm::Trunc>{});
    case OpKind::Exp: return float_op<fm::Exp>(out, x);
    case OpKind::Exp2: return float_op<fm::Exp2>(out, x);
    case OpKind::Log: return float_op<DenormalSafeLog<fm::Log, false>>(out, x);
    case OpKind::Log2: return float_op<DenormalSafeLog<fm::Log2, true>>(out, x);
    case OpKind::Log1p: return float_op<fm::Log1p>(out, x);
    case OpKind::Expm1: return float_op<fm::Expm1>(out, x);
    case OpKind::Sqrt: return float_op<fm::Sqrt>(out, x);
    case OpKind::Rsqrt: return float_op<fm::Rsqrt>(out, x);
    case OpKind::Reciprocal: return float_op<fm::Reciprocal>(out, x);
    case OpKind::Sin: return float_op<fm::Sin>(out, x);
    case OpKind::Cos: return float_op<fm::Cos>(out, x);
    case OpKind::Tan: return float_op<fm::Tan>(out, x);
    case OpKind::Tanh: return float_op<fm::Tanh>(out, x);
    case OpKind::Sigmoid: return float_op<fm::Sigmoid>(out, x);
    case OpKind::Silu: return float_op<fm::Silu>(out, x);
    case OpKind::Erf: return float_op<fm::Erf>(out, x);
    case OpKind::Gelu:
      if (call.attrs.mode == 1) return float_op<fm::GeluTanh>(out, x);
      return float_op<fm::GeluErf>(out, x);
    case OpKind::LogicalNot:
      KILN_DISPATCH_ALL(x.dtype(), T, { ew::map<bool, T, 1>(out, {&x}, Fn<fm::LogicalNot>{}); });
      return;
    case OpKind::Clamp:
      KILN_DISPATCH_ALL(out.dtype(), T, { run_clamp<T>(out, x, call.attrs); });
      return;
    default: throw Error(call.name(), "is not a unary elementwise op of the cpu backend", call.loc);
  }
}

Tensor gelu_backward(const Tensor& x, const Tensor& g, int approximate) {
  Tensor out = simd::empty_cpu(g.shape(), g.dtype());
  KILN_DISPATCH_FLOAT(g.dtype(), T, {
    if (approximate == 1)
      ew::map<T, T, 2>(out, {&x, &g}, Fn<fm::GeluTanhBackward>{});
    else
      ew::map<T, T, 2>(out, {&x, &g}, Fn<fm::GeluErfBackward>{});
  });
  return out;
}

}  // namespace kiln::cpu
