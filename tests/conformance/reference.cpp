// The independent references of tests/conformance (see reference.h): plain C++ in double, exact
// 64-bit integers, naive loops, explicit index logic. No kiln kernel is called.
#include "reference.h"

#include <algorithm>
#include <cmath>

namespace conf {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

// ---------------------------------- elementwise ----------------------------------

double fmax_nan(double x, double y) { return std::isnan(x) || std::isnan(y) ? kNaN : std::max(x, y); }
double fmin_nan(double x, double y) { return std::isnan(x) || std::isnan(y) ? kNaN : std::min(x, y); }

/// Float math of an elementwise op in double; `known` is cleared for ops without one.
double float_fn(OpKind k, const std::vector<double>& v, const OpAttrs& a, bool& known) {
  double x = v[0], y = v.size() > 1 ? v[1] : 0.0;
  switch (k) {
    case OpKind::Neg: return -x;
    case OpKind::Abs: return std::fabs(x);
    case OpKind::Sign: return std::isnan(x) ? x : x > 0 ? 1.0 : x < 0 ? -1.0 : 0.0;
    case OpKind::Exp: return std::exp(x);
    case OpKind::Exp2: return std::exp2(x);
    case OpKind::Log: return std::log(x);
    case OpKind::Log2: return std::log2(x);
    case OpKind::Log1p: return std::log1p(x);
    case OpKind::Expm1: return std::expm1(x);
    case OpKind::Sqrt: return std::sqrt(x);
    case OpKind::Rsqrt: return 1.0 / std::sqrt(x);
    case OpKind::Reciprocal: return 1.0 / x;
    case OpKind::Sin: return std::sin(x);
    case OpKind::Cos: return std::cos(x);
    case OpKind::Tan: return std::tan(x);
    case OpKind::Tanh: return std::tanh(x);
    case OpKind::Sigmoid: return 1.0 / (1.0 + std::exp(-x));
    case OpKind::Relu: return std::isnan(x) ? x : x > 0 ? x : 0.0;
    case OpKind::Gelu:
      if (a.mode == 1) {
        double inner = std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x);
        return 0.5 * x * (1.0 + std::tanh(inner));
      }
      return 0.5 * x * std::erfc(-x / std::sqrt(2.0));  // = 0.5x(1 + erf(x/√2)), no cancellation
    case OpKind::Silu: return x / (1.0 + std::exp(-x));
    case OpKind::Erf: return std::erf(x);
    case OpKind::Floor: return std::floor(x);
    case OpKind::Ceil: return std::ceil(x);
    case OpKind::Round: return std::nearbyint(x);  // default rounding mode: half to even
    case OpKind::Trunc: return std::trunc(x);
    case OpKind::LogicalNot: return x == 0 ? 1.0 : 0.0;
    case OpKind::Clamp: {
      if (std::isnan(x)) return x;
      double r = x;
      if (a.has_low) r = std::max(r, a.alpha.to<double>());
      if (a.has_high) r = std::min(r, a.beta.to<double>());
      return r;
    }
    case OpKind::Add: return x + a.alpha.to<double>() * y;
    case OpKind::Sub: return x - a.alpha.to<double>() * y;
    case OpKind::Mul: return x * y;
    case OpKind::Div: return x / y;
    case OpKind::FloorDivide: {  // Python's float //: inf // 2 is nan, -0.0 keeps its sign
      if (y == 0) return x / y;
      double mod = std::fmod(x, y), div = (x - mod) / y;
      if (mod != 0 && ((y < 0) != (mod < 0))) div -= 1;
      if (div == 0) return std::copysign(0.0, x / y);
      double fl = std::floor(div);
      return div - fl > 0.5 ? fl + 1 : fl;
    }
    case OpKind::Remainder: {
      if (y == 0) return kNaN;
      double r = std::fmod(x, y);
      if (r != 0 && ((r < 0) != (y < 0))) r += y;
      return r;
    }
    case OpKind::Pow: return std::pow(x, y);
    case OpKind::Maximum: return fmax_nan(x, y);
    case OpKind::Minimum: return fmin_nan(x, y);
    case OpKind::Atan2: return std::atan2(x, y);
    case OpKind::Eq: return x == y;
    case OpKind::Ne: return x != y;
    case OpKind::Lt: return x < y;
    case OpKind::Le: return x <= y;
    case OpKind::Gt: return x > y;
    case OpKind::Ge: return x >= y;
    case OpKind::LogicalAnd: return (x != 0) && (y != 0);
    case OpKind::LogicalOr: return (x != 0) || (y != 0);
    case OpKind::LogicalXor: return (x != 0) != (y != 0);
    default: known = false; return 0;
  }
}

/// Integer math (64-bit, wrapping); `raise` set for integer division by zero / 0 ** negative.
uint64_t int_fn(OpKind k, const std::vector<int64_t>& v, const OpAttrs& a, bool& known,
                std::string& raise) {
  int64_t x = v[0], y = v.size() > 1 ? v[1] : 0;
  uint64_t ux = static_cast<uint64_t>(x), uy = static_cast<uint64_t>(y);
  switch (k) {
    case OpKind::Neg: return 0 - ux;
    case OpKind::Abs: return x < 0 ? 0 - ux : ux;
    case OpKind::Sign: return static_cast<uint64_t>((x > 0) - (x < 0));
    case OpKind::Relu: return x > 0 ? ux : 0;
    case OpKind::Floor: case OpKind::Ceil: case OpKind::Round: case OpKind::Trunc: return ux;
    case OpKind::LogicalNot: return x == 0;
    case OpKind::Clamp: {
      int64_t r = x;
      if (a.has_low) r = std::max(r, a.alpha.to<int64_t>());
      if (a.has_high) r = std::min(r, a.beta.to<int64_t>());
      return static_cast<uint64_t>(r);
    }
    case OpKind::Add: return ux + static_cast<uint64_t>(a.alpha.to<int64_t>()) * uy;
    case OpKind::Sub: return ux - static_cast<uint64_t>(a.alpha.to<int64_t>()) * uy;
    case OpKind::Mul: return ux * uy;
    case OpKind::FloorDivide: {
      if (y == 0) { raise = "integer division by zero"; return 0; }
      if (y == -1) return 0 - ux;
      int64_t q = x / y;
      if (x % y != 0 && ((x < 0) != (y < 0))) --q;
      return static_cast<uint64_t>(q);
    }
    case OpKind::Remainder: {
      if (y == 0) { raise = "integer remainder by zero"; return 0; }
      if (y == -1) return 0;
      int64_t r = x % y;
      if (r != 0 && ((r < 0) != (y < 0))) r += y;
      return static_cast<uint64_t>(r);
    }
    case OpKind::Pow: {
      if (y < 0) {
        if (x == 0) { raise = "0 raised to a negative power"; return 0; }
        if (x == 1) return 1;
        if (x == -1) return (y % 2 == 0) ? 1 : static_cast<uint64_t>(-1);
        return 0;
      }
      uint64_t r = 1, b = ux;
      for (uint64_t e = uy; e; e >>= 1, b *= b)
        if (e & 1) r *= b;
      return r;
    }
    case OpKind::Maximum: return static_cast<uint64_t>(std::max(x, y));
    case OpKind::Minimum: return static_cast<uint64_t>(std::min(x, y));
    case OpKind::Eq: return x == y;
    case OpKind::Ne: return x != y;
    case OpKind::Lt: return x < y;
    case OpKind::Le: return x <= y;
    case OpKind::Gt: return x > y;
    case OpKind::Ge: return x >= y;
    case OpKind::LogicalAnd: return (x != 0) && (y != 0);
    case OpKind::LogicalOr: return (x != 0) || (y != 0);
    case OpKind::LogicalXor: return (x != 0) != (y != 0);
    default: known = false; return 0;
  }
}

