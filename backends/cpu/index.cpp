// cat and the Index-category kernels: index_select, gather, embedding, one_hot, masked_fill,
// tril, triu.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>

#include "backends/cpu/kernels.h"
#include "backends/cpu/loops.h"

namespace kiln::cpu {
namespace {

// A view of `base`'s storage with the given shape, strides and element offset (no copy).
Tensor restrided(const Tensor& base, const Shape& shape, const Strides& strides, int64_t offset) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = base.storage();
  impl->shape = shape;
  impl->strides = strides;
  impl->offset = offset;
  impl->dtype = base.dtype();
  return Tensor(std::move(impl));
}

template <class I> int64_t load_index(const char* p) {
  return static_cast<int64_t>(*reinterpret_cast<const I*>(p));
}

// Checks every value of the int32/int64 tensor `index` against [0, size) before any kernel
// writes, so that a bad index raises kiln::Error naming it (PyTorch rejects negative indices
// for these ops too).
void check_indices(const OpCall& call, const Tensor& index, int64_t size, const char* what) {
  StridedLoop<1> loop(index.shape(), {&index});
  const int64_t st = loop.inner_stride(0);
  int64_t bad = 0;
  bool found = false;
  // Each run is first tested whole with one branch-free pass (it vectorises; an early exit and
  // the captured flags reloaded per element made the check cost as much as gather itself),
  // and searched for the first bad value only when it has one.
  auto scan = [&]<class I>(I) {
    loop.run(0, loop.numel(), [&](const std::array<char*, 1>& p, int64_t n) {
      if (found) return;
      const char* base = p[0];
      const auto limit = static_cast<uint64_t>(size);
      bool any_bad = false;
      if (st == sizeof(I)) {
        const I* q = reinterpret_cast<const I*>(base);
        for (int64_t i = 0; i < n; ++i) any_bad |= static_cast<uint64_t>(q[i]) >= limit;
      } else {
        for (int64_t i = 0; i < n; ++i)
          any_bad |= static_cast<uint64_t>(load_index<I>(base + i * st)) >= limit;
      }
      if (!any_bad) return;
      for (int64_t i = 0; i < n; ++i)
        if (int64_t v = load_index<I>(base + i * st); v < 0 || v >= size) {
          bad = v, found = true;
          return;
        }
    });
  };
  if (index.dtype() == DType::Int32) scan(int32_t{});
  else scan(int64_t{});
  if (found) {
    throw Error(call.name(),
                size == 0 ? fmt::format("index {} is out of range: {} has size 0", bad, what)
                          : fmt::format("index {} is out of range for {} of size {} (valid: 0 to "
                                        "{}{})",
                                        bad, what, size, size - 1,
                                        bad < 0 ? "; negative indices are not supported" : ""),
                call.loc);
  }
}

// take() over all of out (see take).
void take_rows(const Tensor& out, const Tensor& src, const Tensor& idx, int64_t axis_stride) {
  StridedLoop<3> loop(out.shape(), {&out, &src, &idx});
  const int64_t os = loop.inner_stride(0), ss = loop.inner_stride(1), is = loop.inner_stride(2);
  auto body = [&]<class T, class I>(T, I) {
    const int64_t ax = axis_stride * static_cast<int64_t>(sizeof(T));
    loop.parallel_run([&](const std::array<char*, 3>& p, int64_t n) {
      if (is == 0) {
        // One index for the whole run (e.g. a row of index_select along dim 0): a plain copy.
        const char* s = p[1] + load_index<I>(p[2]) * ax;
        if (os == sizeof(T) && ss == sizeof(T)) {
          std::memcpy(p[0], s, n * sizeof(T));
        } else {
          for (int64_t i = 0; i < n; ++i)
            *reinterpret_cast<T*>(p[0] + i * os) = *reinterpret_cast<const T*>(s + i * ss);
        }
        return;
      }
      // Local pointers: stores through them may alias `p`, which would otherwise be read
      // again for every element.
      char* out = p[0];
      const char* src = p[1];
      const char* ix = p[2];
      if (os == sizeof(T) && is == sizeof(I)) {
        T* o = reinterpret_cast<T*>(out);
        const I* q = reinterpret_cast<const I*>(ix);
        for (int64_t i = 0; i < n; ++i)
          o[i] = *reinterpret_cast<const T*>(src + i * ss + static_cast<int64_t>(q[i]) * ax);
        return;
      }
      for (int64_t i = 0; i < n; ++i)
        *reinterpret_cast<T*>(out + i * os) =
            *reinterpret_cast<const T*>(src + i * ss + load_index<I>(ix + i * is) * ax);
    });
  };
  KILN_DISPATCH_ALL(out.dtype(), T, {
    if (idx.dtype() == DType::Int32) body(T{}, int32_t{});
    else body(T{}, int64_t{});
  });
}

// Bytes of each output row per block of take_in_column_blocks: one cache line (the blocks of
// a [4096, 1024] float32 index_select of a transposed table: 64 bytes 9.3 ms, 128 11.6, 256
// 14.2; one thread).
constexpr int64_t kColumnBlockBytes = 64;

// take() one block of out's last dim at a time (blocks spread across the pool), for sources
// whose elements along that dim lie a cache line or more apart while an index varies along
// one dim only: a transposed table read by rows (w.t() through index_select dim 0 or
// embedding: each output row read a column of the table's memory, 26-28x the contiguous
// table's time for [4096, 1024] float32, now 10x), or index_select along the last dim of a
// transposed source (4x, now 2x). Row by row, every element loaded a cache line that the
// following rows needed again after it had left the caches; a block's lines stay cached
// while all its rows are read. False (nothing done) where the elements along the last dim
// are close, or for gather (its index varies along every dim, so the lines a block reads
// are not bounded; a transposed source read that way was not slower than a contiguous one).
bool take_in_column_blocks(const Tensor& out, const Tensor& src, const Tensor& idx,
                           int64_t axis_stride) {
  const int r = out.dim();
  if (r < 2 || out.numel() < kGrainSize) return false;
  const int64_t cols = out.size(-1), isz = static_cast<int64_t>(out.itemsize());
  const int64_t block = std::max<int64_t>(1, kColumnBlockBytes / isz);
  if (cols < 2 * block) return false;
  const bool index_along_cols = idx.stride(-1) != 0;
  bool index_along_rows = false;
  for (int i = 0; i + 1 < r; ++i) index_along_rows |= idx.stride(i) != 0 && out.size(i) > 1;
  if (index_along_rows && index_along_cols) return false;
  constexpr int64_t kLine = 64;  // bytes
  const int64_t step = index_along_cols ? std::abs(axis_stride) : std::abs(src.stride(-1));
  if (step * isz < kLine) return false;
  const int64_t blocks = (cols + block - 1) / block;
  parallel_for(0, blocks, 1, [&](int64_t lo, int64_t hi) {
    Shape shape = out.shape();
    auto narrowed = [&](const Tensor& t, int64_t c0) {
      return restrided(t, shape, t.strides(), t.offset() + c0 * t.stride(-1));
    };
    for (int64_t b = lo; b < hi; ++b) {
      const int64_t c0 = b * block;
      shape[r - 1] = std::min(block, cols - c0);
      take_rows(narrowed(out, c0), narrowed(src, c0), narrowed(idx, c0), axis_stride);
    }
  });
  return true;
}

// out[e] = src[e + idx[e] · axis_stride] for every element e of out's shape, where `src` and
// `idx` are views with out's shape (stride 0 where they do not vary). The shared engine of
// index_select, gather and embedding.
void take(const Tensor& out, const Tensor& src, const Tensor& idx, int64_t axis_stride) {
  if (!take_in_column_blocks(out, src, idx, axis_stride)) take_rows(out, src, idx, axis_stride);
}

void index_select(const OpCall& call, const Tensor& out) {
  const Tensor& x = call.inputs[0];
  const Tensor& index = call.inputs[1];
  const int r = x.dim();
  if (r == 0) {
    KILN_CHECK(index.numel() == 1, call.name(), call.loc,
               "index of a 0-d tensor must have one element, got {}", index.numel());
    check_indices(call, index, 1, "a 0-d tensor");
    take(out, x, restrided(index, {}, {}, index.offset()), 0);
    return;
  }
  const int d = wrap_dim(call.attrs.dim, r, call.name());
  check_indices(call, index, x.size(d), fmt::format("dim {}", d).c_str());
  // Over out's shape: x varies in every dim but d (moved by the index), index only along d.
  Strides xs = x.strides(), is = Dims::filled(r, 0);
  xs[d] = 0;
  is[d] = index.dim() ? index.stride(0) : 0;
  take(out, restrided(x, out.shape(), xs, x.offset()),
       restrided(index, out.shape(), is, index.offset()), x.stride(d));
}

void gather(const OpCall& call, const Tensor& out) {
  const Tensor& x = call.inputs[0];
  const Tensor& index = call.inputs[1];
  const int r = x.dim();
  if (r == 0) {
    check_indices(call, index, 1, "a 0-d tensor");
    take(out, restrided(x, out.shape(), {}, x.offset()), index, 0);
    return;
  }
  const int d = wrap_dim(call.attrs.dim, r, call.name());
  check_indices(call, index, x.size(d), fmt::format("dim {}", d).c_str());
  Strides xs = x.strides();
  xs[d] = 0;
  take(out, restrided(x, index.shape(), xs, x.offset()), index, x.stride(d));
}

void embedding(const OpCall& call, const Tensor& out) {
  const Tensor& w = call.inputs[0];
  const Tensor& index = call.inputs[1];
  check_indices(call, index, w.size(0), "the embedding table (num_embeddings)");
  // out = index.shape + [D]: the index repeats along D, the table row varies along it.
  const int r = out.dim();
  Strides ws = Dims::filled(r, 0), is = Dims::filled(r, 0);
  ws[r - 1] = w.stride(1);
  for (int i = 0; i < index.dim(); ++i) is[i] = index.stride(i);
  take(out, restrided(w, out.shape(), ws, w.offset()),
       restrided(index, out.shape(), is, index.offset()), w.stride(0));
}

void one_hot(const OpCall& call, const Tensor& out) {
  const Tensor& x = call.inputs[0];
  const int64_t classes = call.attrs.mode;
  check_indices(call, x, classes, "num_classes");
  int64_t* o = out.data<int64_t>();
  std::memset(o, 0, out.numel() * sizeof(int64_t));
  StridedLoop<1> loop(x.shape(), {&x});
  const int64_t st = loop.inner_stride(0);
  parallel_for(0, loop.numel(), kGrainSize / 8, [&](int64_t lo, int64_t hi) {
    int64_t i = lo;
    loop.run(lo, hi, [&](const std::array<char*, 1>& p, int64_t n) {
      for (int64_t e = 0; e < n; ++e, ++i) o[i * classes + load_index<int64_t>(p[0] + e * st)] = 1;
    });
  });
}

void masked_fill(const OpCall& call, const Tensor& out) {
  const Tensor& x = call.inputs[0];
  const Tensor& mask = call.inputs[1];
  StridedLoop<3> loop(out.shape(), {&out, &x, &mask});
  const int64_t os = loop.inner_stride(0), xs = loop.inner_stride(1), ms = loop.inner_stride(2);
  KILN_DISPATCH_ALL(out.dtype(), T, {
    const T value = call.attrs.alpha.to<T>();
    // Both values loaded, then selected: `m ? value : x[i]` loaded x[i] behind a branch that a
    // random mask mispredicted half the time (15x where()'s time, found by a performance pass).
    loop.parallel_run([&](const std::array<char*, 3>& p, int64_t n) {
      const T fill = value;  // a local: through the capture, each store might change it
      if (os == sizeof(T) && xs == sizeof(T) && ms == sizeof(bool)) {  // contiguous: vectorised
        T* o = reinterpret_cast<T*>(p[0]);
        const T* xp = reinterpret_cast<const T*>(p[1]);
        const bool* mp = reinterpret_cast<const bool*>(p[2]);
        for (int64_t i = 0; i < n; ++i) {
          const T v = xp[i];
          o[i] = mp[i] ? fill : v;
        }
        return;
      }
      for (int64_t i = 0; i < n; ++i) {
        const T v = *reinterpret_cast<const T*>(p[1] + i * xs);
        const bool m = *reinterpret_cast<const bool*>(p[2] + i * ms);
        *reinterpret_cast<T*>(p[0] + i * os) = m ? fill : v;
      }
    });
  });
}

// tril keeps j - i <= diagonal, triu keeps j - i >= diagonal, over the last two dims.
void triangle(const OpCall& call, const Tensor& out) {
  copy_cast(out, call.inputs[0]);
  const bool lower = call.op == OpKind::Tril;
  const int64_t rows = out.size(-2), cols = out.size(-1);
  // Beyond ±(rows + cols) every diagonal gives the same matrix; clamped, i + diag cannot
  // overflow (tril(x, INT64_MAX) kept nothing).
  const int64_t diag = std::clamp<int64_t>(call.attrs.mode, -(rows + cols), rows + cols);
  if (rows == 0 || cols == 0) return;
  const int64_t nrows = out.numel() / cols;  // rows of every matrix together
  const size_t isz = out.itemsize();
  char* base = static_cast<char*>(out.raw_data());
  parallel_for(0, nrows, std::max<int64_t>(1, kGrainSize / cols), [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const int64_t i = r % rows;
      // Zero [z0, z1) of this row.
      int64_t z0, z1;
      if (lower) z0 = std::clamp<int64_t>(i + diag + 1, 0, cols), z1 = cols;
      else z0 = 0, z1 = std::clamp<int64_t>(i + diag, 0, cols);
      if (z1 > z0) std::memset(base + (r * cols + z0) * isz, 0, (z1 - z0) * isz);
    }
  });
}

}  // namespace

