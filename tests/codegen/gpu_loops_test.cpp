// The GPU lowering's loop rewrites (codegen/gpu_lowering.cpp: rows fused over the leading dims
// every nest shares, column sums, elementwise nests linearised and unrolled, constants inlined)
// run on the CPU (CompileOptions::emulate_gpu_loops) against eager results: what the kernels
// compute, checked without a GPU. The kernels' PTX is checked in gpu_ptx_test.cpp.
#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "codegen/codegen.h"
#include "eager/dispatch.h"
#include "gpu_graphs.h"
#include "kiln/kiln.h"

using namespace kiln;

namespace {

codegen::CompileOptions emulated() {
  codegen::CompileOptions o;
  o.disk_cache = false;
  o.emulate_gpu_loops = true;
  return o;
}

/// Largest |a - b| / (1 + |b|).
double rel_diff(const Tensor& a, const Tensor& b) {
  REQUIRE(a.shape() == b.shape());
  std::vector<double> x = a.to(DType::Float64).contiguous().to_vector<double>();
  std::vector<double> y = b.to(DType::Float64).contiguous().to_vector<double>();
  double m = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    if (std::isnan(x[i]) || std::isnan(y[i])) {
      if (std::isnan(x[i]) != std::isnan(y[i])) return INFINITY;
      continue;
    }
    m = std::max(m, std::abs(x[i] - y[i]) / (1 + std::abs(y[i])));
  }
  return m;
}

/// Compiles `g` with the GPU loops emulated and runs it on `inputs`, with each parallel loop's
/// iterations in order and in reverse: a thread reading another's writes differs in one of them.
Tensor run_emulated(const ir::Graph& g, const std::vector<Tensor>& inputs) {
  Tensor in_order = codegen::Executable(g, emulated()).run(inputs).at(0);
  codegen::CompileOptions reverse = emulated();
  reverse.emulate_in_reverse = true;
  Tensor reversed = codegen::Executable(g, reverse).run(inputs).at(0);
  CHECK(rel_diff(reversed, in_order) == 0);
  return in_order;
}

}  // namespace

TEST_CASE("gpu loops on the cpu: softmax over the last dim of a 4-d tensor") {
  // Rows fused over (b, h, l): the attention scores' layout.
  Tensor x = randn({3, 4, 5, 37}) * 4.0;
  ir::Graph g;
  OpAttrs a;
  a.dim = -1;
  g.output(g.op(OpKind::Softmax, {g.input(DType::Float32, {3, 4, 5, 37})}, a));
  CHECK(rel_diff(run_emulated(g, {x}), softmax(x, -1)) < 1e-6);
}

TEST_CASE("gpu loops on the cpu: a static graph's softmax and dropout merged over rows") {
  // test::static_attention: no `?` dims, so fuse_static_row_loops merges the max, the sum of
  // exp and the masked probabilities into one loop over rows (gpu_ptx_test counts its kernels),
  // and the column loops take 4 columns per lane and step, the last step partly past the end
  // (130 columns). Both outputs against eager ops in float64.
  ir::Graph g = test::static_attention(6, 33, 130, 16);
  manual_seed(3);
  Tensor q = randn({6, 33, 16}), k = randn({6, 16, 130}), v = randn({6, 130, 16});
  Tensor keep = (rand({6, 33, 130}) > 0.1).to(DType::Float32);
  std::vector<Tensor> ins = {q, k, v, keep};
  auto f64 = [](const Tensor& t) { return t.to(DType::Float64); };
  Tensor out = matmul(softmax(matmul(f64(q), f64(k)), -1) * f64(keep), f64(v));
  Tensor column = sum(out, {0});
  for (bool reverse : {false, true}) {
    codegen::CompileOptions o = emulated();
    o.emulate_in_reverse = reverse;
    std::vector<Tensor> got = codegen::Executable(g, o).run(ins);
    CHECK(rel_diff(got.at(0), column) < 1e-5);
    CHECK(rel_diff(got.at(1), out) < 1e-5);
  }
}

