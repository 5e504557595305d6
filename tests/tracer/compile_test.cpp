// kiln::compile: replay, guards, recompiles, automatic dynamic, trace trees, mutation.
#include <catch2/catch.hpp>

#include "kiln/kiln.h"

using namespace kiln;

namespace {
std::vector<float> vec(const Tensor& t) { return t.to_vector<float>(); }
}  // namespace

TEST_CASE("compile: x*x + x replays compiled code with eager's values", "[compile]") {
  auto cf = compile([](const Tensor& x) { return x * x + x; });
  Tensor x = from_vector<float>({1, 2, 3, 4}, {4});
  CHECK(vec(cf(x)) == std::vector<float>{2, 6, 12, 20});
  CHECK(vec(cf(x)) == std::vector<float>{2, 6, 12, 20});
  CHECK(cf.compile_count() == 1);
  INFO(cf.explain());
  CHECK(cf.explain().find("compiled region: 2 ops -> 1 kernel") != std::string::npos);
}
