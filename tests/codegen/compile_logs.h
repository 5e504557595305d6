#pragma once
// Captures what KILN_LOGS-style stage dumps (codegen::set_log_stages) write to stderr while a
// graph compiles, for tests that check the generated code.
#include <catch2/catch.hpp>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>

#include "codegen/codegen.h"

namespace kiln::test {

/// The dumps of `stages` ("ir", "codegen", ...) written while `g` compiles; the caches are
/// skipped so the whole pipeline runs.
inline std::string compile_logs(const ir::Graph& g, const char* stages,
                                const codegen::CompileOptions& options = {}) {
  const char* old_disable = std::getenv("KILN_DISABLE_CACHE");
  std::string saved_disable = old_disable ? old_disable : "";
  ::setenv("KILN_DISABLE_CACHE", "1", 1);
  codegen::clear_memory_cache();
  char path[] = "/tmp/kiln-compile-logs-XXXXXX";
  int fd = ::mkstemp(path);
  REQUIRE(fd >= 0);
  std::fflush(stderr);
  int saved = ::dup(2);
  ::dup2(fd, 2);
  codegen::set_log_stages(stages);
  { codegen::Executable exe(g, options); }
  codegen::set_log_stages("");
  std::fflush(stderr);
  ::dup2(saved, 2);
  ::close(saved);
  ::close(fd);
  if (old_disable) ::setenv("KILN_DISABLE_CACHE", saved_disable.c_str(), 1);
  else ::unsetenv("KILN_DISABLE_CACHE");
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::remove(path);
  return text;
}

/// The part of `logs` under the header of stage `stage` ("bufferized", ...), up to the next.
inline std::string stage_text(const std::string& logs, const std::string& stage) {
  const std::string header = "// ----- kiln codegen: " + stage + " -----";
  size_t at = logs.find(header);
  if (at == std::string::npos) return "";
  size_t end = logs.find("// ----- kiln codegen:", at + header.size());
  return logs.substr(at, end == std::string::npos ? std::string::npos : end - at);
}

/// Occurrences of `what` in `text`.
inline size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

}  // namespace kiln::test
