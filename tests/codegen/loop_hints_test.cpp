// Short inner loops (codegen/loop_hints.cpp): a row of 10 classes becomes masked AVX-512 code
// instead of scalar code, with the same results as eager.
#include <catch2/catch.hpp>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>

#include "codegen/codegen.h"
#include "kiln/kiln.h"

using namespace kiln;

namespace {

/// The optimised LLVM IR of `g` (KILN_LOGS=codegen, read back from stderr) and its
/// Executable's outputs for `inputs`. The caches are skipped so the pipeline runs.
std::string optimised_ir(const ir::Graph& g) {
  const char* old_disable = std::getenv("KILN_DISABLE_CACHE");
  std::string saved_disable = old_disable ? old_disable : "";
  ::setenv("KILN_DISABLE_CACHE", "1", 1);
  codegen::clear_memory_cache();
  char path[] = "/tmp/kiln-loop-hints-XXXXXX";
  int fd = ::mkstemp(path);
  REQUIRE(fd >= 0);
  std::fflush(stderr);
  int saved = ::dup(2);
  ::dup2(fd, 2);
  codegen::set_log_stages("codegen");
  { codegen::Executable exe(g); }
  codegen::set_log_stages("");
  std::fflush(stderr);
  ::dup2(saved, 2);
  ::close(saved);
  ::close(fd);
  if (old_disable) ::setenv("KILN_DISABLE_CACHE", saved_disable.c_str(), 1);
  else ::unsetenv("KILN_DISABLE_CACHE");
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::remove(path);
  return text;
}

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

}  // namespace

TEST_CASE("loop hints: log_softmax over 10 classes is masked vector code and matches eager") {
  ir::Graph g;
  ir::Value x = g.input(DType::Float32, {64, 10});
  OpAttrs last;
  last.dim = -1;
  g.output(g.op(OpKind::LogSoftmax, {x}, last));
  const std::string ir = optimised_ir(g);
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
