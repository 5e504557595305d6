// copy_cast and the Copy-category kernels: contiguous, to(dtype), copy_, fill_.
#include <cstring>
#include <limits>
#include <type_traits>

#include "backends/cpu/kernels.h"
#include "backends/cpu/loops.h"

namespace kiln::cpu {
namespace {

/// static_cast<D>(s), except float -> signed integer: NaN, +-inf and values outside D's range
/// (UB for static_cast; UBSan's float-cast-overflow) give D's minimum, the x86 cvtt* "integer
/// indefinite" the unchecked cast produced here and the compiled code selects explicitly
/// (codegen/README.md, Cast).
template <class D, class S> inline D cast_value(S s) {
  if constexpr (std::is_floating_point_v<S> && std::is_integral_v<D> && std::is_signed_v<D>) {
    constexpr S lo = static_cast<S>(std::numeric_limits<D>::min());  // -2^31 / -2^63: exact
    if (!(s >= lo && s < -lo)) return std::numeric_limits<D>::min();
  }
  return static_cast<D>(s);
}

template <class D, class S> void cast_run(char* dst, const char* src, int64_t n, int64_t ds,
                                          int64_t ss) {
  if (ds == sizeof(D) && ss == sizeof(S)) {
    D* d = reinterpret_cast<D*>(dst);
    const S* s = reinterpret_cast<const S*>(src);
    if constexpr (std::is_same_v<D, S>) {
      std::memcpy(d, s, n * sizeof(D));
    } else {
      for (int64_t i = 0; i < n; ++i) d[i] = cast_value<D>(s[i]);
    }
    return;
  }
  if (ds == sizeof(D) && ss == 0) {
    D v = cast_value<D>(*reinterpret_cast<const S*>(src));
    D* d = reinterpret_cast<D*>(dst);
    for (int64_t i = 0; i < n; ++i) d[i] = v;
    return;
  }
  for (int64_t i = 0; i < n; ++i)
    *reinterpret_cast<D*>(dst + i * ds) = cast_value<D>(*reinterpret_cast<const S*>(src + i * ss));
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
