#pragma once
/// codegen's public entry points (MLIR-free). So far: lowering to linalg on tensors.
#include <string>

#include "ir/graph.h"

namespace kiln::codegen {

/// Lowers a copy of `g` with kiln-decompose and convert-kiln-to-linalg (then, if `fuse`,
/// canonicalize and kiln-fuse-elementwise) and returns the MLIR text; `g` is unchanged.
/// Ops without a lowering yet stay kiln ops. Throws kiln::Error with the MLIR diagnostics if a
/// pass fails.
std::string lower_to_linalg(const ir::Graph& g, bool fuse = true);

}  // namespace kiln::codegen

#include <cstddef>
#include <memory>
#include <string_view>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace kiln::codegen {

/// The NVIDIA GPU that CUDA code is generated for (PTX through LLVM's NVPTX target).
struct GpuTarget {
  /// Streaming-multiprocessor architecture of the PTX ("sm_90": H100/H200).
  std::string chip = "sm_90";
  /// PTX ISA version. sm_90 needs PTX >= 7.8; LLVM's default (+ptx60) aborts the process for it.
  std::string features = "+ptx80";
  /// LLVM optimisation level of the device code.
  int opt_level = 3;
  /// Threads per block of the generated kernels (the parallel loops' tile); the grid follows
  /// from the loop bounds. 256 keeps 8 blocks resident per SM on sm_80/sm_90 and fits every
  /// device's 1024-thread limit.
  int threads_per_block = 256;
  /// Elements each thread of an elementwise kernel computes: a block covers threads_per_block
  /// times this many consecutive elements, thread t the ones at t, t + threads_per_block, ...
  /// Every load comes before any store, so each thread keeps this many loads in flight: with one
  /// element per thread, x*x + x at 2^28 floats moved 62 % of the H200's copy bandwidth.
  int elements_per_thread = 4;
  /// Threads that share a row of a row reduction (softmax, layer_norm, a row sum over the last
  /// dim): 32, a warp, whose lanes read the row's consecutive elements and combine their parts
  /// with shuffles; 1 keeps a thread per row (the kernels before the lanes, for comparison).
  /// Rows shorter than 64 elements keep a thread each.
  int row_lanes = 32;
  /// The CUDA toolkit whose nvvm/libdevice/libdevice.10.bc is linked into kernels that call
  /// float64 math functions (exp, log, sin, erf, ... have no polynomial form here for float64;
  /// libdevice's __nv_exp, ...): "" for none found, and those kernels then fail to compile
  /// with a kiln::Error naming the function. from_env() takes $CUDA_HOME, $CUDA_PATH or
  /// $CUDA_ROOT, else the first of /usr/local/cuda, the newest /usr/local/cuda-*, /usr/lib/cuda
  /// and /opt/cuda that has libdevice.
  std::string toolkit;
  /// The default target with the environment's overrides: KILN_CUDA_ARCH (e.g. "sm_80"),
  /// KILN_CUDA_PTX_FEATURES (e.g. "+ptx78"), KILN_CUDA_THREADS_PER_BLOCK (a multiple of 32 in
  /// [32, 1024]), KILN_CUDA_ELEMENTS_PER_THREAD (1 to 16), KILN_CUDA_ROW_LANES (1 or 32): each
  /// the whole value an integer (white space around it ignored); any other value keeps the
  /// default, with a warning on stderr once per variable and value (core/env.h env_int).
  /// compile() and eager CUDA ops use it.
  static GpuTarget from_env();
};

