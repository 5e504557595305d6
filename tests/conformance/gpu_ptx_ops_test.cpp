// CUDA code for every op of the table: each op's first conformance sample as a one-op graph,
// compiled for cuda (PTX, no GPU needed) wherever the CPU codegen compiles it, and assembled
// with ptxas for sm_90 when the CUDA toolkit is installed. These one-op kernels are what eager
// ops on CUDA tensors run (codegen/README.md, "GPU").
#include <catch2/catch.hpp>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "codegen/codegen.h"
#include "samples.h"

using namespace kiln;

namespace {

std::string ptxas_path() {
  if (std::filesystem::exists("/usr/local/cuda/bin/ptxas")) return "/usr/local/cuda/bin/ptxas";
  return std::system("command -v ptxas > /dev/null 2>&1") == 0 ? "ptxas" : "";
}

/// ptxas's output, "" when it assembled `ptx`.
std::string assemble(const std::string& ptxas, const std::string& ptx) {
  // Named per process: ctest runs this file's tests in two processes at once (conformance,
  // conformance_gpu_loops), and one's ptx was read half written by the other's ptxas.
  auto dir = std::filesystem::temp_directory_path();
  const std::string stem = "kiln_op_" + std::to_string(::getpid());
  std::string in = (dir / (stem + ".ptx")).string(), out = (dir / (stem + ".cubin")).string();
  std::ofstream(in) << ptx;
  FILE* p = popen((ptxas + " -arch=sm_90 " + in + " -o " + out + " 2>&1").c_str(), "r");
  std::string log;
  char buf[512];
  while (p && fgets(buf, sizeof buf, p)) log += buf;
  int rc = p ? pclose(p) : -1;
  std::error_code ec;
  std::filesystem::remove(in, ec);
  std::filesystem::remove(out, ec);
  return rc == 0 ? "" : "rc " + std::to_string(rc) + ": " + log;
}

}  // namespace

TEST_CASE("gpu ptx: every op the CPU codegen compiles also compiles to PTX that assembles") {
  const std::string ptxas = ptxas_path();
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
    if (!ptxas.empty()) CHECK(assemble(ptxas, ptx) == "");
  }
  WARN("ops compiled for cuda: " << compiled << " (" << with_kernels
                                  << " with kernels); not compiled on either device: "
                                  << no_lowering);
  CHECK(compiled >= 60);
}
