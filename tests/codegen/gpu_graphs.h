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

/// Attention's backward through its dropout and softmax, with static shapes: inputs g [batch,
/// rows, d] (the output's gradient), v_t [batch, d, cols], keep [batch, rows, cols] (bool, the
/// dropout mask), p [batch, rows, cols] (the probabilities), k [batch, cols, d]; output
/// (p * (dp - sum(dp * p, -1, keepdim))) @ k, where dp = (g @ v_t) * keep * 1.25 (dropout's
/// backward at p = 0.2).
inline ir::Graph static_attention_backward(int64_t batch, int64_t rows, int64_t cols,
                                           int64_t d) {
  ir::Graph g;
  OpAttrs row_sum;
  row_sum.dims = {-1};
  row_sum.keepdim = true;
  ir::Value grad = g.input(DType::Float32, {batch, rows, d});
  ir::Value v_t = g.input(DType::Float32, {batch, d, cols});
  ir::Value keep = g.input(DType::Bool, {batch, rows, cols});
  ir::Value p = g.input(DType::Float32, {batch, rows, cols});
  ir::Value k = g.input(DType::Float32, {batch, cols, d});
  ir::Value dp = g.op(OpKind::Mul, {g.op(OpKind::Mul, {g.op(OpKind::Matmul, {grad, v_t}), keep}),
                                    g.constant(Scalar(1.25), DType::Float32)});
  ir::Value dot = g.op(OpKind::Sum, {g.op(OpKind::Mul, {dp, p})}, row_sum);
  g.output(g.op(OpKind::Matmul, {g.op(OpKind::Mul, {p, g.op(OpKind::Sub, {dp, dot})}), k}));
  return g;
}

/// Attention's query projection: inputs x [batch, len, heads * dim], w [heads * dim, heads * dim],
/// b [heads * dim]; output ((x @ w + b) viewed as [batch, len, heads, dim], transposed to
/// [batch, heads, len, dim]) * 0.125.
inline ir::Graph query_heads(int64_t batch, int64_t len, int64_t heads, int64_t dim) {
  ir::Graph g;
  const int64_t width = heads * dim;
  ir::Value x = g.input(DType::Float32, {batch, len, width});
  ir::Value w = g.input(DType::Float32, {width, width});
  ir::Value b = g.input(DType::Float32, {width});
  OpAttrs split;
  split.dims = {batch, len, heads, dim};
  OpAttrs swap;
  swap.dim = 1;
  swap.dim1 = 2;
  ir::Value heads_first = g.op(
      OpKind::Transpose,
      {g.op(OpKind::View, {g.op(OpKind::Add, {g.op(OpKind::Matmul, {x, w}), b})}, split)}, swap);
  g.output(g.op(OpKind::Mul, {heads_first, g.constant(Scalar(0.125), DType::Float32)}));
  return g;
}

}  // namespace kiln::test
