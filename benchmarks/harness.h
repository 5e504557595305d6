#pragma once
/// kiln-bench's harness: a registry of suites, the timing loop, and the records it produces.
///
/// A suite is a named list of cases. Each suite lives in its own .cpp file in benchmarks/ and
/// registers itself at static-initialisation time; main.cpp never names a suite:
///
///   namespace kiln::bench {
///   namespace {
///   std::vector<Case> my_cases() {
///     return {{"add_1M", Mode::Eager, "GB/s", [](const RunConfig&) {
///       Tensor a = filled({1 << 20}), b = filled({1 << 20});   // outside the timed loop
///       return Benchmark{[=] { kiln::add(a, b); }, gb_per_s(3.0 * 4 * (1 << 20))};
///     }}};
///   }
///   [[maybe_unused]] const bool registered =
///       register_suite({"my-suite", "what it measures", my_cases});
///   }  // namespace
///   }  // namespace kiln::bench
///
/// The harness warms each case up, batches calls so that one repetition lasts at least about
/// a millisecond (so 1-element ops are timed as a loop of many calls), repeats, and reports the
/// median / min / max time of one call and a value derived from the median (GB/s, GFLOP/s,
/// ns/op, ...). A case whose setup or body throws kiln::Error (or any std::exception) is
/// recorded as failed with the message; the remaining cases still run.
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace kiln::bench {

/// What a case measures: kiln eager ops, kiln compiled code, this machine's own ceiling
/// (memcpy, a direct BLAS call), or another framework.
enum class Mode { Eager, Compiled, Reference, Peer };
/// "eager", "compiled", "reference", "peer".
std::string_view mode_name(Mode mode);

/// Settings of one kiln-bench run, handed to every case's setup.
struct RunConfig {
  bool quick = false;  ///< fewer repetitions, shorter warm-up (the whole suite in seconds)
  int threads = 1;     ///< kiln::cpu::num_threads() during the run
};

/// Turns the median time of one call (seconds) into the reported value.
using ValueFn = std::function<double(double seconds_per_call)>;

/// Value = bytes / time in GB/s (1e9 bytes per second).
ValueFn gb_per_s(double bytes_per_call);
/// Value = flops / time in GFLOP/s.
ValueFn gflop_per_s(double flops_per_call);
/// Value = time of one call in nanoseconds.
ValueFn ns_per_call();
/// Value = `count` / time, e.g. samples/s or steps/s.
ValueFn per_second(double count_per_call);

/// What a case's setup returns: the timed body and how to turn time into its value. The body
/// owns its inputs (capture them by value); they are freed when the case ends.
struct Benchmark {
  std::function<void()> body;  ///< one call of the measured operation
  ValueFn value;               ///< from the median seconds per call
  /// For a case that measured itself in its setup (e.g. a whole training run whose figures
  /// several cases report): the time of one call in seconds. The harness then never calls
  /// `body` (it may be empty) and reports this time as median, min and max.
  std::optional<double> measured_s = std::nullopt;
  /// Case-specific figures appended to the record's extra JSON keys.
  std::vector<std::pair<std::string, double>> extra = {};
};

/// Thrown by a setup to skip a case that cannot run here (e.g. a missing reference library).
/// Unlike a kiln::Error, a skipped case does not make kiln-bench exit non-zero.
class Skipped : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// One benchmark case of a suite.
struct Case {
  std::string name;  ///< e.g. "add_16M"; unique within its mode
  Mode mode = Mode::Eager;
  std::string unit;  ///< unit of the value, e.g. "GB/s"
  /// Creates the inputs (outside the timed region) and returns the body to time.
  std::function<Benchmark(const RunConfig&)> setup;
  /// For long bodies (a training step): exactly this many warm-up calls and timed calls, one
  /// call per repetition, instead of the automatic calibration. The record then carries the
  /// extra fields total_time (s, all timed calls), avg_step_time (ms) and gemm_time_per_step
  /// (ms of CPU GEMM ops per call, cpu::gemm_time). 0 = automatic.
  int fixed_warmup = 0, fixed_reps = 0;
  int quick_warmup = 1, quick_reps = 5;  ///< the same under --quick
  /// For a fixed-step case listed right before its case of the same name in the other mode:
  /// the two are set up together and their calls alternate (warm-up and timed steps: eager,
  /// compiled, eager, ...), so both modes see the same load on a shared machine. Timed one
  /// after the other, the Transformer step's compiled / eager ratio ranged 0.91x-1.39x between
  /// runs of one build on this 2-vCPU VM; alternated, 1.15x-1.16x. Both workloads are in memory
  /// at once, so a case of the original (--full) sizes leaves it off.
  bool interleave = false;
};

enum class Status { Ok, Failed, Skipped };

/// The outcome of one case: what --json writes and the table shows.
struct Record {
  std::string suite, case_name;
  Mode mode = Mode::Eager;
  Status status = Status::Ok;
  double median_ms = 0, min_ms = 0, max_ms = 0;  ///< time of one call
  double value = 0;
  std::string unit;
  std::string error;  ///< the message when failed or skipped
  /// Case-specific figures written as extra JSON keys (e.g. total_time, avg_step_time).
  std::vector<std::pair<std::string, double>> extra;
};

/// A named group of cases, plus an optional summary printed after the table (e.g. a check
/// of the run's figures against the project's targets).
struct Suite {
  std::string name;
  std::string description;
  /// Builds the case list; called lazily, so registering a suite costs nothing.
  std::function<std::vector<Case>()> cases;
  /// Given every record of the run (all suites), prints suite-specific lines.
  std::function<void(std::span<const Record>)> summary;
};

/// Adds a suite to the registry; returns true so it can initialise a static bool.
/// Throws std::logic_error for a duplicate name.
bool register_suite(Suite suite);
/// Every registered suite, sorted by name.
std::vector<const Suite*> suites();
/// The suite called `name`, or nullptr.
const Suite* find_suite(std::string_view name);

/// Warms up, calibrates and times one case; never throws for errors of the case itself.
Record run_case(const Suite& suite, const Case& c, const RunConfig& config);
/// Times two fixed-step cases with alternating calls (Case::interleave); one record each, in
/// the order given. A case whose setup or call throws is reported failed (or skipped) and the
/// other goes on alone.
std::vector<Record> run_interleaved(const Suite& suite, const Case& a, const Case& b,
                                    const RunConfig& config);

/// Whether any case of `suite` is among `records` (summaries print nothing otherwise).
bool suite_ran(std::span<const Record> records, std::string_view suite);
/// One summary line "  <label> <value> <unit>   target <op> <target> <unit>   met|MISSED":
/// `at_most` for targets that are ceilings (times), otherwise floors (throughputs).
void print_target(std::string_view label, double value, std::string_view unit, double target,
                  bool at_most);

/// The CPU's model name and widest vector ISA, e.g. "AMD EPYC (AVX2)" or "Intel(R) Xeon(R) ...
/// (AVX-512)", from /proc/cpuinfo ("unknown CPU" where it cannot be read). Figures from
/// different CPUs are not comparable: kiln-bench prints this in its header.
std::string cpu_description();

/// The note under a summary's PyTorch ratio: its fixed peer figure was measured on another
/// machine (notes/cpu-performance.md: Intel Xeon, AVX-512), and
/// benchmarks/peers/side_by_side.py measures PyTorch on this one.
void print_peer_note();

/// The record of `case_name` in `mode` that succeeded, or nullptr.
const Record* find_record(std::span<const Record> records, std::string_view suite,
                          std::string_view case_name, Mode mode);

/// The device of the suites that can run on a GPU (transformer, embedding): KILN_BENCH_DEVICE
/// unset, empty or "cpu" gives the CPU, "cuda" or "cuda:N" that GPU. Any other value throws
/// std::invalid_argument naming it (kiln-bench checks it first: exit 2); a mistyped value ran
/// on the CPU and reported success (found by a break-it pass).
Device bench_device();

/// KILN_BENCH_EXPLAIN: print a compiled case's whole explain() (the transformer and digits
/// suites). A boolean switch like every KILN_* one (core/env.h env_flag: 1/true/on/yes,
/// 0/false/off/no): any value but "0" was on, so KILN_BENCH_EXPLAIN=false printed it.
bool explain_requested();

/// KILN_BENCH_FULL: the transformer suite at the original model's sizes (env_flag, as above).
bool full_sizes_requested();

// ---- helpers for writing cases ----

/// A contiguous float32 tensor of `shape`, written element by element (so its pages are
/// touched before timing) with a deterministic pattern in [lo, hi]. Needs no kernels.
Tensor filled(const Shape& shape, float lo = -1.f, float hi = 1.f);

/// A training step's two cases, eager then compiled, with the same name and unit: 5 warm-up and
/// 50 timed steps (--quick: 9 warm-up, past compile()'s timing runs — each region's first 4
/// runs time both its eager kernels and its compiled code, 8 alternate where values alias,
/// tracer/plan.cpp — which otherwise were most of the 5 timed steps; then 5), alternating when
/// `interleave`.
std::vector<Case> training_step_cases(const std::string& name, const std::string& unit,
                                      std::function<Benchmark(const RunConfig&)> eager,
                                      std::function<Benchmark(const RunConfig&)> compiled,
                                      bool interleave);

/// The copy-bandwidth ceiling: memcpy of `n` float32 between two kiln-allocated buffers (written
/// once, so no page faults are timed), split over kiln's threads like a kernel; GB/s counts one
/// read and one write.
Benchmark copy_reference(int64_t n);

/// Keeps the compiler from discarding a value computed only for timing.
template <class T> inline void do_not_optimize(const T& value) {
  asm volatile("" : : "r,m"(value) : "memory");
}

}  // namespace kiln::bench
