// compile() with donate_buffers: the compiled code computes a training step's new parameters
// and optimizer moments in their own buffers (codegen's in-place outputs), as eager's in-place
// updates do, and leaves them as they were when the step raises.
#include <catch2/catch.hpp>

#include "codegen/codegen.h"
#include "kiln/kiln.h"
#include "kiln/nn.h"
#include "nn/optim.h"
#include "tracer/util.h"

using namespace kiln;
using kiln::testing::contains;

namespace {

double max_abs_diff(const Tensor& a, const Tensor& b) {
  return amax(abs(sub(a.to(DType::Float64), b.to(DType::Float64)))).item<double>();
}

struct Model {
  std::shared_ptr<nn::Linear> fc = std::make_shared<nn::Linear>(8, 4);
  std::shared_ptr<nn::AdamW> opt =
      std::make_shared<nn::AdamW>(fc->parameters(), nn::AdamWOptions{.lr = 0.05});
  std::function<Tensor(const Tensor&, const Tensor&)> step() {
    return [fc = fc, opt = opt](const Tensor& x, const Tensor& y) {
      opt->zero_grad();
      Tensor loss = cross_entropy(fc->forward(x), y);
      loss.backward();
      opt->step();
      return loss.detach();
    };
  }
  // The same starting weights as `other`.
  void copy_parameters(const Model& other) {
    NoGradGuard no_grad;
    for (size_t i = 0; i < fc->parameters().size(); ++i)
      fc->parameters()[i].copy_(other.fc->parameters()[i]);
  }
};

Tensor targets(std::vector<int64_t> v) { return from_vector(v, {static_cast<int64_t>(v.size())}); }

}  // namespace

TEST_CASE("compile(donate_buffers): an AdamW step updates parameters and moments in their own "
          "buffers, as eager does", "[compile][donate]") {
  manual_seed(3);
  Model eager, compiled;
  compiled.copy_parameters(eager);
  auto eager_step = eager.step();
  auto compiled_step = compile(compiled.step(), CompileOptions{.donate_buffers = true});
  Tensor x = randn({6, 8}), y = targets({0, 1, 2, 3, 1, 2});
  Tensor weight = compiled.fc->parameters()[0];
  Tensor bias = compiled.fc->parameters()[1];  // no views: the adopt path would replace it
  const void* weight_data = weight.raw_data();
  const void* bias_data = bias.raw_data();
  Tensor weight_t = weight.t();  // a view the caller holds: sees each update, as in eager
  for (int call = 0; call < 6; ++call) {
    INFO("call " << call);
    Tensor le = eager_step(x, y), lc = compiled_step(x, y);
    CHECK(std::abs(lc.item<float>() - le.item<float>()) <= 1e-6 * std::abs(le.item<float>()));
    for (size_t i = 0; i < eager.fc->parameters().size(); ++i) {
      CHECK(max_abs_diff(compiled.fc->parameters()[i], eager.fc->parameters()[i]) < 1e-6);
      CHECK(max_abs_diff(compiled.opt->exp_avg(i), eager.opt->exp_avg(i)) < 1e-6);
      CHECK(max_abs_diff(compiled.opt->exp_avg_sq(i), eager.opt->exp_avg_sq(i)) < 1e-6);
    }
    CHECK(weight.raw_data() == weight_data);  // a buffer with a view is never replaced
    CHECK(max_abs_diff(weight_t, weight.t()) == 0);
  }
  CHECK(compiled_step.compile_count() == 1);
  // CPU code only: the GPU loop rewrites (KILN_EMULATE_GPU_LOOPS) keep separate outputs.
  if (codegen::gpu_loop_emulation({}) != codegen::GpuLoopEmulation::Off) return;
  // The weight and bias, and each one's two moments and step count: 8 results in place.
  const std::string explain = compiled_step.explain();
  INFO(explain);
  CHECK(contains(explain, "8 result(s) computed in their tensors' buffers (donated)"));
  // Once the region's measured choice is its compiled code (its first runs alternate with eager
  // kernels, whose new values are given to the tensors as their buffers instead), the bias,
  // which has no views, keeps its buffer too.
  for (int call = 0; call < 10; ++call) compiled_step(x, y);
  if (contains(compiled_step.explain(), "runs compiled")) {
    bias_data = bias.raw_data();
    for (int call = 0; call < 3; ++call) compiled_step(x, y);
    CHECK(bias.raw_data() == bias_data);
  }
}

