// The table of runtime symbols (codegen/runtime.h). Each extern kernel adds its entry here.
#include "codegen/runtime.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "backends/cpu/allocator.h"
#include "backends/cpu/blas.h"
#include "backends/cpu/parallel.h"
#include "codegen/omp_runtime.h"

namespace kiln::codegen {
namespace {

// Buffers that compiled code allocates for intermediates (memref.alloc lowers to malloc/free)
// are reused: a fresh malloc of a few hundred KiB per call (one call per row block) would
// page-fault on every call. Each thread keeps its last few freed blocks; a 64-byte header in
// front of each block keeps its capacity. Larger or surplus blocks go to kiln's CPU allocator
// (itself caching from 1 MiB up).
//
// A failed allocation returns null; the code then returns early (codegen/alloc_checks.cpp),
// skipping the frees of the blocks it holds. So each thread links the blocks it hands out
// (newest first, numbered), and an AllocationFailureScope frees those numbered since it began.
// Compiled code frees a block on the thread that allocated it: a loop body run on the pool
// (an outlined parallel region) cannot pass a buffer out of it.
struct LiveBlocks;
struct Block {
  size_t capacity;  // bytes after the header
  uint64_t serial;  // the owner's allocation count when handed out
  LiveBlocks* owner;
  Block* prev;  // the owner's live blocks: newer
  Block* next;  // older
};
static_assert(sizeof(Block) <= kAlignment);
// All intermediates of a graph are live at once (deallocated at the end of the function): the
// MHA in-projection region has 14, the digits MLP's whole training step 47. With 8 slots the
// surplus went through malloc/mmap and page-faulted on every call (4.6 ms per call instead of
// 2.8 ms); with 32 the step's surplus went through glibc each call (about 1 us per step).
constexpr size_t kSlots = 128;
constexpr size_t kPage = 4096;
constexpr size_t kMaxCachedBlock = size_t{16} << 20;
// At most this many bytes stay cached per thread (128 blocks of 16 MiB would keep 2 GiB).
constexpr size_t kMaxCachedBytes = size_t{256} << 20;

struct ThreadCache {
  // The capacity is kept beside each pointer: the scan then reads one small array instead of
  // the header of every cached block (a cache line, often a TLB entry, each). The cached blocks
  // are slots[0, count): a free appends, a hit moves the last one into its place, so neither
  // scans empty slots (the digits step's 47 blocks cost about 1 us per call with gaps).
  struct Slot {
    void* block;
    size_t capacity;
  };
  Slot slots[kSlots];
  size_t count = 0;
  size_t bytes = 0;  // capacities of the cached blocks
  ~ThreadCache() {
    for (size_t i = 0; i < count; ++i)
      cpu::allocator()->deallocate(slots[i].block, slots[i].capacity + kAlignment);
  }
};
thread_local ThreadCache t_cache;
// The blocks a thread handed out, apart from ThreadCache: trivially destructible, so that an
// AllocationFailureScope around code that allocates nothing never makes glibc register a
// thread-local destructor (which aborts when memory has run out, break-it pass).
struct LiveBlocks {
  Block* live;          // handed out and not freed, newest first
  uint64_t serial;      // blocks handed out so far
  size_t failed_bytes;  // the size of an allocation that failed (kiln_rt_allocation_failed)
};
static_assert(std::is_trivially_destructible_v<LiveBlocks>);
thread_local LiveBlocks t_live{};
std::atomic<uint64_t> g_foreign_frees{0};

void link(LiveBlocks& c, Block* b) {
  b->serial = c.serial++;
  b->owner = &c;
  b->prev = nullptr;
  b->next = c.live;
  if (c.live) c.live->prev = b;
  c.live = b;
}

void unlink(LiveBlocks& c, Block* b) {
  (b->prev ? b->prev->next : c.live) = b->next;
  if (b->next) b->next->prev = b->prev;
}

std::atomic<int64_t> g_fail_countdown{-1};  // fail_intermediate_allocation_for_testing

void* rt_malloc(size_t nbytes) {
  if (g_fail_countdown.load(std::memory_order_relaxed) >= 0 &&
      g_fail_countdown.fetch_sub(1, std::memory_order_relaxed) == 0)
    return nullptr;
  size_t capacity = (nbytes + kPage - 1) / kPage * kPage;
  ThreadCache& c = t_cache;
  for (size_t i = 0; i < c.count; ++i) {
    if (c.slots[i].capacity == capacity) {
      auto* hit = static_cast<Block*>(c.slots[i].block);
      c.slots[i] = c.slots[--c.count];
      c.bytes -= capacity;
      link(t_live, hit);
      return reinterpret_cast<char*>(hit) + kAlignment;
    }
  }
  void* base;
  try {
    base = cpu::allocator()->allocate(capacity + kAlignment);
  } catch (...) {  // no exceptions through JIT-compiled frames: the code tests for null
    return nullptr;
  }
  auto* block = static_cast<Block*>(base);
  block->capacity = capacity;
  link(t_live, block);
  return static_cast<char*>(base) + kAlignment;
}

// Caches the block or gives it back to kiln's allocator; it is no longer linked.
void release(ThreadCache& c, Block* block) {
  const size_t capacity = block->capacity;
  if (capacity > kMaxCachedBlock || c.bytes + capacity > kMaxCachedBytes) {
    cpu::allocator()->deallocate(block, capacity + kAlignment);
    return;
  }
  if (c.count == kSlots) {  // full: evict the oldest-placed slot
    ThreadCache::Slot evicted = c.slots[0];
    c.slots[0] = c.slots[--c.count];
    c.bytes -= evicted.capacity;
    cpu::allocator()->deallocate(evicted.block, evicted.capacity + kAlignment);
  }
  c.slots[c.count++] = {block, capacity};
  c.bytes += capacity;
}

void rt_free(void* ptr) {
  if (!ptr) return;
  auto* block = reinterpret_cast<Block*>(static_cast<char*>(ptr) - kAlignment);
  if (block->owner != &t_live) {
    // Not expected (see Block): the owner's list cannot be changed from here, so the block
    // stays linked there, unused, and foreign_block_frees() counts it.
    g_foreign_frees.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  unlink(t_live, block);
  release(t_cache, block);
}

void* rt_aligned_alloc(size_t alignment, size_t nbytes) {
  return alignment <= kAlignment ? rt_malloc(nbytes) : nullptr;
}

// Compiled code calls this when an allocation returned null, then returns (alloc_checks.cpp).
void rt_allocation_failed(int64_t nbytes) {
  LiveBlocks& c = t_live;
  if (!c.failed_bytes) c.failed_bytes = static_cast<size_t>(std::max<int64_t>(nbytes, 1));
}

// Compiled code calls this after a call that may have failed (a parallel region, a function
// of its own that allocates) and returns when it is true.
bool rt_failed() { return t_live.failed_bytes != 0; }

/// C[i] = op(A[i]) · op(B[i]) + beta · C[i] for i < batch (beta 0 or 1; op(X) = Xᵀ when trans_x
/// is 1, BLAS conventions: lda/ldb are the stored matrices' row strides; rows_split 1 when C's
/// rows are a row block of the run, GemmRunScope), row-major with
/// unit-stride rows; the calling convention of codegen/extern_calls.cpp: every argument an int64_t
/// (pointers as integers, offsets in elements). float goes through cpu::sgemm (oneDNN), falling
/// back to kiln's gemm when oneDNN rejects the leading dims.
std::atomic<uint64_t> g_gemm_calls{0};
thread_local bool t_serial_gemm = false;  // SerialGemmScope
struct GemmRun {  // GemmRunScope
  bool set = false;
  MatmulPrecision precision = MatmulPrecision::Highest;
  double rows_factor = 1;
};
thread_local GemmRun t_gemm_run;

template <class T>
void gemm_batched(int64_t batch, int64_t m, int64_t n, int64_t k, int64_t a, int64_t off_a,
                  int64_t batch_a, int64_t lda, int64_t b, int64_t off_b, int64_t batch_b,
                  int64_t ldb, int64_t c, int64_t off_c, int64_t batch_c, int64_t ldc,
                  int64_t rows_split, int64_t beta, int64_t trans_a, int64_t trans_b) {
  g_gemm_calls.fetch_add(1, std::memory_order_relaxed);
  cpu::GemmTimer timer;
  if (m == 0 || n == 0) return;
  // As eager matmul does (backends/cpu/matmul.cpp): a batch of small products (attention's
  // per-head products) is spread over kiln's pool one product per thread; a single or large
  // product is split by cpu::sgemm itself.
  const bool small = 2.0 * double(m) * double(n) * double(k) < cpu::kSpreadGemmBatchMaxFlops;
  // float32: the op's rounding, decided once for all its products and row blocks
  // (GemmRunScope), from the rows that share one B, as eager matmul does (cpu::gemm_rounding);
  // rows_split (extern_calls.cpp) says whether those rows are a block's of a row-split run.
  cpu::GemmRounding rounding = cpu::GemmRounding::None;
  if constexpr (std::is_same_v<T, float>) {
    const GemmRun run = t_gemm_run;
    const double rows_per_b = double(m) * double(batch_b == 0 ? batch : 1) *
                              (run.set && rows_split ? run.rows_factor : 1.0);
    rounding = cpu::gemm_rounding(gemm_run_precision(), rows_per_b, double(n), double(k));
  }
  // Small products (cpu::small_gemm_fits), as eager matmul: kiln's small-matrix kernel, the
  // batch in chunks of at least kSmallGemmGrainFlops on the pool, each product on one thread.
  if (cpu::small_gemm_fits(m, n, k) && rounding == cpu::GemmRounding::None) {
    const T* pa = reinterpret_cast<const T*>(a) + off_a;
    const T* pb = reinterpret_cast<const T*>(b) + off_b;
    T* pc = reinterpret_cast<T*>(c) + off_c;
    auto chunk = [&](int64_t lo, int64_t hi) {
      // op(A)[i, p] = A[i·lda + p], or A[p·lda + i] transposed; op(B) likewise.
      cpu::small_gemm_batch<T>(hi - lo, m, n, k, T(1), pa + lo * batch_a, batch_a,
                               trans_a ? 1 : lda, trans_a ? lda : 1, pb + lo * batch_b, batch_b,
                               trans_b ? 1 : ldb, trans_b ? ldb : 1, T(beta), pc + lo * batch_c,
                               batch_c, ldc);
    };
    if (batch > 1 && !t_serial_gemm)
      cpu::parallel_for(0, batch, cpu::small_gemm_grain(m, n, k), chunk);
    else
      chunk(0, batch);
    return;
  }
  auto product = [&](int64_t i, bool serial) {
    const T* pa = reinterpret_cast<const T*>(a) + off_a + i * batch_a;
    const T* pb = reinterpret_cast<const T*>(b) + off_b + i * batch_b;
    T* pc = reinterpret_cast<T*>(c) + off_c + i * batch_c;
    if (k == 0) {  // an empty sum: C = beta · C
      if (beta == 0)
        for (int64_t r = 0; r < m; ++r) std::fill_n(pc + r * ldc, n, T(0));
      return;
    }
    if constexpr (std::is_same_v<T, float>)
      if (cpu::sgemm(trans_a != 0, trans_b != 0, m, n, k, 1.f, pa, lda, pb, ldb, float(beta), pc,
                     ldc, serial ? 1 : 0, rounding))
        return;
    // op(A)[i, p] = A[i·lda + p], or A[p·lda + i] transposed; op(B) likewise.
    cpu::gemm<T>(m, n, k, T(1), pa, trans_a ? 1 : lda, trans_a ? lda : 1, pb, trans_b ? 1 : ldb,
                 trans_b ? ldb : 1, T(beta), pc, ldc);
  };
  if (small && batch > 1 && !t_serial_gemm) {
    const int64_t grain = std::max<int64_t>(
        1, int64_t(cpu::kSpreadGemmBatchMaxFlops / 2 / (2.0 * double(m) * double(n) * double(k))));
    cpu::parallel_for(0, batch, grain, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) product(i, true);
    });
    return;
  }
  for (int64_t i = 0; i < batch; ++i) product(i, t_serial_gemm);
}

}  // namespace

