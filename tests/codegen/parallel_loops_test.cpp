// Loop nests of graphs that are not row-splittable, shared out over the thread pool
// (codegen/cpu_parallel.h, codegen/omp_runtime.cpp), against eager mode.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <vector>

#include "backends/cpu/parallel.h"
#include "codegen/codegen.h"
#include "codegen/omp_runtime.h"
#include "codegen/runtime.h"
#include "kiln/kiln.h"

using namespace kiln;

namespace {

/// Largest |a - b| / (1 + |b|) over all elements (float32, same shape).
double max_rel_diff(const Tensor& a, const Tensor& b) {
  REQUIRE(a.shape() == b.shape());
  Tensor ac = a.contiguous(), bc = b.contiguous();
  double m = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    double x = ac.data<float>()[i], y = bc.data<float>()[i];
    m = std::max(m, std::abs(x - y) / (1 + std::abs(y)));
  }
  return m;
}

/// out = x * sum(x) + transpose(x): the full sum reads every row, so the graph cannot be split
/// by rows; its elementwise nest (and the transpose) can run in parallel.
/// n = ir::kDynamic: [?, ?].
ir::Graph scaled_plus_transpose(int64_t n) {
  ir::Graph g;
  ir::Value x = g.input(DType::Float32, {n, n});
  ir::Value s = g.op(OpKind::Sum, {x});
  OpAttrs t;
  t.dim = 0;
  t.dim1 = 1;
  ir::Value xt = g.op(OpKind::Transpose, {x}, t);
  g.output(g.op(OpKind::Add, {g.op(OpKind::Mul, {x, s}), xt}));
  return g;
}

Tensor reference(const Tensor& x) { return add(mul(x, sum(x)), x.t()); }

}  // namespace

TEST_CASE("parallel loops: static schedule blocks cover the loop exactly once") {
  using codegen::static_block;
  // 5 iterations over 2 members: [10, 12] and [13, 14].
  auto a = static_block(10, 14, 0, 2), b = static_block(10, 14, 1, 2);
  CHECK(a.lower == 10);
  CHECK(a.upper == 12);
  CHECK_FALSE(a.last);
  CHECK(b.lower == 13);
  CHECK(b.upper == 14);
  CHECK(b.last);
  CHECK(a.trip == 5);
  // One iteration over 3 members: the others get empty blocks (upper = lower - 1).
  CHECK(static_block(7, 7, 0, 3).upper == 7);
  for (int i = 1; i < 3; ++i) {
    auto e = static_block(7, 7, i, 3);
    CHECK(e.upper + 1 == e.lower);
    CHECK_FALSE(e.last);
  }
  // The empty loop (upper = lower - 1, also 0 - 1 wrapping): empty for everyone.
  for (uint64_t lower : {uint64_t{0}, uint64_t{100}})
    for (int i = 0; i < 2; ++i) {
      auto e = static_block(lower, lower - 1, i, 2);
      CHECK(e.trip == 0);
      CHECK(e.upper + 1 == e.lower);
    }
  // Every split of [0, n) for n < 40, 1..5 members: contiguous, disjoint, complete.
  for (uint64_t n = 1; n < 40; ++n)
    for (int size = 1; size <= 5; ++size) {
      uint64_t next = 0;
      for (int i = 0; i < size; ++i) {
        auto blk = static_block(0, n - 1, i, size);
        CHECK(blk.lower == next);
        next = blk.upper + 1;
      }
      CHECK(next == n);
    }
}

TEST_CASE("parallel loops: column sums get one block of whole vectors per thread") {
  using codegen::column_block;
  CHECK(column_block(1024, 2) == 512);
  CHECK(column_block(256, 2) == 128);
  CHECK(column_block(301, 2) == 160);  // 151 rounded up to whole 16-float vectors
  CHECK(column_block(256, 16) == 16);
  CHECK(column_block(1000, 1) == 1008);
  CHECK(column_block(3, 4) == 16);   // never below one vector
  CHECK(column_block(0, 2) == 16);   // an empty nest still gets a valid (unused) width
  // The blocks cover every column with at most `threads` blocks.
  for (int64_t cols = 1; cols < 300; cols += 7)
    for (int threads = 1; threads <= 6; ++threads) {
      int64_t w = column_block(cols, threads);
      CHECK(w % 16 == 0);
      CHECK((cols + w - 1) / w <= threads);
      CHECK((cols + w - 1) / w * w >= cols);
    }
}

