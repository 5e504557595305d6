// Short inner loops (codegen/loop_hints.cpp): a row of 10 classes becomes masked AVX-512 code
// instead of scalar code, with the same results as eager.
#include <catch2/catch.hpp>

#include <string>

#include "kiln/kiln.h"
#include "tests/codegen/compile_logs.h"

using namespace kiln;
using kiln::test::count;

TEST_CASE("loop hints: log_softmax over 10 classes is masked vector code and matches eager") {
  ir::Graph g;
  ir::Value x = g.input(DType::Float32, {64, 10});
  OpAttrs last;
  last.dim = -1;
  g.output(g.op(OpKind::LogSoftmax, {x}, last));
  const std::string ir = test::compile_logs(g, "codegen");
  REQUIRE(ir.find("LLVM IR after -O2") != std::string::npos);
  if (__builtin_cpu_supports("avx512f")) {
    // The rows' max, exp-sum and output loops run on masked 16-lane vectors; without the
    // hints -O2 unrolled them into scalar code (no masked loads at all).
    CHECK(count(ir, "@llvm.masked.load.v16f32") >= 2);
  } else {
    WARN("skipped the vector-code check: the host has no AVX-512");
  }
  codegen::Executable exe(g);
  Tensor in = mul(randn({64, 10}), 4.0);
  Tensor got = exe.run({in})[0];
  Tensor want = log_softmax(in.to(DType::Float64), -1);
  CHECK(amax(abs(sub(got.to(DType::Float64), want))).item<double>() < 1e-5);
}