MatmulPrecision gemm_run_precision() {
  return t_gemm_run.set ? t_gemm_run.precision : float32_matmul_precision();
}

GemmRunScope::GemmRunScope(MatmulPrecision precision, double rows_factor)
    : previous_precision_(t_gemm_run.precision),
      previous_factor_(t_gemm_run.rows_factor),
      previous_set_(t_gemm_run.set) {
  t_gemm_run = {true, precision, rows_factor};
}
GemmRunScope::~GemmRunScope() {
  t_gemm_run = {previous_set_, previous_precision_, previous_factor_};
}

SerialGemmScope::SerialGemmScope() : previous_(t_serial_gemm) { t_serial_gemm = true; }
SerialGemmScope::~SerialGemmScope() { t_serial_gemm = previous_; }

namespace {
// Kernel timers: top-level kernels of a graph's code never nest, so one start time a thread.
thread_local KernelCounter* t_kernel_counters = nullptr;
thread_local std::chrono::steady_clock::time_point t_kernel_start;

void rt_kernel_begin(int64_t) { t_kernel_start = std::chrono::steady_clock::now(); }

void rt_kernel_end(int64_t id) {
  if (!t_kernel_counters) return;
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                      std::chrono::steady_clock::now() - t_kernel_start)
                      .count();
  t_kernel_counters[id].ns.fetch_add(ns, std::memory_order_relaxed);
  t_kernel_counters[id].calls.fetch_add(1, std::memory_order_relaxed);
}
}  // namespace