Tol elementwise_tol(OpKind k, const OpAttrs& a) {
  switch (k) {
    case OpKind::Exp: case OpKind::Exp2: case OpKind::Log: case OpKind::Log2:
    case OpKind::Log1p: case OpKind::Expm1: case OpKind::Rsqrt: case OpKind::Sin:
    case OpKind::Cos: case OpKind::Tan: case OpKind::Tanh: case OpKind::Sigmoid:
    case OpKind::Gelu: case OpKind::Silu: case OpKind::Erf: case OpKind::Pow:
    case OpKind::Atan2:
      return Tol::Approx;
    case OpKind::Add: case OpKind::Sub:  // a + alpha * b rounds alpha * b first
      return a.alpha.to<double>() == 1.0 ? Tol::Exact : Tol::Approx;
    default: return Tol::Exact;
  }
}

Ref elementwise(OpKind k, const std::vector<Arr>& in, const OpAttrs& a) {
  const kiln::OpInfo& info = kiln::op_info(k);
  std::vector<Ix> shapes;
  for (const Arr& x : in) shapes.push_back(x.shape);
  Ix out;
  if (!broadcast(shapes, out)) return raises("shapes do not broadcast");
  std::vector<Arr> vals = in;
  DType c;
  if (k == OpKind::Where) {
    if (in[0].dtype != DType::Bool) return raises("condition must be bool");
    vals = {in[1], in[2]};
    c = promote(vals);
  } else if (k == OpKind::Clamp) {
    std::vector<kiln::Scalar> s;
    if (a.has_low) s.push_back(a.alpha);
    if (a.has_high) s.push_back(a.beta);
    if (s.empty()) return raises("clamp without bounds");
    c = promote(in, s);
  } else {
    c = promote(in);
  }
  // PyTorch rejects subtraction with any bool operand, not only a bool result.
  if (k == OpKind::Sub && std::any_of(in.begin(), in.end(), [](const Arr& x) {
        return x.dtype == DType::Bool; }))
    return raises("bool operand");
  // PyTorch 1.13 has no bool kernel for these ("not implemented for 'Bool'").
  if (c == DType::Bool &&
      (k == OpKind::Neg || k == OpKind::Sign || k == OpKind::FloorDivide ||
       k == OpKind::Remainder || k == OpKind::Abs || k == OpKind::Relu || k == OpKind::Gelu ||
       k == OpKind::Silu || k == OpKind::Floor || k == OpKind::Ceil || k == OpKind::Round ||
       k == OpKind::Trunc || k == OpKind::Pow))
    return raises("not supported on bool");
  DType dt = c;
  if (info.dtype_rule == kiln::DTypeRule::ToFloat && !is_float(c)) dt = DType::Float32;
  if (info.dtype_rule == kiln::DTypeRule::ToBool) dt = DType::Bool;
  DType compute = info.dtype_rule == kiln::DTypeRule::ToBool ? c : dt;
  Ref r = result(out, dt, k == OpKind::Where ? Tol::Exact : elementwise_tol(k, a));
  if (k == OpKind::Gelu) r.tol = Tol::Accum, r.mag.assign(r.f.size(), 0.0);
  bool known = true;
  std::string raise;
  for_each_index(out, [&](const Ix& idx, int64_t j) {
    if (k == OpKind::Where) {
      bool cond = in[0].i[static_cast<size_t>(bcast_at(in[0], idx))] != 0;
      const Arr& src = cond ? in[1] : in[2];
      int64_t p = bcast_at(src, idx);
      if (is_float(dt)) set_f(r, j, as_float(src, p, dt));
      else set_i(r, j, static_cast<uint64_t>(as_int(src, p)));
      return;
    }
    if (is_float(compute)) {
      std::vector<double> v;
      for (const Arr& x : in) v.push_back(as_float(x, bcast_at(x, idx), compute));
      double y = float_fn(k, v, a, known);
      // gelu's 1 + erf / 1 + tanh cancels for x << 0: the error scales with |x|, not |y|.
      if (k == OpKind::Gelu) r.mag[static_cast<size_t>(j)] = std::fabs(y) + 1e-3 * std::fabs(v[0]);
      if (is_float(dt)) set_f(r, j, y);
      else set_i(r, j, y != 0);
    } else {
      std::vector<int64_t> v;
      for (const Arr& x : in) v.push_back(wrap_to(compute, static_cast<uint64_t>(as_int(x, bcast_at(x, idx)))));
      uint64_t y = int_fn(k, v, a, known, raise);
      if (is_float(dt)) set_f(r, j, static_cast<double>(static_cast<int64_t>(y)));
      else set_i(r, j, y);
    }
  });
  if (!known) return raises("no reference");
  if (!raise.empty()) return raises(raise);
  return r;
}

// ---------------------------------- reductions ----------------------------------

