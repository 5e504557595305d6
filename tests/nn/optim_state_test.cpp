// Optimizer::state_dict / load_state_dict: a training run checkpointed (model and optimizer)
// and resumed in fresh objects gives the same losses as the run that went on, bit for bit;
// bad dicts change nothing.
#include <catch2/catch.hpp>

#include <cmath>

#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kiln/nn.h"

using namespace kiln;
using namespace kiln::nn;

namespace {
struct Run {
  std::shared_ptr<Sequential> model;
  std::shared_ptr<Optimizer> opt;
};

Run make_run(bool adamw) {
  manual_seed(3);
  Run r;
  r.model = std::make_shared<Sequential>(std::initializer_list<std::shared_ptr<Module>>{
      std::make_shared<Linear>(4, 8), std::make_shared<GELU>(), std::make_shared<Linear>(8, 1)});
  if (adamw)
    r.opt = std::make_shared<AdamW>(r.model->parameters(), AdamWOptions{.lr = 0.01});
  else
    r.opt = std::make_shared<SGD>(r.model->parameters(),
                                  SGDOptions{.lr = 0.05, .momentum = 0.9, .weight_decay = 1e-3});
  return r;
}

float train_step(Run& r, const Tensor& x, const Tensor& y) {
  r.opt->zero_grad();
  Tensor loss = mse_loss(r.model->forward(x), y);
  loss.backward();
  r.opt->step();
  return loss.item<float>();
}

StateDict clone_dict(const StateDict& d) {
  StateDict out;
  for (const auto& [k, t] : d) out.emplace_back(k, t.clone());
  return out;
}
}  // namespace

TEST_CASE("optimizer state_dict: a resumed run equals the uninterrupted one") {
  for (bool adamw : {false, true}) {
    INFO((adamw ? "AdamW" : "SGD with momentum"));
    manual_seed(11);
    Tensor x = randn({16, 4}), y = randn({16, 1});
    Run a = make_run(adamw);
    for (int i = 0; i < 3; ++i) train_step(a, x, y);
    const std::string model_path = "/tmp/kiln_optim_state_model.safetensors";
    const std::string opt_path = "/tmp/kiln_optim_state_opt.safetensors";
    a.model->save(model_path);
    save_safetensors(a.opt->state_dict(), opt_path);
    std::vector<float> went_on;
    for (int i = 0; i < 4; ++i) went_on.push_back(train_step(a, x, y));

    Run b = make_run(adamw);
    for (int i = 0; i < 2; ++i) train_step(b, x, y);  // other state, to be overwritten
    b.model->load(model_path);
    b.opt->load_state_dict(load_safetensors(opt_path));
    std::vector<float> resumed;
    for (int i = 0; i < 4; ++i) resumed.push_back(train_step(b, x, y));
    CHECK(resumed == went_on);
    CHECK(went_on.back() < went_on.front());
    std::remove(model_path.c_str());
    std::remove(opt_path.c_str());
  }
}

TEST_CASE("optimizer state_dict: names, live tensors and options") {
  Run r = make_run(true);
  StateDict d = r.opt->state_dict();
  std::vector<std::string> keys;
  for (const auto& [k, t] : d) keys.push_back(k);
  CHECK(keys == std::vector<std::string>{
                    "state.0.exp_avg", "state.0.exp_avg_sq", "state.0.step", "state.1.exp_avg",
                    "state.1.exp_avg_sq", "state.1.step", "state.2.exp_avg", "state.2.exp_avg_sq",
                    "state.2.step", "state.3.exp_avg", "state.3.exp_avg_sq", "state.3.step",
                    "step", "options.lr", "options.beta1", "options.beta2", "options.eps",
                    "options.weight_decay"});
  auto& adamw = dynamic_cast<AdamW&>(*r.opt);
  CHECK(d[0].second.is_same(adamw.exp_avg(0)));  // the optimizer's own tensors
  CHECK(d[13].second.item<double>() == 0.01);
  // Options are restored with the state.
  StateDict saved = clone_dict(d);
  adamw.options.lr = 0.5;
  r.opt->load_state_dict(saved);
  CHECK(adamw.options.lr == 0.01);
}

