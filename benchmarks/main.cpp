// kiln-bench: runs registered benchmark suites, prints a table and optionally writes JSON.
#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "backends/cpu/parallel.h"
#include "benchmarks/harness.h"
#include "core/precision.h"
#include "tracer/function.h"

namespace kb = kiln::bench;

namespace {

constexpr std::string_view kUsage =
    "usage: kiln-bench SUITE... [--json FILE] [--threads N] [--quick] [--full] [--filter TEXT]\n"
    "                  [--matmul-precision highest|high|medium]\n"
    "       kiln-bench --list\n"
    "\n"
    "Runs the named benchmark suites and prints one row per case: median / min / max time of\n"
    "one call (ms) and the case's figure (GB/s, GFLOP/s, ns/op, ...).\n"
    "\n"
    "  --json FILE    also write the records as a JSON array to FILE\n"
    "  --threads N    kiln's CPU threads (default: KILN_NUM_THREADS or all hardware threads)\n"
    "  --quick        fewer repetitions and a shorter warm-up (a suite in a few seconds)\n"
    "  --full         the reference workloads at their original sizes (transformer: d_model 768,\n"
    "                 12 layers, batch 32, seq 512); sets KILN_BENCH_FULL=1\n"
    "  --filter TEXT  run only cases whose name contains TEXT\n"
    "  --matmul-precision P  kiln::set_float32_matmul_precision(P) before the suites run:\n"
    "                 highest (default), high (TF32 on NVIDIA GPUs), medium (bfloat16 inputs\n"
    "                 where the CPU or GPU has the kernels); see core/precision.h\n"
    "  --list         list the suites and their cases\n"
    "  --help         this text\n"
    "\n"
    "Exit status: 0 when every case ran or was skipped, 1 when a case failed or the JSON file\n"
    "could not be written, 2 on bad usage, an unknown suite or a --filter that matches nothing.\n";

struct Args {
  std::vector<std::string> suites;
  std::string json_path;
  std::string filter;
  int threads = 0;  // 0: leave kiln's default
  bool quick = false, list = false, help = false;
};

[[noreturn]] void usage_error(const std::string& message) {
  fmt::print(stderr, "kiln-bench: {}\n{}", message, kUsage);
  std::exit(2);
}

Args parse_args(int argc, char** argv) {
  Args args;
  for (int i = 1; i < argc; ++i) {
    std::string_view a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage_error(fmt::format("{} needs a value", a));
      return argv[++i];
    };
    if (a == "--help" || a == "-h") {
      args.help = true;
    } else if (a == "--list") {
      args.list = true;
    } else if (a == "--quick") {
      args.quick = true;
    } else if (a == "--full") {
      ::setenv("KILN_BENCH_FULL", "1", 1);
    } else if (a == "--json") {
      args.json_path = value();
    } else if (a == "--filter") {
      args.filter = value();
    } else if (a == "--matmul-precision") {
      const std::string v = value();
      try {
        kiln::set_float32_matmul_precision(v);
      } catch (const kiln::Error& e) {
        usage_error(fmt::format("--matmul-precision: {}", e.message()));
      }
    } else if (a == "--threads") {
      std::string v = value();
      char* end = nullptr;
      long n = std::strtol(v.c_str(), &end, 10);
      if (v.empty() || *end != '\0' || n < 1 || n > kiln::cpu::kMaxThreads)
        usage_error(fmt::format("--threads wants an integer from 1 to {}, got '{}'",
                                kiln::cpu::kMaxThreads, v));
      args.threads = static_cast<int>(n);
    } else if (a.starts_with("-")) {
      usage_error(fmt::format("unknown option '{}'", a));
    } else {
      args.suites.emplace_back(a);
    }
  }
  return args;
}

std::string known_suites() {
  std::string out;
  for (const kb::Suite* s : kb::suites()) out += (out.empty() ? "" : ", ") + s->name;
  return out;
}

void print_list() {
  size_t width = 0;  // the longest case name, so the mode and unit columns line up
  for (const kb::Suite* s : kb::suites())
    for (const kb::Case& c : s->cases()) width = std::max(width, c.name.size());
  for (const kb::Suite* s : kb::suites()) {
    fmt::print("{}  — {}\n", s->name, s->description);
    for (const kb::Case& c : s->cases())
      fmt::print("    {:<{}}  {:<10} {}\n", c.name, width, kb::mode_name(c.mode), c.unit);
  }
}

/// Times below a microsecond in ms still need significant digits, so use %g-style output.
std::string fmt_ms(double ms) { return fmt::format("{:.4g}", ms); }

