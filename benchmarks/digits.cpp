// Suite digits: real data, a whole training run eager and compiled.
//
// The UCI 8×8 handwritten digits (data/digits.csv.gz, see data/README.md: 1,797 images, 64
// pixels 0–16, 10 classes); pixels scaled by 1/16; a fixed-seed shuffle (splitmix64
// Fisher–Yates, reproduced by benchmarks/peers/digits_torch.py) holds out 20 % for test.
// MLP 64→128→128→10 (ReLU, dropout 0.1), AdamW lr 3e-3, cross_entropy, batch 64 (the last
// partial batch of an epoch is dropped), 20 epochs (3 under --quick), the training order
// reshuffled each epoch with a fixed seed. Two models are trained from the same initial weights:
// one eagerly and one with the whole training step (forward, backward, AdamW step) wrapped in
// kiln::compile, their steps alternating; before each step both seed the generator the same
// way, so the dropout masks are the same. Test accuracy after each epoch: model.eval() under
// no_grad, eagerly.
//
// The training runs once (in the first case's setup); the cases report its figures:
//  * digits_mlp_accuracy (eager / compiled): final test accuracy, percent.
//  * digits_mlp_step (eager / compiled): training steps per second over the epochs after the
//    first (the first compiled step traces and compiles), only the step calls timed; extra
//    fields avg_step_time and gemm_time_per_step (ms; the GEMMs' wall time, cpu::gemm_time).
//  * digits_mlp_max_loss_diff (compiled): the max over every step of
//    |loss_compiled − loss_eager| / |loss_eager|.
// Their median_ms is the measured time: the mean step for digits_mlp_step, that mode's steps
// and evaluations otherwise. The two modes' steps alternate (eager, compiled, eager, ...), so
// that both see the same load on a shared machine.
// Targets (checked by the summary; accuracy only on full runs): accuracy ≥ 95 % in both modes;
// compiled step ≥ 2× kiln eager and ≥ 2× PyTorch 1.13; max loss difference ≤ 1e-5. The issue
// gives PyTorch as a fixed 3,860 steps/s, but the team's notes measured that figure on another
// workload (MLP 64→128→10, SGD, no dropout: train-eager's mlp_64_128_10). The summary prints
// the ratio to it as information; benchmarks/peers/side_by_side.py measures PyTorch on this one.
//
// The data is found at $KILN_DATA_DIR/digits.csv.gz, else <source dir>/data/digits.csv.gz.
// KILN_BENCH_EXPLAIN=1 prints the compiled step's whole explain() in the summary.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "backends/cpu/blas.h"
#include "benchmarks/harness.h"
#include "kiln/kiln.h"
#include "kiln/nn.h"

#ifndef KILN_SOURCE_DIR
#define KILN_SOURCE_DIR "."
#endif