/// How an Executable should use the compile cache (see codegen/README.md, "Compile cache"), and
/// which device it runs on.
struct CompileOptions {
  /// Reuse / publish the compiled code in the process-wide in-memory cache.
  bool memory_cache = true;
  /// Reuse / publish the object code on disk. Also off when the environment disables it
  /// (KILN_DISABLE_CACHE=1, or KILN_CACHE_DIR set but empty).
  bool disk_cache = true;
  /// Cache directory; empty = from the environment: $KILN_CACHE_DIR, else $XDG_CACHE_HOME/kiln,
  /// else ~/.cache/kiln.
  std::string cache_dir = {};
  /// Device of the inputs and outputs: cpu (LLVM JIT for the host), or cuda:N (kernels as PTX,
  /// launched by JIT-compiled host code; codegen/README.md, "GPU").
  Device device = Device::cpu();
  /// The GPU target when `device` is a CUDA device.
  GpuTarget gpu = {};
  /// For tests, with `device` cpu: the loop nests are rewritten as for a GPU (`gpu`'s threads
  /// and elements per thread) and the resulting parallel loops run on the calling thread, so
  /// the GPU lowering's loop rewrites are checked against eager results without a GPU. The
  /// environment's KILN_EMULATE_GPU_LOOPS=1 turns it on for every CPU Executable (compile()'s
  /// regions too: whole training steps then check the rewrites against eager mode).
  bool emulate_gpu_loops = false;
  /// With emulate_gpu_loops: each parallel loop runs its iterations last to first (environment:
  /// KILN_EMULATE_GPU_LOOPS=reverse). A thread that reads what another writes gives a wrong
  /// result in one of the two orders, as it races on a GPU.
  bool emulate_in_reverse = false;
  /// Buffer donation (jax.jit's donate_argnums, XLA's input-output aliasing): (output, input)
  /// pairs whose output the caller lets the code write into that input's buffer, giving up the
  /// input's values. An output is written in place only where that is proven safe: it is
  /// computed by an elementwise loop nest that reads the input element for element, every
  /// other read of the input comes before that loop nest, and the input is not returned
  /// (output_alias() tells which pairs held). CPU only (not with emulate_gpu_loops), and not
  /// for row-parallel graphs, whose row blocks read unsliced inputs whole.
  std::vector<std::pair<int, int>> in_place_outputs = {};
  /// Time each kernel (Executable::kernel_times()): every loop nest, GEMM and copy of a CPU
  /// graph's code is wrapped in two clock reads (under 100 ns a kernel). The environment's
  /// KILN_PROFILE=1 turns it on for every Executable (KILN_CUDA_PROFILE=1 for CUDA ones). Not
  /// for row-parallel graphs (their kernels run inside each row block: row_parallel()); CUDA
  /// graphs only describe their kernels (kernel_descriptions()) for KILN_CUDA_PROFILE's table.
  bool profile_kernels = false;
  /// For graphs with `?` input dims: run() checks that the inputs' sizes agree with each other
  /// as the graph's ops need (their shape rules, core/meta.h, once per call: about a
  /// microsecond an op), and throws kiln::Error naming the op where they do not (a matmul of
  /// [2, 3000] by [1, 4]); the code itself reads them unchecked. compile() turns it off for
  /// its regions, whose guards check the sizes.
  bool check_dynamic_sizes = true;
};

/// Whether `options` or the environment (KILN_PROFILE=1; KILN_CUDA_PROFILE=1 for a CUDA
/// device) asks for kernel timers.
bool kernel_profiling(const CompileOptions& options);

/// One kernel's time over an Executable's runs so far (Executable::kernel_times()).
struct KernelTime {
  /// What the kernel is and where its ops come from: "loop nest [8, 128, 1024]: where, gelu,
  /// mul (model.cpp:42, model.cpp:57)" (the nest's trip counts, `?` where the code reads a size
  /// at run time; the graph ops fused into it; their source lines, at most 4), "GEMM [1024,
  /// 256] x [256, 1024] (model.cpp:40)", "copy: index_add (model.cpp:61)". Loops that the
  /// codegen adds itself (an output's copy or bool conversion) name no graph op.
  std::string kernel;
  int64_t calls = 0;
  double total_ms = 0;  ///< wall time of all its calls together, milliseconds
};

/// How a CPU graph's loops run: as the CPU lowering makes them, or as the GPU lowering makes
/// them (in order, or each loop's iterations in reverse).
enum class GpuLoopEmulation { Off, InOrder, Reversed };
/// The emulation `options` asks for (the options, else the environment; Off for a CUDA device).
GpuLoopEmulation gpu_loop_emulation(const CompileOptions& options);

