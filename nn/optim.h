#pragma once
/// Optimisers. step() updates parameters in place under no_grad (so a parameter shared with a
/// module sees the update); parameters without a gradient are skipped.
///
/// Design: compiled replay. kiln::compile captures a whole training step (forward, backward,
/// optimizer.step()) by recording the eager ops it runs and replays the recorded ops later
/// without running this host code again. So that a replayed step() is the same computation as
/// an eager one, the optimisers follow four rules:
///  1. All state that lives across steps (momentum buffers, Adam moments, the step counts,
///     SGD's "first step" flags) is created in the constructor, never lazily inside step().
///  2. State is only ever updated in place through tensor ops (`m *= b1; m += g * (1 - b1)`,
///     `buf.copy_(...)`, `t += 1`); the Tensor objects (their TensorImpl) never change,
///     so the tensors a recorded graph reads and writes stay the optimiser's state.
///  3. Nothing in step() or clip_grad_norm_ depends on a per-step host value or reads a tensor
///     back to the host (no .item(), which would force a graph break): AdamW's step count of
///     each parameter is a 0-d float64 tensor and its bias corrections 1−β1ᵗ, 1−β2ᵗ are
///     computed from it with tensor ops; SGD's first-step rule (buf = g) is selected with
///     `where` on a 0-d bool flag per parameter; clip_grad_norm_ computes its scale as a
///     tensor.
///  4. Host options (lr, momentum, dampening, weight_decay, betas, eps) are read at every
///     step() call through Optimizer::option(): a 0-d wrapped host number (it promotes like a
///     host double, and formulas of options such as 1 − β1 are evaluated on the host in
///     double, so eager results are those of the host-scalar formulas) that a compiled
///     step takes as a runtime input of its graph, read again on every call — not a constant
///     baked into the trace. Changing `opt.options.lr` between compiled steps (a learning-rate
///     schedule) takes effect on the next step without recompiling, as holding lr in a tensor
///     does in PyTorch. The host branches on options (weight_decay ≠ 0, momentum ≠ 0,
///     nesterov) are guarded host values (Optimizer::option_set()): flipping one recompiles
///     once, with the reason in explain().
/// 0-d float64 operands take part in type promotion as 0-d tensors (as in PyTorch): combined
/// with float32 parameters of rank > 0 the result stays float32, and the float64 value is
/// rounded to float32 exactly as a host double Scalar is, so the results equal the eager
/// host-scalar formulas. Whether a parameter has a gradient is decided on the host
/// (`p.grad().defined()`); the tracer guards on it.
#include <functional>
#include <memory>
#include <string_view>
#include <vector>

#include "core/tensor.h"
#include "nn/module.h"

namespace kiln::nn {

class Optimizer {
 public:
  /// Takes leaf tensors; ones that do not require grad (frozen) are accepted, as in PyTorch, and
  /// skipped while they have no gradient. Throws kiln::Error for an empty list and naming the
  /// index and shape of an undefined or non-leaf tensor (one computed from others: optimise the
  /// leaf it came from) or of one given twice.
  explicit Optimizer(std::vector<Tensor> params, Loc loc = Loc::current());
  virtual ~Optimizer() = default;
  /// A copy shares the parameters (and, in the subclasses, the state tensors) and has its own
  /// host options.
  Optimizer(const Optimizer& o) : params_(o.params_) {}
  Optimizer& operator=(const Optimizer& o) {
    params_ = o.params_;
    return *this;
  }
  /// One update of every parameter that has a gradient. Errors name `loc`, the caller's line.
  virtual void step(Loc loc = Loc::current()) = 0;
  /// Sets every parameter's .grad to undefined.
  void zero_grad();
  const std::vector<Tensor>& params() const { return params_; }

  /// The optimizer's state by name, PyTorch's optimizer.state_dict() flattened for
  /// save_safetensors: per parameter i (in the order given at construction) "state.<i>.<name>"
  /// (SGD: momentum_buffer and the 0-d bool `started`, with momentum; AdamW: exp_avg,
  /// exp_avg_sq and the 0-d float64 step), optimizer-wide state (AdamW: "step"), and the host
  /// options as 0-d float64 "options.<name>" (PyTorch's param_groups). The state tensors are
  /// the optimizer's own, not copies: clone them to keep a snapshot in memory.
  StateDict state_dict() const;
  /// Restores a state_dict() of the same kind of optimizer over parameters of the same number
  /// and shapes: the state tensors are copied in place (a compiled training step keeps using
  /// them without recompiling) and the options are set. Throws kiln::Error naming the missing,
  /// unexpected or mismatched keys or an invalid option; everything is checked first, so a
  /// failed load changes nothing.
  void load_state_dict(const StateDict& dict, Loc loc = Loc::current());

 protected:
  /// Why the current options are invalid, or "" (step() raises it; a compiled step whose
  /// options became invalid traces again, so that step() raises it).
  virtual std::string invalid_options() const = 0;
  /// The state tensors of state_dict() (without the options).
  virtual StateDict state() const = 0;
  /// The host options by name, as doubles (a bool is 0 or 1).
  virtual std::vector<std::pair<std::string, double>> option_values() const = 0;
  /// Sets the options from values named as option_values() names them (all present); throws
  /// kiln::Error as the constructor does for invalid ones, changing nothing then.
  virtual void set_option_values(const std::vector<std::pair<std::string, double>>& values,
                                 Loc loc) = 0;
  /// Throws kiln::Error for state values that step() cannot use (AdamW: a step count that is
  /// not a whole number >= 0), before load_state_dict changes anything.
  virtual void check_state_values(const StateDict&, Loc) const {}
  /// A host option of this optimizer or a formula of its options (`[this] { return 1 -
  /// options.beta1; }`, evaluated in double as a host formula) as a 0-d wrapped float64
  /// number for step()'s tensor formulas: eagerly the same as using the double; in a compiled
  /// step a graph input that calls `read` again on every call (dispatch::host_input), so a
  /// changed option takes effect without recompiling. `read` may use this optimizer only.
  Tensor option(std::function<double()> read) const;
  /// Whether `value` (a host option of this optimizer, a member of it) is nonzero / true, for a
  /// host branch of step(); in a compiled step the answer is a guarded host value named `what`
  /// in explain() (a flip recompiles).
  bool option_set(const double& value, std::string_view what) const;
  bool option_set(const bool& value, std::string_view what) const;

