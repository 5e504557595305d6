#pragma once
/// KILN_CUDA_PROFILE=1: the GPU time of every generated kernel's launch and every cuBLAS GEMM
/// on kiln's streams, measured with CUDA events around each and summed by name: where a
/// training step's device time goes (GEMMs against fused kernels, and which kernels), without
/// an external profiler. The events add a few microseconds of host time per launch, and every
/// 4,096 timed calls the profiler waits for them (a report waits too); off by default.
///
/// Kernel names are "<kernel> of module <n>: <graph ops> (<source lines>) (grid X, block Y)",
/// modules numbered in load order, the ops and lines where the graph's code registered them
/// (KernelDescriptions); GEMMs "cuBLAS sgemm m x n x k (batch b)". The report is a table
/// sorted by total time (ms, calls, average us, share of the profiled time).
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "backends/cuda/driver.h"

namespace kiln::cuda {

/// Whether KILN_CUDA_PROFILE is set to a value other than "0" (read once).
bool profiling() noexcept;

/// Times the device work queued on `stream` (of device `device`, whose context is current)
/// between construction and destruction under `name` (when profiling(); otherwise does
/// nothing). A scope left by an exception (a failed launch) counts nothing. Never throws: a
/// failed event call turns profiling off with one message on stderr.
class ProfileScope {
 public:
  ProfileScope(std::string_view name, CUstream stream, int device) noexcept;
  ~ProfileScope();
  ProfileScope(const ProfileScope&) = delete;
  ProfileScope& operator=(const ProfileScope&) = delete;

 private:
  uint64_t id_ = 0;  // 0: not timed
  CUstream stream_ = nullptr;
  int uncaught_ = 0;  // std::uncaught_exceptions() at construction
};

/// What the kernels of compiled graphs compute, for the profile's kernel names: codegen
/// registers each PTX text's kernels with their graph ops and source lines (codegen::
/// Executable, with kernel timers on), and a module loaded from that text gets them.
class KernelDescriptions {
 public:
  /// `kernels`: (kernel name, description) pairs of the module whose PTX is `ptx`.
  void add(std::string_view ptx, const std::vector<std::pair<std::string, std::string>>& kernels);
  /// Module `m` was loaded from the `size` bytes at `data` (trailing NULs ignored).
  void loaded(CUmodule m, const void* data, size_t size);
  void unloaded(CUmodule m);
  /// The description of kernel `kernel` of module `m`, or "".
  std::string describe(CUmodule m, std::string_view kernel) const;

 private:
  // By a hash of the PTX text: kernel name -> description.
  std::unordered_map<size_t, std::unordered_map<std::string, std::string>> by_text_;
  std::unordered_map<CUmodule, size_t> modules_;
};

/// Registers a PTX text's kernel descriptions (KernelDescriptions::add) when profiling().
void profile_describe_kernels(
    std::string_view ptx,
    const std::vector<std::pair<std::string, std::string>>& kernels) noexcept;
/// Notes which PTX text module `m` was loaded from (mgpuModuleLoadJIT, the `size` bytes at
/// `data`), when profiling().
void profile_module_loaded(CUmodule m, const void* data, size_t size) noexcept;

/// Names a loaded module's kernel for the profile (mlir_runtime.cpp calls it on
/// mgpuModuleGetFunction), and numbers modules in load order.
void profile_name_kernel(CUfunction f, CUmodule m, std::string_view kernel) noexcept;
/// Forgets an unloaded module's number (mgpuModuleUnload).
void profile_forget_module(CUmodule m) noexcept;
/// The profile name of kernel `f` launched with these sizes.
std::string profile_kernel_name(CUfunction f, int64_t grid, int64_t block);

/// Sums what is timed from now on under `section` (a benchmark case and mode, say), apart
/// from other sections' sums.
void profile_section(std::string_view section);
/// Waits for the timed work and returns, per section, the table of everything timed since
/// the last reset (the `top` names of most time, then totals for generated kernels, cuBLAS
/// and all); "" when not profiling or nothing was timed.
std::string profile_report(int top = 25);
/// Forgets what was timed so far (after a warm-up, say).
void reset_profile();

}  // namespace kiln::cuda
