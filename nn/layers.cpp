#include "nn/layers.h"

#include <cmath>

#include "eager/factories.h"
#include "nn/init.h"

namespace kiln::nn {

Linear::Linear(int64_t in, int64_t out, bool with_bias, Loc loc) {
  KILN_CHECK(in >= 0 && out >= 0, "Linear", loc,
             "in_features and out_features must be non-negative, got {} and {}", in, out);
  // Allocations at the caller's line: an out-of-memory error names Linear and that line.
  weight = register_parameter(
      "weight", as_op("Linear", [&] { return empty({out, in}, {}, loc); }));
  init::kaiming_uniform_(weight, std::sqrt(5.0));
  if (with_bias) {
    bias = register_parameter("bias", as_op("Linear", [&] { return empty({out}, {}, loc); }));
    double b = in > 0 ? 1 / std::sqrt(static_cast<double>(in)) : 0;  // PyTorch's bound
    init::uniform_(bias, -b, b);
  }
}
Tensor Linear::forward(const Tensor& x) { return linear(x, weight, bias); }

Conv2d::Conv2d(int64_t in, int64_t out, Size2 kernel, Size2 stride, Size2 padding,
               Size2 dilation, int64_t groups, bool with_bias, Loc loc)
    : stride(stride), padding(padding), dilation(dilation), groups(groups) {
  KILN_CHECK(in >= 1 && out >= 1 && groups >= 1, "Conv2d", loc,
             "in_channels, out_channels and groups must be positive, got {}, {} and {}", in, out,
             groups);
  KILN_CHECK(in % groups == 0 && out % groups == 0, "Conv2d", loc,
             "in_channels ({}) and out_channels ({}) must be divisible by groups ({})", in, out,
             groups);
  KILN_CHECK(kernel.h >= 1 && kernel.w >= 1 && stride.h >= 1 && stride.w >= 1 &&
                 dilation.h >= 1 && dilation.w >= 1 && padding.h >= 0 && padding.w >= 0,
             "Conv2d", loc,
             "kernel_size [{}, {}], stride [{}, {}] and dilation [{}, {}] must be positive and "
             "padding [{}, {}] non-negative",
             kernel.h, kernel.w, stride.h, stride.w, dilation.h, dilation.w, padding.h,
             padding.w);
  weight = register_parameter("weight", as_op("Conv2d", [&] {
                                return empty({out, in / groups, kernel.h, kernel.w}, {}, loc);
                              }));
  init::kaiming_uniform_(weight, std::sqrt(5.0));
  if (with_bias) {
    bias = register_parameter("bias", as_op("Conv2d", [&] { return empty({out}, {}, loc); }));
    const double b = 1 / std::sqrt(static_cast<double>(init::fans(weight).first));
    init::uniform_(bias, -b, b);
  }
}
Tensor Conv2d::forward(const Tensor& x) {
  return conv2d(x, weight, bias, stride, padding, dilation, groups);
}

Embedding::Embedding(int64_t num, int64_t dim, Loc loc) {
  KILN_CHECK(num >= 0 && dim >= 0, "Embedding", loc,
             "num_embeddings and embedding_dim must be non-negative, got {} and {}", num, dim);
  weight = register_parameter(
      "weight", as_op("Embedding", [&] { return empty({num, dim}, {}, loc); }));
  init::normal_(weight);
}
Tensor Embedding::forward(const Tensor& indices) { return embedding(weight, indices); }

LayerNorm::LayerNorm(Shape shape, double eps, bool affine, Loc loc)
    : normalized_shape(shape), eps(eps) {
  for (int64_t s : shape)
    KILN_CHECK(s >= 1, "LayerNorm", loc, "normalized_shape {} has a size below 1",
               to_string(shape));
  KILN_CHECK(eps >= 0, "LayerNorm", loc, "eps must be >= 0, got {}", eps);
  if (affine) {
    weight = register_parameter("weight", ones(shape));
    bias = register_parameter("bias", zeros(shape));
  }
}
Tensor LayerNorm::forward(const Tensor& x) {
  return layer_norm(x, setting(normalized_shape, "normalized_shape"), weight, bias,
                    setting(eps, "eps"));
}

Dropout::Dropout(double p, Loc loc) : p(p) {
  KILN_CHECK(p >= 0 && p <= 1, "Dropout", loc, "p must be in [0, 1], got {}", p);
}

Sequential::Sequential(std::initializer_list<std::shared_ptr<Module>> modules, Loc loc) {
  as_op("Sequential", [&] {  // a null module's error names the constructor called
    for (auto& m : modules) push_back(m, loc);
  });
}
std::shared_ptr<Module> Sequential::operator[](Index index) const {
  const int64_t n = static_cast<int64_t>(modules_.size());
  KILN_CHECK(index.i >= -n && index.i < n, "Sequential", index.loc,
             "index {} out of range for {} modules", index.i, n);
  return modules_[static_cast<size_t>(index.i < 0 ? index.i + n : index.i)];
}
void Sequential::push_back(std::shared_ptr<Module> m, Loc loc) {
  register_module(std::to_string(modules_.size()), m, loc);
  modules_.push_back(std::move(m));
}
Tensor Sequential::forward(const Tensor& x) {
  guard_submodules();  // a push_back after compile() traces again (break-it pass)
  Tensor y = x;
  for (auto& m : modules_) y = m->forward(y);
  return y;
}

}  // namespace kiln::nn
