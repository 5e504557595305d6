#pragma once
// Helpers shared by the compile() tests.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "kiln/nn.h"
#include "nn/optim.h"

namespace kiln::testing {
inline std::vector<float> vec(const Tensor& t) { return t.to_vector<float>(); }
/// The largest |a − b| over float32 elements: absolute when `floor` is 0, else relative, each
/// divided by max(|b|, floor). Infinite when the element counts differ.
inline double max_diff(const Tensor& a, const Tensor& b, double floor = 0) {
  std::vector<float> x = vec(a), y = vec(b);
  if (x.size() != y.size()) return std::numeric_limits<double>::infinity();
  double m = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    double d = std::abs(double(x[i]) - y[i]);
    m = std::max(m, floor > 0 ? d / std::max(std::abs(double(y[i])), floor) : d);
  }
  return m;
}
inline bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}
/// One training step of `m` with `opt` on (x, y) — zero_grad, cross_entropy, backward, step —
/// returning the detached loss; the same function runs eagerly and under compile().
inline auto training_step(nn::Module& m, nn::Optimizer& opt) {
  return [&m, &opt](const Tensor& x, const Tensor& y) {
    opt.zero_grad();
    Tensor loss = cross_entropy(m.forward(x), y);
    loss.backward();
    opt.step();
    return loss.detach();
  };
}
}  // namespace kiln::testing
