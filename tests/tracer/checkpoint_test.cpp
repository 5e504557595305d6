// Checkpoints under compile(): a model and optimizer state loaded into the objects a compiled
// training step was traced with are used by its next replay (the loads copy in place), with
// no retrace, and the run equals the eager one that went on.
#include <catch2/catch.hpp>

#include <memory>
#include <vector>

#include "kiln/kiln.h"
#include "kiln/nn.h"

using namespace kiln;
using namespace kiln::nn;

TEST_CASE("a compiled training step resumes from a loaded checkpoint without retracing") {
  manual_seed(11);
  Tensor x = randn({16, 4}), y = randn({16, 1});
  auto make_model = [] {
    manual_seed(3);
    return std::make_shared<Sequential>(std::initializer_list<std::shared_ptr<Module>>{
        std::make_shared<Linear>(4, 8), std::make_shared<GELU>(), std::make_shared<Linear>(8, 1)});
  };
  // The reference: eager, 3 steps, a checkpoint, 4 more steps.
  auto ref_model = make_model();
  AdamW ref_opt(ref_model->parameters(), {.lr = 0.01});
  auto eager_step = [&] {
    ref_opt.zero_grad();
    Tensor loss = mse_loss(ref_model->forward(x), y);
    loss.backward();
    ref_opt.step();
    return loss.item<float>();
  };
  for (int i = 0; i < 3; ++i) eager_step();
  StateDict model_ckpt, opt_ckpt;
  for (const auto& [k, t] : ref_model->state_dict()) model_ckpt.emplace_back(k, t.clone());
  for (const auto& [k, t] : ref_opt.state_dict()) opt_ckpt.emplace_back(k, t.clone());
  opt_ckpt.back().second = scalar_tensor(1e-3, {DType::Float64});  // weight_decay, as a schedule
  ref_opt.options.weight_decay = 1e-3;
  std::vector<float> went_on;
  for (int i = 0; i < 4; ++i) went_on.push_back(eager_step());

  // Compiled, from other weights: traced, then the checkpoint is loaded into the same objects.
  manual_seed(99);
  auto model = std::make_shared<Sequential>(std::initializer_list<std::shared_ptr<Module>>{
      std::make_shared<Linear>(4, 8), std::make_shared<GELU>(), std::make_shared<Linear>(8, 1)});
  AdamW opt(model->parameters(), {.lr = 0.01});
  auto step = compile([&](const Tensor& in, const Tensor& target) {
    opt.zero_grad();
    Tensor loss = mse_loss(model->forward(in), target);
    loss.backward();
    opt.step();
    return loss.detach();
  });
  for (int i = 0; i < 3; ++i) step(x, y);
  model->load_state_dict(model_ckpt);
  opt.load_state_dict(opt_ckpt);
  CHECK(opt.options.weight_decay == 1e-3);
  std::vector<float> resumed;
  for (int i = 0; i < 4; ++i) resumed.push_back(step(x, y).item<float>());
  CHECK(step.compile_count() == 1);
  for (size_t i = 0; i < resumed.size(); ++i) CHECK(resumed[i] == Approx(went_on[i]).epsilon(1e-5));
}
