#pragma once
// limit_address_space: for tests that make allocations fail, in a child process (fork) only.
#include <sys/resource.h>

#include <cstdio>

namespace kiln::testing {

/// Limits this process's address space to its current size (VmSize) plus `extra_kib` KiB.
/// False when the size cannot be read or the limit set. Not under ASan/TSan, which reserve
/// far more address space than they use.
inline bool limit_address_space(long extra_kib) {
  long vm_kib = 0;
  std::FILE* f = std::fopen("/proc/self/status", "r");
  char line[256];
  while (f && std::fgets(line, sizeof line, f))
    if (std::sscanf(line, "VmSize: %ld kB", &vm_kib) == 1) break;
  if (f) std::fclose(f);
  rlimit limit{};
  limit.rlim_cur = limit.rlim_max = static_cast<rlim_t>(vm_kib + extra_kib) * 1024;
  return vm_kib > 0 && setrlimit(RLIMIT_AS, &limit) == 0;
}

}  // namespace kiln::testing