TEST_CASE("gpu loops on the cpu: dropout's gradient recomputed in the softmax backward's row") {
  // test::static_attention_backward: the row loop's first column loop (dropout's backward)
  // stored its result, which the row sum and the score gradient read; recompute_row_intermediates
  // makes both compute it from the GEMM's product and the mask instead (gpu_ptx_test counts the
  // stores). Against eager ops in float64, in order and reversed.
  manual_seed(4);
  Tensor grad = randn({5, 33, 16}), v_t = randn({5, 16, 130}), p = rand({5, 33, 130});
  Tensor keep = rand({5, 33, 130}) > 0.2, k = randn({5, 130, 16});
  auto f64 = [](const Tensor& t) { return t.to(DType::Float64); };
  Tensor dp = matmul(f64(grad), f64(v_t)) * f64(keep) * 1.25;
  Tensor want = matmul(f64(p) * (dp - sum(dp * f64(p), {-1}, true)), f64(k));
  for (bool reverse : {false, true}) {
    codegen::CompileOptions o = emulated();
    o.emulate_in_reverse = reverse;
    std::vector<Tensor> got = codegen::Executable(test::static_attention_backward(5, 33, 130, 16),
                                                  o).run({grad, v_t, keep, p, k});
    CHECK(rel_diff(got.at(0), want) < 1e-4);  // eager's float32 ops: 3.9e-5 (dp - sum cancels)
  }
}

TEST_CASE("gpu loops on the cpu: a projection's bias recomputed in its head transpose") {
  // test::query_heads: GPU fusion leaves the bias out of the GEMM's C and adds it in the
  // transposing loop (gpu_ptx_test counts the kernels); against eager ops in float64.
  manual_seed(5);
  Tensor x = randn({3, 7, 40}), w = randn({40, 40}), b = randn({40});
  auto f64 = [](const Tensor& t) { return t.to(DType::Float64); };
  Tensor want =
      (matmul(f64(x), f64(w)) + f64(b)).reshape({3, 7, 5, 8}).transpose(1, 2) * 0.125;
  CHECK(rel_diff(run_emulated(test::query_heads(3, 7, 5, 8), {x, w, b}), want) < 1e-5);
}

TEST_CASE("gpu loops on the cpu: softmax over a middle dim keeps a thread per batch row") {
  // The max/sum nests run over (b, t) and the elementwise ones over (b, s, t), with S = T: the
  // second loop dims have equal sizes, but the nests index their intermediates with different
  // ones, so rows stay dim 0 alone.
  Tensor x = randn({3, 5, 5}) * 3.0;
  ir::Graph g;
  OpAttrs a;
  a.dim = 1;
  g.output(g.op(OpKind::Softmax, {g.input(DType::Float32, {3, 5, 5})}, a));
  CHECK(rel_diff(run_emulated(g, {x}), softmax(x, 1)) < 1e-6);
}

TEST_CASE("gpu loops on the cpu: a row sum read transposed keeps a thread per batch row") {
  // y[b, i, j] = x[b, i, j] / s[b, j] with s the row sums: the nests share the sizes of their
  // first two dims, but row (b, i) of y reads every s[b, j], so they cannot run as one loop over
  // (b, i).
  Tensor x = randn({3, 5, 5}) + 4.0;
  ir::Graph g;
  ir::Value in = g.input(DType::Float32, {3, 5, 5});
  OpAttrs sum_attrs;
  sum_attrs.dims = {2};
  sum_attrs.keepdim = true;
  OpAttrs t;
  t.dim = 1;
  t.dim1 = 2;
  ir::Value s = g.op(OpKind::Transpose, {g.op(OpKind::Sum, {in}, sum_attrs)}, t);
  g.output(g.op(OpKind::Div, {in, s}));
  Tensor want = x / sum(x, {2}, true).transpose(1, 2);
  CHECK(rel_diff(run_emulated(g, {x}), want) < 1e-6);
}

