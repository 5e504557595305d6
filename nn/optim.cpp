#include "nn/optim.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <unordered_map>

#include "core/dtype.h"
#include "eager/autograd.h"
#include "eager/dispatch.h"
#include "eager/factories.h"
#include "eager/ops.h"

namespace kiln::nn {

Optimizer::Optimizer(std::vector<Tensor> params, Loc loc) : params_(std::move(params)) {
  KILN_CHECK(!params_.empty(), "Optimizer", loc, "got an empty parameter list");
  // Frozen tensors are fine (skipped while they have no gradient, and trained once unfrozen);
  // a non-leaf never gets a .grad, so optimising it is a mistake; one given twice would be
  // updated twice per step.
  std::unordered_map<const TensorImpl*, size_t> seen;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (params_[i].defined()) {
      auto [it, fresh] = seen.emplace(params_[i].impl(), i);
      KILN_CHECK(fresh, "Optimizer", loc, "parameter {} is parameter {} again ({} {})", i,
                 it->second, kiln::name(params_[i].dtype()), to_string(params_[i].shape()));
    }
    const Tensor& p = params_[i];
    KILN_CHECK(p.defined(), "Optimizer", loc, "parameter {} is undefined", i);
    KILN_CHECK(p.is_leaf(), "Optimizer", loc,
               "parameter {} ({} {}) is not a leaf tensor (it was computed from others); "
               "optimise the leaf it came from",
               i, kiln::name(p.dtype()), to_string(p.shape()));
  }
}

void Optimizer::zero_grad() { kiln::zero_grad(params_); }

StateDict Optimizer::state_dict() const {
  StateDict out = state();
  for (const auto& [name, value] : option_values())
    out.emplace_back("options." + name, scalar_tensor(value, {DType::Float64}));
  return out;
}

void Optimizer::load_state_dict(const StateDict& dict, Loc loc) {
  constexpr char kOp[] = "Optimizer.load_state_dict";
  constexpr std::string_view kPrefix = "options.";
  StateDict state_part;
  std::vector<std::pair<std::string, double>> values;
  for (const auto& [key, t] : dict) {
    if (!key.starts_with(kPrefix)) {
      state_part.emplace_back(key, t);
      continue;
    }
    KILN_CHECK(t.defined() && t.numel() == 1, kOp, loc,
               "the option \"{}\" must be a one-element tensor", key);
    const std::string name = key.substr(kPrefix.size());
    KILN_CHECK(!std::ranges::any_of(values, [&](const auto& v) { return v.first == name; }),
               kOp, loc, "the state dict has the key \"{}\" twice", key);
    values.emplace_back(name, t.item<double>(loc));
  }
  // The options must be this optimizer's, all of them (a file of another optimizer fails here).
  // Every missing and unexpected one is named, as Module::load_state_dict does: the first
  // missing key alone did not say the dict was another optimizer's or a model's (break-it).
  std::vector<std::pair<std::string, double>> mine = option_values();
  std::vector<std::string> missing, unexpected;
  for (const auto& [name, value] : mine)
    if (!std::ranges::any_of(values, [&](const auto& v) { return v.first == name; }))
      missing.push_back("\"options." + name + "\"");
  for (const auto& [name, value] : values)
    if (!std::ranges::any_of(mine, [&](const auto& v) { return v.first == name; }))
      unexpected.push_back("\"options." + name + "\"");
  std::vector<std::string> problems;
  if (!missing.empty())
    problems.push_back(fmt::format("missing keys {}", fmt::join(missing, ", ")));
  if (!unexpected.empty())
    problems.push_back(fmt::format("unexpected keys {}", fmt::join(unexpected, ", ")));
  KILN_CHECK(problems.empty(), kOp, loc,
             "the state dict holds another optimizer's options (or none: a model's): {}",
             fmt::join(problems, "; "));
  check_state_values(state_part, loc);
  auto previous = mine;
  set_option_values(values, loc);  // validated before anything changes
  try {
    load_state_into(state(), state_part, /*strict=*/true, kOp, loc);
  } catch (...) {
    set_option_values(previous, loc);
    throw;
  }
}

