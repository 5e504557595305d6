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

TEST_CASE("profile: kernels of a module loaded from registered PTX get their descriptions") {
  KernelDescriptions d;
  const std::string ptx = ".version 8.0\n.entry main_kernel()\n.entry main_kernel_0()\n";
  d.add(ptx, {{"main_kernel", "softmax (model.cpp:12)"}, {"main_kernel_0", "mul, add"}});
  // Handles are opaque to the table: any distinct pointers stand for modules here.
  int a = 0, b = 0, c = 0;
  auto module = [](int& x) { return reinterpret_cast<CUmodule>(&x); };
  // The loaded blob is the text with its NUL terminator (what gpu-to-llvm embeds).
  d.loaded(module(a), ptx.c_str(), ptx.size() + 1);
  d.loaded(module(b), ptx.data(), ptx.size());
  const std::string other = ptx + "// another graph\n";
  d.loaded(module(c), other.data(), other.size());
  CHECK(d.describe(module(a), "main_kernel") == "softmax (model.cpp:12)");
  CHECK(d.describe(module(a), "main_kernel_0") == "mul, add");
  CHECK(d.describe(module(b), "main_kernel_0") == "mul, add");
  CHECK(d.describe(module(a), "main_kernel_1").empty());  // no such kernel
  CHECK(d.describe(module(c), "main_kernel").empty());    // a text nobody registered
  d.unloaded(module(a));
  CHECK(d.describe(module(a), "main_kernel").empty());  // the handle may name a new module
  CHECK(d.describe(module(b), "main_kernel") == "softmax (model.cpp:12)");
  d.loaded(module(a), nullptr, 0);  // no blob: nothing to match
  CHECK(d.describe(module(a), "main_kernel").empty());
}
