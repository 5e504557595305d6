#pragma once
/// Internal to codegen/: loop nests merged — over the same rows into one loop over rows, for GPU
/// kernels (a thread or warp per row) and for CPU code (each row's intermediates stay in L1);
/// GPU loops over one iteration space into one kernel.
#include <functional>

#include "llvm/ADT/SmallVector.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/SCF/IR/SCF.h"

namespace mlir {
class DialectRegistry;
}

namespace kiln::codegen {

/// The top-level scf.parallel loops of `fn`, in order.
llvm::SmallVector<mlir::scf::ParallelOp> top_level_loops(mlir::func::FuncOp fn);

/// Row mode: consecutive top-level parallel loop nests over the rows become one parallel loop
/// over rows whose body runs each nest's remaining dims as serial loops (softmax, layer_norm:
/// one loop instead of 4-11). For graphs the row-split analysis found row-separable
/// (row_split.h: every nest runs over the same rows, row i of a result reads only row i of what
/// came before; dim 0 is the only `?`) all row loops are merged where nothing stays between
/// them. Otherwise (`verify`: a graph with GEMMs, such as attention's softmax between two) each
/// run of row loops between ops that stay (a GEMM call) merges only where the loops' accesses
/// show it safe, dim 0 included. Returns whether any nests were merged.
bool fuse_row_loops(mlir::func::FuncOp fn, bool verify);

/// Row mode for graphs with static shapes that are not row-separable (a whole training step):
/// runs of consecutive top-level parallel loops with constant bounds (only pure ops between
/// them) are cut into groups, each as long as its loops share at least one row dim by
/// fuse_row_loops' verify rule. A group of two or more loops with a reduction among them (a
/// serial loop: softmax's row max and sum with the normalisation and dropout after them, or
/// its backward's row sum between two elementwise loops) becomes one loop over its row dims,
/// when every loop that results is one `accept(loop, iterations)` takes, `iterations` being
/// the most any loop of the group ran (the caller's test that the rows will be spread over a
/// warp's lanes, since a row loop that keeps a thread per row reads uncoalesced, and that the
/// rows keep enough threads busy). Each row's elements are then read back by the warp that
/// wrote them, in cache, instead of by another kernel from DRAM. Returns whether any group
/// merged.
bool fuse_static_row_loops(mlir::func::FuncOp fn,
                           llvm::function_ref<bool(mlir::scf::ParallelOp, int64_t)> accept);

/// Consecutive top-level parallel loops over the same iteration space (the same bounds and
/// steps in every dim; only pure ops between them) become one loop when every buffer they
/// write is their own (own_buffer) and is accessed in all of them at the same indices, which
/// use every loop index: each iteration then touches only its own elements of what they write,
/// and running the bodies one after another per iteration keeps every read after the writes it
/// saw before. A column sum's zero fill, its loop over the rows and its rounding to float32 (a
/// bias gradient) become one GPU kernel instead of three. Returns whether any loops merged.
bool fuse_same_domain_loops(mlir::func::FuncOp fn);

/// GPU row loops (after the merges above): an allocation that one column loop of a row loop
/// stores (directly in the loop, at each row IV and the loop's own IV, covering the dim) and
/// only later loops of the same row load (at the same row, any column) is not stored: each load
/// becomes the stored value's computation again, at the loaded column. That computation may be
/// at most a few pure ops (no math functions) and loads of buffers nothing in the row loop
/// writes, of at most twice the element's bytes: the readers load the inputs again, from cache
/// when the warp just read the row. Attention's backward then keeps dropout's gradient of the
/// probabilities ([B, H, L, L]) in no buffer: it was stored and read back twice in its row.
/// A column loop left writing nothing goes too. Returns how many allocations went.
int recompute_row_intermediates(mlir::func::FuncOp fn);

/// Registers kiln-gpu-row-recompute (recompute_row_intermediates on each function, for lit
/// tests).
void register_gpu_row_recompute_pass(mlir::DialectRegistry& registry);

/// The CPU's row loops (after convert-linalg-to-parallel-loops; run() calls the code on blocks
/// of rows and the block's rows run one after another): fuse_row_loops, then
/// - an allocation only one row loop touches, always at the loop's row indices, shrinks to one
///   row (memref<?x1024xf32> -> memref<1x1024xf32>), so each row's intermediates stay in L1
///   whatever the block's size;
/// - such a row whose last reader copies it, element for element, into an output argument
///   marked llvm.noalias that nothing else touches is computed in the output's row instead
///   (softmax's exp is stored in the output and scaled there, as eager's kernel does).
/// - consecutive column loops of a row merge (fuse_column_loops), float32 sums and means sum in
///   float32 blocks (block_float32_sums), long float64 sums in float64 blocks
///   (block_float64_sums), and each row prefetches the next
///   (prefetch_next_rows).
/// Returns whether no allocation with a dynamic size is left: every intermediate is then per
/// row, and run() may use blocks as large as a single loop nest's.
bool cpu_row_loops(mlir::func::FuncOp fn, bool verify);

/// The CPU's row loops: consecutive serial column loops of a row body (the same bounds) become
/// one when running the second's body right after the first's in each iteration reads and
/// writes the same values: what both access and either writes (an allocation or an output
/// argument) they access only at the same indices, the column's among them, and what lies
/// between them (an accumulator's initial value) moves above the first. Both must stay
/// vectorizable: their stores at other indices are vector reductions (a `reassoc` sum, a max).
/// Softmax's exp, stored in the output, and its sum become one pass over the row instead of two,
/// as in eager's kernel. Returns how many loops merged into others.
int fuse_column_loops(mlir::func::FuncOp fn);

/// The CPU's row loops: each row starts by prefetching the next row of the arguments it reads
/// at its row indices and does not write (rows of at least 64 B, static and contiguous; at most
/// 16 KiB of next rows in all, in the order the loop first reads them), as eager's softmax and
/// layer_norm kernels do (backends/cpu/reduce_simd.h): rows of 4 KiB end on page boundaries,
/// where the hardware prefetchers stop. Returns how many buffers it prefetches.
int prefetch_next_rows(mlir::func::FuncOp fn);

/// The CPU's row loops: a float64 sum that lower.cpp made of widened float32 terms (its add
/// marked kWidenedFloat32SumAttr, ir/dialect.h: a float32 sum or mean) whose result is only
/// rounded to float32 (a mean's after its division) is summed in float32 partials, one per
/// block of 4,096 columns, each added to the float64 sum, as eager's kernels sum (sum_run,
/// backends/cpu/reduce_simd.h). The vectorised loop then keeps 16 float32 lanes per register
/// instead of 8 float64 and converts nothing per column: compiled softmax [4096, 1024] took
/// 0.84 ms instead of 1.03 (2 threads; eager 0.82), a row sum 0.56-0.65 instead of 0.89 (1
/// thread). Terms >= 0 (kNonnegativeTermsAttr: softmax's, log_softmax's and logsumexp's Σ exp)
/// cannot cancel, so their partials overflow only where the float32 total does. Other sums are
/// blocked only in loops that write nothing but their sums: a block whose partial is inf or
/// NaN runs the original float64 loop over its columns instead (a row [3e38, 3e38, -3e38,
/// -3e38] is 0, as eager's kernels redo such a row in double). A float64 sum the user asked
/// for is not marked and stays one, as does a sum used further as float64 (a variance).
/// Returns how many sums it blocked.
int block_float32_sums(mlir::func::FuncOp fn);

/// Every float64 running sum that adds more than 4,096 terms (or a number not known) into one
/// element, counting the enclosing loops that keep the element, and whose accumulator's buffer
/// (an allocation or output, or a view of one: its part of a cat) only running sums touch in
/// its loop: summed in float64 partials, one per block of up to 4,096 iterations of its loop,
/// each added to the accumulator, as eager's kernels sum (sum_run). One
/// running sum of 10^7 terms lost what it added below half an ulp of its total: a compiled
/// float64 sum of [1, 1e-16 x (10^7 - 1)] was 1 + 0.969e-9 (eager 1 + 0.99999e-9). Widened
/// float32 sums that block_float32_sums left are blocked too. Returns how many sums it blocked.
int block_float64_sums(mlir::func::FuncOp fn);

/// Registers kiln-cpu-row-loops{verify=false} and kiln-fuse-same-domain-loops (cpu_row_loops and
/// fuse_same_domain_loops on each function, for lit tests).
void register_cpu_row_loops_pass(mlir::DialectRegistry& registry);

/// Whether `root` is an argument of @main marked llvm.noalias (an output buffer of its own).
bool noalias_argument(mlir::Value root);

/// The allocation or argument buffer `m` is a view of; null when it comes from anything else
/// (an op not known as a view, such as memref.transpose, may still alias).
mlir::Value view_root(mlir::Value m);

/// The memref a memref.load or memref.store accesses; null for any other op.
mlir::Value accessed_memref(mlir::Operation* op);
/// The indices of a memref.load or memref.store (`op` must be one).
mlir::ValueRange access_index_values(mlir::Operation* op);

/// Whether memref `m` is a buffer of its own for loops that `inside` tells apart: an allocation
/// or a function argument (or a reshape of one, when nothing else reaches that buffer inside
/// the loops) used only by loads, stores, deallocs and dims, or by other ops (views, pointer
/// extraction) of which nothing reached through their results is `inside` — so the loops touch
/// its elements only through `m` itself, and an index check of their accesses sees them all.
bool own_buffer(mlir::Value m, const std::function<bool(mlir::Operation*)>& inside);

}  // namespace kiln::codegen
