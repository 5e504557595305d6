// Public op functions: each builds an OpCall and hands it to the dispatcher. Per-op code here is
// only argument packing; validation is in core/meta.cpp and computation in the backend.
#include "eager/ops.h"

#include <algorithm>
#include <limits>

#include "eager/dispatch.h"
#include "eager/factories.h"

namespace kiln {
namespace {

Tensor unary(OpKind op, const Tensor& x, Loc loc, OpAttrs a = {}) {
  return dispatch::call1({op, {x}, std::move(a), loc});
}
Tensor binary(OpKind op, const Tensor& x, const Tensor& y, Loc loc, OpAttrs a = {}) {
  return dispatch::call1({op, {x, y}, std::move(a), loc});
}
Tensor reduce(OpKind op, const Tensor& x, const Dims& dims, bool keepdim, Loc loc,
              int64_t mode = 0) {
  OpAttrs a;
  a.dims = dims;
  a.all_dims = dims.empty();
  a.keepdim = keepdim;
  a.mode = mode;
  return dispatch::call1({op, {x}, std::move(a), loc});
}
OpAttrs with_alpha(Scalar alpha) {
  OpAttrs a;
  a.alpha = alpha;
  return a;
}
OpAttrs with_dim(int64_t dim) {
  OpAttrs a;
  a.dim = dim;
  return a;
}
Tensor wrap(Scalar s) { return dispatch::wrap_scalar(s); }

}  // namespace

#define KILN_UNARY(fn, Kind) \
  Tensor fn(const Tensor& x, Loc loc) { return unary(OpKind::Kind, x, loc); }
KILN_UNARY(neg, Neg)
KILN_UNARY(abs, Abs)
KILN_UNARY(exp, Exp)
KILN_UNARY(exp2, Exp2)
KILN_UNARY(log, Log)
KILN_UNARY(log2, Log2)
KILN_UNARY(log1p, Log1p)
KILN_UNARY(expm1, Expm1)
KILN_UNARY(sqrt, Sqrt)
KILN_UNARY(rsqrt, Rsqrt)
KILN_UNARY(reciprocal, Reciprocal)
KILN_UNARY(sin, Sin)
KILN_UNARY(cos, Cos)
KILN_UNARY(tan, Tan)
KILN_UNARY(tanh, Tanh)
KILN_UNARY(sigmoid, Sigmoid)
KILN_UNARY(relu, Relu)
KILN_UNARY(silu, Silu)
KILN_UNARY(erf, Erf)
KILN_UNARY(floor, Floor)
KILN_UNARY(ceil, Ceil)
KILN_UNARY(round, Round)
KILN_UNARY(trunc, Trunc)
KILN_UNARY(logical_not, LogicalNot)
#undef KILN_UNARY

Tensor gelu(const Tensor& x, std::string_view approximate, Loc loc) {
  KILN_CHECK(approximate == "none" || approximate == "tanh", "gelu", loc,
             "approximate must be \"none\" or \"tanh\", got \"{}\"", approximate);
  OpAttrs a;
  a.mode = approximate == "tanh";
  return unary(OpKind::Gelu, x, loc, a);
}

Tensor clamp(const Tensor& x, std::optional<Scalar> low, std::optional<Scalar> high, Loc loc) {
  OpAttrs a;
  a.has_low = low.has_value();
  a.has_high = high.has_value();
  if (low) a.alpha = *low;
  if (high) a.beta = *high;
  return unary(OpKind::Clamp, x, loc, a);
}

Tensor add(const Tensor& a, const Tensor& b, Scalar alpha, Loc loc) {
  return binary(OpKind::Add, a, b, loc, with_alpha(alpha));
}
Tensor add(const Tensor& a, Scalar b, Scalar alpha, Loc loc) {
  return binary(OpKind::Add, a, wrap(b), loc, with_alpha(alpha));
}
Tensor sub(const Tensor& a, const Tensor& b, Scalar alpha, Loc loc) {
  return binary(OpKind::Sub, a, b, loc, with_alpha(alpha));
}
Tensor sub(const Tensor& a, Scalar b, Scalar alpha, Loc loc) {
  return binary(OpKind::Sub, a, wrap(b), loc, with_alpha(alpha));
}

#define KILN_BINARY(fn, Kind)                                                          \
  Tensor fn(const Tensor& a, const Tensor& b, Loc loc) {                               \
    return binary(OpKind::Kind, a, b, loc);                                            \
  }                                                                                    \
  Tensor fn(const Tensor& a, Scalar b, Loc loc) { return binary(OpKind::Kind, a, wrap(b), loc); }
KILN_BINARY(mul, Mul)
KILN_BINARY(div, Div)
KILN_BINARY(floor_divide, FloorDivide)
KILN_BINARY(remainder, Remainder)
KILN_BINARY(eq, Eq)
KILN_BINARY(ne, Ne)
KILN_BINARY(lt, Lt)
KILN_BINARY(le, Le)
KILN_BINARY(gt, Gt)
KILN_BINARY(ge, Ge)
#undef KILN_BINARY
Tensor pow(const Tensor& a, const Tensor& b, Loc loc) { return binary(OpKind::Pow, a, b, loc); }
Tensor pow(const Tensor& a, Scalar b, Loc loc) {
  // PyTorch's pow with a number exponent computes 0.5 and -0.5 as sqrt and rsqrt: pow(-inf,
  // 0.5) is nan and pow(-0, 0.5) is -0 there, where C's pow gives inf and 0.
  if (b.is_floating() && a.defined() && is_floating(a.dtype())) {
    if (b.to<double>() == 0.5) return sqrt(a, loc);
    if (b.to<double>() == -0.5) return rsqrt(a, loc);
  }
  KILN_CHECK(!a.defined() || is_floating(a.dtype()) || b.is_floating() || b.to<int64_t>() >= 0,
             "pow", loc, "integers to negative integer powers are not allowed ({} {} ** {})",
             name(a.dtype()), to_string(a.shape()), b.str());
  return binary(OpKind::Pow, a, wrap(b), loc);
}
#define KILN_BINARY_T(fn, Kind) \
  Tensor fn(const Tensor& a, const Tensor& b, Loc loc) { return binary(OpKind::Kind, a, b, loc); }
KILN_BINARY_T(maximum, Maximum)
KILN_BINARY_T(minimum, Minimum)
KILN_BINARY_T(atan2, Atan2)
KILN_BINARY_T(logical_and, LogicalAnd)
KILN_BINARY_T(logical_or, LogicalOr)
KILN_BINARY_T(logical_xor, LogicalXor)
#undef KILN_BINARY_T

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b, Loc loc) {
  return dispatch::call1({OpKind::Where, {cond, a, b}, {}, loc});
}
Tensor where(const Tensor& cond, const Tensor& a, Scalar b, Loc loc) {
  return where(cond, a, wrap(b), loc);
}
Tensor where(const Tensor& cond, Scalar a, const Tensor& b, Loc loc) {
  return where(cond, wrap(a), b, loc);
}
Tensor where(const Tensor& cond, Scalar a, Scalar b, Loc loc) {
  return where(cond, wrap(a), wrap(b), loc);
}

