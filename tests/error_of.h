#pragma once
// error_of: the kiln::Error a call throws, for tests of messages and reported lines.
#include <catch2/catch.hpp>

#include <functional>

#include "core/error.h"

namespace kiln::testing {

/// The kiln::Error `f` throws (FAIL if none).
inline Error error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e;
  }
  FAIL("no kiln::Error");
  return Error("", "", Loc::current());
}

/// Checks that `f` throws a kiln::Error naming `op`, whose message contains `says`, reported
/// at line `line` (of the caller's file: `__LINE__` where the failing call is written).
inline void check_error(const std::function<void()>& f, const std::string& op,
                        const std::string& says, unsigned line) {
  const Error e = error_of(f);
  INFO(e.what());
  CHECK(e.op() == op);
  CHECK_THAT(e.message(), Catch::Contains(says));
  CHECK(e.where().line() == line);
}

}  // namespace kiln::testing
