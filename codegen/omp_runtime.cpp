// The OpenMP entry points that MLIR's convert-scf-to-openmp code calls, over kiln's thread pool
// (cpu_parallel.h). Only what that lowering emits for a parallel loop without reductions:
//   __kmpc_fork_call(loc, argc, microtask, args...)  run microtask on every thread of a team
//   __kmpc_for_static_init_8u(...)                   this thread's block of the iterations
//   __kmpc_for_static_fini, __kmpc_barrier           nothing to do (see below)
//   __kmpc_global_thread_num                         the thread's index in its team
// A team is a cpu::parallel_for over team indices, so it never spins and nests (a graph run
// inside a row block or another parallel_for) run inline, one team member after the other.
// That is why the barrier is a no-op: the lowering places it at the end of the work-sharing
// loop, right before the region's join, and the join (parallel_for returning) already waits
// for every member; members never wait for each other inside a region.
#include <algorithm>
#include <atomic>
#include <cstdarg>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "backends/cpu/parallel.h"
#include "codegen/omp_runtime.h"
#include "codegen/runtime.h"

namespace kiln::codegen {
namespace {

struct Team {
  int32_t index = 0;
  int32_t size = 1;
};
thread_local Team t_team;
std::atomic<uint64_t> g_parallel_runs{0};
// Iterations of the next parallel loop (kiln_rt_parallel_work, called right before it).
thread_local int64_t t_next_work = std::numeric_limits<int64_t>::max();

using Microtask = void (*)(int32_t* global_tid, int32_t* bound_tid, ...);
constexpr int kMaxArgs = 4;  // the lowering passes the captured values as one struct pointer

void rt_parallel_work(int64_t iterations) { t_next_work = iterations; }

int64_t rt_column_block(int64_t cols) { return column_block(cols, cpu::num_threads()); }

int32_t kmpc_global_thread_num(void*) { return t_team.index; }

// Runs one member; returns the size of an allocation that failed in it (0: none).
size_t run_member(Microtask fn, int32_t argc, void* const* args, Team team) {
  const Team outer = t_team;
  t_team = team;
  AllocationFailureScope allocations;
  int32_t gtid = team.index, btid = 0;
  switch (argc) {
    case 0: fn(&gtid, &btid); break;
    case 1: fn(&gtid, &btid, args[0]); break;
    case 2: fn(&gtid, &btid, args[0], args[1]); break;
    case 3: fn(&gtid, &btid, args[0], args[1], args[2]); break;
    default: fn(&gtid, &btid, args[0], args[1], args[2], args[3]); break;
  }
  t_team = outer;
  return allocations.failed_bytes();
}

void kmpc_fork_call(void*, int32_t argc, Microtask fn, ...) {
  void* args[kMaxArgs] = {};
  va_list ap;
  va_start(ap, fn);
  for (int32_t i = 0; i < std::min(argc, kMaxArgs); ++i) args[i] = va_arg(ap, void*);
  va_end(ap);
  const int64_t work = t_next_work;
  t_next_work = std::numeric_limits<int64_t>::max();
  const int threads = cpu::num_threads();
  // A member whose allocation failed has returned early: the code that forked the region
  // finds the failure on its thread (kiln_rt_failed) and returns too.
  if (threads <= 1 || work < kParallelMinIterations) {
    if (size_t failed = run_member(fn, argc, args, Team{0, 1})) note_allocation_failure(failed);
    return;
  }
  g_parallel_runs.fetch_add(1, std::memory_order_relaxed);
  std::atomic<size_t> failed{0};
  cpu::parallel_for(0, threads, 1, [&](int64_t begin, int64_t end) {
    SerialGemmScope serial_gemm;  // the team members are the parallelism
    for (int64_t i = begin; i < end; ++i)
      if (size_t f = run_member(fn, argc, args, Team{static_cast<int32_t>(i), threads}))
        failed.store(f, std::memory_order_relaxed);
  });
  if (size_t f = failed.load()) note_allocation_failure(f);
}

template <class T>
void static_init(int32_t* last, T* lower, T* upper, T* stride) {
  using U = std::make_unsigned_t<T>;
  // The trip count in T's width (upper = lower - 1 is the empty loop in any width).
  const U trip = static_cast<U>(static_cast<U>(*upper) - static_cast<U>(*lower) + U{1});
  const uint64_t lo = static_cast<U>(*lower);
  StaticBlock b = static_block(lo, lo + uint64_t{trip} - 1, t_team.index, t_team.size);
  *lower = static_cast<T>(b.lower);
  *upper = static_cast<T>(b.upper);
  *stride = static_cast<T>(b.trip);
  *last = b.last;
}

// __kmpc_for_static_init_{4,4u,8,8u}: bounds of type T, increment and chunk of type S.
template <class T, class S>
void kmpc_for_static_init(void*, int32_t, int32_t, int32_t* last, T* lower, T* upper, T* stride,
                          S, S) {
  static_init(last, lower, upper, stride);
}
void kmpc_nothing(void*, int32_t) {}

}  // namespace

StaticBlock static_block(uint64_t lower, uint64_t upper, int32_t index, int32_t size) {
  const uint64_t trip = upper - lower + 1;  // 0: empty
  const uint64_t n = static_cast<uint64_t>(size), i = static_cast<uint64_t>(index);
  const uint64_t base = trip / n, extra = trip % n;
  const uint64_t begin = i * base + std::min(i, extra), count = base + (i < extra ? 1 : 0);
  return {lower + begin, lower + begin + count - 1, trip, count > 0 && begin + count == trip};
}

int64_t column_block(int64_t cols, int threads) {
  constexpr int64_t kVector = 16;
  const int64_t teams = std::max(threads, 1);
  const int64_t per_thread = (std::max<int64_t>(cols, 1) + teams - 1) / teams;
  return std::max<int64_t>((per_thread + kVector - 1) / kVector * kVector, kVector);
}

uint64_t parallel_loop_runs() { return g_parallel_runs.load(std::memory_order_relaxed); }

std::vector<RuntimeSymbol> omp_runtime_symbols() {
  return {
      {"kiln_rt_parallel_work", reinterpret_cast<void*>(&rt_parallel_work)},
      {"kiln_rt_column_block", reinterpret_cast<void*>(&rt_column_block)},
      {"__kmpc_global_thread_num", reinterpret_cast<void*>(&kmpc_global_thread_num)},
      {"__kmpc_fork_call", reinterpret_cast<void*>(&kmpc_fork_call)},
      {"__kmpc_for_static_init_8u",
       reinterpret_cast<void*>(&kmpc_for_static_init<uint64_t, int64_t>)},
      {"__kmpc_for_static_init_8",
       reinterpret_cast<void*>(&kmpc_for_static_init<int64_t, int64_t>)},
      {"__kmpc_for_static_init_4u",
       reinterpret_cast<void*>(&kmpc_for_static_init<uint32_t, int32_t>)},
      {"__kmpc_for_static_init_4",
       reinterpret_cast<void*>(&kmpc_for_static_init<int32_t, int32_t>)},
      {"__kmpc_for_static_fini", reinterpret_cast<void*>(&kmpc_nothing)},
      {"__kmpc_barrier", reinterpret_cast<void*>(&kmpc_nothing)},
  };
}

}  // namespace kiln::codegen
