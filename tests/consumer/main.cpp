// A user's program outside kiln's tree: an eager and a compiled training step of nn::Linear
// with SGD from the same weights must give the same losses. Exit status 0 when they do.
#include <cmath>
#include <cstdio>
#include <vector>

#include "kiln/kiln.h"
#include "kiln/nn.h"

int main() {
  using namespace kiln;
  auto losses = [](bool compiled) {
    manual_seed(1);
    nn::Linear model(3, 1);
    nn::SGD opt(model.parameters(), {.lr = 0.1});
    // from_vector and tensor() are templates: instantiated in kiln, called here.
    std::vector<float> xs(48);
    for (size_t i = 0; i < xs.size(); ++i) xs[i] = std::sin(0.7f * static_cast<float>(i));
    Tensor x = from_vector(xs, {16, 3}) * tensor({1.f, 2.f, 3.f});
    Tensor y = x.sum(1, true) * 2.0 + 1.0;
    auto step = [&](const Tensor& in, const Tensor& target) {
      opt.zero_grad();
      Tensor loss = mse_loss(model(in), target);
      loss.backward();
      opt.step();
      return loss.detach();
    };
    auto cstep = compile(step);
    std::vector<double> out;
    for (int i = 0; i < 20; ++i) out.push_back((compiled ? cstep(x, y) : step(x, y)).item<double>());
    return out;
  };
  std::vector<double> eager = losses(false), compiled = losses(true);
  for (size_t i = 0; i < eager.size(); ++i)
    if (std::fabs(eager[i] - compiled[i]) > 1e-5 * std::fabs(eager[i])) {
      std::printf("step %zu: eager loss %g, compiled %g\n", i, eager[i], compiled[i]);
      return 1;
    }
  if (!(eager.back() < 0.1 * eager.front())) {
    std::printf("the loss did not fall: %g -> %g\n", eager.front(), eager.back());
    return 1;
  }
  std::printf("consumer: 20 steps, eager and compiled losses agree (%g -> %g)\n", eager.front(),
              eager.back());
  return 0;
}
