// matmul (NumPy semantics, broadcast batch dims) and addmm on the CPU. Small products (every
// dtype) go through kiln's small-matrix kernel (small_gemm), the others in float32 through
// oneDNN's sgemm (blas.h), in other dtypes through kiln's blocked GEMM.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <utility>

#include "backends/cpu/allocator.h"
#include "backends/cpu/blas.h"
#include "backends/cpu/kernels.h"
#include "backends/cpu/parallel.h"

namespace kiln::cpu {
namespace {

// One operand seen as a batch of matrices: element (b, i, j) is at
// data + batch_offset(b) + i * rs + j * cs (element strides).
struct MatrixOperand {
  Tensor t;               // keeps a contiguous copy alive when one was made
  int64_t rows, cols, rs, cs;
  int nbatch;             // batch dims, aligned with the output's batch dims
  int64_t bstride[kMaxRank];  // 0 where the operand is broadcast
};

MatrixOperand describe(const Tensor& t, bool is_lhs, const Shape& batch) {
  MatrixOperand op;
  op.t = t;
  const int r = t.dim();
  if (r == 1) {
    // A 1-D lhs is a row [1, k]; a 1-D rhs is a column [k, 1].
    op.rows = is_lhs ? 1 : t.size(0);
    op.cols = is_lhs ? t.size(0) : 1;
    op.rs = is_lhs ? 0 : t.stride(0);
    op.cs = is_lhs ? t.stride(0) : 0;
  } else {
    op.rows = t.size(-2);
    op.cols = t.size(-1);
    op.rs = t.stride(-2);
    op.cs = t.stride(-1);
  }
  op.nbatch = batch.size();
  const int own = std::max(r - 2, 0);
  for (int d = 0; d < op.nbatch; ++d) {
    int td = d - (op.nbatch - own);
    op.bstride[d] = td < 0 || t.size(td) == 1 ? 0 : t.stride(td);
  }
  return op;
}

// A new contiguous tensor (kernels cannot call the dispatcher).
Tensor new_contiguous(const Shape& shape, DType dtype) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::make_shared<StorageImpl>(
      static_cast<size_t>(numel(shape)) * itemsize(dtype), allocator());
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

// A contiguous copy of `t`.
Tensor contiguous_copy(const Tensor& t) {
  Tensor out = new_contiguous(t.shape(), t.dtype());
  copy_cast(out, t);
  return out;
}

// The BLAS layout of a rows×cols matrix with element strides (rs, cs): row-major ('N', ld = rs)
// or transposed ('T', ld = cs). False when neither has unit inner stride and a valid ld.
bool blas_layout(int64_t rows, int64_t cols, int64_t rs, int64_t cs, bool& trans, int64_t& ld) {
  if ((cs == 1 || cols == 1) && (rows == 1 || rs >= std::max<int64_t>(1, cols))) {
    trans = false;
    ld = rows == 1 ? std::max<int64_t>(1, cols) : rs;
    return true;
  }
  if ((rs == 1 || rows == 1) && (cols == 1 || cs >= std::max<int64_t>(1, rows))) {
    trans = true;
    ld = cols == 1 ? std::max<int64_t>(1, rows) : cs;
    return true;
  }
  return false;
}

// If the batch dims of `a` fold into its rows (a [B..., M, K] block with uniform row stride)
// and `b` is the same matrix for every batch, the batched product is one [B·M, K]·[K, N] GEMM.
// Returns the row stride of the folded matrix, or -1.
int64_t folded_row_stride(const MatrixOperand& a, const MatrixOperand& b, const Shape& batch) {
  for (int d = 0; d < b.nbatch; ++d)
    if (batch[d] != 1 && b.bstride[d] != 0) return -1;
  // (size, stride) pairs of a's batch dims then its rows, size-1 dims dropped.
  int64_t size[kMaxRank + 1], stride[kMaxRank + 1];
  int n = 0;
  for (int d = 0; d < a.nbatch; ++d)
    if (batch[d] != 1) size[n] = batch[d], stride[n++] = a.bstride[d];
  if (a.rows != 1) size[n] = a.rows, stride[n++] = a.rs;
  if (n == 0) return std::max<int64_t>(a.rs, 1);
  for (int i = 0; i + 1 < n; ++i)
    if (stride[i] != stride[i + 1] * size[i + 1]) return -1;
  return stride[n - 1];
}

// The batch's small products (blas.h, small_gemm_fits) through small_gemm, on the operands in
// place: spread over the pool in chunks of at least kSmallGemmGrainFlops, each product on one
// thread (so the result does not depend on the thread count).
template <class T>
void small_batched_gemm(const MatrixOperand& a, const MatrixOperand& b, const Shape& batch,
                        T alpha, T beta, T* c) {
  const int64_t m = a.rows, n = b.cols, k = a.cols, nb = numel(batch);
  const int nd = batch.size();
  const T* pa = static_cast<const T*>(a.t.raw_data());
  const T* pb = static_cast<const T*>(b.t.raw_data());
  auto chunk = [&](int64_t lo, int64_t hi) {
    // Batch index of `lo` and its element offsets in A and B, then advanced like an odometer.
    int64_t idx[kMaxRank] = {}, oa = 0, ob = 0;
    int64_t rem = lo;
    for (int d = nd - 1; d >= 0; --d) {
      idx[d] = rem % batch[d];
      rem /= batch[d];
      oa += idx[d] * a.bstride[d];
      ob += idx[d] * b.bstride[d];
    }
    // Runs along the last batch dim are one small_gemm_batch call each.
    const int64_t last = nd > 0 ? batch[nd - 1] : 1;
    const int64_t bsa = nd > 0 ? a.bstride[nd - 1] : 0, bsb = nd > 0 ? b.bstride[nd - 1] : 0;
    for (int64_t bi = lo; bi < hi;) {
      const int64_t run = std::min(hi - bi, last - (nd > 0 ? idx[nd - 1] : 0));
      small_gemm_batch<T>(run, m, n, k, alpha, pa + oa, bsa, a.rs, a.cs, pb + ob, bsb, b.rs,
                          b.cs, beta, c + bi * m * n, m * n, n);
      bi += run;
      if (nd == 0) break;
      oa += run * bsa, ob += run * bsb, idx[nd - 1] += run;
      if (idx[nd - 1] < last) continue;
      oa -= last * bsa, ob -= last * bsb, idx[nd - 1] = 0;
      for (int d = nd - 2; d >= 0; --d) {
        oa += a.bstride[d], ob += b.bstride[d];
        if (++idx[d] < batch[d]) break;
        oa -= a.bstride[d] * batch[d], ob -= b.bstride[d] * batch[d], idx[d] = 0;
      }
    }
  };
  parallel_for(0, nb, small_gemm_grain(m, n, k), chunk);
}

template <class T>
void batched_gemm(const OpCall& call, MatrixOperand a, MatrixOperand b, Shape batch, T alpha,
                  T beta, Tensor& out) {
  GemmTimer timer;
  const int64_t k = a.cols, n = b.cols;
  T* c = out.data<T>();
  if (numel(batch) == 0 || a.rows == 0 || n == 0) return;
  if (k == 0) {  // an empty sum: C = beta·C
    for (int64_t i = 0; i < out.numel(); ++i) c[i] = beta == T(0) ? T(0) : T(beta * c[i]);
    return;
  }

  const bool blas = std::is_same_v<T, float> && onednn_available();
  // float32 products round their inputs as the op's size decides (blas.h): the rows of all
  // batch elements that share one B by shape (B's batch dims of size 1; an expanded B counts
  // as a B per element, as compiled code materialises it), decided before any copy or fold.
  GemmRounding rounding = GemmRounding::None;
  if (blas) {
    bool b_shared = true;
    for (int i = 0; i + 2 < b.t.dim(); ++i) b_shared = b_shared && b.t.size(i) == 1;
    const double rows_per_b = double(a.rows) * double(b_shared ? numel(batch) : 1);
    rounding = gemm_rounding(float32_matmul_precision(), rows_per_b, double(n), double(k));
  }
  // Small products: small_gemm on the operands in place (no copies for odd strides), the batch
  // folded into the rows where it folds, as below (a folded product too large for small_gemm
  // is one BLAS call). Under bfloat16 rounding the products stay with oneDNN.
  if (rounding == GemmRounding::None) {
    MatrixOperand fa = a, fb = b;
    Shape fbatch = batch;
    if (numel(batch) > 1) {
      const int64_t rs = folded_row_stride(a, b, batch);
      if (rs >= 0) {
        fa.rows = a.rows * numel(batch);
        fa.rs = rs;
        fa.nbatch = fb.nbatch = 0;
        fbatch = Shape{};
      }
    }
    if (small_gemm_fits(fa.rows, n, k)) {
      small_batched_gemm<T>(fa, fb, fbatch, alpha, beta, c);
      return;
    }
  }
  // sgemm needs a unit stride in one of the two dims of each operand; copy otherwise.
  bool ta = false, tb = false;
  int64_t lda = 0, ldb = 0;
  if (blas) {
    if (!blas_layout(a.rows, a.cols, a.rs, a.cs, ta, lda))
      a = describe(contiguous_copy(a.t), true, batch);
    if (!blas_layout(b.rows, b.cols, b.rs, b.cs, tb, ldb))
      b = describe(contiguous_copy(b.t), false, batch);
    blas_layout(a.rows, a.cols, a.rs, a.cs, ta, lda);
    blas_layout(b.rows, b.cols, b.rs, b.cs, tb, ldb);
  }
  // [B..., M, K]·[K, N] with foldable batch dims: one [B·M, K]·[K, N] product (linear layers).
  if (numel(batch) > 1) {
    const int64_t rs = folded_row_stride(a, b, batch);
    bool t = false;
    int64_t ld = 0;
    const int64_t rows = a.rows * numel(batch);
    if (rs >= 0 && (!blas || blas_layout(rows, k, rs, a.cs, t, ld))) {
      a.rows = rows;
      a.rs = rs;
      a.nbatch = b.nbatch = 0;
      batch = Shape{};
      ta = t;
      lda = ld;
    }
  }
  const int64_t m = a.rows, nb = numel(batch);
  const T* pa = static_cast<const T*>(a.t.raw_data());
  const T* pb = static_cast<const T*>(b.t.raw_data());
  std::atomic<bool> failed{false};
  // Element offsets of batch element `bi` in A and B.
  auto offsets = [&](int64_t bi) {
    int64_t oa = 0, ob = 0;
    for (int d = batch.size() - 1; d >= 0; --d) {
      const int64_t idx = bi % batch[d];
      bi /= batch[d];
      oa += idx * a.bstride[d];
      ob += idx * b.bstride[d];
    }
    return std::pair<int64_t, int64_t>(oa, ob);
  };
  auto product = [&](int64_t bi, int threads) {
    auto [oa, ob] = offsets(bi);
    T* cp = c + bi * m * n;
    if constexpr (std::is_same_v<T, float>) {
      if (blas) {
        if (!sgemm(ta, tb, m, n, k, alpha, pa + oa, lda, pb + ob, ldb, beta, cp, n, threads,
                   rounding))
          failed.store(true, std::memory_order_relaxed);
        return;
      }
    }
    gemm<T>(m, n, k, alpha, pa + oa, a.rs, a.cs, pb + ob, b.rs, b.cs, beta, cp, n);
  };
  // A batch of small products is spread over the pool, one product per thread; a single or
  // large product is split by sgemm itself (blas.h).
  const double flops = 2.0 * static_cast<double>(m) * static_cast<double>(n) * k;
  if (nb == 1 || flops >= kSpreadGemmBatchMaxFlops) {
    for (int64_t bi = 0; bi < nb; ++bi) product(bi, 0);
  } else {
    const int64_t grain = static_cast<int64_t>(std::ceil(kSpreadGemmBatchMaxFlops / 2 / flops));
    parallel_for(0, nb, grain, [&](int64_t lo, int64_t hi) {
      for (int64_t bi = lo; bi < hi; ++bi) product(bi, 1);
    });
  }
  if (failed.load())
    throw Error(call.name(), "oneDNN's sgemm rejected the arguments (internal error)", call.loc);
}

}  // namespace

void matmul_kernel(const OpCall& call, const InferredMeta& meta, std::span<Tensor> outs) {
  Tensor& out = outs[0];
  const bool addmm = call.op == OpKind::Addmm;
  const Tensor& x = call.inputs[addmm ? 1 : 0];
  const Tensor& y = call.inputs[addmm ? 2 : 1];
  // Batch dims of the output: everything before its matrix dims.
  const int nbatch = out.dim() - (x.dim() >= 2) - (y.dim() >= 2);
  Shape batch;
  for (int d = 0; d < nbatch; ++d) batch.push_back(out.shape()[d]);
  MatrixOperand a = describe(x, true, batch), b = describe(y, false, batch);

  KILN_DISPATCH_NUMERIC(meta.compute_dtype, T, {
    T alpha = T(1), beta = T(0);
    if (addmm) {
      alpha = call.attrs.alpha.to<T>();
      beta = call.attrs.beta.to<T>();
      // beta·bias enters through GEMM's beta: write the broadcast bias into out first. With
      // beta == 0 the bias is ignored entirely (NaNs in it too), as in PyTorch.
      if (beta != T(0)) copy_cast(out, call.inputs[0]);
      // alpha == 0: BLAS would skip the product, but PyTorch multiplies it by 0, so its NaN
      // and inf reach the result (and 0 times a negative product is -0). As compiled code:
      // fma(beta, bias, alpha * product).
      if (alpha == T(0)) {
        Tensor product = new_contiguous(out.shape(), out.dtype());
        batched_gemm<T>(call, a, b, batch, T(1), T(0), product);
        const T* p = product.data<T>();
        T* o = out.data<T>();
        for (int64_t i = 0, n = out.numel(); i < n; ++i) {
          T scaled = alpha * p[i];  // alpha is ±0 here: -0. keeps its sign, as PyTorch
          if constexpr (std::is_floating_point_v<T>)
            o[i] = beta != T(0) ? std::fma(beta, o[i], scaled) : scaled;
          else
            o[i] = beta != T(0) ? beta * o[i] + scaled : scaled;
        }
        return;
      }
    }
    batched_gemm<T>(call, a, b, batch, alpha, beta, out);
  });
}

}  // namespace kiln::cpu
