#pragma once
/// Basic layers, with PyTorch's shapes, defaults and initialisation.
#include <string>
#include <vector>

#include "eager/ops.h"
#include "nn/module.h"

namespace kiln::nn {

/// y = x Wᵀ + b. x [..., in] → [..., out]. W [out, in] and b [out] from U(−1/√in, 1/√in)
/// (kaiming_uniform with a = √5, as torch.nn.Linear).
class Linear : public Module {
 public:
  /// Throws kiln::Error for negative sizes (0 is allowed: a [.., 0] input gives the bias).
  Linear(int64_t in_features, int64_t out_features, bool bias = true, Loc loc = Loc::current());
  Tensor forward(const Tensor& x) override;
  std::string name() const override { return "Linear"; }
  Tensor weight, bias;
};

/// 2-D convolution (kiln::conv2d) over NCHW input [N, in, H, W] → [N, out, Ho, Wo]. Weight
/// [out, in/groups, kh, kw] and bias [out] from U(−1/√fan_in, 1/√fan_in), fan_in =
/// in/groups·kh·kw (kaiming_uniform with a = √5, as torch.nn.Conv2d). The geometry is fixed at
/// construction (const members, so a compiled forward needs no guard on it).
class Conv2d : public Module {
 public:
  /// Throws kiln::Error for channels < 1, groups < 1, channels not divisible by groups, or a
  /// kernel / stride / dilation below 1 or a negative padding.
  Conv2d(int64_t in_channels, int64_t out_channels, Size2 kernel_size, Size2 stride = 1,
         Size2 padding = 0, Size2 dilation = 1, int64_t groups = 1, bool bias = true,
         Loc loc = Loc::current());
  Tensor forward(const Tensor& x) override;
  std::string name() const override { return "Conv2d"; }
  const Size2 stride, padding, dilation;
  const int64_t groups;
  Tensor weight, bias;
};

/// kiln::max_pool2d over NCHW input; stride defaults to the kernel size. No parameters.
class MaxPool2d : public Module {
 public:
  explicit MaxPool2d(Size2 kernel_size, std::optional<Size2> stride = std::nullopt,
                     Size2 padding = 0, Size2 dilation = 1)
      : kernel_size(kernel_size), stride(stride), padding(padding), dilation(dilation) {}
  Tensor forward(const Tensor& x) override {
    return max_pool2d(x, kernel_size, stride, padding, dilation);
  }
  std::string name() const override { return "MaxPool2d"; }
  const Size2 kernel_size;
  const std::optional<Size2> stride;
  const Size2 padding, dilation;
};

/// kiln::avg_pool2d (count_include_pad = true) over NCHW input; stride defaults to the kernel
/// size. No parameters.
class AvgPool2d : public Module {
 public:
  explicit AvgPool2d(Size2 kernel_size, std::optional<Size2> stride = std::nullopt,
                     Size2 padding = 0)
      : kernel_size(kernel_size), stride(stride), padding(padding) {}
  Tensor forward(const Tensor& x) override { return avg_pool2d(x, kernel_size, stride, padding); }
  std::string name() const override { return "AvgPool2d"; }
  const Size2 kernel_size;
  const std::optional<Size2> stride;
  const Size2 padding;
};

/// Lookup table: int indices [...] → [..., dim]. Weight [num, dim] from N(0, 1).
class Embedding : public Module {
 public:
  /// Throws kiln::Error for negative sizes.
  Embedding(int64_t num_embeddings, int64_t embedding_dim, Loc loc = Loc::current());
  Tensor forward(const Tensor& indices) override;
  std::string name() const override { return "Embedding"; }
  Tensor weight;
};

/// Layer normalisation over the trailing `shape` dims; weight ones, bias zeros.
class LayerNorm : public Module {
 public:
  /// Throws kiln::Error for a size < 1 or a negative eps.
  explicit LayerNorm(Shape normalized_shape, double eps = 1e-5, bool elementwise_affine = true,
                     Loc loc = Loc::current());
  Tensor forward(const Tensor& x) override;
  std::string name() const override { return "LayerNorm"; }
  Shape normalized_shape;
  double eps;
  Tensor weight, bias;
};

/// Inverted dropout in training mode; identity in eval mode.
class Dropout : public Module {
 public:
  /// Throws kiln::Error unless 0 <= p <= 1.
  explicit Dropout(double p = 0.5, Loc loc = Loc::current());
  Tensor forward(const Tensor& x) override {
    return dropout(x, setting(p, "p"), is_training());
  }
  std::string name() const override { return "Dropout"; }
  double p;
};

class ReLU : public Module {
 public:
  Tensor forward(const Tensor& x) override { return relu(x); }
  std::string name() const override { return "ReLU"; }
};

/// approximate: "none" (erf) or "tanh".
class GELU : public Module {
 public:
  explicit GELU(std::string approximate = "none") : approximate(std::move(approximate)) {}
  Tensor forward(const Tensor& x) override { return gelu(x, setting(approximate, "approximate")); }
  std::string name() const override { return "GELU"; }
  std::string approximate;
};

/// Applies its modules in order; they are registered as "0", "1", ...
class Sequential : public Module {
 public:
  Sequential() = default;
  /// Throws kiln::Error for a null module.
  Sequential(std::initializer_list<std::shared_ptr<Module>> modules, Loc loc = Loc::current());
  /// Throws kiln::Error for a null module.
  void push_back(std::shared_ptr<Module> m, Loc loc = Loc::current());
  Tensor forward(const Tensor& x) override;
  std::string name() const override { return "Sequential"; }
  size_t size() const { return modules_.size(); }
  /// An index and the line it was written on: operator[] takes one argument in C++20, and the
  /// default argument of this implicit constructor is evaluated where `seq[i]` is written.
  struct Index {
    Index(int64_t i, Loc loc = Loc::current()) : i(i), loc(loc) {}  // NOLINT: implicit
    int64_t i;
    Loc loc;
  };
  /// The i-th module; negative i counts from the end (seq[-1] is the last), as in PyTorch.
  /// Throws kiln::Error naming the caller's line when i is not in [-size(), size()).
  std::shared_ptr<Module> operator[](Index index) const;

 private:
  std::vector<std::shared_ptr<Module>> modules_;
};

/// Loss modules (reduction as in the functional forms, default Mean).
class CrossEntropyLoss {
 public:
  explicit CrossEntropyLoss(Reduction r = Reduction::Mean, int64_t ignore_index = -100)
      : reduction(r), ignore_index(ignore_index) {}
  Tensor operator()(const Tensor& logits, const Tensor& target, Loc loc = Loc::current()) const {
    return cross_entropy(logits, target, reduction, ignore_index, loc);
  }
  Reduction reduction;
  int64_t ignore_index;
};
class MSELoss {
 public:
  explicit MSELoss(Reduction r = Reduction::Mean) : reduction(r) {}
  Tensor operator()(const Tensor& a, const Tensor& b, Loc loc = Loc::current()) const {
    return mse_loss(a, b, reduction, loc);
  }
  Reduction reduction;
};
class NLLLoss {
 public:
  explicit NLLLoss(Reduction r = Reduction::Mean, int64_t ignore_index = -100)
      : reduction(r), ignore_index(ignore_index) {}
  Tensor operator()(const Tensor& log_probs, const Tensor& target, Loc loc = Loc::current()) const {
    return nll_loss(log_probs, target, reduction, ignore_index, loc);
  }
  Reduction reduction;
  int64_t ignore_index;
};

}  // namespace kiln::nn