std::string fmt_value(double v) {
  if (!std::isfinite(v)) return fmt::format("{}", v);
  return std::abs(v) >= 100 ? fmt::format("{:.0f}", v) : fmt::format("{:.3g}", v);
}

/// Column widths of the table, sized to the suite and case names of this run.
struct Widths {
  size_t suite = 10, name = 20;
};

void print_header(const Widths& w) {
  fmt::print("{:<{}} {:<{}} {:<10} {:>10} {:>10} {:>10} {:>10}  {}\n", "suite", w.suite, "case",
             w.name, "mode", "median ms", "min ms", "max ms", "value", "unit");
}

void print_row(const kb::Record& r, const Widths& w) {
  fmt::print("{:<{}} {:<{}} {:<10} ", r.suite, w.suite, r.case_name, w.name,
             kb::mode_name(r.mode));
  if (r.status == kb::Status::Ok) {
    fmt::print("{:>10} {:>10} {:>10} {:>10}  {}\n", fmt_ms(r.median_ms), fmt_ms(r.min_ms),
               fmt_ms(r.max_ms), fmt_value(r.value), r.unit);
  } else {
    fmt::print("{}: {}\n", r.status == kb::Status::Failed ? "FAILED" : "skipped", r.error);
  }
  std::fflush(stdout);  // rows appear as cases finish
}

/// A JSON string literal: quotes, backslashes and control characters escaped (UTF-8 passes).
std::string json_string(std::string_view s) {
  std::string out = "\"";
  for (char ch : s) {
    auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) out += fmt::format("\\u{:04x}", c);
        else out += ch;
    }
  }
  return out + "\"";
}

/// JSON has no NaN/Inf; failed cases and non-finite figures are written as null.
std::string json_number(double v, bool ok) {
  return ok && std::isfinite(v) ? fmt::format("{}", v) : "null";
}