namespace kiln::bench {
namespace {

constexpr char kSuite[] = "digits";
constexpr int64_t kFeatures = 64, kClasses = 10, kBatch = 64;
constexpr int kEpochs = 20, kQuickEpochs = 3;
constexpr double kLr = 3e-3, kDropout = 0.1;
constexpr uint64_t kSplitSeed = 42, kWeightSeed = 0;
constexpr double kAccuracyTarget = 95, kLossDiffTarget = 1e-5, kTorchStepsPerS = 3860;

// ---- data ----

struct Dataset {
  std::vector<float> x;        // [n, 64], pixels / 16
  std::vector<int64_t> y;      // [n]
  int64_t n = 0;
};

std::string data_path() {
  std::string dir;
  if (const char* env = std::getenv("KILN_DATA_DIR"); env && *env) dir = env;
  else dir = std::string(KILN_SOURCE_DIR) + "/data";
  return dir + "/digits.csv.gz";
}

/// Reads the gzip-compressed CSV through `gzip -dc` (no zlib dependency).
Dataset load_digits() {
  std::string path = data_path();
  if (!std::filesystem::exists(path))
    throw Skipped(fmt::format("{} not found (set KILN_DATA_DIR to its directory)", path));
  // Quoted for the shell: a ' in the path closes the quote, is escaped, and reopens it.
  std::string quoted = "'";
  for (char c : path) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  std::string cmd = "gzip -dc " + quoted + "'";
  std::FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) throw Skipped("cannot run gzip: " + cmd);
  Dataset d;
  std::string line;
  char buf[4096];
  auto parse_line = [&](const std::string& s) {
    if (s.empty()) return;
    std::vector<int> v;
    const char* c = s.c_str();
    while (*c) {
      char* end = nullptr;
      long x = std::strtol(c, &end, 10);
      if (end == c) break;
      v.push_back(static_cast<int>(x));
      c = end;
      if (*c == ',') ++c;
    }
    if (v.size() != kFeatures + 1)
      throw std::runtime_error(fmt::format("{}: row {} has {} fields, expected 65", path, d.n + 1,
                                           v.size()));
    for (int i = 0; i < kFeatures; ++i) d.x.push_back(static_cast<float>(v[i]) / 16.f);
    if (v[kFeatures] < 0 || v[kFeatures] >= kClasses)
      throw std::runtime_error(fmt::format("{}: row {} has label {}", path, d.n + 1, v[kFeatures]));
    d.y.push_back(v[kFeatures]);
    ++d.n;
  };
  while (std::fgets(buf, sizeof buf, p)) {
    line += buf;
    if (!line.empty() && line.back() == '\n') {
      line.pop_back();
      if (!line.empty() && line.back() == '\r') line.pop_back();
      parse_line(line);
      line.clear();
    }
  }
  parse_line(line);
  int rc = ::pclose(p);
  if (rc != 0 || d.n == 0)
    throw std::runtime_error(fmt::format("reading {} with gzip failed (status {}, {} rows)", path,
                                         rc, d.n));
  return d;
}

/// splitmix64: a tiny generator that the Python peer reproduces exactly.
struct SplitMix64 {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
};

/// 0..n-1 shuffled by Fisher–Yates (j = next() % (i + 1), i from n−1 down to 1).
std::vector<int64_t> permutation(int64_t n, uint64_t seed) {
  std::vector<int64_t> p(n);
  for (int64_t i = 0; i < n; ++i) p[i] = i;
  SplitMix64 g{seed};
  for (int64_t i = n - 1; i > 0; --i) std::swap(p[i], p[g.next() % static_cast<uint64_t>(i + 1)]);
  return p;
}

struct Split {
  std::vector<float> train_x, test_x;
  std::vector<int64_t> train_y, test_y;
  int64_t n_train = 0, n_test = 0;
};

Split split(const Dataset& d) {
  std::vector<int64_t> perm = permutation(d.n, kSplitSeed);
  Split s;
  s.n_test = d.n / 5;  // 20 %
  s.n_train = d.n - s.n_test;
  // Fewer rows ran no step and reported NaN losses as a met target (found by a break-it pass).
  if (s.n_train < kBatch || s.n_test < 1)
    throw std::runtime_error(fmt::format(
        "{} rows give {} training rows (at least {}, one batch, needed) and {} test rows (at "
        "least 1 needed): the data set is too small",
        d.n, s.n_train, kBatch, s.n_test));
  for (int64_t k = 0; k < d.n; ++k) {
    int64_t i = perm[k];
    bool test = k < s.n_test;
    auto& x = test ? s.test_x : s.train_x;
    x.insert(x.end(), d.x.begin() + i * kFeatures, d.x.begin() + (i + 1) * kFeatures);
    (test ? s.test_y : s.train_y).push_back(d.y[i]);
  }
  return s;
}

// ---- training ----

std::shared_ptr<nn::Sequential> make_mlp() {
  manual_seed(kWeightSeed);  // identical initial weights in both modes
  return std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(kFeatures, 128), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Dropout>(kDropout), std::make_shared<nn::Linear>(128, 128),
      std::make_shared<nn::ReLU>(), std::make_shared<nn::Dropout>(kDropout),
      std::make_shared<nn::Linear>(128, kClasses)});
}

struct EpochLog {
  double mean_loss = 0;    // over the epoch's steps
  double accuracy = 0;     // test, percent, after the epoch
  double step_seconds = 0; // the epoch's step calls only
  double gemm_seconds = 0; // of which CPU GEMM ops (cpu::gemm_time)
  int steps = 0;
};

