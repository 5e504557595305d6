// CUDA code for every op of the table: each op's first conformance sample as a one-op graph,
// compiled for cuda (PTX, no GPU needed) wherever the CPU codegen compiles it, and assembled
// with ptxas for sm_90 when the CUDA toolkit is installed. These one-op kernels are what eager
// ops on CUDA tensors run (codegen/README.md, "GPU").
#include <catch2/catch.hpp>

#include <string>

#include "codegen/codegen.h"
#include "ptxas.h"
#include "samples.h"

using namespace kiln;

TEST_CASE("gpu ptx: every op the CPU codegen compiles also compiles to PTX that assembles") {
  const std::string ptxas = testing::find_ptxas();
  if (ptxas.empty()) WARN("skipped ptxas checks: ptxas not found (CUDA toolkit not installed)");
  codegen::CompileOptions cpu_opts;
  cpu_opts.disk_cache = false;
  codegen::CompileOptions gpu_opts = cpu_opts;
  gpu_opts.device = Device::cuda();
  int compiled = 0, with_kernels = 0;
  std::string no_lowering;
  for (int i = 0; i < kNumOps; ++i) {
    OpKind k = static_cast<OpKind>(i);
    std::string missing;
    auto samples = conf::samples(k, false, missing);
    if (samples.empty()) continue;
    const conf::Sample& s = samples.front();
    std::vector<Tensor> inputs = s.make();
    ir::Graph g;
    std::vector<ir::Value> vals;
    for (const Tensor& t : inputs) vals.push_back(g.input(t.dtype(), t.shape().vec()));
    try {
      ir::Value out = g.op(k, vals, s.attrs);
      g.output(out);
      codegen::Executable cpu(g, cpu_opts);
    } catch (const Error&) {  // not in the IR, or no CPU lowering: no GPU one either
      no_lowering += std::string(op_info(k).name) + " ";
      continue;
    }
    INFO("op " << op_info(k).name << " (" << s.what << ")");
    std::string ptx;
    CHECK_NOTHROW(ptx = codegen::Executable(g, gpu_opts).ptx());
    ++compiled;
    if (ptx.empty()) continue;  // a view or a GEMM alone: no kernel
    ++with_kernels;
    CHECK(ptx.find(".target sm_90") != std::string::npos);
    if (!ptxas.empty()) CHECK(testing::ptxas_errors(ptxas, ptx, "op") == "");
  }
  WARN("ops compiled for cuda: " << compiled << " (" << with_kernels
                                  << " with kernels); not compiled on either device: "
                                  << no_lowering);
  CHECK(compiled >= 60);
}