namespace {
// The value named `name` of `values` (present: load_state_dict checked the names).
double value_of(const std::vector<std::pair<std::string, double>>& values, std::string_view name) {
  for (const auto& [n, v] : values)
    if (n == name) return v;
  return 0;
}

// Why options are invalid (PyTorch's checks, and finite values), or "" when they are valid.
std::string invalid(const SGDOptions& o) {
  if (!(o.lr >= 0 && o.momentum >= 0 && o.weight_decay >= 0 && std::isfinite(o.lr) &&
        std::isfinite(o.momentum) && std::isfinite(o.weight_decay) && std::isfinite(o.dampening)))
    return fmt::format("invalid options: lr {}, momentum {}, dampening {}, weight_decay {}", o.lr,
                       o.momentum, o.dampening, o.weight_decay);
  if (o.nesterov && !(o.momentum > 0 && o.dampening == 0))
    return "nesterov needs momentum > 0 and dampening = 0";
  return "";
}

std::string invalid(const AdamWOptions& o) {
  if (!(o.lr >= 0 && o.eps >= 0 && o.beta1 >= 0 && o.beta1 < 1 && o.beta2 >= 0 && o.beta2 < 1 &&
        o.weight_decay >= 0 && std::isfinite(o.lr) && std::isfinite(o.eps) &&
        std::isfinite(o.weight_decay)))
    return fmt::format("invalid options: lr {}, betas ({}, {}), eps {}, wd {}", o.lr, o.beta1,
                       o.beta2, o.eps, o.weight_decay);
  return "";
}

template <class Options> void check_options(const Options& o, const char* op, Loc loc) {
  std::string why = invalid(o);
  KILN_CHECK(why.empty(), op, loc, "{}", why);
}
}  // namespace

std::string SGD::invalid_options() const { return invalid(options); }
std::string AdamW::invalid_options() const { return invalid(options); }

namespace {
// Reads *value while `alive` (its optimizer) is.
template <class T> HostReader read_nonzero(const std::shared_ptr<const int>& alive, const T* value) {
  return [alive = std::weak_ptr<const int>(alive), value]() -> std::optional<Scalar> {
    if (alive.expired()) return std::nullopt;
    return Scalar(*value != T{});
  };
}
}  // namespace

Tensor Optimizer::option(std::function<double()> read) const {
  return dispatch::host_input(read(), [&] {
    return HostReader([alive = std::weak_ptr<const int>(alive_), read,
                       this]() -> std::optional<Scalar> {
      if (alive.expired()) return std::nullopt;  // gone: the entry is dropped
      // Options made invalid since the trace: the replay stops before it changes anything and
      // the call traces, where step() raises the error as eagerly. The entry is kept for when
      // the options are valid again (returning "gone" here dropped it: a break-it pass).
      std::string why = invalid_options();
      KILN_CHECK(why.empty(), "Optimizer.step", Loc::current(), "{}", why);
      return Scalar(read());
    });
  }, Loc::current());
}

bool Optimizer::option_set(const double& value, std::string_view what) const {
  dispatch::note_host_value(&value, what,
                            [&] { return read_nonzero(alive_, &value); }, Loc::current());
  return value != 0;
}

bool Optimizer::option_set(const bool& value, std::string_view what) const {
  dispatch::note_host_value(&value, what,
                            [&] { return read_nonzero(alive_, &value); }, Loc::current());
  return value;
}

SGD::SGD(std::vector<Tensor> params, SGDOptions o, Loc loc)
    : Optimizer(std::move(params), loc), options(o) {
  check_options(o, "SGD", loc);
  momentum_.resize(params_.size());
  started_.resize(params_.size());
  // State exists before the first step (compiled replay cannot create it later).
  if (o.momentum != 0) {
    NoGradGuard ng;
    for (size_t i = 0; i < params_.size(); ++i) {
      momentum_[i] = zeros_like(params_[i]);
      started_[i] = zeros({}, {DType::Bool});
    }
  }
}

void SGD::step(Loc loc) {
  at_user_line(loc, [&] {
  check_options(options, "SGD.step", loc);  // public fields: changed since construction
  NoGradGuard ng;
  bool any = false;
  for (const Tensor& p : params_) any |= p.grad().defined();
  if (!any) return;
  // Options as runtime values (compiled steps read them on every call); host branches guarded.
  const bool decay = option_set(options.weight_decay, "SGD weight_decay != 0");
  const bool use_momentum = option_set(options.momentum, "SGD momentum != 0");
  const bool nesterov = use_momentum && option_set(options.nesterov, "SGD nesterov");
  Tensor lr = option([this] { return options.lr; });
  Tensor wd = decay ? option([this] { return options.weight_decay; }) : Tensor();
  Tensor momentum = use_momentum ? option([this] { return options.momentum; }) : Tensor();
  Tensor keep = use_momentum ? option([this] { return 1 - options.dampening; }) : Tensor();
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor& p = params_[i];
    Tensor g = p.grad();
    if (!g.defined()) continue;
    if (decay) g = g + p * wd;
    if (use_momentum) {
      Tensor& buf = momentum_[i];
      KILN_CHECK(buf.defined(), "SGD.step", loc,
                 "momentum is {} but was 0 at construction (no momentum buffers); set it in "
                 "SGDOptions when creating the SGD",
                 options.momentum);
      // buf = started ? momentum·buf + (1−damp)·g : g, written into the same buffer.
      buf.copy_(where(started_[i], buf * momentum + g * keep, g));
      started_[i].fill_(true);
      g = nesterov ? g + buf * momentum : buf;
    }
    p -= g * lr;
  }
  });
}

