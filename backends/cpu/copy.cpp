// copy_cast and the Copy-category kernels: contiguous, to(dtype), copy_, fill_.
#include <cstring>

#include "backends/cpu/kernels.h"
#include "backends/cpu/loops.h"

namespace kiln::cpu {
namespace {

template <class D, class S> void cast_run(char* dst, const char* src, int64_t n, int64_t ds,
                                          int64_t ss) {
  if (ds == sizeof(D) && ss == sizeof(S)) {
    D* d = reinterpret_cast<D*>(dst);
    const S* s = reinterpret_cast<const S*>(src);
    if constexpr (std::is_same_v<D, S>) {
      std::memcpy(d, s, n * sizeof(D));
    } else {
      for (int64_t i = 0; i < n; ++i) d[i] = static_cast<D>(s[i]);
    }
    return;
  }
  if (ds == sizeof(D) && ss == 0) {
    D v = static_cast<D>(*reinterpret_cast<const S*>(src));
    D* d = reinterpret_cast<D*>(dst);
    for (int64_t i = 0; i < n; ++i) d[i] = v;
    return;
  }
  for (int64_t i = 0; i < n; ++i)
    *reinterpret_cast<D*>(dst + i * ds) = static_cast<D>(*reinterpret_cast<const S*>(src + i * ss));
}

template <class T> void fill(const Tensor& t, T v) {
  StridedLoop<1> loop(t.shape(), {&t});
  int64_t st = loop.inner_stride(0);
  loop.parallel_run([&](const std::array<char*, 1>& p, int64_t n) {
    for (int64_t i = 0; i < n; ++i) *reinterpret_cast<T*>(p[0] + i * st) = v;
  });
}

}  // namespace

void copy_cast(const Tensor& dst, const Tensor& src) {
  StridedLoop<2> loop(dst.shape(), {&dst, &src});
  int64_t ds = loop.inner_stride(0), ss = loop.inner_stride(1);
  KILN_DISPATCH_ALL(dst.dtype(), D, {
    KILN_DISPATCH_ALL(src.dtype(), S, {
      loop.parallel_run([&](const std::array<char*, 2>& p, int64_t n) {
        cast_run<D, S>(p[0], p[1], n, ds, ss);
      });
    });
  });
}

void copy_kernel(const OpCall& call, const InferredMeta& meta, std::span<Tensor> outs) {
  switch (call.op) {
    case OpKind::Contiguous:
    case OpKind::Cast: copy_cast(outs[0], call.inputs[0]); break;
    case OpKind::CopyInto: copy_cast(call.inputs[0], call.inputs[1]); break;
    case OpKind::Fill:
      KILN_DISPATCH_ALL(call.inputs[0].dtype(), T,
                        { fill<T>(call.inputs[0], call.attrs.alpha.to<T>()); });
      break;
    default: break;
  }
}

}  // namespace kiln::cpu
