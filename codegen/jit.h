#pragma once
/// Internal to codegen/: the compiled form of a graph (metadata + JIT-linked object code), object
/// emission and JIT loading for the host CPU, and the KILN_LOGS stage dumps. MLIR-free apart from
/// a forward declaration, so the cache and tests can include it cheaply.
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "codegen/codegen.h"

namespace mlir {
class ModuleOp;
}
namespace llvm {
class LLVMContext;
class Module;
}
namespace llvm::orc {
class LLJIT;
}

namespace kiln::codegen {

/// A `?` dim of an output as run() computes it from the inputs' sizes: the sum of the
/// (input, dim) sizes in `terms` plus `constant` (a cat along a `?` dim: T + 1).
struct DimFormula {
  std::vector<std::pair<int, int>> terms;
  int64_t constant = 0;
  int64_t evaluate(const std::vector<Tensor>& inputs) const;
};

/// One argument of @main as run() sees it.
struct Param {
  DType dtype;
  std::vector<int64_t> shape;       // ir::kDynamic for `?`
  std::vector<DimFormula> dyn_src;  // outputs: per dim, the size of a `?`
  int alias_input = -1;  // outputs: the input whose buffer it is computed in (in place), or -1
};

/// How run() splits rows over threads (codegen/row_split.h).
struct RowSplitPlan {
  bool splittable = false;
  /// Per argument of `main` (inputs, in order): whether it is sliced by rows.
  std::vector<bool> sliced_input;
  /// The graph has a named matmul (a GEMM call): run() gives each thread one block of rows.
  bool gemm = false;
  /// Every intermediate is one row (cpu_row_loops, row_fusion.h): blocks as large as a single
  /// loop nest's keep them in cache.
  bool per_row = false;
};

/// What run() needs besides the code; stored with the object in the disk cache.
struct CompiledMeta {
  std::vector<Param> inputs, outputs;
  int kernels = 0;
  std::string linalg;
  RowSplitPlan row_split;
  /// CUDA code: the kernels' PTX (empty on cpu) and their count.
  std::string ptx;
  int gpu_kernels = 0;
  int cuda_device = 0;  ///< the CUDA device whose context loads the PTX module
  /// Kernel timer ids' descriptions (kernel_profile.h), when compiled with kernel timers.
  std::vector<std::string> profiled_kernels;
  /// CUDA code compiled with kernel timers: (kernel name, graph ops and lines) per kernel.
  std::vector<std::pair<std::string, std::string>> gpu_kernel_ops;
};

/// `_mlir_ciface_main` behind a packed-arguments wrapper: args[i] points at argument i.
using PackedFn = void (*)(void**);

/// Code linked into its own LLJIT; `fn` stays valid while this object lives. Immutable once
/// built, so Executables share it across threads.
struct CompiledCode {
  CompiledMeta meta;
  PackedFn fn = nullptr;
  std::size_t object_bytes = 0;
  int object_parts = 0;
  std::unique_ptr<llvm::orc::LLJIT> jit;
  /// The code's static destructors (CUDA: unloads its PTX module), or nullptr.
  void (*fini)() = nullptr;
  CompiledCode();
  ~CompiledCode();
};

/// LLVM's native target and a fatal-error handler that throws kiln::Error; idempotent.
void init_llvm();

/// The fault set by inject_fault_for_testing (codegen.h).
InjectedFault injected_fault();
/// Triple, CPU name and CPU features of the host (the JIT's target), detected once.
const std::string& host_target_id();

/// LLVM-dialect module -> LLVM IR + packed entry wrapper -> -O2 -> object file bytes.
/// `diagnostics` (the MLIR diagnostics collected so far) is quoted in errors.
std::string emit_object(mlir::ModuleOp m, const std::string& diagnostics, CompileStats& stats);
/// Links `object` (one object file, or a bundle of parts from bundle_objects) into a new LLJIT
/// whose main JITDylib also defines codegen/runtime.h's symbols (and sees the process's), then
/// looks up the entry. Throws kiln::Error.
std::shared_ptr<const CompiledCode> load_object(const std::string& object, CompiledMeta meta,
                                                CompileStats& stats);

// ---- Large modules in parts (object_parts.cpp) ----
// LLVM's -O2 and code generation run on one thread per module; the Transformer training step
// is one module of ~100k instructions that took 2.8 s of -O2 and 3.9 s of code generation.
// Split into parts by function, each part is optimised and emitted on its own thread.

/// Serial loop nests (each parallel loop is a function of its own already) are moved out of
/// `main` into private functions of their own, so that parts can share out main's code too:
/// the Transformer step's main held 102k of the module's 139k lines of LLVM IR. Only with
/// at least kOutlineMinLoopNests nests and two hardware threads; returns how many moved.
inline constexpr size_t kOutlineMinLoopNests = 100;
int outline_serial_loop_nests(mlir::ModuleOp m);
/// Marks each innermost loop with a constant trip count below 4 * `lanes` that is no multiple
/// of `lanes` (float lanes of a vector) so that, where LLVM's vectorizer vectorises it, the tail
/// is masked, and not unrolled first (see loop_hints.cpp); returns how many were marked.
int hint_short_loops(llvm::Module& mod, unsigned lanes);
/// After each malloc / aligned_alloc call (intermediate buffers) in CPU code: a null result
/// calls kiln_rt_allocation_failed(bytes) and returns; after each call that may fail (a defined
/// function that allocates, a parallel region's fork) a true kiln_rt_failed() returns too
/// (codegen/alloc_checks.cpp; Executable::run raises the failure). Returns the checks added.
int return_on_failed_allocations(llvm::Module& mod);
/// Instructions (before -O2) per part: smaller modules stay whole.
inline constexpr uint64_t kInstructionsPerPart = 5000;
inline constexpr unsigned kMaxObjectParts = 8;
/// How many parts `mod` is emitted in: one per kInstructionsPerPart instructions, at most
/// kMaxObjectParts; 1 on a single hardware thread.
unsigned object_parts_for(const llvm::Module& mod);
/// Milliseconds of one part's -O2 and code generation.
struct PartStats {
  double opt_ms = 0, codegen_ms = 0;
  std::string ir_after_opt;  ///< filled when KILN_LOGS=codegen
};
/// Optimises and emits one module (in its own LLVMContext) as an object file.
using EmitPart = std::function<std::string(llvm::Module&, PartStats&)>;
/// Splits `mod` (consumed) into `parts` modules, functions dealt round-robin with
/// llvm::SplitModule, and runs `emit` on each, the parts shared out over up to one thread per
/// hardware thread; returns the objects in order.
/// Rethrows the first part's exception after all threads have finished.
std::vector<std::string> emit_in_parts(llvm::Module& mod, unsigned parts, const EmitPart& emit,
                                       std::vector<PartStats>& stats);
/// Names of the symbols that x86-64 ELF `object` reaches with a 32-bit PC-relative relocation
/// (R_X86_64_PC32) but does not define: a part's object must have none, as the JIT may load the
/// symbol's part more than 2 GiB away. Empty for other targets; throws kiln::Error when `object`
/// is not an object file.
std::vector<std::string> direct_references_to_undefined(std::string_view object);
/// One string for the compile cache: a single object as itself, several as a bundle.
std::string bundle_objects(const std::vector<std::string>& objects);
/// The objects in `bytes` (views into it): one for a plain object file. Throws kiln::Error for
/// a truncated or corrupted bundle.
std::vector<std::string_view> unbundle_objects(std::string_view bytes);

/// Sends LLVM's warnings in `ctx` (a loop that a vectorization hint could not vectorize) to the
/// `codegen` log instead of stderr: they are about generated code, nothing a user can act on.
/// Remarks and notes are dropped. Errors are appended to `*errors` (which must outlive the
/// context's use): with a handler installed LLVM no longer exits on them, so the caller checks
/// `errors` after each step and throws (throw_llvm_errors).
void route_llvm_diagnostics(llvm::LLVMContext& ctx, std::string* errors);
/// Throws kiln::Error naming `stage` when `errors` (route_llvm_diagnostics) is not empty.
void throw_llvm_errors(const std::string& errors, std::string_view stage);

enum LogStage : unsigned { kLogIr = 1, kLogCodegen = 2 };
/// Whether KILN_LOGS (parsed once) or set_log_stages() selected `stage`.
bool log_enabled(LogStage stage);
/// Writes a header line naming `stage`, then `text`, to stderr in one piece.
void log_text(std::string_view stage, std::string_view text);
/// KILN_LOGS=ir: prints module `m` under a header naming `stage`.
void log_module(std::string_view stage, mlir::ModuleOp m);
/// Parses and runs the textual pass `pipeline` on `m`; throws kiln::Error naming `stage` with
/// `diagnostics` (the MLIR diagnostics collected so far) when it fails.
void run_pass_pipeline(mlir::ModuleOp m, const std::string& pipeline, std::string_view stage,
                       const std::string& diagnostics);

/// Milliseconds since construction or the previous call.
class Lap {
 public:
  double operator()() {
    auto now = std::chrono::steady_clock::now();
    double ms = std::chrono::duration<double, std::milli>(now - last_).count();
    last_ = now;
    return ms;
  }

 private:
  std::chrono::steady_clock::time_point last_ = std::chrono::steady_clock::now();
};

}  // namespace kiln::codegen
