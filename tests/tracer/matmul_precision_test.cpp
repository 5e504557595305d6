// compile() and set_float32_matmul_precision: compiled GEMMs, forward and backward, read the
// setting at each call as eager ones do, and never recompile for it. (A row-split run's GEMM
// deciding as the whole product: tests/codegen/matmul_precision_test.cpp.)
#include <catch2/catch.hpp>

#include <functional>

#include "backends/cpu/bf16_gemm.h"
#include "codegen/runtime.h"
#include "kiln/kiln.h"

using namespace kiln;

namespace {
struct PrecisionScope {  // restores the process-wide setting when the test ends
  MatmulPrecision saved = float32_matmul_precision();
  ~PrecisionScope() { set_float32_matmul_precision(saved); }
};

double max_diff(const Tensor& a, const Tensor& b) { return (a - b).abs().max().item<double>(); }

// The first replays alternate the compiled code with the region's ops on eager kernels
// (tracer/plan.cpp, kTrials): calls `f` until a call ran compiled GEMMs, and returns that one.
Tensor compiled_call(const std::function<Tensor()>& f) {
  for (int i = 0; i < 3; ++i) {
    const uint64_t before = codegen::gemm_calls();
    Tensor y = f();
    if (codegen::gemm_calls() > before) return y;
  }
  FAIL("no call ran the compiled GEMM");
  return Tensor();
}
}  // namespace

TEST_CASE("compile: float32 matmuls and their backward follow the matmul precision",
          "[compile]") {
  PrecisionScope scope;
  manual_seed(8);
  const Tensor x = randn({1024, 1024}), w = randn({1024, 256}).requires_grad_();
  auto step = [](const Tensor& x, const Tensor& w) {
    Tensor y = relu(matmul(x, w)) * 0.5;
    y.sum().backward();  // w's gradient: xᵀ · (the masked 0.5s), another float32 GEMM
    return y.detach();
  };
  auto f = compile(step);
  auto fresh = [&](auto&& fn) {  // each call starts from no gradient
    return [&] {
      w.set_grad(Tensor());
      return fn(x, w);
    };
  };
  auto run = [&](const std::function<Tensor()>& call) {
    Tensor y = call();
    return std::pair<Tensor, Tensor>(y, w.grad().clone());
  };
  set_float32_matmul_precision("highest");
  run(fresh(f));  // traced
  const auto [eager_hi, eager_hi_grad] = run(fresh(step));
  const auto [compiled_hi, compiled_hi_grad] = run([&] { return compiled_call(fresh(f)); });
  set_float32_matmul_precision("medium");
  const auto [eager_med, eager_med_grad] = run(fresh(step));
  const auto [compiled_med, compiled_med_grad] = run([&] { return compiled_call(fresh(f)); });

  const double scale = eager_hi.abs().max().item<double>();
  const double grad_scale = eager_hi_grad.abs().max().item<double>();
  CHECK(max_diff(compiled_hi, eager_hi) < 1e-5 * scale);
  CHECK(max_diff(compiled_hi_grad, eager_hi_grad) < 1e-5 * grad_scale);
  CHECK(max_diff(compiled_med, eager_med) < 1e-5 * scale);
  CHECK(max_diff(compiled_med_grad, eager_med_grad) < 1e-5 * grad_scale);
  if (cpu::bf16_gemm_available()) {
    // bfloat16 inputs: relative errors near 2^-9 per product, not float32's 2^-24.
    CHECK(max_diff(compiled_med, compiled_hi) > 1e-4 * scale);
    CHECK(max_diff(compiled_med, compiled_hi) < 3e-2 * scale);
    CHECK(max_diff(compiled_med_grad, compiled_hi_grad) > 1e-4 * grad_scale);
  } else {
    WARN("no bfloat16 GEMM kernels on this CPU: medium computed in float32");
    CHECK(max_diff(compiled_med, compiled_hi) < 1e-5 * scale);
  }
  CHECK(f.compile_count() == 1);
}

// Break-it pass: a function that set the precision itself computed at it only while traced;
// replays ran at the caller's setting (0.18 off eager's "medium" product at 256^3). Such a
// function runs eagerly, as one that reseeds the generator does.
TEST_CASE("compile: a function that changes the matmul precision itself runs eagerly",
          "[compile]") {
  PrecisionScope restore;
  set_float32_matmul_precision("highest");
  manual_seed(11);
  Tensor a = randn({256, 256}), b = randn({256, 256});
  auto step = [](const Tensor& x, const Tensor& y) {
    set_float32_matmul_precision("medium");
    Tensor r = matmul(x, y);
    set_float32_matmul_precision("highest");
    return r;
  };
  const Tensor want = step(a, b);
  CHECK(max_diff(want, matmul(a, b)) > 1e-3);  // "medium" rounds: the case can fail
  auto f = compile(step);
  for (int call = 0; call < 4; ++call) {
    INFO("call " << call);
    CHECK(max_diff(f(a, b), want) == 0);
    CHECK(float32_matmul_precision() == MatmulPrecision::Highest);
  }
  CHECK(f.explain().find("changes the float32 matmul precision") != std::string::npos);
}