struct ModeRun {
  std::vector<EpochLog> epochs;
  std::vector<float> losses;  // every step
  double total_s = 0;         // its steps and evaluations
  double steps_per_s = 0;     // epochs after the first
  double first_epoch_steps_per_s = 0;
  double gemm_us_per_step = 0, step_us = 0;  // epochs after the first
  int compile_count = 0;
  std::string explain;
};

struct Result {
  int epochs = 0;
  int64_t n_train = 0, n_test = 0, steps_per_epoch = 0;
  ModeRun eager, compiled;
  double max_rel_diff = 0, max_abs_diff = 0;
  int64_t worst_step = -1;
};

using Clock = std::chrono::steady_clock;

double accuracy(nn::Sequential& model, const Tensor& x, const std::vector<int64_t>& y) {
  model.eval();
  NoGradGuard no_grad;
  std::vector<int64_t> pred = argmax(model.forward(x), 1).to_vector<int64_t>();
  model.train();
  int64_t correct = 0;
  for (size_t i = 0; i < y.size(); ++i) correct += pred[i] == y[i];
  return 100.0 * static_cast<double>(correct) / static_cast<double>(y.size());
}

// Per-epoch figures of one mode once its epochs are done.
void finish_mode(ModeRun& run) {
  double later_s = 0, later_gemm_s = 0;
  int later_steps = 0;
  for (size_t e = 1; e < run.epochs.size(); ++e) {
    later_s += run.epochs[e].step_seconds;
    later_gemm_s += run.epochs[e].gemm_seconds;
    later_steps += run.epochs[e].steps;
  }
  run.first_epoch_steps_per_s = run.epochs[0].steps / run.epochs[0].step_seconds;
  run.steps_per_s = later_steps ? later_steps / later_s : run.first_epoch_steps_per_s;
  if (later_steps) {
    run.gemm_us_per_step = later_gemm_s / later_steps * 1e6;
    run.step_us = later_s / later_steps * 1e6;
  }
}

// Trains both modes from the same initial weights. Their steps alternate (eager, compiled,
// eager, ...) so that both see the same load on a shared machine: trained one after the
// other, the step ratio ranged 1.67x-2.29x between runs of one build.
void train_modes(const Split& s, int epochs, ModeRun& eager_run, ModeRun& compiled_run) {
  struct Mode {
    std::shared_ptr<nn::Sequential> model = make_mlp();
    std::shared_ptr<nn::AdamW> opt =
        std::make_shared<nn::AdamW>(model->parameters(), nn::AdamWOptions{.lr = kLr});
    std::function<Tensor(const Tensor&, const Tensor&)> step;
    ModeRun* run = nullptr;
  };
  auto step_of = [](const Mode& m) {
    return [model = m.model, opt = m.opt](const Tensor& x, const Tensor& y) {
      opt->zero_grad();
      Tensor loss = cross_entropy(model->forward(x), y);
      loss.backward();
      opt->step();
      return loss.detach();
    };
  };
  Mode modes[2];
  modes[0].step = step_of(modes[0]);
  modes[0].run = &eager_run;
  // Buffer donation, as a JAX training step donates its parameters and optimizer state: the
  // new parameters and moments become their tensors' buffers instead of being copied into them.
  auto compiled_step =
      kiln::compile(step_of(modes[1]), CompileOptions{.donate_buffers = true}, "digits_mlp_step");
  modes[1].step = [&compiled_step](const Tensor& x, const Tensor& y) {
    return compiled_step(x, y);
  };
  modes[1].run = &compiled_run;
  Tensor test_x = from_vector(s.test_x, {s.n_test, kFeatures});

  const int64_t steps = s.n_train / kBatch;  // the partial batch is dropped
  std::vector<float> bx(kBatch * kFeatures);
  std::vector<int64_t> by(kBatch);
  for (int e = 0; e < epochs; ++e) {
    std::vector<int64_t> order = permutation(s.n_train, 1000 + e);
    EpochLog logs[2];
    for (int64_t k = 0; k < steps; ++k) {
      for (int64_t b = 0; b < kBatch; ++b) {
        int64_t i = order[k * kBatch + b];
        std::copy_n(s.train_x.begin() + i * kFeatures, kFeatures, bx.begin() + b * kFeatures);
        by[b] = s.train_y[i];
      }
      Tensor x = from_vector(bx, {kBatch, kFeatures}), y = from_vector(by, {kBatch});
      for (int m = 0; m < 2; ++m) {
        manual_seed(static_cast<uint64_t>(e) * 1000 + static_cast<uint64_t>(k));  // same masks
        const uint64_t gemm_ns = cpu::gemm_time().ns;
        auto t0 = Clock::now();
        Tensor loss = modes[m].step(x, y);
        logs[m].step_seconds += std::chrono::duration<double>(Clock::now() - t0).count();
        logs[m].gemm_seconds += double(cpu::gemm_time().ns - gemm_ns) * 1e-9;
        float l = loss.item<float>();
        modes[m].run->losses.push_back(l);
        logs[m].mean_loss += l;
        ++logs[m].steps;
      }
    }
    for (int m = 0; m < 2; ++m) {
      auto t0 = Clock::now();
      logs[m].mean_loss /= static_cast<double>(logs[m].steps);
      logs[m].accuracy = accuracy(*modes[m].model, test_x, s.test_y);
      modes[m].run->total_s +=
          logs[m].step_seconds + std::chrono::duration<double>(Clock::now() - t0).count();
      modes[m].run->epochs.push_back(logs[m]);
    }
  }
  for (Mode& m : modes) finish_mode(*m.run);
  compiled_run.compile_count = compiled_step.compile_count();
  compiled_run.explain = compiled_step.explain();
}

