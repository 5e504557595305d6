#include "core/meta.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace kiln {
namespace {

std::string dtypes_str(std::span<const TensorMeta> in) {
  std::string s;
  for (const auto& m : in) s += (s.empty() ? "" : ", ") + std::string(name(m.dtype));
  return s;
}
std::string shapes_str(std::span<const TensorMeta> in) {
  std::string s;
  for (const auto& m : in) s += (s.empty() ? "" : " and ") + to_string(m.shape);
  return s;
}

DType apply_rule(DTypeRule rule, DType promoted) {
  switch (rule) {
    case DTypeRule::ToFloat: return is_floating(promoted) ? promoted : default_dtype();
    case DTypeRule::ToBool: return DType::Bool;
    case DTypeRule::ToInt64: return DType::Int64;
    default: return promoted;
  }
}

Shape reduce_shape(const Shape& in, uint32_t mask, bool keepdim) {
  Shape out;
  for (int d = 0; d < in.size(); ++d) {
    if (!(mask >> d & 1)) out.push_back(in[d]);
    else if (keepdim) out.push_back(1);
  }
  return out;
}

InferredMeta elementwise(OpKind op, std::span<const TensorMeta> in, const OpAttrs& a, Loc loc) {
  const char* nm = op_name(op).data();
  Shape shape = in[0].shape;
  for (size_t i = 1; i < in.size(); ++i) shape = broadcast_shapes(shape, in[i].shape, nm, loc);
  DType promoted;
  if (op == OpKind::Clamp) {
    // clamp's bounds are host scalars: they promote like wrapped numbers.
    std::vector<TensorMeta> all(in.begin(), in.end());
    if (a.has_low) all.push_back({a.alpha.dtype(), {}, true});
    if (a.has_high) all.push_back({a.beta.dtype(), {}, true});
    promoted = result_type(all);
    KILN_CHECK(a.has_low || a.has_high, nm, loc, "at least one of min and max must be given");
    if (a.has_low) check_scalar_fits(a.alpha, promoted, nm, loc);
    if (a.has_high) check_scalar_fits(a.beta, promoted, nm, loc);
  } else {
    promoted = result_type(in);
  }
  bool is_bool = promoted == DType::Bool;
  // As PyTorch: a bool operand of `-` is most likely a mask someone meant to invert.
  const bool bool_operand =
      std::any_of(in.begin(), in.end(), [](const TensorMeta& m) { return m.dtype == DType::Bool; });
  KILN_CHECK(!(op == OpKind::Sub && bool_operand), nm, loc,
             "subtraction with a bool operand is not supported (operands {} and {}); to invert a "
             "mask use logical_not", name(in[0].dtype), name(in[1].dtype));
  KILN_CHECK(!(is_bool && (op == OpKind::Neg || op == OpKind::Sign)), nm, loc,
             "not supported on bool tensors (use logical_not / logical_xor)");
  // As PyTorch, which has no bool kernels for these (relu(mask) is most likely a mistake).
  KILN_CHECK(!(is_bool && (op == OpKind::FloorDivide || op == OpKind::Remainder ||
                           op == OpKind::Abs || op == OpKind::Relu || op == OpKind::Gelu ||
                           op == OpKind::Silu || op == OpKind::Floor || op == OpKind::Ceil ||
                           op == OpKind::Round || op == OpKind::Trunc || op == OpKind::Pow)),
             nm, loc, "not supported on bool tensors; convert with .to(kiln::Float32)");
  DType out = apply_rule(op_info(op).dtype_rule, promoted);
  DType compute = op_info(op).dtype_rule == DTypeRule::ToBool ? promoted : out;
  if (op == OpKind::Add || op == OpKind::Sub) {  // PyTorch's alpha_check
    KILN_CHECK(is_floating(compute) || !a.alpha.is_floating(), nm, loc,
               "alpha must not be a floating point number ({}) for {} inputs", a.alpha.str(),
               name(compute));
    KILN_CHECK(compute == DType::Bool || !a.alpha.is_bool(), nm, loc,
               "a bool alpha ({}) is only supported for bool results, not {}", a.alpha.str(),
               name(compute));
    check_scalar_fits(a.alpha, compute, nm, loc);
  }
  return {compute, {{out, shape}}};
}

InferredMeta where(std::span<const TensorMeta> in, Loc loc) {
  KILN_CHECK(in[0].dtype == DType::Bool, "where", loc, "condition must be bool, got {}",
             name(in[0].dtype));
  Shape shape = broadcast_shapes(in[0].shape, in[1].shape, "where", loc);
  shape = broadcast_shapes(shape, in[2].shape, "where", loc);
  DType t = result_type(in.subspan(1));
  return {t, {{t, shape}}};
}

InferredMeta reduction(OpKind op, std::span<const TensorMeta> in, const OpAttrs& a, Loc loc) {
  const char* nm = op_name(op).data();
  const TensorMeta& x = in[0];
  DType t = x.dtype;
  DType out;
  switch (op) {
    case OpKind::Sum:
    case OpKind::Prod: out = is_floating(t) ? t : DType::Int64; break;
    case OpKind::Mean:
    case OpKind::Var:
    case OpKind::Std:
      KILN_CHECK(is_floating(t), nm, loc,
                 "input dtype must be floating point, got {} (convert with .to(kiln::Float32))",
                 name(t));
      out = t;
      break;
    default: out = apply_rule(op_info(op).dtype_rule, t);
  }
  if (op == OpKind::Amax || op == OpKind::Amin || op == OpKind::Argmax || op == OpKind::Argmin) {
    KILN_CHECK(t != DType::Bool || op == OpKind::Amax || op == OpKind::Amin, nm, loc,
               "not supported on bool tensors");
  }
  if (op == OpKind::Argmax || op == OpKind::Argmin) {
    // One dim, or all dims (the flattened index).
    if (a.all_dims) {
      KILN_CHECK(numel(x.shape) > 0, nm, loc, "cannot take {} of an empty tensor (shape {})", nm,
                 to_string(x.shape));
      Shape s = a.keepdim ? Dims::filled(x.shape.size(), 1) : Shape{};
      return {t, {{DType::Int64, s}}};
    }
    int d = wrap_dim(a.dim, x.shape.size(), nm, loc);
    KILN_CHECK(x.shape.size() == 0 || x.shape[d] > 0, nm, loc,
               "cannot reduce over dim {} of size 0 (shape {})", d, to_string(x.shape));
    Shape s = x.shape.size() ? reduce_shape(x.shape, 1u << d, a.keepdim) : Shape{};
    return {t, {{DType::Int64, s}}};
  }
  uint32_t mask = reduction_mask(a, x.shape.size(), nm, loc);
  if (op == OpKind::Amax || op == OpKind::Amin) {
    for (int d = 0; d < x.shape.size(); ++d)
      KILN_CHECK(!(mask >> d & 1) || x.shape[d] > 0, nm, loc,
                 "cannot reduce over dim {} of size 0 (shape {}): the maximum / minimum of "
                 "no elements is undefined", d, to_string(x.shape));
  }
  DType compute = (op == OpKind::All || op == OpKind::Any) ? t : out;
  if (op == OpKind::LogSumExp) compute = out;
  return {compute, {{out, reduce_shape(x.shape, mask, a.keepdim)}}};
}

InferredMeta normalization(OpKind op, std::span<const TensorMeta> in, const OpAttrs& a,
                           Loc loc) {
  const char* nm = op_name(op).data();
  const TensorMeta& x = in[0];
  DType out = apply_rule(DTypeRule::ToFloat, x.dtype);
  KILN_CHECK(x.dtype != DType::Bool, nm, loc, "not supported on bool tensors");
  if (op == OpKind::LayerNorm) {
    const Shape& ns = a.dims;
    KILN_CHECK(ns.size() >= 1, nm, loc,
               "normalized_shape must have at least 1 dim (the trailing dims of the input {} to "
               "normalise over), got []", to_string(x.shape));
    bool ok = ns.size() <= x.shape.size();
    for (int i = 0; ok && i < ns.size(); ++i)
      ok = x.shape[x.shape.size() - ns.size() + i] == ns[i];
    KILN_CHECK(ok, nm, loc, "normalized_shape {} does not match the last dims of input {}",
               to_string(ns), to_string(x.shape));
    for (size_t i = 1; i < in.size(); ++i)
      KILN_CHECK(in[i].shape == ns, nm, loc, "{} has shape {}, expected normalized_shape {}",
                 i == 1 ? "weight" : "bias", to_string(in[i].shape), to_string(ns));
    KILN_CHECK(is_floating(x.dtype), nm, loc, "input must be floating point, got {}",
               name(x.dtype));
    return {out, {{out, x.shape}}};
  }
  wrap_dim(a.dim, x.shape.size(), nm, loc);
  return {out, {{out, x.shape}}};
}

InferredMeta matmul(OpKind op, std::span<const TensorMeta> in, const OpAttrs& a, Loc loc) {
  const char* nm = op_name(op).data();
  std::span<const TensorMeta> ab = op == OpKind::Addmm ? in.subspan(1) : in;
  const Shape& x = ab[0].shape;
  const Shape& y = ab[1].shape;
  DType t = result_type(ab);
  if (op == OpKind::Addmm) t = promote_types(t, in[0].dtype);
  KILN_CHECK(t != DType::Bool, nm, loc, "not supported on bool tensors");
  KILN_CHECK(x.size() >= 1 && y.size() >= 1, nm, loc,
             "both arguments need at least 1 dim, got shapes {} and {}", to_string(x),
             to_string(y));
  int64_t k1 = x.back();
  int64_t k2 = y.size() == 1 ? y[0] : y[y.size() - 2];
  KILN_CHECK(k1 == k2, nm, loc, "shapes {} and {} cannot be multiplied ({} != {})", to_string(x),
             to_string(y), k1, k2);
  if (op == OpKind::Addmm) {
    KILN_CHECK(x.size() == 2 && y.size() == 2, nm, loc, "expects 2-D matrices, got {} and {}",
               to_string(x), to_string(y));
    // PyTorch: "For integral input tensors, argument beta must not be a floating point
    // number" (beta = 0.5 on int tensors acted as 0).
    for (const Scalar* s : {&a.beta, &a.alpha})
      KILN_CHECK(is_floating(t) || !s->is_floating(), nm, loc,
                 "{} must not be a floating point number ({}) for {} inputs",
                 s == &a.beta ? "beta" : "alpha", s->str(), name(t));
    check_scalar_fits(a.alpha, t, nm, loc);
    check_scalar_fits(a.beta, t, nm, loc);
    Shape out{x[0], y[1]};
    Shape b = broadcast_shapes(in[0].shape, out, nm, loc);
    KILN_CHECK(b == out, nm, loc, "bias of shape {} does not broadcast to {}",
               to_string(in[0].shape), to_string(out));
    return {t, {{t, out}}};
  }
  // Batch dims broadcast; a 1-D operand gets a unit dim that is removed again.
  Shape xb, yb;
  for (int i = 0; i + 2 < x.size(); ++i) xb.push_back(x[i]);
  for (int i = 0; i + 2 < y.size(); ++i) yb.push_back(y[i]);
  Shape out = broadcast_shapes(xb, yb, nm, loc);
  if (x.size() >= 2) out.push_back(x[x.size() - 2]);
  if (y.size() >= 2) out.push_back(y.back());
  return {t, {{t, out}}};
}

InferredMeta view(OpKind op, std::span<const TensorMeta> in, const OpAttrs& a, Loc loc) {
  const char* nm = op_name(op).data();
  const Shape& s = in[0].shape;
  DType t = in[0].dtype;
  int r = s.size();
  Shape out;
  switch (op) {
    case OpKind::View: {
      int infer = -1;
      int64_t known = 1;
      for (int i = 0; i < a.dims.size(); ++i) {
        if (a.dims[i] == -1) {
          KILN_CHECK(infer < 0, nm, loc, "only one dim can be -1 in shape {}", to_string(a.dims));
          infer = i;
        } else {
          KILN_CHECK(a.dims[i] >= 0, nm, loc, "invalid size {} in shape {}", a.dims[i],
                     to_string(a.dims));
          known *= a.dims[i];
        }
      }
      out = a.dims;
      int64_t n = numel(s);
      if (infer >= 0) {
        KILN_CHECK(known != 0 && n % known == 0, nm, loc,
                   "shape {} is invalid for input of shape {} ({} elements)", to_string(a.dims),
                   to_string(s), n);
        out[infer] = n / known;
      }
      KILN_CHECK(numel(out) == n, nm, loc,
                 "shape {} is invalid for input of shape {} ({} elements)", to_string(a.dims),
                 to_string(s), n);
      break;
    }
    case OpKind::Transpose: {
      out = s;
      int d0 = wrap_dim(a.dim, r, nm, loc), d1 = wrap_dim(a.dim1, r, nm, loc);
      if (r) std::swap(out[d0], out[d1]);  // a 0-d tensor takes dims 0 and -1, as in PyTorch
      break;
    }
    case OpKind::Permute: {
      KILN_CHECK(a.dims.size() == r, nm, loc, "order {} has {} dims, the input has {}",
                 to_string(a.dims), a.dims.size(), r);
      uint32_t seen = 0;
      for (int i = 0; i < r; ++i) {
        int d = wrap_dim(a.dims[i], r, nm, loc);
        KILN_CHECK(!(seen >> d & 1), nm, loc, "order {} repeats dim {}", to_string(a.dims), d);
        seen |= 1u << d;
        out.push_back(s[d]);
      }
      break;
    }
    case OpKind::Slice: {
      KILN_CHECK(r > 0, nm, loc, "cannot slice a 0-d tensor");
      KILN_CHECK(a.step > 0, nm, loc, "step must be positive, got {}", a.step);
      int d = wrap_dim(a.dim, r, nm, loc);
      out = s;
      out[d] = 0;  // actual extent computed by the caller via slice_extent
      int64_t n = s[d];
      auto clampi = [n](int64_t v) { return std::clamp<int64_t>(v < 0 ? v + n : v, 0, n); };
      int64_t b = clampi(a.start), e = clampi(a.end);
      out[d] = e > b ? 1 + (e - b - 1) / a.step : 0;  // e - b + step - 1 could overflow
      break;
    }
    case OpKind::Select: {
      KILN_CHECK(r > 0, nm, loc, "cannot select on a 0-d tensor");
      int d = wrap_dim(a.dim, r, nm, loc);
      KILN_CHECK(a.start >= -s[d] && a.start < s[d], nm, loc,
                 "index {} out of range for dim {} of size {}", a.start, d, s[d]);
      out = s;
      out.erase(d);
      break;
    }
    case OpKind::Expand: {
      const Shape& want = a.dims;
      KILN_CHECK(want.size() >= r, nm, loc, "cannot expand shape {} to fewer dims {}",
                 to_string(s), to_string(want));
      out = want;
      int lead = want.size() - r;
      for (int i = 0; i < want.size(); ++i) {
        int64_t have = i < lead ? 1 : s[i - lead];
        KILN_CHECK(want[i] >= -1, nm, loc, "invalid size {} in {}", want[i], to_string(want));
        if (want[i] == -1) {
          KILN_CHECK(i >= lead, nm, loc, "-1 is not allowed for a new leading dim in {}",
                     to_string(want));
          out[i] = have;
        } else {
          KILN_CHECK(have == want[i] || have == 1, nm, loc,
                     "cannot expand shape {} to {}: dim {} has size {}", to_string(s),
                     to_string(want), i, have);
        }
      }
      break;
    }
    case OpKind::Squeeze: {
      int d = a.all_dims ? -1 : wrap_dim(a.dim, r, nm, loc);
      for (int i = 0; i < r; ++i)
        if (!(s[i] == 1 && (a.all_dims || i == d))) out.push_back(s[i]);
      break;
    }
    case OpKind::Unsqueeze: {
      KILN_CHECK(r < kMaxRank, nm, loc, "the result would have rank {}, kiln's maximum is {}",
                 r + 1, kMaxRank);
      int d = wrap_dim(a.dim, r + 1, nm, loc);
      out = s;
      out.insert(d, 1);
      break;
    }
    default: break;
  }
  return {t, {{t, out}}};
}

InferredMeta index(OpKind op, std::span<const TensorMeta> in, const OpAttrs& a, Loc loc) {
  const char* nm = op_name(op).data();
  const TensorMeta& x = in[0];
  int r = x.shape.size();
  auto need_index = [&](const TensorMeta& i) {
    KILN_CHECK(i.dtype == DType::Int64 || i.dtype == DType::Int32, nm, loc,
               "indices must be int64 or int32, got {}", name(i.dtype));
  };
  switch (op) {
    case OpKind::IndexSelect: {
      need_index(in[1]);
      KILN_CHECK(in[1].shape.size() <= 1, nm, loc, "index must be 0-d or 1-D, got shape {}",
                 to_string(in[1].shape));
      Shape out = x.shape;
      const int d = wrap_dim(a.dim, r, nm, loc);  // a 0-d input takes dims 0 and -1
      if (r) out[d] = numel(in[1].shape);
      return {x.dtype, {{x.dtype, out}}};
    }
    case OpKind::Gather: {
      need_index(in[1]);
      const Shape& is = in[1].shape;
      int d = wrap_dim(a.dim, r, nm, loc);
      KILN_CHECK(is.size() == r, nm, loc, "index rank {} must equal input rank {}", is.size(), r);
      for (int i = 0; i < r; ++i)
        KILN_CHECK(i == d || is[i] <= x.shape[i], nm, loc,
                   "index shape {} exceeds input shape {} at dim {}", to_string(is),
                   to_string(x.shape), i);
      return {x.dtype, {{x.dtype, is}}};
    }
    case OpKind::Embedding: {
      need_index(in[1]);
      KILN_CHECK(r == 2, nm, loc, "weight must be 2-D [num_embeddings, dim], got {}",
                 to_string(x.shape));
      Shape out = in[1].shape;
      out.push_back(x.shape[1]);
      return {x.dtype, {{x.dtype, out}}};
    }
    case OpKind::OneHot: {
      KILN_CHECK(x.dtype == DType::Int64, nm, loc, "indices must be int64, got {}", name(x.dtype));
      KILN_CHECK(a.mode >= 1, nm, loc, "num_classes must be positive, got {}", a.mode);
      Shape out = x.shape;
      out.push_back(a.mode);
      return {DType::Int64, {{DType::Int64, out}}};
    }
    case OpKind::MaskedFill: {
      KILN_CHECK(in[1].dtype == DType::Bool, nm, loc, "mask must be bool, got {}",
                 name(in[1].dtype));
      check_scalar_fits(a.alpha, x.dtype, nm, loc);
      Shape b = broadcast_shapes(x.shape, in[1].shape, nm, loc);
      KILN_CHECK(b == x.shape, nm, loc, "mask of shape {} does not broadcast to input shape {}",
                 to_string(in[1].shape), to_string(x.shape));
      return {x.dtype, {{x.dtype, x.shape}}};
    }
    case OpKind::IndexAdd:
    case OpKind::IndexCopy:
    case OpKind::ScatterAdd: {
      need_index(in[1]);
      const TensorMeta& src = in[2];
      const Shape& is = in[1].shape;
      KILN_CHECK(src.dtype == x.dtype, nm, loc, "source dtype {} must match input dtype {}",
                 name(src.dtype), name(x.dtype));
      int d = wrap_dim(a.dim, r, nm, loc);
      // The message names the first dim that does not fit and the rule it breaks (it named
      // the op's dim whichever dim failed, break-it pass); infer_meta appends the shapes.
      if (op != OpKind::ScatterAdd) {
        KILN_CHECK(is.size() <= 1, nm, loc, "index must be 1-D, got shape {}", to_string(is));
        KILN_CHECK(src.shape.size() == r, nm, loc, "source must have the input's {} dims", r);
        for (int i = 0; i < r; ++i) {
          const int64_t want = i == d ? numel(is) : x.shape[i];
          KILN_CHECK(src.shape[i] == want, nm, loc, "source's size in dim {} must be {} ({}), got {}",
                     i, want, i == d ? "the index's length" : "the input's", src.shape[i]);
        }
      } else {
        KILN_CHECK(src.shape.size() == r && is.size() == r, nm, loc,
                   "index and source must have the input's {} dims", r);
        for (int i = 0; i < r; ++i) {
          KILN_CHECK(is[i] <= src.shape[i], nm, loc,
                     "index's size in dim {} ({}) exceeds the source's ({})", i, is[i],
                     src.shape[i]);
          KILN_CHECK(i == d || is[i] <= x.shape[i], nm, loc,
                     "index's size in dim {} ({}) exceeds the input's ({})", i, is[i],
                     x.shape[i]);
        }
      }
      return {x.dtype, {{x.dtype, x.shape}}};
    }
    case OpKind::Tril:
    case OpKind::Triu:
      KILN_CHECK(r >= 2, nm, loc, "input must have at least 2 dims, got shape {}",
                 to_string(x.shape));
      return {x.dtype, {{x.dtype, x.shape}}};
    default: break;
  }
  return {x.dtype, {{x.dtype, x.shape}}};
}

InferredMeta cat(std::span<const TensorMeta> in, const OpAttrs& a, Loc loc) {
  KILN_CHECK(!in.empty(), "cat", loc, "expects a non-empty list of tensors");
  const Shape& s0 = in[0].shape;
  KILN_CHECK(s0.size() > 0, "cat", loc, "zero-dimensional tensors cannot be concatenated");
  int d = wrap_dim(a.dim, s0.size(), "cat", loc);
  Shape out = s0;
  out[d] = 0;
  for (const auto& m : in) {
    bool ok = m.shape.size() == s0.size();
    for (int i = 0; ok && i < s0.size(); ++i) ok = i == d || m.shape[i] == s0[i];
    KILN_CHECK(ok, "cat", loc, "shapes {} must match except in dim {}", shapes_str(in), d);
    out[d] += m.shape[d];
  }
  DType t = result_type(in);
  return {t, {{t, out}}};
}

InferredMeta random(OpKind op, std::span<const TensorMeta> in, const OpAttrs& a, Loc loc) {
  const char* nm = op_name(op).data();
  if (op == OpKind::Dropout) {
    KILN_CHECK(a.p >= 0 && a.p <= 1, nm, loc, "probability must be in [0, 1], got {}", a.p);
    KILN_CHECK(is_floating(in[0].dtype), nm, loc, "input must be floating point, got {}",
               name(in[0].dtype));
    return {in[0].dtype, {{in[0].dtype, in[0].shape}}};
  }
  for (int64_t v : a.dims) KILN_CHECK(v >= 0, nm, loc, "negative size in {}", to_string(a.dims));
  if (op == OpKind::DropoutMask)
    KILN_CHECK(a.p >= 0 && a.p <= 1, nm, loc, "probability must be in [0, 1], got {}", a.p);
  if (op == OpKind::RandInt) {
    KILN_CHECK(a.low.to<int64_t>() < a.high.to<int64_t>(), nm, loc,
               "low ({}) must be less than high ({})", a.low.str(), a.high.str());
    KILN_CHECK(a.dtype != DType::Bool, nm, loc, "dtype bool is not supported");
  } else if (op == OpKind::DropoutMask) {
    KILN_CHECK(is_floating(a.dtype) || a.dtype == DType::Bool, nm, loc,
               "dtype must be floating point or bool, got {}", name(a.dtype));
  } else {
    KILN_CHECK(is_floating(a.dtype), nm, loc, "dtype must be floating point, got {}",
               name(a.dtype));
  }
  return {a.dtype, {{a.dtype, a.dims}}};
}

InferredMeta loss(OpKind op, std::span<const TensorMeta> in, const OpAttrs& a, Loc loc) {
  const char* nm = op_name(op).data();
  KILN_CHECK(a.mode >= 0 && a.mode <= 2, nm, loc, "reduction must be none, mean or sum");
  if (op == OpKind::NllLoss) {
    const Shape& x = in[0].shape;
    const Shape& t = in[1].shape;
    KILN_CHECK(is_floating(in[0].dtype), nm, loc, "input must be floating point, got {}",
               name(in[0].dtype));
    KILN_CHECK(in[1].dtype == DType::Int64 || in[1].dtype == DType::Int32, nm, loc,
               "target must be int64 or int32, got {}", name(in[1].dtype));
    KILN_CHECK((x.size() == 2 && t.size() == 1 && t[0] == x[0]) || (x.size() == 1 && t.size() == 0),
               nm, loc,
               "expects input [N, C] and target [N] (or [C] and a 0-d target), got {} and {}",
               to_string(x), to_string(t));
    Shape out = a.mode == 0 ? t : Shape{};
    return {in[0].dtype, {{in[0].dtype, out}}};
  }
  Shape b = broadcast_shapes(in[0].shape, in[1].shape, nm, loc);
  KILN_CHECK(result_type(in) != DType::Bool, nm, loc, "not supported on bool tensors");
  DType t = apply_rule(DTypeRule::ToFloat, result_type(in));
  return {t, {{t, a.mode == 0 ? b : Shape{}}}};
}

// argsort (attr mode = k leading indices, -1: all) and cumsum, along attr dim. A 0-d input is a
// line of one element (dims 0 and -1 only, as PyTorch); k may then be 0 or 1, the result 0-d.
InferredMeta scan(OpKind op, std::span<const TensorMeta> in, const OpAttrs& a, Loc loc) {
  const char* nm = op_name(op).data();
  const TensorMeta& x = in[0];
  const int r = x.shape.size();
  const int d = wrap_dim(a.dim, r, nm, loc);
  if (op == OpKind::CumSum) {
    const DType out = is_floating(x.dtype) ? x.dtype : DType::Int64;
    return {out, {{out, x.shape}}};
  }
  const int64_t n = r ? x.shape[d] : 1;
  KILN_CHECK(a.mode >= 0 ? a.mode <= n : a.mode == -1, nm, loc,
             "k ({}) is out of range for dim {} of size {} (k must be in [0, {}])", a.mode, d, n,
             n);
  Shape out = x.shape;
  if (r && a.mode >= 0) out[d] = a.mode;
  return {x.dtype, {{DType::Int64, out}}};
}

// unfold ([N, C, H, W] -> [N, C*kh*kw, L]) and fold, its adjoint ([N, C*kh*kw, L] ->
// [N, C, H, W] with attr dims[0..1] = H, W), float32 / float64; the geometry in attr dims.
InferredMeta window(OpKind op, std::span<const TensorMeta> in, const OpAttrs& a, Loc loc) {
  const char* nm = op_name(op).data();
  const TensorMeta& x = in[0];
  const bool is_fold = op == OpKind::Fold;
  KILN_CHECK(a.dims.size() == (is_fold ? 10 : 8), nm, loc, "internal: window attrs {}",
             to_string(a.dims));
  const Window2d w = Window2d::from(a);
  KILN_CHECK(is_floating(x.dtype), nm, loc, "takes float32 or float64 input, got {}",
             name(x.dtype));
  KILN_CHECK(x.shape.size() == (is_fold ? 3 : 4), nm, loc, "expects a {} input, got {}",
             is_fold ? "3-D [N, C*kh*kw, L]" : "4-D [N, C, H, W]", to_string(x.shape));
  KILN_CHECK(w.kh > 0 && w.kw > 0, nm, loc, "kernel_size must be positive, got [{}, {}]", w.kh,
             w.kw);
  KILN_CHECK(w.dh > 0 && w.dw > 0, nm, loc, "dilation must be positive, got [{}, {}]", w.dh,
             w.dw);
  KILN_CHECK(w.sh > 0 && w.sw > 0, nm, loc, "stride must be positive, got [{}, {}]", w.sh,
             w.sw);
  KILN_CHECK(w.ph >= 0 && w.pw >= 0, nm, loc, "padding must be non-negative, got [{}, {}]",
             w.ph, w.pw);
  // Bounded, so the sizes below cannot overflow int64 (a padding of 2^62 gave a negative one).
  constexpr int64_t kMaxGeometry = int64_t{1} << 31;
  for (int64_t v : a.dims)
    KILN_CHECK(v < kMaxGeometry, nm, loc,
               "kernel_size, dilation, padding, stride and output_size must be below 2^31, got {}",
               to_string(a.dims));
  const int64_t h = is_fold ? a.dims[0] : x.shape[2], wd = is_fold ? a.dims[1] : x.shape[3];
  KILN_CHECK(h >= 0 && wd >= 0, nm, loc, "output_size must be non-negative, got [{}, {}]", h,
             wd);
  // The dilated kernel must fit the padded input (PyTorch's check).
  const int64_t span_h = w.dh * (w.kh - 1) + 1, span_w = w.dw * (w.kw - 1) + 1;
  KILN_CHECK(span_h <= h + 2 * w.ph && span_w <= wd + 2 * w.pw, nm, loc,
             "the kernel [{}, {}] (dilated: [{}, {}]) is larger than the padded input [{}, {}] "
             "(input [{}, {}], padding [{}, {}])",
             w.kh, w.kw, span_h, span_w, h + 2 * w.ph, wd + 2 * w.pw, h, wd, w.ph, w.pw);
  const int64_t positions = window_positions(h, w.kh, w.dh, w.ph, w.sh) *
                            window_positions(wd, w.kw, w.dw, w.pw, w.sw);
  const int64_t k = w.kh * w.kw;
  if (!is_fold)
    return {x.dtype, {{x.dtype, {x.shape[0], x.shape[1] * k, positions}}}};
  KILN_CHECK(x.shape[1] % k == 0, nm, loc,
             "the input {} has {} rows in dim 1, not a multiple of the kernel's {} x {} = {}",
             to_string(x.shape), x.shape[1], w.kh, w.kw, k);
  KILN_CHECK(x.shape[2] == positions, nm, loc,
             "the input {} has {} columns in dim 2; output_size [{}, {}] with this kernel, "
             "dilation, padding and stride gives {} windows",
             to_string(x.shape), x.shape[2], h, wd, positions);
  return {x.dtype, {{x.dtype, {x.shape[0], x.shape[1] / k, h, wd}}}};
}

}  // namespace