/// Where an Executable's code came from and what building it cost (milliseconds, wall clock).
/// Stage times are 0 for the stages a cache hit skipped.
struct CompileStats {
  enum class Source { Compiled, MemoryCache, DiskCache };
  Source source = Source::Compiled;
  double key_ms = 0;        ///< building the cache key and the in-memory lookup
  double lower_ms = 0;      ///< parse, kiln -> fused linalg, destination-passing rewrite
  double bufferize_ms = 0;  ///< bufferization, loops, math approximation
  double llvm_dialect_ms = 0;  ///< conversion to the LLVM dialect
  double llvm_opt_ms = 0;   ///< translation to LLVM IR and the -O2 pipeline
  double codegen_ms = 0;    ///< machine code emission (object file)
  double disk_ms = 0;       ///< reading (hit) or writing (miss) the disk cache entry
  double link_ms = 0;       ///< JIT-linking the object and looking up the entry point
  double total_ms = 0;      ///< lookups, compile and JIT link together
  std::size_t object_bytes = 0;  ///< size of the object code
  /// Object files the code was emitted as: more than 1 for a large graph whose -O2 and code
  /// generation ran in parts on several threads (codegen/jit.h).
  int object_parts = 0;
  /// Why the disk cache was not used or an entry was rejected ("" when neither happened), e.g.
  /// "disabled", "corrupted entry (checksum)", "stale entry (version)".
  std::string disk_note;
};

/// Drops every entry of the in-memory compile cache (live Executables keep their code).
void clear_memory_cache();

/// Compiled code objects (one ORC LLJIT with its linked object each) alive now. Executables of
/// the same graph share one; the in-memory cache does not keep code alive on its own, so the
/// code is freed with the last Executable (or compiled function) using it.
int64_t live_compiled_code_count();

/// Faults injected into the compile pipeline, for tests of its error paths (process-wide, until
/// reset with None; compiles that hit a cache skip the pipeline, so disable the caches):
enum class InjectedFault {
  None,
  InvalidMlir,     ///< the parsed module is broken (its @main loses its terminator)
  InvalidLlvmIr,   ///< the translated LLVM module gets a function without a terminator
  LlvmFatalError,  ///< llvm::report_fatal_error during object emission
  RunError,        ///< Executable::run raises kiln::Error (a fault of compiled code at run time)
};
void inject_fault_for_testing(InjectedFault fault);

/// Called after each Executable for the CPU is built, with its graph and options (process-wide;
/// nullptr removes it). For tests: `kiln-fuzz --ptx` compiles every graph the tracer builds for
/// CUDA too. Returns the previous observer.
using CompileObserver = void (*)(const ir::Graph& graph, const CompileOptions& options);
CompileObserver set_compile_observer_for_testing(CompileObserver observer);

/// Selects the stage dumps written to stderr, as a comma list (the same syntax as the env var
/// KILN_LOGS, which is read once at the first compile; this call replaces it):
///   ir      -- the kiln MLIR before lowering, then the MLIR after each stage (linalg fused,
///              bufferized, LLVM dialect), each under a header line naming the stage;
///   codegen -- the LLVM IR after optimisation, the object size and the cache outcome.
/// Unknown names are ignored; "" turns every dump off.
void set_log_stages(std::string_view stages);

/// A graph compiled to native code for the host CPU (MLIR JIT, LLVM -O2, host CPU features).
///
///   codegen::Executable exe(g);                 // lower -> fuse -> bufferize -> LLVM -> JIT
///   std::vector<Tensor> out = exe.run({x});      // outputs allocated with dispatch::empty
///
/// Pipeline: kiln-decompose, convert-kiln-to-linalg, canonicalize, elementwise fusion, then the
/// function is made destination-passing (each result goes to a caller-provided memref), one-shot
/// bufferization across the function boundary, linalg -> loops, math polynomial approximation
/// (tanh/exp/erf... as arith + fma), LLVM dialect, LLVM -O2 to an object file, ORC LLJIT. Owns its
/// MLIR context, so `g` may be destroyed afterwards. Errors (an op without a lowering, a failing
/// pass, LLVM errors) throw kiln::Error. run() only reads the compiled code, so concurrent run()
/// calls are safe; Executables of the same graph share one copy of the code (the compile cache).
///
/// Threads: when every kernel runs its outer loop over the rows of its operands (elementwise
/// graphs, reductions and softmax-like graphs over inner dims, x @ W + b), dim 0 is compiled as
/// `?` and run() calls the code on blocks of about 128 KiB of rows, spread over
/// kiln::cpu::parallel_for's threads; each block keeps a multi-kernel graph's intermediates in
/// cache. Results do not depend on the thread count (blocks do not depend on it).
///
/// Dynamic (`?`) output dims are read at run time from the input dim they were built from
/// (followed through destination-style inits to tensor.empty / tensor.dim at compile time); graphs
/// where that cannot be traced are rejected at compile time.
class Executable {
 public:
  /// Compiles `g`, or reuses its code from the in-memory or disk compile cache (the key is the
  /// graph's MLIR text, the host target and the codegen version).
  explicit Executable(const ir::Graph& g, const CompileOptions& options = {});
  ~Executable();
  Executable(Executable&&) noexcept;
  Executable& operator=(Executable&&) noexcept;

