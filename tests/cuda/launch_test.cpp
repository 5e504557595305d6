// launch_config: 1-D grids for elementwise kernels.
#include <catch2/catch.hpp>

#include "backends/cuda/driver.h"
#include "backends/cuda/launch.h"

using namespace kiln::cuda;

TEST_CASE("launch_config: nothing to launch for n = 0") {
  LaunchConfig c = launch_config(0, 1024);
  CHECK_FALSE(c.needs_launch());
  CHECK(c.grid_x == 0);
  CHECK_FALSE(launch_config(-5, 1024).needs_launch());
}

TEST_CASE("launch_config: blocks of 256 and a ceil-divided grid") {
  LaunchConfig c = launch_config(1000, 1024);
  CHECK(c.block_x == 256);
  CHECK(c.grid_x == 4);
  CHECK(c.grid_y == 1);
  CHECK(c.grid_z == 1);
  CHECK(c.block_y == 1);
  CHECK_FALSE(c.grid_stride);
  CHECK(launch_config(256, 1024).grid_x == 1);
  CHECK(launch_config(257, 1024).grid_x == 2);
  CHECK(launch_config(1 << 20, 1024).grid_x == 4096);
}

TEST_CASE("launch_config: small n gets one warp-rounded block") {
  LaunchConfig c = launch_config(1, 1024);
  CHECK(c.block_x == 32);
  CHECK(c.grid_x == 1);
  CHECK(launch_config(33, 1024).block_x == 64);
  CHECK(launch_config(255, 1024).block_x == 256);
}

TEST_CASE("launch_config: the block is capped by the device's max threads per block") {
  LaunchConfig c = launch_config(1000, 128);
  CHECK(c.block_x == 128);
  CHECK(c.grid_x == 8);
  CHECK(launch_config(1000, 0).block_x == 1);  // a nonsensical limit still gives a valid block
  DeviceProps props;
  props.max_threads_per_block = 64;
  CHECK(launch_config(640, props).block_x == 64);
  CHECK(launch_config(640, props).grid_x == 10);
}

TEST_CASE("launch_config: the grid is capped at 2^31 - 1 and then needs a grid-stride loop") {
  int64_t n = int64_t{kMaxGridX} * 256 + 1;
  LaunchConfig c = launch_config(n, 1024);
  CHECK(c.grid_x == kMaxGridX);
  CHECK(c.block_x == 256);
  CHECK(c.grid_stride);
  LaunchConfig exact = launch_config(int64_t{kMaxGridX} * 256, 1024);
  CHECK(exact.grid_x == kMaxGridX);
  CHECK_FALSE(exact.grid_stride);
}
