#pragma once
// stderr_of: what a call prints on stderr, for tests of warnings and logs.
#include <catch2/catch.hpp>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>

namespace kiln::testing {

/// What `body` prints on stderr (through a temporary file standing in for fd 2).
inline std::string stderr_of(const std::function<void()>& body) {
  char path[] = "/tmp/kiln-stderr-XXXXXX";
  const int fd = ::mkstemp(path);
  REQUIRE(fd >= 0);
  std::fflush(stderr);
  const int saved = ::dup(2);
  ::dup2(fd, 2);
  body();
  std::fflush(stderr);
  ::dup2(saved, 2);
  ::close(saved);
  ::close(fd);
  std::ifstream in(path);
  std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  ::unlink(path);
  return text;
}

}  // namespace kiln::testing
