#pragma once
/// Internal to codegen/: the GPU half of the pipeline (codegen/README.md, "GPU"). MLIR-free
/// apart from forward declarations, like jit.h.
#include <functional>
#include <string>
#include <vector>

#include "codegen/codegen.h"

namespace mlir {
class ModuleOp;
class DialectRegistry;
class Operation;
class Value;
namespace scf {
class ParallelOp;
}
namespace func {
class FuncOp;
}
}  // namespace mlir

namespace kiln::codegen {

/// Adds the GPU, NVVM and NVGPU dialects, the NVVM target and the GPU/NVVM -> LLVM IR
/// translations to `r` (cheap; every codegen context gets them).
void fill_gpu_registry(mlir::DialectRegistry& r);

/// What lower_for_gpu produced.
struct GpuLowered {
  std::string ptx;   ///< the PTX of every kernel (one module), "" when the graph has none
  int kernels = 0;   ///< `.entry` kernels in the PTX
  /// (kernel, graph ops and source lines) when the graph's ops carry names (kernel timers:
  /// kernel_profile.h, describe_gpu_kernels)
  std::vector<std::pair<std::string, std::string>> kernel_ops;
};

/// The first half of lower_for_gpu: @main's loop nests rewritten into the parallel loops that
/// become kernels (rows fused and spread over lanes, column sums turned inside out, constants
/// inlined, elementwise nests linearised and unrolled), still scf on memrefs. `for_device`:
/// GEMM calls go to cuBLAS and rows get target.row_lanes lanes; false, for
/// CompileOptions::emulate_gpu_loops, which runs these loops on the CPU so tests check the
/// rewrites' results without a GPU: GEMMs stay the CPU's and rows get lanes of one thread.
/// `same_rows[i]`: input i's dim 0 is `?` only through the row relaxation (row_split.h), so at
/// run time it is the graph's static size, the same for every such input (run() checks the
/// inputs against the graph's shapes, and GPU code runs all rows at once): their dims become
/// one value, so loops over the rows of different inputs are seen to share their rows.
void gpu_parallel_loops(mlir::ModuleOp m, const GpuTarget& target, bool row_separable,
                        const std::vector<bool>& same_rows, bool for_device,
                        std::string& messages);

/// Rows over the lanes of a warp (gpu_row_lanes.cpp): each top-level parallel loop of `fn` whose
/// threads run serial loops along their row's last (contiguous) dim — softmax, layer_norm, row
/// sums — becomes a loop over (rows, `lanes`): lane l runs columns l, l + lanes, ..., keeps its
/// part of each reduction in a register (from the combine's neutral element), and the lanes
/// combine their parts with a butterfly of `gpu.shuffle xor` (log2(lanes) steps; every lane ends
/// with the same bits), so a warp's loads are contiguous. Only loops shown safe are rewritten:
/// a buffer written in the row body is its own, indexed by the row indices and then constants
/// (a per-row value: stored once, by every lane alike) or constants and the column index (an
/// element only its lane touches). `lanes`: 32 (a warp; NVVM's shuffle masks assume whole
/// warps), or 1 for the CPU emulation, which rewrites the loops without shuffles (rows shorter
/// than 2 * lanes keep a thread each on a GPU). Returns the number of loops rewritten. Throws
/// kiln::Error unless lanes is 1, or 32 with `threads_per_block` a multiple of 32.
/// `per_lane`: columns a lane's column loop computes per step, all their loads before any of
/// their stores (GpuTarget::elements_per_thread; 1 where a load follows a store in the loop).
int spread_rows_over_lanes(mlir::func::FuncOp fn, int lanes, int threads_per_block,
                           int per_lane);

/// Whether spread_rows_over_lanes would rewrite the top-level parallel loop `p` for `lanes`.
bool spreads_over_lanes(mlir::scf::ParallelOp p, int lanes);

/// Registers kiln-gpu-row-lanes{lanes=32 per-lane=1} (spread_rows_over_lanes on each function,
/// for lit tests), kiln-gpu-static-rows{lanes=32} (fuse_static_row_loops, accepting what
/// spreads_over_lanes takes) and the dialects their input and output need.
void register_gpu_row_lanes_pass(mlir::DialectRegistry& registry);

/// Every scf.parallel of `m` runs its iterations last to first (each index i becomes ub - 1 - i;
/// loops from 0 with step 1 only): CompileOptions::emulate_in_reverse.
void reverse_parallel_loops(mlir::ModuleOp m);

/// Lowers a bufferized destination-passing @main (after kiln-extern-calls) for an NVIDIA GPU:
/// its loop nests become kernels (an elementwise nest one kernel over all its elements; when
/// every nest of the graph runs over the same rows, as softmax or layer_norm do, all of them
/// one kernel with a thread per row), its GEMMs host calls of cuBLAS (kiln_rt_cuda_gemm_*),
/// intermediates device memory (gpu.alloc), and the module the host half, in the LLVM dialect,
/// that launches them through the mgpu* runtime functions (backends/cuda/mlir_runtime.cpp).
/// Throws kiln::Error with the MLIR diagnostics (`messages`) when a stage fails.
/// `row_separable`: the row-split analysis (row_split.h) found every nest running over the
/// same rows (dim 0 the only `?`), without GEMMs: consecutive nests are merged per row.
void lower_for_gpu(mlir::ModuleOp m, const GpuTarget& target, bool row_separable,
                   const std::vector<bool>& same_rows, std::string& messages, GpuLowered& out);

}  // namespace kiln::codegen