TEST_CASE("parallel loops: a graph that is not row-splittable runs its loops on the pool") {
  const int saved = cpu::num_threads();
  cpu::set_num_threads(2);
  codegen::Executable exe(scaled_plus_transpose(601));  // 361,201 elements, odd sizes
  CHECK_FALSE(exe.row_parallel());
  Tensor x = randn({601, 601});
  const uint64_t before = codegen::parallel_loop_runs();
  Tensor out = exe.run({x})[0];
  CHECK(codegen::parallel_loop_runs() > before);
  CHECK(max_rel_diff(out, reference(x)) < 1e-4);

  SECTION("one thread: the same values, nothing shared out") {
    cpu::set_num_threads(1);
    const uint64_t at = codegen::parallel_loop_runs();
    CHECK(max_rel_diff(exe.run({x})[0], out) == 0);
    CHECK(codegen::parallel_loop_runs() == at);
  }
  SECTION("dynamic sizes: the runtime shares out large loops only") {
    codegen::Executable dyn(scaled_plus_transpose(ir::kDynamic));
    CHECK_FALSE(dyn.row_parallel());
    uint64_t at = codegen::parallel_loop_runs();
    CHECK(max_rel_diff(dyn.run({x})[0], reference(x)) < 1e-4);
    CHECK(codegen::parallel_loop_runs() > at);
    Tensor xs = randn({37, 37});
    at = codegen::parallel_loop_runs();
    CHECK(max_rel_diff(dyn.run({xs})[0], reference(xs)) < 1e-4);
    CHECK(codegen::parallel_loop_runs() == at);
  }
  SECTION("small loops stay on the calling thread") {
    codegen::Executable small(scaled_plus_transpose(37));
    Tensor xs = randn({37, 37});
    const uint64_t at = codegen::parallel_loop_runs();
    CHECK(max_rel_diff(small.run({xs})[0], reference(xs)) < 1e-4);
    CHECK(codegen::parallel_loop_runs() == at);
  }
  SECTION("runs from inside the pool (nested: the team runs inline) give the same values") {
    std::vector<Tensor> outs(4);
    cpu::parallel_for(0, 4, 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) outs[i] = exe.run({x})[0];
    });
    for (const Tensor& o : outs) CHECK(max_rel_diff(o, out) == 0);
  }
  cpu::set_num_threads(saved);
}

TEST_CASE("parallel loops: sums over leading dims share out blocks of columns") {
  // sum over rows ([rows, cols] -> [cols], a bias gradient) lowers to a row loop around a
  // parallel column loop; cpu_parallel.cpp moves blocks of columns outside the row loop.
  // Against a float64 reference, with odd sizes (a partial last block), static and dynamic.
  const int saved = cpu::num_threads();
  cpu::set_num_threads(2);
  auto column_sums = [](int64_t a, int64_t b, int64_t c) {
    ir::Graph g;
    ir::Value x = g.input(DType::Float32, {a, b, c});
    OpAttrs lead;
    lead.dims = {0, 1};
    OpAttrs first;
    first.dims = {0};
    g.output(g.op(OpKind::Sum, {g.op(OpKind::Mul, {x, x})}, lead));  // [c]
    g.output(g.op(OpKind::Sum, {x}, first));                          // [b, c]
    return g;
  };
  auto check = [](const std::vector<Tensor>& out, const Tensor& x) {
    const int64_t a = x.shape()[0], b = x.shape()[1], c = x.shape()[2];
    const float* p = x.contiguous().data<float>();
    REQUIRE(out.size() == 2);
    double worst = 0;
    for (int64_t k = 0; k < c; ++k) {
      double want = 0;
      for (int64_t i = 0; i < a * b; ++i) want += double(p[i * c + k]) * p[i * c + k];
      worst = std::max(worst, std::abs(out[0].contiguous().data<float>()[k] - want) / (1 + want));
    }
    for (int64_t j = 0; j < b; ++j)
      for (int64_t k = 0; k < c; ++k) {
        double want = 0;
        for (int64_t i = 0; i < a; ++i) want += p[(i * b + j) * c + k];
        worst = std::max(worst, std::abs(out[1].contiguous().data<float>()[j * c + k] - want) /
                                    (1 + std::abs(want)));
      }
    CHECK(worst < 1e-5);
  };
  // 722,400 elements; the results' own nests (fill, rounding to float32) stay below
  // kParallelMinIterations, so only the moved reductions run on the pool.
  Tensor x = randn({40, 60, 301});
  codegen::Executable exe(column_sums(40, 60, 301));
  CHECK_FALSE(exe.row_parallel());
  uint64_t at = codegen::parallel_loop_runs();
  check(exe.run({x}), x);
  CHECK(codegen::parallel_loop_runs() >= at + 2);

  codegen::Executable dyn(column_sums(ir::kDynamic, ir::kDynamic, ir::kDynamic));
  at = codegen::parallel_loop_runs();
  check(dyn.run({x}), x);
  CHECK(codegen::parallel_loop_runs() >= at + 2);
  Tensor small = randn({2, 3, 67});
  check(dyn.run({small}), small);
  cpu::set_num_threads(saved);
}

