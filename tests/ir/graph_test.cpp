#include <catch2/catch.hpp>

#include "core/error.h"
#include "eager/factories.h"
#include "eager/ops.h"
#include "ir/graph.h"

using namespace kiln;
using ir::kDynamic;

namespace {
bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}
}  // namespace

TEST_CASE("ir::Graph builds x*x + x with a dynamic dim and prints kiln IR") {
  ir::Graph g;
  ir::Value x = g.input(DType::Float32, {kDynamic, 4});
  ir::Value sq = g.op(OpKind::Mul, {x, x});
  ir::Value y = g.op(OpKind::Add, {sq, x});
  g.output(y);
  CHECK(g.num_inputs() == 1);
  CHECK(g.num_outputs() == 1);
  CHECK(g.type(y).dtype == DType::Float32);
  CHECK(g.type(y).shape == std::vector<int64_t>{kDynamic, 4});
  g.verify();
  std::string text = g.to_mlir();
  INFO(text);
  CHECK(contains(text, "func.func @main(%arg0: tensor<?x4xf32>) -> tensor<?x4xf32>"));
  CHECK(contains(text, "%0 = kiln.elementwise \"mul\" %arg0, %arg0 : (tensor<?x4xf32>, "
                       "tensor<?x4xf32>) -> tensor<?x4xf32>"));
  CHECK(contains(text, "%1 = kiln.elementwise \"add\" %0, %arg0 : (tensor<?x4xf32>, "
                       "tensor<?x4xf32>) -> tensor<?x4xf32>"));
  CHECK(contains(text, "return %1 : tensor<?x4xf32>"));
}

TEST_CASE("ir::Graph infers dtypes and broadcast shapes like eager") {
  ir::Graph g;
  ir::Value a = g.input(DType::Int32, {3, 1});
  ir::Value b = g.input(DType::Float64, {kDynamic});
  ir::Value c = g.op(OpKind::Mul, {a, b});
  CHECK(g.type(c).dtype == DType::Float64);
  CHECK(g.type(c).shape == std::vector<int64_t>{3, kDynamic});
  ir::Value d = g.input(DType::Float32, {kDynamic, 5});
  ir::Value e = g.op(OpKind::Add, {d, g.input(DType::Float32, {5})});
  CHECK(g.type(e).shape == std::vector<int64_t>{kDynamic, 5});
  ir::Value i = g.input(DType::Int64, {2, 3});
  ir::Value ex = g.op(OpKind::Exp, {i});
  CHECK(g.type(ex).dtype == DType::Float32);
  ir::Value lt = g.op(OpKind::Lt, {ex, i});
  CHECK(g.type(lt).dtype == DType::Bool);

  OpAttrs sum;
  sum.dims = {1};
  sum.keepdim = true;
  ir::Value s = g.op(OpKind::Sum, {i}, sum);
  CHECK(g.type(s).dtype == DType::Int64);
  CHECK(g.type(s).shape == std::vector<int64_t>{2, 1});

  ir::Value w = g.input(DType::Float32, {4, 8});
  ir::Value m = g.op(OpKind::Matmul, {g.input(DType::Float32, {kDynamic, kDynamic}), w});
  CHECK(g.type(m).shape == std::vector<int64_t>{kDynamic, 8});

  OpAttrs tr;
  tr.dim = 0;
  tr.dim1 = 1;
  ir::Value t = g.op(OpKind::Transpose, {w}, tr);
  CHECK(g.type(t).shape == std::vector<int64_t>{8, 4});
  g.output(c);
  g.output(s);
  g.output(t);
  g.verify();
  std::string text = g.to_mlir();
  INFO(text);
  CHECK(contains(text, "kiln.reduce \"sum\" %arg4 {dims = array<i64: 1>, keepdim} : "
                       "(tensor<2x3xi64>) -> tensor<2x1xi64>"));
  CHECK(contains(text, "kiln.view \"transpose\" %arg5 {dim1 = 1 : i64} : (tensor<4x8xf32>) -> "
                       "tensor<8x4xf32>"));
}

TEST_CASE("ir::Graph raises eager's error for invalid inputs") {
  std::string eager_message;
  try {
    kiln::add(kiln::zeros({2, 3}), kiln::zeros({4}));
  } catch (const Error& e) {
    eager_message = e.message();
  }
  REQUIRE(!eager_message.empty());

  ir::Graph g;
  ir::Value a = g.input(DType::Float32, {2, 3});
  ir::Value b = g.input(DType::Float32, {4});
  try {
    g.op(OpKind::Add, {a, b});
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(e.op() == "add");
    CHECK(e.message() == eager_message);
  }
  CHECK_THROWS_AS(g.op(OpKind::IndexAdd, {a, a, a}), Error);  // a float index
  try {  // cat's shapes, checked as eager checks them
    g.op(OpKind::Cat, {a, b});
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(e.op() == "cat");
  }
  CHECK_THROWS_AS(g.op(OpKind::Add, {a, ir::Value{}}), Error);
}

