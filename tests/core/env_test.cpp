// env_flag: the one parser of kiln's boolean environment switches.
#include <catch2/catch.hpp>
#include <cstdlib>

#include "core/env.h"

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
