// codegen/transposed_tiles.h: loop nests that read an input across its memory order run in
// tiles, each copying the input's tile into a stack buffer first. Values against index
// arithmetic (exact where the formula is) and the tiles' buffers in the bufferized code.
#include <catch2/catch.hpp>

#include <cmath>

#include "codegen/codegen.h"
#include "compile_logs.h"
#include "kiln/kiln.h"

using namespace kiln;

namespace {

OpAttrs permute_attrs(Dims order) {
  OpAttrs a;
  a.dims = std::move(order);
  return a;
}

codegen::CompileOptions no_disk_cache() {
  codegen::CompileOptions o;
  o.disk_cache = false;
  return o;
}

/// Small integers (exact through * 2 + 1 in every dtype tested), varying along every dim.
Tensor integers(const Shape& shape, DType dtype) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return (remainder(arange(n, DType::Float64), 1001.0) - 500.0).view(shape).to(dtype);
}

/// x.permute(order) * 2 + 1 (or, `output_permuted`, (x * 2 + 1).permute(order): a returned
/// transpose, a loop of its own reading the intermediate across), compiled, against the same
/// by index arithmetic in float64.
void check_permute(const Shape& shape, const Dims& order, DType dtype,
                   bool output_permuted = false) {
  INFO("shape " << to_string(shape) << " order " << to_string(order) << " " << name(dtype)
                << (output_permuted ? " (output permuted)" : ""));
  ir::Graph g;
  ir::Value x = g.input(dtype, shape.vec());
  auto affine = [&](ir::Value v) {
    ir::Value twice = g.op(OpKind::Mul, {v, g.constant(2.0, dtype)});
    return g.op(OpKind::Add, {twice, g.constant(1.0, dtype)});
  };
  auto permute = [&](ir::Value v) { return g.op(OpKind::Permute, {v}, permute_attrs(order)); };
  g.output(output_permuted ? permute(affine(x)) : affine(permute(x)));
  Tensor in = integers(shape, dtype);
  Tensor got = codegen::Executable(g, no_disk_cache()).run({in}).at(0);
  const int rank = shape.size();
  Shape out_shape;
  for (int d = 0; d < rank; ++d) out_shape.push_back(shape[static_cast<int>(order[d])]);
  REQUIRE(got.shape() == out_shape);
  std::vector<double> xs = in.to(DType::Float64).to_vector<double>();
  std::vector<double> ys = got.to(DType::Float64).to_vector<double>();
  const Strides in_strides = contiguous_strides(shape);
  Dims at = Dims::filled(rank, 0);  // the output's index
  size_t wrong = 0;
  for (double y_k : ys) {
    int64_t from = 0;
    for (int d = 0; d < rank; ++d) from += at[d] * in_strides[static_cast<int>(order[d])];
    wrong += y_k != xs[static_cast<size_t>(from)] * 2 + 1;
    for (int d = rank; d-- > 0;) {
      if (++at[d] < out_shape[d]) break;
      at[d] = 0;
    }
  }
  CHECK(wrong == 0);
}

/// The bufferized code of `g`.
std::string bufferized(const ir::Graph& g) {
  return test::stage_text(test::compile_logs(g, "ir"), "bufferized");
}

}  // namespace

