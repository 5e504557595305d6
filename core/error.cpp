#include "core/error.h"

#include <string_view>

namespace kiln {

Error::Error(std::string op, std::string message, Loc where)
    : message_(std::move(message)), where_(where) {
  set_op(std::move(op));
}

void Error::set_where(Loc where) {
  where_ = where;
  set_op(op_);
}

void Error::set_op(std::string op) {
  op_ = std::move(op);
  full_ = fmt::format("kiln::{}: {} (at {}:{})", op_, message_, where_.file_name(), where_.line());
}

namespace {
thread_local const char* t_public_op = nullptr;
thread_local const Loc* t_user_line = nullptr;

// kiln's source root: this file's path less "core/error.cpp" (the build passes absolute paths;
// headers included by a user's program resolve through the same -I, so they match too).
std::string_view source_root() {
  std::string_view self = __FILE__;
  std::string_view tail = "core/error.cpp";
  return self.ends_with(tail) ? self.substr(0, self.size() - tail.size()) : std::string_view();
}
}  // namespace

bool inside_kiln(const Loc& loc) {
  static const std::string_view root = source_root();
  std::string_view file = loc.file_name();
  if (root.empty() || !file.starts_with(root)) return false;
  file.remove_prefix(root.size());
  for (std::string_view dir : {"core/", "eager/", "nn/", "tracer/", "ir/", "codegen/", "backends/",
                               "include/"})
    if (file.starts_with(dir)) return true;
  return false;
}

const Loc* user_line() { return t_user_line; }
void set_user_line(const Loc* loc) { t_user_line = loc; }

const char* public_op() { return t_public_op; }
void set_public_op(const char* op) { t_public_op = op; }

}  // namespace kiln
