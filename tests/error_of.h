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

}  // namespace kiln::testing
