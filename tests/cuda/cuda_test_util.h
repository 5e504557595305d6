#pragma once
// Helpers shared by the CUDA tests.
#include <string>

#include "backends/cuda/driver.h"

namespace kiln::test {

/// Replaces the process-wide CUDA driver with the library at `path` for the scope, and puts
/// the default one (env KILN_CUDA_DRIVER or libcuda.so.1) back at the end.
class ScopedDriver {
 public:
  explicit ScopedDriver(const std::string& path) : status(cuda::load_driver_for_testing(path)) {}
  ~ScopedDriver() { cuda::load_driver_for_testing(""); }
  ScopedDriver(const ScopedDriver&) = delete;
  ScopedDriver& operator=(const ScopedDriver&) = delete;
  cuda::DriverStatus status;
};

/// True when a real device is usable; otherwise WARNs "skipped: no CUDA device (reason)".
#define KILN_REQUIRE_CUDA_OR_SKIP()                                                    \
  do {                                                                                 \
    if (!::kiln::cuda::is_available()) {                                               \
      WARN("skipped: no CUDA device (" << ::kiln::cuda::unavailable_reason() << ")");  \
      return;                                                                          \
    }                                                                                  \
  } while (0)

}  // namespace kiln::test