TEST_CASE("transposed tiles: permuted reads against index arithmetic", "[codegen][tiles]") {
  // The copies move blocks of 16 x 16 (4-byte types) or 8 x 8 (8-byte) elements through
  // registers, the rest element by element: sizes with and without whole blocks and tiles.
  for (DType dtype : {DType::Float32, DType::Float64, DType::Int32, DType::Int64}) {
    check_permute({300, 517}, {1, 0}, dtype);  // tiles with tails both ways
    check_permute({1000, 37}, {1, 0}, dtype);  // narrower than one tile
    check_permute({37, 1000}, {1, 0}, dtype);
    check_permute({5, 7}, {1, 0}, dtype);      // smaller than one tile
    check_permute({128, 64}, {1, 0}, dtype);   // whole tiles
    check_permute({16, 16}, {1, 0}, dtype);    // one block (two of 8 x 8 for 8-byte types)
    check_permute({17, 9}, {1, 0}, dtype);     // a block's width one way, not the other
    check_permute({40, 33}, {1, 0}, dtype);    // blocks with tails of 8 and 1
    check_permute({3, 24, 72}, {0, 2, 1}, dtype);
  }
  check_permute({33, 70, 90}, {2, 0, 1}, DType::Float32);
  check_permute({33, 70, 90}, {1, 2, 0}, DType::Float32);
  check_permute({70, 33, 90}, {2, 1, 0}, DType::Float32);
  check_permute({6, 70, 90}, {0, 2, 1}, DType::Float32);
  check_permute({3, 5, 40, 66}, {0, 3, 2, 1}, DType::Float32);
  check_permute({3, 5, 40, 66}, {3, 1, 0, 2}, DType::Float32);
  check_permute({3, 5, 40, 16}, {0, 2, 1, 3}, DType::Float32);  // [B, H, S, D] heads: along D
  check_permute({300, 517}, {1, 0}, DType::Float32, true);
  check_permute({5, 7}, {1, 0}, DType::Float32, true);
  check_permute({33, 70, 90}, {2, 0, 1}, DType::Float32, true);
}

TEST_CASE("transposed tiles: bool permutes copy their bytes", "[codegen][tiles]") {
  for (const Shape& shape : {Shape{300, 517}, Shape{40, 33}, Shape{5, 7}}) {
    INFO("shape " << to_string(shape));
    ir::Graph g;
    ir::Value x = g.input(DType::Bool, shape.vec());
    g.output(g.op(OpKind::Permute, {x}, permute_attrs({1, 0})));
    Tensor in = gt(remainder(arange(shape[0] * shape[1], DType::Float64), 3.0), 0.5)
                    .view(shape);
    REQUIRE(in.dtype() == DType::Bool);
    Tensor got = codegen::Executable(g, no_disk_cache()).run({in}).at(0);
    CHECK(equal(got, in.t().contiguous()));
  }
}

TEST_CASE("transposed tiles: the copies transpose whole blocks in registers",
          "[codegen][tiles]") {
  // Rows of 64 bytes loaded as vectors, transposed by log2(lanes) rounds of two shuffles per
  // row, stored as the buffer's rows: the copy was one scalar load and store per element.
  struct Width {
    DType dtype;
    const char* element;
    int lanes;
  };
  for (Width w : {Width{DType::Float32, "f32", 16}, Width{DType::Int32, "i32", 16},
                  Width{DType::Float64, "f64", 8}, Width{DType::Int64, "i64", 8}}) {
    INFO(name(w.dtype));
    ir::Graph g;
    ir::Value x = g.input(w.dtype, {300, 517});
    ir::Value t = g.op(OpKind::Permute, {x}, permute_attrs({1, 0}));
    g.output(g.op(OpKind::Add, {t, g.constant(1.0, w.dtype)}));
    const std::string code = bufferized(g);
    INFO(code);
    const std::string el = w.element;
    const std::string vec = "vector<" + std::to_string(w.lanes) + "x" + el + ">";
    const size_t lanes = static_cast<size_t>(w.lanes), rounds = lanes == 16 ? 4 : 3;
    // Rows of x [300, 517] loaded, rows of the buffer (64 x 64, or 32 x 32) stored.
    const std::string buffer = (lanes == 16 ? "64x" : "32x") + el;
    CHECK(test::count(code, "517x" + el + ">, " + vec) == lanes);
    CHECK(test::count(code, buffer + ">, " + vec) == lanes);
    CHECK(test::count(code, "vector.shuffle") == rounds * lanes);
  }
}