TEST_CASE("gpu loops on the cpu: a row result read through a view keeps a thread per batch row") {
  // Attention's heads split after layer_norm ([B, T, E] -> [B, T, H, D] -> [B, H, T, D]) and a
  // softmax reshaped: the view reads other rows' elements through another memref (review:
  // with T == H these gave inf and 2e6 before the separability check followed views).
  {
    Tensor x = randn({2, 4, 8});
    ir::Graph g;
    OpAttrs ln;
    ln.dims = {8};
    ln.eps = 1e-5;
    OpAttrs split, t;
    split.dims = {2, 4, 4, 2};
    t.dim = 1;
    t.dim1 = 2;
    ir::Value y = g.op(OpKind::LayerNorm, {g.input(DType::Float32, {2, 4, 8})}, ln);
    g.output(g.op(OpKind::Transpose, {g.op(OpKind::View, {y}, split)}, t));
    Tensor want = layer_norm(x, {8}).view({2, 4, 4, 2}).transpose(1, 2);
    CHECK(rel_diff(run_emulated(g, {x}), want) < 1e-5);
  }
  {
    Tensor x = randn({3, 2, 4});
    ir::Graph g;
    OpAttrs sm, v, t;
    sm.dim = -1;
    v.dims = {-1, 4, 2};
    t.dim = 1;
    t.dim1 = 2;
    ir::Value y = g.op(OpKind::Softmax, {g.input(DType::Float32, {3, 2, 4})}, sm);
    g.output(g.op(OpKind::Transpose, {g.op(OpKind::View, {y}, v)}, t));
    Tensor want = softmax(x, -1).view({3, 4, 2}).transpose(1, 2);
    CHECK(rel_diff(run_emulated(g, {x}), want) < 1e-6);
  }
}

TEST_CASE("gpu loops on the cpu: a split sum reads what its loop computes first") {
  // sum(x * exp(a)), a 0-d: exp(a) is computed and stored in the same one-thread loop as the
  // sum; the partial sums must not read it before it is written (review: errors of 0.99).
  Tensor x = randn({70000}).to(DType::Float64);
  ir::Graph g;
  ir::Value in = g.input(DType::Float64, {70000});
  ir::Value a = g.input(DType::Float64, {});
  OpAttrs all;
  all.all_dims = true;
  g.output(g.op(OpKind::Sum, {g.op(OpKind::Mul, {in, g.op(OpKind::Exp, {a})})}, all));
  codegen::Executable exe(g, emulated());
  for (double v : {3.0, -1.5}) {
    Tensor av = from_vector<double>({v}, Shape{});
    CHECK(rel_diff(exe.run({x, av}).at(0), sum(x * std::exp(v))) < 1e-12);
  }
}

TEST_CASE("gpu loops on the cpu: a dropout mask from its key equals eager's") {
  OpAttrs a;
  a.dims = {37, 41};
  a.dtype = DType::Float32;
  a.p = 0.3;
  ir::Graph g;
  g.output(g.op(OpKind::DropoutMask, {g.input(DType::Int64, {2})}, a));
  Tensor key = from_vector<int64_t>({123, 4567}, Shape{2});
  a.seed = 123;
  a.offset = 4567;
  Tensor want = dispatch::call1({OpKind::DropoutMask, {}, a, Loc::current()});
  CHECK(run_emulated(g, {key}).to_vector<float>() == want.to_vector<float>());
}

TEST_CASE("gpu loops on the cpu: rand, randn and randint from their key equal eager's draws") {
  // The counter layout of backends/cpu/random.cpp: 2, 4 and 2 words per element.
  struct Draw {
    OpKind op;
    DType dtype;
    Scalar low, high;
  };
  const Draw draws[] = {{OpKind::Uniform, DType::Float32, 0.0, 1.0},
                        {OpKind::Uniform, DType::Float32, -2.5, 3.0},
                        {OpKind::Uniform, DType::Float64, -2.5, 3.0},
                        {OpKind::Normal, DType::Float32, 1.0, 2.0},
                        {OpKind::Normal, DType::Float64, 0.0, 1.0},
                        {OpKind::RandInt, DType::Int64, int64_t{-7}, int64_t{1} << 40},
                        {OpKind::RandInt, DType::Int32, int64_t{0}, int64_t{10}},
                        {OpKind::RandInt, DType::Float32, int64_t{-3}, int64_t{3}}};
  for (const Draw& d : draws) {
    OpAttrs a;
    a.dims = {13, 37};  // odd: a block's words are split between elements
    a.dtype = d.dtype;
    a.low = d.low;
    a.high = d.high;
    INFO(op_name(d.op) << " " << name(d.dtype) << " [" << a.low.str() << ", " << a.high.str()
                       << ")");
    ir::Graph g;
    g.output(g.op(d.op, {g.input(DType::Int64, {2})}, a));
    Tensor key = from_vector<int64_t>({977, 12345}, Shape{2});
    a.seed = 977;
    a.offset = 12345;
    Tensor want = dispatch::call1({d.op, {}, a, Loc::current()});
    Tensor got = run_emulated(g, {key});
    if (d.op == OpKind::RandInt && d.dtype != DType::Float32) {
      CHECK(got.to(DType::Int64).to_vector<int64_t>() ==
            want.to(DType::Int64).to_vector<int64_t>());
    } else if (d.op == OpKind::Uniform && d.low.to<double>() == 0.0) {
      CHECK(got.to_vector<float>() == want.to_vector<float>());  // u itself: exact
    } else {
      // low + span * u may be one fused rounding in eager's C++; randn's log and cos come from
      // different math libraries: a few ulp.
      const double ulps = d.dtype == DType::Float32 ? 0x1.0p-23 : 0x1.0p-50;
      CHECK(amax(abs(got - want) / (abs(want) + 1)).to(DType::Float64).item<double>() <=
            2 * ulps);
    }
  }
}