void check_scalar_fits(const Scalar& v, DType dtype, const char* op, Loc loc) {
  bool fits = true;
  if (is_integral(dtype)) {
    const bool i32 = dtype == DType::Int32;
    if (v.is_floating()) {  // within the range itself, as PyTorch (2147483647.5 is out)
      double d = v.to<double>();
      fits = i32 ? d >= -2147483648.0 && d <= 2147483647.0
                 : d >= -9223372036854775808.0 && d < 9223372036854775808.0;
    } else if (i32 && v.is_integral()) {
      int64_t i = v.to<int64_t>();
      fits = i >= INT32_MIN && i <= INT32_MAX;
    }
  } else if (dtype == DType::Float32 && v.is_floating()) {
    double d = std::fabs(v.to<double>());
    fits = !(d > std::numeric_limits<float>::max()) || std::isinf(d);  // NaN, inf pass
  }
  KILN_CHECK(fits, op, loc, "value {} cannot be converted to {} without overflow", v.str(),
             name(dtype));
}

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op, Loc loc) {
  if (a == b) return a;
  int r = std::max(a.size(), b.size());
  Shape out = Dims::filled(r, 1);
  for (int i = 0; i < r; ++i) {
    int ia = i - (r - a.size()), ib = i - (r - b.size());
    int64_t x = ia >= 0 ? a[ia] : 1, y = ib >= 0 ? b[ib] : 1;
    KILN_CHECK(x == y || x == 1 || y == 1, op, loc,
               "shapes {} and {} cannot be broadcast (dim {}: {} vs {})", to_string(a),
               to_string(b), i, x, y);
    out[i] = x == 1 ? y : x;
  }
  return out;
}