TEST_CASE("transposed tiles: the fused loop reads x.t() through a tile buffer",
          "[codegen][tiles]") {
  auto graph = [](bool transposed) {
    ir::Graph g;
    ir::Value x = g.input(DType::Float32, {4096, 2048});
    ir::Value v = transposed ? g.op(OpKind::Permute, {x}, permute_attrs({1, 0})) : x;
    ir::Value y = g.op(OpKind::Mul, {v, g.constant(2.0, DType::Float32)});
    g.output(g.op(OpKind::Tanh, {g.op(OpKind::Add, {y, g.constant(1.0, DType::Float32)})}));
    return g;
  };
  const std::string tiled = bufferized(graph(true));
  INFO(tiled);
  CHECK(test::count(tiled, "memref.alloca() : memref<64x64xf32>") == 1);
  // The contiguous case keeps its loops.
  CHECK(test::count(bufferized(graph(false)), "memref.alloca") == 0);

  // Values: tanh(2x + 1) of x.t() against float64, and the same as eager's kernels.
  Tensor x = rand({4096, 2048}) * 4.0 - 2.0;
  Tensor got = codegen::Executable(graph(true), no_disk_cache()).run({x}).at(0);
  Tensor want = tanh(add(mul(x.t().to(DType::Float64), 2.0), 1.0));
  CHECK((got.to(DType::Float64) - want).abs().max().item<double>() < 2e-6);
  CHECK((got - tanh(add(mul(x.t(), 2.0), 1.0))).abs().max().item<double>() < 2e-6);
}

TEST_CASE("transposed tiles: a transposed input next to contiguous and broadcast ones",
          "[codegen][tiles]") {
  // gelu-like chains on x.t() + b (b broadcast over rows) + y: only x.t() goes through a tile.
  for (int64_t rows : {int64_t{1000}, int64_t{64}, int64_t{3}}) {
    const int64_t cols = 37 * 3;
    ir::Graph g;
    ir::Value x = g.input(DType::Float32, {cols, rows});
    ir::Value b = g.input(DType::Float32, {cols});
    ir::Value y = g.input(DType::Float32, {rows, cols});
    ir::Value xt = g.op(OpKind::Permute, {x}, permute_attrs({1, 0}));
    ir::Value s = g.op(OpKind::Add, {g.op(OpKind::Add, {xt, b}), y});
    g.output(g.op(OpKind::Relu, {s}));
    g.output(g.op(OpKind::Mul, {xt, xt}));  // x.t() read by a second loop nest too
    Tensor xs = integers({cols, rows}, DType::Float32), bs = integers({cols}, DType::Float32),
           ys = integers({rows, cols}, DType::Float32) * 0.5;
    std::vector<Tensor> got = codegen::Executable(g, no_disk_cache()).run({xs, bs, ys});
    std::vector<float> xv = xs.to_vector<float>(), bv = bs.to_vector<float>(),
                       yv = ys.to_vector<float>(), r0 = got.at(0).to_vector<float>(),
                       r1 = got.at(1).to_vector<float>();
    size_t wrong = 0;
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) {
        const float xij = xv[static_cast<size_t>(j * rows + i)];
        const float sum = xij + bv[static_cast<size_t>(j)] + yv[static_cast<size_t>(i * cols + j)];
        wrong += r0[static_cast<size_t>(i * cols + j)] != std::max(sum, 0.f);
        wrong += r1[static_cast<size_t>(i * cols + j)] != xij * xij;
      }
    CHECK(wrong == 0);
  }
}