Ref reduction(OpKind k, const Arr& x, const OpAttrs& a) {
  int64_t rank = static_cast<int64_t>(x.shape.size());
  bool index = k == OpKind::Argmax || k == OpKind::Argmin;
  std::vector<bool> red(static_cast<size_t>(rank), false);
  bool flat_all = false;
  if (index) {
    if (x.dtype == DType::Bool) return raises("not supported on bool");
    if (a.all_dims) {
      flat_all = true;
      std::fill(red.begin(), red.end(), true);
    } else {
      int64_t d = wrap_dim(a.dim, std::max<int64_t>(rank, 1));
      if (d < 0 || d >= std::max<int64_t>(rank, 1)) return raises("dim out of range");
      if (rank) red[static_cast<size_t>(d)] = true;
    }
  } else if (a.all_dims || a.dims.empty()) {
    std::fill(red.begin(), red.end(), true);
  } else {
    for (int64_t d0 : a.dims) {
      int64_t d = wrap_dim(d0, std::max<int64_t>(rank, 1));
      if (d < 0 || d >= std::max<int64_t>(rank, 1)) return raises("dim out of range");
      if (rank) {
        if (red[static_cast<size_t>(d)]) return raises("dim repeated");
        red[static_cast<size_t>(d)] = true;
      }
    }
  }
  Ix out;
  for (int64_t d = 0; d < rank; ++d) {
    if (!red[static_cast<size_t>(d)]) out.push_back(x.shape[static_cast<size_t>(d)]);
    else if (a.keepdim) out.push_back(1);
  }
  int64_t group = 1;
  for (int64_t d = 0; d < rank; ++d)
    if (red[static_cast<size_t>(d)]) group *= x.shape[static_cast<size_t>(d)];
  bool fl = is_float(x.dtype);
  if ((k == OpKind::Mean || k == OpKind::Var || k == OpKind::Std) && !fl)
    return raises("needs a floating dtype");
  if ((k == OpKind::Amax || k == OpKind::Amin || index) && group == 0)
    return raises("empty reduction without identity");
  // Members of each output element, in row-major order of the input.
  int64_t nout = numel(out);
  std::vector<std::vector<int64_t>> members(static_cast<size_t>(nout));
  for_each_index(x.shape, [&](const Ix& idx, int64_t j) {
    int64_t o = 0;
    size_t od = 0;
    for (int64_t d = 0; d < rank; ++d) {
      if (!red[static_cast<size_t>(d)]) o = o * out[od] + idx[static_cast<size_t>(d)], ++od;
      else if (a.keepdim) ++od;  // size 1: contributes 0
    }
    members[static_cast<size_t>(o)].push_back(j);
  });
  if (rank == 0) members.assign(1, {0});
  DType dt;
  switch (k) {
    case OpKind::Sum: case OpKind::Prod: dt = fl ? x.dtype : DType::Int64; break;
    case OpKind::LogSumExp: dt = fl ? x.dtype : DType::Float32; break;
    case OpKind::All: case OpKind::Any: dt = DType::Bool; break;
    case OpKind::Argmax: case OpKind::Argmin: dt = DType::Int64; break;
    default: dt = x.dtype;
  }
  Tol tol = (k == OpKind::Sum || k == OpKind::Mean || k == OpKind::Prod || k == OpKind::Var ||
             k == OpKind::Std || k == OpKind::LogSumExp) ? Tol::Accum : Tol::Exact;
  Ref r = result(out, dt, tol);
  if (tol == Tol::Accum) r.mag.assign(static_cast<size_t>(nout), 0.0);
  for (int64_t o = 0; o < nout; ++o) {
    const auto& m = members[static_cast<size_t>(o)];
    double n = static_cast<double>(m.size());
    auto fv = [&](int64_t j) { return x.f[static_cast<size_t>(j)]; };
    auto iv = [&](int64_t j) { return as_int(x, j); };
    switch (k) {
      case OpKind::Sum:
      case OpKind::Mean: {
        if (!fl) {
          uint64_t s = 0;
          for (int64_t j : m) s += static_cast<uint64_t>(iv(j));
          set_i(r, o, s);
          break;
        }
        double s = 0, mg = 0;
        for (int64_t j : m) s += fv(j), mg += std::fabs(fv(j));
        if (k == OpKind::Mean) s /= n, mg /= n;
        set_f(r, o, s);
        r.mag[static_cast<size_t>(o)] = mg;
        break;
      }
      case OpKind::Prod: {
        if (!fl) {
          uint64_t p = 1;
          for (int64_t j : m) p *= static_cast<uint64_t>(iv(j));
          set_i(r, o, p);
          break;
        }
        double p = 1;
        for (int64_t j : m) p *= fv(j);
        set_f(r, o, p);
        r.mag[static_cast<size_t>(o)] = std::fabs(p) * std::max(1.0, n);
        break;
      }
      case OpKind::Amax:
      case OpKind::Amin: {
        bool mx = k == OpKind::Amax;
        if (!fl) {
          int64_t b = iv(m[0]);
          for (int64_t j : m) b = mx ? std::max(b, iv(j)) : std::min(b, iv(j));
          set_i(r, o, static_cast<uint64_t>(b));
          break;
        }
        double b = fv(m[0]);
        for (int64_t j : m) b = mx ? fmax_nan(b, fv(j)) : fmin_nan(b, fv(j));
        set_f(r, o, b);
        break;
      }
      case OpKind::Var:
      case OpKind::Std: {
        double s = 0;
        for (int64_t j : m) s += fv(j);
        double mean = s / n, ss = 0, sq = 0;
        for (int64_t j : m) ss += (fv(j) - mean) * (fv(j) - mean), sq += fv(j) * fv(j);
        double denom = n - static_cast<double>(a.mode);
        double v = ss / std::max(denom, 0.0);  // inf, or NaN for a constant row (PyTorch)
        double mg = denom <= 0 ? 0 : sq / denom;
        set_f(r, o, k == OpKind::Var ? v : std::sqrt(v));
        r.mag[static_cast<size_t>(o)] = k == OpKind::Var ? mg : std::sqrt(mg);
        break;
      }
      case OpKind::LogSumExp: {
        double mx = -kInf;
        bool nan = false;
        for (int64_t j : m) nan |= std::isnan(fv(j)), mx = std::max(mx, fv(j));
        double v;
        if (nan) v = kNaN;
        else if (std::isinf(mx)) v = mx;
        else {
          double s = 0;
          for (int64_t j : m) s += std::exp(fv(j) - mx);
          v = mx + std::log(s);
        }
        set_f(r, o, v);
        r.mag[static_cast<size_t>(o)] = std::fabs(mx) + std::fabs(v) + 1;
        break;
      }
      case OpKind::All:
      case OpKind::Any: {
        bool all = true, any = false;
        for (int64_t j : m) {
          bool t = fv(j) != 0;
          all &= t, any |= t;
        }
        set_i(r, o, k == OpKind::All ? all : any);
        break;
      }
      case OpKind::Argmax:
      case OpKind::Argmin: {
        bool mx = k == OpKind::Argmax;
        size_t best = 0;
        for (size_t q = 1; q < m.size(); ++q) {
          double b = fv(m[best]), c = fv(m[q]);
          if (!fl) {
            int64_t bi = iv(m[best]), ci = iv(m[q]);
            if (mx ? ci > bi : ci < bi) best = q;
            continue;
          }
          if (std::isnan(b)) break;
          if (std::isnan(c) || (mx ? c > b : c < b)) best = q;
        }
        // The index along the reduced dim (flat index when all dims are reduced).
        int64_t pos = static_cast<int64_t>(best);
        (void)flat_all;
        set_i(r, o, static_cast<uint64_t>(pos));
        break;
      }
      default: return raises("no reference");
    }
  }
  return r;
}

// ------------------------------- softmax / layer_norm -------------------------------

Ref normalization(OpKind k, const std::vector<Tensor>& inputs, const OpAttrs& a) {
  Arr x = read(inputs[0]);
  int64_t rank = static_cast<int64_t>(x.shape.size());
  DType dt = is_float(x.dtype) ? x.dtype : DType::Float32;
  if (x.dtype == DType::Bool) return raises("not supported on bool");
  if (k == OpKind::LayerNorm) {
    Ix ns(a.dims.begin(), a.dims.end());
    if (!is_float(x.dtype)) return raises("input must be floating point");
    if (ns.empty() || ns.size() > x.shape.size()) return raises("normalized_shape rank");
    for (size_t q = 0; q < ns.size(); ++q)
      if (x.shape[x.shape.size() - ns.size() + q] != ns[q]) return raises("normalized_shape mismatch");
    Arr w, b;
    bool hw = inputs.size() > 1 && inputs[1].defined(), hb = inputs.size() > 2 && inputs[2].defined();
    if (hw) { w = read(inputs[1]); if (w.shape != ns) return raises("weight shape"); }
    if (hb) { b = read(inputs[2]); if (b.shape != ns) return raises("bias shape"); }
    Ref r = result(x.shape, dt, Tol::Accum);
    r.mag.assign(r.f.size(), 0.0);
    int64_t g = numel(ns), groups = g ? x.numel() / g : 0;
    for (int64_t q = 0; q < groups; ++q) {
      double s = 0;
      for (int64_t e = 0; e < g; ++e) s += x.f[static_cast<size_t>(q * g + e)];
      double mean = s / static_cast<double>(g), v = 0;
      for (int64_t e = 0; e < g; ++e) {
        double d = x.f[static_cast<size_t>(q * g + e)] - mean;
        v += d * d;
      }
      v /= static_cast<double>(g);
      double inv = 1.0 / std::sqrt(v + a.eps);
      for (int64_t e = 0; e < g; ++e) {
        size_t j = static_cast<size_t>(q * g + e);
        double xh = (x.f[j] - mean) * inv;
        double wv = hw ? w.f[static_cast<size_t>(e)] : 1.0, bv = hb ? b.f[static_cast<size_t>(e)] : 0.0;
        set_f(r, static_cast<int64_t>(j), xh * wv + bv);
        r.mag[j] = (std::fabs(xh) + 1) * std::fabs(wv) + std::fabs(bv);
      }
    }
    return r;
  }
  int64_t d = wrap_dim(a.dim, std::max<int64_t>(rank, 1));
  if (d < 0 || d >= std::max<int64_t>(rank, 1)) return raises("dim out of range");
  // softmax: relative (Approx); log_softmax = x − m − log s cancels: error ~ eps·(|x − m| + log s + 1).
  Ref r = result(x.shape, dt, k == OpKind::Softmax ? Tol::Approx : Tol::Accum);
  if (k == OpKind::LogSoftmax) r.mag.assign(r.f.size(), 1.0);
  if (rank == 0) {
    set_f(r, 0, k == OpKind::Softmax ? 1.0 : 0.0);
    if (std::isnan(x.f[0]) || std::isinf(x.f[0])) set_f(r, 0, kNaN);
    return r;
  }
  int64_t n = x.shape[static_cast<size_t>(d)], inner = 1;
  for (int64_t q = d + 1; q < rank; ++q) inner *= x.shape[static_cast<size_t>(q)];
  int64_t outer = n * inner ? x.numel() / (n * inner) : 0;
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t in = 0; in < inner; ++in) {
      auto at = [&](int64_t e) { return static_cast<size_t>((o * n + e) * inner + in); };
      double mx = -kInf;
      for (int64_t e = 0; e < n; ++e) mx = std::max(mx, round_to(dt, x.f[at(e)]));
      double s = 0;
      for (int64_t e = 0; e < n; ++e) s += std::exp(round_to(dt, x.f[at(e)]) - mx);
      for (int64_t e = 0; e < n; ++e) {
        double xv = round_to(dt, x.f[at(e)]);
        set_f(r, static_cast<int64_t>(at(e)),
              k == OpKind::Softmax ? std::exp(xv - mx) / s : xv - mx - std::log(s));
        if (k == OpKind::LogSoftmax && std::isfinite(xv - mx)) r.mag[at(e)] = std::fabs(xv - mx) + std::log(s) + 1;
      }
    }
  return r;
}

