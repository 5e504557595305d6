#pragma once
/// kiln's implementation of the OpenMP runtime calls that MLIR's `convert-scf-to-openmp` code
/// makes (omp_runtime.cpp; cpu_parallel.h says when codegen emits them). MLIR-free.
#include <cstdint>
#include <vector>

#include "codegen/runtime.h"

namespace kiln::codegen {

/// Parallel loops of fewer iterations run on the calling thread: the same grain as the eager
/// kernels (cpu::kGrainSize); waking a pool thread costs more than such a loop takes.
inline constexpr int64_t kParallelMinIterations = 32768;

/// kiln_rt_parallel_work and the __kmpc_* entry points, for runtime_symbols().
std::vector<RuntimeSymbol> omp_runtime_symbols();

}  // namespace kiln::codegen
