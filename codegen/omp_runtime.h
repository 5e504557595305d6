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

/// Member `index` of a team of `size`'s block of the loop [lower, upper] (inclusive bounds,
/// unsigned, increment 1; upper = lower - 1 is the empty loop): the index-th of `size` nearly
/// equal contiguous blocks, the first trip % size one longer (OpenMP's static schedule without
/// chunks, which __kmpc_for_static_init implements). An empty block has upper = lower - 1.
/// trip: the loop's iteration count; last: this block ends the loop.
struct StaticBlock {
  uint64_t lower, upper, trip;
  bool last;
};
StaticBlock static_block(uint64_t lower, uint64_t upper, int32_t index, int32_t size);

/// Columns per block of a reduction over leading dims (cpu_parallel.cpp) for `cols` columns and
/// a pool of `threads`: one block per thread, a multiple of 16 columns (a 64-byte vector of
/// floats), at least 16. Any width gives the same sums (each column adds its rows in order).
int64_t column_block(int64_t cols, int threads);

/// kiln_rt_parallel_work, kiln_rt_column_block and the __kmpc_* entry points, for runtime_symbols().
std::vector<RuntimeSymbol> omp_runtime_symbols();

}  // namespace kiln::codegen
