// CompileOptions::check and kiln::compare on functions that change state the caller holds: a
// training step's parameters, optimizer state and .grad (tracer::StateJournal). Found by a
// fresh-user trial: check ran the step up to 3 times per call and raised a false divergence;
// compare() let its compiled run read parameters the eager run had already updated.
#include <catch2/catch.hpp>

#include <cstring>

#include "kiln/kiln.h"
#include "kiln/nn.h"

using namespace kiln;

namespace {

std::vector<float> vec(const Tensor& t) { return t.detach().contiguous().to_vector<float>(); }

// A model, its optimizer and one training step on fixed data, all deterministic.
struct Trainer {
  nn::Linear lin{3, 2};
  nn::AdamW opt;
  Tensor x = arange(12, DType::Float32).view({4, 3}) * 0.1 - 0.5;
  Trainer() : opt(lin.parameters(), nn::AdamWOptions{.lr = 0.1}) {
    NoGradGuard ng;
    lin.weight.copy_(arange(6, DType::Float32).view({2, 3}) * 0.2 - 0.5);
    lin.bias.copy_(tensor({0.25f, -0.75f}));
  }
  Tensor step(const Tensor& in) {
    opt.zero_grad();
    Tensor y = lin(in);
    Tensor loss = (y * y).sum();
    loss.backward();
    opt.step();
    return loss;
  }
};

}  // namespace

TEST_CASE("check = true on a training step: one step per call, checked state, eager's values",
          "[compile]") {
  Trainer eager, checked;
  int runs = 0;
  auto step = compile([&](const Tensor& in) { ++runs; return checked.step(in); }, {.check = true});
  for (int k = 0; k < 4; ++k) {
    Tensor le = eager.step(eager.x);
    Tensor lc = step(checked.x);
    CHECK(lc.item<float>() == Approx(le.item<float>()).epsilon(1e-6));
    std::vector<float> we = vec(eager.lin.weight), wc = vec(checked.lin.weight);
    for (size_t i = 0; i < we.size(); ++i) CHECK(wc[i] == Approx(we[i]).epsilon(1e-6));
    std::vector<float> ge = vec(eager.lin.bias.grad()), gc = vec(checked.lin.bias.grad());
    for (size_t i = 0; i < ge.size(); ++i) CHECK(gc[i] == Approx(ge[i]).epsilon(1e-6));
    CHECK(checked.opt.step_count() == k + 1);
  }
  // The host function ran for eager's reference every call, and once more to trace.
  CHECK(runs == 5);
}

TEST_CASE("compare() on a training step matches and leaves the state as it found it",
          "[compile]") {
  Trainer t;
  t.step(t.x);  // .grad and the optimizer's moments exist
  std::vector<float> w = vec(t.lin.weight), g = vec(t.lin.weight.grad());
  CompareReport r = kiln::compare([&](const Tensor& in) { return t.step(in); }, t.x);
  INFO(r.str());
  CHECK(r.ok);
  CHECK(r.first_divergence.empty());
  CHECK(vec(t.lin.weight) == w);
  CHECK(vec(t.lin.weight.grad()) == g);
  CHECK(t.opt.step_count() == 1);
}

TEST_CASE("check = true reports state that compiled code leaves different, and undoes the call",
          "[compile]") {
  // A raw write through data<T>() is not recorded (README): eager's run makes it, a replay
  // does not, so the parameter differs while the loss agrees.
  Trainer t;
  auto step = compile([&](const Tensor& in) {
    Tensor loss = t.step(in);
    t.lin.bias.data<float>()[0] += 1.0f;
    return loss;
  }, {.check = true});
  step(t.x);  // traced: the trace run made the raw write too
  std::vector<float> w = vec(t.lin.weight), b = vec(t.lin.bias);
  try {
    step(t.x);
    FAIL("no error");
  } catch (const Error& e) {
    CHECK_THAT(e.what(), Catch::Contains("check: the tensor written at") &&
                             Catch::Contains("check_state_test.cpp") &&
                             Catch::Contains("differs from eager"));
  }
  CHECK(vec(t.lin.weight) == w);  // the failed call had no effect
  CHECK(vec(t.lin.bias) == b);
  CHECK(t.opt.step_count() == 1);
}