// ---------------------------------- matmul ----------------------------------

Ref matmul(OpKind k, const std::vector<Tensor>& inputs, const OpAttrs& a) {
  bool addmm = k == OpKind::Addmm;
  Arr A = read(inputs[addmm ? 1 : 0]), B = read(inputs[addmm ? 2 : 1]);
  std::vector<Arr> all = {A, B};
  Arr bias;
  if (addmm) bias = read(inputs[0]), all.push_back(bias);
  DType dt = promote(all);
  if (dt == DType::Bool) return raises("not supported on bool");
  if (A.shape.empty() || B.shape.empty()) return raises("0-d operand");
  if (addmm && (A.shape.size() != 2 || B.shape.size() != 2)) return raises("addmm needs 2-D");
  Ix as = A.shape, bs = B.shape;
  bool a1 = as.size() == 1, b1 = bs.size() == 1;
  if (a1) as.insert(as.begin(), 1);
  if (b1) bs.push_back(1);
  int64_t M = as[as.size() - 2], K = as.back(), K2 = bs[bs.size() - 2], N = bs.back();
  if (K != K2) return raises("inner dims differ");
  Ix ab(as.begin(), as.end() - 2), bb(bs.begin(), bs.end() - 2), batch;
  if (!broadcast({ab, bb}, batch)) return raises("batch dims do not broadcast");
  Ix out = batch;
  if (!a1) out.push_back(M);
  if (!b1) out.push_back(N);
  Ix full = batch;
  full.push_back(M);
  full.push_back(N);
  if (addmm) {
    Ix bo;
    if (!broadcast({bias.shape, out}, bo) || bo != out) return raises("bias does not broadcast");
  }
  Ref r = result(out, dt, Tol::Accum);
  r.mag.assign(static_cast<size_t>(numel(out)), 0.0);
  Arr Ab = A, Bb = B;
  Ab.shape = as, Bb.shape = bs;
  bool fl = is_float(dt);
  double alpha = a.alpha.to<double>(), beta = a.beta.to<double>();
  for_each_index(full, [&](const Ix& idx, int64_t j) {
    Ix ai(idx.begin(), idx.end() - 2), bi = ai;
    double s = 0, mg = 0;
    uint64_t si = 0;
    for (int64_t q = 0; q < K; ++q) {
      Ix ia = ai, ib = bi;
      ia.push_back(idx[idx.size() - 2]), ia.push_back(q);
      ib.push_back(q), ib.push_back(idx.back());
      int64_t pa = bcast_at(Ab, ia), pb = bcast_at(Bb, ib);
      if (fl) {
        double x = round_to(dt, A.f[static_cast<size_t>(pa)]), y = round_to(dt, B.f[static_cast<size_t>(pb)]);
        s += x * y, mg += std::fabs(x * y);
      } else {
        si += static_cast<uint64_t>(wrap_to(dt, static_cast<uint64_t>(as_int(A, pa)))) *
              static_cast<uint64_t>(wrap_to(dt, static_cast<uint64_t>(as_int(B, pb))));
      }
    }
    if (addmm) {
      int64_t pc = bcast_at(bias, idx);
      if (fl) {
        double c = round_to(dt, bias.f[static_cast<size_t>(pc)]);
        s = alpha * s + (beta == 0 ? 0.0 : beta * c);
        mg = std::fabs(alpha) * mg + (beta == 0 ? 0.0 : std::fabs(beta * c));
      } else {
        si = static_cast<uint64_t>(a.alpha.to<int64_t>()) * si +
             static_cast<uint64_t>(a.beta.to<int64_t>()) * static_cast<uint64_t>(as_int(bias, pc));
      }
    }
    if (fl) set_f(r, j, s), r.mag[static_cast<size_t>(j)] = mg;
    else set_i(r, j, si);
  });
  return r;
}

// ---------------------------------- views ----------------------------------

/// A view's result: output index → input flat index.
template <class Map> Ref view_of(const Arr& x, const Ix& out, Map&& map) {
  Ref r = result(out, x.dtype);
  r.aliases_input0 = true;
  for_each_index(out, [&](const Ix& idx, int64_t j) {
    int64_t p = map(idx);
    if (is_float(x.dtype)) set_f(r, j, x.f[static_cast<size_t>(p)]);
    else set_i(r, j, static_cast<uint64_t>(x.i[static_cast<size_t>(p)]));
  });
  return r;
}

