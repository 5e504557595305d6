// copy_cast and the Copy-category kernels: contiguous, to(dtype), copy_, fill_.
#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

#include <immintrin.h>

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

// Transposed copies move square blocks through vector registers: L rows of the source loaded
// as vectors, transposed by log2(L) rounds of interleaves, stored as L rows of the destination.
// The vector is the widest the build targets: AVX-512 (-march=native here), AVX, or SSE2
// (-DKILN_NATIVE=OFF, plain x86-64); clang and g++ lower the shuffles to each (vpermt2ps,
// unpcklps, ...). Element by element through a 64 x 64 tile buffer x.t().contiguous() of
// [2048, 2048] float32 took 5.1-5.3 ms of CPU time, 4x a contiguous copy; in blocks 1.5-2.1
// (a copy 1.2-1.3); float64 8.5-9.1 -> 2.9-3.1 (2.6-3.2), x.t().to(Float64) 6.8-8.3 -> 2.0
// (1.8-2.0), [64, 256, 512] float32 .transpose(1, 2) 10.2-12.1 -> 3.0 (2.6-2.9); one thread,
// 2 shared vCPUs (AMD EPYC, AVX-512), 2026-12-07; README.md, eager-ops, has the cases.
#if defined(__AVX512F__)
constexpr int kVectorBytes = 64;
#elif defined(__AVX__)
constexpr int kVectorBytes = 32;
#else
constexpr int kVectorBytes = 16;
#endif

/// The unsigned integer of T's size: blocks move bits, whatever the dtype.
template <class T> using Bits = std::conditional_t<
    sizeof(T) == 1, uint8_t,
    std::conditional_t<sizeof(T) == 2, uint16_t,
                       std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>>>;

/// Rows (and columns) of a block of T: a vector's worth, at most 16 (16 rows and their
/// interleaves fill AVX-512's 32 registers; 1-byte elements use 16-byte vectors).
template <class T> constexpr int kBlockLanes = std::min<int>(16, kVectorBytes / sizeof(T));

template <class U, int L> struct BlockRow {
  typedef U type __attribute__((vector_size(L * sizeof(U))));
};

/// The lower (kUpper: upper) halves of a and b interleaved: a0 b0 a1 b1 ... log2(L) rounds of
/// these over L rows transpose them (each round moves a bit of the row index into the column
/// index and one back).
template <bool kUpper, class V, size_t... I>
inline V interleave(V a, V b, std::index_sequence<I...>) {
  constexpr size_t kHalf = sizeof...(I) / 2;  // b's lanes are numbered after a's
  return __builtin_shufflevector(a, b, ((I % 2 ? 2 * kHalf : 0) + kUpper * kHalf + I / 2)...);
}

/// out[i * out_stride + j] = in[j * in_stride + i] for an L x L block of U (L = kBlockLanes<U>).
template <class U>
inline void transpose_block(U* out, int64_t out_stride, const U* in, int64_t in_stride) {
  constexpr int L = kBlockLanes<U>;
  using V = typename BlockRow<U, L>::type;
  constexpr auto lanes = std::make_index_sequence<L>();
  V row[L];
  for (int i = 0; i < L; ++i) std::memcpy(&row[i], in + i * in_stride, sizeof(V));
  for (int round = 1; round < L; round *= 2) {
    V next[L];
    for (int i = 0; i < L / 2; ++i) {
      next[2 * i] = interleave<false>(row[i], row[i + L / 2], lanes);
      next[2 * i + 1] = interleave<true>(row[i], row[i + L / 2], lanes);
    }
    std::memcpy(row, next, sizeof(row));
  }
  for (int i = 0; i < L; ++i) std::memcpy(out + i * out_stride, &row[i], sizeof(V));
}

/// dst[r * drs + c] = src[r + c * sc] for r in [r0, r1), c in [c0, c1), one element at a time:
/// the edges past whole blocks.
template <class D, class S>
void transpose_elements(D* dst, const S* src, int64_t r0, int64_t r1, int64_t c0, int64_t c1,
                        int64_t sc, int64_t drs) {
  for (int64_t r = r0; r < r1; ++r)
    for (int64_t c = c0; c < c1; ++c) dst[r * drs + c] = cast_value<D>(src[r + c * sc]);
}

/// Elements of T in a 64-byte cache line.
template <class T> constexpr int kLine = 64 / sizeof(T);

/// Whether rows of a block converted from S to D can be written by non-temporal stores: whole
/// cache lines from AVX-512 registers.
template <class D, class S>
constexpr bool kCanStream = kVectorBytes == 64 && kBlockLanes<Bits<S>> * sizeof(D) % 64 == 0;

/// out[j] = cast_value<D>(row[j]) (row: the bits of L values of S). kStream: by non-temporal
/// stores (out aligned to 64 bytes), which write the lines without reading them first.
template <bool kStream, class D, class S, int L>
inline void write_row(D* out, const Bits<S> (&row)[L]) {
  D values[L];
  for (int j = 0; j < L; ++j) values[j] = cast_value<D>(std::bit_cast<S>(row[j]));
  if constexpr (kStream) {
    static_assert(kVectorBytes == 64 && L * sizeof(D) % 64 == 0);
#if defined(__AVX512F__)
    for (int k = 0; k < L; k += kLine<D>)
      _mm512_stream_si512(reinterpret_cast<__m512i*>(out + k), _mm512_loadu_si512(values + k));
#endif
  } else {
    std::memcpy(out, values, sizeof(values));
  }
}