TEST_CASE("ir::Graph::simplify merges duplicates and drops dead ops") {
  ir::Graph g;
  ir::Value x = g.input(DType::Float32, {kDynamic});
  ir::Value p = g.op(OpKind::Mul, {x, x});
  ir::Value q = g.op(OpKind::Mul, {x, x});
  g.op(OpKind::Exp, {p});  // dead
  g.output(g.op(OpKind::Add, {p, q}));
  g.simplify();
  g.verify();
  std::string text = g.to_mlir();
  INFO(text);
  size_t muls = 0;
  for (size_t pos = text.find("\"mul\""); pos != std::string::npos;
       pos = text.find("\"mul\"", pos + 1))
    ++muls;
  CHECK(muls == 1);
  CHECK(!contains(text, "\"exp\""));
  CHECK(contains(text, "kiln.elementwise \"add\" %0, %0"));
}

TEST_CASE("ir::Graph: every elementwise op of the table builds and verifies, static and dynamic") {
  for (int i = 0; i < kNumOps; ++i) {
    auto k = static_cast<OpKind>(i);
    auto c = op_info(k).category;
    if (c != OpCategory::Unary && c != OpCategory::Binary && c != OpCategory::Ternary) continue;
    for (bool dynamic : {false, true}) {
      INFO(op_name(k) << (dynamic ? " dynamic" : " static"));
      ir::Graph g;
      std::vector<int64_t> shape = {dynamic ? kDynamic : 2, 3};
      std::vector<ir::Value> ins;
      for (int j = 0; j < op_info(k).arity; ++j) {
        bool is_bool = (k == OpKind::Where && j == 0) || k == OpKind::LogicalNot ||
                       k == OpKind::LogicalAnd || k == OpKind::LogicalOr ||
                       k == OpKind::LogicalXor;
        ins.push_back(g.input(is_bool ? DType::Bool : DType::Float32, shape));
      }
      OpAttrs attrs;
      if (k == OpKind::Clamp) {
        attrs.has_low = true;
        attrs.alpha = 0.0;
      }
      ir::Value y = g.op(k, ins, attrs);
      g.output(y);
      CHECK(g.type(y).shape == shape);
      CHECK_NOTHROW(g.verify());
    }
  }
}

TEST_CASE("ir::Graph: composite ops (normalization, loss) build and verify, static and dynamic") {
  for (bool dynamic : {false, true}) {
    INFO((dynamic ? "dynamic" : "static"));
    ir::Graph g;
    int64_t n = dynamic ? kDynamic : 4;
    ir::Value x = g.input(DType::Float32, {n, 6});
    ir::Value t = g.input(DType::Int64, {n});
    ir::Value w = g.input(DType::Float32, {6});
    OpAttrs last;
    last.dim = -1;
    ir::Value sm = g.op(OpKind::Softmax, {x}, last);
    ir::Value ls = g.op(OpKind::LogSoftmax, {x}, last);
    OpAttrs ln;
    ln.dims = {6};
    ln.eps = 1e-3;
    ir::Value y0 = g.op(OpKind::LayerNorm, {x}, ln);
    ir::Value y1 = g.op(OpKind::LayerNorm, {x, w}, ln);
    ir::Value y2 = g.op(OpKind::LayerNorm, {x, ir::Value{}, w}, ln);  // bias only
    OpAttrs mean;
    mean.mode = 1;
    ir::Value nll = g.op(OpKind::NllLoss, {ls, t}, mean);
    ir::Value mse = g.op(OpKind::MseLoss, {sm, x});  // reduction none
    for (ir::Value v : {sm, ls, y0, y1, y2, mse}) {
      CHECK(g.type(v).shape == std::vector<int64_t>{n, 6});
      CHECK(g.type(v).dtype == DType::Float32);
      g.output(v);
    }
    CHECK(g.type(nll).shape.empty());
    g.output(nll);
    CHECK_NOTHROW(g.verify());
    std::string text = g.to_mlir();
    INFO(text);
    CHECK(contains(text, "kiln.composite \"softmax\" %arg0 {dim = -1 : i64}"));
    CHECK(contains(text, "{dims = array<i64: 6>, eps = 1.000000e-03 : f64}"));
    // The absent weight of the bias-only layer_norm is a ones constant (exact: y * 1 == y).
    CHECK(contains(text, "kiln.constant dense<1.000000e+00> : tensor<6xf32>"));
    CHECK(contains(text, "kiln.composite \"nll_loss\" %1, %arg1 {mode = 1 : i64}"));
  }
}

