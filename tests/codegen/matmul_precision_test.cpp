// Compiled GEMMs under set_float32_matmul_precision("medium") round their inputs as eager
// matmul does: once per op, decided from the whole product, whatever row blocks a run splits
// it into (codegen/runtime.h, GemmRunScope).
#include <catch2/catch.hpp>

#include "backends/cpu/bf16_gemm.h"
#include "backends/cpu/parallel.h"
#include "codegen/codegen.h"
#include "codegen/runtime.h"
#include "kiln/kiln.h"

using namespace kiln;

namespace {
struct Restore {  // the process-wide settings this file changes
  MatmulPrecision precision = float32_matmul_precision();
  int threads = cpu::num_threads();
  ~Restore() {
    set_float32_matmul_precision(precision);
    cpu::set_num_threads(threads);
  }
};

double max_diff(const Tensor& a, const Tensor& b) { return (a - b).abs().max().item<double>(); }

OpAttrs transposed() {
  OpAttrs t;  // as Tensor::transpose(0, 1)
  t.dim = 0;
  t.dim1 = 1;
  return t;
}
}  // namespace

TEST_CASE("Executable: GEMMs round as the whole eager product does, split into row blocks or "
          "batched") {
  Restore restore;
  manual_seed(11);
  // relu(x @ W.t() + b): 134 MFLOP whole, bfloat16 under medium in eager; a compiled run
  // splits x's rows into blocks of 128 or 64 rows, which alone would stay float32 (2·m·n /
  // (m + n) = 171 or 102 flops per converted element, under kBf16GemmMinFlopsPerElement).
  ir::Graph linear_graph;
  {
    ir::Value x = linear_graph.input(DType::Float32, {512, 512});
    ir::Value w = linear_graph.input(DType::Float32, {256, 512});
    ir::Value b = linear_graph.input(DType::Float32, {256});
    ir::Value y = linear_graph.op(
        OpKind::Add, {linear_graph.op(OpKind::Matmul,
                                      {x, linear_graph.op(OpKind::Transpose, {w}, transposed())}),
                      b});
    linear_graph.output(linear_graph.op(OpKind::Relu, {y}));
  }
  const Tensor x = randn({512, 512}), w = randn({256, 512}), b = randn({256});
  // [8, 64, 128] @ [128, 128] then relu: eager folds the batch into one 16.8 MFLOP product.
  ir::Graph batched_graph;
  {
    ir::Value u = batched_graph.input(DType::Float32, {8, 64, 128});
    ir::Value v = batched_graph.input(DType::Float32, {128, 128});
    ir::Value product = batched_graph.op(OpKind::Matmul, {u, v});
    batched_graph.output(batched_graph.op(OpKind::Relu, {product}));
  }
  const Tensor u = randn({8, 64, 128}), v = randn({128, 128});
  const codegen::Executable linear_exe(linear_graph), batched_exe(batched_graph);
  CHECK(linear_exe.row_parallel());
  for (int threads : {2, 4})
    for (const char* p : {"medium", "highest"}) {
      CAPTURE(threads, p);
      cpu::set_num_threads(threads);
      set_float32_matmul_precision(p);
      const uint64_t before = codegen::gemm_calls();
      const Tensor compiled = linear_exe.run({x, w, b})[0];
      CHECK(codegen::gemm_calls() - before >= 4);  // row blocks, each one GEMM
      const Tensor eager = relu(addmm(b, x, w.t()));
      const double scale = eager.abs().max().item<double>();
      CHECK(max_diff(compiled, eager) < 1e-6 * scale);
      const Tensor compiled_batched = batched_exe.run({u, v})[0];
      const Tensor eager_batched = relu(matmul(u, v));
      CHECK(max_diff(compiled_batched, eager_batched) <
            1e-6 * eager_batched.abs().max().item<double>());
      if (cpu::bf16_gemm_available() && std::string(p) == "medium") {
        set_float32_matmul_precision("highest");
        CHECK(max_diff(compiled, relu(addmm(b, x, w.t()))) > 1e-4 * scale);  // bfloat16 inputs
        CHECK(max_diff(compiled_batched, relu(matmul(u, v))) >
              1e-4 * eager_batched.abs().max().item<double>());
      }
    }
}

TEST_CASE("Executable: GEMMs whose rows are not the split rows keep eager's rounding") {
  Restore restore;
  manual_seed(12);
  set_float32_matmul_precision("medium");
  // (1) A batch_matmul split over its batch: each product has its own B and 128 rows (4.2
  // MFLOP, float32 in eager); the blocks must not count the run's batch as its rows.
  ir::Graph bmm_graph;
  {
    ir::Value u = bmm_graph.input(DType::Float32, {8, 128, 128});
    ir::Value v = bmm_graph.input(DType::Float32, {8, 128, 128});
    bmm_graph.output(bmm_graph.op(OpKind::Relu, {bmm_graph.op(OpKind::Matmul, {u, v})}));
  }
  const Tensor u = randn({8, 128, 128}), v = randn({8, 128, 128});
  // (2) x + W1 @ W2: every row block computes the whole 128 x 128 x 128 product (4.2 MFLOP).
  ir::Graph whole_graph;
  {
    ir::Value x = whole_graph.input(DType::Float32, {4, 128, 128});
    ir::Value w1 = whole_graph.input(DType::Float32, {128, 128});
    ir::Value w2 = whole_graph.input(DType::Float32, {128, 128});
    whole_graph.output(whole_graph.op(OpKind::Add, {x, whole_graph.op(OpKind::Matmul, {w1, w2})}));
  }
  const Tensor x = randn({4, 128, 128}), w1 = randn({128, 128}), w2 = randn({128, 128});
  const codegen::Executable bmm_exe(bmm_graph), whole_exe(whole_graph);
  for (int threads : {2, 4}) {
    CAPTURE(threads);
    cpu::set_num_threads(threads);
    const Tensor eager_bmm = relu(matmul(u, v)), eager_whole = x + matmul(w1, w2);
    CHECK(max_diff(bmm_exe.run({u, v})[0], eager_bmm) <
          1e-6 * eager_bmm.abs().max().item<double>());
    CHECK(max_diff(whole_exe.run({x, w1, w2})[0], eager_whole) <
          1e-6 * eager_whole.abs().max().item<double>());
  }
}
