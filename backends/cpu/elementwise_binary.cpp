// Binary elementwise kernels and where: each op is its formula from core/formulas.h run by the
// loop engine in elementwise.h. Integer division, remainder and power flag bad divisors /
// exponents inside the loop and throw after it (never inside the parallel region).
#include <atomic>
#include <limits>

#include "backends/cpu/elementwise.h"
#include "backends/cpu/kernels.h"

namespace kiln::cpu {
namespace {

namespace fm = formulas;
using ew::Fn;

template <class F> void run_any(const Tensor& out, const Tensor& a, const Tensor& b, const F& f) {
  KILN_DISPATCH_ALL(out.dtype(), T, { ew::map<T, T, 2>(out, {&a, &b}, f); });
}
template <class F> void run_float(const Tensor& out, const Tensor& a, const Tensor& b, const F& f) {
  KILN_DISPATCH_FLOAT(out.dtype(), T, { ew::map<T, T, 2>(out, {&a, &b}, f); });
}
/// Comparisons and logical ops: inputs in the compute dtype, bool output.
template <class Fm> void run_to_bool(const Tensor& out, const Tensor& a, const Tensor& b) {
  KILN_DISPATCH_ALL(a.dtype(), T, { ew::map<bool, T, 2>(out, {&a, &b}, Fn<Fm, false>{}); });
}

/// add/sub with alpha ≠ 1.
template <class Fm, class C> struct AlphaFn {
  static constexpr bool kSimd = true;
  static constexpr bool kExpensive = false;
  C alpha;
  template <class S> S operator()(S a, S b) const { return Fm::eval(a, b, S(alpha)); }
};

template <class Fm>
void run_add_sub(const OpCall& call, const Tensor& out, const Tensor& a, const Tensor& b) {
  const Scalar& alpha = call.attrs.alpha;  // checked against the dtype in core/meta.cpp
  bool one = alpha.is_floating() ? alpha.to<double>() == 1.0 : alpha.to<int64_t>() == 1;
  if (one) return run_any(out, a, b, Fn<Fm>{});
  KILN_DISPATCH_ALL(out.dtype(), T, {
    using C = ew::ComputeOf<T>;
    ew::map<T, T, 2>(out, {&a, &b}, AlphaFn<Fm, C>{alpha.to<C>()});
  });
}

/// SIMD atan2 / pow (libmvec) and fmod (exact) where built (backends/cpu/simd_exp.h); else
/// scalar libm, ~10 ns/element: a smaller grain.
constexpr bool kVecAtan2Pow = fm::VecMath<xsimd::batch<float>>::kAtan2Pow;
constexpr bool kVecFmod = fm::VecMath<xsimd::batch<float>>::kFmod;

/// Integer floor_divide / remainder: flags a zero divisor (the formula returns 0 for it).
template <class Fm> struct IntDivFn {
  static constexpr bool kSimd = false;
  static constexpr bool kExpensive = false;
  std::atomic<bool>* zero;
  template <class S> S operator()(S a, S b) const {
    if (b == S(0)) [[unlikely]]
      zero->store(true, std::memory_order_relaxed);
    return Fm::eval(a, b);
  }
};

template <class Fm>
void run_divide(const OpCall& call, const Tensor& out, const Tensor& a, const Tensor& b) {
  // Floats: an exact fmod (xsimd's is not): SIMD with a fused multiply-add, else libm's.
  if (is_floating(out.dtype())) return run_float(out, a, b, Fn<Fm, kVecFmod, !kVecFmod>{});
  std::atomic<bool> zero{false};
  KILN_DISPATCH_NUMERIC(out.dtype(), T, { ew::map<T, T, 2>(out, {&a, &b}, IntDivFn<Fm>{&zero}); });
  KILN_CHECK(!zero.load(), call.name(), call.loc,
             "integer division by zero: the divisor ({}, shape {}) contains 0", name(b.dtype()),
             to_string(b.shape()));
}

/// Integer pow: flags 0 raised to a negative power.
struct IntPowFn {
  static constexpr bool kSimd = false;
  static constexpr bool kExpensive = false;
  std::atomic<bool>* bad;
  std::atomic<int64_t>* exponent;
  template <class S> S operator()(S a, S b) const {
    if (a == S(0) && b < S(0)) [[unlikely]] {
      bad->store(true, std::memory_order_relaxed);
      exponent->store(b, std::memory_order_relaxed);
    }
    return fm::Pow::eval(a, b);
  }
};

// pow(x, e) for a single float exponent with a cheaper exact-enough formula.
struct PowSquare {
  static constexpr bool kSimd = true, kExpensive = false;
  template <class S> S operator()(S x) const { return fm::Mul::eval(x, x); }
};
struct PowCube {
  static constexpr bool kSimd = true, kExpensive = false;
  template <class S> S operator()(S x) const { return fm::Mul::eval(fm::Mul::eval(x, x), x); }
};
struct PowHalf {  // pow(x, 0.5): sqrt, but pow(-0, .5) = +0 and pow(-inf, .5) = +inf
  static constexpr bool kSimd = true, kExpensive = false;
  template <class S> S operator()(S x) const {
    using fm::select;
    return select(x == S(-std::numeric_limits<double>::infinity()),
                  S(std::numeric_limits<double>::infinity()), fm::Sqrt::eval(x) + S(0));
  }
};

template <class T> bool pow_fast_path(const Tensor& out, const Tensor& a, const Tensor& b) {
  if (b.numel() != 1) return false;
  T e = *static_cast<const T*>(b.raw_data());
  if (e == T(2))
    ew::map<T, T, 1>(out, {&a}, PowSquare{});
  else if (e == T(3))
    ew::map<T, T, 1>(out, {&a}, PowCube{});
  else if (e == T(0.5))
    ew::map<T, T, 1>(out, {&a}, PowHalf{});
  else if (e == T(-1))
    ew::map<T, T, 1>(out, {&a}, Fn<fm::Reciprocal>{});
  else
    return false;
  return true;
}

void run_pow(const OpCall& call, const Tensor& out, const Tensor& a, const Tensor& b) {
  if (is_floating(out.dtype())) {
    KILN_DISPATCH_FLOAT(out.dtype(), T, {
      if (!pow_fast_path<T>(out, a, b))
        ew::map<T, T, 2>(out, {&a, &b}, Fn<fm::Pow, kVecAtan2Pow, !kVecAtan2Pow>{});
    });
    return;
  }
  std::atomic<bool> bad{false};
  std::atomic<int64_t> exponent{0};
  KILN_DISPATCH_ALL(out.dtype(), T, {
    if constexpr (!std::is_floating_point_v<T>)
      ew::map<T, T, 2>(out, {&a, &b}, IntPowFn{&bad, &exponent});
  });
  KILN_CHECK(!bad.load(), call.name(), call.loc,
             "integer 0 cannot be raised to a negative power ({}); convert to float for inf",
             exponent.load());
}

}  // namespace

void binary_kernel(const OpCall& call, const InferredMeta& meta, std::span<Tensor> outs) {
  const Tensor& a = call.inputs[0];
  const Tensor& b = call.inputs[1];
  const Tensor& out = outs[0];
  if (out.numel() == 0) return;
  switch (call.op) {
    case OpKind::Add: return run_add_sub<fm::Add>(call, out, a, b);
    case OpKind::Sub: return run_add_sub<fm::Sub>(call, out, a, b);
    case OpKind::Mul: return run_any(out, a, b, Fn<fm::Mul>{});
    case OpKind::Div: return run_float(out, a, b, Fn<fm::Div>{});
    case OpKind::FloorDivide: return run_divide<fm::FloorDivide>(call, out, a, b);
    case OpKind::Remainder: return run_divide<fm::Remainder>(call, out, a, b);
    case OpKind::Pow: return run_pow(call, out, a, b);
    case OpKind::Maximum: return run_any(out, a, b, Fn<fm::Maximum>{});
    case OpKind::Minimum: return run_any(out, a, b, Fn<fm::Minimum>{});
    // Never xsimd 8.1's atan2: it returns nan for (±0, ±0) and (±inf, ±inf).
    case OpKind::Atan2:
      return run_float(out, a, b, Fn<fm::Atan2, kVecAtan2Pow, !kVecAtan2Pow>{});
    case OpKind::Eq: return run_to_bool<fm::Eq>(out, a, b);
    case OpKind::Ne: return run_to_bool<fm::Ne>(out, a, b);
    case OpKind::Lt: return run_to_bool<fm::Lt>(out, a, b);
    case OpKind::Le: return run_to_bool<fm::Le>(out, a, b);
    case OpKind::Gt: return run_to_bool<fm::Gt>(out, a, b);
    case OpKind::Ge: return run_to_bool<fm::Ge>(out, a, b);
    case OpKind::LogicalAnd: return run_to_bool<fm::LogicalAnd>(out, a, b);
    case OpKind::LogicalOr: return run_to_bool<fm::LogicalOr>(out, a, b);
    case OpKind::LogicalXor: return run_to_bool<fm::LogicalXor>(out, a, b);
    default:
      throw Error(call.name(), "is not a binary elementwise op of the cpu backend", call.loc);
  }
}

namespace {

struct WhereFn {
  template <class C, class S> S operator()(C cond, S a, S b) const {
    return fm::Where::eval(cond != 0, a, b);
  }
};

template <class T>
void run_where(const Tensor& out, const Tensor& c, const Tensor& a, const Tensor& b) {
  using ew::In;
  using ew::ScalarSrc;
  StridedLoop<4> loop(out.shape(), {&out, &c, &a, &b});
  if (loop.numel() == 0) return;
  int64_t so = loop.inner_stride(0), sc = loop.inner_stride(1), sa = loop.inner_stride(2),
          sb = loop.inner_stride(3);
  constexpr int64_t t = sizeof(T);
  WhereFn f;
  auto body = [&](const std::array<char*, 4>& p, int64_t n) {
    if (so == t && sc == 1) {
      T* o = reinterpret_cast<T*>(p[0]);
      ScalarSrc<bool, In::Contig> cs(p[1], 1);
      if (sa == t && sb == t)
        return ew::scalar_loop<T>(o, n, f, cs, ScalarSrc<T, In::Contig>(p[2], t),
                                  ScalarSrc<T, In::Contig>(p[3], t));
      if (sa == t && sb == 0)
        return ew::scalar_loop<T>(o, n, f, cs, ScalarSrc<T, In::Contig>(p[2], t),
                                  ScalarSrc<T, In::Bcast>(p[3], 0));
      if (sa == 0 && sb == t)
        return ew::scalar_loop<T>(o, n, f, cs, ScalarSrc<T, In::Bcast>(p[2], 0),
                                  ScalarSrc<T, In::Contig>(p[3], t));
      // where(mask, 1.0, 0.0): both values broadcast; took the strided loop below at 32x
      // the time of mask.to(float) (a performance pass).
      if (sa == 0 && sb == 0)
        return ew::scalar_loop<T>(o, n, f, cs, ScalarSrc<T, In::Bcast>(p[2], 0),
                                  ScalarSrc<T, In::Bcast>(p[3], 0));
    }
    ew::scalar_loop_scatter<T>(p[0], so, n, f, ScalarSrc<bool, In::Strided>(p[1], sc),
                               ScalarSrc<T, In::Strided>(p[2], sa),
                               ScalarSrc<T, In::Strided>(p[3], sb));
  };
  if (loop.numel() < 2 * kGrainSize)
    loop.run(0, loop.numel(), body);
  else
    loop.parallel_run(body);
}

}  // namespace

void where_kernel(const OpCall& call, const InferredMeta& meta, std::span<Tensor> outs) {
  const Tensor& out = outs[0];
  if (out.numel() == 0) return;
  KILN_DISPATCH_ALL(out.dtype(), T,
                    { run_where<T>(out, call.inputs[0], call.inputs[1], call.inputs[2]); });
}

}  // namespace kiln::cpu
