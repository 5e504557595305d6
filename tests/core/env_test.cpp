// env_flag and env_bytes: the parsers of kiln's boolean switches and byte sizes.
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstdlib>
#include <utility>

#include "core/env.h"

using kiln::env_bytes;
using kiln::env_flag;

TEST_CASE("env_flag: 1/true/on/yes and 0/false/off/no in any case; others keep the default") {
  const char* name = "KILN_TEST_ENV_FLAG";
  ::unsetenv(name);
  CHECK_FALSE(env_flag(name));
  CHECK(env_flag(name, true));
  for (const char* on : {"1", "true", "ON", "Yes"}) {
    INFO(on);
    ::setenv(name, on, 1);
    CHECK(env_flag(name));
    CHECK(env_flag(name, true));
  }
  // "false" turned KILN_PROFILE on and KILN_DISABLE_CACHE on when any value but "0" was on.
  for (const char* off : {"0", "false", "OFF", "no"}) {
    INFO(off);
    ::setenv(name, off, 1);
    CHECK_FALSE(env_flag(name));
    CHECK_FALSE(env_flag(name, true));
  }
  for (const char* other : {"", "maybe", "2", "1x"}) {
    INFO(other);
    ::setenv(name, other, 1);
    CHECK_FALSE(env_flag(name));
    CHECK(env_flag(name, true));
  }
  ::unsetenv(name);
}

TEST_CASE("env_bytes: a whole number with a binary suffix; malformed values keep the default") {
  const char* name = "KILN_TEST_ENV_BYTES";
  ::unsetenv(name);
  CHECK(env_bytes(name, 77) == 77);
  const std::pair<const char*, int64_t> sizes[] = {
      {"0", 0},           {"1000", 1000},       {"1000b", 1000},
      {"4k", 4096},       {"4KiB", 4096},       {"512M", int64_t{512} << 20},
      {"2G", int64_t{2} << 30}, {"2gb", int64_t{2} << 30}, {"3T", int64_t{3} << 40},
      {"4611686018427387904", int64_t{1} << 62}};
  for (auto [text, bytes] : sizes) {
    INFO(text);
    ::setenv(name, text, 1);
    CHECK(env_bytes(name, 77) == bytes);
  }
  // 18446744073709551620 (2^64 + 4) wrapped to 4 (break-it pass): the check now runs before
  // each digit's multiply.
  for (const char* bad : {"", "-5", "1.5G", "G", "5X", "5 G", "12345678901234567890",
                          "18446744073709551620", "4611686018427387905", "4294967297G"}) {
    INFO(bad);
    ::setenv(name, bad, 1);
    CHECK(env_bytes(name, 77) == 77);
  }
  ::unsetenv(name);
}
