// cpu::parallel_for and its pool: every index exactly once, chunk sizes, nesting, regions after
// the workers went to sleep, and regions started from several threads at once.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

#include "backends/cpu/parallel.h"
#include "fork_children.h"
#include "kiln/kiln.h"

using namespace kiln;

namespace {

// Restores the pool size when a test ends.
struct ThreadCount {
  int saved = cpu::num_threads();
  explicit ThreadCount(int n) { cpu::set_num_threads(n); }
  ~ThreadCount() { cpu::set_num_threads(saved); }
};

// Runs parallel_for(begin, end, grain) and checks that the chunks cover [begin, end) exactly
// once, that there are at most num_threads() of them, and that all but the last hold at least
// `grain` indices.
void check_cover(int64_t begin, int64_t end, int64_t grain) {
  CAPTURE(begin, end, grain, cpu::num_threads());
  std::vector<std::atomic<int>> hits(static_cast<size_t>(std::max<int64_t>(end - begin, 0)));
  std::mutex mu;
  std::vector<std::pair<int64_t, int64_t>> chunks;
  cpu::parallel_for(begin, end, grain, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) hits[i - begin].fetch_add(1);
    std::lock_guard<std::mutex> lock(mu);
    chunks.emplace_back(lo, hi);
  });
  bool once = true;
  for (auto& h : hits) once &= h.load() == 1;
  CHECK(once);
  if (end <= begin) {
    CHECK(chunks.empty());
    return;
  }
  CHECK(chunks.size() <= static_cast<size_t>(cpu::num_threads()));
  std::sort(chunks.begin(), chunks.end());
  for (size_t c = 0; c + 1 < chunks.size(); ++c) CHECK(chunks[c].second - chunks[c].first >= grain);
}

}  // namespace

TEST_CASE("parallel_for: every index exactly once, at most one chunk per thread", "[threads]") {
  for (int threads : {1, 2, 3, 4}) {
    ThreadCount tc(threads);
    for (int64_t n : {0, 1, 2, 3, 7, 64, 1000, 100003})
      for (int64_t grain : {1, 2, 5, 1000, 1 << 20}) check_cover(-3, n - 3, grain);
  }
}

TEST_CASE("parallel_for: a region after the workers went to sleep still covers everything", "[threads]") {
  // Idle workers spin for at most 50 us, then sleep: the next region must wake them (or the
  // caller claims their chunks). Alternate short and long gaps.
  ThreadCount tc(2);
  for (int round = 0; round < 40; ++round) {
    if (round % 2) std::this_thread::sleep_for(std::chrono::microseconds(200));
    check_cover(0, 4096, 1);
  }
}

TEST_CASE("parallel_for: nested calls run inline on the calling thread", "[threads]") {
  ThreadCount tc(2);
  std::atomic<int> inner_chunks{0}, total{0};
  std::atomic<bool> same_thread{true};  // Catch2's CHECK is not thread-safe: check afterwards
  cpu::parallel_for(0, 2, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      const std::thread::id outer = std::this_thread::get_id();
      cpu::parallel_for(0, 1000, 1, [&](int64_t a, int64_t b) {
        if (std::this_thread::get_id() != outer) same_thread = false;
        inner_chunks.fetch_add(1);
        total.fetch_add(static_cast<int>(b - a));
      });
    }
  });
  CHECK(same_thread.load());
  CHECK(inner_chunks.load() == 2);  // one inline chunk per outer index
  CHECK(total.load() == 2000);
}

TEST_CASE("parallel_for: regions started from several threads at once", "[threads]") {
  ThreadCount tc(2);
  std::atomic<bool> ok{true};
  std::vector<std::thread> users;
  for (int u = 0; u < 4; ++u)
    users.emplace_back([&, u] {
      for (int r = 0; r < 300; ++r) {
        const int64_t n = 1 + (u * 131 + r * 17) % 5000;
        std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
        cpu::parallel_for(0, n, 1, [&](int64_t lo, int64_t hi) {
          for (int64_t i = lo; i < hi; ++i) hits[i].fetch_add(1);
        });
        for (auto& h : hits)
          if (h.load() != 1) ok = false;
      }
    });
  for (auto& t : users) t.join();
  CHECK(ok.load());
}

