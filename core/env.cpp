#include "core/env.h"

#include <fmt/format.h>

#include <cctype>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <utility>

namespace kiln {
namespace {

/// `v` without the white space around it (as KILN_LOGS reads its list).
std::string trimmed(std::string_view v) {
  auto space = [](char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; };
  while (!v.empty() && space(v.front())) v.remove_prefix(1);
  while (!v.empty() && space(v.back())) v.remove_suffix(1);
  return std::string(v);
}

/// Prints `message` unless it was printed for this variable and value before: switches are read
/// at every compile, and a warning each time buried the output.
void warn_once(const char* name, const char* value, const std::string& message) {
  static std::mutex mutex;
  static std::set<std::string> warned;
  std::lock_guard lock(mutex);
  if (warned.insert(std::string(name) + "=" + value).second)
    fmt::print(stderr, "kiln: {}\n", message);
}

}  // namespace

bool env_flag(const char* name, bool otherwise) {
  const char* env = std::getenv(name);
  std::string v = trimmed(env ? env : "");
  for (char& c : v) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (v == "1" || v == "true" || v == "on" || v == "yes") return true;
  if (v == "0" || v == "false" || v == "off" || v == "no") return false;
  // Said by the value it is taken as: "it stays off" read as the disk cache staying off for
  // KILN_DISABLE_CACHE=2, whose default keeps the cache on.
  if (!v.empty())
    warn_once(name, env,
              fmt::format("ignoring {}={} (expected 1/true/on/yes or 0/false/off/no); treated "
                          "as {}",
                          name, env, otherwise ? "1 (on)" : "0 (off)"));
  return otherwise;
}

int64_t env_bytes(const char* name, int64_t otherwise) {
  const char* env = std::getenv(name);
  if (!env || !*env) return otherwise;
  const std::string v = env;
  size_t i = 0;
  uint64_t n = 0;
  bool ok = i < v.size() && std::isdigit(static_cast<unsigned char>(v[i]));
  for (; ok && i < v.size() && std::isdigit(static_cast<unsigned char>(v[i])); ++i) {
    const auto digit = static_cast<uint64_t>(v[i] - '0');
    ok = n <= ((uint64_t{1} << 62) - digit) / 10;  // before it wraps: 2^64 + 4 read as 4
    n = n * 10 + digit;
  }
  std::string suffix = v.substr(i);
  for (char& c : suffix) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  int shift = -1;
  for (auto [text, bits] : {std::pair{"", 0}, {"b", 0}, {"k", 10}, {"kb", 10}, {"kib", 10},
                            {"m", 20}, {"mb", 20}, {"mib", 20}, {"g", 30}, {"gb", 30},
                            {"gib", 30}, {"t", 40}, {"tb", 40}, {"tib", 40}})
    if (suffix == text) shift = bits;
  ok = ok && shift >= 0 && n <= (uint64_t{1} << (62 - shift));
  if (ok) return static_cast<int64_t>(n << shift);
  // Once per variable and value: the disk cache reads its limit at every write.
  warn_once(name, env,
            fmt::format("ignoring {}={} (expected a size such as 1000, 512M or 2G); it stays {}",
                        name, env, otherwise));
  return otherwise;
}

int64_t env_int(const char* name, int64_t otherwise, int64_t min, int64_t max,
                const char* expected, bool (*valid)(int64_t)) {
  const char* env = std::getenv(name);
  const std::string v = trimmed(env ? env : "");
  if (v.empty()) return otherwise;
  size_t i = v[0] == '-' || v[0] == '+' ? 1 : 0;
  bool ok = i < v.size();
  int64_t n = 0;  // accumulated negatively: covers INT64_MIN, and overflow is caught first
  for (; ok && i < v.size(); ++i) {
    const int digit = v[i] - '0';
    ok = digit >= 0 && digit <= 9 && n >= (INT64_MIN + digit) / 10;
    if (ok) n = n * 10 - digit;
  }
  if (ok && v[0] != '-') {
    ok = n != INT64_MIN;  // 2^63 does not fit; negating it would overflow (UBSan)
    if (ok) n = -n;
  }
  ok = ok && n >= min && n <= max && (!valid || valid(n));
  if (ok) return n;
  warn_once(name, env,
            fmt::format("ignoring {}={} (expected {}); using {}", name, env, expected, otherwise));
  return otherwise;
}

}  // namespace kiln
