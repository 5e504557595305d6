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

}  // namespace kiln::test
