// Backward formulas, one per differentiable op (the derivatives.yaml of kiln). Each is written
// with kiln ops so that it is itself differentiable (create_graph / double backward).
// Sources: standard calculus; GELU's derivative from Hendrycks & Gimpel (2016); layer_norm's
// from Ba et al. (2016); softmax/log_softmax as in PyTorch's derivatives.yaml.
#include "eager/derivatives.h"

#include <cmath>
#include <numbers>

#include "backends/cpu/kernels.h"
#include "eager/autograd.h"
#include "eager/dispatch.h"
#include "eager/factories.h"
#include "eager/ops.h"

namespace kiln::autograd {

Tensor sum_to(const Tensor& g, const Shape& shape) {
  if (g.shape() == shape) return g;
  int lead = g.dim() - shape.size();
  Dims dims;
  for (int i = 0; i < g.dim(); ++i)
    if (i < lead || (shape[i - lead] == 1 && g.shape()[i] != 1)) dims.push_back(i);
  Tensor r = dims.empty() ? g : sum(g, dims, /*keepdim=*/true);
  return r.reshape(shape);
}

namespace {

using K = OpKind;
constexpr uint8_t X = 1, A = 1, B = 2, ALL3 = 7;

// Dims reduced by a reduction call, as a Dims list over the input rank.
Dims reduced_dims(const OpAttrs& a, int rank) {
  uint32_t mask = reduction_mask(a, rank, "backward", Loc::current());
  Dims d;
  for (int i = 0; i < rank; ++i)
    if (mask >> i & 1) d.push_back(i);
  return d;
}

// A reduction's output-shaped tensor broadcast back to the input shape.
Tensor expand_back(const Tensor& t, const Shape& in_shape, const OpAttrs& a) {
  Tensor r = t;
  if (!a.keepdim)
    for (int64_t d : reduced_dims(a, in_shape.size())) r = r.unsqueeze(d);
  return r.expand(in_shape);
}

/// Zeros of an input's shape and dtype on the gradient's device.
Tensor zeros_of(const TensorMeta& m, const Tensor& g) {
  return zeros(m.shape, {m.dtype, g.device()});
}

/// index_add / scatter_add (`op`) in a backward whose indices the forward checked (or kiln built
/// in range): marked so, so that compiled code and eager GPU ops do not scan them again
/// (eager/value_checks.h).
Tensor add_at_checked_indices(K op, const Tensor& x, int64_t dim, const Tensor& index,
                              const Tensor& source, Loc loc = Loc::current()) {
  OpAttrs a;
  a.dim = dim;
  a.indices_checked = true;
  return dispatch::call1({op, {x, index, source}, a, loc});
}

// Gradient of a slice [start, start + len) with step 1 along dim: g padded with zeros.
Tensor pad_slice(const Tensor& g, const TensorMeta& in, int dim, int64_t start) {
  int64_t len = g.shape()[dim], total = in.shape[dim];
  std::vector<Tensor> parts;
  Shape s = in.shape;
  if (start > 0) {
    s[dim] = start;
    parts.push_back(zeros(s, {g.dtype(), g.device()}));
  }
  parts.push_back(g);
  if (start + len < total) {
    s[dim] = total - start - len;
    parts.push_back(zeros(s, {g.dtype(), g.device()}));
  }
  return parts.size() == 1 ? g : cat(parts, dim);
}

// Eager backward without create_graph on the CPU: one fused kernel (backends/cpu/kernels.h)
// instead of a formula of many full-size ops (layer_norm's ~12 passes were 3.4x slower than
// PyTorch's fused kernel at 8192x768, gelu's ~11 2.3x). A trace records the formula (the tracer
// sees dispatched ops only, and the codegen fuses them), as does double backward. `inputs`:
// the saved tensors the kernel reads, the first of g's shape; undefined ones are skipped.
bool fused_backward_applies(const Tensor& g, std::initializer_list<Tensor> inputs) {
  if (is_grad_enabled() || dispatch::tracer_hook() || !g.device().is_cpu()) return false;
  const DType dt = g.dtype();
  if (dt != DType::Float32 && dt != DType::Float64) return false;
  for (const Tensor& t : inputs)
    if (t.defined() && (!t.device().is_cpu() || t.dtype() != dt)) return false;
  return inputs.begin()->shape() == g.shape();
}

std::vector<Tensor> unary(const BackwardContext& c, const Tensor& g) {
  const Tensor& x = c.inputs.empty() ? Tensor() : c.inputs[0];
  const Tensor& y = c.output;
  constexpr double ln2 = std::numbers::ln2;
  switch (c.op) {
    case K::Neg: return {-g};
    case K::Abs: return {g * sign(x)};
    case K::Sign:
    case K::Floor:
    case K::Ceil:
    case K::Round:
    case K::Trunc: return {zeros_like(g)};
    case K::Exp: return {g * y};
    case K::Exp2: return {g * y * ln2};
    case K::Log: return {g / x};
    case K::Log2: return {g / (x * ln2)};
    case K::Log1p: return {g / (x + 1)};
    case K::Expm1: return {g * (y + 1)};
    case K::Sqrt: return {g / (y * 2)};
    case K::Rsqrt: return {g * y * y * y * -0.5};
    case K::Reciprocal: return {-(g * y * y)};
    case K::Sin: return {g * cos(x)};
    case K::Cos: return {-(g * sin(x))};
    case K::Tan: return {g * (y * y + 1)};
    case K::Tanh: return {g * (1 - y * y)};
    case K::Sigmoid: return {g * y * (1 - y)};
    case K::Relu: {
      Tensor mask = le(y, 0);
      Tensor r = where(mask, 0, g);  // a NaN passes g, as PyTorch's threshold_backward
      // Under create_graph, PyTorch's threshold_backward is differentiable in its input with
      // derivative 0: the gradient requires grad as the input does, and its own gradient is
      // zeros, not "does not require grad" or "input not used" (when it requires grad through
      // g alone: relu(x) * w). A term that is exactly 0 (y is +-0 where selected) joins y's
      // graph without changing a value.
      if (is_grad_enabled() && y.requires_grad()) r = r + where(mask, y, 0) * 0;
      return {r};
    }
    case K::Silu: {
      Tensor s = sigmoid(x);
      return {g * s * (1 + x * (1 - s))};
    }
    case K::Erf: return {g * exp(-(x * x)) * (2 / std::sqrt(std::numbers::pi))};
    case K::Gelu: {
      if (fused_backward_applies(g, {x})) return {cpu::gelu_backward(x, g, c.attrs.mode)};
      if (c.attrs.mode == 0) {  // x·Φ(x): Φ(x) + x·φ(x)
        Tensor cdf = (1 + erf(x * std::numbers::sqrt2 * 0.5)) * 0.5;
        Tensor pdf = exp(x * x * -0.5) * (1 / std::sqrt(2 * std::numbers::pi));
        return {g * (cdf + x * pdf)};
      }
      constexpr double k = 0.7978845608028654, c3 = 0.044715;  // √(2/π)
      Tensor t = tanh((x + x * x * x * c3) * k);
      Tensor d = (1 + t) * 0.5 + x * (1 - t * t) * (1 + x * x * (3 * c3)) * (0.5 * k);
      return {g * d};
    }
    case K::Clamp: {
      Tensor keep = ones_like(x, {DType::Bool});
      if (c.attrs.has_low) keep = logical_and(keep, ge(x, c.attrs.alpha));
      if (c.attrs.has_high) keep = logical_and(keep, le(x, c.attrs.beta));
      return {where(keep, g, 0)};
    }
    default: break;
  }
  throw Error(op_name(c.op).data(), "no derivative", c.loc);
}

std::vector<Tensor> binary(const BackwardContext& c, const Tensor& g) {
  const Shape& sa = c.input_meta[0].shape;
  const Shape& sb = c.input_meta[1].shape;
  const Tensor& a = c.inputs[0];
  const Tensor& b = c.inputs.size() > 1 ? c.inputs[1] : Tensor();
  auto pair = [&](const Tensor& ga, const Tensor& gb) {
    return std::vector<Tensor>{c.needs_grad[0] ? sum_to(ga, sa) : Tensor(),
                               c.needs_grad[1] ? sum_to(gb, sb) : Tensor()};
  };
  switch (c.op) {
    case K::Add: return pair(g, c.needs_grad[1] ? g * c.attrs.alpha : g);
    case K::Sub: return pair(g, c.needs_grad[1] ? g * -c.attrs.alpha.to<double>() : g);
    case K::Mul: return pair(c.needs_grad[0] ? g * b : g, c.needs_grad[1] ? g * a : g);
    case K::Div:
      return pair(c.needs_grad[0] ? g / b : g, c.needs_grad[1] ? -(g * a / (b * b)) : g);
    case K::Pow: {
      // d/da a^b = b·a^(b-1), masked to 0 where b = 0 (PyTorch; its d/db is then 0 too). The
      // masked branch takes a^0 there, not 0^-1: its NaN would come back as 0·NaN in a second
      // derivative.
      Tensor ga = c.needs_grad[0]
                      ? g * where(eq(b, 0), 0.0, b * pow(a, where(eq(b, 0), 1.0, b) - 1))
                      : g;
      Tensor gb = g;
      if (c.needs_grad[1])  // d/db a^b = a^b·log a, taken as 0 where a = 0 and b >= 0
        gb = where(logical_and(eq(a, 0), ge(b, 0)), zeros_like(g), g * c.output * log(a));
      return pair(ga, gb);
    }
    case K::Maximum:
    case K::Minimum: {
      // Ties split the gradient evenly and a NaN on either side passes it to both, as in PyTorch
      // (each side gets g unless the other side wins).
      Tensor a_loses = c.op == K::Maximum ? lt(a, b) : gt(a, b);
      Tensor b_loses = c.op == K::Maximum ? gt(a, b) : lt(a, b);
      Tensor share = where(eq(a, b), 0.5, 1.0);
      return pair(g * where(a_loses, 0.0, share), g * where(b_loses, 0.0, share));
    }
    case K::Atan2: {
      Tensor denom = a * a + b * b;
      return pair(g * b / denom, -(g * a / denom));
    }
    case K::FloorDivide: return pair(zeros_like(g), zeros_like(g));
    case K::Remainder: return pair(g, c.needs_grad[1] ? -(g * floor_divide(a, b)) : g);
    case K::MseLoss: {
      Tensor d = a - b;
      double scale = c.attrs.mode == 1 ? 2.0 / static_cast<double>(std::max<int64_t>(d.numel(), 1))
                                       : 2.0;
      Tensor gd = g * d * scale;
      return pair(gd, -gd);
    }
    default: break;
  }
  throw Error(op_name(c.op).data(), "no derivative", c.loc);
}

std::vector<Tensor> reduction(const BackwardContext& c, const Tensor& g) {
  const TensorMeta& in = c.input_meta[0];
  const Tensor& x = c.inputs.empty() ? Tensor() : c.inputs[0];
  const Tensor& y = c.output;
  int64_t n_in = numel(in.shape), n_out = g.numel();
  double n = n_out ? static_cast<double>(n_in) / static_cast<double>(n_out) : 0;
  Tensor ge_ = expand_back(g, in.shape, c.attrs);
  switch (c.op) {
    case K::Sum: return {ge_.contiguous()};
    case K::Mean: return {ge_ / n};
    case K::Prod: {
      // ∂y/∂x_i = Π_{j≠i} x_j, which is y / x_i except at a zero, where that is 0/0 (PyTorch's
      // prod_backward). At a zero, with P the product of the slice's non-zero elements: P when
      // it is the slice's only zero; (S − x_i)·P when there is one other zero (S, the sum of the
      // slice's zeros, is 0 but carries the other zero's derivative, so second derivatives hold
      // between the two); 0 with more.
      Dims dims = reduced_dims(c.attrs, in.shape.size());
      Tensor zero = eq(x, 0.0);
      Tensor x_or_1 = where(zero, 1.0, x);
      Tensor zeros_in_slice = sum(zero.to(x.dtype()), dims, true);
      Tensor p = prod(x_or_1, dims, true);
      Tensor zeros_sum = sum(where(zero, x, 0.0), dims, true);
      Tensor other_zero = zeros_sum - x;
      Tensor at_zero = where(eq(zeros_in_slice, 1.0), p,
                             where(eq(zeros_in_slice, 2.0), other_zero * p, 0.0));
      // A non-zero element of a slice with zeros: its Π_{j≠i} holds a zero, so it is 0, or NaN
      // when another element is inf or NaN (PyTorch's exclusive products). y / x_i is not: y
      // is NaN when an inf or an overflowing product meets the zero. With one zero, (the zero)
      // · (the others' product) keeps the second derivative towards it.
      Tensor nonfinite = logical_not(isfinite(x));
      Tensor other_nonfinite =
          gt(sum(nonfinite.to(x.dtype()), dims, true) - nonfinite.to(x.dtype()), 0.0);
      Tensor others = p / x_or_1;
      Tensor beside_zero =
          where(eq(zeros_in_slice, 1.0),
                zeros_sum * where(isfinite(others), others, 0.0), 0.0);
      beside_zero = where(other_nonfinite, NAN, beside_zero);
      Tensor no_zero = expand_back(y, in.shape, c.attrs) / x_or_1;
      return {ge_ * where(zero, at_zero, where(gt(zeros_in_slice, 0.0), beside_zero, no_zero))};
    }
    case K::Amax:
    case K::Amin: {
      // Ties share the gradient. max(x) / min(x) (mode 1) also give it to NaNs when the result
      // is NaN, as PyTorch's evenly_distribute_backward; amax's NaN result gives NaN, as its.
      Tensor yb = expand_back(y, in.shape, c.attrs);
      Tensor at = eq(x, yb);
      if (c.attrs.mode == 1) at = logical_or(at, logical_and(isnan(x), isnan(yb)));
      Tensor hit = where(at, 1.0, 0.0).to(x.dtype());
      Dims dims = reduced_dims(c.attrs, in.shape.size());
      Tensor count = sum(hit, dims, true);
      return {ge_ * hit / count};
    }
    case K::Var:
    case K::Std: {
      Dims dims = reduced_dims(c.attrs, in.shape.size());
      double dof = n - static_cast<double>(c.attrs.mode);
      Tensor xc = x - mean(x, dims, true);
      if (c.op == K::Var) return {ge_ * xc * (2.0 / dof)};
      // std = 0 (all elements equal): xc = 0 too; the gradient is 0, not 0/0 (PyTorch masks it)
      Tensor yb = expand_back(y, in.shape, c.attrs);
      return {where(eq(yb, 0), 0.0, ge_ / (yb * dof)) * xc};
    }
    case K::LogSumExp: return {ge_ * exp(x - expand_back(y, in.shape, c.attrs))};
    default: break;
  }
  throw Error(op_name(c.op).data(), "no derivative", c.loc);
}

std::vector<Tensor> normalization(const BackwardContext& c, const Tensor& g) {
  const Tensor& y = c.output;
  switch (c.op) {
    case K::Softmax: return {y * (g - sum(g * y, {c.attrs.dim}, true))};
    case K::LogSoftmax: return {g - exp(y) * sum(g, {c.attrs.dim}, true)};
    case K::LayerNorm: {
      const Tensor& x = c.inputs[0];
      const Tensor& w = c.inputs.size() > 1 ? c.inputs[1] : Tensor();
      const bool need_w = c.input_meta.size() > 1 && c.needs_grad[1];
      const bool need_b = c.input_meta.size() > 2 && c.needs_grad[2];
      if (fused_backward_applies(g, {x, w})) {
        auto [dx, dw, db] = cpu::layer_norm_backward(x, w, g, c.attrs.dims, c.attrs.eps,
                                                     c.needs_grad[0], need_w, need_b);
        return {dx, dw, db};
      }
      Dims dims;
      for (int i = 0; i < c.attrs.dims.size(); ++i) dims.push_back(x.dim() - c.attrs.dims.size() + i);
      // xhat and rstd from layer_norm and std, which keep their statistics in double: the
      // float32 xc·xc of rsqrt(mean(xc·xc) + eps) overflowed (rstd 0, xhat NaN) on rows near
      // the float32 limits whose gradient is representable. sd² would overflow above 2^64,
      // where eps no longer counts and rstd is 1/sd.
      Tensor xhat = layer_norm(x, c.attrs.dims, Tensor(), Tensor(), c.attrs.eps);
      Tensor sd = kiln::std(x, dims, 0, true);
      Tensor rstd = where(gt(sd, 0x1p60), reciprocal(sd), rsqrt(sd * sd + c.attrs.eps));
      std::vector<Tensor> out(3);
      Tensor gxhat = w.defined() ? g * w : g;
      if (c.needs_grad[0])
        out[0] = rstd * (gxhat - mean(gxhat, dims, true) - xhat * mean(gxhat * xhat, dims, true));
      if (need_w) out[1] = sum_to(g * xhat, c.input_meta[1].shape);
      if (need_b) out[2] = sum_to(g, c.input_meta[2].shape);
      return out;
    }
    default: break;
  }
  throw Error(op_name(c.op).data(), "no derivative", c.loc);
}

std::vector<Tensor> linalg(const BackwardContext& c, const Tensor& g) {
  if (c.op == K::Addmm) {
    const Tensor& a = c.inputs[1];
    const Tensor& b = c.inputs[2];
    double alpha = c.attrs.alpha.to<double>(), beta = c.attrs.beta.to<double>();
    auto scaled = [](const Tensor& t, double s) { return s == 1.0 ? t : t * s; };
    std::vector<Tensor> out(3);
    if (c.needs_grad[0]) out[0] = sum_to(scaled(g, beta), c.input_meta[0].shape);
    if (c.needs_grad[1]) out[1] = scaled(matmul(g, b.t()), alpha);
    if (c.needs_grad[2]) {
      // mat2 a transposed contiguous matrix (nn::Linear's weight.t()): its gradient is made as
      // (gᵀ·a)ᵀ, the same layout, so the weight's gradient comes out contiguous instead of
      // being copied from a transpose (PyTorch's mm_mat2_backward does the same).
      out[2] = scaled(c.input_meta[2].column_major ? matmul(g.t(), a).t() : matmul(a.t(), g),
                      alpha);
    }
    return out;
  }
  // a is saved only when b's gradient is wanted and b only for a's (OpNode::save): ranks and
  // shapes come from input_meta.
  const Tensor& a = c.inputs[0];
  const Tensor& b = c.inputs[1];
  const Shape& a_shape = c.input_meta[0].shape;
  const Shape& b_shape = c.input_meta[1].shape;
  const bool a_vec = a_shape.size() == 1, b_vec = b_shape.size() == 1;
  if (a_vec && b_vec)
    return {c.needs_grad[0] ? g * b : Tensor(), c.needs_grad[1] ? g * a : Tensor()};
  Tensor g2 = a_vec ? g.unsqueeze(-2) : g;
  if (b_vec) g2 = g2.unsqueeze(-1);
  std::vector<Tensor> out(2);
  if (c.needs_grad[0]) {
    Tensor b2 = b_vec ? b.unsqueeze(-1) : b;
    Shape a2_shape = a_vec ? Shape{1, a_shape[0]} : a_shape;
    out[0] = sum_to(matmul(g2, b2.transpose(-1, -2)), a2_shape).reshape(a_shape);
  }
  if (c.needs_grad[1]) {
    Tensor a2 = a_vec ? a.unsqueeze(0) : a;
    Shape b2_shape = b_vec ? Shape{b_shape[0], 1} : b_shape;
    if (b2_shape.size() == 2 && a2.dim() > 2) {
      // b is shared by every batch (a linear layer's weight): sum_b a_bᵀ·g_b is one GEMM over
      // the folded rows, [K, B·M]·[B·M, N] (PyTorch folds the same way), instead of B products
      // [B, K, N] then a sum over B.
      const int64_t k = a2.shape().back(), n = g2.shape().back();
      out[1] = matmul(a2.reshape({-1, k}).t(), g2.reshape({-1, n})).reshape(b_shape);
    } else {
      out[1] = sum_to(matmul(a2.transpose(-1, -2), g2), b2_shape).reshape(b_shape);
    }
  }
  return out;
}

std::vector<Tensor> view(const BackwardContext& c, const Tensor& g) {
  const TensorMeta& in = c.input_meta[0];
  const OpAttrs& a = c.attrs;
  int r = in.shape.size();
  switch (c.op) {
    case K::View:
    case K::Squeeze:
    case K::Unsqueeze: return {g.reshape(in.shape)};
    case K::Transpose: return {r ? g.transpose(a.dim, a.dim1) : g};
    case K::Permute: {
      Dims inv = Dims::filled(r, 0);
      for (int i = 0; i < r; ++i) inv[wrap_dim(a.dims[i], r, "permute")] = i;
      return {g.permute(inv)};
    }
    case K::Expand: return {sum_to(g, in.shape)};
    case K::Slice: {
      int d = wrap_dim(a.dim, r, "slice");
      int64_t n = in.shape[d];
      int64_t start = std::clamp<int64_t>(a.start < 0 ? a.start + n : a.start, 0, n);
      if (a.step == 1) return {pad_slice(g, in, d, start)};
      // Strided: g's rows added back at start, start + step, ... with index_add (differentiable
      // again). It was an in-place copy_ into a strided view of zeros, which compiled backward
      // replayed wrongly (the rows became ones; found by tests/conformance).
      int64_t len = g.shape()[d];
      Tensor idx = arange(Scalar(start), Scalar(start + len * a.step), Scalar(a.step), {DType::Int64});
      return {add_at_checked_indices(K::IndexAdd, zeros_of(in, g), d, idx, g)};
    }
    case K::Select: {
      int d = wrap_dim(a.dim, r, "select");
      int64_t i = a.start < 0 ? a.start + in.shape[d] : a.start;
      return {pad_slice(g.unsqueeze(d), in, d, i)};
    }
    default: break;
  }
  throw Error(op_name(c.op).data(), "no derivative", c.loc);
}

std::vector<Tensor> other(const BackwardContext& c, const Tensor& g) {
  switch (c.op) {
    case K::Contiguous: return {g};
    case K::Cast: return {is_floating(c.input_meta[0].dtype) ? g.to(c.input_meta[0].dtype) : Tensor()};
    case K::CopyInto:
      return {zeros_like(g), c.needs_grad[1] && is_floating(c.input_meta[1].dtype)
                                 ? sum_to(g.to(c.input_meta[1].dtype), c.input_meta[1].shape)
                                 : Tensor()};
    case K::Fill: return {zeros_like(g)};
    case K::Where: {
      const Tensor& cond = c.inputs[0];
      std::vector<Tensor> out(3);
      if (c.needs_grad[1]) out[1] = sum_to(where(cond, g, 0), c.input_meta[1].shape);
      if (c.needs_grad[2]) out[2] = sum_to(where(cond, 0, g), c.input_meta[2].shape);
      return out;
    }
    case K::Cat: {
      std::vector<Tensor> out;
      int d = wrap_dim(c.attrs.dim, g.dim(), "cat");
      int64_t at = 0;
      for (const TensorMeta& m : c.input_meta) {
        out.push_back(g.slice(d, at, at + m.shape[d]));
        at += m.shape[d];
      }
      return out;
    }
    case K::IndexSelect:
      return {add_at_checked_indices(K::IndexAdd, zeros_of(c.input_meta[0], g), c.attrs.dim,
                                     c.inputs[1], g)};
    case K::Embedding: {
      int64_t dim = c.input_meta[0].shape[1];
      return {add_at_checked_indices(K::IndexAdd, zeros_of(c.input_meta[0], g), 0,
                                     c.inputs[1].reshape({-1}), g.reshape({-1, dim}))};
    }
    case K::Gather:
      return {add_at_checked_indices(K::ScatterAdd, zeros_of(c.input_meta[0], g), c.attrs.dim,
                                     c.inputs[1], g)};
    case K::IndexAdd:
      return {g, Tensor(), c.needs_grad[2] ? index_select(g, c.attrs.dim, c.inputs[1]) : Tensor()};
    case K::IndexCopy: {
      // x's gradient: g with the written slices zeroed; source's: the slices read back, a
      // repeated index's earlier slices (overwritten by its last) zeroed too.
      const Tensor index = c.inputs[1].reshape({-1});
      const Shape& xs = c.input_meta[0].shape;
      const Shape& ss = c.input_meta[2].shape;
      const int d = xs.empty() ? 0 : wrap_dim(c.attrs.dim, xs.size(), "index_copy");
      Tensor gx, gs;
      if (c.needs_grad[0])
        gx = add_at_checked_indices(K::IndexCopy, g, d, index, zeros(ss, {g.dtype(), g.device()}));
      if (!c.needs_grad[2]) return {gx, Tensor(), Tensor()};
      gs = index_select(g, d, index).reshape(ss);
      if (!xs.empty() && index.numel() > 1) {
        // writer[j]: the last i with index[i] == j; slice i keeps its gradient when it is that.
        const Tensor order = arange(index.numel(), {DType::Int64, g.device()});
        const Tensor writer = add_at_checked_indices(
            K::IndexCopy, full({xs[d]}, -1, {DType::Int64, g.device()}), 0, index, order);
        Shape along = Shape::filled(ss.size(), 1);
        along[d] = index.numel();
        gs = where((index_select(writer, 0, index) == order).view(along), gs, 0.0);
      }
      return {gx, Tensor(), gs};
    }
    case K::CumSum: {
      // x[j] is in every running sum from j on: its gradient is the running sum of g from the
      // other end (a reverse cumsum, which also undoes a reverse one).
      OpAttrs reversed = c.attrs;
      reversed.descending = !reversed.descending;
      return {dispatch::call1({K::CumSum, {g}, reversed, c.loc})};
    }
    case K::Unfold: {
      // unfold and fold are each other's adjoint: the gradient of the windows is their sum
      // folded back onto the input (padding elements, constants, get none).
      const Shape& in = c.input_meta[0].shape;
      OpAttrs a;
      a.dims = {in[2], in[3]};
      for (int64_t v : c.attrs.dims) a.dims.push_back(v);
      return {dispatch::call1({K::Fold, {g}, a, c.loc})};
    }
    case K::Fold: {
      OpAttrs a;
      a.dims = Window2d::from(c.attrs).dims();
      a.alpha = 0;
      return {dispatch::call1({K::Unfold, {g}, a, c.loc})};
    }
    case K::ScatterAdd: {
      if (!c.needs_grad[2]) return {g, Tensor(), Tensor()};
      // src may be larger than index (only its leading index.shape block is scattered): the
      // rest of src gets a zero gradient, so the gradient has src's shape.
      Tensor gs = gather(g, c.attrs.dim, c.inputs[1]);
      const Shape& ss = c.input_meta[2].shape;
      for (int q = 0; q < ss.size(); ++q)
        if (gs.shape()[q] < ss[q]) {
          Shape pad = gs.shape();
          pad[q] = ss[q] - gs.shape()[q];
          gs = cat({gs, zeros(pad, {gs.dtype(), gs.device()})}, q);
        }
      return {g, Tensor(), gs};
    }
    case K::MaskedFill: return {masked_fill(g, c.inputs[1], 0)};
    case K::Tril: return {tril(g, c.attrs.mode)};
    case K::Triu: return {triu(g, c.attrs.mode)};
    case K::Dropout:
      // The same Philox counters give the same mask: dropout(g) = g·mask/(1−p).
      return {dispatch::call1({K::Dropout, {g}, c.attrs, c.loc})};
    case K::NllLoss: {
      const Tensor& target = c.inputs[1];
      int64_t classes = c.input_meta[0].shape.back();
      // In int64, as the forward compares: ignore_index may be out of an int32 target's range.
      Tensor valid = ne(target.to(DType::Int64), c.attrs.ignore_index);
      Tensor safe = where(valid, target.to(DType::Int64), 0);
      OpAttrs encode;
      encode.mode = classes;
      encode.indices_checked = true;  // the forward checked the targets
      Tensor w = dispatch::call1({K::OneHot, {safe}, encode, c.loc}).to(g.dtype()) *
                 valid.to(g.dtype()).unsqueeze(-1);
      Tensor scale = g;
      if (c.attrs.mode == 0) scale = g.unsqueeze(-1);
      // Every target ignored: the count is 0 and w is all 0; the gradient is 0 (PyTorch), so
      // the count is taken as at least 1 (0·(g/0) would be NaN).
      if (c.attrs.mode == 1) scale = g / clamp(valid.to(g.dtype()).sum(), 1.0, std::nullopt);
      return {-(w * scale)};
    }
    default: break;
  }
  throw Error(op_name(c.op).data(), "no derivative", c.loc);
}

}  // namespace

const SaveSpec& save_spec(OpKind op) {
  static const auto table = [] {
    std::array<SaveSpec, kNumOps> t{};
    auto set = [&](OpKind k, uint8_t inputs, bool output) { t[int(k)] = {true, inputs, output}; };
    for (K k : {K::Neg, K::Sign, K::Floor, K::Ceil, K::Round, K::Trunc, K::Add, K::Sub, K::Sum,
                K::Mean, K::View, K::Transpose, K::Permute, K::Slice, K::Select, K::Expand,
                K::Squeeze, K::Unsqueeze, K::Contiguous, K::Cast, K::CopyInto, K::Fill, K::Cat,
                K::Tril, K::Triu, K::Dropout, K::CumSum, K::Unfold, K::Fold})
      set(k, 0, false);
    for (K k : {K::Exp, K::Exp2, K::Expm1, K::Sqrt, K::Rsqrt, K::Reciprocal, K::Tan, K::Tanh,
                K::Sigmoid, K::Relu, K::Softmax, K::LogSoftmax})
      set(k, 0, true);
    for (K k : {K::Abs, K::Log, K::Log2, K::Log1p, K::Sin, K::Cos, K::Silu, K::Erf, K::Gelu,
                K::Clamp, K::Var})
      set(k, X, false);
    for (K k : {K::Mul, K::Div, K::Maximum, K::Minimum, K::Atan2, K::FloorDivide, K::Remainder,
                K::MseLoss, K::Matmul})
      set(k, A | B, false);
    for (K k : {K::Prod, K::Amax, K::Amin, K::Std, K::LogSumExp}) set(k, X, true);
    set(K::Pow, A | B, true);
    set(K::Where, 1, false);
    set(K::LayerNorm, A | B, false);
    set(K::Addmm, 6, false);
    for (K k : {K::IndexSelect, K::Embedding, K::Gather, K::IndexAdd, K::IndexCopy, K::ScatterAdd,
                K::MaskedFill, K::NllLoss})
      set(k, B, false);
    (void)ALL3;
    return t;
  }();
  return table[static_cast<int>(op)];
}

std::vector<Tensor> derivative(const BackwardContext& c, const Tensor& g) {
  switch (op_info(c.op).category) {
    case OpCategory::Unary: return unary(c, g);
    case OpCategory::Binary:
    case OpCategory::Loss:
      if (c.op == K::NllLoss) return other(c, g);
      return binary(c, g);
    case OpCategory::Reduction: return reduction(c, g);
    case OpCategory::Normalization: return normalization(c, g);
    case OpCategory::Matmul: return linalg(c, g);
    case OpCategory::View: return view(c, g);
    default: return other(c, g);
  }
}

}  // namespace kiln::autograd
