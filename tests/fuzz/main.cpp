// kiln-fuzz: differential fuzzing of kiln::compile against eager mode (tests/fuzz/README.md).
//
//   kiln-fuzz [--n N] [--seed S] [--start I] [--index I] [--keep-going] [--no-shrink]
//             [--verbose] [--print] [--max-seconds T]
//
// Env: KILN_FUZZ_N and KILN_FUZZ_SEED set the defaults of --n and --seed.
#include <fmt/format.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>

#include "fuzz/fuzz.h"

using namespace kiln::fuzz;

int main(int argc, char** argv) {
  uint64_t n = 500, seed = 1, start = 0;
  int64_t only = -1;
  bool keep_going = false, do_shrink = true, verbose = false, print = false;
  double max_seconds = 0;
  if (const char* e = std::getenv("KILN_FUZZ_N")) n = std::strtoull(e, nullptr, 10);
  if (const char* e = std::getenv("KILN_FUZZ_SEED")) seed = std::strtoull(e, nullptr, 10);
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) {
        fmt::print(stderr, "kiln-fuzz: {} needs a value\n", a);
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--n") n = std::strtoull(next(), nullptr, 10);
    else if (a == "--seed") seed = std::strtoull(next(), nullptr, 10);
    else if (a == "--start") start = std::strtoull(next(), nullptr, 10);
    else if (a == "--index") only = std::strtoll(next(), nullptr, 10);
    else if (a == "--keep-going") keep_going = true;
    else if (a == "--no-shrink") do_shrink = false;
    else if (a == "--verbose") verbose = true;
    else if (a == "--print") print = true;
    else if (a == "--max-seconds") max_seconds = std::strtod(next(), nullptr);
    else {
      fmt::print(stderr,
                 "usage: kiln-fuzz [--n N] [--seed S] [--start I] [--index I] [--keep-going] "
                 "[--no-shrink] [--verbose] [--print] [--max-seconds T]\n");
      return 2;
    }
  }
  uint64_t first = only >= 0 ? static_cast<uint64_t>(only) : start;
  uint64_t last = only >= 0 ? first + 1 : start + n;
  auto t0 = std::chrono::steady_clock::now();
  int failures = 0;
  uint64_t ran = 0;
  for (uint64_t i = first; i < last; ++i) {
    double elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (max_seconds > 0 && elapsed > max_seconds) break;
    Program p = generate(seed, i);
    if (verbose) fmt::print("program {} (seed {}): {}\n", i, seed, summary(p));
    if (print) fmt::print("{}\n", to_cpp(p, "(none: --print)"));
    std::fflush(stdout);
    std::string d = check(p);
    ++ran;
    if (d.empty()) continue;
    ++failures;
    fmt::print("\nFAIL program {} (seed {}): {}\n  {}\n", i, seed, d, summary(p));
    if (do_shrink) {
      Program s = shrink(p);
      std::string ds = check(s);
      fmt::print("shrunk to {} ops: {}\n", s.nodes.size(), ds.empty() ? d : ds);
      fmt::print("----- repro (kiln-fuzz --seed {} --index {}) -----\n{}\n-----\n", seed, i,
                 to_cpp(s, ds.empty() ? d : ds));
    }
    std::fflush(stdout);
    if (!keep_going) break;
  }
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  fmt::print("kiln-fuzz: seed {}, programs {}..{}: {} run, {} failing, {:.1f} s\n", seed, first,
             first + ran, ran, failures, secs);
  return failures ? 1 : 0;
}
