// kiln-fuzz: differential fuzzing of kiln::compile against eager mode (tests/fuzz/README.md).
//
//   kiln-fuzz [--n N] [--seed S] [--start I] [--index I] [--keep-going] [--no-shrink]
//             [--verbose] [--print] [--max-seconds T] [--isolate] [--large] [--program FILE]
//
// Env: KILN_FUZZ_N and KILN_FUZZ_SEED set the defaults of --n and --seed.
#include <fmt/format.h>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>

#include "codegen/codegen.h"
#include "fuzz/fuzz.h"
#include "ptxas.h"

using namespace kiln;
using namespace kiln::fuzz;

namespace {

// The program running now, for the crash handler.
volatile uint64_t g_seed = 0, g_index = 0;
volatile bool g_in_program = false;
// --keep-going: after a crash, the process re-executes itself from the next program with
// these arguments (prepared before any program runs; execv is async-signal-safe).
std::vector<std::string> g_restart_args;
uint64_t g_end = 0;
volatile bool g_large = false;
volatile uint64_t g_prior_failures = 0, g_prior_ran = 0, g_ran = 0, g_failures = 0;

void on_crash(int sig) {
  if (g_in_program) {
    char buf[256];
    int n = std::snprintf(buf, sizeof buf,
                          "\nkiln-fuzz: signal %d in program %llu (seed %llu); shrink it with: "
                          "kiln-fuzz --seed %llu --index %llu --isolate%s\n",
                          sig, static_cast<unsigned long long>(g_index),
                          static_cast<unsigned long long>(g_seed),
                          static_cast<unsigned long long>(g_seed),
                          static_cast<unsigned long long>(g_index), g_large ? " --large" : "");
    if (n > 0) (void)!write(2, buf, static_cast<size_t>(n));
    if (!g_restart_args.empty() && g_index + 1 < g_end) {
      // Numbers written into preallocated strings: no allocation in the handler.
      static char start[32], fails[32], ran[32];
      std::snprintf(start, sizeof start, "%llu", static_cast<unsigned long long>(g_index + 1));
      std::snprintf(fails, sizeof fails, "%llu",
                    static_cast<unsigned long long>(g_prior_failures + g_failures + 1));
      std::snprintf(ran, sizeof ran, "%llu",
                    static_cast<unsigned long long>(g_prior_ran + g_ran + 1));
      static char* argv[64];
      size_t k = 0;
      for (std::string& a : g_restart_args) argv[k++] = a.data();
      argv[k++] = const_cast<char*>("--start");
      argv[k++] = start;
      argv[k++] = const_cast<char*>("--prior");
      argv[k++] = fails;
      argv[k++] = ran;
      argv[k] = nullptr;
      execv("/proc/self/exe", argv);
    }
  }
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

// --ptx: each graph the tracer compiles for the CPU is compiled for CUDA too (PTX, no GPU
// needed) and assembled with ptxas when it is installed; the first failure is kept.
std::mutex g_ptx_mu;
std::string g_ptx_failure, g_ptxas;
bool g_ptx = false;

void compile_for_cuda(const ir::Graph& g, const codegen::CompileOptions& cpu_options) {
  codegen::CompileOptions options = cpu_options;
  options.device = Device::cuda();
  std::string failure;
  try {
    std::string ptx = codegen::Executable(g, options).ptx();
    if (!ptx.empty() && !g_ptxas.empty())
      failure = kiln::testing::ptxas_errors(g_ptxas, ptx, "fuzz");
  } catch (const Error& e) {
    failure = fmt::format("the CPU compiled it, the CUDA compile raised: {}", e.what());
  }
  std::lock_guard lock(g_ptx_mu);
  if (!failure.empty() && g_ptx_failure.empty())
    g_ptx_failure = fmt::format("{}\ngraph:\n{}", failure, g.to_mlir());
}

// check(p), then (--ptx) the CUDA compiles of the graphs it built.
std::string check_program(const Program& p) {
  if (!g_ptx) return check(p);
  g_ptx_failure.clear();
  codegen::CompileObserver before = codegen::set_compile_observer_for_testing(compile_for_cuda);
  std::string d = check(p);
  codegen::set_compile_observer_for_testing(before);
  std::lock_guard lock(g_ptx_mu);
  return !d.empty() || g_ptx_failure.empty() ? d : "PTX for CUDA: " + g_ptx_failure;
}

// Runs `kiln-fuzz --program FILE` in a child process: "" when it passes, else the failure
// (a crash included).
std::string isolated_check(const std::string& self, const Program& p) {
  char path[] = "/tmp/kiln-fuzz-XXXXXX";
  int fd = mkstemp(path);
  if (fd < 0) return "mkstemp failed";
  std::string text = serialize(p);
  (void)!write(fd, text.data(), text.size());
  close(fd);
  std::string out_path = std::string(path) + ".out";
  std::string cmd = fmt::format("'{}' --program '{}'{} > '{}' 2>&1", self, path,
                                g_ptx ? " --ptx" : "", out_path);
  int status = std::system(cmd.c_str());
  std::ifstream in(out_path);
  std::stringstream ss;
  ss << in.rdbuf();
  std::remove(path);
  std::remove(out_path.c_str());
  if (status == 0) return "";
  if (WIFEXITED(status) && WEXITSTATUS(status) >= 128)
    return fmt::format("crash (signal {})", WEXITSTATUS(status) - 128);
  if (WIFSIGNALED(status)) return fmt::format("crash (signal {})", WTERMSIG(status));
  std::string o = ss.str();
  size_t k = o.find("FAIL: ");
  return k == std::string::npos ? "failure: " + o : o.substr(k + 6);
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t n = 500, seed = 1, start = 0;
  int64_t only = -1;
  bool keep_going = false, do_shrink = true, verbose = false, print = false;
  double max_seconds = 0;
  bool isolate = false;
  bool large = false;
  uint64_t end_arg = 0;
  std::vector<std::pair<uint64_t, uint64_t>> skip;  // (seed, index)
  std::string program_file;
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
    else if (a == "--isolate") isolate = true;
    else if (a == "--large") large = true;
    else if (a == "--ptx") g_ptx = true;
    else if (a == "--skip") {  // known failures (README "Findings"): SEED:INDEX,...
      std::stringstream ss(next());
      for (std::string x; std::getline(ss, x, ',');) {
        size_t c = x.find(':');
        if (c == std::string::npos) continue;
        skip.push_back({std::strtoull(x.c_str(), nullptr, 10),
                        std::strtoull(x.c_str() + c + 1, nullptr, 10)});
      }
    }
    else if (a == "--end") end_arg = std::strtoull(next(), nullptr, 10);
    else if (a == "--program") program_file = next();
    else if (a == "--prior") {  // (after a crash restart) failures and programs run before
      g_prior_failures = std::strtoull(next(), nullptr, 10);
      g_prior_ran = std::strtoull(next(), nullptr, 10);
    }
    else {
      fmt::print(stderr,
                 "usage: kiln-fuzz [--n N] [--seed S] [--start I] [--index I] [--keep-going] "
                 "[--no-shrink] [--verbose] [--print] [--max-seconds T] [--isolate] "
                 "[--large] [--ptx] [--program FILE] [--skip SEED:I,...]\n");
      return 2;
    }
  }
  if (!program_file.empty()) {  // one serialized program (the isolated shrinker's child)
    std::ifstream in(program_file);
    std::stringstream ss;
    ss << in.rdbuf();
    Program p = deserialize(ss.str());
    if (print) fmt::print("{}\n", to_cpp(p, "(none: --print)"));
    std::string d = check_program(p);
    if (d.empty()) return 0;
    fmt::print("FAIL: {}\n", d);
    return 1;
  }
  {  // a restart from the crash handler inherits its blocked signal: unblock it
    sigset_t all;
    sigfillset(&all);
    sigprocmask(SIG_UNBLOCK, &all, nullptr);
  }
  std::signal(SIGSEGV, on_crash);
  std::signal(SIGABRT, on_crash);
  std::signal(SIGBUS, on_crash);
  std::signal(SIGFPE, on_crash);
  std::string self = argv[0];
  g_large = large;  // for the crash handler's message
  if (g_ptx) {
    g_ptxas = kiln::testing::find_ptxas();
    if (g_ptxas.empty())
      fmt::print("kiln-fuzz --ptx: ptxas not found; the PTX is generated, not assembled\n");
  }
  Checker checker = nullptr;
  if (g_ptx) checker = check_program;
  if (isolate) checker = [&self](const Program& q) { return isolated_check(self, q); };
  uint64_t first = only >= 0 ? static_cast<uint64_t>(only) : start;
  uint64_t last = only >= 0 ? first + 1 : end_arg ? end_arg : start + n;
  if (keep_going && only < 0) {
    // Restart arguments: everything but --start/--prior/--n, then --n for the rest.
    g_restart_args.push_back(argv[0]);
    for (int i = 1; i < argc; ++i) {
      std::string a = argv[i];
      if (a == "--start" || a == "--n" || a == "--end") { ++i; continue; }
      if (a == "--prior") { i += 2; continue; }
      g_restart_args.push_back(a);
    }
    g_restart_args.push_back("--end");
    g_restart_args.push_back(std::to_string(last));
    g_end = last;
  }
  auto t0 = std::chrono::steady_clock::now();
  int failures = 0;
  uint64_t ran = 0;
  for (uint64_t i = first; i < last; ++i) {
    double elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (max_seconds > 0 && elapsed > max_seconds) break;
    if (only < 0 && std::find(skip.begin(), skip.end(), std::make_pair(seed, i)) != skip.end()) {
      fmt::print("kiln-fuzz: program {} (seed {}) skipped: a known failure (--skip)\n", i, seed);
      continue;
    }
    Program p = generate(seed, i, large);
    if (verbose) fmt::print("program {} (seed {}): {}\n", i, seed, summary(p));
    if (print) fmt::print("{}\n", to_cpp(p, "(none: --print)"));
    std::fflush(stdout);
    g_seed = seed;
    g_index = i;
    g_in_program = true;
    std::string d = checker ? checker(p) : check(p);
    g_in_program = false;
    ++ran;
    g_ran = ran;
    if (d.empty()) continue;
    ++failures;
    g_failures = static_cast<uint64_t>(failures);
    fmt::print("\nFAIL program {} (seed {}): {}\n  {}\n", i, seed, d, summary(p));
    if (do_shrink) {
      Program s = shrink(p, {}, 400, checker);
      std::string ds = checker ? checker(s) : check(s);
      fmt::print("shrunk to {} ops: {}\n", s.nodes.size(), ds.empty() ? d : ds);
      fmt::print("----- repro (kiln-fuzz --seed {} --index {}{}; shrunk program: {}) -----\n{}\n-----\n",
                 seed, i, large ? " --large" : "", serialize(s), to_cpp(s, ds.empty() ? d : ds));
    }
    std::fflush(stdout);
    if (!keep_going) break;
  }
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  fmt::print("kiln-fuzz: seed {}, programs {}..{}: {} run, {} failing, {:.1f} s\n", seed, first,
             first + ran, ran, failures, secs);
  if (g_prior_ran)
    fmt::print("kiln-fuzz: with the runs before crash restarts: {} run, {} failing (crashes "
               "included)\n", g_prior_ran + ran, g_prior_failures + failures);
  return failures || g_prior_failures ? 1 : 0;
}
