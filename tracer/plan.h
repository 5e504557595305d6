#pragma once
/// Internal: how a range of a Program runs. The range is partitioned into steps: compiled
/// regions (maximal runs of ops the kiln IR covers, built into one ir::Graph and compiled by
/// codegen::Executable, where fusion makes them few kernels) and single ops on eager kernels
/// (ops the IR does not cover yet, random ops, ops with size-dependent attributes once sizes
/// are symbolic), host reads and callbacks.
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "eager/factories.h"
#include "tracer/program.h"

namespace kiln::codegen {
class Executable;
}

namespace kiln::tracer {

/// Raised internally when a captured tensor no longer matches the trace (freed, or its
/// metadata changed): the call tries the function's other entries, then traces again.
struct GuardFailure {
  std::string reason;
  /// The entry is unlikely to pass again (a captured tensor freed, resized or moved, a host
  /// value gone): it is dropped.
  /// Otherwise the state may come back (requires_grad toggled, a .grad cleared then set) and
  /// the entry is kept beside the new one.
  bool permanent = false;
};

/// The state of one call while its plans run.
struct RunState {
  std::vector<Tensor> slots;         // by value id
  std::vector<Tensor> args;          // tensor arguments by position (undefined for scalars)
  std::vector<Scalar> scalars;       // host-scalar arguments by position
  GeneratorState rng{};              // generator state at the start of the call
  /// Values keep real aliasing: in-place ops run in place (Program::aliased_mutation).
  bool in_place = false;
  /// Ops run on eager kernels detach the inputs that carried no gradient history while tracing
  /// (Node::in_required_grad): the forward re-run of a create_graph backward.
  bool detach_as_traced = false;

  /// The tensor of value v, materialising sources on first use.
  const Tensor& value(const Program& p, int v);
  /// The host scalar of value v when its source is one (a scalar argument, a constant, a host
  /// value read at run time, a size), else nullopt. Throws GuardFailure as value() does.
  std::optional<Scalar> host_scalar(const Program& p, int v);
  /// Host values (SourceKind::HostInput) read so far in this call, by value id.
  std::vector<std::pair<int, Scalar>> host_reads;
  /// Symbolic int `s` (program.h) at this run's argument sizes.
  int64_t eval(const SymInt& s) const {
    auto size = [&](int a, int d, bool scalar) {
      return scalar ? scalars[a].to<int64_t>() : args[a].shape()[d];
    };
    int64_t v = s.factor * size(s.arg, s.dim, s.scalar);
    if (s.arg2 >= 0) v *= size(s.arg2, s.dim2, s.scalar2) + s.offset2;
    return (v + s.bias) / s.divisor * s.multiple + s.offset;
  }
  /// The shape of a value at this run's sizes (its symbolic dims evaluated).
  Shape shape_of(const ValueInfo& v) const;
  /// Generator offset, from the call's start, that the random nodes before node `node` of `p`
  /// drew (the offset random node `node` draws at; all nodes: what the call consumes).
  uint64_t rng_offset(const Program& p, size_t node) const;
  /// The node running or last run (an index into the program): a replay that raises advances
  /// the generator by what the nodes before it drew, as eager's ops before the failing one did.
  size_t node = 0;
};

struct PlanOptions {
  bool compile = true;  ///< false: every op on eager kernels (backend = eager)
  /// Values used after the range (outputs, write-backs, later segments); all others may be
  /// freed after their last use when `free_dead` is set.
  std::vector<bool> live_after;
  bool free_dead = true;
  /// Buffer donation (CompileOptions::donate_buffers): (new value, old value) pairs of tensors
  /// the call writes back, whose new value the range's last step, when it is a compiled region,
  /// may compute in the old value's buffer (codegen's in_place_outputs). The caller guarantees
  /// that nothing after the range reads the old value's elements.
  std::vector<std::pair<int, int>> donate;
  /// Builds every compiled region for this device instead of its inputs' device: what a trace
  /// made on one device compiles to on another (tests of the CUDA build of a CPU trace, on
  /// machines without a GPU). Such a plan's regions refuse to run on the traced inputs.
  std::optional<Device> build_for;
};

class Plan {
 public:
  Plan(std::shared_ptr<const Program> program, size_t begin, size_t end,
       const PlanOptions& options);
  ~Plan();

  /// Runs the steps. If the range ends with a Read node, returns the value it read.
  std::optional<Scalar> run(RunState& st) const;

  int num_regions() const { return num_regions_; }
  int num_eager_ops() const { return num_eager_; }
  /// Kernels of the compiled regions (codegen's count) plus one per eager op.
  int num_kernels() const { return num_kernels_; }
  /// Recorded ops in the range (host reads and callbacks not counted).
  int num_ops() const;
  /// One line per step, for explain().
  std::string describe() const;

 private:
  struct Region;
  struct Step;
  void pull_in_views(size_t begin, size_t end);
  void build_region(Region& r, const PlanOptions& options);
  std::vector<std::pair<int, int>> donation_requests(const Region& r,
                                                     const std::vector<int>& in_v) const;
  void run_region(const Region& r, RunState& st) const;
  void run_compiled(const Region& r, RunState& st) const;
  void run_eager(const Node& n, RunState& st) const;
  // The region's ops on eager kernels, each intermediate freed after its last use.
  void run_nodes_eagerly(const Region& r, RunState& st) const;
  // Fills r.free_after_node (run_nodes_eagerly's frees) once the region is built.
  void plan_eager_frees(Region& r, const std::vector<bool>& used_outside_region) const;

  std::shared_ptr<const Program> p_;
  size_t begin_, end_;
  std::vector<Step> steps_;
  int num_regions_ = 0, num_eager_ = 0, num_kernels_ = 0;
};

/// Runs node `n` of `p` on eager kernels on st's slots (used by plans and by the eager
/// re-execution of a compiled forward for double backward).
void run_node_eagerly(const Program& p, const Node& n, RunState& st);

}  // namespace kiln::tracer
