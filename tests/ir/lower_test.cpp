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
  ir::Value x = g.input(DType::Float32, {ir::kDynamic});
  OpAttrs slice;
  slice.end = 2;
  g.output(g.op(OpKind::Slice, {x}, slice));  // slice of a `?` dim: not lowered
  g.output(g.op(OpKind::Exp, {x}));
  std::string text = codegen::lower_to_linalg(g);
  INFO(text);
  // float32 exp is expanded (lower.cpp): its roundings add 1.5 * 2^23
  CHECK(count(text, "arith.constant 0x4B400000 : f32") == 1);
  CHECK(count(text, "kiln.view \"slice\"") == 1);
}

TEST_CASE("codegen::lower_to_linalg covers the float unary and binary ops of the table") {
  for (int i = 0; i < kNumOps; ++i) {
    auto k = static_cast<OpKind>(i);
    auto c = op_info(k).category;
    if (c != OpCategory::Unary && c != OpCategory::Binary) continue;
    for (DType dt : {DType::Float32, DType::Float64}) {
      INFO(op_name(k) << " " << name(dt));
      ir::Graph g;
      std::vector<ir::Value> ins;
      for (int j = 0; j < op_info(k).arity; ++j) ins.push_back(g.input(dt, {ir::kDynamic, 3}));
      OpAttrs attrs;
      if (k == OpKind::Clamp) {
        attrs.has_low = attrs.has_high = true;
        attrs.alpha = -1.0;
        attrs.beta = 1.0;
      }
      g.output(g.op(k, ins, attrs));
      std::string text = codegen::lower_to_linalg(g);
      INFO(text);
      CHECK(count(text, "kiln.") == 0);
      CHECK(count(text, "linalg.generic") == 1);
    }
  }
}

TEST_CASE("codegen::lower_to_linalg: integer add/sub/mul/neg and int -> float promotion") {
  ir::Graph g;
  ir::Value a = g.input(DType::Int32, {4});
  ir::Value b = g.input(DType::Int64, {4});
  ir::Value s = g.op(OpKind::Sub, {g.op(OpKind::Mul, {a, b}), g.op(OpKind::Neg, {a})});
  ir::Value e = g.op(OpKind::Exp, {g.op(OpKind::Add, {s, b})});
  CHECK(g.type(e).dtype == DType::Float32);
  g.output(e);
  std::string text = codegen::lower_to_linalg(g);
  INFO(text);
  CHECK(count(text, "kiln.") == 0);
  CHECK(count(text, "linalg.generic") == 1);
  CHECK(count(text, "arith.muli") == 1);
  CHECK(count(text, "arith.extsi") >= 1);
  CHECK(count(text, "arith.sitofp") == 1);
}

TEST_CASE("codegen::lower_to_linalg: comparisons and logical ops on every dtype give i1") {
  for (OpKind k : {OpKind::Eq, OpKind::Ne, OpKind::Lt, OpKind::Le, OpKind::Gt, OpKind::Ge,
                   OpKind::LogicalAnd, OpKind::LogicalOr, OpKind::LogicalXor, OpKind::LogicalNot}) {
    for (DType dt : {DType::Bool, DType::Int32, DType::Int64, DType::Float32, DType::Float64}) {
      INFO(op_name(k) << " " << name(dt));
      ir::Graph g;
      std::vector<ir::Value> ins;
      for (int j = 0; j < op_info(k).arity; ++j) ins.push_back(g.input(dt, {5}));
      ir::Value y = g.op(k, ins);
      CHECK(g.type(y).dtype == DType::Bool);
      g.output(y);
      std::string text = codegen::lower_to_linalg(g);
      INFO(text);
      CHECK(count(text, "kiln.") == 0);
      CHECK(count(text, "-> tensor<5xi1>") >= 1);
      bool is_float = dt == DType::Float32 || dt == DType::Float64;
      // (on bools, `x != 0` folds to x, so logical ops may have no comparison left)
      if (dt != DType::Bool) CHECK(count(text, is_float ? "arith.cmpf" : "arith.cmpi") >= 1);
    }
  }
  // Mixed int32 < float32 compares in float32, like eager's compute dtype.
  ir::Graph g;
  g.output(g.op(OpKind::Lt, {g.input(DType::Int32, {3}), g.input(DType::Float32, {3})}));
  std::string text = codegen::lower_to_linalg(g);
  INFO(text);
  CHECK(count(text, "arith.sitofp") == 1);
  CHECK(count(text, "arith.cmpf olt") == 1);
}

TEST_CASE("codegen::lower_to_linalg: where selects with promotion and broadcasting") {
  ir::Graph g;
  ir::Value c = g.input(DType::Bool, {2, 1});
  ir::Value a = g.input(DType::Int32, {3});
  ir::Value x = g.input(DType::Float32, {2, 3});
  ir::Value y = g.op(OpKind::Where, {c, a, x});
  CHECK(g.type(y).dtype == DType::Float32);
  CHECK(g.type(y).shape == std::vector<int64_t>{2, 3});
  g.output(y);
  g.output(g.op(OpKind::Where, {c, a, a}));
  std::string text = codegen::lower_to_linalg(g, /*fuse=*/false);
  INFO(text);
  CHECK(count(text, "kiln.") == 0);
  CHECK(count(text, "arith.select") == 2);
  CHECK(count(text, "arith.sitofp") == 1);
}

