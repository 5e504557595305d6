#pragma once
/// Optimisers. step() updates parameters in place under no_grad (so a parameter shared with a
/// module sees the update); parameters without a gradient are skipped.
#include <vector>

#include "core/tensor.h"

namespace kiln::nn {

class Optimizer {
 public:
  explicit Optimizer(std::vector<Tensor> params);
  virtual ~Optimizer() = default;
  virtual void step() = 0;
  /// Sets every parameter's .grad to undefined.
  void zero_grad();
  const std::vector<Tensor>& params() const { return params_; }

 protected:
  std::vector<Tensor> params_;
};

struct SGDOptions {
  double lr = 1e-2;
  double momentum = 0;
  double dampening = 0;
  double weight_decay = 0;
  bool nesterov = false;
};

/// Stochastic gradient descent as torch.optim.SGD: g += wd·p; buf = momentum·buf + (1−damp)·g
/// (buf = g on the first step); g = nesterov ? g + momentum·buf : buf; p −= lr·g.
class SGD : public Optimizer {
 public:
  SGD(std::vector<Tensor> params, SGDOptions options);
  void step() override;
  SGDOptions options;

 private:
  std::vector<Tensor> momentum_;
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
class AdamW : public Optimizer {
 public:
  AdamW(std::vector<Tensor> params, AdamWOptions options = {});
  void step() override;
  AdamWOptions options;
  int64_t step_count() const { return t_; }

 private:
  std::vector<Tensor> m_, v_;
  int64_t t_ = 0;
};

/// Scales gradients in place so their total 2-norm is at most max_norm (scale
/// max_norm / (norm + 1e-6) when norm > max_norm); returns the norm before clipping (0-d).
Tensor clip_grad_norm_(const std::vector<Tensor>& params, double max_norm);

}  // namespace kiln::nn
