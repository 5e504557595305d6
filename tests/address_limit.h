#pragma once
// limit_address_space: for tests that make allocations fail, in a child process (fork) only.
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

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

/// Takes the memory glibc's heap holds free (1 MiB blocks until malloc fails), then gives
/// `give_back_mib` MiB back for error strings: under an address-space limit such memory served
/// allocations a test meant to fail. The caller frees the blocks returned, or exits.
inline std::vector<void*> hold_free_heap(int give_back_mib = 8) {
  std::vector<void*> held;
  for (void* p; (p = std::malloc(size_t{1} << 20)) != nullptr;) held.push_back(p);
  for (int i = 0; i < give_back_mib && !held.empty(); ++i) {
    std::free(held.back());
    held.pop_back();
  }
  return held;
}

/// Runs `body` in a forked child, which ends with `_exit(body())`; returns the child's wait
/// status (-1 when fork failed). Address-space limits set there are the child's own.
inline int status_of_child(const std::function<int()>& body) {
  const pid_t child = ::fork();
  if (child < 0) return -1;
  if (child == 0) _exit(body());
  int status = 0;
  return ::waitpid(child, &status, 0) == child ? status : -1;
}

}  // namespace kiln::testing
