#include "core/env.h"

#include <fmt/format.h>

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <string>

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

}  // namespace kiln
