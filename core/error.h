#pragma once
/// kiln::Error — the one exception type kiln throws.
///
/// Every error names the op that raised it, a message with the offending shapes, dtypes or
/// values, and the caller's source location. Public op functions take a defaulted
/// `Loc loc = Loc::current()` argument so that `loc` is the user's line, not kiln's.
#include <exception>
#include <source_location>
#include <string>
#include <string_view>
#include <utility>

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
  /// Names the public function the user called instead (see kiln::as_op).
  void set_op(std::string op);
  /// Reports `where` instead (see kiln::at_user_line).
  void set_where(Loc where);

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

/// The outermost kiln::as_op running on this thread (nullptr outside any): the tracer records
/// it with each op so that replayed code raises the errors under the same name as eager code.
const char* public_op();
void set_public_op(const char* op);

/// Runs `body`, the work of the public function `op` done by other ops, so that an Error raised
/// anywhere inside names `op`, the function the user called: `ones({-1})` reports `ones`, not
/// the `empty` that checked the shape; `cross_entropy` with a bad target reports
/// `cross_entropy`, not its `nll_loss`. Nested calls keep the outermost name. Errors thrown on
/// pool threads are renamed too: they reach the caller before they reach here.
template <class F>
decltype(auto) as_op(const char* op, F&& body) {
  struct Scope {
    const char* outer = public_op();
    explicit Scope(const char* op) {
      if (!outer) set_public_op(op);
    }
    ~Scope() { set_public_op(outer); }
  } scope(op);
  try {
    return std::forward<F>(body)();
  } catch (Error& e) {
    e.set_op(op);
    throw;
  }
}

/// Whether `loc` is a line of kiln's own library sources (core/, eager/, nn/, tracer/, ir/,
/// codegen/, backends/, include/): not a line the user wrote. A header reached through another
/// include path than the build's (`-I.` gives "./nn/layers.h") counts when the same path from
/// its library folder on names a file in kiln's source tree.
bool inside_kiln(const Loc& loc);
/// inside_kiln for a file path (uncached; may look at the file system).
bool is_kiln_source_path(std::string_view file);

/// The user's line of the innermost kiln::at_user_line running on this thread, or nullptr.
const Loc* user_line();
void set_user_line(const Loc* loc);

/// `loc`, or the innermost kiln::at_user_line's line when `loc` is inside kiln: the line to
/// report for an op recorded at `loc` (the tracer records it, so replays raise at it too).
inline Loc user_facing(const Loc& loc) {
  const Loc* user = user_line();
  return user && inside_kiln(loc) ? *user : loc;
}

/// Runs `body`, the work of a public entry point done by kiln code that checks its input at its
/// own lines (a module's forward, load_state_dict), so that an Error raised inside at a line of
/// kiln reports `loc`, the user's line, instead: `linear(x)` with the wrong width names the
/// user's `model(x)` line, not nn/layers.cpp. Errors already at a user line (a user's module's
/// own check, an op called from the user's forward) keep it. Nested scopes: the innermost user
/// line wins.
template <class F>
decltype(auto) at_user_line(Loc loc, F&& body) {
  if (inside_kiln(loc)) return std::forward<F>(body)();  // kiln calling kiln: no new line
  struct Scope {
    const Loc* outer = user_line();
    explicit Scope(const Loc* l) { set_user_line(l); }
    ~Scope() { set_user_line(outer); }
  } scope(&loc);
  try {
    return std::forward<F>(body)();
  } catch (Error& e) {
    if (inside_kiln(e.where())) e.set_where(loc);
    throw;
  }
}

}  // namespace kiln