  std::vector<Tensor> params_;

 private:
  // Alive while this optimizer is: compiled steps read options through it, and a replay after
  // the optimizer is gone traces again instead of reading freed memory.
  std::shared_ptr<const int> alive_ = std::make_shared<const int>(0);
};

struct SGDOptions {
  double lr = 1e-2;
  double momentum = 0;
  double dampening = 0;
  double weight_decay = 0;
  bool nesterov = false;
};

/// Stochastic gradient descent as torch.optim.SGD: g += wd·p; buf = momentum·buf + (1−damp)·g
/// (buf = g on a parameter's first step with a gradient); g = nesterov ? g + momentum·buf : buf;
/// p −= lr·g. With momentum ≠ 0 (at construction) every parameter gets a zero buffer and a 0-d
/// bool "started" flag up front; the first-step rule is buf ← where(started, momentum·buf +
/// (1−damp)·g, g), which is exact.
class SGD : public Optimizer {
 public:
  SGD(std::vector<Tensor> params, SGDOptions options, Loc loc = Loc::current());
  /// Throws kiln::Error when momentum is nonzero now but was 0 at construction (no buffers).
  void step(Loc loc = Loc::current()) override;
  SGDOptions options;
  /// The momentum buffer of parameter i (undefined without momentum); updated in place.
  /// Throws kiln::Error naming the caller's line for an index out of range.
  const Tensor& momentum_buffer(size_t i, Loc loc = Loc::current()) const;

 protected:
  std::string invalid_options() const override;
  StateDict state() const override;
  std::vector<std::pair<std::string, double>> option_values() const override;
  void set_option_values(const std::vector<std::pair<std::string, double>>& values,
                         Loc loc) override;

 private:
  std::vector<Tensor> momentum_;  // per parameter, zeros like it (momentum ≠ 0 only)
  std::vector<Tensor> started_;   // per parameter, 0-d bool: has had a step with a gradient
};

struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9, beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;
};

/// Adam with decoupled weight decay (Loshchilov & Hutter 2019), as torch.optim.AdamW:
/// p *= 1 − lr·wd; m = β1 m + (1−β1) g; v = β2 v + (1−β2) g²;
/// p −= (lr / (1−β1ᵗ)) · m / (√v / √(1−β2ᵗ) + eps).
/// t counts the steps of each parameter separately, as PyTorch's state[p]['step']: it advances
/// only in a step() where that parameter has a gradient, so a parameter first trained at the
/// optimiser's 5th step (or unfrozen then) starts its bias correction at t = 1. The t's are the
/// elements of one float64 vector (the bias corrections of all parameters are then three vector
/// ops, not three per parameter); m and v are zeros like each parameter; all exist from
/// construction on.
class AdamW : public Optimizer {
 public:
  AdamW(std::vector<Tensor> params, AdamWOptions options = {}, Loc loc = Loc::current());
  void step(Loc loc = Loc::current()) override;
  AdamWOptions options;
  /// The number of step() calls that updated at least one parameter (a call where no
  /// parameter has a gradient changes nothing and is not counted, as in PyTorch). Reads the
  /// count tensor to the host.
  int64_t step_count() const;
  /// Parameter i's own t (the steps in which it had a gradient), read to the host.
  int64_t step_count(size_t i, Loc loc = Loc::current()) const;
  /// The state tensors (updated in place, never replaced): the count behind step_count()
  /// (0-d float64), parameter i's t (a 0-d float64 view of the vector of t's) and its first /
  /// second moments. The per-parameter ones throw kiln::Error naming the caller's line for an
  /// index out of range.
  const Tensor& step_tensor() const { return steps_; }
  Tensor step_tensor(size_t i, Loc loc = Loc::current()) const;
  const Tensor& exp_avg(size_t i, Loc loc = Loc::current()) const;
  const Tensor& exp_avg_sq(size_t i, Loc loc = Loc::current()) const;

 protected:
  std::string invalid_options() const override;
  StateDict state() const override;
  std::vector<std::pair<std::string, double>> option_values() const override;
  void set_option_values(const std::vector<std::pair<std::string, double>>& values,
                         Loc loc) override;
  void check_state_values(const StateDict& state, Loc loc) const override;

 private:
  std::vector<Tensor> m_, v_;
  Tensor t_;  // [number of parameters] float64
  Tensor steps_;
};

/// Scales gradients in place so their total 2-norm is at most max_norm, as
/// torch.nn.utils.clip_grad_norm_: scale = min(max_norm / (norm + 1e-6), 1) is computed as a
/// 0-d tensor and multiplied into every gradient (a no-op ×1 when norm ≤ max_norm; a nan/inf
/// norm propagates into the gradients, as in PyTorch). The norm is accumulated in float64.
/// Returns the norm before clipping as a 0-d tensor of the default float dtype, without
/// reading anything back to the host.
/// Throws kiln::Error for a negative or NaN max_norm (inf: no clipping) or an undefined tensor.
Tensor clip_grad_norm_(const std::vector<Tensor>& params, double max_norm,
                       Loc loc = Loc::current());

}  // namespace kiln::nn
