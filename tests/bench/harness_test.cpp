// kiln-bench's harness (benchmarks/harness.cpp): interleaved eager / compiled pairs, and the
// GEMM time per step of fixed-step cases, the report of slow steps, and KILN_BENCH_DEVICE.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#include <chrono>
#include <thread>

#include "kiln/kiln.h"

#include "benchmarks/harness.h"

namespace kb = kiln::bench;

namespace {

// A fixed-step case whose calls append `tag` to `log`; the call numbered `throw_at` (from 0,
// warm-up included) throws.
kb::Case logging_case(kb::Mode mode, std::string tag, std::vector<std::string>& log,
                      int throw_at = -1) {
  kb::Case c;
  c.name = "step";
  c.mode = mode;
  c.unit = "steps/s";
  c.fixed_warmup = 2;
  c.fixed_reps = 3;
  c.quick_warmup = 1;
  c.quick_reps = 2;
  c.interleave = true;
  c.setup = [&log, tag, throw_at](const kb::RunConfig&) {
    auto calls = std::make_shared<int>(0);
    return kb::Benchmark{[&log, tag, throw_at, calls] {
                           if ((*calls)++ == throw_at) throw std::runtime_error(tag + " broke");
                           log.push_back(tag);
                         },
                         kb::per_second(1.0)};
  };
  return c;
}

}  // namespace

TEST_CASE("harness: an interleaved pair alternates warm-up and timed calls, one record each") {
  kb::Suite suite{"s", "test", {}, {}};
  std::vector<std::string> log;
  kb::Case e = logging_case(kb::Mode::Eager, "e", log);
  kb::Case c = logging_case(kb::Mode::Compiled, "c", log);
  std::vector<kb::Record> r = kb::run_interleaved(suite, e, c, kb::RunConfig{false, 1});
  CHECK(log == std::vector<std::string>{"e", "c", "e", "c", "e", "c", "e", "c", "e", "c"});
  REQUIRE(r.size() == 2);
  CHECK(r[0].mode == kb::Mode::Eager);
  CHECK(r[1].mode == kb::Mode::Compiled);
  for (const kb::Record& rec : r) {
    CHECK(rec.status == kb::Status::Ok);
    CHECK(rec.case_name == "step");
    CHECK(rec.min_ms <= rec.median_ms);
    CHECK(rec.median_ms <= rec.max_ms);
    // total_time (s), avg_step_time (ms) over the 3 timed calls, and their GEMM time (none)
    REQUIRE(rec.extra.size() == 3);
    CHECK(rec.extra[0].first == "total_time");
    CHECK(rec.extra[1].second == Approx(rec.extra[0].second / 3 * 1e3));
    CHECK(rec.extra[2].first == "gemm_time_per_step");
    CHECK(rec.extra[2].second == 0);
    CHECK(rec.value == Approx(3 / rec.extra[0].second));  // 1 step per call
  }
  log.clear();
  kb::run_interleaved(suite, e, c, kb::RunConfig{true, 1});  // --quick: 1 warm-up, 2 timed
  CHECK(log == std::vector<std::string>{"e", "c", "e", "c", "e", "c"});
}

TEST_CASE("harness: a failing case of an interleaved pair is reported, the other runs on") {
  kb::Suite suite{"s", "test", {}, {}};
  std::vector<std::string> log;
  kb::Case e = logging_case(kb::Mode::Eager, "e", log);
  kb::Case c = logging_case(kb::Mode::Compiled, "c", log, /*throw_at=*/3);
  std::vector<kb::Record> r = kb::run_interleaved(suite, e, c, kb::RunConfig{false, 1});
  CHECK(log == std::vector<std::string>{"e", "c", "e", "c", "e", "c", "e", "e"});
  REQUIRE(r.size() == 2);
  CHECK(r[0].status == kb::Status::Ok);
  CHECK(r[1].status == kb::Status::Failed);
  CHECK(r[1].error == "c broke");

  kb::Case broken_setup = c;
  broken_setup.setup = [](const kb::RunConfig&) -> kb::Benchmark {
    throw kb::Skipped("no device");
  };
  log.clear();
  r = kb::run_interleaved(suite, broken_setup, e, kb::RunConfig{false, 1});
  CHECK(log == std::vector<std::string>{"e", "e", "e", "e", "e"});
  CHECK(r[0].status == kb::Status::Skipped);
  CHECK(r[0].error == "no device");
  CHECK(r[1].status == kb::Status::Ok);
}

TEST_CASE("harness: an interleaved case without timed calls is reported failed, not read empty") {
  kb::Suite suite{"s", "test", {}, {}};
  std::vector<std::string> log;
  kb::Case e = logging_case(kb::Mode::Eager, "e", log);
  kb::Case c = logging_case(kb::Mode::Compiled, "c", log);
  c.quick_reps = 0;
  std::vector<kb::Record> r = kb::run_interleaved(suite, e, c, kb::RunConfig{true, 1});
  CHECK(log == std::vector<std::string>{"e", "c", "e", "e"});
  CHECK(r[0].status == kb::Status::Ok);
  CHECK(r[1].status == kb::Status::Failed);
  CHECK(r[1].error.find("no timed calls") != std::string::npos);
}