TEST_CASE("ir::Graph: composite ops raise eager's errors") {
  std::string eager_message;
  try {
    kiln::layer_norm(kiln::zeros({2, 8}), {4});
  } catch (const Error& e) {
    eager_message = e.message();
  }
  REQUIRE(!eager_message.empty());
  ir::Graph g;
  ir::Value x = g.input(DType::Float32, {2, 8});
  OpAttrs ln;
  ln.dims = {4};
  try {
    g.op(OpKind::LayerNorm, {x}, ln);
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(e.op() == "layer_norm");
    CHECK(e.message() == eager_message);
  }
  OpAttrs bad_dim;
  bad_dim.dim = 2;
  CHECK_THROWS_AS(g.op(OpKind::Softmax, {x}, bad_dim), Error);
  CHECK_THROWS_AS(g.op(OpKind::NllLoss, {x, x}), Error);  // float target
}

TEST_CASE("ir::Graph: to (every dtype pair) and one_hot build, verify and round-trip their attrs") {
  const DType all[] = {DType::Bool, DType::Int32, DType::Int64, DType::Float32, DType::Float64};
  for (bool dynamic : {false, true})
    for (DType from : all)
      for (DType to : all) {
        INFO(name(from) << " -> " << name(to) << (dynamic ? " dynamic" : ""));
        ir::Graph g;
        std::vector<int64_t> shape = {dynamic ? kDynamic : 2, 3};
        OpAttrs a;
        a.dtype = to;
        ir::Value y = g.op(OpKind::Cast, {g.input(from, shape)}, a);
        g.output(y);
        CHECK(g.type(y).dtype == to);
        CHECK(g.type(y).shape == shape);
        CHECK_NOTHROW(g.verify());
      }
  ir::Graph g;
  OpAttrs a;
  a.dtype = DType::Float64;
  g.output(g.op(OpKind::Cast, {g.input(DType::Int32, {3})}, a));
  OpAttrs c;
  c.mode = 7;  // num_classes
  ir::Value oh = g.op(OpKind::OneHot, {g.input(DType::Int64, {kDynamic, 2})}, c);
  CHECK(g.type(oh).dtype == DType::Int64);
  CHECK(g.type(oh).shape == std::vector<int64_t>{kDynamic, 2, 7});
  g.output(oh);
  CHECK_NOTHROW(g.verify());
  std::string text = g.to_mlir();
  INFO(text);
  CHECK(contains(text, "kiln.elementwise \"to\" %arg0 {dtype = f64} : (tensor<3xi32>) -> tensor<3xf64>"));
  CHECK(contains(text, "kiln.index \"one_hot\" %arg1 {mode = 7 : i64} : (tensor<?x2xi64>) -> tensor<?x2x7xi64>"));
  CHECK(ir::supports(OpKind::Cast));
  CHECK(ir::supports(OpKind::OneHot));
  CHECK(ir::supports(OpKind::Gather));
  CHECK(ir::supports(OpKind::Tril));
  CHECK(ir::supports(OpKind::ScatterAdd));
  CHECK(ir::supports(OpKind::IndexAdd));
  // The Random rows drawn from a key operand; dropout itself is x times its mask.
  CHECK(ir::supports(OpKind::Normal));
  CHECK(ir::supports(OpKind::DropoutMask));
  CHECK_FALSE(ir::supports(OpKind::Dropout));
}

TEST_CASE("ir::Graph: one_hot raises eager's errors") {
  std::string eager_message;
  try {
    kiln::one_hot(kiln::zeros({3}, DType::Int32), 4);
  } catch (const Error& e) {
    eager_message = e.message();
  }
  REQUIRE(!eager_message.empty());
  ir::Graph g;
  OpAttrs c;
  c.mode = 4;
  try {
    g.op(OpKind::OneHot, {g.input(DType::Int32, {3})}, c);
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(e.op() == "one_hot");
    CHECK(e.message() == eager_message);
  }
  c.mode = 0;
  CHECK_THROWS_AS(g.op(OpKind::OneHot, {g.input(DType::Int64, {3})}, c), Error);
}
