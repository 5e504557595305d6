// compile() and set_float32_matmul_precision: compiled GEMMs read the setting at each call, as
// eager ones do, so changing it neither recompiles nor makes compiled and eager disagree.
#include <catch2/catch.hpp>

#include "backends/cpu/bf16_gemm.h"
#include "kiln/kiln.h"

using namespace kiln;

namespace {
struct PrecisionScope {  // restores the process-wide setting when the test ends
  MatmulPrecision saved = float32_matmul_precision();
  ~PrecisionScope() { set_float32_matmul_precision(saved); }
};

double max_diff(const Tensor& a, const Tensor& b) { return (a - b).abs().max().item<double>(); }
}  // namespace

TEST_CASE("compile: float32 matmuls follow the matmul precision at every call, no recompile",
          "[compile]") {
  PrecisionScope scope;
  manual_seed(7);
  // 537 MFLOP forward: above kBf16GemmMinFlops whole and in any row block of a split run.
  const Tensor x = randn({1024, 1024}), w = randn({1024, 256}).requires_grad_();
  auto step = [](const Tensor& x, const Tensor& w) {
    Tensor y = relu(matmul(x, w)) * 0.5;
    y.sum().backward();  // w's gradient: xᵀ · (the masked 0.5s), another float32 GEMM
    return y;
  };
  auto f = compile(step);
  auto run = [&](auto&& fn) {
    w.set_grad(Tensor());  // each call starts from no gradient
    Tensor y = fn(x, w);
    return std::pair<Tensor, Tensor>(y.detach(), w.grad().clone());
  };
  set_float32_matmul_precision("highest");
  const auto [eager_hi, eager_hi_grad] = run(step);
  const auto [compiled_hi, compiled_hi_grad] = run(f);
  set_float32_matmul_precision("medium");
  const auto [eager_med, eager_med_grad] = run(step);
  const auto [compiled_med, compiled_med_grad] = run(f);
  set_float32_matmul_precision("highest");
  const auto [compiled_hi2, compiled_hi2_grad] = run(f);

  const double scale = eager_hi.abs().max().item<double>();
  CHECK(max_diff(compiled_hi, eager_hi) < 1e-5 * scale);
  CHECK(max_diff(compiled_med, eager_med) < 1e-5 * scale);
  CHECK(max_diff(compiled_med_grad, eager_med_grad) < 1e-5 * eager_hi_grad.abs().max().item<double>());
  CHECK(max_diff(compiled_hi2, eager_hi) < 1e-5 * scale);
  if (cpu::bf16_gemm_available()) {
    // bfloat16 inputs: relative errors near 2^-9 per product, not float32's 2^-24.
    CHECK(max_diff(compiled_med, compiled_hi) > 1e-4 * scale);
    CHECK(max_diff(compiled_med, compiled_hi) < 3e-2 * scale);
  } else {
    WARN("no bfloat16 GEMM kernels on this CPU: medium computed in float32");
    CHECK(max_diff(compiled_med, compiled_hi) < 1e-5 * scale);
  }
  CHECK(f.compile_count() == 1);
}