TEST_CASE("randint into int32 over a range that does not fit is not compiled (eager raises)") {
  OpAttrs a;
  a.dims = {13, 37};
  a.dtype = DType::Int32;
  a.low = int64_t{-1} << 62;
  a.high = int64_t{1} << 62;
  ir::Graph g;
  g.output(g.op(OpKind::RandInt, {g.input(DType::Int64, {2})}, a));
  for (bool emulate : {false, true}) {
    INFO("emulated " << emulate);
    codegen::CompileOptions o = emulate ? emulated() : codegen::CompileOptions{};
    o.disk_cache = false;
    CHECK_THROWS_AS(codegen::Executable(g, o), Error);
  }
  CHECK_THROWS_WITH(dispatch::call1({OpKind::RandInt, {}, a, Loc::current()}),
                    Catch::Contains("does not fit dtype int32"));
}

TEST_CASE("gpu loops on the cpu: layer_norm over the last one and two dims") {
  Tensor x = randn({3, 6, 40}) + 2.0;
  Tensor w = randn({40}), b = randn({40});
  for (bool two_dims : {false, true}) {
    INFO("normalised over the last " << (two_dims ? 2 : 1) << " dims");
    Shape normalized = two_dims ? Shape{6, 40} : Shape{40};
    ir::Graph g;
    OpAttrs a;
    a.dims = normalized;
    a.eps = 1e-5;
    ir::Value in = g.input(DType::Float32, {3, 6, 40});
    if (two_dims) {
      g.output(g.op(OpKind::LayerNorm, {in}, a));
      CHECK(rel_diff(run_emulated(g, {x}), layer_norm(x, normalized)) < 1e-5);
    } else {
      g.output(g.op(OpKind::LayerNorm,
                    {in, g.input(DType::Float32, {40}), g.input(DType::Float32, {40})}, a));
      CHECK(rel_diff(run_emulated(g, {x, w, b}), layer_norm(x, normalized, w, b)) < 1e-5);
    }
  }
}

TEST_CASE("gpu loops on the cpu: sums split into partials") {
  // Few outputs, many summed elements: partial sums over strided chunks, then their sum.
  Tensor x = randn({32, 64, 50});
  Tensor x64 = x.to(DType::Float64);
  auto sum_graph = [](const Dims& dims, bool mean) {
    ir::Graph g;
    OpAttrs a;
    a.dims = dims;
    a.all_dims = dims.empty();
    g.output(g.op(mean ? OpKind::Mean : OpKind::Sum, {g.input(DType::Float32, {32, 64, 50})}, a));
    return g;
  };
  CHECK(rel_diff(run_emulated(sum_graph({}, false), {x}), sum(x64)) < 1e-7);   // 102,400 -> 1
  CHECK(rel_diff(run_emulated(sum_graph({}, true), {x}), mean(x64)) < 1e-7);
  CHECK(rel_diff(run_emulated(sum_graph({0, 1}, false), {x}), sum(x64, {0, 1})) < 1e-7);
  CHECK(rel_diff(run_emulated(sum_graph({0}, false), {x}), sum(x64, {0})) < 1e-7);
  {  // a dynamic number of summed elements (compile()'s symbolic batch)
    ir::Graph g;
    OpAttrs all;
    all.all_dims = true;
    g.output(g.op(OpKind::Sum, {g.input(DType::Float32, {ir::kDynamic, 50})}, all));
    Tensor y = randn({2000, 50});
    CHECK(rel_diff(run_emulated(g, {y}), sum(y.to(DType::Float64))) < 1e-7);
    codegen::CompileOptions cuda;
    cuda.device = Device::cuda();
    cuda.disk_cache = false;
    // Partials, their partials, the last sum: split although the count is known at run time.
    CHECK(codegen::Executable(g, cuda).num_kernels() >= 2);
  }
  // A bias gradient's column sum over many rows.
  Tensor rows = randn({3000, 5});
  ir::Graph g;
  OpAttrs a;
  a.dims = {0};
  g.output(g.op(OpKind::Sum, {g.input(DType::Float32, {3000, 5})}, a));
  CHECK(rel_diff(run_emulated(g, {rows}), sum(rows.to(DType::Float64), {0})) < 1e-7);
}