StateDict SGD::state() const {
  StateDict out;
  for (size_t i = 0; i < params_.size(); ++i)
    if (momentum_[i].defined()) {
      out.emplace_back(fmt::format("state.{}.momentum_buffer", i), momentum_[i]);
      out.emplace_back(fmt::format("state.{}.started", i), started_[i]);
    }
  return out;
}

std::vector<std::pair<std::string, double>> SGD::option_values() const {
  return {{"lr", options.lr},
          {"momentum", options.momentum},
          {"dampening", options.dampening},
          {"weight_decay", options.weight_decay},
          {"nesterov", options.nesterov ? 1.0 : 0.0}};
}

void SGD::set_option_values(const std::vector<std::pair<std::string, double>>& values, Loc loc) {
  SGDOptions o{.lr = value_of(values, "lr"),
               .momentum = value_of(values, "momentum"),
               .dampening = value_of(values, "dampening"),
               .weight_decay = value_of(values, "weight_decay"),
               .nesterov = value_of(values, "nesterov") != 0};
  const double nesterov = value_of(values, "nesterov");
  KILN_CHECK(nesterov == 0 || nesterov == 1, "Optimizer.load_state_dict", loc,
             "options.nesterov must be 0 or 1 (false or true), got {}", nesterov);
  check_options(o, "Optimizer.load_state_dict", loc);
  KILN_CHECK(o.momentum == 0 || params_.empty() || momentum_[0].defined(),
             "Optimizer.load_state_dict", loc,
             "the state dict has momentum {}, but this SGD was made without momentum (no "
             "momentum buffers); set momentum in SGDOptions when creating it",
             o.momentum);
  options = o;
}

AdamW::AdamW(std::vector<Tensor> params, AdamWOptions o, Loc loc)
    : Optimizer(std::move(params), loc), options(o) {
  check_options(o, "AdamW", loc);
  // State exists before the first step (compiled replay cannot create it later).
  NoGradGuard ng;
  for (const Tensor& p : params_) {
    m_.push_back(zeros_like(p));
    v_.push_back(zeros_like(p));
  }
  t_ = zeros({static_cast<int64_t>(params_.size())}, {DType::Float64});
  steps_ = zeros({}, {DType::Float64});
}

StateDict AdamW::state() const {
  StateDict out;
  for (size_t i = 0; i < params_.size(); ++i) {
    out.emplace_back(fmt::format("state.{}.exp_avg", i), m_[i]);
    out.emplace_back(fmt::format("state.{}.exp_avg_sq", i), v_[i]);
    out.emplace_back(fmt::format("state.{}.step", i), step_tensor(i));
  }
  out.emplace_back("step", steps_);
  return out;
}

void AdamW::check_state_values(const StateDict& state, Loc loc) const {
  // A NaN or fractional count became INT64_MIN in step_count() and NaN parameters at the next
  // step (a break-it pass).
  for (const auto& [key, t] : state) {
    if (key != "step" && !(key.starts_with("state.") && key.ends_with(".step"))) continue;
    if (!t.defined() || t.device().is_cuda()) continue;  // load_state_into names those
    for (double v : t.to_vector<double>())
      KILN_CHECK(std::isfinite(v) && v >= 0 && v == std::floor(v) && v <= 0x1p53,
                 "Optimizer.load_state_dict", loc,
                 "\"{}\" must hold whole step counts >= 0, got {}", key, v);
  }
}

std::vector<std::pair<std::string, double>> AdamW::option_values() const {
  return {{"lr", options.lr},       {"beta1", options.beta1}, {"beta2", options.beta2},
          {"eps", options.eps},     {"weight_decay", options.weight_decay}};
}

void AdamW::set_option_values(const std::vector<std::pair<std::string, double>>& values,
                              Loc loc) {
  AdamWOptions o{.lr = value_of(values, "lr"),
                 .beta1 = value_of(values, "beta1"),
                 .beta2 = value_of(values, "beta2"),
                 .eps = value_of(values, "eps"),
                 .weight_decay = value_of(values, "weight_decay")};
  check_options(o, "Optimizer.load_state_dict", loc);
  options = o;
}

namespace {
// The per-parameter state accessors' index check.
void check_parameter_index(const char* op, size_t i, size_t count, Loc loc) {
  KILN_CHECK(i < count, op, loc, "parameter index {} out of range for {} parameters", i, count);
}
}  // namespace

