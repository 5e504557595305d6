#pragma once
/// Process-wide settings of the CPU backend, as torch.set_num_threads and
/// torch.set_flush_denormal are in PyTorch.

#include "core/error.h"
#include "core/precision.h"

namespace kiln {

/// Threads that eager CPU kernels and compiled loops use (default: the hardware threads, or
/// KILN_NUM_THREADS). `n` above 256 is taken as 256; `n` < 1 throws kiln::Error, as PyTorch's
/// "set_num_threads expects a positive integer". Not to be called while another thread is
/// running kiln ops.
void set_num_threads(int n, Loc loc = Loc::current());
/// The number of threads set by set_num_threads (or the default).
int get_num_threads();

/// Flushes denormal float32/float64 values to zero, as inputs and as results (x86 FTZ and DAZ),
/// for ops called from this thread, eager and compiled; the kernels' worker threads follow the
/// calling thread. Denormals (|x| < 1.18e-38 in float32) can make arithmetic 10-100x slower,
/// e.g. in optimizer moments that decay towards zero. Results change only where a value is
/// denormal. Returns true where supported (every x86-64 CPU), like torch.set_flush_denormal.
bool set_flush_denormal(bool on);

}  // namespace kiln
