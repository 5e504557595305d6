// Tensor's op methods (declared in core/tensor.h): thin forwards to the dispatcher.
#include "eager/autograd.h"
#include "eager/dispatch.h"
#include "eager/ops.h"
#include "eager/view.h"

namespace kiln {
namespace {

Tensor view_op(OpKind op, const Tensor& x, OpAttrs a, Loc loc) {
  return dispatch::call1({op, {x}, std::move(a), loc});
}

// In-place update: x = op(x, y) for a binary op `kind` with `attrs`, written back into x's
// storage (dtype of x kept; a result of a higher category, e.g. float into an int tensor, is
// an error as in PyTorch). Every error names the in-place op (`add_` for `x += y`). `y` is the
// tensor operand, or `scalar` wrapped. `saves_self`: the op's backward reads x's value (mul_,
// div_: for x's gradient or for the gradient of y); when autograd records it, it computes from
// a clone of x (as PyTorch saves the original self), since the write into x would otherwise
// invalidate the saved value and backward() would fail. Without a temporary where the
// dispatcher can (dispatch::call_in_place), else out of place and copied back.
Tensor& in_place(Tensor& x, const char* op, OpKind kind, OpAttrs attrs, const Tensor& y,
                 const Scalar* scalar, bool saves_self, Loc loc) {
  return as_op(op, [&]() -> Tensor& {
    const Tensor operand = scalar ? dispatch::wrap_scalar(*scalar) : y;
    if (dispatch::call_in_place({kind, {x, operand}, attrs, loc})) return x;
    bool clone_self = saves_self && x.defined() && is_grad_enabled() &&
                      (x.requires_grad() || (y.defined() && y.requires_grad()));
    Tensor result = dispatch::call1({kind, {clone_self ? x.clone(loc) : x, operand}, attrs, loc});
    KILN_CHECK(category(result.dtype()) <= category(x.dtype()), op, loc,
               "result type {} can't be cast to the in-place output type {} (self: {} {}; "
               "other: {})",
               name(result.dtype()), name(x.dtype()), name(x.dtype()), to_string(x.shape()),
               scalar ? fmt::format("the scalar {}", scalar->str())
                      : fmt::format("{} {}", name(y.dtype()), to_string(y.shape())));
    KILN_CHECK(result.shape() == x.shape(), op, loc,
               "output with shape {} doesn't match the broadcast shape {}", to_string(x.shape()),
               to_string(result.shape()));
    return x.copy_(result, loc);
  });
}

OpAttrs alpha_one() {
  OpAttrs a;
  a.alpha = 1;
  return a;
}

}  // namespace

Tensor Tensor::to(DType dtype, Loc loc) const {
  if (defined() && dtype == this->dtype()) return *this;  // no copy, as in PyTorch
  OpAttrs a;
  a.dtype = dtype;
  return dispatch::call1({OpKind::Cast, {*this}, a, loc});
}
Tensor Tensor::clone(Loc loc) const {
  return as_op("clone", [&] { return dispatch::call1({OpKind::Contiguous, {*this}, {}, loc}); });
}
Tensor Tensor::contiguous(Loc loc) const {
  if (defined() && is_contiguous()) return *this;
  return as_op("contiguous", [&] { return clone(loc); });
}
Tensor& Tensor::copy_(const Tensor& src, Loc loc) {
  // Across devices (as in PyTorch): move the source over first, then copy on this device.
  if (defined() && src.defined() && src.device() != device() && !src.impl()->wrapped_number) {
    dispatch::call({OpKind::CopyInto, {*this, src.to(device(), loc)}, {}, loc});
    return *this;
  }
  dispatch::call({OpKind::CopyInto, {*this, src}, {}, loc});
  return *this;
}
Tensor& Tensor::fill_(Scalar value, Loc loc) {
  OpAttrs a;
  a.alpha = value;
  // As PyTorch, fill_ may write an expanded (stride-0) view, where several elements share one
  // memory location: each location is filled once, through a slice of length 1 of such dims.
  Tensor target = *this;
  for (int d = 0; defined() && d < dim(); ++d)
    if (strides()[d] == 0 && shape()[d] > 1) target = target.slice(d, 0, 1, 1, loc);
  dispatch::call({OpKind::Fill, {target}, a, loc});
  return *this;
}

Tensor Tensor::view(const Shape& shape, Loc loc) const {
  OpAttrs a;
  a.dims = shape;
  return view_op(OpKind::View, *this, a, loc);
}
Tensor Tensor::reshape(const Shape& shape, Loc loc) const {
  KILN_CHECK(defined(), "reshape", loc, "tensor is undefined");
  // A view when the strides allow it, a copy otherwise.
  OpAttrs a;
  a.dims = shape;
  return as_op("reshape", [&] {
    InferredMeta m = infer_meta(OpKind::View, std::array{TensorMeta::of(*this)}, a, loc);
    Strides st;
    if (view_strides(this->shape(), strides(), m.outputs[0].shape, st)) return view(shape, loc);
    return clone(loc).view(shape, loc);
  });
}
Tensor Tensor::transpose(int64_t d0, int64_t d1, Loc loc) const {
  OpAttrs a;
  a.dim = d0;
  a.dim1 = d1;
  return view_op(OpKind::Transpose, *this, a, loc);
}
Tensor Tensor::t(Loc loc) const {
  KILN_CHECK(defined() && dim() <= 2, "t", loc, "expects a tensor with <= 2 dims, got {}",
             defined() ? to_string(shape()) : "undefined");
  return dim() < 2 ? *this : transpose(0, 1, loc);
}
Tensor Tensor::permute(const Dims& order, Loc loc) const {
  OpAttrs a;
  a.dims = order;
  return view_op(OpKind::Permute, *this, a, loc);
}
Tensor Tensor::slice(int64_t dim, int64_t start, int64_t end, int64_t step, Loc loc) const {
  OpAttrs a;
  a.dim = dim;
  a.start = start;
  a.end = end;
  a.step = step;
  return view_op(OpKind::Slice, *this, a, loc);
}
Tensor Tensor::select(int64_t dim, int64_t index, Loc loc) const {
  OpAttrs a;
  a.dim = dim;
  a.start = index;
  return view_op(OpKind::Select, *this, a, loc);
}
Tensor Tensor::expand(const Shape& shape, Loc loc) const {
  OpAttrs a;
  a.dims = shape;
  return view_op(OpKind::Expand, *this, a, loc);
}
Tensor Tensor::squeeze(Loc loc) const {
  OpAttrs a;
  a.all_dims = true;
  return view_op(OpKind::Squeeze, *this, a, loc);
}
Tensor Tensor::squeeze(int64_t dim, Loc loc) const {
  OpAttrs a;
  a.dim = dim;
  return view_op(OpKind::Squeeze, *this, a, loc);
}
Tensor Tensor::unsqueeze(int64_t dim, Loc loc) const {
  OpAttrs a;
  a.dim = dim;
  return view_op(OpKind::Unsqueeze, *this, a, loc);
}
Tensor Tensor::flatten(int64_t start, int64_t end, Loc loc) const {
  KILN_CHECK(defined(), "flatten", loc, "tensor is undefined");
  int s = wrap_dim(start, dim(), "flatten", loc), e = wrap_dim(end, dim(), "flatten", loc);
  if (dim() == 0) return reshape({1}, loc);
  KILN_CHECK(s <= e, "flatten", loc, "start dim {} is after end dim {}", s, e);
  Shape out;
  for (int i = 0; i < s; ++i) out.push_back(shape()[i]);
  int64_t n = 1;
  for (int i = s; i <= e; ++i) n *= shape()[i];
  out.push_back(n);
  for (int i = e + 1; i < dim(); ++i) out.push_back(shape()[i]);
  return reshape(out, loc);
}

Tensor Tensor::sum(Loc loc) const { return kiln::sum(*this, {}, false, loc); }
Tensor Tensor::sum(const Dims& dims, bool keepdim, Loc loc) const {
  return kiln::sum(*this, dims, keepdim, loc);
}
Tensor Tensor::mean(Loc loc) const { return kiln::mean(*this, {}, false, loc); }
Tensor Tensor::mean(const Dims& dims, bool keepdim, Loc loc) const {
  return kiln::mean(*this, dims, keepdim, loc);
}
Tensor Tensor::matmul(const Tensor& other, Loc loc) const { return kiln::matmul(*this, other, loc); }
Tensor Tensor::index_select(int64_t dim, const Tensor& index, Loc loc) const {
  return kiln::index_select(*this, dim, index, loc);
}
Tensor Tensor::index_copy(int64_t dim, const Tensor& index, const Tensor& source,
                          Loc loc) const {
  return kiln::index_copy(*this, dim, index, source, loc);
}
Tensor& Tensor::index_copy_(int64_t dim, const Tensor& index, const Tensor& source, Loc loc) {
  return as_op("index_copy_", [&]() -> Tensor& {
    // Only the slices are written where the dispatcher can (eager, no autograd recording, a
    // contiguous CPU tensor); otherwise out of place and copied back.
    OpAttrs a;
    a.dim = dim;
    if (dispatch::call_in_place({OpKind::IndexCopy, {*this, index, source}, a, loc})) return *this;
    return copy_(kiln::index_copy(*this, dim, index, source, loc), loc);
  });
}

ValuesIndices Tensor::sort(int64_t dim, bool descending, Loc loc) const {
  return kiln::sort(*this, dim, descending, loc);
}
Tensor Tensor::argsort(int64_t dim, bool descending, Loc loc) const {
  return kiln::argsort(*this, dim, descending, loc);
}
ValuesIndices Tensor::topk(int64_t k, int64_t dim, bool largest, bool sorted, Loc loc) const {
  return kiln::topk(*this, k, dim, largest, sorted, loc);
}
Tensor Tensor::cumsum(int64_t dim, std::optional<DType> dtype, Loc loc) const {
  return kiln::cumsum(*this, dim, dtype, loc);
}

Tensor Tensor::exp(Loc loc) const { return kiln::exp(*this, loc); }
Tensor Tensor::log(Loc loc) const { return kiln::log(*this, loc); }
Tensor Tensor::sqrt(Loc loc) const { return kiln::sqrt(*this, loc); }
Tensor Tensor::rsqrt(Loc loc) const { return kiln::rsqrt(*this, loc); }
Tensor Tensor::abs(Loc loc) const { return kiln::abs(*this, loc); }
Tensor Tensor::neg(Loc loc) const { return kiln::neg(*this, loc); }
Tensor Tensor::relu(Loc loc) const { return kiln::relu(*this, loc); }
Tensor Tensor::sigmoid(Loc loc) const { return kiln::sigmoid(*this, loc); }
Tensor Tensor::tanh(Loc loc) const { return kiln::tanh(*this, loc); }
Tensor Tensor::pow(Scalar exponent, Loc loc) const { return kiln::pow(*this, exponent, loc); }
Tensor Tensor::clamp(std::optional<Scalar> low, std::optional<Scalar> high, Loc loc) const {
  return kiln::clamp(*this, low, high, loc);
}
Tensor Tensor::softmax(int64_t dim, Loc loc) const { return kiln::softmax(*this, dim, loc); }
Tensor Tensor::log_softmax(int64_t dim, Loc loc) const {
  return kiln::log_softmax(*this, dim, loc);
}
Tensor Tensor::amax(const Dims& dims, bool keepdim, Loc loc) const {
  return kiln::amax(*this, dims, keepdim, loc);
}
Tensor Tensor::amin(const Dims& dims, bool keepdim, Loc loc) const {
  return kiln::amin(*this, dims, keepdim, loc);
}
Tensor Tensor::prod(const Dims& dims, bool keepdim, Loc loc) const {
  return kiln::prod(*this, dims, keepdim, loc);
}
Tensor Tensor::var(const Dims& dims, int64_t correction, bool keepdim, Loc loc) const {
  return kiln::var(*this, dims, correction, keepdim, loc);
}
Tensor Tensor::std(const Dims& dims, int64_t correction, bool keepdim, Loc loc) const {
  return kiln::std(*this, dims, correction, keepdim, loc);
}
Tensor Tensor::logsumexp(const Dims& dims, bool keepdim, Loc loc) const {
  return kiln::logsumexp(*this, dims, keepdim, loc);
}
Tensor Tensor::all(const Dims& dims, bool keepdim, Loc loc) const {
  return kiln::all(*this, dims, keepdim, loc);
}
Tensor Tensor::any(const Dims& dims, bool keepdim, Loc loc) const {
  return kiln::any(*this, dims, keepdim, loc);
}
Tensor Tensor::max(Loc loc) const { return kiln::max(*this, loc); }
Tensor Tensor::min(Loc loc) const { return kiln::min(*this, loc); }
ValuesIndices Tensor::max(int64_t dim, bool keepdim, Loc loc) const {
  return kiln::max(*this, dim, keepdim, loc);
}
ValuesIndices Tensor::min(int64_t dim, bool keepdim, Loc loc) const {
  return kiln::min(*this, dim, keepdim, loc);
}
Tensor Tensor::argmax(std::optional<int64_t> dim, bool keepdim, Loc loc) const {
  return kiln::argmax(*this, dim, keepdim, loc);
}
Tensor Tensor::argmin(std::optional<int64_t> dim, bool keepdim, Loc loc) const {
  return kiln::argmin(*this, dim, keepdim, loc);
}
Tensor& Tensor::add_(TensorOperand other) { return *this += other; }
Tensor& Tensor::add_(ScalarOperand other) { return *this += other; }
Tensor& Tensor::sub_(TensorOperand other) { return *this -= other; }
Tensor& Tensor::sub_(ScalarOperand other) { return *this -= other; }
Tensor& Tensor::mul_(TensorOperand other) { return *this *= other; }
Tensor& Tensor::mul_(ScalarOperand other) { return *this *= other; }
Tensor& Tensor::div_(TensorOperand other) { return *this /= other; }
Tensor& Tensor::div_(ScalarOperand other) { return *this /= other; }

Tensor& Tensor::operator+=(TensorOperand o) {
  return in_place(*this, "add_", OpKind::Add, alpha_one(), o.tensor, nullptr, false, o.loc);
}
Tensor& Tensor::operator-=(TensorOperand o) {
  return in_place(*this, "sub_", OpKind::Sub, alpha_one(), o.tensor, nullptr, false, o.loc);
}
Tensor& Tensor::operator*=(TensorOperand o) {
  return in_place(*this, "mul_", OpKind::Mul, {}, o.tensor, nullptr, true, o.loc);
}
Tensor& Tensor::operator/=(TensorOperand o) {
  return in_place(*this, "div_", OpKind::Div, {}, o.tensor, nullptr, true, o.loc);
}
Tensor& Tensor::operator+=(ScalarOperand o) {
  return in_place(*this, "add_", OpKind::Add, alpha_one(), Tensor(), &o.scalar, false, o.loc);
}
Tensor& Tensor::operator-=(ScalarOperand o) {
  return in_place(*this, "sub_", OpKind::Sub, alpha_one(), Tensor(), &o.scalar, false, o.loc);
}
Tensor& Tensor::operator*=(ScalarOperand o) {
  return in_place(*this, "mul_", OpKind::Mul, {}, Tensor(), &o.scalar, true, o.loc);
}
Tensor& Tensor::operator/=(ScalarOperand o) {
  return in_place(*this, "div_", OpKind::Div, {}, Tensor(), &o.scalar, true, o.loc);
}

}  // namespace kiln