KernelProfileScope::KernelProfileScope(KernelCounter* counters) : previous_(t_kernel_counters) {
  t_kernel_counters = counters;
}
KernelProfileScope::~KernelProfileScope() { t_kernel_counters = previous_; }

AllocationFailureScope::AllocationFailureScope() : first_serial_(t_live.serial) {}

AllocationFailureScope::~AllocationFailureScope() {
  LiveBlocks& c = t_live;
  if (!c.failed_bytes) return;
  // Only blocks of this scope's code: they are the newest, at the front of the list.
  while (c.live && c.live->serial >= first_serial_) {
    Block* b = c.live;
    unlink(c, b);
    release(t_cache, b);
  }
  c.failed_bytes = 0;
}

size_t AllocationFailureScope::failed_bytes() const { return t_live.failed_bytes; }

void note_allocation_failure(size_t nbytes) { rt_allocation_failed(static_cast<int64_t>(nbytes)); }

void fail_intermediate_allocation_for_testing(int64_t n) { g_fail_countdown.store(n); }

uint64_t intermediate_allocations_on_this_thread() { return t_live.serial; }

size_t live_intermediate_blocks_on_this_thread() {
  size_t n = 0;
  for (const Block* b = t_live.live; b; b = b->next) ++n;
  return n;
}

