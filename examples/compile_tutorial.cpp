// The classic tutorial programs through kiln::compile: each prints its results eagerly and
// compiled, how many traces it took, and explain().
//   build/examples/compile_tutorial
#include <iostream>
#include <string>

#include "kiln/kiln.h"

using namespace kiln;

int main(int argc, char** argv) {
  if (argc > 1) {  // it takes no arguments: say so rather than ignore them
    const std::string a = argv[1];
    const bool help = a == "--help" || a == "-h";
    (help ? std::cout : std::cerr)
        << (help ? "" : "compile_tutorial: unexpected argument '" + a + "'\n")
        << "usage: compile_tutorial   (no arguments)\nRuns the classic tutorial programs "
           "eagerly and through kiln::compile and prints their results and explain().\n";
    return help ? 0 : 2;
  }
  // 1. c = a * b and its gradients.
  auto mul = compile([](const Tensor& a, const Tensor& b) { return a * b; }, {}, "mul");
  for (int call = 0; call < 2; ++call) {
    Tensor a = scalar_tensor(15.0).requires_grad_(), b = scalar_tensor(20.0).requires_grad_();
    Tensor c = mul(a, b);
    c.backward();
    fmt::print("mul (call {}): c = {}, dc/da = {}, dc/db = {}\n", call + 1, c.item<double>(),
               a.grad().item<double>(), b.grad().item<double>());
  }
  std::cout << mul.explain() << "\n";

  // 2. dynamic_computation: a data-dependent branch (a host read ends the graph segment).
  auto dynamic_computation = compile(
      [](const Tensor& x) {
        if (abs(x).item<double>() > 0) return x * x + x;
        return zeros_like(x);
      },
      {}, "dynamic_computation");
  for (int call = 0; call < 2; ++call) {
    Tensor x = scalar_tensor(2.0).requires_grad_();
    Tensor y = dynamic_computation(x);
    y.backward();
    Tensor z = dynamic_computation(scalar_tensor(0.0));
    fmt::print("dynamic_computation (call {}): f(2) = {}, grad = {}; f(0) = {}\n", call + 1,
               y.item<double>(), x.grad().item<double>(), z.item<double>());
  }
  std::cout << dynamic_computation.explain() << "\n";

  // 3. The AutoGraph example: x > 0 ? x * x : x + x.
  auto square_if_positive = compile(
      [](const Tensor& x) { return (x > 0.0).item<bool>() ? x * x : x + x; }, {},
      "square_if_positive");
  for (int call = 0; call < 2; ++call)
    fmt::print("square_if_positive (call {}): f(5) = {}, f(-3) = {}\n", call + 1,
               square_if_positive(scalar_tensor(5.0)).item<double>(),
               square_if_positive(scalar_tensor(-3.0)).item<double>());
  std::cout << square_if_positive.explain();
}
