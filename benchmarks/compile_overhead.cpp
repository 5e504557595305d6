// Suite compile-overhead: what kiln::compile costs on top of the work it runs.
//  * call_overhead_1op: a compiled 1-op function (x + x) on 1-element float32 tensors, warmed
//    up (the first call traces and compiles), so each timed call is the guard check plus the
//    replay — ns per call, mode compiled; beside the plain eager call of the same function,
//    mode eager.
//  * call_overhead_4_tensors: the same 1-op function with 4 tensor arguments (4 sets of tensor
//    guards checked per call) — ns per call; the guard target is <= 1 µs for 4 tensors.
//  * transformer_layer_compile: the first call of a fresh kiln::compile of the reference
//    Transformer layer's forward + backward (nn::TransformerEncoderLayer: d_model 256, 4 heads,
//    FFN 1024, gelu, dropout 0.1, batch_first; input [8, 128, 256]; the layer's parameters
//    require grad, so the backward is traced with the forward) — trace + compile, ms. Cold:
//    KILN_DISABLE_CACHE=1 and the in-memory compile cache cleared before each repetition.
//  * transformer_layer_compile_warm: the same with the in-memory cache kept (a second fresh
//    compile() of the same function, its kernels served from memory) — ms.
// Targets: call_overhead_1op compiled <= 1 µs, transformer_layer_compile cold <= 3000 ms; the
// summary checks them.
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <tuple>

#include <fmt/format.h>

#include "benchmarks/harness.h"
#include "codegen/codegen.h"
#include "kiln/kiln.h"
#include "nn/transformer.h"