TEST_CASE("codegen::lower_to_linalg: sum/prod/amax/amin/mean over dims, keepdim, dynamic") {
  for (OpKind k : {OpKind::Sum, OpKind::Prod, OpKind::Amax, OpKind::Amin, OpKind::Mean}) {
    for (DType dt : {DType::Int32, DType::Int64, DType::Float32, DType::Float64}) {
      if (k == OpKind::Mean && !(dt == DType::Float32 || dt == DType::Float64)) continue;
      for (bool keepdim : {false, true}) {
        INFO(op_name(k) << " " << name(dt) << " keepdim " << keepdim);
        ir::Graph g;
        ir::Value x = g.input(dt, {ir::kDynamic, 3, 4});
        OpAttrs attrs;
        attrs.dims = {0, 2};
        attrs.keepdim = keepdim;
        ir::Value y = g.op(k, {x}, attrs);
        g.output(y);
        std::string text = codegen::lower_to_linalg(g);
        INFO(text);
        CHECK(count(text, "kiln.") == 0);
        CHECK(count(text, "iterator_types = [\"reduction\", \"parallel\", \"reduction\"]") == 1);
        CHECK(count(text, "linalg.fill") == 1);
      }
    }
  }
}

TEST_CASE("codegen::lower_to_linalg decomposes every composite row of the table completely") {
  for (int i = 0; i < kNumOps; ++i) {
    auto k = static_cast<OpKind>(i);
    auto c = op_info(k).category;
    bool composite = c == OpCategory::Normalization || c == OpCategory::Loss ||
                     k == OpKind::Var || k == OpKind::Std || k == OpKind::LogSumExp;
    if (!composite) continue;
    for (DType dt : {DType::Float32, DType::Float64})
      for (int64_t n : {int64_t{5}, ir::kDynamic}) {
        INFO(op_name(k) << " " << name(dt) << " n " << n);
        ir::Graph g;
        ir::Value x = g.input(dt, {n, 7});
        OpAttrs a;
        a.dims = {1};
        std::vector<ir::Value> in = {x};
        if (k == OpKind::LayerNorm) {
          a.dims = {7};
          in = {x, g.input(dt, {7}), g.input(dt, {7})};
        } else if (k == OpKind::NllLoss) {
          in.push_back(g.input(DType::Int64, {n}));
        } else if (k == OpKind::MseLoss) {
          in.push_back(g.input(dt, {7}));
        }
        g.output(g.op(k, in, a));
        std::string text = codegen::lower_to_linalg(g);
        INFO(text);
        CHECK(count(text, "kiln.") == 0);
        CHECK(count(text, "linalg.generic") >= 1);
      }
  }
}

TEST_CASE("codegen::lower_to_linalg: to between every dtype pair is one generic of arith casts") {
  const DType all[] = {DType::Bool, DType::Int32, DType::Int64, DType::Float32, DType::Float64};
  for (DType from : all)
    for (DType to : all) {
      INFO(name(from) << " -> " << name(to));
      ir::Graph g;
      OpAttrs a;
      a.dtype = to;
      g.output(g.op(OpKind::Cast, {g.input(from, {ir::kDynamic, 3})}, a));
      std::string text = codegen::lower_to_linalg(g);
      INFO(text);
      CHECK(count(text, "kiln.") == 0);
      CHECK(count(text, "linalg.generic") == (from == to ? 0 : 1));  // same dtype: folded away
      bool f_from = from == DType::Float32 || from == DType::Float64;
      bool i_to = to == DType::Int32 || to == DType::Int64;
      // float -> int: NaN and out-of-range values select the target's minimum, as eager.
      if (f_from && i_to) CHECK(count(text, "arith.fptosi") == 1);
      if (f_from && i_to) CHECK(count(text, "arith.select") == 1);
      if (to == DType::Bool && from != DType::Bool)
        CHECK(count(text, f_from ? "arith.cmpf une" : "arith.cmpi ne") == 1);
    }
}

TEST_CASE("codegen::lower_to_linalg: one_hot compares linalg.index of the class dim") {
  ir::Graph g;
  OpAttrs c;
  c.mode = 10;
  OpAttrs f;
  f.dtype = DType::Float32;
  ir::Value oh = g.op(OpKind::OneHot, {g.input(DType::Int64, {ir::kDynamic})}, c);
  g.output(g.op(OpKind::Cast, {oh}, f));
  std::string unfused = codegen::lower_to_linalg(g, /*fuse=*/false);
  INFO(unfused);
  CHECK(count(unfused, "kiln.") == 0);
  CHECK(count(unfused, "linalg.index 1 : index") == 1);
  CHECK(count(unfused, "arith.cmpi eq") == 1);
  CHECK(count(unfused, "linalg.generic") == 2);
  std::string fused = codegen::lower_to_linalg(g);
  INFO(fused);
  CHECK(count(fused, "linalg.generic") == 1);
  CHECK(count(fused, "tensor<?x10xf32>") >= 1);
}
