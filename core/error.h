#pragma once
/// kiln::Error — the one exception type kiln throws.
///
/// Every error names the op that raised it, a message with the offending shapes, dtypes or
/// values, and the caller's source location. Public op functions take a defaulted
/// `Loc loc = Loc::current()` argument so that `loc` is the user's line, not kiln's.
#include <exception>
#include <source_location>
#include <string>

#include <fmt/format.h>

namespace kiln {

using Loc = std::source_location;

class Error : public std::exception {
 public:
  /// @param op       op name, e.g. "add"
  /// @param message  what is wrong, with the offending shapes / dtypes / values
  /// @param where    the user's source location
  Error(std::string op, std::string message, Loc where = Loc::current());

  const char* what() const noexcept override { return full_.c_str(); }
  const std::string& op() const { return op_; }
  const std::string& message() const { return message_; }
  const Loc& where() const { return where_; }

 private:
  std::string op_, message_, full_;
  Loc where_;
};

/// Throws kiln::Error(op, fmt::format(...), loc) unless `cond` holds.
#define KILN_CHECK(cond, op, loc, ...)                                  \
  do {                                                                  \
    if (!(cond)) [[unlikely]]                                           \
      throw ::kiln::Error((op), ::fmt::format(__VA_ARGS__), (loc));     \
  } while (0)

}  // namespace kiln
