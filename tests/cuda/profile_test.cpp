// KILN_CUDA_PROFILE (backends/cuda/profile.h) off, as in every test run: scopes record nothing
// and need no driver, and the report is empty. On a GPU, benchmarks/gpu/run_device_check.sh
// prints the profile of the Transformer step.
#include <catch2/catch.hpp>
#include <cstdlib>

#include "backends/cuda/profile.h"

using namespace kiln::cuda;

TEST_CASE("profile: off unless KILN_CUDA_PROFILE is set: nothing timed, empty report") {
  if (std::getenv("KILN_CUDA_PROFILE")) return;  // a profiled run of the tests
  CHECK_FALSE(profiling());
  profile_section("case eager");
  { ProfileScope timed("kernel", nullptr, 0); }
  profile_forget_module(nullptr);
  profile_name_kernel(nullptr, nullptr, "main_kernel");
  CHECK(profile_report().empty());
  reset_profile();
  CHECK(profile_report().empty());
}
