#pragma once
/// Multi-threading inside a compiled graph that cannot be split by rows (row_split.h): each
/// top-level parallel loop nest is shared out over kiln's thread pool. Internal to codegen/
/// (MLIR inside).
///
/// After `convert-linalg-to-parallel-loops`, every `scf.parallel` directly in @main keeps its
/// leading dims parallel (all but the innermost, which becomes an `scf.for` so that LLVM still
/// vectorises it; a 1-D loop stays parallel), is preceded by a call
/// `kiln_rt_parallel_work(iterations)` (runtime: small nests run on the calling thread; a nest
/// whose static sizes are already below that stays sequential code), and is
/// then lowered by MLIR's `convert-scf-to-openmp`. A reduction over leading dims (a column
/// sum: `scf.for` rows around an `scf.parallel` over columns) is first turned inside out: an
/// `scf.parallel` over blocks of columns (one per thread, width from
/// `kiln_rt_column_block(cols)` at run time) around the row loop and a loop over the block's
/// columns, so it is shared out too. Other parallel loops inside a sequential loop become
/// `scf.for` nests: forking per outer iteration costs more than it gains. The OpenMP entry points the lowered code calls
/// (`__kmpc_fork_call`, `__kmpc_for_static_init_8u`, ...) are kiln's own, over its thread pool
/// (omp_runtime.cpp), so no OpenMP runtime with its own (spinning) threads is loaded.
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/IR/BuiltinOps.h"

namespace kiln::codegen {

/// index_add / scatter_add's loop nest (codegen/lower_index.cpp: scf.for loops tagged
/// kScatterLoopAttr): fills `fors`, outermost first, when `outer` starts a perfect nest of such
/// loops without results (the innermost body adds one element).
bool match_scatter_nest(mlir::scf::ForOp outer, llvm::SmallVectorImpl<mlir::scf::ForOp>& fors);

/// Rewrites @main's `scf.parallel` loops as described above. index_add / scatter_add nests
/// are shared out first: different iterations of the loops other than the one over the indexed
/// dim (kScatterAxisAttr) add into different elements, so the loops after it become one
/// `scf.parallel` inside the others (shared out by column blocks, as a reduction over leading
/// dims), or, when the indexed dim's loop is the innermost (or was folded away), the loops
/// before it become an `scf.parallel` around it. Each element still gets its additions in
/// eager's order, so the results equal eager's bit for bit. Throws kiln::Error for a parallel
/// loop with reductions (convert-linalg-to-parallel-loops makes none).
void prepare_parallel_loops(mlir::ModuleOp m);

/// After convert-scf-to-openmp: inlines the `memref.alloca_scope` it wraps each loop body in
/// when the body allocates nothing on the stack (kiln's never do). Its loops would otherwise
/// become several blocks inside the scope, which the scope does not allow, and conversion to
/// the LLVM dialect fails.
void finish_parallel_loops(mlir::ModuleOp m);

/// A reduction over leading dims as convert-linalg-to-parallel-loops leaves it (a column sum):
/// a perfect nest of `scf.for` loops without iter_args (each body holds just the next loop)
/// around one `scf.parallel` with step-1 loops, every bound defined outside the nest. Fills
/// `fors` (outermost first) and `par`; false for any other loop. The output elements of such a
/// nest are indexed by the parallel dims only (it comes from a linalg op), so the parallel loop
/// may go outside the row loops.
bool match_reduction_nest(mlir::scf::ForOp outer, llvm::SmallVectorImpl<mlir::scf::ForOp>& fors,
                          mlir::scf::ParallelOp& par);

}  // namespace kiln::codegen
