#pragma once
/// Internal: records one call of the user's function into a Program. The function runs eagerly
/// on its real inputs (so host reads see real values and errors are eager's); the recorder sees
/// every dispatched op through the thread's tracer hook and numbers the tensors it touches.
#include <map>
#include <tuple>
#include <unordered_map>
#include <unordered_set>

#include "eager/dispatch.h"
#include "eager/factories.h"
#include "tracer/program.h"

namespace kiln::tracer {

/// Thrown (not a kiln::Error, so the function's `catch (const kiln::Error&)` lets it pass) where
/// a shape-only run (Recorder::shape_only) cannot go on: the function reads tensor values, or
/// its backward reaches autograd history made before the call, or it writes in place with
/// autograd history into a tensor it did not make (StateJournal::refuse_history_writes).
struct ShapeOnlyAbort {};

class Recorder final : public DispatchHook {
 public:
  /// `keep_values`: hold every value's tensor (kiln::compare reads eager's value of each op);
  /// otherwise only the sources' are held, and the function's intermediates are freed when
  /// its own code drops them, as in eager (the first call needs no more memory than eager).
  explicit Recorder(Program& program, bool keep_values = false);
  ~Recorder() override;
  Recorder(const Recorder&) = delete;
  Recorder& operator=(const Recorder&) = delete;

  /// Installs this recorder as the calling thread's tracer hook and host-read observer;
  /// uninstall() (or the destructor) restores the previous ones.
  void install();
  void uninstall();

  /// Registers tensor argument `index` (before the function runs).
  int add_arg(const Tensor& t, int index);
  /// Registers a value with source `src` for tensor `t` (GradOutput placeholders).
  int add_source(const Tensor& t, Source src);
  /// The value id of `t`: a value recorded so far, or a new source (captured, snapshot, ...).
  int lookup(const Tensor& t);
  /// The tensor of value `v` as it was while tracing; undefined for an op's result that the
  /// function has since dropped (unless keep_values).
  Tensor tensor(int v) const {
    return held_[v].defined() ? held_[v] : Tensor(impls_[v].lock());
  }

  bool before_kernel(const OpCall& call, const InferredMeta& meta,
                     std::vector<Tensor>& outs) override {
    return false;
  }
  void after_kernel(const OpCall& call, const InferredMeta& meta,
                    std::vector<Tensor>& outs) override;
  void on_grad_assigned(const Tensor& leaf) override;
  void on_grad_found_undefined(const Tensor& leaf) override;
  void on_grad_read(const Tensor& leaf, const Tensor& grad) override;
  /// backward() / grad() ran `node`: one made before the trace (not a leaf's AccumulateGrad)
  /// sets Program::outside_backward.
  void on_backward_node(const autograd::Node& node) override;
  /// A node made before the trace (not a leaf's AccumulateGrad): the history an argument or
  /// captured tensor brought, which the next call may bring anew.
  bool defers_backward_node(const autograd::Node& node) override;
  /// Runs that history's backward now, and records it (Program::history_backwards) for
  /// replays to run at their end: the gradients computed so far and the tensors whose history
  /// it is. Sets Program::outside_backward instead (the trace is not cached) where a replay
  /// could not: an edge that is no argument's or captured tensor's history, a .grad that both
  /// the traced part and the history set or read, or (finish()) a tensor the history saved
  /// that the function writes in place.
  void run_deferred_backward(const std::vector<autograd::Edge>& edges,
                             const std::vector<Tensor>& grads, bool retain_graph) override;
  /// compile(fullgraph = true) of function `name`: run_deferred_backward raises a kiln::Error
  /// at the backward() instead, before that history runs (it frees the caller's graph, which
  /// nothing could give back). raised_at_graph_break() then tells the caller it was this.
  void raise_at_graph_break(std::string name) { fullgraph_name_ = std::move(name); }
  bool raised_at_graph_break() const { return raised_at_graph_break_; }
  /// A shape-only run (dispatch::ShapeOnlyScope: no kernel runs, values are garbage): a host
  /// read, a pointer to tensor memory taken by the function, or a backward into history made
  /// before the call throws ShapeOnlyAbort before anything sees a value or runs that history.
  /// aborted() says whether that happened (the function may have caught it).
  void shape_only() { shape_only_ = true; }
  bool aborted() const { return aborted_; }
  /// Random counters this thread reserved while traced.
  uint64_t own_draws() const;
  /// item()/to_vector(): records a Read node with the value about to be read.
  void on_read(const Tensor& t, Loc loc);
  /// The function's own code took a pointer to tensor memory at `loc` (Program::raw_access).
  void on_raw_access(Loc loc);
  /// kiln::guarded, Module::is_training(): host state the function's result depends on
  /// (Program::host_values, one per key and `what`).
  void on_host_value(const HostValue& value) override;
  /// dispatch::host_input: `t` becomes a HostInput source.
  void on_host_input(const Tensor& t, const HostReader& reader, Loc loc) override;
  /// Module::train / eval inside the function: a Callback node repeats the write on every
  /// call, and later reads of `key` are not guarded (Program::host_values).
  void on_host_write(const void* key, const std::string& what, const std::function<void()>& apply,
                     Loc loc) override;
  /// kiln::print / host callbacks.
  void on_callback(const std::string& name, std::function<void(const std::vector<Tensor>&)> fn,
                   const std::vector<Tensor>& tensors, Loc loc);

  /// Ends the trace: write-backs of mutated arguments / captured tensors and the final .grad
  /// of leaves touched by autograd.
  void finish();

  /// The recorder of the calling thread, or nullptr.
  static Recorder* current();

