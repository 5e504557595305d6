// Compiled code whose intermediate buffer cannot be allocated (codegen/alloc_checks.cpp): it
// wrote through the null pointer (SIGSEGV, break-it pass); now run() raises kiln::Error, frees
// the blocks the code had allocated, and the next run is right.
#include <catch2/catch.hpp>
#include <cmath>
#include <string>
#include <vector>

#include "backends/cpu/parallel.h"
#include "codegen/codegen.h"
#include "codegen/runtime.h"
#include "kiln/kiln.h"

using namespace kiln;

namespace {

struct Case {
  std::string name;
  ir::Graph graph;
  std::vector<Tensor> inputs;
  Tensor want;  // float64, of the first output
};

// x [1, 1] expanded to [n, n], plus b [n], summed: compiled code copies the expanded view.
Case expand_add_sum(int64_t n) {
  Case c{"expand + add + sum", {}, {randn({1, 1}), randn({n})}, {}};
  ir::Graph& g = c.graph;
  OpAttrs to_square;
  to_square.dims = {n, n};
  OpAttrs all;
  all.all_dims = true;
  ir::Value x = g.input(DType::Float32, {1, 1}), b = g.input(DType::Float32, {n});
  g.output(g.op(OpKind::Sum, {g.op(OpKind::Add, {g.op(OpKind::Expand, {x}, to_square), b})}, all));
  Tensor x64 = c.inputs[0].to(DType::Float64), b64 = c.inputs[1].to(DType::Float64);
  c.want = sum(add(x64.expand({n, n}), b64));
  return c;
}

// softmax(x) @ w per row, then tanh: row blocks, a GEMM on an intermediate.
Case softmax_matmul(int64_t rows, int64_t cols, int64_t out) {
  Case c{"softmax @ w, tanh", {}, {randn({rows, cols}), randn({cols, out})}, {}};
  ir::Graph& g = c.graph;
  OpAttrs last;
  last.dim = -1;
  ir::Value x = g.input(DType::Float32, {rows, cols}), w = g.input(DType::Float32, {cols, out});
  g.output(g.op(OpKind::Tanh,
                {g.op(OpKind::Matmul, {g.op(OpKind::Softmax, {x}, last), w})}));
  Tensor x64 = c.inputs[0].to(DType::Float64), w64 = c.inputs[1].to(DType::Float64);
  c.want = tanh(matmul(softmax(x64, -1), w64));
  return c;
}

double max_error(const Tensor& got, const Tensor& want) {
  return amax(abs(sub(got.to(DType::Float64), want))).item<double>();
}

// Runs `exe`, expecting the failure of an intermediate allocation.
void expect_allocation_error(const codegen::Executable& exe, const std::vector<Tensor>& in) {
  try {
    (void)exe.run(in);
    FAIL("the run succeeded although an allocation failed");
  } catch (const Error& e) {
    CHECK(e.op() == "codegen::Executable::run");
    CHECK_THAT(e.what(), Catch::Contains("out of memory allocating") &&
                             Catch::Contains("intermediate buffer"));
  }
}

}  // namespace

TEST_CASE("alloc failure: each intermediate allocation that fails raises, and frees the rest",
          "[memory]") {
  const int threads = cpu::num_threads();
  cpu::set_num_threads(1);  // every block on this thread: its live blocks can be counted
  for (int which = 0; which < 2; ++which) {
    Case c = which == 0 ? expand_add_sum(64) : softmax_matmul(300, 40, 8);
    INFO(c.name);
    codegen::Executable exe(c.graph);
    const uint64_t first = codegen::intermediate_allocations_on_this_thread();
    const size_t live = codegen::live_intermediate_blocks_on_this_thread();
    CHECK(max_error(exe.run(c.inputs)[0], c.want) < 1e-4);
    const uint64_t allocations = codegen::intermediate_allocations_on_this_thread() - first;
    REQUIRE(allocations > 0);  // else the case tests nothing
    for (uint64_t k = 0; k < allocations; ++k) {
      INFO("allocation " << k << " of " << allocations << " fails");
      codegen::fail_intermediate_allocation_for_testing(static_cast<int64_t>(k));
      expect_allocation_error(exe, c.inputs);
      codegen::fail_intermediate_allocation_for_testing(-1);
      CHECK(codegen::live_intermediate_blocks_on_this_thread() == live);
      CHECK(max_error(exe.run(c.inputs)[0], c.want) < 1e-4);
    }
  }
  cpu::set_num_threads(threads);
  CHECK(codegen::foreign_block_frees() == 0);
}

TEST_CASE("alloc failure: a failure in a row block on the thread pool raises too", "[memory]") {
  const int threads = cpu::num_threads();
  cpu::set_num_threads(std::max(threads, 2));
  Case c = softmax_matmul(8192, 64, 16);  // row blocks spread over the pool
  codegen::Executable exe(c.graph);
  CHECK(max_error(exe.run(c.inputs)[0], c.want) < 1e-4);
  for (int64_t k : {0, 1, 3, 7}) {
    INFO("allocation " << k << " fails");
    codegen::fail_intermediate_allocation_for_testing(k);
    expect_allocation_error(exe, c.inputs);
    codegen::fail_intermediate_allocation_for_testing(-1);
    CHECK(max_error(exe.run(c.inputs)[0], c.want) < 1e-4);
  }
  cpu::set_num_threads(threads);
  CHECK(codegen::foreign_block_frees() == 0);
}