Ref view(OpKind k, const Arr& x, const OpAttrs& a) {
  int64_t rank = static_cast<int64_t>(x.shape.size());
  Ix s = x.shape;
  switch (k) {
    case OpKind::View: {
      Ix out(a.dims.begin(), a.dims.end());
      int64_t known = 1, infer = -1;
      for (size_t q = 0; q < out.size(); ++q) {
        if (out[q] == -1) {
          if (infer >= 0) return raises("two -1");
          infer = static_cast<int64_t>(q);
        } else if (out[q] < 0) return raises("negative size");
        else known *= out[q];
      }
      if (infer >= 0) {
        if (known == 0 || x.numel() % known) return raises("cannot infer -1");
        out[static_cast<size_t>(infer)] = x.numel() / known;
      }
      if (numel(out) != x.numel()) return raises("numel differs");
      return view_of(x, out, [&](const Ix& idx) { return flat_of(out, idx); });
    }
    case OpKind::Transpose: {
      int64_t r1 = std::max<int64_t>(rank, 1);
      int64_t d0 = wrap_dim(a.dim, r1), d1 = wrap_dim(a.dim1, r1);
      if (d0 < 0 || d0 >= r1 || d1 < 0 || d1 >= r1) return raises("dim out of range");
      if (rank == 0) return view_of(x, s, [](const Ix&) { return int64_t{0}; });
      Ix out = s;
      std::swap(out[static_cast<size_t>(d0)], out[static_cast<size_t>(d1)]);
      return view_of(x, out, [&](Ix idx) {
        std::swap(idx[static_cast<size_t>(d0)], idx[static_cast<size_t>(d1)]);
        return flat_of(s, idx);
      });
    }
    case OpKind::Permute: {
      if (static_cast<int64_t>(a.dims.size()) != rank) return raises("order rank");
      Ix order;
      std::vector<bool> seen(static_cast<size_t>(rank), false);
      for (int64_t d0 : a.dims) {
        int64_t d = wrap_dim(d0, rank);
        if (d < 0 || d >= rank || seen[static_cast<size_t>(d)]) return raises("bad order");
        seen[static_cast<size_t>(d)] = true;
        order.push_back(d);
      }
      Ix out;
      for (int64_t d : order) out.push_back(s[static_cast<size_t>(d)]);
      return view_of(x, out, [&](const Ix& idx) {
        Ix in(static_cast<size_t>(rank));
        for (size_t q = 0; q < order.size(); ++q) in[static_cast<size_t>(order[q])] = idx[q];
        return flat_of(s, in);
      });
    }
    case OpKind::Slice: {
      if (rank == 0) return raises("slice of 0-d");
      if (a.step <= 0) return raises("step must be positive");
      int64_t d = wrap_dim(a.dim, rank);
      if (d < 0 || d >= rank) return raises("dim out of range");
      int64_t n = s[static_cast<size_t>(d)];
      auto clampi = [&](int64_t v) { v = v < 0 ? v + n : v; return std::clamp<int64_t>(v, 0, n); };
      int64_t st = clampi(a.start), en = clampi(a.end);
      int64_t len = en > st ? (en - st + a.step - 1) / a.step : 0;
      Ix out = s;
      out[static_cast<size_t>(d)] = len;
      return view_of(x, out, [&](Ix idx) {
        idx[static_cast<size_t>(d)] = st + idx[static_cast<size_t>(d)] * a.step;
        return flat_of(s, idx);
      });
    }
    case OpKind::Select: {
      if (rank == 0) return raises("select on 0-d");
      int64_t d = wrap_dim(a.dim, rank);
      if (d < 0 || d >= rank) return raises("dim out of range");
      int64_t n = s[static_cast<size_t>(d)], i = a.start < 0 ? a.start + n : a.start;
      if (i < 0 || i >= n) return raises("index out of range");
      Ix out = s;
      out.erase(out.begin() + d);
      return view_of(x, out, [&](Ix idx) {
        idx.insert(idx.begin() + d, i);
        return flat_of(s, idx);
      });
    }
    case OpKind::Expand: {
      Ix want(a.dims.begin(), a.dims.end());
      if (want.size() < s.size()) return raises("fewer dims");
      size_t lead = want.size() - s.size();
      for (size_t q = 0; q < want.size(); ++q) {
        if (want[q] == -1) {
          if (q < lead) return raises("-1 for a new dim");
          want[q] = s[q - lead];
        } else if (q >= lead && s[q - lead] != want[q] && s[q - lead] != 1) {
          return raises("cannot expand");
        } else if (want[q] < 0) return raises("negative size");
      }
      Arr xb = x;
      return view_of(x, want, [&](const Ix& idx) { return bcast_at(xb, idx); });
    }
    case OpKind::Squeeze: {
      int64_t r1 = std::max<int64_t>(rank, 1);
      int64_t d = wrap_dim(a.dim, r1);
      if (d < 0 || d >= r1) return raises("dim out of range");
      Ix out = s;
      if (rank && s[static_cast<size_t>(d)] == 1) out.erase(out.begin() + d);
      return view_of(x, out, [&](const Ix& idx) {
        Ix in = idx;
        if (rank && s[static_cast<size_t>(d)] == 1) in.insert(in.begin() + d, 0);
        return flat_of(s, in);
      });
    }
    case OpKind::Unsqueeze: {
      int64_t d = wrap_dim(a.dim, rank + 1);
      if (d < 0 || d > rank) return raises("dim out of range");
      Ix out = s;
      out.insert(out.begin() + d, 1);
      return view_of(x, out, [&](Ix idx) {
        idx.erase(idx.begin() + d);
        return flat_of(s, idx);
      });
    }
    default: return raises("no reference");
  }
}

// ------------------------------- copies and casts -------------------------------

/// Element j of `x` converted to dtype `to` (float → integer truncates toward zero; the caller
/// only converts in-range values).
void put_converted(Ref& r, int64_t j, const Arr& x, int64_t p) {
  if (is_float(r.dtype)) {
    set_f(r, j, x.f[static_cast<size_t>(p)]);
  } else if (r.dtype == DType::Bool) {
    set_i(r, j, x.f[static_cast<size_t>(p)] != 0);
  } else if (is_float(x.dtype)) {
    set_i(r, j, static_cast<uint64_t>(static_cast<int64_t>(std::trunc(x.f[static_cast<size_t>(p)]))));
  } else {
    set_i(r, j, static_cast<uint64_t>(as_int(x, p)));
  }
}

Ref copy(OpKind k, const std::vector<Tensor>& inputs, const OpAttrs& a) {
  Arr x = read(inputs[0]);
  switch (k) {
    case OpKind::Contiguous: {
      Ref r = result(x.shape, x.dtype);
      for (int64_t j = 0; j < x.numel(); ++j) put_converted(r, j, x, j);
      return r;
    }
    case OpKind::Cast: {
      Ref r = result(x.shape, a.dtype);
      for (int64_t j = 0; j < x.numel(); ++j) put_converted(r, j, x, j);
      return r;
    }
    case OpKind::CopyInto: {
      Arr src = read(inputs[1]);
      Ix b;
      if (!broadcast({x.shape, src.shape}, b) || b != x.shape) return raises("source does not broadcast");
      Ref r = result(x.shape, x.dtype);
      r.aliases_input0 = true;
      for_each_index(x.shape, [&](const Ix& idx, int64_t j) { put_converted(r, j, src, bcast_at(src, idx)); });
      return r;
    }
    case OpKind::Fill: {
      if (is_int(x.dtype) && a.alpha.is_floating()) {
        double v = a.alpha.to<double>(), lim = x.dtype == DType::Int32 ? 2147483648.0 : 9223372036854775808.0;
        if (!(v >= -lim && v < lim)) return raises("value overflows the dtype");
      }
      Ref r = result(x.shape, x.dtype);
      r.aliases_input0 = true;
      Arr v;
      v.dtype = a.alpha.is_floating() ? DType::Float64 : DType::Int64;
      v.f = {a.alpha.to<double>()};
      if (!a.alpha.is_floating()) v.i = {a.alpha.to<int64_t>()};
      for (int64_t j = 0; j < x.numel(); ++j) put_converted(r, j, v, 0);
      return r;
    }
    default: return raises("no reference");
  }
}

