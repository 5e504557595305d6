// float32 GEMM on bfloat16 copies of the operands through oneDNN's matmul primitive (see
// bf16_gemm.h). oneDNN is loaded at run time (blas.cpp); dnnl.h gives the types only.
#include "backends/cpu/bf16_gemm.h"

#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>

#include "backends/cpu/allocator.h"
#include "backends/cpu/blas.h"
#include "backends/cpu/parallel.h"

#ifdef KILN_HAVE_DNNL_H
#include <oneapi/dnnl/dnnl.h>
#endif

namespace kiln::cpu {

uint16_t to_bfloat16(float x) noexcept {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  // NaN: the rounding below could carry into the exponent and make it Inf.
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even
  return static_cast<uint16_t>(u >> 16);
}

#ifndef KILN_HAVE_DNNL_H

bool bf16_gemm_available() noexcept { return false; }
bool bf16_gemm(bool, bool, int64_t, int64_t, int64_t, float, const float*, int64_t, const float*,
               int64_t, float, float*, int64_t, int) noexcept {
  return false;
}

#else

namespace {

// The oneDNN C functions kiln calls, looked up in the library blas.cpp loaded.
struct Dnnl {
  bool ok = false;
  dnnl_engine_t engine = nullptr;
#define KILN_DNNL_FN(fn) decltype(&::fn) fn = nullptr;
#define KILN_DNNL_FNS(X)                                                                      \
  X(dnnl_get_effective_cpu_isa) X(dnnl_engine_create) X(dnnl_stream_create)                  \
  X(dnnl_stream_wait) X(dnnl_stream_destroy) X(dnnl_memory_desc_init_by_strides)              \
  X(dnnl_matmul_desc_init) X(dnnl_primitive_attr_create) X(dnnl_primitive_attr_destroy)      \
  X(dnnl_primitive_attr_set_output_scales) X(dnnl_post_ops_create) X(dnnl_post_ops_destroy) \
  X(dnnl_post_ops_append_sum) X(dnnl_primitive_attr_set_post_ops)                           \
  X(dnnl_primitive_desc_create) X(dnnl_primitive_desc_destroy) X(dnnl_primitive_create)     \
  X(dnnl_primitive_destroy) X(dnnl_memory_create) X(dnnl_memory_destroy)                    \
  X(dnnl_primitive_execute)
  KILN_DNNL_FNS(KILN_DNNL_FN)
#undef KILN_DNNL_FN
};

bool has_bf16_kernels(dnnl_cpu_isa_t isa) {
  // ISA values are bit sets: each includes the bits of the ISAs it extends.
  return (isa & dnnl_cpu_isa_avx512_core_bf16) == dnnl_cpu_isa_avx512_core_bf16;
}

const Dnnl& dnnl() {
  static const Dnnl lib = [] {
    Dnnl d;
    void* h = onednn_library();
    if (!h) return d;
    bool all = true;
#define KILN_DNNL_SYM(fn)                                          \
  d.fn = reinterpret_cast<decltype(d.fn)>(dlsym(h, #fn)); \
  all = all && d.fn != nullptr;
    KILN_DNNL_FNS(KILN_DNNL_SYM)
#undef KILN_DNNL_SYM
    if (!all || !has_bf16_kernels(d.dnnl_get_effective_cpu_isa())) return d;
    d.ok = d.dnnl_engine_create(&d.engine, dnnl_cpu, 0) == dnnl_success;
    return d;
  }();
  return lib;
}

// One in-order CPU stream per thread (a stream is not to be shared between threads).
dnnl_stream_t thread_stream(const Dnnl& d) {
  struct Holder {
    dnnl_stream_t stream = nullptr;
    ~Holder() {
      if (stream) dnnl().dnnl_stream_destroy(stream);
    }
  };
  thread_local Holder h;
  if (!h.stream && d.dnnl_stream_create(&h.stream, d.engine, dnnl_stream_default_flags) !=
                       dnnl_success)
    h.stream = nullptr;
  return h.stream;
}

// A rows x cols float32 matrix (rows `ld` apart) as dense bfloat16, transposed (cols x rows)
// when asked, in kiln's allocator. Dense, not padded as blas.cpp's PaddedCopy: oneDNN 2.6 runs
// its bfloat16 brgemm kernels only on dense operands (512x256x768, one thread: 0.47 ms, and
// 0.94-0.97 ms through its gemm:jit fallback with rows 16-64 elements further apart), and
// only on an untransposed A (1024x1024x256 with A transposed: 1.37 ms, as float32; 0.75 ms).
class Bf16Copy {
 public:
  // On the pool unless `serial`.
  Bf16Copy(const float* src, int64_t rows, int64_t cols, int64_t ld, bool transpose, bool serial)
      : ld_(transpose ? rows : cols),
        bytes_(static_cast<size_t>(rows * cols) * sizeof(uint16_t)) {
    data_ = static_cast<uint16_t*>(allocator()->allocate(bytes_));
    auto for_blocks = [serial](int64_t end, int64_t grain, auto&& fn) {
      if (serial) fn(int64_t{0}, end);
      else parallel_for(0, end, grain, fn);
    };
    if (transpose) {  // by 16 x 16 tiles, as contiguous() transposes
      constexpr int64_t kTile = 16;
      for_blocks(cols, std::max<int64_t>(kTile, (64 << 10) / std::max<int64_t>(rows, 1)),
                   [&](int64_t lo, int64_t hi) {
                     for (int64_t r0 = lo; r0 < hi; r0 += kTile) {
                       const int64_t nr = std::min(hi - r0, kTile);
                       for (int64_t j0 = 0; j0 < rows; j0 += kTile) {
                         const int64_t nj = std::min(rows - j0, kTile);
                         uint16_t tile[kTile][kTile];  // [source column][source row]
                         for (int64_t j = 0; j < nj; ++j)
                           for (int64_t r = 0; r < nr; ++r)
                             tile[r][j] = to_bfloat16(src[(j0 + j) * ld + r0 + r]);
                         for (int64_t r = 0; r < nr; ++r)
                           std::memcpy(data_ + (r0 + r) * ld_ + j0, tile[r], nj * 2);
                       }
                     }
                   });
      return;
    }
    for_blocks(rows, std::max<int64_t>(1, (64 << 10) / std::max<int64_t>(cols, 1)),
                 [&](int64_t lo, int64_t hi) {
                   for (int64_t r = lo; r < hi; ++r) {
                     const float* in = src + r * ld;
                     uint16_t* out = data_ + r * ld_;
                     for (int64_t j = 0; j < cols; ++j) out[j] = to_bfloat16(in[j]);
                   }
                 });
  }
  ~Bf16Copy() { allocator()->deallocate(data_, bytes_); }
  Bf16Copy(const Bf16Copy&) = delete;
  Bf16Copy& operator=(const Bf16Copy&) = delete;
  const uint16_t* data() const { return data_; }
  int64_t ld() const { return ld_; }

 private:
  int64_t ld_;
  size_t bytes_;
  uint16_t* data_;
};

// A matrix operand by its element strides: element (i, j) at data[i·rs + j·cs].
template <class T>
struct Strided {
  const T* data;
  int64_t rs, cs;
};

// C (rows x cols, rows ldc apart) = alpha · A (rows x k) · B (k x cols) + beta · C for every
// block of one shape; built once on the calling thread, run on any.
class MatmulPrimitive {
 public:
  MatmulPrimitive(int64_t rows, int64_t cols, int64_t k, int64_t a_rs, int64_t a_cs,
                  int64_t b_rs, int64_t b_cs, int64_t ldc, float alpha, float beta) {
    const Dnnl& d = dnnl();
    const dnnl_dims_t a_dims = {rows, k}, a_strides = {a_rs, a_cs};
    const dnnl_dims_t b_dims = {k, cols}, b_strides = {b_rs, b_cs};
    const dnnl_dims_t c_dims = {rows, cols}, c_strides = {ldc, 1};
    if (d.dnnl_memory_desc_init_by_strides(&a_md_, 2, a_dims, dnnl_bf16, a_strides) ||
        d.dnnl_memory_desc_init_by_strides(&b_md_, 2, b_dims, dnnl_bf16, b_strides) ||
        d.dnnl_memory_desc_init_by_strides(&c_md_, 2, c_dims, dnnl_f32, c_strides))
      return;
    dnnl_matmul_desc_t desc;
    if (d.dnnl_matmul_desc_init(&desc, &a_md_, &b_md_, nullptr, &c_md_)) return;
    dnnl_primitive_attr_t attr = nullptr;
    if (d.dnnl_primitive_attr_create(&attr)) return;
    bool attr_ok = alpha == 1.0f || !d.dnnl_primitive_attr_set_output_scales(attr, 1, 0, &alpha);
    if (beta != 0.0f && attr_ok) {  // C = (alpha · A · B) + beta · C
      dnnl_post_ops_t post_ops = nullptr;
      attr_ok = !d.dnnl_post_ops_create(&post_ops) &&
                !d.dnnl_post_ops_append_sum(post_ops, beta) &&
                !d.dnnl_primitive_attr_set_post_ops(attr, post_ops);
      if (post_ops) d.dnnl_post_ops_destroy(post_ops);
    }
    dnnl_primitive_desc_t pd = nullptr;
    if (attr_ok && !d.dnnl_primitive_desc_create(&pd, &desc, attr, d.engine, nullptr)) {
      if (d.dnnl_primitive_create(&primitive_, pd)) primitive_ = nullptr;
      d.dnnl_primitive_desc_destroy(pd);
    }
    d.dnnl_primitive_attr_destroy(attr);
  }
  ~MatmulPrimitive() {
    if (primitive_) dnnl().dnnl_primitive_destroy(primitive_);
  }
  MatmulPrimitive(const MatmulPrimitive&) = delete;
  MatmulPrimitive& operator=(const MatmulPrimitive&) = delete;
  bool ok() const { return primitive_ != nullptr; }

  // Runs on the calling thread.
  bool run(const uint16_t* a, const uint16_t* b, float* c) const {
    const Dnnl& d = dnnl();
    dnnl_stream_t stream = thread_stream(d);
    if (!stream) return false;
    dnnl_memory_t mem[3] = {nullptr, nullptr, nullptr};
    bool ok = !d.dnnl_memory_create(&mem[0], &a_md_, d.engine, const_cast<uint16_t*>(a)) &&
              !d.dnnl_memory_create(&mem[1], &b_md_, d.engine, const_cast<uint16_t*>(b)) &&
              !d.dnnl_memory_create(&mem[2], &c_md_, d.engine, c);
    if (ok) {
      const dnnl_exec_arg_t args[3] = {
          {DNNL_ARG_SRC, mem[0]}, {DNNL_ARG_WEIGHTS, mem[1]}, {DNNL_ARG_DST, mem[2]}};
      ok = !d.dnnl_primitive_execute(primitive_, stream, 3, args) &&
           !d.dnnl_stream_wait(stream);
    }
    for (dnnl_memory_t m : mem)
      if (m) d.dnnl_memory_destroy(m);
    return ok;
  }

 private:
  dnnl_memory_desc_t a_md_{}, b_md_{}, c_md_{};
  dnnl_primitive_t primitive_ = nullptr;
};

}  // namespace

bool bf16_gemm_available() noexcept { return dnnl().ok; }

bool bf16_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
               const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
               int64_t ldc, int threads) noexcept {
  if (m <= 0 || n <= 0 || k <= 0 || alpha == 0.0f || !bf16_gemm_available()) return false;
  if (lda < (trans_a ? m : k) || ldb < (trans_b ? k : n) || ldc < n) return false;
  try {
    // op(A) copied as m x k; B in its stored orientation, op(B) (k x n) by strides.
    const bool serial = threads == 1;
    Bf16Copy ca(a, trans_a ? k : m, trans_a ? m : k, lda, /*transpose=*/trans_a, serial);
    Bf16Copy cb(b, trans_b ? n : k, trans_b ? k : n, ldb, /*transpose=*/false, serial);
    const Strided<uint16_t> pa{ca.data(), ca.ld(), 1};
    const Strided<uint16_t> pb{cb.data(), trans_b ? 1 : cb.ld(), trans_b ? cb.ld() : 1};
    // Blocks of rows of C (columns when m is small), as sgemm splits (blas.h).
    const int want = threads > 0 ? threads : num_threads();
    const bool split = want > 1 && 2.0 * double(m) * double(n) * double(k) >= kSplitGemmMinFlops;
    const bool by_rows = m >= 2 * kSplitGemmMinRows || n < 2 * kSplitGemmMinRows;
    const int64_t extent = by_rows ? m : n;
    const int64_t block =
        split ? std::max<int64_t>(kSplitGemmMinRows, (extent + want - 1) / want) : extent;
    const int64_t blocks = (extent + block - 1) / block, last = extent - (blocks - 1) * block;
    auto build = [&](int64_t size) {
      return std::make_unique<MatmulPrimitive>(by_rows ? size : m, by_rows ? n : size, k,
                                               pa.rs, pa.cs, pb.rs, pb.cs, ldc, alpha, beta);
    };
    // oneDNN plans a primitive's threads when it is built: one, as each block runs on one.
    onednn_single_thread();
    // The blocks' shapes are checked before any block runs, so a rejection writes nothing.
    if (!build(block)->ok() || (last != block && !build(last)->ok())) return false;
    auto run_block = [&](int64_t i) {
      const int64_t at = i * block, size = i == blocks - 1 ? last : block;
      // Each block builds its own primitive (a hit in oneDNN's primitive cache, about 2 us):
      // two threads running one primitive object took as long as one thread running both
      // blocks (1024x768x256 on 2 threads: 1.35 ms shared, 0.66 ms one each).
      onednn_single_thread();
      bool done = false;
      try {  // parallel_for's function must not throw
        const auto p = build(size);
        done = p->ok() && (by_rows ? p->run(pa.data + at * pa.rs, pb.data, c + at * ldc)
                                   : p->run(pa.data, pb.data + at * pb.cs, c + at));
      } catch (...) {
      }
      if (done) return;
      // oneDNN failed after accepting the arguments (no stream or memory, say), before
      // writing: this block in float32, so that C is whole.
      if (by_rows)
        sgemm_float32(trans_a, trans_b, size, n, k, alpha, a + at * (trans_a ? 1 : lda), lda, b,
                      ldb, beta, c + at * ldc, ldc, 1);
      else
        sgemm_float32(trans_a, trans_b, m, size, k, alpha, a, lda,
                      b + at * (trans_b ? ldb : 1), ldb, beta, c + at, ldc, 1);
    };
    if (blocks == 1) {
      run_block(0);
    } else {
      parallel_for(0, blocks, 1, [&](int64_t lo, int64_t hi) {
        for (int64_t i = lo; i < hi; ++i) run_block(i);
      });
    }
    return true;
  } catch (...) {  // the bfloat16 copies or a primitive could not be allocated
    return false;
  }
}

#endif  // KILN_HAVE_DNNL_H

}  // namespace kiln::cpu