// Raise kiln::Error naming `op` and the user's line for an undefined input, before a composite
// op reads its dtype or shape (those accessors would name kiln's own line and op "tensor").
static void check_defined(const Tensor& x, const char* op, Loc loc) {
  KILN_CHECK(x.defined(), op, loc, "input 0 is an undefined tensor");
}
static void check_both_defined(const Tensor& a, const Tensor& b, const char* op, Loc loc) {
  KILN_CHECK(a.defined() && b.defined(), op, loc, "input {} is an undefined tensor",
             a.defined() ? 1 : 0);
}

// mode 1: the gradient of a NaN result goes to the NaNs (derivatives.cpp).
Tensor max(const Tensor& x, Loc loc) {
  return as_op("max", [&] { return reduce(OpKind::Amax, x, {}, false, loc, 1); });
}
Tensor min(const Tensor& x, Loc loc) {
  return as_op("min", [&] { return reduce(OpKind::Amin, x, {}, false, loc, 1); });
}
namespace {
// The element argmax / argmin picks, read with gather: its gradient goes to that element.
ValuesIndices values_at(const char* op, const Tensor& x, int64_t dim, bool keepdim, Loc loc) {
  check_defined(x, op, loc);
  return as_op(op, [&] {
    const bool is_max = std::string_view(op) == "max";
    // argmax has no bool kernel (as PyTorch's), but max(b, dim) works there: rank as int32,
    // once amax's checks have named the bool input (they named the int32 copy).
    if (x.dtype() == DType::Bool) {
      const int d = wrap_dim(dim, x.dim(), op, loc);
      KILN_CHECK(x.dim() == 0 || x.shape()[d] > 0, op, loc,
                 "cannot reduce over dim {} of size 0 (shape {}) (got bool {})", d,
                 to_string(x.shape()), to_string(x.shape()));
    }
    const Tensor ranked = x.dtype() == DType::Bool ? x.to(DType::Int32, loc) : x;
    Tensor idx = is_max ? argmax(ranked, dim, true, loc) : argmin(ranked, dim, true, loc);
    Tensor values = gather(x, dim, idx, loc);
    if (!keepdim) {
      values = values.squeeze(dim);
      idx = idx.squeeze(dim);
    }
    return ValuesIndices{values, idx};
  });
}
}  // namespace
ValuesIndices max(const Tensor& x, int64_t dim, bool keepdim, Loc loc) {
  return values_at("max", x, dim, keepdim, loc);
}
ValuesIndices min(const Tensor& x, int64_t dim, bool keepdim, Loc loc) {
  return values_at("min", x, dim, keepdim, loc);
}

Tensor isnan(const Tensor& x, Loc loc) {
  check_defined(x, "isnan", loc);
  return as_op("isnan", [&] { return ne(x, x, loc); });
}
Tensor isinf(const Tensor& x, Loc loc) {
  check_defined(x, "isinf", loc);
  return as_op("isinf", [&] {
    if (!is_floating(x.dtype())) return zeros_like(x, {DType::Bool}, loc);
    return eq(abs(x, loc), INFINITY, loc);
  });
}
Tensor isfinite(const Tensor& x, Loc loc) {
  check_defined(x, "isfinite", loc);
  return as_op("isfinite", [&] {
    if (!is_floating(x.dtype())) return ones_like(x, {DType::Bool}, loc);
    return lt(abs(x, loc), INFINITY, loc);  // NaN < inf is false
  });
}

