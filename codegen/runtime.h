#pragma once
/// Functions that JIT-compiled code may call (extern kernels such as BLAS, parallel-for helpers).
/// MLIR-free. Whatever JIT backs codegen::Executable must make every symbol listed here resolvable
/// by name from the generated code.
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "core/error.h"
#include "core/precision.h"

namespace kiln::codegen {

struct RuntimeSymbol {
  const char* name;  // the C symbol name the generated code calls
  void* address;
};

/// All runtime symbols kiln provides to compiled code (the CPU ones and cuda_runtime_symbols()).
const std::vector<RuntimeSymbol>& runtime_symbols();

/// CUDA host code's runtime (codegen/cuda_runtime.cpp): kiln_rt_cuda_malloc/free (device memory
/// of intermediates), kiln_rt_cuda_gemm_f32/f64 (cuBLAS), and MLIR's mgpu* functions.
std::vector<RuntimeSymbol> cuda_runtime_symbols();
/// The device that the calling thread's CUDA host code runs on (the GEMM's cuBLAS handle).
void set_cuda_runtime_device(int index);
/// The first error a CUDA runtime function recorded on this thread since the last call (and
/// clears it); they cannot throw through JIT-compiled frames.
std::optional<Error> take_cuda_runtime_error();

/// Around each call into JIT-compiled CPU code on a thread (Executable::run's calls, each member
/// of a parallel region): when an allocation of the code's intermediates fails (malloc returns
/// null; the code then sets the thread's failure and returns early, codegen/alloc_checks.cpp),
/// failed_bytes() is its size, and the destructor frees the blocks the code allocated on this
/// thread since the scope began (the early return skipped their frees) and clears the failure.
/// Nested scopes on one thread each free their own blocks.
class AllocationFailureScope {
 public:
  AllocationFailureScope();
  ~AllocationFailureScope();
  AllocationFailureScope(const AllocationFailureScope&) = delete;
  AllocationFailureScope& operator=(const AllocationFailureScope&) = delete;
  /// Bytes of the allocation that failed on this thread in the scope; 0 when none did.
  size_t failed_bytes() const;

 private:
  uint64_t first_serial_;
};

/// Sets the calling thread's allocation failure, as compiled code does: a parallel region
/// whose member failed on another thread makes the code that started it return early too.
void note_allocation_failure(size_t nbytes);

/// Intermediate blocks freed by a thread other than the one that allocated them (compiled code
/// never does; such a block is not reused). For tests.
uint64_t foreign_block_frees();

/// Tests: the `n`-th next intermediate allocation of compiled code, on any thread (0: the next
/// one), returns null, as when memory runs out; -1 turns this off (after the failure, the
/// count goes on below -1: no later allocation fails).
void fail_intermediate_allocation_for_testing(int64_t n);
/// Tests: intermediate blocks handed out on this thread so far, and those not freed yet.
uint64_t intermediate_allocations_on_this_thread();
size_t live_intermediate_blocks_on_this_thread();

/// How many times compiled code has called the runtime GEMM (kiln_rt_gemm_f32/f64) in this
/// process: tests check with it that a graph's matmuls went to BLAS.
uint64_t gemm_calls();

/// How many parallel loops compiled code has run on more than one thread in this process (the
/// loop nests of graphs that are not row-splittable; codegen/cpu_parallel.h): tests check with
/// it that large loops were shared out and small ones were not.
uint64_t parallel_loop_runs();

/// While alive on a thread, the runtime GEMM's float32 products round their inputs as
/// cpu::gemm_rounding decides for `precision` (read once per Executable::run, so that one run
/// never mixes precisions) and for the whole product: a call whose C rows are the block's
/// (rows_split, from kiln-extern-calls) counts `rows_factor` times its rows (the run's rows over
/// its row block's, where Executable::run splits a graph into blocks of rows), so that compiled
/// products decide as eager ones do. Without one, a product reads the current precision and
/// counts its own rows.
class GemmRunScope {
 public:
  GemmRunScope(MatmulPrecision precision, double rows_factor);
  ~GemmRunScope();
  GemmRunScope(const GemmRunScope&) = delete;
  GemmRunScope& operator=(const GemmRunScope&) = delete;

 private:
  MatmulPrecision previous_precision_;
  double previous_factor_;
  bool previous_set_;
};

/// The precision of the GemmRunScope alive on this thread, else float32_matmul_precision():
/// what compiled code's cuBLAS GEMMs use (one read per run, as on the CPU).
MatmulPrecision gemm_run_precision();

/// While alive on a thread, the runtime GEMM runs single-threaded on that thread: Executable::run
/// sets it around each row block it runs on the thread pool (the blocks are the parallelism;
/// a threaded BLAS inside each block would oversubscribe the cores).
class SerialGemmScope {
 public:
  SerialGemmScope();
  ~SerialGemmScope();
  SerialGemmScope(const SerialGemmScope&) = delete;
  SerialGemmScope& operator=(const SerialGemmScope&) = delete;

 private:
  bool previous_;
};

/// One kernel's calls and wall time (nanoseconds) in an Executable compiled with kernel timers
/// (CompileOptions::profile_kernels; the code calls kiln_rt_kernel_begin(id) and
/// kiln_rt_kernel_end(id) around kernel `id`, codegen/kernel_profile.h).
struct KernelCounter {
  std::atomic<int64_t> calls{0}, ns{0};
};

/// While alive on a thread, the kernel timers of the code run on that thread add to
/// `counters[id]` (indexed by kernel id); without one they add nowhere.
class KernelProfileScope {
 public:
  explicit KernelProfileScope(KernelCounter* counters);
  ~KernelProfileScope();
  KernelProfileScope(const KernelProfileScope&) = delete;
  KernelProfileScope& operator=(const KernelProfileScope&) = delete;

 private:
  KernelCounter* previous_;
};

}  // namespace kiln::codegen
