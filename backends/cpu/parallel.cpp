#include "backends/cpu/parallel.h"

#include <immintrin.h>
#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

namespace kiln::cpu {
namespace {

thread_local bool t_in_parallel = false;

// MXCSR bits 6-15: denormals-are-zero, exception masks, rounding, flush-to-zero (the low six
// are sticky exception flags, which each thread keeps).
constexpr uint32_t kCsrControl = 0xFFC0;
constexpr uint32_t kFlushDenormal = 1u << 15 | 1u << 6;  // FTZ | DAZ

// Tasks are claimed, not assigned: the caller and every awake worker take the next unclaimed
// task until none is left. A worker that is slow to wake (a futex wake-up costs 10-40 us on
// this VM) then finds its tasks done by the caller, so a parallel region is never much slower
// than running it on the calling thread.
class ThreadPool {
 public:
  explicit ThreadPool(int n) { resize(n); }
  ~ThreadPool() { stop_all(); }

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  void resize(int n) {
    stop_all();
    stop_ = false;
    // New workers start at the current generation: the last task_ is gone by now.
    const uint32_t gen = generation();
    for (int i = 1; i < n; ++i) workers_.emplace_back([this, gen] { worker_loop(gen); });
  }

  // Runs task(i) for every i in [0, n), on the caller and the workers; returns when all are done.
  void run(int n, const std::function<void(int)>& task) {
    std::lock_guard<std::mutex> run_lock(run_mu_);  // one parallel region at a time
    bool wake;
    uint32_t gen;
    {
      std::lock_guard<std::mutex> lock(mu_);
      task_ = &task;
      ntasks_ = n;
      csr_control_ = _mm_getcsr() & kCsrControl;
      unfinished_.store(n, std::memory_order_relaxed);
      gen = generation() + 1;
      claim_.store(uint64_t{gen} << 32, std::memory_order_release);  // new generation, index 0
      wake = sleepers_ > 0;
    }
    // A spinning worker sees the new generation by itself: no futex wake-up.
    if (wake) cv_.notify_all();
    t_in_parallel = true;
    run_claimed(gen, task, n);
    t_in_parallel = false;
    // Wait for tasks the workers claimed: spin briefly, then sleep.
    for (int spin = 0; spin < 2000 && unfinished_.load(std::memory_order_acquire) > 0; ++spin)
      _mm_pause();
    if (unfinished_.load(std::memory_order_acquire) > 0) {
      std::unique_lock<std::mutex> lock(mu_);
      done_cv_.wait(lock, [&] { return unfinished_.load(std::memory_order_acquire) == 0; });
    }
  }

 private:
  uint32_t generation() const {
    return static_cast<uint32_t>(claim_.load(std::memory_order_acquire) >> 32);
  }

  // Claims and runs tasks of generation `gen` until none is left. task_ stays valid while a
  // claimed task is unfinished: run() waits for unfinished_ == 0 before it returns.
  void run_claimed(uint32_t gen, const std::function<void(int)>& task, int n) {
    uint64_t c = claim_.load(std::memory_order_acquire);
    for (;;) {
      if (static_cast<uint32_t>(c >> 32) != gen || static_cast<int>(c & 0xffffffffu) >= n) return;
      if (!claim_.compare_exchange_weak(c, c + 1, std::memory_order_acq_rel)) continue;
      task(static_cast<int>(c & 0xffffffffu));
      if (unfinished_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
        std::lock_guard<std::mutex> lock(mu_);
        done_cv_.notify_one();
      }
      c = claim_.load(std::memory_order_acquire);
    }
  }

  void worker_loop(uint32_t seen) {
    t_in_parallel = true;
    for (;;) {
      spin_until_new_generation(seen);
      const std::function<void(int)>* task;
      int n;
      {
        std::unique_lock<std::mutex> lock(mu_);
        auto ready = [&] { return stop_ || generation() != seen; };
        if (!ready()) {
          ++sleepers_;
          cv_.wait(lock, ready);
          --sleepers_;
        }
        if (stop_) return;
        seen = generation();
        task = task_;
        n = ntasks_;
        follow_csr(csr_control_);
      }
      run_claimed(seen, *task, n);
    }
  }

