// Buffer donation: outputs computed in an input's buffer (CompileOptions::in_place_outputs).
#include <catch2/catch.hpp>

#include "codegen/codegen.h"
#include "kiln/kiln.h"
#include "tests/codegen/compile_logs.h"

using namespace kiln;

namespace {

double max_abs_diff(const Tensor& a, const Tensor& b) {
  return amax(abs(sub(a.to(DType::Float64), b.to(DType::Float64)))).item<double>();
}

// An optimizer-like step: y = x @ p reads the parameter first; then m' = 0.9 m + g and
// p' = p - 0.1 m' in one elementwise loop nest. Outputs: p', m', y.
ir::Graph sgd_momentum_graph() {
  ir::Graph g;
  ir::Value p = g.input(DType::Float32, {32, 48}), m = g.input(DType::Float32, {32, 48});
  ir::Value grad = g.input(DType::Float32, {32, 48}), x = g.input(DType::Float32, {8, 32});
  ir::Value y = g.op(OpKind::Matmul, {x, p});
  ir::Value m2 = g.op(OpKind::Add, {g.op(OpKind::Mul, {m, g.constant(0.9, DType::Float32)}), grad});
  ir::Value p2 = g.op(OpKind::Sub, {p, g.op(OpKind::Mul, {m2, g.constant(0.1, DType::Float32)})});
  g.output(p2);
  g.output(m2);
  g.output(y);
  return g;
}

}  // namespace

TEST_CASE("Executable: donated inputs hold the outputs computed in place") {
  codegen::CompileOptions o;
  o.in_place_outputs = {{0, 0}, {1, 1}};
  ir::Graph g = sgd_momentum_graph();
  codegen::Executable exe(g, o);
  CHECK(exe.output_alias(0) == 0);
  CHECK(exe.output_alias(1) == 1);
  CHECK(exe.output_alias(2) == -1);
  for (int call = 0; call < 3; ++call) {
    Tensor p = randn({32, 48}), m = randn({32, 48}), grad = randn({32, 48}), x = randn({8, 32});
    Tensor want_m = m * 0.9f + grad, want_p = p - want_m * 0.1f, want_y = matmul(x, p);
    const uint64_t p_version = p.version();
    std::vector<Tensor> out = exe.run({p, m, grad, x});
    CHECK(out[0].is_same(p));  // the input tensor itself, now holding p'
    CHECK(out[1].is_same(m));
    CHECK(p.version() > p_version);  // written: views taken before see a new version
    CHECK(max_abs_diff(p, want_p) < 1e-5);
    CHECK(max_abs_diff(m, want_m) < 1e-5);
    CHECK(max_abs_diff(out[2], want_y) < 1e-4);  // the product read p before it was written
  }
  // The bufferized code has out memrefs for y only.
  const std::string bufferized = test::stage_text(test::compile_logs(g, "ir", o), "bufferized");
  REQUIRE(!bufferized.empty());
  CHECK(test::count(bufferized, "memref.copy") == 0);
  // An input passed twice (p also as the gradient): the donated one is copied first, so the
  // other still reads the old values and the caller's tensor is left as it was.
  Tensor p = randn({32, 48}), m = randn({32, 48}), x = randn({8, 32});
  Tensor p_before = p.clone();
  Tensor want_m = m * 0.9f + p, want_p = p - want_m * 0.1f;
  std::vector<Tensor> out = exe.run({p, m, p, x});
  CHECK(!out[0].is_same(p));
  CHECK(max_abs_diff(p, p_before) == 0);
  CHECK(max_abs_diff(out[0], want_p) < 1e-5);
  CHECK(max_abs_diff(out[1], want_m) < 1e-5);
}

TEST_CASE("Executable: an in-place output is refused where a later read of the input would see "
          "it") {
  // p is read by a product after the elementwise update: computing p' in p's buffer would
  // change what the product reads.
  ir::Graph g;
  ir::Value p = g.input(DType::Float32, {16, 16}), x = g.input(DType::Float32, {4, 16});
  g.output(g.op(OpKind::Add, {p, g.constant(1.0, DType::Float32)}));
  g.output(g.op(OpKind::Matmul, {x, p}));
  codegen::CompileOptions o;
  o.in_place_outputs = {{0, 0}};
  codegen::Executable exe(g, o);
  CHECK(exe.output_alias(0) == -1);
  Tensor tp = randn({16, 16}), tx = randn({4, 16});
  Tensor before = tp.clone();
  std::vector<Tensor> out = exe.run({tp, tx});
  CHECK(max_abs_diff(tp, before) == 0);  // not donated after all: the input is untouched
  CHECK(max_abs_diff(out[0], before + 1.0f) < 1e-5);
  CHECK(max_abs_diff(out[1], matmul(tx, before)) < 1e-4);
}

