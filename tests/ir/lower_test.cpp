#include <catch2/catch.hpp>

#include "codegen/codegen.h"

using namespace kiln;

namespace {
size_t count(const std::string& text, const std::string& part) {
  size_t n = 0;
  for (size_t p = text.find(part); p != std::string::npos; p = text.find(part, p + 1)) ++n;
  return n;
}
}  // namespace

TEST_CASE("codegen::lower_to_linalg: x*x + x, then tanh, becomes one fused linalg.generic") {
  ir::Graph g;
  ir::Value x = g.input(DType::Float32, {ir::kDynamic});
  ir::Value y = g.op(OpKind::Add, {g.op(OpKind::Mul, {x, x}), x});
  g.output(g.op(OpKind::Tanh, {y}));

  std::string unfused = codegen::lower_to_linalg(g, /*fuse=*/false);
  INFO(unfused);
  CHECK(count(unfused, "linalg.generic") == 3);
  CHECK(count(unfused, "kiln.") == 0);

  std::string fused = codegen::lower_to_linalg(g);
  INFO(fused);
  CHECK(count(fused, "linalg.generic") == 1);
  CHECK(count(fused, "arith.mulf") == 1);
  CHECK(count(fused, "arith.addf") == 1);
  CHECK(count(fused, "math.tanh") == 1);
  // The graph itself still holds kiln ops.
  CHECK(count(g.to_mlir(), "kiln.elementwise") == 3);
}

TEST_CASE("codegen::lower_to_linalg keeps kinds without a lowering as kiln ops") {
  ir::Graph g;
  ir::Value x = g.input(DType::Float32, {4});
  g.output(g.op(OpKind::Sigmoid, {g.op(OpKind::Exp, {x})}));
  std::string text = codegen::lower_to_linalg(g);
  INFO(text);
  CHECK(count(text, "math.exp") == 1);
  CHECK(count(text, "kiln.elementwise \"sigmoid\"") == 1);
}
