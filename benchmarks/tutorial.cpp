// Suite tutorial: the classic tutorial programs, eagerly and through kiln::compile —
//  * mul_grad: c = a * b at a = 15, b = 20, then c.backward() (300; grads 20 and 15);
//  * dynamic_computation: |x| > 0 ? x*x + x : 0 at 2.0 (6, grad 5) and at 0.0 (0) — a
//    data-dependent branch, so the compiled function is a trace tree with one branch per value;
//  * square_if_positive: x > 0 ? x*x : x+x (AutoGraph's example) at 5 (25) and at -3 (-6).
// Each case times one call of the program in each mode (µs per call); the summary prints the
// results of both modes, the number of traces and recompiles, and explain().
#include <memory>

#include <fmt/format.h>

#include "benchmarks/harness.h"
#include "kiln/kiln.h"

namespace kiln::bench {
namespace {

constexpr char kSuite[] = "tutorial";

struct Results {
  double c = 0, ga = 0, gb = 0;  // mul_grad
  double d2 = 0, dgrad = 0, d0 = 0;  // dynamic_computation
  double s5 = 0, sm3 = 0;  // square_if_positive
};

Tensor mul(const Tensor& a, const Tensor& b) { return a * b; }
Tensor dynamic_computation(const Tensor& x) {
  if (abs(x).item<double>() > 0) return x * x + x;
  return zeros_like(x);
}
Tensor square_if_positive(const Tensor& x) { return (x > 0.0).item<bool>() ? x * x : x + x; }

// The programs through one set of functions (eager: plain calls; compiled: kiln::compile).
template <class Mul, class Dyn, class Sq> struct Programs {
  Mul mul_fn;
  Dyn dyn_fn;
  Sq sq_fn;
  Results run() {
    Results r;
    Tensor a = scalar_tensor(15.0).requires_grad_(), b = scalar_tensor(20.0).requires_grad_();
    Tensor c = mul_fn(a, b);
    c.backward();
    r.c = c.item<double>(), r.ga = a.grad().item<double>(), r.gb = b.grad().item<double>();
    Tensor x = scalar_tensor(2.0).requires_grad_();
    Tensor y = dyn_fn(x);
    y.backward();
    r.d2 = y.item<double>(), r.dgrad = x.grad().item<double>();
    r.d0 = Tensor(dyn_fn(scalar_tensor(0.0).requires_grad_())).item<double>();
    r.s5 = Tensor(sq_fn(scalar_tensor(5.0))).item<double>();
    r.sm3 = Tensor(sq_fn(scalar_tensor(-3.0))).item<double>();
    return r;
  }
};

auto eager_programs() {
  return Programs<decltype(&mul), decltype(&dynamic_computation), decltype(&square_if_positive)>{
      &mul, &dynamic_computation, &square_if_positive};
}

auto compiled_programs() {
  auto m = kiln::compile(mul, {}, "mul_grad");
  auto d = kiln::compile(dynamic_computation, {}, "dynamic_computation");
  auto s = kiln::compile(square_if_positive, {}, "square_if_positive");
  return Programs<decltype(m), decltype(d), decltype(s)>{m, d, s};
}

// Kept for the summary: the compiled functions the timed cases used, and both modes' results.
struct State {
  decltype(compiled_programs()) compiled = compiled_programs();
  Results eager, compiled_results;
};
std::shared_ptr<State>& state() {
  static std::shared_ptr<State> s;
  return s;
}

Benchmark eager_case(const RunConfig&) {
  if (!state()) state() = std::make_shared<State>();
  auto p = eager_programs();
  state()->eager = p.run();
  return {[p]() mutable { do_not_optimize(p.run()); }, [](double s) { return s * 1e6; }};
}

Benchmark compiled_case(const RunConfig&) {
  if (!state()) state() = std::make_shared<State>();
  auto st = state();
  st->compiled_results = st->compiled.run();  // traces each program (and branch) once
  return {[st] { do_not_optimize(st->compiled.run()); }, [](double s) { return s * 1e6; }};
}

std::vector<Case> cases() {
  return {{"tutorial_programs", Mode::Eager, "us", eager_case},
          {"tutorial_programs", Mode::Compiled, "us", compiled_case}};
}

void summary(std::span<const Record>) {
  auto st = state();
  if (!st) return;
  const Results& e = st->eager;
  const Results& c = st->compiled_results;
  fmt::print("\ntutorial programs (eager | compiled):\n");
  fmt::print("  c = a * b                 {} | {}   dc/da {} | {}   dc/db {} | {}\n", e.c, c.c,
             e.ga, c.ga, e.gb, c.gb);
  fmt::print("  dynamic_computation(2.0)  {} | {}   grad {} | {}\n", e.d2, c.d2, e.dgrad, c.dgrad);
  fmt::print("  dynamic_computation(0.0)  {} | {}\n", e.d0, c.d0);
  fmt::print("  square_if_positive(5)     {} | {}\n", e.s5, c.s5);
  fmt::print("  square_if_positive(-3)    {} | {}\n", e.sm3, c.sm3);
  bool same = e.c == c.c && e.ga == c.ga && e.gb == c.gb && e.d2 == c.d2 && e.dgrad == c.dgrad &&
              e.d0 == c.d0 && e.s5 == c.s5 && e.sm3 == c.sm3;
  fmt::print("  compiled results {} eager's\n", same ? "equal" : "DIFFER from");
  auto& p = st->compiled;
  fmt::print("  traces (graphs compiled): mul_grad {}, dynamic_computation {}, square_if_positive {}\n\n",
             p.mul_fn.compile_count(), p.dyn_fn.compile_count(), p.sq_fn.compile_count());
  fmt::print("{}\n{}\n{}", p.mul_fn.explain(), p.dyn_fn.explain(), p.sq_fn.explain());
}

[[maybe_unused]] const bool registered = register_suite(
    {kSuite, "tutorial programs (multiplication + grads, data-dependent branches) eager vs compiled",
     cases, summary});

}  // namespace
}  // namespace kiln::bench
