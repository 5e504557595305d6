// copy_cast and the Copy-category kernels: contiguous, to(dtype), copy_, fill_.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "backends/cpu/kernels.h"
#include "backends/cpu/loops.h"
#include "backends/cpu/reduce_simd.h"

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
  if (!t.is_contiguous()) loop.order_by(0);
  int64_t st = loop.inner_stride(0);
  loop.parallel_run([&](const std::array<char*, 1>& p, int64_t n) {
    for (int64_t i = 0; i < n; ++i) *reinterpret_cast<T*>(p[0] + i * st) = v;
  });
}

// dst[r * drs + c] = src[r + c * sc] for the rows [r0, r1) and every column c < cols, through
// a kTile x kTile buffer: contiguous reads of a tile, then contiguous writes. Element by
// element, a transposed 1024 x 1024 float32 read 4 KiB apart, aliasing the writes (4K
// aliasing) and a few cache sets: t().contiguous() took 4.4 ms, 8x PyTorch's blocked copy
// (found by review). The tile holds the source's rows as read (tile[c][r]): filled by row
// copies, emptied column by column with vectorisation off, as -march=native vectorised the
// other order into AVX-512 scatters or gathers (2.3 ms for 1024 x 1024 float32, one thread).
// 64 x 64 tiles: 0.55-0.7 ms; 32: 0.75; 16: 1.1 (a standalone copy of this loop, clang 22 -O3).
constexpr int64_t kTile = 64;

template <class D, class S>
void transpose_rows(D* dst, const S* src, int64_t r0, int64_t r1, int64_t cols, int64_t sc,
                    int64_t drs) {
  S tile[kTile][kTile];  // in the source's dtype: a conversion happens as the tile is emptied
  for (int64_t rb = r0; rb < r1; rb += kTile) {
    const int64_t rn = std::min(r1 - rb, kTile);
    for (int64_t cb = 0; cb < cols; cb += kTile) {
      const int64_t cn = std::min(cols - cb, kTile);
      for (int64_t c = 0; c < cn; ++c)
        for (int64_t r = 0; r < rn; ++r) tile[c][r] = src[rb + r + (cb + c) * sc];
      for (int64_t r = 0; r < rn; ++r) {
#pragma clang loop vectorize(disable)
        for (int64_t c = 0; c < cn; ++c) dst[(rb + r) * drs + cb + c] = cast_value<D>(tile[c][r]);
      }
    }
  }
}

