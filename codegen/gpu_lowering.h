#pragma once
/// Internal to codegen/: the GPU half of the pipeline (codegen/README.md, "GPU"). MLIR-free
/// apart from forward declarations, like jit.h.
#include <string>

#include "codegen/codegen.h"

namespace mlir {
class ModuleOp;
class DialectRegistry;
}  // namespace mlir

namespace kiln::codegen {

/// Adds the GPU, NVVM and NVGPU dialects, the NVVM target and the GPU/NVVM -> LLVM IR
/// translations to `r` (cheap; every codegen context gets them).
void fill_gpu_registry(mlir::DialectRegistry& r);

/// What lower_for_gpu produced.
struct GpuLowered {
  std::string ptx;   ///< the PTX of every kernel (one module), "" when the graph has none
  int kernels = 0;   ///< `.entry` kernels in the PTX
};

/// The first half of lower_for_gpu: @main's loop nests rewritten into the parallel loops that
/// become kernels (rows fused, column sums turned inside out, constants inlined, elementwise
/// nests linearised and unrolled), still scf on memrefs. `cuda_gemm`: GEMM calls go to cuBLAS
/// (false keeps the CPU's). CompileOptions::emulate_gpu_loops runs these loops on the CPU, so
/// tests check the rewrites' results without a GPU.
void gpu_parallel_loops(mlir::ModuleOp m, const GpuTarget& target, bool row_separable,
                        bool cuda_gemm, std::string& messages);

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
                   std::string& messages, GpuLowered& out);

}  // namespace kiln::codegen
