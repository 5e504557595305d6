#pragma once
/// Multi-threading of compiled graphs by splitting the leading dim ("rows") over the thread pool.
/// Internal to codegen/ (MLIR inside).
///
/// A graph is row-splittable when every loop nest after fusion runs its outermost loop over the
/// rows of every row-carrying operand and of every result, so the graph computed on rows
/// [lo, hi) of those operands gives rows [lo, hi) of every result. Then run() calls the compiled
/// function on row blocks: blocks are spread over the pool's threads, and each is small enough
/// that the intermediates of a multi-loop graph (softmax, layer_norm) stay in cache. Operands
/// without rows (a broadcast bias, a matmul's right-hand side) are passed whole to every call.
#include <vector>

#include "codegen/jit.h"  // RowSplitPlan (MLIR-free: cached with the object code)
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/BuiltinOps.h"

namespace kiln::codegen {

/// Makes dim 0 of `main`'s arguments dynamic where it equals the first result's (static, > 1)
/// dim 0, and re-infers every kiln op's result type (core's infer_meta). Only graphs of
/// elementwise, reduce, matmul, composite and constant ops, and views of values whose type does
/// not change (views carry sizes in attributes: a weight's slices and transposes), are relaxed;
/// composites are decomposed afterwards, on the relaxed types.
/// Returns false, possibly leaving `m` half-changed, when the graph cannot be relaxed: the
/// caller then starts again from the graph's text.
bool relax_leading_dim(mlir::ModuleOp m);

/// Analyses fused linalg-on-tensors `fn` (results still returned as tensors): all results must
/// be row-carrying, each argument either row-carrying with a dynamic dim 0 or used without rows,
/// and all of those must have the same rows: joined by loop nests that run over the rows of
/// several of them, or among the arguments `equal_rows` marks (dim 0 relaxed from one size by
/// relax_leading_dim; run() checks their sizes). Two results of separate nests over arguments
/// with `?` rows are not split: their sizes may differ (run() would slice them alike, and the
/// merged row loops run to the first one's size).
RowSplitPlan plan_row_split(mlir::func::FuncOp fn, const std::vector<bool>& equal_rows);

}  // namespace kiln::codegen