Ref cat(const std::vector<Tensor>& inputs, const OpAttrs& a) {
  if (inputs.empty()) return raises("empty list");
  std::vector<Arr> xs;
  for (const Tensor& t : inputs) xs.push_back(read(t));
  int64_t rank = static_cast<int64_t>(xs[0].shape.size());
  if (rank == 0) return raises("0-d");
  int64_t d = wrap_dim(a.dim, rank);
  if (d < 0 || d >= rank) return raises("dim out of range");
  Ix out = xs[0].shape;
  out[static_cast<size_t>(d)] = 0;
  for (const Arr& x : xs) {
    if (static_cast<int64_t>(x.shape.size()) != rank) return raises("rank differs");
    for (int64_t q = 0; q < rank; ++q)
      if (q != d && x.shape[static_cast<size_t>(q)] != xs[0].shape[static_cast<size_t>(q)]) return raises("shapes differ");
    out[static_cast<size_t>(d)] += x.shape[static_cast<size_t>(d)];
  }
  DType dt = DType::Bool;
  for (size_t q = 0; q < xs.size(); ++q) dt = q ? max_dtype(dt, xs[q].dtype) : xs[q].dtype;
  Ref r = result(out, dt);
  for_each_index(out, [&](Ix idx, int64_t j) {
    int64_t pos = idx[static_cast<size_t>(d)];
    for (const Arr& x : xs) {
      int64_t n = x.shape[static_cast<size_t>(d)];
      if (pos < n) {
        idx[static_cast<size_t>(d)] = pos;
        put_converted(r, j, x, flat_of(x.shape, idx));
        return;
      }
      pos -= n;
    }
  });
  return r;
}

// ---------------------------------- index ops ----------------------------------

bool int_index(const Arr& i) { return i.dtype == DType::Int64 || i.dtype == DType::Int32; }

Ref index_op(OpKind k, const std::vector<Tensor>& inputs, const OpAttrs& a) {
  Arr x = read(inputs[0]);
  int64_t rank = static_cast<int64_t>(x.shape.size());
  const Ix& s = x.shape;
  switch (k) {
    case OpKind::IndexSelect: {
      Arr ix = read(inputs[1]);
      if (!int_index(ix)) return raises("index must be integer");
      if (ix.shape.size() > 1) return raises("index must be 0-d or 1-D");
      int64_t d = wrap_dim(a.dim, std::max<int64_t>(rank, 1));
      if (d < 0 || d >= std::max<int64_t>(rank, 1)) return raises("dim out of range");
      int64_t n = rank ? s[static_cast<size_t>(d)] : 1;
      for (int64_t v : ix.i) if (v < 0 || v >= n) return raises("index out of range");
      Ix out = s;
      if (rank) out[static_cast<size_t>(d)] = ix.numel();
      Ref r = result(out, x.dtype);
      for_each_index(out, [&](Ix idx, int64_t j) {
        if (rank) idx[static_cast<size_t>(d)] = ix.i[static_cast<size_t>(idx[static_cast<size_t>(d)])];
        put_converted(r, j, x, rank ? flat_of(s, idx) : 0);
      });
      return r;
    }
    case OpKind::Gather: {
      Arr ix = read(inputs[1]);
      if (!int_index(ix)) return raises("index must be integer");
      if (static_cast<int64_t>(ix.shape.size()) != rank) return raises("index rank");
      int64_t d = wrap_dim(a.dim, std::max<int64_t>(rank, 1));
      if (d < 0 || d >= std::max<int64_t>(rank, 1)) return raises("dim out of range");
      for (int64_t q = 0; q < rank; ++q)
        if (q != d && ix.shape[static_cast<size_t>(q)] > s[static_cast<size_t>(q)]) return raises("index larger than input");
      int64_t n = rank ? s[static_cast<size_t>(d)] : 1;
      for (int64_t v : ix.i) if (v < 0 || v >= n) return raises("index out of range");
      Ref r = result(ix.shape, x.dtype);
      for_each_index(ix.shape, [&](Ix idx, int64_t j) {
        int64_t v = ix.i[static_cast<size_t>(j)];
        if (rank) idx[static_cast<size_t>(d)] = v;
        put_converted(r, j, x, rank ? flat_of(s, idx) : 0);
      });
      return r;
    }
    case OpKind::Embedding: {
      Arr ix = read(inputs[1]);
      if (!int_index(ix)) return raises("indices must be integer");
      if (rank != 2) return raises("weight must be 2-D");
      for (int64_t v : ix.i) if (v < 0 || v >= s[0]) return raises("index out of range");
      Ix out = ix.shape;
      out.push_back(s[1]);
      Ref r = result(out, x.dtype);
      for_each_index(out, [&](const Ix& idx, int64_t j) {
        Ix ii(idx.begin(), idx.end() - 1);
        int64_t row = ix.i[static_cast<size_t>(flat_of(ix.shape, ii))];
        put_converted(r, j, x, row * s[1] + idx.back());
      });
      return r;
    }
    case OpKind::OneHot: {
      if (x.dtype != DType::Int64) return raises("indices must be int64");
      int64_t c = a.mode;  // the op takes num_classes >= 1 (the public one_hot resolves -1)
      if (c < 1) return raises("num_classes must be positive");
      for (int64_t v : x.i) if (v < 0 || v >= c) return raises("class out of range");
      Ix out = s;
      out.push_back(c);
      Ref r = result(out, DType::Int64);
      for_each_index(out, [&](const Ix& idx, int64_t j) {
        Ix ii(idx.begin(), idx.end() - 1);
        set_i(r, j, x.i[static_cast<size_t>(flat_of(s, ii))] == idx.back());
      });
      return r;
    }
    case OpKind::MaskedFill: {
      Arr m = read(inputs[1]);
      if (m.dtype != DType::Bool) return raises("mask must be bool");
      Ix b;
      if (!broadcast({s, m.shape}, b) || b != s) return raises("mask does not broadcast");
      if (!is_float(x.dtype) && x.dtype != DType::Bool && a.alpha.is_floating())
        return raises("float value into an integer tensor");
      Arr v;
      v.dtype = a.alpha.is_floating() ? DType::Float64 : DType::Int64;
      v.f = {a.alpha.to<double>()};
      if (!a.alpha.is_floating()) v.i = {a.alpha.to<int64_t>()};
      Ref r = result(s, x.dtype);
      for_each_index(s, [&](const Ix& idx, int64_t j) {
        if (m.i[static_cast<size_t>(bcast_at(m, idx))]) put_converted(r, j, v, 0);
        else put_converted(r, j, x, j);
      });
      return r;
    }
    case OpKind::IndexAdd:
    case OpKind::ScatterAdd: {
      Arr ix = read(inputs[1]), src = read(inputs[2]);
      if (!int_index(ix)) return raises("index must be integer");
      if (src.dtype != x.dtype) return raises("source dtype differs");
      int64_t d = wrap_dim(a.dim, std::max<int64_t>(rank, 1));
      if (d < 0 || d >= std::max<int64_t>(rank, 1)) return raises("dim out of range");
      int64_t n = rank ? s[static_cast<size_t>(d)] : 1;
      for (int64_t v : ix.i) if (v < 0 || v >= n) return raises("index out of range");
      Ref r = result(s, x.dtype, is_float(x.dtype) ? Tol::Accum : Tol::Exact);
      std::vector<double> acc(x.f);
      std::vector<uint64_t> acci(x.i.begin(), x.i.end());
      std::vector<double> mag(x.f.size());
      for (size_t q = 0; q < mag.size(); ++q) mag[q] = std::fabs(x.f[q]);
      auto add_at = [&](int64_t dst, int64_t p) {
        if (is_float(x.dtype)) acc[static_cast<size_t>(dst)] += src.f[static_cast<size_t>(p)], mag[static_cast<size_t>(dst)] += std::fabs(src.f[static_cast<size_t>(p)]);
        else acci[static_cast<size_t>(dst)] += static_cast<uint64_t>(src.i[static_cast<size_t>(p)]);
      };
      if (k == OpKind::IndexAdd) {
        if (ix.shape.size() > 1) return raises("index must be 1-D");
        Ix want = s;
        if (rank) want[static_cast<size_t>(d)] = ix.numel();
        if (src.shape != want) return raises("source shape");
        for_each_index(src.shape, [&](Ix idx, int64_t p) {
          if (rank) idx[static_cast<size_t>(d)] = ix.i[static_cast<size_t>(idx[static_cast<size_t>(d)])];
          add_at(rank ? flat_of(s, idx) : 0, p);
        });
      } else {
        if (static_cast<int64_t>(ix.shape.size()) != rank || src.shape.size() != ix.shape.size()) return raises("index rank");
        for (size_t q = 0; q < ix.shape.size(); ++q) {
          if (ix.shape[q] > src.shape[q]) return raises("index larger than src");
          if (static_cast<int64_t>(q) != d && ix.shape[q] > s[q]) return raises("index larger than input");
        }
        for_each_index(ix.shape, [&](Ix idx, int64_t p) {
          int64_t ps = flat_of(src.shape, idx);
          if (rank) idx[static_cast<size_t>(d)] = ix.i[static_cast<size_t>(p)];
          add_at(rank ? flat_of(s, idx) : 0, ps);
        });
      }
      if (is_float(x.dtype)) r.mag = mag;
      for (int64_t j = 0; j < x.numel(); ++j) {
        if (is_float(x.dtype)) set_f(r, j, acc[static_cast<size_t>(j)]);
        else set_i(r, j, acci[static_cast<size_t>(j)]);
      }
      return r;
    }
    case OpKind::IndexCopy: {
      Arr ix = read(inputs[1]), src = read(inputs[2]);
      if (!int_index(ix)) return raises("index must be integer");
      if (ix.shape.size() > 1) return raises("index must be 1-D");
      if (src.dtype != x.dtype) return raises("source dtype differs");
      int64_t d = wrap_dim(a.dim, std::max<int64_t>(rank, 1));
      if (d < 0 || d >= std::max<int64_t>(rank, 1)) return raises("dim out of range");
      Ix want = s;
      if (rank) want[static_cast<size_t>(d)] = ix.numel();
      if (src.shape != want) return raises("source shape");
      int64_t n = rank ? s[static_cast<size_t>(d)] : 1;
      for (int64_t v : ix.i) if (v < 0 || v >= n) return raises("index out of range");
      // Each element's writer: the last source position (row-major) that lands on it.
      std::vector<int64_t> from(static_cast<size_t>(x.numel()), -1);
      for_each_index(src.shape, [&](Ix idx, int64_t p) {
        if (rank) idx[static_cast<size_t>(d)] = ix.i[static_cast<size_t>(idx[static_cast<size_t>(d)])];
        from[static_cast<size_t>(rank ? flat_of(s, idx) : 0)] = p;
      });
      Ref r = result(s, x.dtype);
      for (int64_t j = 0; j < x.numel(); ++j) {
        const int64_t p = from[static_cast<size_t>(j)];
        if (p < 0) put_converted(r, j, x, j);
        else put_converted(r, j, src, p);
      }
      return r;
    }
    case OpKind::Tril:
    case OpKind::Triu: {
      if (rank < 2) return raises("needs 2 dims");
      Ref r = result(s, x.dtype);
      for_each_index(s, [&](const Ix& idx, int64_t j) {
        int64_t diff = idx[static_cast<size_t>(rank - 1)] - idx[static_cast<size_t>(rank - 2)];
        bool keep = k == OpKind::Tril ? diff <= a.mode : diff >= a.mode;
        if (keep) put_converted(r, j, x, j);
        else if (is_float(x.dtype)) set_f(r, j, 0.0);
        else set_i(r, j, 0);
      });
      return r;
    }
    default: return raises("no reference");
  }
}