uint64_t foreign_block_frees() { return g_foreign_frees.load(std::memory_order_relaxed); }

uint64_t gemm_calls() { return g_gemm_calls.load(std::memory_order_relaxed); }

const std::vector<RuntimeSymbol>& runtime_symbols() {
  static const std::vector<RuntimeSymbol> symbols = [] {
    std::vector<RuntimeSymbol> s = {
        {"malloc", reinterpret_cast<void*>(&rt_malloc)},
        {"free", reinterpret_cast<void*>(&rt_free)},
        {"aligned_alloc", reinterpret_cast<void*>(&rt_aligned_alloc)},
        {"kiln_rt_allocation_failed", reinterpret_cast<void*>(&rt_allocation_failed)},
        {"kiln_rt_failed", reinterpret_cast<void*>(&rt_failed)},
        {"kiln_rt_gemm_f32", reinterpret_cast<void*>(&gemm_batched<float>)},
        {"kiln_rt_gemm_f64", reinterpret_cast<void*>(&gemm_batched<double>)},
        {"kiln_rt_kernel_begin", reinterpret_cast<void*>(&rt_kernel_begin)},
        {"kiln_rt_kernel_end", reinterpret_cast<void*>(&rt_kernel_end)},
    };
    for (const RuntimeSymbol& r : omp_runtime_symbols()) s.push_back(r);
    for (const RuntimeSymbol& r : cuda_runtime_symbols()) s.push_back(r);
    return s;
  }();
  return symbols;
}

}  // namespace kiln::codegen
