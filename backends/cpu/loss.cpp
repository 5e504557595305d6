// Loss kernels: nll_loss and mse_loss (reduction none / mean / sum, attrs.mode 0 / 1 / 2).
#include <vector>

#include "backends/cpu/kernels.h"
#include "backends/cpu/loops.h"
#include "backends/cpu/parallel.h"
#include "backends/cpu/reduce_simd.h"

namespace kiln::cpu {
namespace {

using namespace simd;

constexpr int64_t kChunk = 65536;  // elements per partial sum (fixed: thread-count independent)

template <class T>
void nll_loss(const OpCall& call, Tensor& out) {
  const Tensor& x = call.inputs[0];
  const Tensor& target = call.inputs[1];
  const bool batched = x.dim() == 2;
  const int64_t n = batched ? x.size(0) : 1;
  const int64_t classes = batched ? x.size(1) : x.size(0);
  const int64_t xs0 = batched ? x.stride(0) : 0, xs1 = x.stride(-1);
  const int64_t ignore = call.attrs.ignore_index;

  // Targets as int64, validated before any output is written.
  std::vector<int64_t> t(n);
  const int64_t ts = target.dim() ? target.stride(0) : 0;
  KILN_DISPATCH_ALL(target.dtype(), I, {
    const I* tp = target.data<I>();
    for (int64_t i = 0; i < n; ++i) t[i] = static_cast<int64_t>(tp[i * ts]);
  });
  for (int64_t i = 0; i < n; ++i) {
    KILN_CHECK(t[i] == ignore || (t[i] >= 0 && t[i] < classes), call.name(), call.loc,
               "target {} is out of bounds for {} classes (sample {}; ignore_index is {})", t[i],
               classes, i, ignore);
  }
  const T* xp = x.data<T>();
  auto loss = [&](int64_t i) { return t[i] == ignore ? T(0) : -xp[i * xs0 + t[i] * xs1]; };
  T* o = out.data<T>();
  if (call.attrs.mode == 0) {
    for (int64_t i = 0; i < n; ++i) o[i] = loss(i);
    return;
  }
  double total = 0;
  int64_t count = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (t[i] == ignore) continue;
    total += static_cast<double>(loss(i));
    ++count;
  }
  // mean over no targets is 0/0 = nan, as in PyTorch.
  *o = static_cast<T>(call.attrs.mode == 1 ? total / static_cast<double>(count) : total);
}

template <class T>
void mse_loss(const OpCall& call, Tensor& out) {
  const Tensor& a = call.inputs[0];
  const Tensor& b = call.inputs[1];
  if (call.attrs.mode == 0) {
    StridedLoop<3> loop(out.shape(), {&out, &a, &b});
    const int64_t so = loop.inner_stride(0), sa = loop.inner_stride(1), sb = loop.inner_stride(2);
    constexpr int64_t sz = sizeof(T);
    loop.parallel_run([&](const std::array<char*, 3>& p, int64_t n) {
      T* y = reinterpret_cast<T*>(p[0]);
      const T* u = reinterpret_cast<const T*>(p[1]);
      const T* v = reinterpret_cast<const T*>(p[2]);
      if (so == sz && sa == sz && sb == sz) {
        for (int64_t i = 0; i < n; ++i) y[i] = (u[i] - v[i]) * (u[i] - v[i]);
        return;
      }
      for (int64_t i = 0; i < n; ++i) {
        T d =
            *reinterpret_cast<const T*>(p[1] + i * sa) - *reinterpret_cast<const T*>(p[2] + i * sb);
        *reinterpret_cast<T*>(p[0] + i * so) = d * d;
      }
    });
    return;
  }
  const Shape shape = broadcast_shapes(a.shape(), b.shape(), call.name(), call.loc);
  StridedLoop<2> loop(shape, {&a, &b});
  const int64_t sa = loop.inner_stride(0), sb = loop.inner_stride(1);
  const int64_t total_n = loop.numel();
  const int64_t nc = ceil_div(total_n, kChunk);
  std::vector<double> part(nc, 0.0);
  parallel_for(0, nc, std::max<int64_t>(1, kGrainSize / kChunk), [&](int64_t lo, int64_t hi) {
    for (int64_t c = lo; c < hi; ++c) {
      double s = 0;
      loop.run(c * kChunk, std::min(total_n, (c + 1) * kChunk),
               [&](const std::array<char*, 2>& p, int64_t n) {
                 const T* u = reinterpret_cast<const T*>(p[0]);
                 const T* v = reinterpret_cast<const T*>(p[1]);
                 if (sa == sizeof(T) && sb == sizeof(T)) {
                   double f = sum_run(u, n, [v](auto x, int64_t i) {
                     auto d = x - vload<decltype(x)>(v + i);
                     return d * d;
                   });
                   // A float32 square overflows past 1.8e19 where the mean may still be
                   // representable: such a run (or one with inf / NaN) is redone in double.
                   if (std::isfinite(f)) {
                     s += f;
                     return;
                   }
                 }
                 for (int64_t i = 0; i < n; ++i) {
                   double d = static_cast<double>(*reinterpret_cast<const T*>(p[0] + i * sa)) -
                              static_cast<double>(*reinterpret_cast<const T*>(p[1] + i * sb));
                   s += d * d;
                 }
               });
      part[c] = s;
    }
  });
  double total = 0;
  for (double s : part) total += s;
  // mean of no elements is 0/0 = nan, as in PyTorch.
  *out.data<T>() =
      static_cast<T>(call.attrs.mode == 1 ? total / static_cast<double>(total_n) : total);
}

}  // namespace

void loss_kernel(const OpCall& call, const InferredMeta& meta, std::span<Tensor> outs) {
  Tensor& out = outs[0];
  KILN_DISPATCH_FLOAT(out.dtype(), T, {
    if (call.op == OpKind::NllLoss)
      nll_loss<T>(call, out);
    else
      mse_loss<T>(call, out);
  });
}

}  // namespace kiln::cpu