bool write_json(const std::string& path, const std::vector<kb::Record>& records) {
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (!f) return false;
  fmt::print(f, "[");
  for (size_t i = 0; i < records.size(); ++i) {
    const kb::Record& r = records[i];
    bool ok = r.status == kb::Status::Ok;
    fmt::print(f,
               "{}\n  {{\"suite\": {}, \"case\": {}, \"mode\": {}, \"median_ms\": {}, "
               "\"min_ms\": {}, \"max_ms\": {}, \"value\": {}, \"unit\": {}",
               i ? "," : "", json_string(r.suite), json_string(r.case_name),
               json_string(kb::mode_name(r.mode)), json_number(r.median_ms, ok),
               json_number(r.min_ms, ok), json_number(r.max_ms, ok), json_number(r.value, ok),
               json_string(r.unit));
    for (const auto& [key, v] : r.extra)
      fmt::print(f, ", {}: {}", json_string(key), json_number(v, ok));
    // Only cases that did not run carry these two extra keys.
    if (!ok)
      fmt::print(f, ", \"status\": {}, \"error\": {}",
                 json_string(r.status == kb::Status::Failed ? "failed" : "skipped"),
                 json_string(r.error));
    fmt::print(f, "}}");
  }
  fmt::print(f, "\n]\n");
  return std::fclose(f) == 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args args = parse_args(argc, argv);
  if (args.help) {
    fmt::print("{}", kUsage);
    return 0;
  }
  if (args.list) {
    if (!args.suites.empty()) usage_error("--list takes no suite names");
    print_list();
    return 0;
  }
  if (args.suites.empty()) usage_error("name at least one suite (see --list)");
  try {
    kb::bench_device();
  } catch (const std::invalid_argument& e) {
    usage_error(e.what());
  }

  std::vector<const kb::Suite*> selected;
  for (const std::string& name : args.suites) {
    const kb::Suite* s = kb::find_suite(name);
    if (!s) {
      fmt::print(stderr, "kiln-bench: unknown suite '{}' (known: {}; see --list)\n", name,
                 known_suites());
      return 2;
    }
    // A suite named twice runs once: its summary and JSON keys name each case once.
    if (std::find(selected.begin(), selected.end(), s) != selected.end()) {
      fmt::print(stderr, "kiln-bench: suite '{}' is named twice; it runs once\n", name);
      continue;
    }
    selected.push_back(s);
  }

  // Build every case list first: the table's columns fit the longest name.
  std::vector<std::vector<kb::Case>> cases;
  Widths widths;
  for (const kb::Suite* s : selected) {
    auto& list = cases.emplace_back();
    for (kb::Case& c : s->cases())
      if (args.filter.empty() || c.name.find(args.filter) != std::string::npos)
        list.push_back(std::move(c));
    widths.suite = std::max(widths.suite, s->name.size());
    for (const kb::Case& c : list) widths.name = std::max(widths.name, c.name.size());
  }

  size_t matched = 0;
  for (const auto& list : cases) matched += list.size();
  if (matched == 0) {
    fmt::print(stderr, "kiln-bench: no case of {} matches --filter '{}' (see --list)\n",
               fmt::join(args.suites, ", "), args.filter);
    return 2;
  }

  // A --json file that cannot be written fails now, not after the whole run (and a file that
  // was not there is not left behind, empty, by this check).
  if (!args.json_path.empty()) {
    const bool existed = std::filesystem::exists(args.json_path);
    std::FILE* f = std::fopen(args.json_path.c_str(), "a");
    if (!f) {
      fmt::print(stderr, "kiln-bench: cannot write --json file '{}': {}\n", args.json_path,
                 std::strerror(errno));
      return 1;  // as --help says: the JSON file could not be written
    }
    std::fclose(f);
    if (!existed) std::filesystem::remove(args.json_path);
  }
  if (args.threads > 0) kiln::cpu::set_num_threads(args.threads);
  kb::RunConfig config{args.quick, kiln::cpu::num_threads()};
  fmt::print("kiln-bench: {} thread(s) of {} hardware, {}; CPU: {}{}\n", config.threads,
             std::thread::hardware_concurrency(), args.quick ? "quick" : "full repetitions",
             kb::cpu_description(),
             kiln::float32_matmul_precision() == kiln::MatmulPrecision::Highest
                 ? ""
                 : fmt::format("; float32 matmul precision: {}",
                               kiln::name(kiln::float32_matmul_precision())));
  // Review: with compile() off, "compiled" rows of the suites that call it were eager code.
  if (kiln::tracer::compile_disabled())
    fmt::print("kiln-bench: KILN_COMPILE=0: compile() runs functions eagerly, so the "
               "\"compiled\" rows of suites that use it (tutorial, digits, transformer, "
               "embedding, compile-overhead) measure eager code\n");

  std::vector<kb::Record> records;
  print_header(widths);
  // Progress on stderr (the table on stdout stays clean): case k of n, elapsed, a rough ETA
  // from the mean time per case so far.
  size_t total = 0, done = 0;
  for (const auto& list : cases) total += list.size();
  auto t0 = std::chrono::steady_clock::now();
  for (size_t i = 0; i < selected.size(); ++i) {
    const std::vector<kb::Case>& list = cases[i];
    for (size_t j = 0; j < list.size(); ++j) {
      const kb::Case& c = list[j];
      // An interleaved pair: this case and the next, same name, the other mode, both with
      // fixed steps.
      const bool pair = c.interleave && c.fixed_reps > 0 && j + 1 < list.size() &&
                        list[j + 1].interleave && list[j + 1].fixed_reps > 0 &&
                        list[j + 1].name == c.name && list[j + 1].mode != c.mode;
      double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::string eta = done ? fmt::format(", ETA ~{:.0f} s", elapsed / done * (total - done)) : "";
      fmt::print(stderr, "[{}/{}] {}/{} ({}{}) ... {:.0f} s elapsed{}\n", done + 1, total,
                 selected[i]->name, c.name, kb::mode_name(c.mode),
                 pair ? fmt::format(" and {}, alternating", kb::mode_name(list[j + 1].mode)) : "",
                 elapsed, eta);
      std::vector<kb::Record> ran =
          pair ? kb::run_interleaved(*selected[i], c, list[j + 1], config)
               : std::vector<kb::Record>{kb::run_case(*selected[i], c, config)};
      for (kb::Record& r : ran) {
        records.push_back(std::move(r));
        print_row(records.back(), widths);
        ++done;
      }
      std::fflush(stdout);
      j += ran.size() - 1;
    }
  }

  for (const kb::Suite* s : selected)
    if (s->summary) s->summary(records);

  int failed = 0;
  for (const kb::Record& r : records) failed += r.status == kb::Status::Failed;
  if (failed) fmt::print("\n{} of {} case(s) failed.\n", failed, records.size());

  if (!args.json_path.empty()) {
    if (!write_json(args.json_path, records)) {
      fmt::print(stderr, "kiln-bench: cannot write '{}': {}\n", args.json_path,
                 std::strerror(errno));
      return 1;
    }
    fmt::print("wrote {} record(s) to {}\n", records.size(), args.json_path);
  }
  return failed ? 1 : 0;
}