namespace {
// isclose of two defined tensors whose shapes broadcast.
Tensor isclose_of_defined(const Tensor& a, const Tensor& b, double rtol, double atol,
                          bool equal_nan, Loc loc) {
  if (!is_floating(a.dtype()) && !is_floating(b.dtype())) {
    // Integers and bools: the difference is taken exactly in int64 (float64 holds integers
    // only up to 2^53, where 2^53 + 1 would be "close" to 2^53 at zero tolerance).
    Tensor x = a.to(DType::Int64, loc), y = b.to(DType::Int64, loc);
    Tensor close = eq(x, y, loc);
    if (rtol == 0 && atol == 0) return close;
    // |x - y| exactly where the int64 difference cannot overflow, else in float64 (far beyond
    // any tolerance an integer comparison uses, where rounding does not matter).
    Tensor wide = abs(sub(x.to(DType::Float64, loc), y.to(DType::Float64, loc), 1, loc), loc);
    Tensor exact = abs(sub(x, y, 1, loc), loc).to(DType::Float64, loc);
    Tensor error = where(lt(wide, 0x1p62, loc), exact, wide, loc);
    Tensor allowed = add(mul(abs(y, loc).to(DType::Float64, loc), rtol, loc), atol, 1, loc);
    return logical_or(close, le(error, allowed, loc), loc);
  }
  auto as_float = [&](const Tensor& t) {
    return is_floating(t.dtype()) ? t : t.to(DType::Float64, loc);
  };
  Tensor x = as_float(a), y = as_float(b);
  // Equal (equal infinities too), or finite and within tolerance (an infinite b would make
  // the tolerance infinite: inf and -inf are not close).
  Tensor within = le(abs(sub(x, y, 1, loc), loc), add(mul(abs(y, loc), rtol, loc), atol, 1, loc),
                     loc);
  Tensor close = logical_or(eq(x, y, loc), logical_and(within, isfinite(y, loc), loc), loc);
  if (equal_nan) close = logical_or(close, logical_and(isnan(x, loc), isnan(y, loc), loc), loc);
  return close;
}
}  // namespace

Tensor isclose(const Tensor& a, const Tensor& b, double rtol, double atol, bool equal_nan,
               Loc loc) {
  check_both_defined(a, b, "isclose", loc);
  KILN_CHECK(rtol >= 0 && atol >= 0, "isclose", loc, "rtol ({}) and atol ({}) must be >= 0",
             rtol, atol);
  broadcast_shapes(a.shape(), b.shape(), "isclose", loc);  // the error names isclose
  return as_op("isclose", [&] { return isclose_of_defined(a, b, rtol, atol, equal_nan, loc); });
}

bool allclose(const Tensor& a, const Tensor& b, double rtol, double atol, bool equal_nan,
              Loc loc) {
  check_both_defined(a, b, "allclose", loc);
  return as_op("allclose", [&] {
    return all(isclose(a, b, rtol, atol, equal_nan, loc), {}, false, loc).item<bool>(loc);
  });
}

bool equal(const Tensor& a, const Tensor& b, Loc loc) {
  check_both_defined(a, b, "equal", loc);
  if (a.shape() != b.shape()) return false;
  return all(eq(a, b, loc), {}, false, loc).item<bool>(loc);
}

Tensor operator-(TensorOperand x) { return neg(x.tensor, x.loc); }
Tensor operator+(TensorOperand a, const Tensor& b) { return add(a.tensor, b, 1, a.loc); }
Tensor operator-(TensorOperand a, const Tensor& b) { return sub(a.tensor, b, 1, a.loc); }
Tensor operator*(TensorOperand a, const Tensor& b) { return mul(a.tensor, b, a.loc); }
Tensor operator/(TensorOperand a, const Tensor& b) { return div(a.tensor, b, a.loc); }
Tensor operator+(TensorOperand a, Scalar b) { return add(a.tensor, b, 1, a.loc); }
Tensor operator-(TensorOperand a, Scalar b) { return sub(a.tensor, b, 1, a.loc); }
Tensor operator*(TensorOperand a, Scalar b) { return mul(a.tensor, b, a.loc); }
Tensor operator/(TensorOperand a, Scalar b) { return div(a.tensor, b, a.loc); }
Tensor operator+(Scalar a, TensorOperand b) { return add(wrap(a), b.tensor, 1, b.loc); }
Tensor operator-(Scalar a, TensorOperand b) { return sub(wrap(a), b.tensor, 1, b.loc); }
Tensor operator*(Scalar a, TensorOperand b) { return mul(wrap(a), b.tensor, b.loc); }
Tensor operator/(Scalar a, TensorOperand b) { return div(wrap(a), b.tensor, b.loc); }
Tensor operator<(TensorOperand a, const Tensor& b) { return lt(a.tensor, b, a.loc); }
Tensor operator<=(TensorOperand a, const Tensor& b) { return le(a.tensor, b, a.loc); }
Tensor operator>(TensorOperand a, const Tensor& b) { return gt(a.tensor, b, a.loc); }
Tensor operator>=(TensorOperand a, const Tensor& b) { return ge(a.tensor, b, a.loc); }
Tensor operator<(TensorOperand a, Scalar b) { return lt(a.tensor, b, a.loc); }
Tensor operator<=(TensorOperand a, Scalar b) { return le(a.tensor, b, a.loc); }
Tensor operator>(TensorOperand a, Scalar b) { return gt(a.tensor, b, a.loc); }
Tensor operator>=(TensorOperand a, Scalar b) { return ge(a.tensor, b, a.loc); }
Tensor operator<(Scalar a, TensorOperand b) { return gt(b.tensor, a, b.loc); }
Tensor operator<=(Scalar a, TensorOperand b) { return ge(b.tensor, a, b.loc); }
Tensor operator>(Scalar a, TensorOperand b) { return lt(b.tensor, a, b.loc); }
Tensor operator>=(Scalar a, TensorOperand b) { return le(b.tensor, a, b.loc); }
Tensor operator==(TensorOperand a, const Tensor& b) { return eq(a.tensor, b, a.loc); }
Tensor operator!=(TensorOperand a, const Tensor& b) { return ne(a.tensor, b, a.loc); }
Tensor operator==(TensorOperand a, Scalar b) { return eq(a.tensor, b, a.loc); }
Tensor operator!=(TensorOperand a, Scalar b) { return ne(a.tensor, b, a.loc); }
Tensor operator==(Scalar a, TensorOperand b) { return eq(b.tensor, a, b.loc); }
Tensor operator!=(Scalar a, TensorOperand b) { return ne(b.tensor, a, b.loc); }
Tensor operator%(TensorOperand a, const Tensor& b) { return remainder(a.tensor, b, a.loc); }
Tensor operator%(TensorOperand a, Scalar b) { return remainder(a.tensor, b, a.loc); }
Tensor operator%(Scalar a, TensorOperand b) { return remainder(wrap(a), b.tensor, b.loc); }
Tensor operator!(TensorOperand x) { return logical_not(x.tensor, x.loc); }