// A copy (or conversion) between layouts that run across each other: the source has stride 1
// in a dim (row_dim), the destination in another (col_dim) (x.t().contiguous(),
// x.permute({2, 0, 1}), dT.t().copy_(x), x.t().to(Float64)). A batched blocked transpose of
// those two dims, the others the batch, converting as it writes. permute({2, 0, 1}).contiguous()
// of [64, 256, 512] float32 took 37 ms element by element (1.8 GB/s), dT.t().copy_(x) of
// [4096, 2048] 35 ms. Conversions used to be staged through a transposed copy in the source's
// dtype: a temporary and a third pass over memory (x.t().to(Int32) of [2048, 2048] float32,
// one thread: 6.1 ms, now 5.4; a contiguous conversion 1.2). False for other layouts.
bool copy_transposed(const Tensor& dst, const Tensor& src) {
  const int rank = dst.dim();
  if (rank < 2 || src.shape() != dst.shape()) return false;
  auto unit_dim = [&](const Tensor& t) {  // the innermost dim of stride 1 (size > 1), or -1
    for (int i = rank - 1; i >= 0; --i)
      if (t.strides()[i] == 1 && t.size(i) > 1) return i;
    return -1;
  };
  const int row_dim = unit_dim(src), col_dim = unit_dim(dst);
  if (row_dim < 0 || col_dim < 0 || row_dim == col_dim) return false;
  for (int i = 0; i < rank; ++i)  // the destination's elements are distinct memory
    if (dst.strides()[i] <= 0 && dst.size(i) > 1) return false;
  const int64_t rows = dst.size(row_dim), cols = dst.size(col_dim);
  const int64_t sc = src.strides()[col_dim], drs = dst.strides()[row_dim];
  // sc == 0 (a broadcast column, col.expand({R, C})): rows of one value, which the strided
  // loop writes at copy speed (the tiles took 3x as long).
  if (sc <= 0 || rows < 8 || cols < 8 || rows * cols < 1024) return false;
  std::vector<int> batch_dims;
  int64_t batch = 1;
  for (int i = 0; i < rank; ++i)
    if (i != row_dim && i != col_dim) batch_dims.push_back(i), batch *= dst.size(i);
  std::vector<int64_t> src_offset(batch), dst_offset(batch);  // of each batch element
  for (int64_t b = 0; b < batch; ++b) {
    int64_t rest = b, from = 0, to = 0;
    for (auto i = batch_dims.rbegin(); i != batch_dims.rend(); ++i) {
      const int64_t at = rest % dst.size(*i);
      rest /= dst.size(*i);
      from += at * src.strides()[*i];
      to += at * dst.strides()[*i];
    }
    src_offset[b] = from;
    dst_offset[b] = to;
  }
  auto run = [&]<class D, class S>(D*, const S*) {
    D* out = static_cast<D*>(dst.raw_data());
    const S* in = static_cast<const S*>(src.raw_data());
    const int64_t blocks = (rows + kTile - 1) / kTile;
    const int64_t grain = std::max<int64_t>(1, kGrainSize / (kTile * cols));
    parallel_for(0, batch * blocks, grain, [&](int64_t lo, int64_t hi) {
      for (int64_t t = lo; t < hi; ++t) {
        const int64_t b = t / blocks, r0 = t % blocks * kTile;
        transpose_rows(out + dst_offset[b], in + src_offset[b], r0, std::min(rows, r0 + kTile),
                       cols, sc, drs);
      }
    });
  };
  if (src.dtype() != dst.dtype()) {
    KILN_DISPATCH_ALL(dst.dtype(), D, {
      KILN_DISPATCH_ALL(src.dtype(), S,
                        { run(static_cast<D*>(nullptr), static_cast<const S*>(nullptr)); });
    });
    return true;
  }
  // The same dtype: moved as unsigned integers of its size (one instantiation per size).
  auto same = [&]<class U>(U* none) { run(none, static_cast<const U*>(none)); };
  switch (dst.itemsize()) {
    case 1: same(static_cast<uint8_t*>(nullptr)); return true;
    case 2: same(static_cast<uint16_t*>(nullptr)); return true;
    case 4: same(static_cast<uint32_t*>(nullptr)); return true;
    case 8: same(static_cast<uint64_t*>(nullptr)); return true;
    default: return false;
  }
}

}  // namespace

Tensor copy_if_read_across(const Tensor& in, const Tensor& out) {
  constexpr int64_t kMinElements = 1 << 16;
  const int last = in.dim() - 1;
  if (last < 1 || in.numel() < kMinElements || !out.is_contiguous() || in.shape() != out.shape() ||
      in.strides()[last] == 1 || in.size(last) == 1)
    return {};
  // A broadcast input (stride 0: col.expand({R, C})) reads little memory: copying it whole
  // tripled x + col's time (found by a performance pass).
  for (int i = 0; i <= last; ++i)
    if (in.strides()[i] == 0 && in.size(i) > 1) return {};
  for (int i = 0; i < last; ++i)
    if (in.strides()[i] == 1 && in.size(i) > 1) {
      Tensor copy = simd::empty_cpu(in.shape(), in.dtype());
      copy_cast(copy, in);
      return copy;
    }
  return {};
}

void copy_cast(const Tensor& dst, const Tensor& src) {
  // Conversions too (x.t().to(Float64) took 20-30x a contiguous cast element by element).
  if (copy_transposed(dst, src)) return;
  StridedLoop<2> loop(dst.shape(), {&dst, &src});
  if (!dst.is_contiguous()) loop.order_by(0);
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
