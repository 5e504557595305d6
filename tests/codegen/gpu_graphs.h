#pragma once
// Graphs the GPU lowering's tests share (gpu_loops_test.cpp runs them emulated on the CPU,
// gpu_ptx_test.cpp checks their PTX).
#include <cstdint>

#include "kiln/kiln.h"

namespace kiln::test {

/// Softmax's backward after the GEMM that gives its incoming gradient: inputs y [rows, cols],
/// a [rows, k], b [k, cols]; output y * (a @ b - sum((a @ b) * y, -1, keepdim)).
inline ir::Graph softmax_backward_after_gemm(int64_t rows, int64_t cols, int64_t k) {
  ir::Graph g;
  OpAttrs keep;
  keep.dims = {-1};
  keep.keepdim = true;
  ir::Value y = g.input(DType::Float32, {rows, cols});
  ir::Value grad = g.op(OpKind::Matmul, {g.input(DType::Float32, {rows, k}),
                                         g.input(DType::Float32, {k, cols})});
  ir::Value dot = g.op(OpKind::Sum, {g.op(OpKind::Mul, {grad, y})}, keep);
  g.output(g.op(OpKind::Mul, {y, g.op(OpKind::Sub, {grad, dot})}));
  return g;
}

/// Attention's forward in a graph that keeps its static shapes (as a whole training step does):
/// inputs q [batch, rows, d], k [batch, d, cols], v [batch, cols, d], keep [batch, rows, cols];
/// outputs the column sum of `out` over the batch (first: it has no rows to relax, like a weight
/// gradient) and out = (softmax(q @ k, -1) * keep) @ v.
inline ir::Graph static_attention(int64_t batch, int64_t rows, int64_t cols, int64_t d) {
  ir::Graph g;
  OpAttrs last;
  last.dim = -1;
  ir::Value q = g.input(DType::Float32, {batch, rows, d});
  ir::Value k = g.input(DType::Float32, {batch, d, cols});
  ir::Value v = g.input(DType::Float32, {batch, cols, d});
  ir::Value keep = g.input(DType::Float32, {batch, rows, cols});
  ir::Value p =
      g.op(OpKind::Mul, {g.op(OpKind::Softmax, {g.op(OpKind::Matmul, {q, k})}, last), keep});
  ir::Value out = g.op(OpKind::Matmul, {p, v});
  OpAttrs batch_sum;
  batch_sum.dims = {0};
  g.output(g.op(OpKind::Sum, {out}, batch_sum));
  g.output(out);
  return g;
}

}  // namespace kiln::test
