#pragma once
/// Loop nests that read a buffer across its memory order (CPU; internal to codegen/, MLIR
/// inside). A fused `(x.t() * 2 + 1).tanh()` is one `scf.parallel` over the output whose
/// innermost loop reads x with the stride of x's rows: a cache line and a page per element,
/// 2-3x eager's time, whose kernels copy such an input through a blocked transpose first
/// (backends/cpu/copy.cpp, `copy_if_read_across`). Here the same happens per tile, in L1: the
/// nest runs over 64 x 64 tiles of the two loops involved (the innermost, and the one indexing
/// the input's last, unit-stride dim); each tile first copies the input's tile into a stack
/// buffer in the loop's order (reading the input's rows, 16 x 16 or 8 x 8 blocks transposed in
/// vector registers), then runs the body, whose innermost loop reads the buffer contiguously and
/// stays vectorised. No extra pass over memory.
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/BuiltinOps.h"

namespace kiln::codegen {

/// Marks the tile loops' `scf.parallel`: every dim of it stays parallel (prepare_parallel_loops
/// keeps the innermost of other nests sequential for LLVM to vectorise; here the tile's own
/// loops are the vectorised ones, and the innermost tile loop may be the only one with more
/// than one iteration: x [4096, 37].t()).
inline constexpr char kTileLoopsAttr[] = "kiln_tile_loops";

/// After `convert-linalg-to-parallel-loops`: rewrites each `scf.parallel` of `fn` (no results,
/// unit steps, a body of loads, stores and pure ops) that loads, from a buffer it does not
/// store to, an element whose last (unit-stride) subscript is an outer loop's index and whose
/// innermost loop's index is an earlier subscript, as described above. The tile loops stay an
/// `scf.parallel` (the thread pool shares them out as before); the buffers are `memref.alloca`s
/// marked for `hoist_tile_buffers`. Returns how many nests it rewrote.
int tile_transposed_reads(mlir::func::FuncOp fn);

/// Once the loops are final (after convert-scf-to-openmp or the row loops): moves each tile
/// buffer to the entry of its enclosing parallel region (one per thread) or function, so that
/// it is allocated once, not per tile, and leaves no `memref.alloca_scope` allocating.
void hoist_tile_buffers(mlir::ModuleOp m);

}  // namespace kiln::codegen