TEST_CASE("gpu loops on the cpu: column sums, elementwise chains, constants") {
  Tensor x = randn({300, 70});
  {  // a bias gradient: the sum over rows
    ir::Graph g;
    OpAttrs a;
    a.dims = {0};
    g.output(g.op(OpKind::Sum, {g.input(DType::Float32, {300, 70})}, a));
    // Against float64 sums: the kernel accumulates in float64 and rounds once.
    CHECK(rel_diff(run_emulated(g, {x}), sum(x.to(DType::Float64), {0})) < 1e-7);
  }
  {  // x*x + x, unrolled 4 elements per thread over 21,000 elements (not a multiple of 1024)
    ir::Graph g;
    ir::Value in = g.input(DType::Float32, {300, 70});
    g.output(g.op(OpKind::Add, {g.op(OpKind::Mul, {in, in}), in}));
    CHECK(rel_diff(run_emulated(g, {x}), x * x + x) == 0);
  }
  {  // gelu/silu/sigmoid chains over 21,380 elements: the last block's first 132 threads have
     // all four elements in bounds (the unguarded path), the others clamp and guard them
    Tensor w = randn({20, 1069}) * 4;
    OpAttrs tanh_mode;
    tanh_mode.mode = 1;
    for (OpKind kind : {OpKind::Gelu, OpKind::Silu, OpKind::Sigmoid}) {
      ir::Graph g;
      ir::Value in = g.input(DType::Float32, {20, 1069});
      ir::Value y = g.op(OpKind::Add, {g.op(OpKind::Mul, {in, in}), in});
      g.output(g.op(kind, {y}, kind == OpKind::Gelu ? tanh_mode : OpAttrs{}));
      Tensor eager_y = w * w + w;
      Tensor want = kind == OpKind::Gelu  ? gelu(eager_y, "tanh")
                    : kind == OpKind::Silu ? silu(eager_y)
                                           : sigmoid(eager_y);
      INFO(op_name(kind));
#if defined(__FMA__)  // eager's SIMD fma is fused, as compiled code's is: the same formulas
      CHECK(rel_diff(run_emulated(g, {w}), want) == 0);
#else  // a build for plain x86-64 (the sanitizer builds): eager's fma rounds twice
      CHECK(rel_diff(run_emulated(g, {w}), want) < 1e-6);
#endif
    }
  }
  {  // a constant operand, as compile() traces x + 1.5
    ir::Graph g;
    g.output(g.op(OpKind::Add,
                  {g.input(DType::Float32, {300, 70}), g.constant(Scalar(1.5), DType::Float32)}));
    CHECK(rel_diff(run_emulated(g, {x}), x + 1.5) == 0);
  }
}