 private:
  // Memory is named by its storage's serial, never reused (a freed storage's address is).
  struct GeoKey {
    uint64_t storage;
    int64_t offset;
    DType dtype;
    Shape shape;
    Strides strides;
    bool operator<(const GeoKey& o) const;
  };
  static GeoKey key_of(const Tensor& t);
  int new_value(const Tensor& t, int source);
  int find(const Tensor& t);
  // Sets Program::foreign_thread_reason when another thread wrote `t`'s memory in place since
  // the trace began.
  void check_foreign_write(const Tensor& t);
  // The value of `t` as the call found it: its argument or captured source, not the value the
  // function's in-place writes gave it since (a replay checks a leaf's .grad before the run,
  // where only the sources exist: `w.mul_(2)` before backward() raised an internal error).
  int value_at_call(const Tensor& t);
  // The value recorded for this very TensorImpl (alive), or -1.
  int by_impl(const Tensor& t) const;
  bool record_dropout_as_mask(const OpCall& call, const std::vector<Tensor>& outs);

  Program& p_;
  bool keep_values_;
  uint64_t start_serial_;
  uint32_t thread_;  // StorageImpl::current_thread_number() of the tracing thread
  uint64_t write_epoch_start_;  // StorageImpl::begin_write_epoch() when the trace began
  uint64_t rng_start_;
  uint64_t first_node_;  // autograd::next_sequence_nr() when the trace began
  // This thread's generator reservations while installed (eager/factories.h, set_draw_log).
  DrawLog draws_;
  DrawLog* prev_draw_log_ = nullptr;
  // A random op's offset `offset` counted in this thread's draws since the trace began.
  uint64_t own_offset(uint64_t offset) const;
  bool installed_ = false;
  DispatchHook* prev_hook_ = nullptr;
  HostReadObserver prev_observer_ = nullptr;
  RawAccessObserver prev_raw_observer_ = nullptr;
  Recorder* prev_current_ = nullptr;
  std::vector<Tensor> held_;  // by value id: sources' tensors (every value's if keep_values)
  std::vector<std::weak_ptr<TensorImpl>> impls_;  // by value id
  std::vector<uint64_t> write_count_;           // storage writes seen when the value was made
  std::unordered_map<const TensorImpl*, int> by_impl_;  // checked against impls_ (reuse)
  std::map<GeoKey, int> by_geometry_;
  std::unordered_map<uint64_t, uint64_t> writes_;  // in-place writes per storage serial
  std::vector<Tensor> grad_leaves_;
  // Tensors whose .grad the function read or changed (on_grad_*), and those whose .grad a
  // deferred backward changed: a replay sets the first at the end of the call and runs the
  // second at the backward() (run_deferred_backward), so they must not meet.
  std::unordered_set<const TensorImpl*> grad_touched_, history_grads_;
  std::unordered_set<const StorageImpl*> history_saved_;
  // raise_at_graph_break(): a backward into history made before the call raises here.
  void raise_if_fullgraph(const std::string& first_node);
  std::string fullgraph_name_;  // raise_at_graph_break(): the compiled function's name
  bool raised_at_graph_break_ = false;
  bool shape_only_ = false, aborted_ = false;  // shape_only()
  void abort_if_shape_only();  // saved by the deferred histories
  void check_history_grad(const Tensor& t);
  std::unordered_set<const TensorImpl*> grad_leaf_set_;
  std::unordered_set<const void*> host_written_;  // host state keys the function wrote
  // Dropout masks by (seed, offset, p, shape): a backward's dropout reuses its forward's.
  std::map<std::tuple<uint64_t, uint64_t, double, std::vector<int64_t>>, Tensor> dropout_masks_;
  std::vector<Tensor> stand_ins_;  // eager outputs recorded as another op's value
};

/// Runs `fn` with the calling thread's tracer hook and read observer removed (the tracer's own
/// tensor work must not be recorded).
template <class F> decltype(auto) untraced(F&& fn) {
  dispatch::ShapeOnlyScope kernels_on(false);  // the tracer's own tensors hold real values
  DispatchHook* hook = dispatch::set_tracer_hook(nullptr);
  HostReadObserver obs = set_host_read_observer(nullptr);
  RawAccessObserver raw = set_raw_access_observer(nullptr);
  struct Restore {
    DispatchHook* h;
    HostReadObserver o;
    RawAccessObserver r;
    ~Restore() {
      dispatch::set_tracer_hook(h);
      set_host_read_observer(o);
      set_raw_access_observer(r);
    }
  } restore{hook, obs, raw};
  return fn();
}

/// The host value of element `index` (row-major) of a tensor, or of a one-element tensor, as a
/// Scalar of its dtype's kind (not recorded). Throws kiln::Error as item() does for a tensor
/// that is empty or not on the cpu.
Scalar read_scalar(const Tensor& t, int64_t index = 0);

/// The prints of one compiled call (kiln::print, run or replayed). A call may run the
/// function's first part twice (a replay that reads a value no branch was traced for, or fails
/// a later segment's guard, then the trace or the eager run): each print is shown once, by its
/// position in the call (found by a break-it pass: the first segment's print showed twice).
class PrintScope {
 public:
  PrintScope();  // one compiled call: saves the thread's positions, starts fresh ones
  ~PrintScope();
  PrintScope(const PrintScope&) = delete;
  PrintScope& operator=(const PrintScope&) = delete;
  /// An attempt of the call (a replay, the trace, the eager run) starts at position 0.
  static void restart();
  /// Whether the print at the next position is shown: not when an earlier attempt of the call
  /// showed it; always outside a compiled call.
  static bool show_next();

 private:
  struct Positions {
    int64_t next = 0, shown = 0;
    bool active = false;
  } saved_;
  static thread_local Positions t_positions;
};

}  // namespace kiln::tracer