TEST_CASE("harness: a single fixed-step case without timed calls is reported failed too") {
  kb::Suite suite{"s", "test", {}, {}};
  std::vector<std::string> log;
  kb::Case c = logging_case(kb::Mode::Compiled, "c", log);
  c.quick_reps = 0;
  kb::Record r = kb::run_case(suite, c, kb::RunConfig{true, 1});
  CHECK(log == std::vector<std::string>{"c"});  // the warm-up call only
  CHECK(r.status == kb::Status::Failed);
  CHECK(r.error.find("no timed calls") != std::string::npos);
}

TEST_CASE("harness: a fixed-step case reports the wall time of its GEMM ops per step") {
  // A step of one 512x512x512 product (eager matmul) and a 2 ms pause: the GEMM time is part
  // of the step's time, and far from all of it.
  kb::Suite suite{"s", "test", {}, {}};
  kb::Case c;
  c.name = "step";
  c.unit = "steps/s";
  c.fixed_warmup = 1;
  c.fixed_reps = 4;
  c.setup = [](const kb::RunConfig&) {
    auto a = std::make_shared<kiln::Tensor>(kiln::randn({512, 512}));
    return kb::Benchmark{[a] {
                           kiln::Tensor p = kiln::matmul(*a, *a);
                           (void)p.data<float>()[0];
                           std::this_thread::sleep_for(std::chrono::milliseconds(2));
                         },
                         kb::per_second(1.0)};
  };
  kb::Record rec = kb::run_case(suite, c, kb::RunConfig{false, 1});
  REQUIRE(rec.status == kb::Status::Ok);
  REQUIRE(rec.extra.size() == 3);
  CHECK(rec.extra[2].first == "gemm_time_per_step");
  const double gemm_ms = rec.extra[2].second, step_ms = rec.extra[1].second;
  CHECK(gemm_ms > 0);
  CHECK(gemm_ms < step_ms - 1.9);  // the pause is not GEMM time
}

TEST_CASE("harness: a fixed-step case reports each step of a second or more on stderr") {
  // Quick: one warm-up step of 1.05 s and two timed steps, the second of 1.05 s.
  kb::Suite suite{"s", "test", {}, {}};
  kb::Case c;
  c.name = "long_step";
  c.mode = kb::Mode::Compiled;
  c.unit = "steps/s";
  c.fixed_reps = 2;
  c.quick_warmup = 1;
  c.quick_reps = 2;
  c.setup = [](const kb::RunConfig&) {
    auto calls = std::make_shared<int>(0);
    return kb::Benchmark{[calls] {
                           int call = (*calls)++;
                           if (call != 1)
                             std::this_thread::sleep_for(std::chrono::milliseconds(1050));
                         },
                         kb::per_second(1.0)};
  };
  std::fflush(stderr);
  char path[] = "/tmp/kiln_harness_stderr_XXXXXX";
  int file = mkstemp(path);
  REQUIRE(file >= 0);
  int saved = dup(2);
  dup2(file, 2);
  kb::Record rec = kb::run_case(suite, c, kb::RunConfig{true, 1});
  std::fflush(stderr);
  dup2(saved, 2);
  close(saved);
  close(file);
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::remove(path);
  INFO(text);
  CHECK(rec.status == kb::Status::Ok);
  CHECK(text.find("long_step (compiled): warm-up step 1/1 took 1.") != std::string::npos);
  CHECK(text.find("timed step 1/2") == std::string::npos);  // the fast one
  CHECK(text.find("long_step (compiled): timed step 2/2 took 1.") != std::string::npos);
}

TEST_CASE("harness: KILN_BENCH_DEVICE is cpu, cuda or cuda:N; anything else is an error") {
  // A mistyped value ran the GPU suites on the CPU and reported success (break-it pass).
  const char* name = "KILN_BENCH_DEVICE";
  ::unsetenv(name);
  CHECK(kb::bench_device() == kiln::Device::cpu());
  const std::pair<const char*, kiln::Device> good[] = {
      {"", kiln::Device::cpu()}, {"cpu", kiln::Device::cpu()}, {"cuda", kiln::Device::cuda()},
      {"cuda:0", kiln::Device::cuda(0)}, {"cuda:3", kiln::Device::cuda(3)}};
  for (const auto& [text, device] : good) {
    INFO(text);
    ::setenv(name, text, 1);
    CHECK(kb::bench_device() == device);
  }
  for (const char* bad : {"bogus", "cudaXYZ", "cuda:", "cuda:x", "cuda:-1", "cuda:999", "CPU"}) {
    INFO(bad);
    ::setenv(name, bad, 1);
    CHECK_THROWS_AS(kb::bench_device(), std::invalid_argument);
  }
  ::unsetenv(name);
}

// Any value but "0" was on: KILN_BENCH_EXPLAIN=false printed explain(), KILN_BENCH_FULL=off ran
// the original sizes. They take the words of every boolean KILN_* switch (core/env.h).
TEST_CASE("harness: KILN_BENCH_EXPLAIN and KILN_BENCH_FULL are boolean switches") {
  const std::pair<const char*, bool (*)()> switches[] = {
      {"KILN_BENCH_EXPLAIN", kb::explain_requested}, {"KILN_BENCH_FULL", kb::full_sizes_requested}};
  for (auto [name, read] : switches) {
    INFO(name);
    ::unsetenv(name);
    CHECK_FALSE(read());
    for (const char* on : {"1", "true", "ON", "yes "}) {
      INFO(on);
      ::setenv(name, on, 1);
      CHECK(read());
    }
    for (const char* off : {"0", "false", "off", "No", "", "bogus"}) {
      INFO(off);
      ::setenv(name, off, 1);
      CHECK_FALSE(read());
    }
    ::unsetenv(name);
  }
}
