#pragma once
// Helpers shared by the compile() tests.
#include <string>
#include <vector>

#include "core/tensor.h"
#include "kiln/nn.h"
#include "nn/optim.h"

namespace kiln::testing {
inline std::vector<float> vec(const Tensor& t) { return t.to_vector<float>(); }
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
