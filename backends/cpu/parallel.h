#pragma once
/// A small thread pool for the CPU kernels. It never spins for long: on 2-vCPU machines a
/// spinning pool made 2 threads slower than 1 (notes/cpu-performance.md), so an idle worker
/// waits at most 50 us for the next parallel region (back-to-back eager ops and compiled loops
/// then skip the ~10 us futex wake-up) and then sleeps on a condition variable. Chunks are
/// claimed by whichever thread is free, so a worker that is slow to wake leaves its chunk to
/// the caller instead of holding the region up.
#include <cstdint>
#include <functional>

namespace kiln::cpu {

/// Elements below which a loop runs on the calling thread (no threading cost).
inline constexpr int64_t kGrainSize = 32768;

/// The most threads kernels use: more only oversubscribe the machine (and can exhaust
/// thread limits).
inline constexpr int kMaxThreads = 256;

/// Number of threads kernels use (default: hardware threads; KILN_NUM_THREADS overrides, up to
/// kMaxThreads, with a warning above it).
int num_threads();
/// Sets the number of threads, clamped to [1, kMaxThreads]. Not to be called while another
/// thread is running kiln ops.
void set_num_threads(int n);

/// Flush-to-zero and denormals-are-zero for float math on the calling thread (x86 MXCSR);
/// parallel_for's workers follow the caller's setting. Returns true (supported).
bool set_flush_denormal(bool on);

/// Runs fn(begin, end) over [begin, end) split into at most num_threads() contiguous chunks of
/// at least `grain` iterations; runs inline when the range is smaller than 2 * grain or when
/// called from inside another parallel_for. fn must not throw. Every chunk runs with the
/// caller's floating-point controls (flush-to-zero, rounding).
void parallel_for(int64_t begin, int64_t end, int64_t grain,
                  const std::function<void(int64_t, int64_t)>& fn);

/// Whether the calling thread is running a chunk of a parallel_for (or is a pool worker).
bool in_parallel_region();

}  // namespace kiln::cpu
