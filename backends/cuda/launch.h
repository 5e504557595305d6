#pragma once
/// Launch geometry for 1-D elementwise kernels (pure logic; no driver needed).
#include <cstdint>

namespace kiln::cuda {

struct DeviceProps;

/// Grid and block dimensions of one kernel launch (cuLaunchKernel's arguments).
struct LaunchConfig {
  uint32_t grid_x = 0, grid_y = 1, grid_z = 1;
  uint32_t block_x = 0, block_y = 1, block_z = 1;
  uint32_t shared_bytes = 0;
  /// False when there is nothing to do (n == 0): the caller must not launch.
  bool needs_launch() const { return grid_x > 0 && block_x > 0; }
  /// True when grid_x * block_x < n: the kernel must loop with a grid-stride
  /// (i += gridDim.x * blockDim.x) to cover every item.
  bool grid_stride = false;
};

inline constexpr uint32_t kDefaultBlockSize = 256;
/// cuLaunchKernel's limit on gridDim.x (2^31 - 1).
inline constexpr uint32_t kMaxGridX = 2147483647u;

/// A 1-D configuration for `n` independent work items: block = min(256, max_threads_per_block),
/// grid = ceil(n / block) capped at 2^31 - 1 (then `grid_stride` is set). n <= 0 gives an
/// empty configuration (needs_launch() false).
LaunchConfig launch_config(int64_t n, const DeviceProps& props);
/// The same from the device limit alone (for tests and callers without DeviceProps).
LaunchConfig launch_config(int64_t n, int max_threads_per_block);

}  // namespace kiln::cuda