TEST_CASE("transposed tiles: up to four transposed inputs of a nest go through tiles",
          "[codegen][tiles]") {
  // Two buffers per nest kept the tiles in L1; up to four are still faster than reads across
  // memory (a fifth input keeps them). x1.t() + 2 x2.t() + ... + n xn.t().
  for (int inputs : {2, 3, 4, 5}) {
    INFO(inputs << " inputs");
    ir::Graph g;
    std::vector<Tensor> xs;
    ir::Value sum;
    for (int i = 1; i <= inputs; ++i) {
      ir::Value x = g.input(DType::Float32, {300, 517});
      ir::Value t = g.op(OpKind::Mul, {g.op(OpKind::Permute, {x}, permute_attrs({1, 0})),
                                       g.constant(static_cast<double>(i), DType::Float32)});
      sum = i == 1 ? t : g.op(OpKind::Add, {sum, t});
      xs.push_back(integers({300, 517}, DType::Float32) + static_cast<double>(i));
    }
    g.output(sum);
    const std::string code = bufferized(g);
    CHECK(test::count(code, "memref.alloca() : memref<64x64xf32>") ==
          static_cast<size_t>(std::min(inputs, 4)));
    Tensor got = codegen::Executable(g, no_disk_cache()).run(xs).at(0);
    std::vector<float> r = got.to_vector<float>();
    std::vector<std::vector<float>> xv;
    for (const Tensor& x : xs) xv.push_back(x.to_vector<float>());
    REQUIRE(r.size() == size_t{517} * 300);
    size_t wrong = 0;
    for (size_t i = 0; i < 517; ++i)
      for (size_t j = 0; j < 300; ++j) {
        double want = 0;
        for (int k = 0; k < inputs; ++k) want += (k + 1) * double{xv[k][j * 517 + i]};
        wrong += r[i * 300 + j] != static_cast<float>(want);
      }
    CHECK(wrong == 0);
  }
}

TEST_CASE("transposed tiles: a reduction over x.t() * 2 keeps the transpose a loop of its own",
          "[codegen][tiles]") {
  // Fused into the sum, x would be read across memory in the reduction's loops, which get no
  // tiles: the transpose (with the scaling) stays a tiled loop nest, the sum reads it.
  ir::Graph g;
  ir::Value x = g.input(DType::Float32, {300, 517});
  ir::Value xt = g.op(OpKind::Permute, {x}, permute_attrs({1, 0}));
  OpAttrs rows;
  rows.dims = Dims{1};
  g.output(g.op(OpKind::Sum, {g.op(OpKind::Mul, {xt, g.constant(2.0, DType::Float32)})}, rows));
  const std::string code = bufferized(g);
  CHECK(test::count(code, "memref.alloca() : memref<64x64xf32>") == 1);
  Tensor xs = integers({300, 517}, DType::Float32);
  Tensor sums = codegen::Executable(g, no_disk_cache()).run({xs}).at(0);
  std::vector<float> got = sums.to_vector<float>();
  std::vector<float> xv = xs.to_vector<float>();
  REQUIRE(got.size() == 517);
  size_t wrong = 0;
  for (size_t j = 0; j < 517; ++j) {
    double sum = 0;
    for (size_t i = 0; i < 300; ++i) sum += 2.0 * xv[i * 517 + j];
    wrong += got[j] != static_cast<float>(sum);
  }
  CHECK(wrong == 0);
}

TEST_CASE("transposed tiles: the nests of one function share their tile buffers",
          "[codegen][tiles]") {
  // Found by a review: each small (serial) nest's buffer was hoisted to the function's entry
  // on its own, all live for the whole call; 700 such nests (11 MiB) overflowed an 8 MiB
  // stack, 80 a thread's 1 MiB. Nests run one after the other, so one buffer per type serves.
  constexpr int kNests = 12;
  ir::Graph g;
  std::vector<Tensor> ins;
  for (int i = 0; i < kNests; ++i) {
    ir::Value x = g.input(DType::Float32, {64, 64});
    ir::Value t = g.op(OpKind::Permute, {x}, permute_attrs({1, 0}));
    g.output(g.op(OpKind::Add, {g.op(OpKind::Mul, {t, g.constant(2.0, DType::Float32)}),
                                g.constant(static_cast<double>(i), DType::Float32)}));
    ins.push_back(integers({64, 64}, DType::Float32) + static_cast<double>(i));
  }
  const std::string code = bufferized(g);
  CHECK(test::count(code, "memref.alloca() : memref<64x64xf32>") == 1);
  std::vector<Tensor> got = codegen::Executable(g, no_disk_cache()).run(ins);
  REQUIRE(got.size() == static_cast<size_t>(kNests));
  for (int i = 0; i < kNests; ++i) {
    INFO("output " << i);
    CHECK(equal(got[i], ins[i].t() * 2.0 + static_cast<double>(i)));
  }
}