Tensor sum(const Tensor& x, const Dims& d, bool k, Loc loc) { return reduce(OpKind::Sum, x, d, k, loc); }
Tensor mean(const Tensor& x, const Dims& d, bool k, Loc loc) { return reduce(OpKind::Mean, x, d, k, loc); }
Tensor prod(const Tensor& x, const Dims& d, bool k, Loc loc) { return reduce(OpKind::Prod, x, d, k, loc); }
Tensor amax(const Tensor& x, const Dims& d, bool k, Loc loc) { return reduce(OpKind::Amax, x, d, k, loc); }
Tensor amin(const Tensor& x, const Dims& d, bool k, Loc loc) { return reduce(OpKind::Amin, x, d, k, loc); }
Tensor all(const Tensor& x, const Dims& d, bool k, Loc loc) { return reduce(OpKind::All, x, d, k, loc); }
Tensor any(const Tensor& x, const Dims& d, bool k, Loc loc) { return reduce(OpKind::Any, x, d, k, loc); }
Tensor var(const Tensor& x, const Dims& d, int64_t correction, bool k, Loc loc) {
  return reduce(OpKind::Var, x, d, k, loc, correction);
}
Tensor std(const Tensor& x, const Dims& d, int64_t correction, bool k, Loc loc) {
  return reduce(OpKind::Std, x, d, k, loc, correction);
}
Tensor logsumexp(const Tensor& x, const Dims& d, bool k, Loc loc) {
  return reduce(OpKind::LogSumExp, x, d, k, loc);
}
static Tensor arg_reduce(OpKind op, const Tensor& x, std::optional<int64_t> dim, bool keepdim,
                         Loc loc) {
  OpAttrs a;
  a.all_dims = !dim.has_value();
  a.dim = dim.value_or(0);
  a.keepdim = keepdim;
  return unary(op, x, loc, a);
}
Tensor argmax(const Tensor& x, std::optional<int64_t> dim, bool keepdim, Loc loc) {
  return arg_reduce(OpKind::Argmax, x, dim, keepdim, loc);
}
Tensor argmin(const Tensor& x, std::optional<int64_t> dim, bool keepdim, Loc loc) {
  return arg_reduce(OpKind::Argmin, x, dim, keepdim, loc);
}
namespace {
// The first k indices (-1: all) of argsort along dim.
Tensor sorted_indices(const Tensor& x, int64_t dim, bool descending, int64_t k, Loc loc) {
  OpAttrs a = with_dim(dim);
  a.descending = descending;
  a.mode = k;
  return unary(OpKind::ArgSort, x, loc, std::move(a));
}
}  // namespace
Tensor argsort(const Tensor& x, int64_t dim, bool descending, Loc loc) {
  return sorted_indices(x, dim, descending, -1, loc);
}
ValuesIndices sort(const Tensor& x, int64_t dim, bool descending, Loc loc) {
  check_defined(x, "sort", loc);
  return as_op("sort", [&] {
    Tensor idx = sorted_indices(x, dim, descending, -1, loc);
    return ValuesIndices{gather(x, dim, idx, loc), idx};
  });
}
ValuesIndices topk(const Tensor& x, int64_t k, int64_t dim, bool largest, bool sorted, Loc loc) {
  check_defined(x, "topk", loc);
  (void)sorted;  // always sorted (PyTorch leaves the order unspecified for sorted = false)
  return as_op("topk", [&] {
    KILN_CHECK(k >= 0, "topk", loc, "k ({}) must not be negative (got {} {})", k,
               name(x.dtype()), to_string(x.shape()));
    Tensor idx = sorted_indices(x, dim, largest, k, loc);
    return ValuesIndices{gather(x, dim, idx, loc), idx};
  });
}
Tensor cumsum(const Tensor& x, int64_t dim, std::optional<DType> dtype, Loc loc) {
  check_defined(x, "cumsum", loc);
  return as_op("cumsum", [&] {
    return unary(OpKind::CumSum, dtype ? x.to(*dtype, loc) : x, loc, with_dim(dim));
  });
}
Tensor softmax(const Tensor& x, int64_t dim, Loc loc) {
  return unary(OpKind::Softmax, x, loc, with_dim(dim));
}
Tensor log_softmax(const Tensor& x, int64_t dim, Loc loc) {
  return unary(OpKind::LogSoftmax, x, loc, with_dim(dim));
}

