// env_flag, env_bytes and env_int: the parsers of kiln's boolean switches, byte sizes and
// integers.
#include <catch2/catch.hpp>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>
#include <utility>

#include "core/env.h"
#include "stderr_of.h"

using kiln::env_bytes;
using kiln::env_flag;
using kiln::env_int;
using kiln::testing::stderr_of;

namespace {

size_t count(const std::string& text, const std::string& part) {
  size_t n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}

}  // namespace

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
  for (const char* other : {"", "maybe", "2", "1x", "1 1", "o n"}) {
    INFO(other);
    ::setenv(name, other, 1);
    CHECK_FALSE(env_flag(name));
    CHECK(env_flag(name, true));
  }
  ::unsetenv(name);
}

// " 1" and "Yes " were rejected while KILN_LOGS trimmed its list.
TEST_CASE("env_flag: white space around the word is ignored") {
  const char* name = "KILN_TEST_ENV_FLAG_SPACE";
  for (const char* on : {" 1", "Yes ", "\ttrue\n", "  on  "}) {
    INFO(on);
    ::setenv(name, on, 1);
    CHECK(env_flag(name));
  }
  for (const char* off : {" 0", "No ", "\tfalse\n", "  OFF  "}) {
    INFO(off);
    ::setenv(name, off, 1);
    CHECK_FALSE(env_flag(name, true));
  }
  ::setenv(name, "   ", 1);  // blank: unset
  CHECK(env_flag(name, true));
  ::unsetenv(name);
}

// KILN_DISABLE_CACHE=2 warned at every compile, saying "it stays off" of a cache that stayed on.
TEST_CASE("env_flag: an unknown value warns once per variable and value, saying what it means") {
  const char* name = "KILN_TEST_ENV_FLAG_WARN";
  ::setenv(name, "2", 1);
  std::string log = stderr_of([&] {
    for (int i = 0; i < 5; ++i) CHECK_FALSE(env_flag(name));
  });
  CHECK(count(log, "kiln: ignoring KILN_TEST_ENV_FLAG_WARN=2 (expected 1/true/on/yes or "
                   "0/false/off/no); treated as 0 (off)\n") == 1);
  CHECK(count(log, "\n") == 1);
  ::setenv(name, "3", 1);  // another value: warned too, once
  log = stderr_of([&] {
    for (int i = 0; i < 3; ++i) CHECK(env_flag(name, true));
  });
  CHECK(count(log, "ignoring KILN_TEST_ENV_FLAG_WARN=3") == 1);
  CHECK(count(log, "treated as 1 (on)") == 1);
  CHECK(count(log, "\n") == 1);
  ::setenv(name, "2", 1);  // already reported
  CHECK(stderr_of([&] { env_flag(name); }).empty());
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

TEST_CASE("env_int: the whole value an integer in range; anything else warns once, default") {
  const char* name = "KILN_TEST_ENV_INT";
  auto multiple_of_32 = [](int64_t v) { return v % 32 == 0; };
  auto read = [&] { return env_int(name, 256, 32, 1024, "a multiple of 32", multiple_of_32); };
  ::unsetenv(name);
  CHECK(read() == 256);
  const std::pair<const char*, int64_t> good[] = {
      {"64", 64}, {" 128", 128}, {"32 ", 32}, {"\t1024\n", 1024}, {"+96", 96}, {"0064", 64}};
  for (auto [text, value] : good) {
    INFO(text);
    ::setenv(name, text, 1);
    CHECK(read() == value);
  }
  // atoi read "64abc" as 64, "2.9" as 2 and 4294967360 (2^32 + 64) as 64.
  for (const char* bad : {"", "64abc", "2.9", "4294967360", "18446744073709551680",
                          "99999999999999999999999", "-64", "0", "2048", "48", "6 4", "abc",
                          "-", "+", "0x40"}) {
    INFO(bad);
    ::setenv(name, bad, 1);
    CHECK(read() == 256);
  }
  CHECK(env_int(name, 7, INT64_MIN, INT64_MAX, "an integer") == 7);  // "0x40"
  ::setenv(name, "-9223372036854775808", 1);
  CHECK(env_int(name, 7, INT64_MIN, INT64_MAX, "an integer") == INT64_MIN);
  ::setenv(name, "9223372036854775807", 1);
  CHECK(env_int(name, 7, INT64_MIN, INT64_MAX, "an integer") == INT64_MAX);
  ::setenv(name, "9223372036854775808", 1);
  CHECK(env_int(name, 7, INT64_MIN, INT64_MAX, "an integer") == 7);
  ::setenv(name, "-9223372036854775809", 1);
  CHECK(env_int(name, 7, INT64_MIN, INT64_MAX, "an integer") == 7);

  ::setenv(name, "65x", 1);
  const std::string log = stderr_of([&] {
    for (int i = 0; i < 4; ++i) CHECK(read() == 256);
  });
  CHECK(log == "kiln: ignoring KILN_TEST_ENV_INT=65x (expected a multiple of 32); using 256\n");
  ::unsetenv(name);
}