// ---------------------------------- losses ----------------------------------

Ref loss(OpKind k, const std::vector<Tensor>& inputs, const OpAttrs& a) {
  Arr x = read(inputs[0]), t = read(inputs[1]);
  if (a.mode < 0 || a.mode > 2) return raises("reduction");
  if (k == OpKind::MseLoss) {
    Ix b;
    if (!broadcast({x.shape, t.shape}, b)) return raises("shapes do not broadcast");
    DType dt = promote({x, t});
    if (dt == DType::Bool) return raises("not supported on bool");
    if (!is_float(dt)) dt = DType::Float32;
    std::vector<double> e;
    for_each_index(b, [&](const Ix& idx, int64_t) {
      double d = round_to(dt, x.f[static_cast<size_t>(bcast_at(x, idx))]) - round_to(dt, t.f[static_cast<size_t>(bcast_at(t, idx))]);
      e.push_back(d * d);
    });
    if (a.mode == 0) {
      Ref r = result(b, dt, Tol::Approx);
      for (size_t q = 0; q < e.size(); ++q) set_f(r, static_cast<int64_t>(q), e[q]);
      return r;
    }
    Ref r = result({}, dt, Tol::Accum);
    double s = 0;
    for (double v : e) s += v;
    if (a.mode == 1) s /= static_cast<double>(e.size());
    set_f(r, 0, s);
    r.mag = {std::fabs(s)};
    return r;
  }
  // nll_loss
  if (!is_float(x.dtype)) return raises("log_probs must be floating point");
  if (!int_index(t)) return raises("target must be integer");
  bool batched = x.shape.size() == 2;
  if (!((batched && t.shape.size() == 1 && t.shape[0] == x.shape[0]) || (x.shape.size() == 1 && t.shape.empty())))
    return raises("shapes");
  int64_t N = batched ? x.shape[0] : 1, C = x.shape.back();
  std::vector<double> per(static_cast<size_t>(N), 0.0);
  double s = 0, cnt = 0;
  for (int64_t n = 0; n < N; ++n) {
    int64_t c = t.i[static_cast<size_t>(n)];
    if (c == a.ignore_index) continue;
    if (c < 0 || c >= C) return raises("target out of range");
    per[static_cast<size_t>(n)] = -x.f[static_cast<size_t>(n * C + c)];
    s += per[static_cast<size_t>(n)], cnt += 1;
  }
  if (a.mode == 0) {
    Ref r = result(batched ? Ix{N} : Ix{}, x.dtype);
    for (int64_t n = 0; n < N; ++n) set_f(r, n, per[static_cast<size_t>(n)]);
    return r;
  }
  Ref r = result({}, x.dtype, Tol::Accum);
  double mg = 0;
  for (double v : per) mg += std::fabs(v);
  if (a.mode == 1) s /= cnt, mg /= std::max(cnt, 1.0);
  set_f(r, 0, s);
  r.mag = {mg};
  return r;
}

// ---------------------------------- scans ----------------------------------

