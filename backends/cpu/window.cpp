// The Window-category kernels over NCHW planes (PyTorch's im2col / col2im): unfold copies each
// kh x kw window of a plane into a column of [C*kh*kw, L]; fold, its adjoint, adds the columns
// back into the plane. Parallel over the N*C planes, each done by one thread in a fixed order,
// so results do not depend on the thread count. conv2d and the pools are composites over
// unfold (eager/ops.cpp), so these loops are their only kernels.
#include <algorithm>

#include "backends/cpu/kernels.h"
#include "backends/cpu/parallel.h"
#include "backends/cpu/reduce_simd.h"
#include "core/meta.h"

namespace kiln::cpu {
namespace {

struct Planes {
  int64_t count, h, w;  // N*C planes of h x w
  int64_t out_h, out_w;  // window positions down and across a plane
};

// Runs fn(plane) for each plane, split across the pool (about kGrainSize elements a chunk).
template <class Fn> void for_planes(const Planes& p, int64_t per_plane, Fn&& fn) {
  const int64_t grain = std::max<int64_t>(1, kGrainSize / std::max<int64_t>(per_plane, 1));
  parallel_for(0, p.count, grain, [&](int64_t lo, int64_t hi) {
    for (int64_t plane = lo; plane < hi; ++plane) fn(plane);
  });
}

// For each window element (ki, kj) and each row oh of window positions: the positions whose
// element lies inside the plane are one run, ow in [lo, hi), reading plane columns iw0,
// iw0 + sw, ...; fn(first column index, plane row, iw0, count) gets it, pad(column index,
// count) the positions in the padding (unfold fills them, fold skips them).
template <class Fn, class Pad>
void walk_windows(const Planes& p, const Window2d& w, Fn&& fn, Pad&& pad) {
  int64_t at = 0;
  for (int64_t ki = 0; ki < w.kh; ++ki)
    for (int64_t kj = 0; kj < w.kw; ++kj) {
      // iw = ow * sw + shift is inside [0, p.w) for ow in [lo, hi).
      const int64_t shift = kj * w.dw - w.pw;
      const int64_t lo = std::clamp<int64_t>((-shift + w.sw - 1) / w.sw, 0, p.out_w);
      const int64_t hi = std::clamp<int64_t>(
          p.w - shift <= 0 ? 0 : (p.w - 1 - shift) / w.sw + 1, lo, p.out_w);
      for (int64_t oh = 0; oh < p.out_h; ++oh, at += p.out_w) {
        const int64_t ih = oh * w.sh - w.ph + ki * w.dh;
        if (ih < 0 || ih >= p.h) {
          pad(at, p.out_w);
          continue;
        }
        pad(at, lo);
        if (hi > lo) fn(at + lo, ih, lo * w.sw + shift, hi - lo);
        pad(at + hi, p.out_w - hi);
      }
    }
}

template <class T>
void unfold_planes(const T* x, T* out, const Planes& p, const Window2d& w, T pad_value) {
  const int64_t column = w.kh * w.kw * p.out_h * p.out_w;  // output elements per plane
  for_planes(p, column, [&](int64_t plane) {
    const T* in = x + plane * p.h * p.w;
    T* col = out + plane * column;
    walk_windows(
        p, w,
        [&](int64_t i, int64_t ih, int64_t iw0, int64_t n) {
          const T* src = in + ih * p.w + iw0;
          if (w.sw == 1) std::copy_n(src, n, col + i);
          else
            for (int64_t t = 0; t < n; ++t) col[i + t] = src[t * w.sw];
        },
        [&](int64_t i, int64_t n) { std::fill_n(col + i, n, pad_value); });
  });
}

template <class T> void fold_planes(const T* cols, T* out, const Planes& p, const Window2d& w) {
  const int64_t column = w.kh * w.kw * p.out_h * p.out_w;
  for_planes(p, column, [&](int64_t plane) {
    const T* col = cols + plane * column;
    T* to = out + plane * p.h * p.w;
    std::fill_n(to, p.h * p.w, T(0));
    walk_windows(
        p, w,
        [&](int64_t i, int64_t ih, int64_t iw0, int64_t n) {
          T* dst = to + ih * p.w + iw0;
          for (int64_t t = 0; t < n; ++t) dst[t * w.sw] += col[i + t];
        },
        [](int64_t, int64_t) {});
  });
}

}  // namespace

void window_kernel(const OpCall& c, const InferredMeta&, std::span<Tensor> outs) {
  // A copy made here, not by x.contiguous(), which would dispatch an op (that a trace records).
  const Tensor x = simd::contiguous_cpu(c.inputs[0], c.inputs[0].dtype());
  Tensor& out = outs[0];
  if (out.numel() == 0) return;
  const Window2d w = Window2d::from(c.attrs);
  const Tensor& plane_tensor = c.op == OpKind::Unfold ? x : out;  // the [N, C, H, W] side
  Planes p;
  p.count = plane_tensor.size(0) * plane_tensor.size(1);
  p.h = plane_tensor.size(2), p.w = plane_tensor.size(3);
  p.out_h = window_positions(p.h, w.kh, w.dh, w.ph, w.sh);
  p.out_w = window_positions(p.w, w.kw, w.dw, w.pw, w.sw);
  KILN_DISPATCH_FLOAT(x.dtype(), T, {
    if (c.op == OpKind::Unfold)
      unfold_planes<T>(x.data<T>(), out.data<T>(), p, w,
                       static_cast<T>(c.attrs.alpha.to<double>()));
    else
      fold_planes<T>(x.data<T>(), out.data<T>(), p, w);
  });
}

}  // namespace kiln::cpu
