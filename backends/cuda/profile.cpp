#include "backends/cuda/profile.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>

#include "core/env.h"

namespace kiln::cuda {
namespace {

/// Timed ranges kept before their events are read (each read waits for the range's end).
constexpr size_t kMaxPending = 4096;

struct Range {
  int name;
  int device;
  CUevent start, end;
};

struct Profile {
  std::mutex mutex;
  bool failed = false;
  std::string section;  // profile_section()
  std::vector<std::string> sections, names;  // per name id: its section, its name
  std::unordered_map<std::string, int> ids;  // by section + '\n' + name
  std::vector<double> total_ms;
  std::vector<int64_t> calls;
  uint64_t next_id = 1;
  std::unordered_map<uint64_t, Range> open;  // by ProfileScope id
  std::vector<Range> ended;
  std::unordered_map<int, std::vector<CUevent>> spare;  // by device (events of its context)
  std::unordered_map<CUfunction, std::string> kernels;
  std::unordered_map<CUmodule, int> modules;
  int next_module = 0;
  KernelDescriptions descriptions;
};

Profile& profile() {
  static Profile* p = new Profile;  // never destroyed: launches may happen at exit
  return *p;
}

// Stops profiling after a failed event call, with one message. Caller holds the mutex.
bool failed_call(Profile& p, CUresult r, const char* what) {
  if (r == kCudaSuccess) return false;
  if (!p.failed)
    std::fprintf(stderr, "kiln: KILN_CUDA_PROFILE: %s failed (%s); profiling stops\n", what,
                 error_text(r).c_str());
  p.failed = true;
  return true;
}

// Reads the events of every ended range into the totals and keeps the events for reuse.
// Caller holds the mutex.
void collect(Profile& p) {
  if (p.ended.empty()) return;  // (without a driver, nothing was timed)
  const DriverApi& api = driver("KILN_CUDA_PROFILE");
  for (const Range& r : p.ended) {
    float ms = 0;
    if (!p.failed && !failed_call(p, api.cuEventSynchronize(r.end), "cuEventSynchronize") &&
        !failed_call(p, api.cuEventElapsedTime(&ms, r.start, r.end), "cuEventElapsedTime")) {
      p.total_ms[r.name] += ms;
      ++p.calls[r.name];
    }
    p.spare[r.device].push_back(r.start);
    p.spare[r.device].push_back(r.end);
  }
  p.ended.clear();
}

size_t text_hash(std::string_view text) {
  while (!text.empty() && text.back() == '\0') text.remove_suffix(1);
  return std::hash<std::string_view>()(text);
}

}  // namespace

void KernelDescriptions::add(std::string_view ptx,
                             const std::vector<std::pair<std::string, std::string>>& kernels) {
  auto& named = by_text_[text_hash(ptx)];
  for (const auto& [kernel, description] : kernels) named[kernel] = description;
}

void KernelDescriptions::loaded(CUmodule m, const void* data, size_t size) {
  if (!data) return;
  modules_[m] = text_hash(std::string_view(static_cast<const char*>(data), size));
}

void KernelDescriptions::unloaded(CUmodule m) { modules_.erase(m); }

std::string KernelDescriptions::describe(CUmodule m, std::string_view kernel) const {
  auto module = modules_.find(m);
  if (module == modules_.end()) return "";
  auto text = by_text_.find(module->second);
  if (text == by_text_.end()) return "";
  auto it = text->second.find(std::string(kernel));
  return it == text->second.end() ? "" : it->second;
}

void profile_describe_kernels(
    std::string_view ptx,
    const std::vector<std::pair<std::string, std::string>>& kernels) noexcept {
  if (!profiling()) return;
  try {
    Profile& p = profile();
    std::lock_guard lock(p.mutex);
    p.descriptions.add(ptx, kernels);
  } catch (...) {
  }
}

void profile_module_loaded(CUmodule m, const void* data, size_t size) noexcept {
  if (!profiling()) return;
  try {
    Profile& p = profile();
    std::lock_guard lock(p.mutex);
    p.descriptions.loaded(m, data, size);
  } catch (...) {
  }
}

bool profiling() noexcept {
  static const bool on = env_flag("KILN_CUDA_PROFILE");
  return on;
}

ProfileScope::ProfileScope(std::string_view name, CUstream stream, int device) noexcept
    : stream_(stream), uncaught_(std::uncaught_exceptions()) {
  if (!profiling()) return;
  try {
    Profile& p = profile();
    std::lock_guard lock(p.mutex);
    if (p.failed) return;
    const DriverApi& api = driver("KILN_CUDA_PROFILE");
    auto [it, fresh] = p.ids.try_emplace(p.section + '\n' + std::string(name),
                                         static_cast<int>(p.names.size()));
    if (fresh) {
      p.sections.push_back(p.section);
      p.names.emplace_back(name);
      p.total_ms.push_back(0);
      p.calls.push_back(0);
    }
    CUevent e[2];
    std::vector<CUevent>& spare = p.spare[device];
    for (CUevent& x : e) {
      if (!spare.empty()) {
        x = spare.back();
        spare.pop_back();
      } else if (failed_call(p, api.cuEventCreate(&x, 0), "cuEventCreate")) {  // timed events
        return;
      }
    }
    if (failed_call(p, api.cuEventRecord(e[0], stream), "cuEventRecord")) return;
    id_ = p.next_id++;
    p.open[id_] = {it->second, device, e[0], e[1]};
  } catch (...) {
    id_ = 0;
  }
}

ProfileScope::~ProfileScope() {
  if (id_ == 0) return;
  try {
    Profile& p = profile();
    std::lock_guard lock(p.mutex);
    auto it = p.open.find(id_);
    if (p.failed || it == p.open.end()) return;
    Range r = it->second;
    p.open.erase(it);
    if (std::uncaught_exceptions() > uncaught_) {  // the launch failed: nothing ran
      p.spare[r.device].push_back(r.start);
      p.spare[r.device].push_back(r.end);
      return;
    }
    if (failed_call(p, driver("KILN_CUDA_PROFILE").cuEventRecord(r.end, stream_),
                    "cuEventRecord"))
      return;
    p.ended.push_back(r);
    if (p.ended.size() >= kMaxPending) collect(p);
  } catch (...) {
  }
}

void profile_name_kernel(CUfunction f, CUmodule m, std::string_view kernel) noexcept {
  if (!profiling()) return;
  try {
    Profile& p = profile();
    std::lock_guard lock(p.mutex);
    auto [it, fresh] = p.modules.try_emplace(m, p.next_module);
    if (fresh) ++p.next_module;
    const std::string ops = p.descriptions.describe(m, kernel);
    p.kernels[f] =
        fmt::format("{} of module {}{}", kernel, it->second, ops.empty() ? "" : ": " + ops);
  } catch (...) {
  }
}

void profile_forget_module(CUmodule m) noexcept {
  if (!profiling()) return;
  Profile& p = profile();
  std::lock_guard lock(p.mutex);
  p.modules.erase(m);  // a handle reused by a later load is a new module
  p.descriptions.unloaded(m);
}

std::string profile_kernel_name(CUfunction f, int64_t grid, int64_t block) {
  Profile& p = profile();
  std::lock_guard lock(p.mutex);
  auto it = p.kernels.find(f);
  return fmt::format("{} (grid {}, block {})", it == p.kernels.end() ? "kernel" : it->second,
                     grid, block);
}

void profile_section(std::string_view section) {
  if (!profiling()) return;
  Profile& p = profile();
  std::lock_guard lock(p.mutex);
  p.section = section;
}

std::string profile_report(int top) {
  if (!profiling()) return "";
  Profile& p = profile();
  std::lock_guard lock(p.mutex);
  collect(p);  // ranges still open (another thread's call) count in a later report
  std::vector<std::string> sections;
  for (const std::string& s : p.sections)
    if (std::find(sections.begin(), sections.end(), s) == sections.end()) sections.push_back(s);
  std::string out;
  for (const std::string& section : sections) {
    std::vector<int> order;
    double all = 0, gemm = 0;
    int64_t gemm_calls = 0, launches = 0;
    for (int i = 0; i < static_cast<int>(p.names.size()); ++i) {
      if (p.calls[i] == 0 || p.sections[i] != section) continue;
      order.push_back(i);
      all += p.total_ms[i];
      if (p.names[i].starts_with("cuBLAS")) {
        gemm += p.total_ms[i];
        gemm_calls += p.calls[i];
      } else {
        launches += p.calls[i];
      }
    }
    if (order.empty()) continue;
    std::sort(order.begin(), order.end(),
              [&](int a, int b) { return p.total_ms[a] > p.total_ms[b]; });
    out += fmt::format("GPU time by kernel{} (KILN_CUDA_PROFILE, CUDA events):\n"
                       "{:>11} {:>8} {:>11} {:>6}  name\n",
                       section.empty() ? "" : ", " + section, "total ms", "calls", "avg us", "%");
    for (size_t k = 0; k < order.size() && static_cast<int>(k) < top; ++k) {
      int i = order[k];
      out += fmt::format("{:>11.3f} {:>8} {:>11.1f} {:>6.1f}  {}\n", p.total_ms[i], p.calls[i],
                         1e3 * p.total_ms[i] / p.calls[i],
                         all > 0 ? 100 * p.total_ms[i] / all : 0.0, p.names[i]);
    }
    out += fmt::format("generated kernels: {:.3f} ms in {} launches; cuBLAS: {:.3f} ms in {} "
                       "calls; all: {:.3f} ms\n",
                       all - gemm, launches, gemm, gemm_calls, all);
  }
  return out;
}

void reset_profile() {
  if (!profiling()) return;
  Profile& p = profile();
  std::lock_guard lock(p.mutex);
  collect(p);
  std::fill(p.total_ms.begin(), p.total_ms.end(), 0.0);
  std::fill(p.calls.begin(), p.calls.end(), 0);
}

}  // namespace kiln::cuda