  // Eager ops and compiled loops come back to back, each a parallel region: waiting a little
  // for the next one before sleeping saves the futex wake-up of each region (~10 us on this VM:
  // 13.4 -> 2.7 us per region after 10 us of serial work). Bounded, so an idle pool leaves the
  // CPU within kSpin.
  void spin_until_new_generation(uint32_t seen) const {
    constexpr auto kSpin = std::chrono::microseconds(50);
    const auto start = std::chrono::steady_clock::now();
    for (;;) {
      for (int i = 0; i < 16; ++i) {
        if (generation() != seen) return;
        _mm_pause();
      }
      if (std::chrono::steady_clock::now() - start > kSpin) return;
    }
  }

  // Workers run with the caller's floating-point controls (MXCSR: flush-to-zero,
  // denormals-are-zero, rounding), as if the caller ran every chunk itself.
  static void follow_csr(uint32_t control) {
    const uint32_t csr = _mm_getcsr();
    if ((csr & kCsrControl) != control) _mm_setcsr((csr & ~kCsrControl) | control);
  }

  void stop_all() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& w : workers_) w.join();
    workers_.clear();
  }

  std::vector<std::thread> workers_;
  std::mutex mu_, run_mu_;
  std::condition_variable cv_, done_cv_;
  const std::function<void(int)>* task_ = nullptr;  // guarded by mu_, with ntasks_
  int ntasks_ = 0;
  // Generation (high 32 bits, one per run()) and the next unclaimed task index (low 32 bits),
  // in one word so that a worker still holding the last generation can never claim a task of
  // the next one.
  std::atomic<uint64_t> claim_{0};
  std::atomic<int> unfinished_{0};  // tasks of the current run() not yet finished
  int sleepers_ = 0;                // workers waiting on cv_ (guarded by mu_)
  uint32_t csr_control_ = 0;        // the caller's MXCSR control bits (guarded by mu_)
  bool stop_ = false;
};

int default_threads() {
  if (const char* env = std::getenv("KILN_NUM_THREADS")) {
    char* end = nullptr;
    long n = std::strtol(env, &end, 10);  // the whole value: "2x" is not 2
    if (end != env && *end == '\0' && n >= 1) {
      if (n > kMaxThreads)
        std::fprintf(stderr, "kiln: KILN_NUM_THREADS=%s is above kiln's maximum; using %d\n", env,
                     kMaxThreads);
      return static_cast<int>(std::min<long>(n, kMaxThreads));
    }
    std::fprintf(stderr, "kiln: ignoring KILN_NUM_THREADS=%s (expected a positive integer)\n", env);
  }
  return std::clamp<int>(static_cast<int>(std::thread::hardware_concurrency()), 1, kMaxThreads);
}

// Leaked: workers outlive statics. A fork() child starts a fresh pool on first use: the
// parent's workers do not exist there, and the pool's mutexes may have been held by a thread
// that was running a parallel region when another forked (the child deadlocked in run()).
std::atomic<ThreadPool*> g_pool{nullptr};
std::atomic<int> g_pool_size{0};  // the size set, for the child's fresh pool

ThreadPool& pool() {
  if (ThreadPool* p = g_pool.load(std::memory_order_acquire)) return *p;
  static const bool registered = [] {
    pthread_atfork(nullptr, nullptr, [] { g_pool.store(nullptr, std::memory_order_release); });
    return true;
  }();
  (void)registered;
  const int size = g_pool_size.load();
  auto* fresh = new ThreadPool(size > 0 ? size : default_threads());
  ThreadPool* expected = nullptr;
  if (g_pool.compare_exchange_strong(expected, fresh, std::memory_order_acq_rel)) return *fresh;
  delete fresh;  // another thread made the pool first
  return *expected;
}

}  // namespace

int num_threads() { return pool().size(); }
bool set_flush_denormal(bool on) {
  const uint32_t csr = _mm_getcsr();
  _mm_setcsr(on ? csr | kFlushDenormal : csr & ~kFlushDenormal);
  return true;
}
void set_num_threads(int n) {
  g_pool_size.store(std::clamp(n, 1, kMaxThreads));
  pool().resize(g_pool_size.load());
}

bool in_parallel_region() { return t_in_parallel; }

void parallel_for(int64_t begin, int64_t end, int64_t grain,
                  const std::function<void(int64_t, int64_t)>& fn) {
  int64_t n = end - begin;
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  int threads = t_in_parallel ? 1 : static_cast<int>(std::min<int64_t>(num_threads(), n / grain));
  if (threads <= 1) {
    fn(begin, end);
    return;
  }
  int64_t chunk = (n + threads - 1) / threads;
  pool().run(threads, [&](int i) {
    int64_t b = begin + i * chunk, e = std::min(end, b + chunk);
    if (b < e) fn(b, e);
  });
}

}  // namespace kiln::cpu