namespace {

// Rows [r0, r1) of a contiguous [rows, c] piece into columns [at, at + c) of a contiguous
// [rows, row] output, as elements of U (an unsigned type of the element's size).
template <class U>
void copy_piece_rows(char* out, const char* piece, int64_t row, int64_t at, int64_t c, int64_t r0,
                     int64_t r1) {
  U* o = reinterpret_cast<U*>(out);
  const U* p = reinterpret_cast<const U*>(piece);
  if (c == 1) {  // stack along the last dim: one element per row
    for (int64_t r = r0; r < r1; ++r) o[r * row + at] = p[r];
    return;
  }
  for (int64_t r = r0; r < r1; ++r)
    for (int64_t j = 0; j < c; ++j) o[r * row + at + j] = p[r * c + j];
}

// cat of contiguous inputs of out's dtype into contiguous `out` along dim d, as [outer, c_i]
// pieces of an [outer, C] output, a tile of output rows at a time: each piece's rows go into
// the tile while it stays in cache. Copying each piece into its slab of the whole output
// instead wrote every cache line of the output once per piece: 64 pieces of [32768, 1] took
// 12.7 ms against 0.54 ms for a copy of the output (a performance pass). False if the inputs
// are not such.
bool cat_contiguous(const std::vector<Tensor>& xs, const Tensor& out, int d) {
  if (!out.is_contiguous()) return false;
  for (const Tensor& x : xs)
    if (!x.is_contiguous() || x.dtype() != out.dtype()) return false;
  int64_t outer = 1;
  for (int i = 0; i < d; ++i) outer *= out.shape()[i];
  const size_t isz = out.itemsize();
  const int64_t row = out.numel() / std::max<int64_t>(outer, 1);  // C
  if (outer <= 1 || row == 0) return false;
  const int64_t tile = std::max<int64_t>(1, 32768 / (row * static_cast<int64_t>(isz)));
  char* o = static_cast<char*>(out.raw_data());
  parallel_for(0, outer, std::max<int64_t>(tile, kGrainSize / row), [&](int64_t lo, int64_t hi) {
    for (int64_t r0 = lo; r0 < hi; r0 += tile) {
      const int64_t r1 = std::min(hi, r0 + tile);
      int64_t at = 0;  // elements of the output row before this piece's
      for (const Tensor& x : xs) {
        const int64_t c = x.numel() / outer;
        if (c == 0) continue;
        const char* src = static_cast<const char*>(x.raw_data());
        if (c * static_cast<int64_t>(isz) >= 64 || (isz != 1 && isz != 4 && isz != 8)) {
          for (int64_t r = r0; r < r1; ++r)
            std::memcpy(o + (r * row + at) * isz, src + r * c * isz, c * isz);
        } else if (isz == 1) {
          copy_piece_rows<uint8_t>(o, src, row, at, c, r0, r1);
        } else if (isz == 4) {
          copy_piece_rows<uint32_t>(o, src, row, at, c, r0, r1);
        } else {
          copy_piece_rows<uint64_t>(o, src, row, at, c, r0, r1);
        }
        at += c;
      }
    }
  });
  return true;
}

}  // namespace

