#include "backends/cuda/launch.h"

#include <algorithm>

#include "backends/cuda/driver.h"

namespace kiln::cuda {

LaunchConfig launch_config(int64_t n, int max_threads_per_block) {
  LaunchConfig config;
  if (n <= 0) return config;
  // A device reporting nothing sensible still gets a valid (small) block.
  uint32_t limit = max_threads_per_block > 0 ? static_cast<uint32_t>(max_threads_per_block) : 1;
  uint32_t block = std::min(kDefaultBlockSize, limit);
  // Few items: one block just large enough (rounded to a warp) wastes no threads.
  if (static_cast<uint64_t>(n) < block) {
    uint32_t warp_rounded = static_cast<uint32_t>((n + 31) / 32 * 32);
    block = std::min(block, warp_rounded);
  }
  uint64_t blocks = (static_cast<uint64_t>(n) + block - 1) / block;
  config.block_x = block;
  config.grid_x = static_cast<uint32_t>(std::min<uint64_t>(blocks, kMaxGridX));
  config.grid_stride = blocks > kMaxGridX;
  return config;
}

LaunchConfig launch_config(int64_t n, const DeviceProps& props) {
  return launch_config(n, props.max_threads_per_block);
}

}  // namespace kiln::cuda