Tensor matmul(const Tensor& a, const Tensor& b, Loc loc) { return binary(OpKind::Matmul, a, b, loc); }
Tensor bmm(const Tensor& a, const Tensor& b, Loc loc) {
  KILN_CHECK(a.defined() && b.defined() && a.dim() == 3 && b.dim() == 3 && a.size(0) == b.size(0),
             "bmm", loc, "expects [B, n, k] and [B, k, m], got {} and {}",
             a.defined() ? to_string(a.shape()) : "undefined",
             b.defined() ? to_string(b.shape()) : "undefined");
  return as_op("bmm", [&] { return matmul(a, b, loc); });
}
Tensor addmm(const Tensor& bias, const Tensor& a, const Tensor& b, Scalar beta, Scalar alpha,
             Loc loc) {
  OpAttrs at;
  at.alpha = alpha;
  at.beta = beta;
  return dispatch::call1({OpKind::Addmm, {bias, a, b}, at, loc});
}
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias, Loc loc) {
  KILN_CHECK(weight.defined() && weight.dim() == 2, "linear", loc,
             "weight must be 2-D [out_features, in_features]");
  KILN_CHECK(!x.defined() || x.dim() == 0 || x.size(-1) == weight.size(1), "linear", loc,
             "the input {} has {} features in its last dim; the weight {} [out_features, "
             "in_features] takes {}",
             to_string(x.shape()), x.size(-1), to_string(weight.shape()), weight.size(1));
  // A bias whose last dim is neither out_features nor 1: the message names the bias (the addmm
  // or add below would name shapes of their own, the weight transposed).
  KILN_CHECK(!bias.defined() || bias.dim() == 0 || bias.size(-1) == 1 ||
                 bias.size(-1) == weight.size(0),
             "linear", loc,
             "the bias {} has {} elements in its last dim; the weight {} [out_features, "
             "in_features] gives {} out_features",
             to_string(bias.shape()), bias.size(-1), to_string(weight.shape()), weight.size(0));
  return as_op("linear", [&] {
    if (bias.defined() && x.defined() && x.dim() == 2)
      return addmm(bias, x, weight.t(loc), 1, 1, loc);
    Tensor y = matmul(x, weight.t(loc), loc);
    return bias.defined() ? add(y, bias, 1, loc) : y;
  });
}

Tensor sign(const Tensor& x, Loc loc) {
  // PyTorch: a bool's sign is itself (true is +1), returned as a copy like other dtypes'.
  if (x.defined() && x.dtype() == DType::Bool) return x.clone(loc);
  return unary(OpKind::Sign, x, loc);
}

