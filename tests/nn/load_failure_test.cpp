// Failed loads change nothing: load_state_dict validates every key and shape before it copies.
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "kiln/nn.h"

using namespace kiln;
using namespace kiln::nn;
using V = std::vector<float>;

namespace {
V vec(const Tensor& t) { return t.to_vector<float>(); }

void expect_error(const std::function<void()>& f, const std::string& part) {
  try {
    f();
    FAIL("no kiln::Error (expected one containing \"" << part << "\")");
  } catch (const Error& e) {
    INFO(e.what());
    CHECK(std::string(e.what()).find(part) != std::string::npos);
  }
}

}  // namespace

TEST_CASE("load_state_dict that fails leaves every parameter unchanged") {
  manual_seed(1);
  Linear lin(2, 3);
  const V w0 = vec(lin.weight), b0 = vec(lin.bias);
  auto unchanged = [&] {
    CHECK(vec(lin.weight) == w0);
    CHECK(vec(lin.bias) == b0);
  };
  SECTION("a later key with the wrong shape") {
    StateDict d{{"weight", full({3, 2}, 7.0)}, {"bias", full({5}, 7.0)}};
    expect_error([&] { lin.load_state_dict(d); }, "size mismatch for \"bias\"");
    unchanged();
  }
  SECTION("an unexpected key (strict)") {
    StateDict d{{"weight", full({3, 2}, 9.0)}, {"bias", full({3}, 9.0)}, {"extra", full({1}, 0.0)}};
    expect_error([&] { lin.load_state_dict(d); }, "unexpected key \"extra\"");
    unchanged();
    lin.load_state_dict(d, /*strict=*/false);  // not strict: loads, ignoring "extra"
    CHECK(vec(lin.bias) == V{9.f, 9.f, 9.f});
    CHECK(vec(lin.weight) == V(6, 9.f));
  }
  SECTION("a missing key (strict)") {
    StateDict d{{"weight", full({3, 2}, 9.0)}};
    expect_error([&] { lin.load_state_dict(d); }, "missing key \"bias\"");
    unchanged();
  }
  SECTION("an undefined tensor") {
    StateDict d{{"weight", full({3, 2}, 9.0)}, {"bias", Tensor()}};
    expect_error([&] { lin.load_state_dict(d); }, "\"bias\" is undefined");
    unchanged();
  }
  SECTION("a good dict of another dtype loads, converted") {
    StateDict d{{"weight", full({3, 2}, 2.0, Float64)}, {"bias", full({3}, 3, Int64)}};
    lin.load_state_dict(d);
    CHECK(vec(lin.weight) == V(6, 2.f));
    CHECK(vec(lin.bias) == V{3.f, 3.f, 3.f});
    CHECK(lin.weight.dtype() == Float32);
  }
}
