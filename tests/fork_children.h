#pragma once
// forked_children_ok: fork() while other threads work, for tests of what a child inherits.
#include <chrono>
#include <functional>
#include <thread>

#include <sys/wait.h>
#include <unistd.h>

namespace kiln::testing {

/// Forks `n` children, `pause` apart, each running `child` (true: it worked) and exiting with
/// 0 or 1; a child still running after 20 s (a lock it inherited held) ends with SIGALRM.
/// Returns how many exited with 0.
inline int forked_children_ok(int n, std::chrono::milliseconds pause,
                              const std::function<bool()>& child) {
  int ok = 0;
  for (int i = 0; i < n; ++i) {
    std::this_thread::sleep_for(pause);
    pid_t pid = fork();
    if (pid == 0) {
      alarm(20);
      _exit(child() ? 0 : 1);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    ok += WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }
  return ok;
}

}  // namespace kiln::testing