TEST_CASE("set_flush_denormal: denormal results and inputs are zero on every thread", "[threads]") {
  ThreadCount four(4);  // more workers than this machine's cores: every chunk still follows
  struct Restore {
    ~Restore() { set_flush_denormal(false); }
  } restore;
  const int64_t n = 4 * cpu::kGrainSize;  // one chunk per thread
  Tensor tiny = full({n}, 1e-20f);        // normal; its square 1e-40 is denormal in float32
  Tensor denormal = full({n}, 1e-40f);    // stored as is: a fill does no arithmetic
  auto count_zero = [](const Tensor& t) {
    std::vector<float> v = t.to_vector<float>();
    return std::count(v.begin(), v.end(), 0.0f);
  };
  // The pool: each chunk waits until another thread has started one, so workers run some.
  {
    set_flush_denormal(true);
    std::atomic<int> started{0}, flushed{0};
    std::mutex mu;
    std::vector<std::thread::id> ids;
    cpu::parallel_for(0, 2, 1, [&](int64_t, int64_t) {
      {
        std::lock_guard<std::mutex> lock(mu);
        ids.push_back(std::this_thread::get_id());
      }
      started.fetch_add(1);
      auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
      while (started.load() < 2 && std::chrono::steady_clock::now() < deadline)
        std::this_thread::yield();
      volatile float x = 1e-20f;
      if (x * x == 0.0f) flushed.fetch_add(1);
    });
    set_flush_denormal(false);
    REQUIRE(ids.size() == 2);
    CHECK(ids[0] != ids[1]);
    CHECK(flushed.load() == 2);
  }
  // Eager ops.
  REQUIRE(count_zero(tiny * tiny) == 0);
  REQUIRE(count_zero(denormal * 1.0f) == 0);
  CHECK(set_flush_denormal(true));
  CHECK(count_zero(tiny * tiny) == n);       // flush to zero (results)
  CHECK(count_zero(denormal * 1.0f) == n);   // denormals are zero (inputs)
  CHECK(count_zero(tiny * 2.0f) == 0);       // normal values are untouched
  CHECK(set_flush_denormal(false));
  std::vector<float> back = (tiny * tiny).to_vector<float>();
  CHECK(std::all_of(back.begin(), back.end(), [](float v) { return v == 1e-20f * 1e-20f; }));
}

TEST_CASE("fork() while another thread runs parallel ops: the child's ops work", "[fork]") {
  // Found by review: the child inherited the pool's mutexes held by the busy thread (and the
  // generator's) and deadlocked in its first parallel op. The child starts a fresh pool.
  ThreadCount two(2);
  std::atomic<bool> stop{false};
  std::thread busy([&] {
    Tensor a = ones({1 << 20});
    while (!stop) {
      (a * 2.0 + 1.0).sum();
      randn({4096});
    }
  });
  int ok = kiln::testing::forked_children_ok(5, std::chrono::milliseconds(3), [] {
    Tensor a = full({1 << 20}, 2.0);
    bool right = (a * 2.0 + 1.0).sum().item<double>() == 5.0 * (1 << 20);
    return right && randn({1 << 16}).numel() == (1 << 16);
  });
  stop = true;
  busy.join();
  CHECK(ok == 5);
}

TEST_CASE("set_num_threads: a count below 1 raises, as PyTorch; above 256 is 256") {
  // Review (a new user's trial): 0 and -1 were taken as 1 without a word.
  const int saved = get_num_threads();
  CHECK_THROWS_WITH(set_num_threads(0), Catch::Contains("set_num_threads") &&
                                            Catch::Contains("positive integer, got 0") &&
                                            Catch::Contains("parallel_test.cpp"));
  CHECK_THROWS_AS(set_num_threads(-1), Error);
  CHECK(get_num_threads() == saved);  // unchanged by the failed calls
  set_num_threads(1000);
  CHECK(get_num_threads() == 256);
  set_num_threads(saved);
  CHECK(get_num_threads() == saved);
}