TEST_CASE("parallel loops: index_add and scatter_add are shared out and equal eager bit for "
          "bit") {
  // Their loops ran on one thread. Loops other than the one over the indexed dim never add
  // into the same element: shared out, each element still adds its sources in eager's order.
  const int saved = cpu::num_threads();
  cpu::set_num_threads(2);
  Tensor rows = randint(0, 50, {3000});  // many repeats
  Tensor src = randn({3000, 300}), x = randn({50, 300});
  Tensor picks = randint(0, 40, {2000, 70}), vals = randn({2000, 70}), y = randn({2000, 40});
  Tensor cube_idx = randint(0, 9, {40, 30, 60}), cube = randn({40, 30, 60});
  OpAttrs along0, along1, along2;
  along1.dim = 1;
  along2.dim = 2;
  struct Case {
    const char* what;
    OpKind op;
    OpAttrs attrs;
    std::vector<Tensor> in;
    Tensor want;
  };
  std::vector<Case> cases = {
      {"index_add, dim 0 (an embedding's gradient)", OpKind::IndexAdd, along0, {x, rows, src},
       index_add(x, 0, rows, src)},
      {"scatter_add along the last dim", OpKind::ScatterAdd, along1, {y, picks, vals},
       scatter_add(y, 1, picks, vals)},
      {"scatter_add along a middle dim", OpKind::ScatterAdd, along1,
       {randn({40, 9, 60}), cube_idx, cube},
       Tensor()},
  };
  cases[2].want = scatter_add(cases[2].in[0], 1, cube_idx, cube);
  for (const Case& c : cases) {
    INFO(c.what);
    ir::Graph g;
    std::vector<ir::Value> ins;
    for (const Tensor& t : c.in) ins.push_back(g.input(t.dtype(), t.shape().vec()));
    g.output(g.op(c.op, ins, c.attrs));
    codegen::Executable exe(g);
    const uint64_t before = codegen::parallel_loop_runs();
    Tensor got = exe.run(c.in)[0];
    CHECK(codegen::parallel_loop_runs() > before);
    CHECK(got.to_vector<float>() == c.want.to_vector<float>());
  }
  cpu::set_num_threads(saved);
}

// kiln-fuzz seed 53 #336: a traced function returned a row sum of one `?`-row input and a
// comparison of another, [s - 1, ...] and [s, ...]. Both were split by rows, and the merged row
// loop ran to the first input's rows: the last sum was never written (0.375 for 0).
TEST_CASE("parallel loops: separate nests over `?` rows of different sizes are not split by rows") {
  ir::Graph g;
  ir::Value x = g.input(DType::Float32, {ir::kDynamic, 3});
  ir::Value y = g.input(DType::Float32, {ir::kDynamic, 3});
  OpAttrs cols;
  cols.dims = {1};
  g.output(g.op(OpKind::Sum, {y}, cols));
  g.output(g.op(OpKind::Mul, {x, x}));
  codegen::Executable exe(g);
  CHECK_FALSE(exe.row_parallel());
  const int saved = cpu::num_threads();
  cpu::set_num_threads(2);
  for (auto [x_rows, y_rows] : {std::pair{2, 3}, std::pair{3, 2}, std::pair{90001, 90002}}) {
    CAPTURE(x_rows, y_rows);
    Tensor xt = randn({x_rows, 3}), yt = randn({y_rows, 3});
    std::vector<Tensor> out = exe.run({xt, yt});
    REQUIRE(out[0].shape() == Shape{y_rows});
    CHECK(max_rel_diff(out[0], sum(yt, {1})) < 1e-6);
    CHECK(max_rel_diff(out[1], mul(xt, xt)) == 0);
  }
  cpu::set_num_threads(saved);

  SECTION("one input's rows in both results: still split") {
    ir::Graph h;
    ir::Value z = h.input(DType::Float32, {ir::kDynamic, 3});
    h.output(h.op(OpKind::Sum, {z}, cols));
    h.output(h.op(OpKind::Mul, {z, z}));
    CHECK(codegen::Executable(h).row_parallel());
  }
}