TEST_CASE("gpu loops on the cpu: rows spread over lanes") {
  // The lane rewrite (gpu_row_lanes.cpp) runs with lanes of one thread here: each reduction's
  // part starts at its combine's neutral element and is combined with the row's initial value
  // after the loop; gpu_ptx_test.cpp checks the shuffles of the 32-lane form.
  SECTION("softmax after a matmul; a reduction whose fill is a loop of its own") {
    // With a GEMM the graph is not row-separable: the loops after it merge where
    // shared_row_dims verifies it.
    Tensor x = randn({24, 16}), w = randn({16, 200});
    ir::Graph g;
    OpAttrs a;
    a.dim = -1;
    g.output(g.op(OpKind::Softmax, {g.op(OpKind::Matmul, {g.input(DType::Float32, {24, 16}),
                                                          g.input(DType::Float32, {16, 200})})},
                  a));
    CHECK(rel_diff(run_emulated(g, {x, w}), softmax(matmul(x, w), -1)) < 1e-6);
    // The second input's rows are not the batch: its fill stays a loop of its own, so its max
    // loads the initial value.
    Tensor b = randn({10, 300});
    ir::Graph two;
    OpAttrs last;
    last.dims = {-1};
    two.output(two.op(OpKind::Sum, {two.input(DType::Float32, {24, 300})}, last));
    two.output(two.op(OpKind::Amax, {two.input(DType::Float32, {10, 300})}, last));
    Tensor rows = randn({24, 300});
    std::vector<Tensor> outs = codegen::Executable(two, emulated()).run({rows, b - 10.0});
    CHECK(rel_diff(outs.at(0), sum(rows.to(DType::Float64), {-1})) < 1e-7);
    CHECK(rel_diff(outs.at(1), amax(b - 10.0, {-1})) == 0);
  }
  SECTION("attention: softmax between two GEMMs, its probabilities reshaped for the second") {
    Tensor q = randn({2, 3, 70, 16}), k = randn({2, 3, 16, 70}), v = randn({2, 3, 70, 16});
    ir::Graph g;
    OpAttrs a;
    a.dim = -1;
    ir::Value qk = g.op(OpKind::Matmul, {g.input(DType::Float32, {2, 3, 70, 16}),
                                         g.input(DType::Float32, {2, 3, 16, 70})});
    ir::Value scores = g.op(OpKind::Mul, {qk, g.constant(Scalar(0.25), DType::Float32)});
    g.output(g.op(OpKind::Matmul, {g.op(OpKind::Softmax, {scores}, a),
                                   g.input(DType::Float32, {2, 3, 70, 16})}));
    Tensor want = matmul(softmax(matmul(q, k) * 0.25, -1), v);
    CHECK(rel_diff(run_emulated(g, {q, k, v}), want) < 1e-5);
  }
  SECTION("softmax's backward after a GEMM: its fill moves after the GEMM") {
    Tensor y = softmax(randn({40, 90}), -1), a = randn({40, 8}), b = randn({8, 90});
    Tensor gm = matmul(a, b);
    CHECK(rel_diff(run_emulated(test::softmax_backward_after_gemm(40, 90, 8), {y, a, b}),
                   y * (gm - sum(gm * y, {-1}, true))) < 1e-5);
  }
  SECTION("after a matmul, a row sum read at other rows is complete before it is read") {
    // out[i, j] = m[i, j] * s[j]: merged per row, row i would read s[j] before row j wrote it.
    Tensor x = randn({24, 16}), w = randn({16, 24});
    ir::Graph g;
    OpAttrs last;
    last.dims = {-1};
    ir::Value m = g.op(OpKind::Matmul, {g.input(DType::Float32, {24, 16}),
                                        g.input(DType::Float32, {16, 24})});
    g.output(g.op(OpKind::Mul, {m, g.op(OpKind::Sum, {m}, last)}));
    Tensor mm = matmul(x, w);
    CHECK(rel_diff(run_emulated(g, {x, w}), mm * sum(mm, {-1})) < 1e-5);
  }
  SECTION("integer sums, max, min and products of rows") {
    Tensor xi = randint(-50, 50, {7, 130}, Int64);
    Tensor xf = randn({7, 130});
    OpAttrs last;
    last.dims = {-1};
    // Rows of negative values for the max and positive ones for the min: a part starting at 0
    // instead of the neutral element would show.
    for (OpKind kind : {OpKind::Sum, OpKind::Amax, OpKind::Amin}) {
      ir::Graph g;
      g.output(g.op(kind, {g.input(DType::Int64, {7, 130})}, last));
      Tensor in = kind == OpKind::Sum ? xi : kind == OpKind::Amax ? xi - 60 : xi + 60;
      Tensor want = kind == OpKind::Sum    ? sum(in, {-1})
                    : kind == OpKind::Amax ? amax(in, {-1})
                                           : amin(in, {-1});
      CHECK(rel_diff(run_emulated(g, {in}), want) == 0);
    }
    ir::Graph g;
    g.output(g.op(OpKind::Prod, {g.input(DType::Float32, {7, 130})}, last));
    Tensor scaled = xf * 0.1 + 1.0;
    CHECK(rel_diff(run_emulated(g, {scaled}), prod(scaled.to(DType::Float64), {-1})) < 1e-5);
  }
  SECTION("a NaN in a row reaches the row's max and every softmax output") {
    std::vector<float> v(3 * 100, 0.5f);
    v[100 + 77] = NAN;
    Tensor x = from_vector(v, {3, 100});
    ir::Graph g;
    OpAttrs a;
    a.dim = -1;
    g.output(g.op(OpKind::Softmax, {g.input(DType::Float32, {3, 100})}, a));
    std::vector<float> y = run_emulated(g, {x}).to_vector<float>();
    CHECK(y[0] == Approx(0.01));
    CHECK(std::isnan(y[100]));
    CHECK(std::isnan(y[199]));
    CHECK(y[299] == Approx(0.01));
  }
}

