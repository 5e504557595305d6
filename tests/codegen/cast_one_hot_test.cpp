// codegen::Executable for `to` (Cast) and one_hot against eager mode: every dtype pair of the
// cast on the values where conversions differ (±0, ±inf, NaN, out-of-range and fractional
// negative floats, the integer limits), one_hot on static, dynamic and 0-d indices, and both
// fusing with their elementwise neighbours into one loop nest.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "codegen/codegen.h"
#include "kiln/kiln.h"

using namespace kiln;

namespace {

const DType kAll[] = {DType::Bool, DType::Int32, DType::Int64, DType::Float32, DType::Float64};

/// Values that exercise a conversion from `dt`.
Tensor cast_inputs(DType dt) {
  const double inf = std::numeric_limits<double>::infinity();
  switch (dt) {
    case DType::Bool: return from_vector<bool>({false, true, true, false}, Shape{4});
    case DType::Int32:
      return from_vector<int32_t>({0, 1, -1, 7, -13, INT32_MAX, INT32_MIN, 16777217, -16777217, 255, 256},
                                  Shape{11});
    case DType::Int64:
      return from_vector<int64_t>({0, 1, -1, INT64_MAX, INT64_MIN, int64_t{1} << 31, -(int64_t{1} << 31) - 1,
                                   (int64_t{1} << 32) + 5, (int64_t{1} << 53) + 1, -3000000000LL, 4294967295LL},
                                  Shape{11});
    default: {
      std::vector<double> v = {0.0, -0.0, 1.0, -1.0, 0.7, -0.7, 1.5, -1.5, -2.5, 2.999, -7.99,
                               inf, -inf, NAN, -NAN, 1e10, -1e10, 3e9, -3e9, 2147483520.0,
                               -2147483648.0, 2147483648.0, 9.2233715e18, -9.2233720368547758e18,
                               9.2233720368547758e18, 16777217.0, 1e-40, -1e-40, 3e38, -3e38};
      if (dt == DType::Float64)  // only representable in float64
        for (double x : {2147483647.0, 2147483647.9, -2147483648.9, -2147483649.0, 1e300, -1e300, 1e-310,
                         0.1, 4503599627370497.0})
          v.push_back(x);
      if (dt == DType::Float64) return from_vector<double>(v, Shape{static_cast<int64_t>(v.size())});
      std::vector<float> f(v.begin(), v.end());
      return from_vector<float>(f, Shape{static_cast<int64_t>(f.size())});
    }
  }
}

/// "" when equal bit for bit (NaNs: both NaN), else the first difference.
std::string bit_mismatch(const Tensor& got, const Tensor& want) {
  if (got.dtype() != want.dtype()) return "dtype " + std::string(name(got.dtype()));
  if (!(got.shape() == want.shape())) return "shape " + to_string(got.shape());
  Tensor g = got.contiguous(), w = want.contiguous();
  size_t size = itemsize(g.dtype());
  const char* pg = static_cast<const char*>(g.raw_data());
  const char* pw = static_cast<const char*>(w.raw_data());
  for (int64_t i = 0; i < g.numel(); ++i) {
    const char* a = pg + i * size;
    const char* b = pw + i * size;
    if (std::memcmp(a, b, size) == 0) continue;
    if (g.dtype() == DType::Float32) {
      float x, y;
      std::memcpy(&x, a, 4), std::memcpy(&y, b, 4);
      if (std::isnan(x) && std::isnan(y)) continue;
    } else if (g.dtype() == DType::Float64) {
      double x, y;
      std::memcpy(&x, a, 8), std::memcpy(&y, b, 8);
      if (std::isnan(x) && std::isnan(y)) continue;
    } else if (g.dtype() == DType::Bool && (*a != 0) == (*b != 0)) {
      continue;
    }
    Tensor gi = g.to(DType::Float64).contiguous(), wi = w.to(DType::Float64).contiguous();
    return "element " + std::to_string(i) + ": compiled " + std::to_string(gi.data<double>()[i]) +
           ", eager " + std::to_string(wi.data<double>()[i]) +
           (g.dtype() == DType::Int64 ? " (int64 " + std::to_string(g.data<int64_t>()[i]) + " vs " +
                                            std::to_string(w.data<int64_t>()[i]) + ")"
                                      : "");
  }
  return "";
}

OpAttrs cast_to(DType dt) {
  OpAttrs a;
  a.dtype = dt;
  return a;
}

OpAttrs classes(int64_t n) {
  OpAttrs a;
  a.mode = n;
  return a;
}

}  // namespace

