// index_add and scatter_add: out = x, then source elements added at indexed positions.
// Serial in the indexed dim (repeated indices accumulate, so no two threads share a target).
#include "backends/cpu/kernels.h"

namespace kiln::cpu {
namespace {

template <class I> void check_range(const Tensor& idx, int64_t size, const OpCall& c, int dim) {
  const I* p = idx.data<I>();
  for (int64_t i = 0; i < idx.numel(); ++i)
    KILN_CHECK(p[i] >= 0 && p[i] < size, c.name(), c.loc,
               "index {} is out of range for dim {} of size {}", static_cast<int64_t>(p[i]), dim,
               size);
}

/// dst += v; bool: logical or (true + true stays true, as in PyTorch).
template <class T> inline void add_to(T& dst, T v) {
  if constexpr (std::is_same_v<T, bool>) dst = dst || v;
  else dst += v;
}

template <class T, class I>
void index_add(const Tensor& out, int d, const Tensor& idx, const Tensor& src) {
  // out and src contiguous; view both as [outer, size_d, inner].
  int64_t outer = 1, inner = 1;
  for (int i = 0; i < d; ++i) outer *= out.shape()[i];
  for (int i = d + 1; i < out.dim(); ++i) inner *= out.shape()[i];
  int64_t n_out = out.dim() ? out.shape()[d] : 1, n_src = idx.numel();
  T* o = out.data<T>();
  const T* s = src.data<T>();
  const I* ix = idx.data<I>();
  for (int64_t a = 0; a < outer; ++a)
    for (int64_t j = 0; j < n_src; ++j) {
      T* dst = o + (a * n_out + ix[j]) * inner;
      const T* from = s + (a * n_src + j) * inner;
      for (int64_t k = 0; k < inner; ++k) add_to(dst[k], from[k]);
    }
}

template <class T, class I>
void scatter_add(const Tensor& out, int d, const Tensor& idx, const Tensor& src) {
  // Walk index's logical positions; src and out are addressed with their own strides.
  int r = idx.dim();
  int64_t n = idx.numel(), pos[kMaxRank] = {};
  T* o = out.data<T>();
  const T* s = src.data<T>();
  const I* ix = idx.data<I>();
  for (int64_t e = 0; e < n; ++e) {
    int64_t so = 0, oo = 0;
    for (int k = 0; k < r; ++k) {
      so += pos[k] * src.strides()[k];
      oo += (k == d ? static_cast<int64_t>(ix[e]) : pos[k]) * out.strides()[k];
    }
    add_to(o[oo], s[so]);
    for (int k = r - 1; k >= 0; --k) {
      if (++pos[k] < idx.shape()[k]) break;
      pos[k] = 0;
    }
  }
}

}  // namespace

void scatter_kernel(const OpCall& c, const InferredMeta&, std::span<Tensor> outs) {
  const Tensor& x = c.inputs[0];
  Tensor idx = c.inputs[1].contiguous();
  Tensor src = c.inputs[2].contiguous();
  Tensor& out = outs[0];
  int d = x.dim() ? wrap_dim(c.attrs.dim, x.dim(), c.name()) : 0;
  int64_t size = x.dim() ? x.shape()[d] : 1;
  copy_cast(out, x);
  auto run = [&]<class I>() {
    check_range<I>(idx, size, c, d);
    // Every dtype: bool tensors used to be skipped (the result was x, the source ignored).
    KILN_DISPATCH_ALL(x.dtype(), T, {
      if (c.op == OpKind::IndexAdd) index_add<T, I>(out, d, idx, src);
      else scatter_add<T, I>(out, d, idx, src);
    });
  };
  if (idx.dtype() == DType::Int64) run.template operator()<int64_t>();
  else run.template operator()<int32_t>();
}

}  // namespace kiln::cpu