DType result_type(std::span<const TensorMeta> inputs) {
  // Three tiers as in PyTorch: tensors with dims, 0-d tensors, wrapped host numbers.
  bool have[3] = {false, false, false};
  DType tier[3] = {DType::Bool, DType::Bool, DType::Bool};
  for (const auto& m : inputs) {
    int k = m.wrapped_number ? 2 : (m.shape.size() == 0 ? 1 : 0);
    DType t = m.dtype;
    if (k == 2 && is_floating(t)) t = default_dtype();
    if (k == 2 && is_integral(t)) t = DType::Int64;
    tier[k] = have[k] ? promote_types(tier[k], t) : t;
    have[k] = true;
  }
  DType r = DType::Bool;
  bool any = false;
  for (int k = 0; k < 3; ++k) {
    if (!have[k]) continue;
    if (!any) {
      r = tier[k];
      any = true;
    } else if (category(tier[k]) > category(r)) {
      r = (k == 2 && is_floating(tier[k])) ? default_dtype() : promote_types(r, tier[k]);
    }
  }
  return r;
}

uint32_t reduction_mask(const OpAttrs& attrs, int rank, const char* op, Loc loc) {
  if (attrs.all_dims || attrs.dims.empty()) return rank ? (1u << rank) - 1 : 0;
  uint32_t seen = 0;  // a 0-d input takes dim 0 (or -1) once, as in PyTorch, and reduces none
  for (int64_t d : attrs.dims) {
    int w = wrap_dim(d, rank, op, loc);
    KILN_CHECK(!(seen >> w & 1), op, loc, "dim {} appears more than once in {}", w,
               to_string(attrs.dims));
    seen |= 1u << w;
  }
  return rank ? seen : 0;
}