TEST_CASE("Executable: p + p.t() is computed in p's buffer after the transpose is stored") {
  // The transposed read is a loop nest of its own (linalg.transpose into a new buffer) before
  // the add, so the add may overwrite p: element (i, j) then reads p(i, j) and the stored p(j, i).
  ir::Graph g;
  ir::Value p = g.input(DType::Float32, {16, 16});
  OpAttrs swap;
  swap.dim = 0;
  swap.dim1 = 1;
  g.output(g.op(OpKind::Add, {p, g.op(OpKind::Transpose, {p}, swap)}));
  codegen::CompileOptions o;
  o.in_place_outputs = {{0, 0}};
  codegen::Executable exe(g, o);
  CHECK(exe.output_alias(0) == 0);
  Tensor tp = randn({16, 16});
  Tensor want = tp + tp.t();
  std::vector<Tensor> out = exe.run({tp});
  CHECK(out[0].is_same(tp));
  CHECK(max_abs_diff(tp, want) < 1e-6);
}

TEST_CASE("Executable: in-place outputs of a row-parallel graph, each row block in its rows") {
  // w' = 0.9 w + g over 4 MiB: run() splits the rows over the thread pool; w is sliced by rows,
  // so each block reads and writes only its own rows of w.
  ir::Graph g;
  ir::Value w = g.input(DType::Float32, {1024, 1024}), grad = g.input(DType::Float32, {1024, 1024});
  g.output(g.op(OpKind::Add, {g.op(OpKind::Mul, {w, g.constant(0.9, DType::Float32)}), grad}));
  codegen::CompileOptions o;
  o.in_place_outputs = {{0, 0}};
  codegen::Executable exe(g, o);
  CHECK(exe.row_parallel());
  CHECK(exe.output_alias(0) == 0);
  Tensor tw = randn({1024, 1024}), tg = randn({1024, 1024});
  Tensor want = tw * 0.9f + tg;
  std::vector<Tensor> out = exe.run({tw, tg});
  CHECK(out[0].is_same(tw));
  CHECK(max_abs_diff(tw, want) < 1e-5);
}

TEST_CASE("Executable: index_copy into a donated cache writes only the slots, in the cache") {
  // A KV cache [2, 8, 3] written at positions along dim 1 (x.index_copy_(1, pos, k)): the
  // scatter nest starts from the cache, so the cache's own buffer is updated and the code
  // copies nothing (without donation the nest starts from a copy of the whole cache).
  ir::Graph g;
  ir::Value cache = g.input(DType::Float32, {2, 8, 3}), pos = g.input(DType::Int64, {2});
  ir::Value k = g.input(DType::Float32, {2, 2, 3});
  OpAttrs along1;
  along1.dim = 1;
  g.output(g.op(OpKind::IndexCopy, {cache, pos, k}, along1));
  codegen::CompileOptions o;
  o.in_place_outputs = {{0, 0}};
  codegen::Executable exe(g, o);
  CHECK(exe.output_alias(0) == 0);
  Tensor tc = randn({2, 8, 3});
  for (int64_t step = 0; step < 3; ++step) {
    const int64_t slots[2] = {2 * step, 7 - step};
    Tensor tpos = tensor({slots[0], slots[1]}), tk = randn({2, 2, 3});
    Tensor want = tc.clone();
    for (int64_t b = 0; b < 2; ++b)
      for (int64_t j = 0; j < 2; ++j)
        want.select(0, b).select(0, slots[j]).copy_(tk.select(0, b).select(0, j));
    std::vector<Tensor> out = exe.run({tc, tpos, tk});
    CHECK(out[0].is_same(tc));
    CHECK(max_abs_diff(tc, want) == 0);
  }
  const std::string bufferized = test::stage_text(test::compile_logs(g, "ir", o), "bufferized");
  REQUIRE(!bufferized.empty());
  CHECK(test::count(bufferized, "memref.copy") == 0);
  CHECK(test::count(bufferized, "memref.alloc") == 0);
}

TEST_CASE("Executable: index_copy into a cache read after the update is not donated") {
  // The sum reads the old cache after the scatter nest: writing the cache in place would
  // change what it reads.
  ir::Graph g;
  ir::Value cache = g.input(DType::Float32, {8, 3}), pos = g.input(DType::Int64, {1});
  ir::Value k = g.input(DType::Float32, {1, 3});
  g.output(g.op(OpKind::IndexCopy, {cache, pos, k}));
  OpAttrs rows;
  rows.dims = {0};
  g.output(g.op(OpKind::Sum, {cache}, rows));
  codegen::CompileOptions o;
  o.in_place_outputs = {{0, 0}};
  codegen::Executable exe(g, o);
  CHECK(exe.output_alias(0) == -1);
  Tensor tc = randn({8, 3}), before = tc.clone(), tk = randn({1, 3});
  std::vector<Tensor> out = exe.run({tc, tensor({int64_t{5}}), tk});
  CHECK(max_abs_diff(tc, before) == 0);
  CHECK(max_abs_diff(out[0].select(0, 5), tk.select(0, 0)) == 0);
  CHECK(max_abs_diff(out[1], sum(before, {0})) < 1e-5);
}