/// The last training run, for the summary (which has no RunConfig).
const Result* g_last = nullptr;

/// Trains both modes on the split and compares their losses step by step.
Result train_both(const Split& s, int epochs) {
  Result out;
  out.epochs = epochs;
  out.n_train = s.n_train;
  out.n_test = s.n_test;
  out.steps_per_epoch = s.n_train / kBatch;
  train_modes(s, epochs, out.eager, out.compiled);
  for (size_t i = 0; i < out.eager.losses.size(); ++i) {
    double a = out.eager.losses[i], b = out.compiled.losses[i];
    double abs_diff = std::abs(a - b), rel = abs_diff / std::max(std::abs(a), 1e-30);
    if (!(rel <= out.max_rel_diff)) {  // NaN counts as the worst
      out.max_rel_diff = std::isnan(rel) ? INFINITY : rel;
      out.worst_step = static_cast<int64_t>(i);
    }
    out.max_abs_diff = std::max(out.max_abs_diff, abs_diff);
  }
  return out;
}

/// The training runs once per process (per --quick setting); every case reports from it. A
/// training that threw is not run again: the later cases report the same error.
const Result& result(const RunConfig& config) {
  const int k = config.quick ? 1 : 0;
  static std::optional<Result> cached[2];
  static std::optional<std::string> failed[2];
  if (cached[k]) return *cached[k];
  if (failed[k]) throw std::runtime_error(*failed[k]);
  Split s = split(load_digits());  // a missing file throws Skipped (each case says so)
  try {
    cached[k] = train_both(s, config.quick ? kQuickEpochs : kEpochs);
  } catch (const std::exception& e) {
    failed[k] = e.what();
    throw;
  }
  g_last = &*cached[k];
  return *cached[k];
}

ValueFn constant(double v) {
  return [v](double) { return v; };
}

Benchmark accuracy_case(const RunConfig& config, bool compiled) {
  const Result& r = result(config);
  const ModeRun& m = compiled ? r.compiled : r.eager;
  Benchmark b{{}, constant(m.epochs.back().accuracy), m.total_s};
  double best = 0;
  for (const EpochLog& e : m.epochs) best = std::max(best, e.accuracy);
  b.extra = {{"epochs", r.epochs},
             {"final_loss", m.epochs.back().mean_loss},
             {"best_accuracy", best},
             {"test_samples", static_cast<double>(r.n_test)}};
  // The training curve, for the report's loss chart (scripts/report.py).
  for (size_t e = 0; e < m.epochs.size(); ++e)
    b.extra.emplace_back(fmt::format("loss_epoch_{}", e + 1), m.epochs[e].mean_loss);
  return b;
}