namespace kiln::bench {
namespace {

constexpr char kSuite[] = "compile-overhead";
constexpr double kCallTargetNs = 1000, kColdTargetMs = 3000;

// ---- call_overhead_1op ----

Tensor one_op(const Tensor& x) { return x + x; }

Benchmark eager_1op(const RunConfig&) {
  Tensor x = filled({1});
  return {[x] { do_not_optimize(one_op(x)); }, ns_per_call()};
}

Benchmark compiled_1op(const RunConfig&) {
  Tensor x = filled({1});
  auto cf = kiln::compile([](const Tensor& t) { return one_op(t); }, CompileOptions{},
                          "call_overhead_1op");
  cf(x);  // traces and compiles
  cf(x);  // first replay
  if (cf.compile_count() != 1)
    throw std::runtime_error(fmt::format("expected 1 compile after warm-up, got {}:\n{}",
                                         cf.compile_count(), cf.explain()));
  return {[cf, x] { do_not_optimize(cf(x)); }, ns_per_call()};
}

// ---- call_overhead_4_tensors: guards of 4 tensor arguments ----

Benchmark compiled_4args(const RunConfig&) {
  Tensor a = filled({1}), b = filled({1}), c = filled({1}), d = filled({1});
  auto cf = kiln::compile(
      [](const Tensor& a, const Tensor& b, const Tensor& c, const Tensor& d) { return one_op(a); },
      CompileOptions{}, "call_overhead_4_tensors");
  cf(a, b, c, d);
  cf(a, b, c, d);
  return {[cf, a, b, c, d] { do_not_optimize(cf(a, b, c, d)); }, ns_per_call()};
}

// ---- transformer_layer_compile ----

ValueFn ms_per_call() {
  return [](double seconds) { return seconds * 1e3; };
}

/// Sets an environment variable for its lifetime, then restores the previous value (so the
/// disabled disk cache does not leak into the suites that run after this one).
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    ::setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (old_) ::setenv(name_, old_->c_str(), 1);
    else ::unsetenv(name_);
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

struct TransformerWorkload {
  std::shared_ptr<nn::TransformerEncoderLayer> layer;
  Tensor x;
};

TransformerWorkload transformer_workload() {
  nn::TransformerEncoderLayerOptions o;
  o.d_model = 256;
  o.nhead = 4;
  o.dim_feedforward = 1024;
  o.dropout = 0.1;
  o.activation = "gelu";
  o.batch_first = true;
  return {std::make_shared<nn::TransformerEncoderLayer>(o), filled({8, 128, 256})};
}

/// One fresh compile() of the layer's forward + backward, called once (trace + compile).
/// Returns the compiled function so callers can inspect explain().
auto compile_and_call_once(const TransformerWorkload& w) {
  auto layer = w.layer;
  auto cf = kiln::compile([layer](const Tensor& x) { return layer->forward(x).sum(); },
                          CompileOptions{}, "transformer_layer");
  EnableGradGuard grad;  // the joint forward + backward is traced only with grad mode on
  Tensor loss = cf(w.x);
  do_not_optimize(loss);
  return cf;
}

Benchmark transformer_cold(const RunConfig&) {
  auto w = std::make_shared<TransformerWorkload>(transformer_workload());
  return {[w] {
            ScopedEnv no_disk("KILN_DISABLE_CACHE", "1");
            codegen::clear_memory_cache();
            compile_and_call_once(*w);
          },
          ms_per_call()};
}

Benchmark transformer_warm(const RunConfig&) {
  auto w = std::make_shared<TransformerWorkload>(transformer_workload());
  // The in-memory cache holds code only while something uses it: this first compiled function
  // stays alive (in the closure) so that the timed ones hit its code.
  using Kept = decltype(compile_and_call_once(*w));
  std::shared_ptr<Kept> kept;
  {
    ScopedEnv no_disk("KILN_DISABLE_CACHE", "1");
    codegen::clear_memory_cache();
    kept = std::make_shared<Kept>(compile_and_call_once(*w));  // fills the cache (not timed)
  }
  return {[w, kept] {
            ScopedEnv no_disk("KILN_DISABLE_CACHE", "1");  // memory cache only
            compile_and_call_once(*w);
          },
          ms_per_call()};
}

std::vector<Case> cases() {
  std::vector<Case> out = {
      {"call_overhead_1op", Mode::Eager, "ns", eager_1op},
      {"call_overhead_1op", Mode::Compiled, "ns", compiled_1op},
      {"call_overhead_4_tensors", Mode::Compiled, "ns", compiled_4args},
      {"transformer_layer_compile", Mode::Compiled, "ms", transformer_cold},
      {"transformer_layer_compile_warm", Mode::Compiled, "ms", transformer_warm},
  };
  // A compile is seconds long: exactly 3 timed first calls (1 under --quick), no warm-up (a
  // warm-up would only fill caches the cold case clears anyway).
  for (Case& c : out) {
    if (c.unit != "ms") continue;
    c.fixed_warmup = 0;
    c.fixed_reps = 3;
    c.quick_warmup = 0;
    c.quick_reps = 1;
  }
  return out;
}

void summary(std::span<const Record> records) {
  auto find = [&](std::string_view name, Mode mode) {
    return find_record(records, kSuite, name, mode);
  };
  const Record* call_c = find("call_overhead_1op", Mode::Compiled);
  const Record* call_e = find("call_overhead_1op", Mode::Eager);
  const Record* cold = find("transformer_layer_compile", Mode::Compiled);
  const Record* warm = find("transformer_layer_compile_warm", Mode::Compiled);
  if (!suite_ran(records, kSuite)) return;

  fmt::print("\ncompile-overhead targets (printed, not asserted; the machine is shared):\n");
  if (call_c)
    print_target("call_overhead_1op compiled (guard + replay)", call_c->value, "ns",
                 kCallTargetNs, true);
  else
    fmt::print("  {:<44} n/a (the case did not run)\n", "call_overhead_1op compiled");
  if (const Record* c4 = find("call_overhead_4_tensors", Mode::Compiled))
    print_target("call_overhead_4_tensors (4 guards + replay)", c4->value, "ns", kCallTargetNs,
                 true);
  if (call_c && call_e)
    fmt::print("  {:<44} {:8.0f} ns   (compiled / eager {:.2f}x)\n",
               "call_overhead_1op eager (information)", call_e->value,
               call_c->value / call_e->value);
  if (cold)
    print_target("transformer_layer_compile cold (median)", cold->median_ms, "ms", kColdTargetMs,
                 true);
  else
    fmt::print("  {:<44} n/a (the case did not run or failed)\n", "transformer_layer_compile cold");
  if (warm)
    fmt::print("  {:<44} {:8.1f} ms   (information: memory cache kept)\n",
               "transformer_layer_compile warm (median)", warm->median_ms);
  for (const Record& r : records)
    if (r.suite == kSuite && r.status == Status::Failed)
      fmt::print("  FAILED {} ({}): {}\n", r.case_name, mode_name(r.mode), r.error);

  // What the compile produced: the explain() lines that count regions and kernels.
  if (cold || warm) {
    try {
      TransformerWorkload w = transformer_workload();
      auto cf = compile_and_call_once(w);
      std::string text = cf.explain();
      fmt::print("  transformer layer, kiln::compile explain() ({} trace(s)):\n",
                 cf.compile_count());
      size_t begin = 0;
      while (begin < text.size()) {
        size_t end = text.find('\n', begin);
        if (end == std::string::npos) end = text.size();
        std::string_view line(text.data() + begin, end - begin);
        if (line.find("segment:") != std::string_view::npos ||
            line.find("backward:") != std::string_view::npos)
          fmt::print("    {}\n", line.substr(line.find_first_not_of(' ')));
        begin = end + 1;
      }
    } catch (const std::exception& e) {
      fmt::print("  explain() unavailable: {}\n", e.what());
    }
  }
}

[[maybe_unused]] const bool registered = register_suite(
    {kSuite, "kiln::compile overhead: guard + replay per call, trace + compile of a Transformer layer",
     cases, summary});

}  // namespace
}  // namespace kiln::bench