Tensor cat(const std::vector<Tensor>& xs, int64_t dim, Loc loc) {
  // PyTorch's legacy rule: a 1-D tensor of size 0 joins a cat of tensors of any rank. It becomes
  // a size-0 slab of the others' shape (a view), so it still takes part in dtype promotion and
  // gets its (empty) gradient, and the kernels see one rank.
  auto legacy_empty = [](const Tensor& t) {
    return t.defined() && t.dim() == 1 && t.numel() == 0;
  };
  auto ref = std::find_if(xs.begin(), xs.end(),
                          [&](const Tensor& t) { return t.defined() && !legacy_empty(t); });
  if (ref == xs.end() || ref->dim() == 1)
    return dispatch::call1({OpKind::Cat, xs, with_dim(dim), loc});
  Shape slab = ref->shape();
  slab[wrap_dim(dim, ref->dim(), "cat", loc)] = 0;
  std::vector<Tensor> parts = xs;
  for (Tensor& t : parts)
    if (legacy_empty(t)) t = t.view(slab, loc);
  return dispatch::call1({OpKind::Cat, parts, with_dim(dim), loc});
}
Tensor stack(const std::vector<Tensor>& xs, int64_t dim, Loc loc) {
  KILN_CHECK(!xs.empty(), "stack", loc, "expects a non-empty list of tensors");
  for (size_t i = 0; i < xs.size(); ++i)
    KILN_CHECK(xs[i].defined(), "stack", loc, "tensor {} of the list is undefined", i);
  for (const Tensor& x : xs)
    KILN_CHECK(x.defined() && x.shape() == xs[0].shape(), "stack", loc,
               "all tensors must have the same shape, got {} and {}", to_string(xs[0].shape()),
               x.defined() ? to_string(x.shape()) : "undefined");
  int d = wrap_dim(dim, xs[0].dim() + 1, "stack", loc);
  return as_op("stack", [&] {  // unsqueeze's errors (a rank limit) name stack
    std::vector<Tensor> us;
    for (const Tensor& x : xs) us.push_back(x.unsqueeze(d, loc));
    return cat(us, d, loc);
  });
}
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim, Loc loc) {
  KILN_CHECK(x.defined(), "split", loc, "the tensor to split is undefined");
  KILN_CHECK(x.dim() > 0, "split", loc, "a 0-d tensor cannot be split");
  int d = wrap_dim(dim, x.dim(), "split", loc);
  int64_t total = 0;
  for (int64_t s : sizes) {
    KILN_CHECK(s >= 0, "split", loc, "negative split size {}", s);
    total += s;
  }
  KILN_CHECK(total == x.size(d), "split", loc, "sizes sum to {}, but dim {} has size {}", total,
             d, x.size(d));
  std::vector<Tensor> out;
  int64_t at = 0;
  for (int64_t s : sizes) {
    out.push_back(x.slice(d, at, at + s, 1, loc));
    at += s;
  }
  return out;
}
std::vector<Tensor> split(const Tensor& x, int64_t size, int64_t dim, Loc loc) {
  KILN_CHECK(x.defined(), "split", loc, "the tensor to split is undefined");
  KILN_CHECK(x.dim() > 0, "split", loc, "a 0-d tensor cannot be split");
  int d = wrap_dim(dim, x.dim(), "split", loc);
  // PyTorch allows size 0 for an empty dim only (one empty piece).
  KILN_CHECK(size > 0 || (size == 0 && x.size(d) == 0), "split", loc,
             "split size must be positive (or 0 for an empty dim), got {} for dim {} of size {}",
             size, d, x.size(d));
  std::vector<int64_t> sizes;
  for (int64_t at = 0; at < x.size(d); at += size) sizes.push_back(std::min(size, x.size(d) - at));
  if (sizes.empty()) sizes.push_back(0);
  return split(x, sizes, d, loc);
}
std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim, Loc loc) {
  KILN_CHECK(x.defined(), "chunk", loc, "the tensor to chunk is undefined");
  KILN_CHECK(chunks > 0, "chunk", loc, "chunks must be positive, got {}", chunks);
  KILN_CHECK(x.dim() > 0, "chunk", loc, "a 0-d tensor cannot be chunked");
  int d = wrap_dim(dim, x.dim(), "chunk", loc);
  // An empty dim gives `chunks` empty pieces, as in PyTorch (split by size gives one).
  // (A million pieces or more were a std::bad_alloc, not a kiln::Error: a break-it pass.)
  constexpr int64_t kMaxEmptyPieces = int64_t{1} << 20;
  if (x.size(d) == 0) {
    KILN_CHECK(chunks < kMaxEmptyPieces, "chunk", loc,
               "{} chunks of an empty dim would be {} empty tensors; at most {}", chunks, chunks,
               kMaxEmptyPieces - 1);
    return split(x, std::vector<int64_t>(chunks, 0), d, loc);
  }
  // ceil(size / chunks) without overflow: size + chunks - 1 overflowed for chunks near
  // INT64_MAX (split then blamed a size of 0).
  const int64_t size = x.size(d) / chunks + (x.size(d) % chunks != 0);
  return split(x, size, d, loc);
}

Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index, Loc loc) {
  return binary(OpKind::IndexSelect, x, index, loc, with_dim(dim));
}
Tensor gather(const Tensor& x, int64_t dim, const Tensor& index, Loc loc) {
  return binary(OpKind::Gather, x, index, loc, with_dim(dim));
}
Tensor index_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& source,
                 Loc loc) {
  return dispatch::call1({OpKind::IndexAdd, {x, index, source}, with_dim(dim), loc});
}
Tensor index_copy(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& source,
                  Loc loc) {
  return dispatch::call1({OpKind::IndexCopy, {x, index, source}, with_dim(dim), loc});
}
Tensor scatter_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src, Loc loc) {
  return dispatch::call1({OpKind::ScatterAdd, {x, index, src}, with_dim(dim), loc});
}
Tensor embedding(const Tensor& weight, const Tensor& indices, Loc loc) {
  return binary(OpKind::Embedding, weight, indices, loc);
}
Tensor one_hot(const Tensor& indices, int64_t num_classes, Loc loc) {
  KILN_CHECK(indices.defined(), "one_hot", loc, "indices are undefined");
  if (num_classes == -1) {
    KILN_CHECK(indices.numel() > 0, "one_hot", loc,
               "cannot infer num_classes from an empty tensor; pass it explicitly");
    const int64_t largest = amax(indices, {}, false, loc).item<int64_t>(loc);
    KILN_CHECK(largest < std::numeric_limits<int64_t>::max(), "one_hot", loc,
               "the largest index {} leaves no num_classes (largest + 1) in int64", largest);
    KILN_CHECK(largest >= 0, "one_hot", loc, "indices must be >= 0, got {}", largest);
    num_classes = largest + 1;
  }
  OpAttrs a;
  a.mode = num_classes;
  return unary(OpKind::OneHot, indices, loc, a);
}
Tensor masked_fill(const Tensor& x, const Tensor& mask, Scalar value, Loc loc) {
  // The result has the broadcast shape of x and mask, as PyTorch's out-of-place masked_fill:
  // x is expanded (a view) when the mask is the larger one.
  if (x.defined() && mask.defined() && x.shape() != mask.shape()) {
    Shape b = broadcast_shapes(x.shape(), mask.shape(), "masked_fill", loc);
    if (b != x.shape())
      return as_op("masked_fill", [&] {
        return binary(OpKind::MaskedFill, x.expand(b, loc), mask, loc, with_alpha(value));
      });
  }
  return binary(OpKind::MaskedFill, x, mask, loc, with_alpha(value));
}
Tensor tril(const Tensor& x, int64_t diagonal, Loc loc) {
  OpAttrs a;
  a.mode = diagonal;
  return unary(OpKind::Tril, x, loc, a);
}
Tensor triu(const Tensor& x, int64_t diagonal, Loc loc) {
  OpAttrs a;
  a.mode = diagonal;
  return unary(OpKind::Triu, x, loc, a);
}
Tensor broadcast_to(const Tensor& x, const Shape& shape, Loc loc) {
  return as_op("broadcast_to", [&] { return x.expand(shape, loc); });
}

Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight,
                  const Tensor& bias, double eps, Loc loc) {
  // A negative eps gave NaN rows silently (LayerNorm.eps set after construction: a break-it
  // pass); the module's constructor checked it only once.
  KILN_CHECK(eps >= 0, "layer_norm", loc, "eps must be >= 0, got {}", eps);
  OpAttrs a;
  a.dims = normalized_shape;
  a.eps = eps;
  return dispatch::call1({OpKind::LayerNorm, {x, weight, bias}, a, loc});
}
Tensor dropout(const Tensor& x, double p, bool training, Loc loc) {
  KILN_CHECK(p >= 0 && p <= 1, "dropout", loc, "probability must be in [0, 1], got {}", p);
  if (!training || p == 0) return x;  // an alias of x, as in PyTorch
  OpAttrs a;
  a.p = p;
  return draw_random(static_cast<uint64_t>(x.defined() ? x.numel() : 0),
                     [&](uint64_t seed, uint64_t offset) {
                       a.seed = seed;
                       a.offset = offset;
                       return unary(OpKind::Dropout, x, loc, a);
                     });
}
Tensor nll_loss(const Tensor& log_probs, const Tensor& target, Reduction reduction,
                int64_t ignore_index, Loc loc) {
  OpAttrs a;
  a.mode = static_cast<int64_t>(reduction);
  a.ignore_index = ignore_index;
  if (!log_probs.defined() || !target.defined() || log_probs.dim() <= 2)
    return binary(OpKind::NllLoss, log_probs, target, loc, a);
  // K-dimensional input [N, C, d1, ...] with target [N, d1, ...] (PyTorch): the class dim moved
  // last and the rest flattened, [N·d1·..., C] with target [N·d1·...]; None reshapes back.
  return as_op("nll_loss", [&] {
    Shape expected = log_probs.shape();
    expected.erase(1);
    KILN_CHECK(target.dtype() == DType::Int64 || target.dtype() == DType::Int32, "nll_loss", loc,
               "expects integer class indices as target, got {} {} for input {}",
               kiln::name(target.dtype()), to_string(target.shape()), to_string(log_probs.shape()));
    KILN_CHECK(target.shape() == expected, "nll_loss", loc,
               "expects target {} for input {} ([N, C, d1, ...] with target [N, d1, ...]), got {}",
               to_string(expected), to_string(log_probs.shape()), to_string(target.shape()));
    Dims order{0};
    for (int d = 2; d < log_probs.dim(); ++d) order.push_back(d);
    order.push_back(1);
    Tensor flat = log_probs.permute(order, loc).reshape({-1, log_probs.size(1)}, loc);
    Tensor loss = binary(OpKind::NllLoss, flat, target.reshape({-1}, loc), loc, a);
    return reduction == Reduction::None ? loss.view(target.shape(), loc) : loss;
  });
}
Tensor cross_entropy(const Tensor& logits, const Tensor& target, Reduction reduction,
                     int64_t ignore_index, Loc loc) {
  return as_op("cross_entropy", [&] {
    // The class dim is 1, or 0 for an unbatched [C] input (NllLoss takes it with a 0-d target).
    const int64_t class_dim = logits.defined() && logits.dim() == 1 ? 0 : 1;
    return nll_loss(log_softmax(logits, class_dim, loc), target, reduction, ignore_index, loc);
  });
}
namespace {
OpAttrs window_attrs(Size2 kernel, Size2 dilation, Size2 padding, Size2 stride) {
  OpAttrs a;
  a.dims = Window2d{kernel.h, kernel.w, dilation.h, dilation.w, padding.h, padding.w,
                    stride.h, stride.w}.dims();
  a.alpha = 0;
  return a;
}
// The windows of a pool, [N, C, kh*kw, Ho, Wo]; padding reads `pad_value`.
Tensor pool_windows(const char* op, const Tensor& x, Size2 kernel, std::optional<Size2> stride,
                    Size2 padding, Size2 dilation, double pad_value, Loc loc) {
  check_defined(x, op, loc);
  KILN_CHECK(x.dim() == 4, op, loc, "expects a 4-D input [N, C, H, W], got {}",
             to_string(x.shape()));
  // PyTorch's check: a window past the padding always overlaps the input.
  KILN_CHECK(padding.h >= 0 && padding.w >= 0 && padding.h <= kernel.h / 2 &&
                 padding.w <= kernel.w / 2,
             op, loc, "padding [{}, {}] must be non-negative and at most half the kernel [{}, {}]",
             padding.h, padding.w, kernel.h, kernel.w);
  const Size2 step = stride.value_or(kernel);
  OpAttrs a = window_attrs(kernel, dilation, padding, step);
  a.alpha = pad_value;
  Tensor cols = unary(OpKind::Unfold, x, loc, std::move(a));
  const int64_t ho = window_positions(x.size(2), kernel.h, dilation.h, padding.h, step.h);
  const int64_t wo = window_positions(x.size(3), kernel.w, dilation.w, padding.w, step.w);
  return cols.view({x.size(0), x.size(1), kernel.h * kernel.w, ho, wo}, loc);
}
}  // namespace

