#include "eager/view.h"

namespace kiln {

bool view_strides(const Shape& shape, const Strides& strides, const Shape& new_shape,
                  Strides& out) {
  // Walk chunks of old dims that are contiguous among themselves and match each chunk with
  // new dims of the same element count (the algorithm of PyTorch's computeStride).
  out = Dims::filled(new_shape.size(), 0);
  if (numel(shape) == 0) {
    out = contiguous_strides(new_shape);
    return true;
  }
  if (shape.size() == 0) {
    for (int i = new_shape.size() - 1, s = 1; i >= 0; --i) out[i] = s;
    return true;
  }
  int view_d = new_shape.size() - 1;
  int64_t chunk_base_stride = strides.back();
  int64_t tensor_numel = 1, view_numel = 1;
  for (int d = shape.size() - 1; d >= 0; --d) {
    tensor_numel *= shape[d];
    if (d == 0 || (shape[d - 1] != 1 && strides[d - 1] != tensor_numel * chunk_base_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || new_shape[view_d] == 1)) {
        out[view_d] = view_numel * chunk_base_stride;
        view_numel *= new_shape[view_d];
        --view_d;
      }
      if (view_numel != tensor_numel) return false;
      if (d > 0) {
        chunk_base_stride = strides[d - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  return view_d == -1;
}

Tensor make_view(const OpCall& call, const InferredMeta& meta) {
  const Tensor& x = call.inputs[0];
  const OpAttrs& a = call.attrs;
  const Shape& s = x.shape();
  const Strides& st = x.strides();
  int r = x.dim();
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = x.storage();
  impl->lineage = x.impl()->lineage;
  impl->base = x.impl()->base ? x.impl()->base : x.impl_ptr();
  impl->dtype = x.dtype();
  impl->offset = x.offset();
  impl->shape = meta.outputs[0].shape;
  Strides& out = impl->strides;
  switch (call.op) {
    case OpKind::View:
      KILN_CHECK(view_strides(s, st, impl->shape, out), call.name(), call.loc,
                 "shape {} is not compatible with the input's shape {} and strides {}; use "
                 "reshape() to copy instead",
                 to_string(impl->shape), to_string(s), to_string(st));
      break;
    case OpKind::Transpose:
      out = st;
      if (r) std::swap(out[wrap_dim(a.dim, r, "transpose")], out[wrap_dim(a.dim1, r, "transpose")]);
      break;
    case OpKind::Permute:
      for (int i = 0; i < r; ++i) out.push_back(st[wrap_dim(a.dims[i], r, "permute")]);
      break;
    case OpKind::Slice: {
      int d = wrap_dim(a.dim, r, "slice");
      int64_t n = s[d];
      int64_t b = std::clamp<int64_t>(a.start < 0 ? a.start + n : a.start, 0, n);
      out = st;
      out[d] = st[d] * a.step;
      if (impl->shape[d] > 0) impl->offset += b * st[d];
      break;
    }
    case OpKind::Select: {
      int d = wrap_dim(a.dim, r, "select");
      int64_t i = a.start < 0 ? a.start + s[d] : a.start;
      impl->offset += i * st[d];
      out = st;
      out.erase(d);
      break;
    }
    case OpKind::Expand: {
      const Shape& want = impl->shape;
      int lead = want.size() - r;
      for (int i = 0; i < want.size(); ++i) {
        if (i < lead) out.push_back(0);
        else out.push_back(s[i - lead] == want[i] ? st[i - lead] : 0);
      }
      break;
    }
    case OpKind::Squeeze: {
      int d = a.all_dims || r == 0 ? -1 : wrap_dim(a.dim, r, "squeeze");
      for (int i = 0; i < r; ++i)
        if (!(s[i] == 1 && (a.all_dims || i == d))) out.push_back(st[i]);
      break;
    }
    case OpKind::Unsqueeze: {
      int d = wrap_dim(a.dim, r + 1, "unsqueeze");
      out = st;
      out.insert(d, d < r ? st[d] * s[d] : 1);
      break;
    }
    default: break;
  }
  return Tensor(std::move(impl));
}

}  // namespace kiln