/// argsort: each line's indices in std::stable_sort order (NaN the largest value; integers
/// compared exactly), its first k (attr mode; -1: all); a 0-d input's index is 0. cumsum:
/// running sums in double, float32 rounded once per result, integers exact with a 64-bit wrap
/// (attr descending: from the line's end).
Ref scan(OpKind k, const Arr& x, const OpAttrs& a) {
  const int64_t rank = static_cast<int64_t>(x.shape.size());
  const int64_t d = wrap_dim(a.dim, std::max<int64_t>(rank, 1));
  if (d < 0 || d >= std::max<int64_t>(rank, 1)) return raises("dim out of range");
  const int64_t n = rank ? x.shape[static_cast<size_t>(d)] : 1;
  int64_t outer = 1, inner = 1;
  for (int64_t i = 0; i < rank; ++i) {
    if (i < d) outer *= x.shape[static_cast<size_t>(i)];
    if (i > d) inner *= x.shape[static_cast<size_t>(i)];
  }
  auto at = [&](int64_t o, int64_t j, int64_t c) { return (o * n + j) * inner + c; };
  if (k == OpKind::CumSum) {
    Ref r = result(x.shape, is_float(x.dtype) ? x.dtype : DType::Int64);
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t c = 0; c < inner; ++c) {
        double sum = 0;
        uint64_t isum = 0;
        for (int64_t s = 0; s < n; ++s) {
          const int64_t p = at(o, a.descending ? n - 1 - s : s, c);
          if (is_float(x.dtype)) {
            sum += x.f[static_cast<size_t>(p)];
            set_f(r, p, sum);
          } else {
            isum += static_cast<uint64_t>(as_int(x, p));
            set_i(r, p, isum);
          }
        }
      }
    return r;
  }
  if (a.mode < -1 || a.mode > n) return raises("k out of range");
  const int64_t kk = a.mode < 0 ? n : a.mode;
  Ix shape = x.shape;
  if (rank) shape[static_cast<size_t>(d)] = kk;
  Ref r = result(shape, DType::Int64);
  if (rank == 0) return r;  // index 0
  auto less = [&](int64_t p, int64_t q) {
    if (!is_float(x.dtype)) return as_int(x, p) < as_int(x, q);
    const double u = x.f[static_cast<size_t>(p)], v = x.f[static_cast<size_t>(q)];
    return !std::isnan(u) && (std::isnan(v) || u < v);
  };
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t c = 0; c < inner; ++c) {
      Ix order(static_cast<size_t>(n));
      for (int64_t j = 0; j < n; ++j) order[static_cast<size_t>(j)] = j;
      std::stable_sort(order.begin(), order.end(), [&](int64_t i, int64_t j) {
        return a.descending ? less(at(o, j, c), at(o, i, c)) : less(at(o, i, c), at(o, j, c));
      });
      for (int64_t j = 0; j < kk; ++j)
        r.i[static_cast<size_t>((o * kk + j) * inner + c)] = order[static_cast<size_t>(j)];
    }
  return r;
}

// ---------------------------------- windows ----------------------------------

/// unfold / fold by direct index loops over the geometry in attr dims ({kh, kw, dilation,
/// padding, stride}, each h then w; fold: the output's H, W first). unfold copies (padding:
/// attr alpha); fold sums overlapping elements in double (Accum).
Ref window(OpKind k, const Arr& x, const OpAttrs& a) {
  const bool is_fold = k == OpKind::Fold;
  const int o = is_fold ? 2 : 0;
  if (a.dims.size() != o + 8) return raises("bad geometry attrs");
  if (!is_float(x.dtype)) return raises("not a floating dtype");
  if (x.shape.size() != (is_fold ? 3u : 4u)) return raises("wrong rank");
  const int64_t kh = a.dims[o], kw = a.dims[o + 1], dh = a.dims[o + 2], dw = a.dims[o + 3];
  const int64_t ph = a.dims[o + 4], pw = a.dims[o + 5], sh = a.dims[o + 6], sw = a.dims[o + 7];
  if (kh < 1 || kw < 1 || dh < 1 || dw < 1 || sh < 1 || sw < 1 || ph < 0 || pw < 0)
    return raises("non-positive kernel / dilation / stride or negative padding");
  const int64_t h = is_fold ? a.dims[0] : x.shape[2], w = is_fold ? a.dims[1] : x.shape[3];
  const int64_t eh = dh * (kh - 1) + 1, ew = dw * (kw - 1) + 1;
  if (h < 0 || w < 0 || eh > h + 2 * ph || ew > w + 2 * pw)
    return raises("kernel larger than the padded input");
  const int64_t ho = (h + 2 * ph - eh) / sh + 1, wo = (w + 2 * pw - ew) / sw + 1;
  const int64_t kk = kh * kw, l = ho * wo, n = x.shape[0];
  if (is_fold && (x.shape[1] % kk != 0 || x.shape[2] != l)) return raises("columns");
  const int64_t c = is_fold ? x.shape[1] / kk : x.shape[1];
  const Ix shape = is_fold ? Ix{n, c, h, w} : Ix{n, c * kk, l};
  Ref r = result(shape, x.dtype, is_fold ? Tol::Accum : Tol::Exact);
  const size_t count = static_cast<size_t>(numel(shape));
  std::vector<double> acc(count, is_fold ? 0.0 : a.alpha.to<double>()), mag(count, 0.0);
  for (int64_t b = 0; b < n; ++b)
    for (int64_t ch = 0; ch < c; ++ch)
      for (int64_t ki = 0; ki < kh; ++ki)
        for (int64_t kj = 0; kj < kw; ++kj)
          for (int64_t i = 0; i < ho; ++i)
            for (int64_t j = 0; j < wo; ++j) {
              const int64_t row = i * sh - ph + ki * dh, col = j * sw - pw + kj * dw;
              if (row < 0 || row >= h || col < 0 || col >= w) continue;
              const auto window = static_cast<size_t>(((b * c + ch) * kk + ki * kw + kj) * l + i * wo + j);
              const auto pixel = static_cast<size_t>(((b * c + ch) * h + row) * w + col);
              if (is_fold) acc[pixel] += x.f[window], mag[pixel] += std::fabs(x.f[window]);
              else acc[window] = x.f[pixel];
            }
  if (is_fold) r.mag = mag;
  for (size_t j = 0; j < count; ++j) set_f(r, static_cast<int64_t>(j), acc[j]);
  return r;
}

}  // namespace

Ref reference(OpKind k, const std::vector<Tensor>& inputs, const OpAttrs& a) {
  using C = kiln::OpCategory;
  switch (kiln::op_info(k).category) {
    case C::Unary:
    case C::Binary:
    case C::Ternary: {
      std::vector<Arr> in;
      for (const Tensor& t : inputs) in.push_back(read(t));
      return elementwise(k, in, a);
    }
    case C::Reduction:
    case C::IndexReduction: return reduction(k, read(inputs[0]), a);
    case C::Normalization:
      if (k != OpKind::Softmax && k != OpKind::LogSoftmax && k != OpKind::LayerNorm) break;
      return normalization(k, inputs, a);
    case C::Matmul:
      if (k != OpKind::Matmul && k != OpKind::Addmm) break;
      return matmul(k, inputs, a);
    case C::View: return view(k, read(inputs[0]), a);
    case C::Copy: return copy(k, inputs, a);
    case C::Shape:
      if (k != OpKind::Cat) break;
      return cat(inputs, a);
    case C::Index: return index_op(k, inputs, a);
    case C::Scan: return scan(k, read(inputs[0]), a);
    case C::Window: return window(k, read(inputs[0]), a);
    case C::Loss:
      if (k != OpKind::NllLoss && k != OpKind::MseLoss) break;
      return loss(k, inputs, a);
    case C::Random: {  // values are checked by property; here only what must raise
      bool p_ok = a.p >= 0 && a.p <= 1;
      if (k == OpKind::Dropout) {
        if (!p_ok) return raises("probability outside [0, 1]");
        if (!is_float(inputs[0].dtype())) return raises("input must be floating point");
      } else {
        for (int64_t d : a.dims)
          if (d < 0) return raises("negative size");
        if (k == OpKind::DropoutMask && !p_ok) return raises("probability outside [0, 1]");
        if (k == OpKind::RandInt) {
          if (a.dtype == DType::Bool) return raises("bool dtype");
          if (a.low.to<int64_t>() >= a.high.to<int64_t>()) return raises("low >= high");
        } else if (!is_float(a.dtype)) {
          return raises("dtype must be floating point");
        }
      }
      Ref r;
      r.property_only = true;
      return r;
    }
  }
  return raises("no reference");
}

}  // namespace conf
