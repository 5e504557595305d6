// Suite `fusion`: fused, JIT-compiled graphs (codegen::Executable) next to the same computation
// in eager mode and this machine's copy bandwidth, all measured in the same run. GB/s counts
// the bytes a perfectly fused kernel must move: inputs read once, outputs written once;
// linear_8x128x256_to_1024 (x @ W.t() + b) is in GFLOP/s (the compiled one calls BLAS).
#include <cstring>

#include <fmt/format.h>

#include "backends/cpu/parallel.h"
#include "benchmarks/harness.h"
#include "codegen/codegen.h"
#include "kiln/kiln.h"

namespace kiln::bench {
namespace {

constexpr char kSuite[] = "fusion";
constexpr int64_t k16M = int64_t{1} << 24;
constexpr int64_t kRows = 4096, kCols = 1024;
constexpr double kF32 = sizeof(float);

Benchmark copy_16m(const RunConfig&) { return copy_reference(k16M); }

// ---- the workloads, once as graphs and once as eager calls ----

ir::Graph square_plus_graph() {
  ir::Graph g;
  ir::Value x = g.input(DType::Float32, {k16M});
  g.output(g.op(OpKind::Add, {g.op(OpKind::Mul, {x, x}), x}));
  return g;
}

// gelu written out: 0.5*x*(1+tanh(0.79788456*(x+0.044715*x^3))), nine elementwise ops.
ir::Graph gelu_graph() {
  ir::Graph g;
  ir::Value x = g.input(DType::Float32, {k16M});
  auto c = [&](double v) { return g.constant(Scalar(v), DType::Float32); };
  auto mul = [&](ir::Value a, ir::Value b) { return g.op(OpKind::Mul, {a, b}); };
  auto add = [&](ir::Value a, ir::Value b) { return g.op(OpKind::Add, {a, b}); };
  ir::Value cube = mul(mul(x, x), x);
  ir::Value t = g.op(OpKind::Tanh, {mul(add(x, mul(cube, c(0.044715))), c(0.79788456))});
  g.output(mul(mul(x, c(0.5)), add(t, c(1.0))));
  return g;
}

Tensor gelu_eager(const Tensor& x) {
  Tensor cube = mul(mul(x, x), x);
  Tensor t = tanh(mul(add(x, mul(cube, 0.044715)), 0.79788456));
  return mul(mul(x, 0.5), add(t, 1.0));
}

ir::Graph softmax_graph() {
  ir::Graph g;
  OpAttrs a;
  a.dim = -1;
  g.output(g.op(OpKind::Softmax, {g.input(DType::Float32, {kRows, kCols})}, a));
  return g;
}

ir::Graph log_softmax_graph() {
  ir::Graph g;
  OpAttrs a;
  a.dim = -1;
  g.output(g.op(OpKind::LogSoftmax, {g.input(DType::Float32, {kRows, kCols})}, a));
  return g;
}

ir::Graph logsumexp_graph() {
  ir::Graph g;
  OpAttrs a;
  a.dims = {1};
  g.output(g.op(OpKind::LogSumExp, {g.input(DType::Float32, {kRows, kCols})}, a));
  return g;
}

ir::Graph layer_norm_graph() {
  ir::Graph g;
  ir::Value x = g.input(DType::Float32, {kRows, kCols});
  ir::Value w = g.input(DType::Float32, {kCols});
  ir::Value b = g.input(DType::Float32, {kCols});
  OpAttrs a;
  a.dims = Dims{kCols};
  a.eps = 1e-5;
  g.output(g.op(OpKind::LayerNorm, {x, w, b}, a));
  return g;
}

// nn::Linear as the tracer records it: x [8, 128, 256] @ W.t() + b with W [1024, 256]. Compiled,
// the weight's transpose folds into the GEMM (trans_b) and x's rows collapse into one GEMM.
constexpr int64_t kLinB = 8, kLinT = 128, kLinK = 256, kLinN = 1024;
constexpr double kLinearFlops = 2.0 * kLinB * kLinT * kLinK * kLinN;

ir::Graph linear_graph() {
  ir::Graph g;
  ir::Value x = g.input(DType::Float32, {kLinB, kLinT, kLinK});
  ir::Value w = g.input(DType::Float32, {kLinN, kLinK});
  ir::Value b = g.input(DType::Float32, {kLinN});
  OpAttrs t;
  t.dim = 0;
  t.dim1 = 1;
  g.output(g.op(OpKind::Add, {g.op(OpKind::Matmul, {x, g.op(OpKind::Transpose, {w}, t)}), b}));
  return g;
}

// (x.t() * 2 + 1).tanh() with x [4096, 2048]: the compiled loop reads x across its rows
// (codegen/transposed_tiles.h); eager copies x.t() through its blocked transpose first.
constexpr int64_t kTRows = 4096, kTCols = 2048;
constexpr double kTBytes2 = 2 * kF32 * kTRows * kTCols;

/// (x.t() * 2 + 1).tanh() of x [rows, cols], or (`transposed` false) the same of x itself: the
/// ceiling of the tiled loop, the same computation reading its input in memory order.
ir::Graph transposed_tanh_graph(int64_t rows = kTRows, int64_t cols = kTCols,
                                bool transposed = true) {
  ir::Graph g;
  ir::Value x = g.input(DType::Float32, {rows, cols});
  OpAttrs t;
  t.dim = 0;
  t.dim1 = 1;
  auto c = [&](double v) { return g.constant(Scalar(v), DType::Float32); };
  ir::Value y = g.op(OpKind::Mul, {transposed ? g.op(OpKind::Transpose, {x}, t) : x, c(2.0)});
  g.output(g.op(OpKind::Tanh, {g.op(OpKind::Add, {y, c(1.0)})}));
  return g;
}

/// x.t() + y.t() + z.t() of [n, n] inputs: three tiled inputs in one nest.
ir::Graph transposed_sum3_graph(int64_t n) {
  ir::Graph g;
  OpAttrs t;
  t.dim = 0;
  t.dim1 = 1;
  ir::Value sum;
  for (int i = 0; i < 3; ++i) {
    ir::Value xt = g.op(OpKind::Transpose, {g.input(DType::Float32, {n, n})}, t);
    sum = i == 0 ? xt : g.op(OpKind::Add, {sum, xt});
  }
  g.output(sum);
  return g;
}

/// A compiled transposed_tanh_graph case of x [rows, cols].
Case transposed_tanh_case(const char* name, int64_t rows, int64_t cols, bool transposed);

std::vector<Tensor> linear_inputs() {
  return {filled({kLinB, kLinT, kLinK}, -1.f, 1.f), filled({kLinN, kLinK}, -0.1f, 0.1f),
          filled({kLinN})};
}

/// A compiled case: the graph is compiled in setup (not timed), each call runs it.
Benchmark compiled(ir::Graph g, std::vector<Tensor> inputs, double bytes) {
  auto exe = std::make_shared<codegen::Executable>(g);
  return {[exe, inputs] { do_not_optimize(exe->run(inputs)); }, gb_per_s(bytes)};
}

Case transposed_tanh_case(const char* name, int64_t rows, int64_t cols, bool transposed) {
  return {name, Mode::Compiled, "GB/s", [rows, cols, transposed](const RunConfig&) {
            return compiled(transposed_tanh_graph(rows, cols, transposed),
                            {filled({rows, cols}, -2.f, 2.f)}, 2 * kF32 * rows * cols);
          }};
}

constexpr double k16MBytes2 = 2 * kF32 * k16M;  // one input read, one output written
constexpr double kRowBytes2 = 2 * kF32 * kRows * kCols;

std::vector<Case> cases() {
  return {
      {"copy_16M", Mode::Reference, "GB/s", copy_16m},
      {"x_mul_x_plus_x_16M", Mode::Eager, "GB/s",
       [](const RunConfig&) -> Benchmark {
         Tensor x = filled({k16M});
         return {[x] { do_not_optimize(add(mul(x, x), x)); }, gb_per_s(k16MBytes2)};
       }},
      {"x_mul_x_plus_x_16M", Mode::Compiled, "GB/s",
       [](const RunConfig&) { return compiled(square_plus_graph(), {filled({k16M})}, k16MBytes2); }},
      {"gelu_16M", Mode::Eager, "GB/s",
       [](const RunConfig&) -> Benchmark {
         Tensor x = filled({k16M}, -3.f, 3.f);
         return {[x] { do_not_optimize(gelu_eager(x)); }, gb_per_s(k16MBytes2)};
       }},
      {"gelu_16M", Mode::Compiled, "GB/s",
       [](const RunConfig&) {
         return compiled(gelu_graph(), {filled({k16M}, -3.f, 3.f)}, k16MBytes2);
       }},
      {"softmax_4096x1024", Mode::Eager, "GB/s",
       [](const RunConfig&) -> Benchmark {
         Tensor x = filled({kRows, kCols}, -4.f, 4.f);
         return {[x] { do_not_optimize(softmax(x, -1)); }, gb_per_s(kRowBytes2)};
       }},
      {"softmax_4096x1024", Mode::Compiled, "GB/s",
       [](const RunConfig&) {
         return compiled(softmax_graph(), {filled({kRows, kCols}, -4.f, 4.f)}, kRowBytes2);
       }},
      {"log_softmax_4096x1024", Mode::Eager, "GB/s",
       [](const RunConfig&) -> Benchmark {
         Tensor x = filled({kRows, kCols}, -4.f, 4.f);
         return {[x] { do_not_optimize(log_softmax(x, -1)); }, gb_per_s(kRowBytes2)};
       }},
      {"log_softmax_4096x1024", Mode::Compiled, "GB/s",
       [](const RunConfig&) {
         return compiled(log_softmax_graph(), {filled({kRows, kCols}, -4.f, 4.f)}, kRowBytes2);
       }},
      // GB/s of the input (the output is a column).
      {"logsumexp_4096x1024", Mode::Eager, "GB/s",
       [](const RunConfig&) -> Benchmark {
         Tensor x = filled({kRows, kCols}, -4.f, 4.f);
         return {[x] { do_not_optimize(logsumexp(x, {1})); }, gb_per_s(kRowBytes2 / 2)};
       }},
      {"logsumexp_4096x1024", Mode::Compiled, "GB/s",
       [](const RunConfig&) {
         return compiled(logsumexp_graph(), {filled({kRows, kCols}, -4.f, 4.f)},
                         kRowBytes2 / 2);
       }},
      {"layer_norm_4096x1024", Mode::Eager, "GB/s",
       [](const RunConfig&) -> Benchmark {
         Tensor x = filled({kRows, kCols}, -4.f, 4.f), w = filled({kCols}), b = filled({kCols});
         return {[x, w, b] { do_not_optimize(layer_norm(x, {kCols}, w, b)); },
                 gb_per_s(kRowBytes2)};
       }},
      {"layer_norm_4096x1024", Mode::Compiled, "GB/s",
       [](const RunConfig&) {
         return compiled(layer_norm_graph(),
                         {filled({kRows, kCols}, -4.f, 4.f), filled({kCols}), filled({kCols})},
                         kRowBytes2);
       }},
      {"transposed_tanh_4096x2048", Mode::Eager, "GB/s",
       [](const RunConfig&) -> Benchmark {
         Tensor x = filled({kTRows, kTCols}, -2.f, 2.f);
         return {[x] { do_not_optimize(tanh(add(mul(x.t(), 2.0), 1.0))); }, gb_per_s(kTBytes2)};
       }},
      {"transposed_tanh_4096x2048", Mode::Compiled, "GB/s",
       [](const RunConfig&) {
         return compiled(transposed_tanh_graph(), {filled({kTRows, kTCols}, -2.f, 2.f)},
                         kTBytes2);
       }},
      transposed_tanh_case("contiguous_tanh_4096x2048", kTRows, kTCols, false),
      // Small regions: the whole input fits in L2 (1000 x 37: 145 KiB).
      transposed_tanh_case("transposed_tanh_1000x37", 1000, 37, true),
      transposed_tanh_case("transposed_tanh_37x1000", 37, 1000, true),
      {"transposed_sum3_2048x2048", Mode::Compiled, "GB/s",
       [](const RunConfig&) {
         constexpr int64_t n = 2048;
         return compiled(transposed_sum3_graph(n),
                         {filled({n, n}), filled({n, n}), filled({n, n})}, 4 * kF32 * n * n);
       }},
      {"linear_8x128x256_to_1024", Mode::Eager, "GFLOP/s",
       [](const RunConfig&) -> Benchmark {
         std::vector<Tensor> in = linear_inputs();
         return {[in] { do_not_optimize(add(matmul(in[0], in[1].t()), in[2])); },
                 gflop_per_s(kLinearFlops)};
       }},
      {"linear_8x128x256_to_1024", Mode::Compiled, "GFLOP/s",
       [](const RunConfig&) -> Benchmark {
         auto exe = std::make_shared<codegen::Executable>(linear_graph());
         std::vector<Tensor> in = linear_inputs();
         return {[exe, in] { do_not_optimize(exe->run(in)); }, gflop_per_s(kLinearFlops)};
       }},
  };
}

/// One targets line: `x` as a share of `ref`; "n/a" when a case it needs did not run.
void check_line(std::string_view what, const Record* x, const Record* ref, double target) {
  if (!x || !ref) {
    fmt::print("  {:<40} n/a (a case it needs did not run)\n", what);
    return;
  }
  double ratio = x->value / ref->value;
  fmt::print("  {:<40} {:.3g} / {:.3g} {} = {:.0f} %   target >= {:.0f} %   {}\n", what,
             x->value, ref->value, x->unit, 100 * ratio, 100 * target,
             ratio >= target ? "ok" : "MISSED");
}

void summary(std::span<const Record> records) {
  if (!suite_ran(records, kSuite)) return;
  auto find = [&](std::string_view name, Mode mode) {
    return find_record(records, kSuite, name, mode);
  };
  fmt::print("\ntargets (printed, not asserted; the machine is shared, expect +-20-30 %):\n");
  const Record* copy = find("copy_16M", Mode::Reference);
  check_line("x_mul_x_plus_x_16M compiled vs copy_16M", find("x_mul_x_plus_x_16M", Mode::Compiled),
             copy, 0.85);
  check_line("gelu_16M compiled vs copy_16M", find("gelu_16M", Mode::Compiled), copy, 0.85);
  fmt::print("compiled / eager (information; kiln's eager softmax and layer_norm are single fused\n"
             "kernels already, the target for those two is PyTorch eager, see below):\n");
  for (const char* name : {"x_mul_x_plus_x_16M", "gelu_16M", "softmax_4096x1024",
                           "layer_norm_4096x1024", "transposed_tanh_4096x2048",
                           "linear_8x128x256_to_1024"}) {
    const Record *c = find(name, Mode::Compiled), *e = find(name, Mode::Eager);
    if (c && e) fmt::print("  {:<40} {:.2f}x\n", name, c->value / e->value);
  }
  const Record *tiled = find("transposed_tanh_4096x2048", Mode::Compiled),
               *contiguous = find("contiguous_tanh_4096x2048", Mode::Compiled);
  if (tiled && contiguous)
    fmt::print("transposed_tanh / contiguous_tanh compiled (tiles' cost, 1.00x: none): {:.2f}x\n",
               tiled->value / contiguous->value);
  fmt::print("softmax / layer_norm compiled >= PyTorch 1.13 eager (target): compare with\n"
             "  /usr/bin/python3 benchmarks/peers/fusion_torch.py\n");
}

[[maybe_unused]] const bool registered = register_suite(
    {kSuite, "fused compiled graphs vs eager vs copy bandwidth (GB/s), Linear (GFLOP/s)", cases,
     summary});

}  // namespace
}  // namespace kiln::bench