Tensor unfold(const Tensor& x, Size2 kernel, Size2 dilation, Size2 padding, Size2 stride,
              Loc loc) {
  return unary(OpKind::Unfold, x, loc, window_attrs(kernel, dilation, padding, stride));
}
Tensor fold(const Tensor& cols, Size2 output_size, Size2 kernel, Size2 dilation, Size2 padding,
            Size2 stride, Loc loc) {
  OpAttrs a;
  a.dims = {output_size.h, output_size.w};
  for (int64_t v : window_attrs(kernel, dilation, padding, stride).dims) a.dims.push_back(v);
  return unary(OpKind::Fold, cols, loc, std::move(a));
}
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, Size2 stride,
              Size2 padding, Size2 dilation, int64_t groups, Loc loc) {
  check_both_defined(x, weight, "conv2d", loc);
  KILN_CHECK(x.dim() == 4, "conv2d", loc, "expects a 4-D input [N, C, H, W], got {}",
             to_string(x.shape()));
  KILN_CHECK(weight.dim() == 4, "conv2d", loc,
             "weight must be 4-D [out_channels, in_channels / groups, kh, kw], got {}",
             to_string(weight.shape()));
  KILN_CHECK(groups >= 1, "conv2d", loc, "groups must be positive, got {}", groups);
  const int64_t n = x.size(0), c = x.size(1), o = weight.size(0);
  KILN_CHECK(c % groups == 0 && o % groups == 0, "conv2d", loc,
             "in_channels ({}, input {}) and out_channels ({}, weight {}) must both be "
             "divisible by groups ({})",
             c, to_string(x.shape()), o, to_string(weight.shape()), groups);
  KILN_CHECK(weight.size(1) * groups == c, "conv2d", loc,
             "the weight {} with groups = {} takes {} input channels, but the input {} has {}",
             to_string(weight.shape()), groups, weight.size(1) * groups, to_string(x.shape()), c);
  KILN_CHECK(x.dtype() == weight.dtype(), "conv2d", loc,
             "the input ({}) and the weight ({}) must have the same dtype", name(x.dtype()),
             name(weight.dtype()));
  KILN_CHECK(!bias.defined() || (bias.dim() == 1 && bias.size(0) == o), "conv2d", loc,
             "the bias must be [{}] (out_channels of the weight {}), got {}", o,
             to_string(weight.shape()), to_string(bias.shape()));
  return as_op("conv2d", [&] {
    const Size2 k(weight.size(2), weight.size(3));
    Tensor cols = unfold(x, k, dilation, padding, stride, loc);  // [N, C*kh*kw, L]
    const int64_t rows = cols.size(1) / groups, l = cols.size(2);
    // One matmul per group: [g, O/g, rows] @ [N, g, rows, L] -> [N, g, O/g, L].
    Tensor w = weight.reshape({groups, o / groups, rows}, loc);
    Tensor y = matmul(w, cols.view({n, groups, rows, l}, loc), loc);
    y = y.view({n, o, window_positions(x.size(2), k.h, dilation.h, padding.h, stride.h),
                window_positions(x.size(3), k.w, dilation.w, padding.w, stride.w)},
               loc);
    return bias.defined() ? add(y, bias.view({o, 1, 1}, loc), 1, loc) : y;
  });
}
Tensor max_pool2d(const Tensor& x, Size2 kernel, std::optional<Size2> stride, Size2 padding,
                  Size2 dilation, Loc loc) {
  return as_op("max_pool2d", [&] {
    // max(dim) gives the gradient to the first maximum, as PyTorch's max_pool2d.
    return max(pool_windows("max_pool2d", x, kernel, stride, padding, dilation, -INFINITY, loc),
               2, false, loc)
        .values;
  });
}
Tensor avg_pool2d(const Tensor& x, Size2 kernel, std::optional<Size2> stride, Size2 padding,
                  Loc loc) {
  return as_op("avg_pool2d", [&] {
    return mean(pool_windows("avg_pool2d", x, kernel, stride, padding, 1, 0, loc), {2}, false,
                loc);
  });
}

Tensor mse_loss(const Tensor& a, const Tensor& b, Reduction reduction, Loc loc) {
  OpAttrs at;
  at.mode = static_cast<int64_t>(reduction);
  return binary(OpKind::MseLoss, a, b, loc, at);
}

}  // namespace kiln
