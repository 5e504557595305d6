#pragma once
// ptxas for the tests that check generated PTX without a GPU (gpu_ptx_test, gpu_ptx_ops_test,
// kiln-fuzz --ptx).
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace kiln::testing {

/// ptxas from $CUDA_HOME, $CUDA_PATH, /usr/local/cuda or PATH; "" when absent.
inline std::string find_ptxas() {
  for (const char* env : {"CUDA_HOME", "CUDA_PATH"})
    if (const char* d = std::getenv(env);
        d && *d && std::filesystem::exists(std::string(d) + "/bin/ptxas"))
      return std::string(d) + "/bin/ptxas";
  if (std::filesystem::exists("/usr/local/cuda/bin/ptxas")) return "/usr/local/cuda/bin/ptxas";
  return std::system("command -v ptxas > /dev/null 2>&1") == 0 ? "ptxas" : "";
}

/// Assembles `ptx` for sm_90 with `ptxas`: "" when it assembled to a non-empty cubin, else the
/// command, its exit status and output. Files are named per call (`name`, the pid and a count):
/// two processes or threads at once read each other's half-written files otherwise.
inline std::string ptxas_errors(const std::string& ptxas, const std::string& ptx,
                                const std::string& name) {
  auto dir = std::filesystem::temp_directory_path();
  static std::atomic<uint64_t> calls{0};
  const std::string stem = "kiln_" + name + "_" + std::to_string(::getpid()) + "_" +
                           std::to_string(calls++);
  const std::string in = (dir / (stem + ".ptx")).string();
  const std::string out = (dir / (stem + ".cubin")).string();
  std::ofstream(in) << ptx;
  const std::string cmd = ptxas + " -arch=sm_90 " + in + " -o " + out + " 2>&1";
  std::string log;
  int rc = -1;
  if (FILE* p = popen(cmd.c_str(), "r")) {
    char buf[512];
    while (fgets(buf, sizeof buf, p)) log += buf;
    rc = pclose(p);
  }
  std::error_code ec;
  const bool empty = !std::filesystem::exists(out, ec) || std::filesystem::file_size(out, ec) == 0;
  std::filesystem::remove(in, ec);
  std::filesystem::remove(out, ec);
  if (rc == 0 && !empty) return "";
  return cmd + ": exit status " + std::to_string(rc) + (empty ? ", no cubin" : "") + "\n" + log;
}

}  // namespace kiln::testing