Benchmark step_case(const RunConfig& config, bool compiled) {
  const Result& r = result(config);
  const ModeRun& m = compiled ? r.compiled : r.eager;
  Benchmark b{{}, per_second(1), 1.0 / m.steps_per_s};
  b.extra = {{"steps", static_cast<double>(m.losses.size())},
             {"first_epoch_steps_per_s", m.first_epoch_steps_per_s},
             // As the transformer's (harness.h): the report's "where the time goes" table.
             {"avg_step_time", m.step_us * 1e-3},
             {"gemm_time_per_step", m.gemm_us_per_step * 1e-3}};
  if (compiled) b.extra.emplace_back("compile_count", m.compile_count);
  return b;
}

Benchmark loss_diff_case(const RunConfig& config) {
  const Result& r = result(config);
  Benchmark b{{}, constant(r.max_rel_diff), r.compiled.total_s};
  b.extra = {{"max_abs_loss_diff", r.max_abs_diff},
             {"steps_compared", static_cast<double>(r.eager.losses.size())},
             {"worst_step", static_cast<double>(r.worst_step)}};
  return b;
}

std::vector<Case> cases() {
  return {
      {"digits_mlp_accuracy", Mode::Eager, "percent", [](const RunConfig& c) { return accuracy_case(c, false); }},
      {"digits_mlp_accuracy", Mode::Compiled, "percent", [](const RunConfig& c) { return accuracy_case(c, true); }},
      {"digits_mlp_step", Mode::Eager, "steps/s", [](const RunConfig& c) { return step_case(c, false); }},
      {"digits_mlp_step", Mode::Compiled, "steps/s", [](const RunConfig& c) { return step_case(c, true); }},
      {"digits_mlp_max_loss_diff", Mode::Compiled, "relative", loss_diff_case},
  };
}

std::string verdict(bool met) { return met ? "met" : "MISSED"; }