static InferredMeta infer_meta_unchecked(OpKind op, std::span<const TensorMeta> inputs,
                                         const OpAttrs& attrs, Loc loc);

/// What an invalid call was given, appended to every error infer_meta raises so that each one
/// names the op (Error's prefix), the input dtypes and the input shapes, whatever check failed:
/// "got float32 [2, 3], int64 [4]"; random ops (no tensor inputs): their dtype and size attrs.
static std::string inputs_str(OpKind op, std::span<const TensorMeta> inputs, const OpAttrs& a) {
  std::string s;
  for (const TensorMeta& m : inputs)
    s += fmt::format("{}{} {}", s.empty() ? "" : ", ", name(m.dtype), to_string(m.shape));
  if (inputs.empty() && op_info(op).category == OpCategory::Random)
    s = fmt::format("dtype {}, size {}", name(a.dtype), to_string(a.dims));
  return s.empty() ? "no tensor inputs" : s;
}

InferredMeta infer_meta(OpKind op, std::span<const TensorMeta> inputs, const OpAttrs& attrs,
                        Loc loc) {
  // A DType made from an integer out of range (static_cast<DType>(42)) would index the dtype
  // tables out of bounds.
  check_dtype(attrs.dtype, op_name(op).data(), loc);
  try {
    InferredMeta m = infer_meta_unchecked(op, inputs, attrs, loc);
    for (const OutputMeta& o : m.outputs)
      check_shape(o.shape, itemsize(o.dtype), op_name(op).data(), loc);
    return m;
  } catch (const Error& e) {
    throw Error(e.op(), e.message() + " (got " + inputs_str(op, inputs, attrs) + ")", e.where());
  }
}

