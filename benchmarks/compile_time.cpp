// Suite compile-time: how long codegen::Executable takes to get a 10-op elementwise float32
// graph ready to run.
//  * elementwise_10op_cold: a full compile (MLIR pipeline, LLVM -O2, object code, JIT link) with
//    the in-memory and disk caches bypassed — ms.
//  * elementwise_1000op_cold: the same for a chain of 1,000 ops (x * 1.0001 + 0.001, 500
//    times) — ms; linear growth, where one fused loop body of all of them was quadratic.
//  * elementwise_10op_warm: a new Executable of the same graph served from the disk cache (a
//    fresh temporary directory; the in-memory cache is cleared before each call) — ms.
// Targets: cold <= 100 ms, warm <= 10 ms; the summary checks them and splits a compile by stage.
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <tuple>

#include <fmt/format.h>

#include "benchmarks/harness.h"
#include "codegen/codegen.h"

namespace kiln::bench {
namespace {

constexpr double kColdTargetMs = 100, kWarmTargetMs = 10;

/// mul, add, tanh, sub, mul, neg, abs, maximum, sigmoid, add on two [256, 256] inputs.
ir::Graph chain10() {
  ir::Graph g;
  ir::Value x = g.input(DType::Float32, {256, 256}), y = g.input(DType::Float32, {256, 256});
  ir::Value v = g.op(OpKind::Tanh, {g.op(OpKind::Add, {g.op(OpKind::Mul, {x, y}), x})});
  v = g.op(OpKind::Neg, {g.op(OpKind::Mul, {g.op(OpKind::Sub, {v, y}), x})});
  v = g.op(OpKind::Sigmoid, {g.op(OpKind::Maximum, {g.op(OpKind::Abs, {v}), y})});
  g.output(g.op(OpKind::Add, {v, x}));
  return g;
}

/// x * 1.0001 + 0.001 applied 500 times: 1,000 ops in one chain, as an unrolled loop makes.
/// Fusion caps a loop body (codegen/fusion.cpp), so its compile time grows linearly.
ir::Graph chain1000() {
  ir::Graph g;
  ir::Value v = g.input(DType::Float32, {256});
  ir::Value scale = g.constant(1.0001, DType::Float32), shift = g.constant(0.001, DType::Float32);
  for (int i = 0; i < 500; ++i) v = g.op(OpKind::Add, {g.op(OpKind::Mul, {v, scale}), shift});
  g.output(v);
  return g;
}

ValueFn ms_per_call() {
  return [](double seconds) { return seconds * 1e3; };
}

/// A temporary cache directory, removed with the last body that uses it.
struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/tmp/kiln-bench-cache-XXXXXX";
    if (!::mkdtemp(tmpl)) throw Skipped("cannot create a temporary directory");
    path = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

Benchmark cold_of(ir::Graph graph) {
  auto g = std::make_shared<ir::Graph>(std::move(graph));
  codegen::CompileOptions uncached;
  uncached.memory_cache = false;
  uncached.disk_cache = false;
  return {[=] {
            codegen::Executable exe(*g, uncached);
            do_not_optimize(exe.num_kernels());
          },
          ms_per_call()};
}

Benchmark warm(const RunConfig&) {
  auto g = std::make_shared<ir::Graph>(chain10());
  auto dir = std::make_shared<TempDir>();
  codegen::CompileOptions disk;
  disk.cache_dir = dir->path;
  codegen::Executable first(*g, disk);  // writes the entry
  return {[g, dir, disk] {  // holds `dir`: it is removed with the last copy
            codegen::clear_memory_cache();
            codegen::Executable exe(*g, disk);
            if (exe.stats().source != codegen::CompileStats::Source::DiskCache)
              throw std::runtime_error("not served from the disk cache: " + exe.stats().disk_note);
            do_not_optimize(exe.num_kernels());
          },
          ms_per_call()};
}

std::vector<Case> compile_cases() {
  return {{"elementwise_10op_cold", Mode::Compiled, "ms",
           [](const RunConfig&) { return cold_of(chain10()); }},
          {"elementwise_1000op_cold", Mode::Compiled, "ms",
           [](const RunConfig&) { return cold_of(chain1000()); }},
          {"elementwise_10op_warm", Mode::Compiled, "ms", warm}};
}

void summary(std::span<const Record> records) {
  const Record* c = find_record(records, "compile-time", "elementwise_10op_cold", Mode::Compiled);
  const Record* w = find_record(records, "compile-time", "elementwise_10op_warm", Mode::Compiled);
  if (!c && !w) return;
  fmt::print("\nCompile time of a 10-op elementwise float32 graph (median):\n");
  for (auto [r, what, target] : {std::tuple{c, "cold (no cache)", kColdTargetMs},
                                 std::tuple{w, "warm (disk cache)", kWarmTargetMs}})
    if (r)
      fmt::print("  {:<18} {:7.2f} ms  (target <= {:.0f} ms: {})\n", what, r->median_ms, target,
                 r->median_ms <= target ? "met" : "MISSED");
  codegen::CompileOptions uncached;
  uncached.memory_cache = false;
  uncached.disk_cache = false;
  try {
    codegen::CompileStats s = codegen::Executable(chain10(), uncached).stats();
    fmt::print("  one cold compile by stage: lower {:.1f}, bufferize {:.1f}, LLVM dialect {:.1f}, "
               "LLVM -O2 {:.1f}, codegen {:.1f}, JIT link {:.1f}; total {:.1f} ms, object {} "
               "bytes\n",
               s.lower_ms, s.bufferize_ms, s.llvm_dialect_ms, s.llvm_opt_ms, s.codegen_ms,
               s.link_ms, s.total_ms, s.object_bytes);
  } catch (const std::exception& e) {
    fmt::print("  stage split unavailable: {}\n", e.what());
  }
}

[[maybe_unused]] const bool registered = register_suite(
    {"compile-time", "codegen::Executable build time: cold compile vs disk-cache hit",
     compile_cases, summary});

}  // namespace
}  // namespace kiln::bench
