#pragma once
/// The type-erased core of kiln::compile (tracer/compile.h is the typed front end): the
/// specialisation cache of one compiled function, its guards, trace trees and replay.
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace kiln {

/// How compile() treats sizes and host scalars (see CompileOptions::dynamic).
enum class Dynamic : uint8_t {
  Auto,    ///< specialise first; a dim (scalar) that changes and causes a recompile becomes
           ///< symbolic (a runtime argument) — "automatic dynamic", as TorchDynamo
  Always,  ///< every dim (of size >= 2) of every tensor argument is symbolic from the start;
           ///< host scalars (and dims first seen at size 1) become symbolic as under Auto
  Never,   ///< every distinct size / scalar value gets its own specialisation
};

/// Where compiled graphs run.
enum class Backend : uint8_t {
  /// The codegen for each region's device: kiln MLIR -> LLVM for cpu tensors, -> PTX kernels for
  /// CUDA tensors (the name predates the CUDA backend); ops it does not cover on eager kernels.
  Cpu,
  Eager,  ///< every recorded op on eager kernels (same capture, guards and replay; for bisecting)
};

/// Options of one compiled function. They travel with the function, never through globals, so
/// functions compiled with different options can run on different threads at the same time.
struct CompileOptions {
  Dynamic dynamic = Dynamic::Auto;
  /// Dims marked symbolic from the first trace: (argument position, dim), like
  /// torch._dynamo.mark_dynamic. Such a dim never specialises, size 1 included.
  std::vector<std::pair<int, int>> dynamic_dims{};
  /// kiln::Error (naming the user's line) instead of a graph break or of running eagerly: at a
  /// data-dependent host read, a pointer taken to tensor memory, an op error the function
  /// caught, a backward() that runs autograd history made before the call (an argument's
  /// grad_fn; raised there, before that history runs), or anything that makes the function
  /// run eagerly from then on (the limit of cache entries aside). The trace has run the
  /// function by then (torch.compile raises before): the call then has no effect on tensors
  /// that existed before it, their version counters and .grad, or the random generator
  /// (tracer::StateJournal gives them back, at the cost of one copy of each such tensor the
  /// function writes, during traces only). Not given back: host state (C++ variables, prints,
  /// requires_grad_ flags, kiln's settings); the generator where another thread drew from it
  /// meanwhile; and nothing at all where an in-place write gave a tensor that existed before
  /// the call a new gradient history (the error then says "not undone").
  bool fullgraph = false;
  /// Specialisations (guard sets and trace-tree branches) before the function runs eagerly,
  /// with one warning naming the guard that keeps failing. TorchDynamo's default is 8.
  int cache_size_limit = 8;
  Backend backend = Backend::Cpu;
  /// Also run eagerly on every call and compare the outputs and the state the function writes
  /// (a training step's parameters, optimizer state): kiln::Error when beyond tolerance,
  /// naming the first diverging op or the written tensor, and the call then has no effect.
  /// Both runs start from the caller's state (tracer::StateJournal gives it back in between),
  /// so a training step advances one step per call. Slow; for debugging. Adam and AdamW turn
  /// rounding noise in a gradient that is 0 in exact arithmetic (a key projection's bias)
  /// into steps of ±lr, which differ between eager and compiled: raise atol for such state.
  bool check = false;
  /// Relative / absolute tolerance of `check` and kiln::compare. Under
  /// set_float32_matmul_precision("medium") raise rtol to about 1e-2: a last-bit difference
  /// in a matmul's input (compiled and eager layer_norm may differ there) can move its
  /// bfloat16 rounding by 2^-8.
  double rtol = 1e-5, atol = 1e-6;
  /// Buffer donation (like JAX's donate_argnums), for training steps: a tensor the function
  /// updates in place (an argument, or a captured parameter / optimizer state) gives its
  /// buffer to the compiled code. Where the last compiled region computes the new value
  /// element for element from the old one (an optimizer's update of a parameter and its
  /// moments), it is computed in the tensor's own buffer, as eager's in-place ops do
  /// (explain() says "computed in their tensors' buffers"); the scans that make eager raise
  /// (class indices out of range) run first, so a call that raises leaves the tensors as they
  /// were. Otherwise the tensor may be given the buffer of its new value instead of having the
  /// value copied into it: a raw data() pointer taken before the call then no longer points at
  /// its elements. Only tensors that share their buffer with nothing else (no views) are given
  /// another buffer; the others are written in place or copied into. Values, shape, dtype,
  /// autograd state and every Tensor handle are what eager leaves. A call that raises because
  /// memory ran out inside the compiled code may leave some of them updated (an optimizer's
  /// step counters), as eager's in-place ops that ran before such an error do. Off by default;
  /// whatever the setting, a tensor the function changes by `index_copy_` (or by copy_ of an
  /// index_copy / index_add / scatter_add of itself; a KV cache written at a position tensor)
  /// is updated in its own buffer where the last compiled region writes it, as eager's
  /// in-place op does (computed apart, a one-slot write copied the whole tensor twice).
  bool donate_buffers = false;
  /// How a symbolic specialisation is confirmed for a new set of sizes (or host-scalar
  /// values), since host code may branch on them. true: once a trace confirmed its formulas
  /// at a size set beyond those it was made from, by running the function shape-only (ops check and infer
  /// shapes, no kernel runs, dispatch::ShapeOnlyScope) and comparing the ops it records; the
  /// call then replays, so a loop whose sizes grow every call (a KV cache grown by cat) replays
  /// every step. A run that reads a tensor value, runs autograd history made before the call,
  /// writes with autograd history into a tensor it did not make, raises, or records other ops
  /// gives the caller's tensors, their version counters and .grad and the random generator
  /// back and traces the call as false does: its host code (prints, C++ variables) then runs
  /// twice. false: every new size set is traced, at eager speed.
  bool shape_only_checks = true;
  /// Marks a dim dynamic (returns *this for chaining).
  CompileOptions& mark_dynamic(int arg, int dim) {
    dynamic_dims.push_back({arg, dim});
    return *this;
  }
};

namespace tracer {

/// One argument of a call: a tensor, a host scalar, or something else (hashed by nothing:
/// passed through and treated as a constant of the trace, like a C++ closure).
struct ArgValue {
  /// Undefined: a default-constructed Tensor (an optional tensor left out, as None is in
  /// PyTorch); guarded as undefined and passed to the function as it is.
  enum class Kind : uint8_t { Tensor, Scalar, TensorList, Other, Undefined } kind = Kind::Other;
  /// The argument's C++ type (a tag unique to it): a value of another type that compares or
  /// converts equal (an enum and an int, two structs with equal members) takes other code paths
  /// in a generic or overloaded function, so it is guarded too. Null: not checked.
  const void* type = nullptr;
  kiln::Tensor tensor;
  kiln::Scalar scalar;
  std::vector<kiln::Tensor> list;  ///< TensorList: guarded per element, length by value
  /// The length of a TensorList (flattened internally): guarded by value, never dynamic.
  bool fixed = false;
  /// Other arguments that are copyable and equality-comparable are guarded by value:
  const void* other = nullptr;
  std::shared_ptr<const void> (*other_copy)(const void*) = nullptr;
  bool (*other_equal)(const void*, const void*) = nullptr;
  /// Other arguments passed through (a struct, a module): `other` and its size in bytes,
  /// scanned for tensors held in it directly (guarded by identity, see function.cpp).
  size_t other_size = 0;
  /// A passed-through object of a polymorphic class (an nn::Module taken by reference): guarded
  /// by its address, since the tensors it reaches through pointers (a Sequential's layers) are
  /// not in its bytes. Another module then traces again instead of replaying the first's weights.
  bool by_identity = false;
  /// Its lifetime_token() where it has one (an nn::Module): guarded with the address, which a
  /// new object may reuse once this one is destroyed.
  std::weak_ptr<const void> lifetime;
};

/// One result of the function: a tensor or a host value (a constant of its specialisation).
struct OutValue {
  bool is_tensor = true;
  kiln::Tensor tensor;
  kiln::Scalar scalar;
  /// The length of a returned std::vector<Tensor>, which precedes its elements: not an output
  /// of its own in reports (output k is the k-th tensor or number the function returned).
  bool is_length = false;
};

/// Calls the user's function on the real arguments and converts its result.
using Invoke = std::function<std::vector<OutValue>()>;

class CompiledFunction {
 public:
  /// Throws kiln::Error (at `loc`) for a cache_size_limit below 1.
  CompiledFunction(std::string name, CompileOptions options, Loc loc = Loc::current());
  ~CompiledFunction();
  CompiledFunction(const CompiledFunction&) = delete;
  CompiledFunction& operator=(const CompiledFunction&) = delete;

  /// Runs a call: replays a matching specialisation, or traces `invoke` (which runs the function
  /// eagerly) and adds one. Thread-safe.
  std::vector<OutValue> call(const std::vector<ArgValue>& args, const Invoke& invoke,
                             Loc loc);

  std::string explain() const;
  int compile_count() const;
  int cache_entries() const;
  void reset();
  const CompileOptions& options() const { return options_; }
  const std::string& name() const { return name_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string name_;
  CompileOptions options_;
};

struct Program;
/// The trace the calling thread's latest CompiledFunction::call replayed, for a function with
/// CompileOptions::check (which names how a stale trace differs from eager); null when that
/// call traced, ran eagerly, or had no check.
std::shared_ptr<const Program> last_replayed_program();

/// Whether KILN_COMPILE=0 turned compile() into plain eager calls (read once).
bool compile_disabled();

}  // namespace tracer
}  // namespace kiln