TEST_CASE("optimizer load_state_dict: a bad dict is an error that changes nothing") {
  manual_seed(11);
  Tensor x = randn({16, 4}), y = randn({16, 1});
  Run sgd = make_run(false), adamw = make_run(true);
  train_step(sgd, x, y);
  train_step(adamw, x, y);
  auto& opt = dynamic_cast<AdamW&>(*adamw.opt);
  const StateDict before = clone_dict(opt.state_dict());
  auto unchanged = [&] {
    StateDict now = opt.state_dict();
    REQUIRE(now.size() == before.size());
    for (size_t i = 0; i < now.size(); ++i)
      CHECK(now[i].second.to_vector<double>() == before[i].second.to_vector<double>());
  };
  auto expect_error = [&](const StateDict& d, const std::string& part) {
    try {
      opt.load_state_dict(d);
      FAIL("no kiln::Error (expected one containing \"" << part << "\")");
    } catch (const Error& e) {
      INFO(e.what());
      CHECK(std::string(e.what()).find(part) != std::string::npos);
      CHECK(std::string(e.what()).find("optim_state_test.cpp") != std::string::npos);
    }
    unchanged();
  };
  SECTION("another optimizer's dict") {
    // Every missing and unexpected option is named (the first missing one alone did not say
    // the dict was another optimizer's; break-it pass).
    expect_error(sgd.opt->state_dict(),
                 "the state dict holds another optimizer's options (or none: a model's): missing "
                 "keys \"options.beta1\", \"options.beta2\", \"options.eps\"");
    expect_error(sgd.opt->state_dict(), "unexpected keys \"options.momentum\"");
  }
  SECTION("an invalid option") {
    StateDict d = clone_dict(before);
    for (auto& [k, t] : d)
      if (k == "options.beta2") t = scalar_tensor(1.5, {DType::Float64});
    expect_error(d, "invalid options: lr 0.01, betas (0.9, 1.5)");
  }
  SECTION("a step count that is not a whole number >= 0") {
    // A NaN count was loaded: step_count() gave INT64_MIN and the next step NaN parameters
    // (break-it pass).
    for (double bad : {std::nan(""), -1.5, 0.5, 1e300}) {
      INFO("step " << bad);
      for (const char* key : {"state.0.step", "step"}) {
        StateDict d = clone_dict(before);
        for (auto& [k, t] : d)
          if (k == key) t = full(t.shape(), bad, {DType::Float64});
        expect_error(d, fmt::format("\"{}\" must hold whole step counts >= 0", key));
      }
    }
  }
  SECTION("an SGD nesterov flag that is not 0 or 1") {
    auto& s = *sgd.opt;
    StateDict d = clone_dict(s.state_dict());
    for (auto& [k, t] : d)
      if (k == "options.nesterov") t = scalar_tensor(0.5, {DType::Float64});
    CHECK_THROWS_WITH(s.load_state_dict(d), Catch::Contains("options.nesterov must be 0 or 1"));
  }
  SECTION("an option given twice") {  // the second was ignored (break-it pass)
    StateDict d = clone_dict(before);
    d.emplace_back("options.lr", scalar_tensor(0.5, {DType::Float64}));
    expect_error(d, "the state dict has the key \"options.lr\" twice");
  }
  SECTION("a state tensor of the wrong shape, named with the others") {
    StateDict d = clone_dict(before);
    d[1].second = zeros({3});
    expect_error(d, "size mismatch for \"state.0.exp_avg_sq\"");
  }
  SECTION("a dict for fewer parameters") {
    StateDict d;
    for (const auto& [k, t] : before)
      if (!k.starts_with("state.3.")) d.emplace_back(k, t);
    expect_error(d, "missing keys in state dict: \"state.3.exp_avg\", \"state.3.exp_avg_sq\", "
                    "\"state.3.step\"");
  }
  SECTION("momentum into an SGD made without it") {
    auto model = std::make_shared<Sequential>(std::initializer_list<std::shared_ptr<Module>>{
        std::make_shared<Linear>(4, 8), std::make_shared<GELU>(), std::make_shared<Linear>(8, 1)});
    SGD plain(model->parameters(), {.lr = 0.1});
    CHECK_THROWS_WITH(plain.load_state_dict(sgd.opt->state_dict()),
                      Catch::Contains("this SGD was made without momentum"));
    CHECK(plain.options.momentum == 0);
    CHECK(plain.options.lr == 0.1);
  }
}