  /// Runs the compiled graph. Inputs must match the graph's dtypes and static dims (checked);
  /// non-contiguous inputs are made contiguous first. Sizes of `?` dims must also agree with
  /// each other as the graph's ops need (a matmul's two inner sizes): checked unless
  /// CompileOptions::check_dynamic_sizes is off. Returns one new tensor per graph output,
  /// except that an output written in place (output_alias) is its input tensor, or that
  /// input's contiguous copy, now holding the output's values.
  std::vector<Tensor> run(const std::vector<Tensor>& inputs) const;
  /// Runs the compiled graph writing into `outputs`: contiguous tensors of the graph's output
  /// dtypes and shapes on the Executable's device, sharing no memory with the inputs (checked;
  /// kiln::Error otherwise). Eager CUDA ops run their one-op kernels this way. An output written
  /// in place (output_alias) is computed in its input's buffer, then copied into `outputs`.
  void run_into(const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs) const;

  /// The input whose buffer output `k` is computed in (CompileOptions::in_place_outputs), or -1.
  int output_alias(int k) const;

  /// Number of kernels after fusion, counted like TorchInductor counts them: a row-parallel
  /// graph (see row_parallel()) is one kernel — one parallel loop over row blocks whose body
  /// runs the graph's loop nests on the block, the way Inductor's CPU softmax is one kernel
  /// with three inner loops; otherwise each loop nest is a kernel of its own.
  int num_kernels() const;
  /// Number of loop nests (linalg ops) after fusion, e.g. 3 for softmax (max, sum of exp, divide).
  int num_loop_nests() const;
  /// Whether run() splits the leading dim over the thread pool (codegen/row_split.h): every
  /// kernel then runs inside one parallel loop over row blocks. Graphs under 256 KiB of
  /// row-carrying data still run on the calling thread.
  bool row_parallel() const;
  /// The fused linalg-on-tensors IR the native code was generated from (for tests/debugging).
  const std::string& linalg_ir() const;
  /// Cache outcome and compile time per stage of this Executable's construction.
  const CompileStats& stats() const;
  /// CUDA Executables: the PTX of all kernels (one module; "" for a graph without kernels, or
  /// on cpu). Produced without a GPU; `ptxas -arch=sm_90` assembles it.
  const std::string& ptx() const;
  /// The device the code runs on (CompileOptions::device).
  Device device() const;
  /// With CompileOptions::profile_kernels: each kernel's calls and time over this
  /// Executable's runs so far, in program order (empty otherwise; see profile_kernels).
  std::vector<KernelTime> kernel_times() const;
  /// With CompileOptions::profile_kernels: what each kernel computes (KernelTime::kernel).
  /// CPU: the kernel_times() descriptions. CUDA: "main_kernel_3: softmax, mul (model.cpp:12)",
  /// kernel name, graph ops, lines; KILN_CUDA_PROFILE=1's table (backends/cuda/profile.h)
  /// names their launches so and gives their GPU time.
  std::vector<std::string> kernel_descriptions() const;

 private:
  /// `inputs` once checked against the graph's, or `copies` (filled) when one of them is
  /// strided and needs a contiguous copy.
  const std::vector<Tensor>& checked_inputs(const std::vector<Tensor>& inputs,
                                            std::vector<Tensor>& copies) const;
  void launch(const std::vector<Tensor>& ins, const std::vector<Tensor>& outs) const;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// Eager ops on CUDA tensors that ran their CPU kernel on host copies of their operands (no
/// generated kernel for the op or for its operands' layout; codegen/cuda_kernels.cpp), as (op
/// name and reason, calls) since the process started. Each call is a round trip over PCIe, so
/// `kiln-bench transformer` on cuda prints them. Defined in kiln_cuda_kernels (the CUDA
/// kernel provider, which kiln_tracer links).
std::vector<std::pair<std::string, uint64_t>> cuda_host_fallbacks();

}  // namespace kiln::codegen