TEST_CASE("gpu loops on the cpu: embedding, index_select, gather, tril and masked_fill equal "
          "eager's; an index out of range reads the clamped element, inside the buffer") {
  Tensor w = randn({50, 24}), x = randn({6, 40});
  Tensor tokens = randint(0, 50, {4, 33}), cols = randint(0, 40, {17}),
         picks = randint(0, 6, {5, 40}).to(DType::Int32);
  Tensor mask = rand({40}) < 0.3;
  ir::Graph g;
  ir::Value gw = g.input(DType::Float32, {50, 24}), gx = g.input(DType::Float32, {6, 40});
  ir::Value gt = g.input(DType::Int64, {4, 33}), gc = g.input(DType::Int64, {17});
  ir::Value gp = g.input(DType::Int32, {5, 40}), gm = g.input(DType::Bool, {40});
  OpAttrs along1, along0, diag, fill;
  along1.dim = 1;
  diag.mode = 2;
  fill.alpha = Scalar(-1e9);
  g.output(g.op(OpKind::Embedding, {gw, gt}));
  g.output(g.op(OpKind::IndexSelect, {gx, gc}, along1));
  g.output(g.op(OpKind::Gather, {gx, gp}, along0));
  g.output(g.op(OpKind::Tril, {gx}, diag));
  g.output(g.op(OpKind::MaskedFill, {gx, gm}, fill));
  std::vector<Tensor> want = {embedding(w, tokens), index_select(x, 1, cols), gather(x, 0, picks),
                              tril(x, 2), masked_fill(x, mask, -1e9)};
  for (auto reverse : {false, true}) {
    codegen::CompileOptions o = emulated();
    o.emulate_in_reverse = reverse;
    codegen::Executable exe(g, o);
    std::vector<Tensor> got = exe.run({w, x, tokens, cols, picks, mask});
    for (size_t i = 0; i < want.size(); ++i) {
      INFO("output " << i);
      CHECK(got[i].to_vector<float>() == want[i].to_vector<float>());
    }
    // Out of range: -7 reads row 0, 50 reads row 49 (the caller raises eager's error).
    Tensor bad = tokens.clone();
    bad.data<int64_t>()[0] = -7;
    bad.data<int64_t>()[1] = 50;
    Tensor e = exe.run({w, x, bad, cols, picks, mask}).at(0);
    CHECK(e.select(0, 0).select(0, 0).to_vector<float>() == w.select(0, 0).to_vector<float>());
    CHECK(e.select(0, 0).select(0, 1).to_vector<float>() == w.select(0, 49).to_vector<float>());
  }
}

TEST_CASE("index_select along a `?` dim is not lowered: at size 0 nothing could be clamped into") {
  // The dim may be 0 at run time: the clamp gave index -1, a read before the buffer (review).
  ir::Graph g;
  OpAttrs along0;
  g.output(g.op(OpKind::IndexSelect,
                {g.input(DType::Float32, {ir::kDynamic, 3}), g.input(DType::Int64, {2})}, along0));
  codegen::CompileOptions o;
  o.disk_cache = false;
  CHECK_THROWS_AS(codegen::Executable(g, o), Error);
}