static InferredMeta infer_meta_unchecked(OpKind op, std::span<const TensorMeta> inputs,
                                         const OpAttrs& attrs, Loc loc) {
  const OpInfo& info = op_info(op);
  KILN_CHECK(info.arity < 0 || static_cast<int>(inputs.size()) == info.arity ||
                 (op == OpKind::LayerNorm && !inputs.empty() && inputs.size() <= 3), info.name.data(),
             loc, "expects {} tensor inputs, got {}", info.arity, inputs.size());
  switch (info.category) {
    case OpCategory::Unary:
    case OpCategory::Binary: return elementwise(op, inputs, attrs, loc);
    case OpCategory::Ternary: return where(inputs, loc);
    case OpCategory::Reduction:
    case OpCategory::IndexReduction: return reduction(op, inputs, attrs, loc);
    case OpCategory::Normalization: return normalization(op, inputs, attrs, loc);
    case OpCategory::Matmul: return matmul(op, inputs, attrs, loc);
    case OpCategory::View: return view(op, inputs, attrs, loc);
    case OpCategory::Shape: return cat(inputs, attrs, loc);
    case OpCategory::Index: return index(op, inputs, attrs, loc);
    case OpCategory::Random: return random(op, inputs, attrs, loc);
    case OpCategory::Loss: return loss(op, inputs, attrs, loc);
    case OpCategory::Scan: return scan(op, inputs, attrs, loc);
    case OpCategory::Window: return window(op, inputs, attrs, loc);
    case OpCategory::Copy: {
      const TensorMeta& x = inputs[0];
      if (op == OpKind::Cast) return {x.dtype, {{attrs.dtype, x.shape}}};
      if (op == OpKind::Fill) check_scalar_fits(attrs.alpha, x.dtype, info.name.data(), loc);
      if (op == OpKind::CopyInto) {
        Shape b = broadcast_shapes(x.shape, inputs[1].shape, info.name.data(), loc);
        KILN_CHECK(b == x.shape, info.name.data(), loc,
                   "source of shape {} does not broadcast to destination shape {}",
                   to_string(inputs[1].shape), to_string(x.shape));
      }
      return {x.dtype, {{x.dtype, x.shape}}};
    }
  }
  (void)dtypes_str;
  return {};
}

}  // namespace kiln
