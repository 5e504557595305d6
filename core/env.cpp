#include "core/env.h"

#include <fmt/format.h>

#include <cctype>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <set>
#include <string>
#include <utility>

namespace kiln {

bool env_flag(const char* name, bool otherwise) {
  const char* env = std::getenv(name);
  std::string v = env ? env : "";
  for (char& c : v) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (v == "1" || v == "true" || v == "on" || v == "yes") return true;
  if (v == "0" || v == "false" || v == "off" || v == "no") return false;
  if (!v.empty())
    fmt::print(stderr, "kiln: ignoring {}={} (expected 1/true/on/yes or 0/false/off/no); it "
               "stays {}\n", name, env, otherwise ? "on" : "off");
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
  static std::mutex mutex;
  static std::set<std::string> warned;
  std::lock_guard lock(mutex);
  if (warned.insert(std::string(name) + "=" + v).second)
    fmt::print(stderr, "kiln: ignoring {}={} (expected a size such as 1000, 512M or 2G); it "
               "stays {}\n", name, env, otherwise);
  return otherwise;
}

}  // namespace kiln