TEST_CASE("gpu loops on the cpu: index_add and scatter_add are one parallel loop of atomic adds "
          "that equals eager's, repeated indices included") {
  // Integer-valued floats: the atomic adds' order (any, on a GPU) does not change the sums.
  Tensor x = randint(-4, 4, {6, 40}).to(DType::Float32);
  Tensor rows = from_vector(std::vector<int64_t>{5, 0, 5, 2, 5}, {5});
  Tensor src = randint(-9, 9, {5, 40}).to(DType::Float32);
  Tensor picks = randint(0, 40, {4, 30}).to(DType::Int32);
  Tensor values = randint(-9, 9, {6, 35}).to(DType::Float32);  // larger than the index
  Tensor counts = randint(0, 100, {6, 40});
  ir::Graph g;
  ir::Value gx = g.input(DType::Float32, {6, 40}), gr = g.input(DType::Int64, {5});
  ir::Value gs = g.input(DType::Float32, {5, 40}), gp = g.input(DType::Int32, {4, 30});
  ir::Value gv = g.input(DType::Float32, {6, 35}), gc = g.input(DType::Int64, {6, 40});
  ir::Value gs64 = g.input(DType::Int64, {5, 40});
  OpAttrs along0, along1;
  along1.dim = 1;
  g.output(g.op(OpKind::IndexAdd, {gx, gr, gs}, along0));
  g.output(g.op(OpKind::ScatterAdd, {gx, gp, gv}, along1));
  g.output(g.op(OpKind::IndexAdd, {gc, gr, gs64}, along0));
  std::vector<Tensor> want = {index_add(x, 0, rows, src), scatter_add(x, 1, picks, values),
                              index_add(counts, 0, rows, src.to(DType::Int64))};
  for (auto reverse : {false, true}) {
    codegen::CompileOptions o = emulated();
    o.emulate_in_reverse = reverse;
    codegen::Executable exe(g, o);
    INFO(exe.linalg_ir());
    std::vector<Tensor> ins = {x, rows, src, picks, values, counts, src.to(DType::Int64)};
    std::vector<Tensor> got = exe.run(ins);
    CHECK(got[0].to_vector<float>() == want[0].to_vector<float>());
    CHECK(got[1].to_vector<float>() == want[1].to_vector<float>());
    CHECK(got[2].to_vector<int64_t>() == want[2].to_vector<int64_t>());
    // The inputs are not written (the result starts as a copy of x).
    CHECK(exe.run(ins)[0].to_vector<float>() ==
          want[0].to_vector<float>());
  }
}

TEST_CASE("index_add over 10007 elements, whose graph type is relaxed to `?`, and into zeros "
          "that are returned too, equals eager on CPU code and emulated GPU loops") {
  // ir/dialect.cpp gives sizes that are multiples of 10007 a `?` in the op's result type; the
  // loops' result keeps x's static type and is cast (review).
  Tensor x = randint(-4, 4, {10007}).to(DType::Float32);
  Tensor idx = from_vector(std::vector<int64_t>{10006, 0, 10006}, {3});
  Tensor src = from_vector(std::vector<float>{1, 2, 3}, {3});
  ir::Graph g;
  g.output(g.op(OpKind::IndexAdd, {g.input(DType::Float32, {10007}), g.input(DType::Int64, {3}),
                                   g.input(DType::Float32, {3})}));
  Tensor want = index_add(x, 0, idx, src);
  // Zeros returned and also added into (review): the two results must not share a buffer.
  ir::Graph z;
  OpAttrs to_size;
  to_size.dims = {50};
  ir::Value zeros = z.op(OpKind::Expand, {z.constant(Scalar(0.0), DType::Float32)}, to_size);
  z.output(zeros);
  z.output(z.op(OpKind::IndexAdd, {zeros, z.input(DType::Int64, {3}),
                                   z.input(DType::Float32, {3})}));
  Tensor rows = from_vector(std::vector<int64_t>{49, 0, 49}, {3});
  std::vector<float> added(50, 0.f);
  added[0] = 2, added[49] = 4;
  for (bool emulate : {false, true}) {
    INFO("emulated " << emulate);
    codegen::CompileOptions o = emulate ? emulated() : codegen::CompileOptions{};
    o.disk_cache = false;
    CHECK(codegen::Executable(g, o).run({x, idx, src}).at(0).to_vector<float>() ==
          want.to_vector<float>());
    std::vector<Tensor> got = codegen::Executable(z, o).run({rows, src});
    CHECK(got.at(0).to_vector<float>() == std::vector<float>(50, 0.f));
    CHECK(got.at(1).to_vector<float>() == added);
  }
}
