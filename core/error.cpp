#include "core/error.h"

#include <filesystem>
#include <string>
#include <string_view>
#include <unordered_map>

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
  // A default Loc argument evaluated inside the C++ library: a constructor called through
  // std::make_shared names stl_construct.h, and no user line is known (break-it pass).
  const bool in_std = std::string_view(where_.file_name()).find("/include/c++/") !=
                      std::string_view::npos;
  full_ = fmt::format("kiln::{}: {} (at {}:{}{})", op_, message_, where_.file_name(),
                      where_.line(),
                      in_std ? ", inside the C++ library: an object built through "
                               "std::make_shared cannot name your line; build it directly to "
                               "see it"
                             : "");
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

constexpr std::string_view kLibraryDirs[] = {"core/",    "eager/",    "nn/",      "tracer/",
                                             "ir/",      "codegen/",  "backends/", "include/"};

bool in_library_dir(std::string_view relative) {
  for (std::string_view dir : kLibraryDirs)
    if (relative.starts_with(dir)) return true;
  return false;
}

// A kiln header reached through another include path than the build's absolute one (`-I.`
// gives "./nn/layers.h", a symlinked checkout another prefix): the file's path from one of the
// library folders on names a header under kiln's root, and is that file where the path can be
// resolved from here. Only headers: kiln's sources are compiled with absolute paths, and a
// user's own `myproj/nn/layers.cpp` (or a header of that name) is the user's code (review).
bool names_library_file(std::string_view file, std::string_view root) {
  if (!file.ends_with(".h")) return false;
  for (std::string_view dir : kLibraryDirs)
    for (size_t pos = file.find(dir); pos != std::string_view::npos; pos = file.find(dir, pos + 1))
      if (pos == 0 || file[pos - 1] == '/') {
        std::error_code ec;
        const std::string ours = std::string(root) + std::string(file.substr(pos));
        if (!std::filesystem::is_regular_file(ours, ec)) continue;
        const std::string path(file);
        if (!std::filesystem::exists(path, ec)) return true;  // relative to another directory
        return std::filesystem::equivalent(path, ours, ec);
      }
  return false;
}
}  // namespace

bool is_kiln_source_path(std::string_view file) {
  static const std::string_view root = source_root();
  if (root.empty()) return false;
  if (file.starts_with(root)) return in_library_dir(file.substr(root.size()));
  return names_library_file(file, root);
}

bool inside_kiln(const Loc& loc) {
  static const std::string_view root = source_root();
  std::string_view file = loc.file_name();
  if (root.empty()) return false;
  if (file.starts_with(root)) return in_library_dir(file.substr(root.size()));
  // Called for every op: the answer for another path is found once per file-name literal, and
  // the last one (the user's file, op after op) is a pointer compare.
  thread_local const char* last_file = nullptr;
  thread_local bool last_answer = false;
  if (loc.file_name() == last_file) return last_answer;
  thread_local std::unordered_map<const char*, bool> other_paths;
  auto [it, added] = other_paths.try_emplace(loc.file_name(), false);
  if (added) it->second = is_kiln_source_path(file);
  last_file = loc.file_name();
  last_answer = it->second;
  return last_answer;
}

const Loc* user_line() { return t_user_line; }
void set_user_line(const Loc* loc) { t_user_line = loc; }

const char* public_op() { return t_public_op; }
void set_public_op(const char* op) { t_public_op = op; }

}  // namespace kiln