TEST_CASE("codegen: to() compiles every dtype pair with eager's values") {
  for (DType from : kAll)
    for (DType to : kAll) {
      INFO(name(from) << " -> " << name(to));
      Tensor x = cast_inputs(from);
      Tensor want = x.to(to);
      for (bool dynamic : {false, true}) {
        ir::Graph g;
        ir::Value in = g.input(from, {dynamic ? ir::kDynamic : x.shape()[0]});
        ir::Value y = g.op(OpKind::Cast, {in}, cast_to(to));
        CHECK(g.type(y).dtype == to);
        g.output(y);
        codegen::Executable exe(g);
        INFO(exe.linalg_ir());
        CHECK(bit_mismatch(exe.run({x}).at(0), want) == "");
      }
      // A transposed (strided) 2-D input of the same values, in a longer vector loop.
      Tensor big = x.expand({9, x.shape()[0]}).contiguous().t();
      ir::Graph g;
      g.output(g.op(OpKind::Cast, {g.input(from, {x.shape()[0], 9})}, cast_to(to)));
      codegen::Executable exe(g);
      CHECK(bit_mismatch(exe.run({big}).at(0), big.to(to)) == "");
    }
}

TEST_CASE("codegen: to() fuses with its elementwise neighbours into one loop nest") {
  // float32 x -> (x * 2.5).to(int32) + 1 -> to(float64): one generic, eager's values.
  ir::Graph g;
  ir::Value x = g.input(DType::Float32, {ir::kDynamic, 5});
  ir::Value m = g.op(OpKind::Mul, {x, g.constant(2.5, DType::Float32)});
  ir::Value i = g.op(OpKind::Cast, {m}, cast_to(DType::Int32));
  ir::Value s = g.op(OpKind::Add, {i, g.constant(int64_t{1}, DType::Int32)});
  g.output(g.op(OpKind::Cast, {s}, cast_to(DType::Float64)));
  codegen::Executable exe(g);
  INFO(exe.linalg_ir());
  CHECK(exe.num_kernels() == 1);
  Tensor in = cast_inputs(DType::Float32).slice(0, 0, 25).view({5, 5});
  Tensor want = ((in * 2.5).to(DType::Int32) + 1).to(DType::Float64);
  CHECK(bit_mismatch(exe.run({in}).at(0), want) == "");
}

TEST_CASE("codegen: one_hot matches eager on static, dynamic and 0-d indices") {
  struct C {
    std::vector<int64_t> graph;
    Tensor idx;
    int64_t n;
  };
  Tensor v = from_vector<int64_t>({0, 3, 1, 2, 2, 0}, Shape{6});
  std::vector<C> cases = {{{6}, v, 4},
                          {{ir::kDynamic}, v, 5},
                          {{ir::kDynamic}, v.slice(0, 0, 2), 5},
                          {{2, 3}, v.view({2, 3}), 4},
                          {{3, 2}, v.view({2, 3}).t(), 4},  // strided
                          {{ir::kDynamic, 3}, v.view({2, 3}), 4},
                          {{}, scalar_tensor(2, {DType::Int64}), 3},
                          {{0}, from_vector<int64_t>({}, Shape{0}), 3}};
  for (const C& c : cases) {
    INFO(to_string(c.idx.shape()) << " classes " << c.n);
    ir::Graph g;
    ir::Value y = g.op(OpKind::OneHot, {g.input(DType::Int64, c.graph)}, classes(c.n));
    CHECK(g.type(y).dtype == DType::Int64);
    g.output(y);
    codegen::Executable exe(g);
    INFO(exe.linalg_ir());
    CHECK(bit_mismatch(exe.run({c.idx}).at(0), one_hot(c.idx, c.n)) == "");
  }
}

TEST_CASE("codegen: one_hot out of range gives a zero row (eager raises)") {
  // Compiled code cannot raise (codegen/README.md, Divergence from eager); compile() keeps
  // eager's error by checking the indices (tests/tracer/cast_one_hot_test.cpp).
  ir::Graph g;
  g.output(g.op(OpKind::OneHot, {g.input(DType::Int64, {4})}, classes(3)));
  codegen::Executable exe(g);
  Tensor idx = from_vector<int64_t>({1, -1, 3, INT64_MIN}, Shape{4});
  CHECK_THROWS_AS(one_hot(idx, 3), Error);
  CHECK(exe.run({idx}).at(0).to_vector<int64_t>() ==
        std::vector<int64_t>{0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0});
}

TEST_CASE("codegen: nll_loss's backward, one_hot(t).to(f32) * valid * g, is one loop nest") {
  // The eager derivative (eager/derivatives.cpp): w = one_hot(safe, C).to(f32) * valid.unsqueeze(-1).
  ir::Graph g;
  ir::Value t = g.input(DType::Int64, {ir::kDynamic});
  ir::Value gy = g.input(DType::Float32, {ir::kDynamic, 10});
  ir::Value oh = g.op(OpKind::Cast, {g.op(OpKind::OneHot, {t}, classes(10))}, cast_to(DType::Float32));
  g.output(g.op(OpKind::Neg, {g.op(OpKind::Mul, {oh, gy})}));
  codegen::Executable exe(g);
  INFO(exe.linalg_ir());
  CHECK(exe.num_kernels() == 1);
  Tensor ti = from_vector<int64_t>({3, 0, 9, 9, 4, 1, 2}, Shape{7});
  Tensor gi = randn({7, 10});
  CHECK(bit_mismatch(exe.run({ti, gi}).at(0), -(one_hot(ti, 10).to(DType::Float32) * gi)) == "");
}