TEST_CASE("compile(donate_buffers): a step that raises on a bad target leaves the parameters "
          "and optimizer state as they were", "[compile][donate]") {
  manual_seed(4);
  Model m;
  auto step = compile(m.step(), CompileOptions{.donate_buffers = true});
  Tensor x = randn({4, 8});
  // Past the region's measured choice between its compiled code and eager kernels (4 runs),
  // so the raising call runs the choice (explain() says which; compiled here so far).
  for (int call = 0; call < 10; ++call) step(x, targets({0, 1, 2, 3}));
  INFO(step.explain());
  std::vector<Tensor> before;
  for (size_t i = 0; i < m.fc->parameters().size(); ++i) {
    before.push_back(m.fc->parameters()[i].clone());
    before.push_back(m.opt->exp_avg(i).clone());
    before.push_back(m.opt->exp_avg_sq(i).clone());
  }
  // Class 4 of 4 classes: eager's nll_loss raises before the optimizer runs.
  CHECK_THROWS_WITH(step(x, targets({0, 1, 4, 3})), Catch::Contains("target 4 is out of bounds"));
  for (size_t i = 0; i < m.fc->parameters().size(); ++i) {
    INFO("parameter " << i);
    CHECK(max_abs_diff(m.fc->parameters()[i], before[3 * i]) == 0);
    CHECK(max_abs_diff(m.opt->exp_avg(i), before[3 * i + 1]) == 0);
    CHECK(max_abs_diff(m.opt->exp_avg_sq(i), before[3 * i + 2]) == 0);
  }
}

TEST_CASE("compile(donate_buffers, check): the eager comparison sees the in-place updates",
          "[compile][donate]") {
  // check = true runs each call eagerly too, from the same state: the compiled run writing the
  // parameters in place must leave the journal able to give that state back.
  manual_seed(5);
  Model eager, checked;
  checked.copy_parameters(eager);
  auto eager_step = eager.step();
  auto step = compile(checked.step(), CompileOptions{.check = true, .atol = 1e-5,
                                                     .donate_buffers = true});
  Tensor x = randn({5, 8}), y = targets({3, 2, 1, 0, 3});
  for (int call = 0; call < 12; ++call) {
    INFO("call " << call);
    Tensor le = eager_step(x, y), lc = step(x, y);  // raises if compiled and eager differ
    CHECK(std::abs(lc.item<float>() - le.item<float>()) <= 1e-5);
    for (size_t i = 0; i < eager.fc->parameters().size(); ++i)
      CHECK(max_abs_diff(checked.fc->parameters()[i], eager.fc->parameters()[i]) < 1e-5);
  }
}

TEST_CASE("compile(donate_buffers): an elementwise update of a captured tensor, in row blocks, "
          "is computed in its buffer", "[compile][donate]") {
  // w.mul_(0.9).add_(g) over 1 MiB: the region is row-parallel, w sliced by rows.
  manual_seed(6);
  Tensor w = randn({512, 512}), reference = w.clone();
  auto f = compile([&](const Tensor& g) {
    w.mul_(0.9).add_(g);
    return g * 2.0;
  }, CompileOptions{.donate_buffers = true});
  const void* data = w.raw_data();
  for (int call = 0; call < 12; ++call) {
    INFO("call " << call);
    Tensor g = randn({512, 512});
    f(g);
    reference.mul_(0.9).add_(g);
    CHECK(max_abs_diff(w, reference) < 1e-5);
  }
  if (codegen::gpu_loop_emulation({}) != codegen::GpuLoopEmulation::Off) return;
  const std::string explain = f.explain();
  INFO(explain);
  CHECK(contains(explain, "1 result(s) computed in their tensors' buffers (donated)"));
  if (contains(explain, "runs compiled")) {
    data = w.raw_data();
    for (int call = 0; call < 3; ++call) f(randn({512, 512}));
    CHECK(w.raw_data() == data);
  }
}

TEST_CASE("compile: a leaf updated in place before backward() inside the function replays, "
          "donated or not", "[compile][autograd]") {
  // Found by a break-it pass: the guard "the .grad backward sets is undefined at the call" was
  // recorded on w's value after w.mul_(2), which a replay computes only later: with
  // donate_buffers every replay raised an internal error, without it every call ran eagerly.
  for (bool donate : {false, true}) {
    INFO("donate_buffers " << donate);
    Tensor w = ones({3}).requires_grad_();
    CompileOptions o;
    o.donate_buffers = donate;
    auto f = compile(
        [&](const Tensor& x) {
          {
            NoGradGuard no_grad;
            w.mul_(2.0);
          }
          Tensor loss = (w * w * x).sum();
          loss.backward();
          return loss.detach();
        },
        o, "update_then_backward");
    for (int call = 1; call <= 4; ++call) {
      INFO("call " << call);
      w.set_grad(Tensor());
      const float k = std::ldexp(1.0f, call);  // w = 2^call
      CHECK(f(ones({3})).item<float>() == 3 * k * k);
      CHECK(w.to_vector<float>() == std::vector<float>(3, k));
      CHECK(w.grad().to_vector<float>() == std::vector<float>(3, 2 * k));
    }
    CHECK(contains(f.explain(), "3 replay(s)"));
  }
}