void cat_kernel(const OpCall& call, const InferredMeta& meta, std::span<Tensor> outs) {
  const Tensor& out = outs[0];
  const int d = wrap_dim(call.attrs.dim, out.dim(), call.name());
  if (cat_contiguous(call.inputs, out, d)) return;
  int64_t at = 0;
  for (const Tensor& x : call.inputs) {
    const int64_t len = x.size(d);
    if (len == 0) continue;
    // The slab of out this input fills: out's strides, x's shape, offset along d.
    copy_cast(restrided(out, x.shape(), out.strides(), out.offset() + at * out.stride(d)), x);
    at += len;
  }
}

void index_kernel(const OpCall& call, const InferredMeta& meta, std::span<Tensor> outs) {
  const Tensor& out = outs[0];
  switch (call.op) {
    case OpKind::IndexSelect: index_select(call, out); break;
    case OpKind::Gather: gather(call, out); break;
    case OpKind::Embedding: embedding(call, out); break;
    case OpKind::OneHot: one_hot(call, out); break;
    case OpKind::MaskedFill: masked_fill(call, out); break;
    case OpKind::Tril:
    case OpKind::Triu: triangle(call, out); break;
    default: throw Error(call.name(), "not an index op", call.loc);
  }
}

}  // namespace kiln::cpu
