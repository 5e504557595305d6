#include "nn/optim.h"

#include <cmath>

#include "eager/autograd.h"
#include "eager/factories.h"
#include "eager/ops.h"

namespace kiln::nn {

Optimizer::Optimizer(std::vector<Tensor> params) : params_(std::move(params)) {
  for (const Tensor& p : params_)
    KILN_CHECK(p.defined() && p.requires_grad() && p.is_leaf(), "Optimizer", Loc::current(),
               "parameters must be leaf tensors that require grad");
}

void Optimizer::zero_grad() { kiln::zero_grad(params_); }

SGD::SGD(std::vector<Tensor> params, SGDOptions o) : Optimizer(std::move(params)), options(o) {
  KILN_CHECK(o.lr >= 0 && o.momentum >= 0 && o.weight_decay >= 0, "SGD", Loc::current(),
             "invalid options: lr {}, momentum {}, weight_decay {}", o.lr, o.momentum,
             o.weight_decay);
  KILN_CHECK(!o.nesterov || (o.momentum > 0 && o.dampening == 0), "SGD", Loc::current(),
             "nesterov needs momentum > 0 and dampening = 0");
  momentum_.resize(params_.size());
}

void SGD::step() {
  NoGradGuard ng;
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor& p = params_[i];
    Tensor g = p.grad();
    if (!g.defined()) continue;
    if (options.weight_decay != 0) g = g + p * options.weight_decay;
    if (options.momentum != 0) {
      Tensor& buf = momentum_[i];
      if (!buf.defined()) buf = g.clone();
      else buf = buf * options.momentum + g * (1 - options.dampening);
      g = options.nesterov ? g + buf * options.momentum : buf;
    }
    p -= g * options.lr;
  }
}

AdamW::AdamW(std::vector<Tensor> params, AdamWOptions o) : Optimizer(std::move(params)), options(o) {
  KILN_CHECK(o.lr >= 0 && o.eps >= 0 && o.beta1 >= 0 && o.beta1 < 1 && o.beta2 >= 0 &&
                 o.beta2 < 1 && o.weight_decay >= 0,
             "AdamW", Loc::current(), "invalid options: lr {}, betas ({}, {}), eps {}, wd {}", o.lr,
             o.beta1, o.beta2, o.eps, o.weight_decay);
  m_.resize(params_.size());
  v_.resize(params_.size());
}

void AdamW::step() {
  NoGradGuard ng;
  ++t_;
  double bc1 = 1 - std::pow(options.beta1, static_cast<double>(t_));
  double bc2 = 1 - std::pow(options.beta2, static_cast<double>(t_));
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor& p = params_[i];
    Tensor g = p.grad();
    if (!g.defined()) continue;
    if (!m_[i].defined()) {
      m_[i] = zeros_like(p);
      v_[i] = zeros_like(p);
    }
    if (options.weight_decay != 0) p *= 1 - options.lr * options.weight_decay;
    m_[i] = m_[i] * options.beta1 + g * (1 - options.beta1);
    v_[i] = v_[i] * options.beta2 + g * g * (1 - options.beta2);
    Tensor denom = sqrt(v_[i]) * (1 / std::sqrt(bc2)) + options.eps;
    p -= m_[i] / denom * (options.lr / bc1);
  }
}

Tensor clip_grad_norm_(const std::vector<Tensor>& params, double max_norm) {
  NoGradGuard ng;
  Tensor total = zeros({}, {DType::Float64});
  for (const Tensor& p : params)
    if (p.grad().defined()) total = total + sum(p.grad().to(DType::Float64) * p.grad().to(DType::Float64));
  double norm = std::sqrt(total.item<double>());
  double scale = max_norm / (norm + 1e-6);
  if (scale < 1)
    for (const Tensor& p : params)
      if (Tensor g = p.grad(); g.defined()) g *= scale;
  return full({}, norm);
}

}  // namespace kiln::nn
