#include <catch2/catch.hpp>

#include "core/philox.h"

using namespace kiln;

// Known-answer vectors of Philox4x32-10 from the Random123 distribution (kat_vectors).
TEST_CASE("Philox4x32-10 matches the Random123 known answers") {
  auto r = philox::philox4x32(0, 0, 0);
  CHECK(r == std::array<uint32_t, 4>{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u});
  r = philox::philox4x32(~0ull, ~0ull, ~0ull);
  CHECK(r == std::array<uint32_t, 4>{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu});
  r = philox::philox4x32(0x85a308d3243f6a88ull, 0x0370734413198a2eull, 0x299f31d0a4093822ull);
  CHECK(r == std::array<uint32_t, 4>{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u});
}

TEST_CASE("Philox element draws depend only on (seed, offset, index)") {
  CHECK(philox::bits(42, 7, 5) == philox::philox4x32(7 + 1, 0, 42)[1]);
  CHECK(philox::bits(42, 7, 5) != philox::bits(43, 7, 5));
  CHECK(philox::to_uniform_float(0) == 0.0f);
  CHECK(philox::to_uniform_float(0xFFFFFFFFu) < 1.0f);
}