const Tensor& SGD::momentum_buffer(size_t i, Loc loc) const {
  check_parameter_index("SGD.momentum_buffer", i, params_.size(), loc);
  return momentum_[i];
}
int64_t AdamW::step_count() const { return static_cast<int64_t>(steps_.item<double>()); }
int64_t AdamW::step_count(size_t i, Loc loc) const {
  check_parameter_index("AdamW.step_count", i, params_.size(), loc);
  return static_cast<int64_t>(step_tensor(i, loc).item<double>(loc));
}
Tensor AdamW::step_tensor(size_t i, Loc loc) const {
  check_parameter_index("AdamW.step_tensor", i, params_.size(), loc);
  return t_.select(0, static_cast<int64_t>(i), loc);
}
const Tensor& AdamW::exp_avg(size_t i, Loc loc) const {
  check_parameter_index("AdamW.exp_avg", i, params_.size(), loc);
  return m_[i];
}
const Tensor& AdamW::exp_avg_sq(size_t i, Loc loc) const {
  check_parameter_index("AdamW.exp_avg_sq", i, params_.size(), loc);
  return v_[i];
}

void AdamW::step(Loc loc) {
  at_user_line(loc, [&] {
  check_options(options, "AdamW.step", loc);  // public fields: changed since construction
  NoGradGuard ng;
  std::vector<double> has_grad(params_.size());
  bool any = false, all = true;
  for (size_t i = 0; i < params_.size(); ++i) {
    has_grad[i] = params_[i].grad().defined();
    any |= has_grad[i] != 0;
    all &= has_grad[i] != 0;
  }
  if (!any) return;
  steps_ += 1;
  // Each parameter's t advances when it has a gradient (whether it has one is a guard of a
  // compiled step, so the mask is a constant of the trace).
  if (all) t_ += 1;
  else t_ += from_vector(has_grad, {static_cast<int64_t>(has_grad.size())});
  // Options as runtime values (compiled steps read them on every call); formulas of them are
  // evaluated on the host in double, as before; the weight-decay branch is guarded.
  Tensor lr = option([this] { return options.lr; });
  Tensor b1 = option([this] { return options.beta1; });
  Tensor b2 = option([this] { return options.beta2; });
  Tensor eps = option([this] { return options.eps; });
  Tensor decay = option_set(options.weight_decay, "AdamW weight_decay != 0")
                     ? option([this] { return 1 - options.lr * options.weight_decay; })
                     : Tensor();
  Tensor one_minus_b1 = option([this] { return 1 - options.beta1; });
  Tensor one_minus_b2 = option([this] { return 1 - options.beta2; });
  // Bias corrections from the t's (tensors, not host counts): lr / (1 − β1ᵗ), 1 / √(1 − β2ᵗ).
  Tensor step_sizes = lr / (1 - pow(b1, t_));
  Tensor inv_sqrt_bc2s = 1 / sqrt(1 - pow(b2, t_));
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor& p = params_[i];
    Tensor g = p.grad();
    if (!g.defined()) continue;
    Tensor step_size = step_sizes.select(0, static_cast<int64_t>(i));
    Tensor inv_sqrt_bc2 = inv_sqrt_bc2s.select(0, static_cast<int64_t>(i));
    if (decay.defined()) p *= decay;
    Tensor& m = m_[i];
    Tensor& v = v_[i];
    m *= b1;
    m += g * one_minus_b1;
    v *= b2;
    v += g * g * one_minus_b2;
    Tensor denom = sqrt(v) * inv_sqrt_bc2 + eps;
    p -= m / denom * step_size;
  }
  });
}

Tensor clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, Loc loc) {
  KILN_CHECK(max_norm >= 0, "clip_grad_norm_", loc, "max_norm must be >= 0, got {}", max_norm);
  for (size_t i = 0; i < params.size(); ++i)
    KILN_CHECK(params[i].defined(), "clip_grad_norm_", loc, "tensor {} is undefined", i);
  return at_user_line(loc, [&] {
  NoGradGuard ng;
  Tensor total = zeros({}, {DType::Float64});
  for (const Tensor& p : params)
    if (Tensor g = p.grad(); g.defined()) {
      Tensor g64 = g.to(DType::Float64);
      total += sum(g64 * g64);
    }
  Tensor norm = sqrt(total);
  Tensor scale = clamp(max_norm / (norm + 1e-6), std::nullopt, 1.0);
  for (const Tensor& p : params)
    if (Tensor g = p.grad(); g.defined()) g *= scale;
  return norm.to(default_dtype());
  });
}

}  // namespace kiln::nn