/// The same for r in [r0, r1), c in [c0, c1), a cache line by a cache line at a time (blocks
/// narrower than a line, SSE2's 4 x 4 floats, wrote a quarter of each destination line at a
/// time: [2048, 2048] float32 5.7 ms, by lines 3.8), then the edges. A conversion converts
/// each transposed row of a block as it writes it (in registers).
template <bool kStream, class D, class S>
void transpose_tile(D* dst, const S* src, int64_t r0, int64_t r1, int64_t c0, int64_t c1,
                    int64_t sc, int64_t drs) {
  using U = Bits<S>;
  constexpr int L = kBlockLanes<U>;
  const U* in = reinterpret_cast<const U*>(src);
  auto block = [&](int64_t r, int64_t c) {
    U rows[L][L];
    transpose_block(&rows[0][0], L, in + r + c * sc, sc);
    for (int i = 0; i < L; ++i) write_row<kStream, D, S>(dst + (r + i) * drs + c, rows[i]);
  };
  for (int64_t c = c0; c < c1; c += kLine<S>) {
    const int64_t c_end = std::min(c1, c + kLine<S>), c_blocks = c + (c_end - c) / L * L;
    for (int64_t r = r0; r < r1; r += kLine<S>) {
      const int64_t r_end = std::min(r1, r + kLine<S>), r_blocks = r + (r_end - r) / L * L;
      for (int64_t cb = c; cb < c_blocks; cb += L)
        for (int64_t rb = r; rb < r_blocks; rb += L) block(rb, cb);
      transpose_elements(dst, src, r_blocks, r_end, c, c_blocks, sc, drs);
      transpose_elements(dst, src, r, r_end, c_blocks, c_end, sc, drs);
    }
  }
}

// Tiles of 512 rows (the source's runs) by 256 bytes of columns (4 destination lines): 128
// KiB read, 128 KiB written, walked a line of columns at a time. [2048, 2048] float32, one
// thread, a standalone copy of this loop (clang 22, AVX-512): 512 x 64 tiles 1.42-1.65 ms,
// 256 x 256 1.53-1.76, 128 x 128 1.68-1.96, 64 x 64 1.9-2.3, single blocks along the
// destination's rows 3.1-3.4; memcpy 1.25-1.5.
constexpr int64_t kTileRows = 512;
constexpr int64_t kTileColumnBytes = 256;

// Source and destination larger than this together (the L3 holds 32 MiB here) go to memory
// anyway: the destination is then written by non-temporal stores where it can be (kCanStream,
// lines aligned), as memcpy does for large copies. x.t().to(Float64) of [2048, 2048] float32,
// a standalone copy of the loop: 3.6-3.8 ms, streamed 2.4-2.7 (a contiguous conversion 1.6-1.9);
// x.t().contiguous() of [2048, 2048] float32 (32 MiB in all) 1.3-1.5 ms, streamed 1.6-1.9.
constexpr int64_t kStreamBytes = int64_t{32} << 20;

// A copy (or conversion) between layouts that run across each other: the source has stride 1
// in a dim (row_dim), the destination in another (col_dim) (x.t().contiguous(),
// x.permute({2, 0, 1}), dT.t().copy_(x), x.t().to(Float64)). A batched blocked transpose of
// those two dims, the others the batch, converting as it writes. permute({2, 0, 1}).contiguous()
// of [64, 256, 512] float32 took 37 ms element by element (1.8 GB/s), dT.t().copy_(x) of
// [4096, 2048] 35 ms. Conversions used to be staged through a transposed copy in the source's
// dtype: a temporary and a third pass over memory (x.t().to(Int32) of [2048, 2048] float32,
// one thread: 6.1 ms, then 5.4 converting in a tile buffer, now 1.8-2.3 in register blocks; a
// contiguous conversion 1.1-1.3). False for other layouts.
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
    constexpr int64_t tile_cols = kTileColumnBytes / sizeof(S);
    const int64_t strips = (rows + kTileRows - 1) / kTileRows;
    const int64_t grain = std::max<int64_t>(1, kGrainSize / (kTileRows * cols));
    auto line_aligned = [&](int64_t elements) { return elements * sizeof(D) % 64 == 0; };
    bool stream = reinterpret_cast<uintptr_t>(out) % 64 == 0 &&
                  line_aligned(drs) && dst.numel() * (sizeof(D) + sizeof(S)) > kStreamBytes;
    for (int64_t offset : dst_offset) stream = stream && line_aligned(offset);
    auto copy = [&]<bool kStream>(std::bool_constant<kStream>) {
      parallel_for(0, batch * strips, grain, [&](int64_t lo, int64_t hi) {
        for (int64_t t = lo; t < hi; ++t) {
          const int64_t b = t / strips, r0 = t % strips * kTileRows;
          const int64_t r1 = std::min(rows, r0 + kTileRows);
          for (int64_t c0 = 0; c0 < cols; c0 += tile_cols)
            transpose_tile<kStream>(out + dst_offset[b], in + src_offset[b], r0, r1, c0,
                                    std::min(cols, c0 + tile_cols), sc, drs);
        }
        if constexpr (kStream) _mm_sfence();  // the stores visible before the join
      });
    };
    if constexpr (kCanStream<D, S>) {
      if (stream) return copy(std::true_type{});
    }
    copy(std::false_type{});
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