void summary(std::span<const Record> records) {
  if (!suite_ran(records, kSuite)) return;
  auto find = [&](std::string_view name, Mode mode) {
    return find_record(records, kSuite, name, mode);
  };
  const Record* acc_e = find("digits_mlp_accuracy", Mode::Eager);
  const Record* acc_c = find("digits_mlp_accuracy", Mode::Compiled);
  const Record* step_e = find("digits_mlp_step", Mode::Eager);
  const Record* step_c = find("digits_mlp_step", Mode::Compiled);
  const Record* diff = find("digits_mlp_max_loss_diff", Mode::Compiled);
  for (const Record& r : records)
    if (r.suite == kSuite && r.status != Status::Ok) {
      fmt::print("\ndigits: {} ({}) {}: {}\n", r.case_name, mode_name(r.mode),
                 r.status == Status::Failed ? "FAILED" : "skipped", r.error);
      return;
    }
  if (!g_last) return;
  const Result& res = *g_last;
  const bool quick = res.epochs != kEpochs;
  fmt::print("\ndigits: UCI 8x8 digits, {} train / {} test, MLP 64-128-128-10 (ReLU, dropout {}), "
             "AdamW lr {}, batch {}, {} steps/epoch, {} epochs{}\n",
             res.n_train, res.n_test, kDropout, kLr, kBatch, res.steps_per_epoch, res.epochs,
             quick ? " (--quick: accuracy targets apply to full runs)" : "");
  fmt::print("  {:>5}  {:>12} {:>12}  {:>10} {:>10}  {:>10} {:>10}\n", "epoch", "eager loss",
             "comp. loss", "eager acc", "comp. acc", "eager st/s", "comp. st/s");
  for (int e = 0; e < res.epochs; ++e) {
    const EpochLog& a = res.eager.epochs[e];
    const EpochLog& b = res.compiled.epochs[e];
    fmt::print("  {:>5}  {:>12.7f} {:>12.7f}  {:>9.2f}% {:>9.2f}%  {:>10.0f} {:>10.0f}\n", e + 1,
               a.mean_loss, b.mean_loss, a.accuracy, b.accuracy, a.steps / a.step_seconds,
               b.steps / b.step_seconds);
  }
  fmt::print("  max |loss diff| over {} steps: {:.3g} relative (step {}), {:.3g} absolute\n",
             res.eager.losses.size(), res.max_rel_diff, res.worst_step, res.max_abs_diff);

  fmt::print("\ndigits targets (printed, not asserted; the machine is shared):\n");
  if (acc_e && acc_c) {
    for (const Record* r : {acc_e, acc_c})
      fmt::print("  {:<44} {:8.2f} %    target >= {:.0f} %      {}\n",
                 fmt::format("test accuracy {}", mode_name(r->mode)), r->value, kAccuracyTarget,
                 quick ? "n/a (--quick)" : verdict(r->value >= kAccuracyTarget));
  }
  if (step_e && step_c) {
    fmt::print("  {:<44} {:8.0f} steps/s  (epochs 2..{})\n", "step eager", step_e->value,
               res.epochs);
    fmt::print("  {:<44} {:8.0f} steps/s  (epochs 2..{})\n", "step compiled", step_c->value,
               res.epochs);
    double vs_eager = step_c->value / step_e->value, vs_torch = step_c->value / kTorchStepsPerS;
    fmt::print("  {:<44} {:8.2f}x        target >= 2x          {}\n", "compiled / kiln eager",
               vs_eager, verdict(vs_eager >= 2));
    fmt::print("  {:<44} {:8.2f}x        (information: another workload)\n",
               "compiled / PyTorch 1.13's 3,860 st/s", vs_torch);
    // GEMMs are oneDNN's in both modes, single-threaded at this size (blas.h): with every
    // other op free, a compiled step would still take its GEMM time.
    const ModeRun &me = res.eager, &mc = res.compiled;
    if (mc.gemm_us_per_step > 0)
      fmt::print("  GEMM (oneDNN) time per step: eager {:.0f} of {:.0f} us, compiled {:.0f} of "
                 "{:.0f} us; bound on the speed-up with every other op free: {:.2f}x\n",
                 me.gemm_us_per_step, me.step_us, mc.gemm_us_per_step, mc.step_us,
                 me.step_us / mc.gemm_us_per_step);
    fmt::print("  (3,860 st/s is PyTorch's step of an MLP 64-128-10 with SGD and no dropout, not this\n"
               "   one; benchmarks/peers/side_by_side.py runs PyTorch on this workload, target >= 2x)\n");
  }
  if (diff)
    fmt::print("  {:<44} {:8.2g}         target <= {:.0e}       {}\n",
               "max relative loss diff (every step)", diff->value, kLossDiffTarget,
               verdict(diff->value <= kLossDiffTarget));

  const std::string& text = res.compiled.explain;
  if (explain_requested()) {
    fmt::print("  compiled step: {} trace(s); explain():\n{}", res.compiled.compile_count, text);
    return;
  }
  fmt::print("  compiled step: {} trace(s); explain() (all of it with KILN_BENCH_EXPLAIN=1):\n",
             res.compiled.compile_count);
  size_t begin = 0;
  int shown = 0;
  while (begin < text.size()) {
    size_t end = text.find('\n', begin);
    if (end == std::string::npos) end = text.size();
    std::string_view line(text.data() + begin, end - begin);
    if (line.find("specialisation #") != std::string_view::npos ||
        line.find("segment:") != std::string_view::npos ||
        line.find("backward:") != std::string_view::npos ||
        line.find("recompiles:") != std::string_view::npos ||
        line.find("runs eagerly") != std::string_view::npos) {
      if (++shown > 12) break;
      fmt::print("    {}\n", line.substr(line.find_first_not_of(' ')));
    }
    begin = end + 1;
  }
}

[[maybe_unused]] const bool registered = register_suite(
    {kSuite,
     "UCI digits MLP trained eagerly and with the whole step compiled: accuracy, steps/s, loss diff",
     cases, summary});

}  // namespace
}  // namespace kiln::bench
