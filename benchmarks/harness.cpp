#include "benchmarks/harness.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <map>
#include <memory>
#include <stdexcept>
#include <string_view>

#include "backends/cpu/blas.h"
#include "backends/cpu/parallel.h"
#include "backends/cuda/profile.h"
#include "core/env.h"
#include "eager/factories.h"

namespace kiln::bench {

std::string_view mode_name(Mode mode) {
  switch (mode) {
    case Mode::Eager: return "eager";
    case Mode::Compiled: return "compiled";
    case Mode::Reference: return "reference";
    case Mode::Peer: return "peer";
  }
  return "?";
}

ValueFn gb_per_s(double bytes_per_call) {
  return [bytes_per_call](double s) { return bytes_per_call / s / 1e9; };
}
ValueFn gflop_per_s(double flops_per_call) {
  return [flops_per_call](double s) { return flops_per_call / s / 1e9; };
}
ValueFn ns_per_call() {
  return [](double s) { return s * 1e9; };
}
ValueFn per_second(double count_per_call) {
  return [count_per_call](double s) { return count_per_call / s; };
}

namespace {

// A function-local static, so suites registering from other files' static initialisers
// never see it unconstructed.
std::map<std::string, Suite, std::less<>>& registry() {
  static std::map<std::string, Suite, std::less<>> r;
  return r;
}

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

/// Timing policy; --quick shrinks it so a suite takes seconds.
struct Policy {
  int warmup_calls;  // at least this many untimed calls...
  double warmup_s;   // ...and at least this long (fills the allocator cache, caches)
  double min_rep_s;  // calls are batched so one repetition lasts at least this long
  int min_reps, max_reps;
  double target_s;   // aim for this much timed work per case
};

Policy policy_for(const RunConfig& config) {
  // Quick still warms up for 150 ms: the first ~100 ms of matmuls in a process run up to 2x
  // slower (oneDNN generating its kernels, OpenMP starting threads, pages settling), which
  // would otherwise land in the timed repetitions.
  if (config.quick) return {2, 0.15, 0.001, 3, 30, 0.15};
  return {3, 0.1, 0.002, 10, 200, 1.0};
}

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

bool register_suite(Suite suite) {
  std::string name = suite.name;
  if (!registry().emplace(name, std::move(suite)).second)
    throw std::logic_error("kiln-bench: suite '" + name + "' registered twice");
  return true;
}

std::vector<const Suite*> suites() {
  std::vector<const Suite*> out;
  for (const auto& [name, suite] : registry()) out.push_back(&suite);
  return out;
}

const Suite* find_suite(std::string_view name) {
  auto it = registry().find(name);
  return it == registry().end() ? nullptr : &it->second;
}

namespace {

Record new_record(const Suite& suite, const Case& c) {
  Record rec;
  rec.suite = suite.name;
  rec.case_name = c.name;
  rec.mode = c.mode;
  rec.unit = c.unit;
  return rec;
}

// A fixed-step case's warm-up or timed calls under this run's setting (--quick or not).
int fixed_calls(const Case& c, const RunConfig& config, bool timed) {
  return config.quick ? (timed ? c.quick_reps : c.quick_warmup)
                      : (timed ? c.fixed_reps : c.fixed_warmup);
}

// A fixed-step case's step that took a second or more, reported on stderr as it ends: a long
// case (the Transformer at its original size on a GPU) then shows how far it got even when a
// time limit stops it (the device check's first H200 run timed out with no figure at all).
void report_slow_step(const Case& c, const RunConfig& config, bool timed, int i, double s) {
  if (s < 1.0) return;
  fmt::print(stderr, "  {} ({}): {} step {}/{} took {:.1f} s\n", c.name, mode_name(c.mode),
             timed ? "timed" : "warm-up", i + 1, fixed_calls(c, config, timed), s);
}

// Median, min and max of the per-call seconds, the value, and the case's extra figures.
// `gemm_s`: wall time of the timed calls' CPU GEMM ops (cpu::gemm_time). Throws when there
// are no timed calls (a fixed-step case with 0 repetitions), for guarded().
void finish_record(Record& rec, const Case& c, const Benchmark& bench,
                   const std::vector<double>& per_call, double gemm_s = 0) {
  if (per_call.empty()) throw std::runtime_error("no timed calls (fixed_reps / quick_reps is 0)");
  double median = median_of(per_call);
  auto [lo, hi] = std::minmax_element(per_call.begin(), per_call.end());
  rec.median_ms = median * 1e3;
  rec.min_ms = *lo * 1e3;
  rec.max_ms = *hi * 1e3;
  rec.value = bench.value(median);
  if (c.fixed_reps > 0 && !bench.measured_s) {
    // Fixed-step cases (training steps) report throughput over all timed steps.
    double total = 0;
    for (double t : per_call) total += t;
    rec.extra = {{"total_time", total},
                 {"avg_step_time", total / per_call.size() * 1e3},
                 {"gemm_time_per_step", gemm_s / per_call.size() * 1e3}};
    rec.value = bench.value(total / per_call.size());
  }
  rec.extra.insert(rec.extra.end(), bench.extra.begin(), bench.extra.end());
}

// Runs `fn` and records a thrown error in `rec`; returns whether it ran.
template <class F>
bool guarded(Record& rec, F&& fn) {
  try {
    fn();
    return true;
  } catch (const Skipped& e) {
    rec.status = Status::Skipped;
    rec.error = e.what();
  } catch (const std::exception& e) {  // kiln::Error included: report it, run the rest
    rec.status = Status::Failed;
    rec.error = e.what();
  }
  return false;
}

/// KILN_CUDA_PROFILE: GPU time is summed per case and mode from the first timed call on
/// (cuda/profile.h), and printed once the case is timed (before its result line).
void start_gpu_profile(const Case& c) {
  cuda::profile_section(fmt::format("{} {}", c.name, mode_name(c.mode)));
}
void print_gpu_profile() {
  std::string report = cuda::profile_report();
  if (!report.empty()) fmt::print("{}", report);
  cuda::reset_profile();
}

}  // namespace

Record run_case(const Suite& suite, const Case& c, const RunConfig& config) {
  Record rec = new_record(suite, c);
  guarded(rec, [&] {
    Benchmark bench = c.setup(config);
    const Policy p = policy_for(config);

    std::vector<double> per_call;  // seconds
    double gemm_s = 0;
    cuda::reset_profile();  // (a case whose setup measured itself has no profile)
    if (bench.measured_s) {
      per_call = {*bench.measured_s};
    } else if (c.fixed_reps > 0) {
      for (int i = 0; i < fixed_calls(c, config, false); ++i) {
        auto start = Clock::now();
        bench.body();
        report_slow_step(c, config, false, i, seconds_since(start));
      }
      cuda::reset_profile();
      start_gpu_profile(c);
      for (int r = 0; r < fixed_calls(c, config, true); ++r) {
        const uint64_t gemm_ns = cpu::gemm_time().ns;
        auto start = Clock::now();
        bench.body();
        per_call.push_back(seconds_since(start));
        gemm_s += double(cpu::gemm_time().ns - gemm_ns) * 1e-9;
        report_slow_step(c, config, true, r, per_call.back());
      }
    } else {
      // Warm-up; its mean time per call sizes the batches below.
      int warm_calls = 0;
      auto warm_start = Clock::now();
      while (warm_calls < p.warmup_calls || seconds_since(warm_start) < p.warmup_s) {
        bench.body();
        ++warm_calls;
      }
      double est = std::max(seconds_since(warm_start) / warm_calls, 1e-9);

      // A tiny op is timed as a loop of `batch` calls: steady_clock's resolution and the cost
      // of reading it would otherwise dominate.
      int64_t batch = std::max<int64_t>(1, static_cast<int64_t>(std::ceil(p.min_rep_s / est)));
      int reps = static_cast<int>(
          std::clamp(p.target_s / (est * batch), double(p.min_reps), double(p.max_reps)));

      per_call.reserve(reps);
      cuda::reset_profile();
      start_gpu_profile(c);
      for (int r = 0; r < reps; ++r) {
        auto start = Clock::now();
        for (int64_t i = 0; i < batch; ++i) bench.body();
        per_call.push_back(seconds_since(start) / batch);
      }
    }
    finish_record(rec, c, bench, per_call, gemm_s);
    print_gpu_profile();
  });
  return rec;
}

std::vector<Record> run_interleaved(const Suite& suite, const Case& a, const Case& b,
                                    const RunConfig& config) {
  struct Side {
    const Case* c;
    Record rec;
    Benchmark bench;
    bool ok = false;
    std::vector<double> per_call;
    double gemm_s = 0;
  };
  Side sides[2] = {{&a, new_record(suite, a), {}, false, {}, 0},
                   {&b, new_record(suite, b), {}, false, {}, 0}};
  for (Side& s : sides)
    s.ok = guarded(s.rec, [&] { s.bench = s.c->setup(config); });
  for (bool timed : {false, true}) {
    if (timed) cuda::reset_profile();
    int n = std::max(fixed_calls(a, config, timed), fixed_calls(b, config, timed));
    for (int i = 0; i < n; ++i)
      for (Side& s : sides) {
        if (!s.ok || i >= fixed_calls(*s.c, config, timed)) continue;
        if (timed) start_gpu_profile(*s.c);
        const uint64_t gemm_ns = cpu::gemm_time().ns;
        auto start = Clock::now();
        s.ok = guarded(s.rec, [&] { s.bench.body(); });
        const double step_s = seconds_since(start);
        if (s.ok) report_slow_step(*s.c, config, timed, i, step_s);
        if (s.ok && timed) {
          s.per_call.push_back(step_s);
          s.gemm_s += double(cpu::gemm_time().ns - gemm_ns) * 1e-9;
        }
      }
  }
  std::vector<Record> out;
  for (Side& s : sides) {
    if (s.ok) guarded(s.rec, [&] { finish_record(s.rec, *s.c, s.bench, s.per_call, s.gemm_s); });
    out.push_back(std::move(s.rec));
  }
  print_gpu_profile();
  return out;
}

bool suite_ran(std::span<const Record> records, std::string_view suite) {
  for (const Record& r : records)
    if (r.suite == suite) return true;
  return false;
}

void print_target(std::string_view label, double value, std::string_view unit, double target,
                  bool at_most) {
  bool met = at_most ? value <= target : value >= target;
  fmt::print("  {:<44} {:8.{}f} {}   target {} {:.0f} {}   {}\n", label, value,
             value < 100 ? 1 : 0, unit, at_most ? "<=" : ">=", target, unit,
             met ? "met" : "MISSED");
}

const Record* find_record(std::span<const Record> records, std::string_view suite,
                          std::string_view case_name, Mode mode) {
  for (const Record& r : records)
    if (r.status == Status::Ok && r.suite == suite && r.case_name == case_name && r.mode == mode)
      return &r;
  return nullptr;
}

Tensor filled(const Shape& shape, float lo, float hi) {
  Tensor t = kiln::empty(shape, kiln::Float32);
  float* p = t.data<float>();
  const int64_t n = t.numel();
  // A cheap LCG: varied values (no constant-folding shortcuts in kernels) without needing
  // the random kernels.
  uint32_t s = 12345;
  const float scale = (hi - lo) / 16777216.f;
  for (int64_t i = 0; i < n; ++i) {
    s = s * 1664525u + 1013904223u;
    p[i] = lo + static_cast<float>(s >> 8) * scale;
  }
  return t;
}

std::vector<Case> training_step_cases(const std::string& name, const std::string& unit,
                                      std::function<Benchmark(const RunConfig&)> eager,
                                      std::function<Benchmark(const RunConfig&)> compiled,
                                      bool interleave) {
  std::vector<Case> out = {{name, Mode::Eager, unit, std::move(eager)},
                           {name, Mode::Compiled, unit, std::move(compiled)}};
  for (Case& c : out) {
    c.fixed_warmup = 5;  // the compiled mode traces and compiles in its first warm-up step
    c.fixed_reps = 50;
    c.quick_warmup = 9;
    c.quick_reps = 5;
    c.interleave = interleave;
  }
  return out;
}

Benchmark copy_reference(int64_t n) {
  Tensor src = filled({n}), dst = filled({n});
  return {[src, dst, n] {
            const float* s = src.data<float>();
            float* d = dst.data<float>();
            cpu::parallel_for(0, n, cpu::kGrainSize, [=](int64_t begin, int64_t end) {
              std::memcpy(d + begin, s + begin, (end - begin) * sizeof(float));
            });
            do_not_optimize(d);
          },
          gb_per_s(2.0 * sizeof(float) * static_cast<double>(n))};
}

std::string cpu_description() {
  std::ifstream in("/proc/cpuinfo");
  std::string line, model, isa = "no AVX2";
  while (std::getline(in, line)) {
    if (model.empty() && line.starts_with("model name")) {
      size_t start = line.find_first_not_of(' ', line.find(':') + 1);
      if (line.find(':') != std::string::npos && start != std::string::npos) model = line.substr(start);
    }
    if (line.starts_with("flags")) {
      auto has = [&](std::string_view flag) {
        return line.find(fmt::format(" {} ", flag)) != std::string::npos ||
               line.ends_with(fmt::format(" {}", flag));
      };
      isa = has("avx512f") ? "AVX-512" : has("avx2") ? "AVX2" : "no AVX2";
      break;
    }
  }
  return model.empty() ? "unknown CPU" : fmt::format("{} ({})", model, isa);
}

void print_peer_note() {
  fmt::print("  (the PyTorch figure was measured on 2 vCPUs of an Intel Xeon with AVX-512;\n"
             "   this CPU: {}; benchmarks/peers/side_by_side.py measures PyTorch here)\n",
             cpu_description());
}

Device bench_device() {
  const char* env = std::getenv("KILN_BENCH_DEVICE");
  const std::string_view v = env ? env : "";
  if (v.empty() || v == "cpu") return Device::cpu();
  if (v == "cuda") return Device::cuda();
  int index = -1;
  if (v.starts_with("cuda:") && v.size() > 5 && v.size() <= 7) {
    index = 0;
    for (char c : v.substr(5)) index = c >= '0' && c <= '9' ? index * 10 + (c - '0') : -1000;
  }
  if (index < 0 || index > 127)
    throw std::invalid_argument(fmt::format(
        "KILN_BENCH_DEVICE={} is not a device (expected cpu, cuda or cuda:N)", v));
  return Device::cuda(index);
}

bool explain_requested() { return env_flag("KILN_BENCH_EXPLAIN"); }

bool full_sizes_requested() { return env_flag("KILN_BENCH_FULL"); }

}  // namespace kiln::bench
