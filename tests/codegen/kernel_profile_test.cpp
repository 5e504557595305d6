// Kernel timers of compiled CPU code (CompileOptions::profile_kernels, codegen/kernel_profile.h).
#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "codegen/codegen.h"
#include "kiln/kiln.h"

using namespace kiln;

namespace {

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// The kernel descriptions that contain `part`.
int count_kernels(const std::vector<codegen::KernelTime>& times, const std::string& part) {
  int n = 0;
  for (const auto& t : times) n += contains(t.kernel, part);
  return n;
}

bool same_values(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() &&
         std::memcmp(a.contiguous().raw_data(), b.contiguous().raw_data(),
                     static_cast<size_t>(a.numel()) * itemsize(a.dtype())) == 0;
}

codegen::CompileOptions profiled() {
  codegen::CompileOptions o;
  o.profile_kernels = true;
  o.disk_cache = false;
  return o;
}

}  // namespace

TEST_CASE("kernel timers: every kernel of a graph is timed and named after its source lines") {
  // exp(x) * sum(x) + xᵀ @ x: a full sum (not row-splittable), an elementwise nest, a GEMM.
  ir::Graph g;
  ir::Value x = g.input(DType::Float32, {300, 300});
  const int sum_line = __LINE__ + 1;
  ir::Value s = g.op(OpKind::Sum, {x});
  const int exp_line = __LINE__ + 1;
  ir::Value e = g.op(OpKind::Exp, {x});
  OpAttrs t;
  t.dim = 0;
  t.dim1 = 1;
  const int gemm_line = __LINE__ + 1;
  ir::Value p = g.op(OpKind::Matmul, {g.op(OpKind::Transpose, {x}, t), x});
  g.output(g.op(OpKind::Add, {g.op(OpKind::Mul, {e, s}), p}));

  codegen::Executable exe(g, profiled());
  REQUIRE_FALSE(exe.row_parallel());
  Tensor in = mul(randn({300, 300}), Scalar(0.1));
  Tensor out;
  for (int k = 0; k < 3; ++k) out = exe.run({in})[0];

  const std::vector<codegen::KernelTime> times = exe.kernel_times();
  REQUIRE(times.size() >= 3);
  for (const auto& k : times) {
    INFO(k.kernel);
    CHECK(k.calls == 3);
    CHECK(k.total_ms > 0);
    CHECK(k.total_ms < 60e3);
  }
  // Each kernel names the graph ops fused into it and their source lines.
  const std::string file = "kernel_profile_test.cpp:";
  auto line = [&](int l) { return file + std::to_string(l); };
  CHECK(count_kernels(times, "GEMM [300, 300] x [300, 300] (" + line(gemm_line) + ")") == 1);
  int sums = 0, exps = 0;
  for (const auto& k : times) {
    INFO(k.kernel);
    if (contains(k.kernel, ": sum")) {
      ++sums;
      CHECK(contains(k.kernel, "loop nest [300, 300]"));
      CHECK(contains(k.kernel, line(sum_line)));
    }
    if (contains(k.kernel, "exp")) {
      ++exps;
      CHECK(contains(k.kernel, "loop nest [300, 300]: "));
      CHECK(contains(k.kernel, line(exp_line)));
      CHECK_FALSE(contains(k.kernel, line(gemm_line)));
    }
  }
  CHECK(sums == 1);
  CHECK(exps == 1);

  SECTION("the timers change no value, and code without them has none") {
    codegen::CompileOptions plain;
    plain.disk_cache = false;
    codegen::Executable untimed(g, plain);
    CHECK(same_values(untimed.run({in})[0], out));
    if (!codegen::kernel_profiling(plain)) CHECK(untimed.kernel_times().empty());
  }
  SECTION("a second Executable of the same graph counts its own runs") {
    codegen::Executable again(g, profiled());
    again.run({in});
    for (const auto& k : again.kernel_times()) CHECK(k.calls == 1);
    for (const auto& k : exe.kernel_times()) CHECK(k.calls == 3);
  }
  SECTION("the descriptions come back from the disk cache") {
    char dir[] = "/tmp/kiln-kernel-timers-XXXXXX";
    REQUIRE(::mkdtemp(dir) != nullptr);
    codegen::CompileOptions o = profiled();
    o.disk_cache = true;
    o.cache_dir = dir;
    codegen::clear_memory_cache();
    codegen::Executable first(g, o);
    codegen::clear_memory_cache();
    codegen::Executable loaded(g, o);
    if (!first.stats().disk_note.starts_with("disabled")) {  // KILN_DISABLE_CACHE=1 is set
      CHECK(loaded.stats().source == codegen::CompileStats::Source::DiskCache);
      CHECK(same_values(loaded.run({in})[0], out));
      const auto a = first.kernel_times(), b = loaded.kernel_times();
      REQUIRE(a.size() == b.size());
      for (size_t k = 0; k < a.size(); ++k) {
        CHECK(a[k].kernel == b[k].kernel);
        CHECK(b[k].calls == 1);
      }
    }
    std::filesystem::remove_all(dir);
  }
}

TEST_CASE("kernel timers: row-parallel graphs have none") {
  ir::Graph g;
  ir::Value x = g.input(DType::Float32, {512, 256});
  g.output(g.op(OpKind::Exp, {x}));
  codegen::Executable exe(g, profiled());
  REQUIRE(exe.row_parallel());
  Tensor in = randn({512, 256});
  // Against float64: eager's float32 kernels may round otherwise (sanitizer builds).
  Tensor out = exe.run({in})[0].contiguous(), xs = in.contiguous();
  double worst = 0;
  for (int64_t i = 0; i < xs.numel(); ++i) {
    const double want = std::exp(static_cast<double>(xs.data<float>()[i]));
    worst = std::max(worst, std::abs(out.data<float>()[i] - want) / want);
  }
  CHECK(worst < 1e-6);
  CHECK(exe.kernel_times().empty());
}
