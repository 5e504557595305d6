// inside_kiln's test of a file path: kiln's library sources by the build's absolute path, or
// by another include path that names the same file (-I. gives "./nn/layers.h").
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

#include "core/error.h"

using namespace kiln;

TEST_CASE("is_kiln_source_path: library files by any include path, nothing else") {
  const std::string self = __FILE__;
  const std::string tail = "tests/core/error_test.cpp";
  REQUIRE(self.ends_with(tail));
  const std::string root = self.substr(0, self.size() - tail.size());
  CHECK(is_kiln_source_path(root + "nn/layers.h"));
  CHECK(is_kiln_source_path(root + "core/tensor.h"));
  CHECK(is_kiln_source_path("./nn/layers.h"));
  CHECK(is_kiln_source_path("nn/layers.h"));
  CHECK(is_kiln_source_path("../checkout/include/kiln/kiln.h"));
  CHECK(is_kiln_source_path("/elsewhere/kiln/eager/ops.h"));
  CHECK_FALSE(is_kiln_source_path(self));                   // a test: the user's side
  CHECK_FALSE(is_kiln_source_path(root + "examples/x.cpp"));
  CHECK_FALSE(is_kiln_source_path("./nn/no_such_file.h"));  // not one of kiln's files
  CHECK_FALSE(is_kiln_source_path("/home/me/mynn/layers.h"));
  CHECK_FALSE(is_kiln_source_path("model.cpp"));
  // A user's project with files of kiln's names is the user's code: a source, or a header that
  // exists and is another file than kiln's (review: its data<T>() read was not seen, so a
  // compiled function replayed the value it read as a constant).
  CHECK_FALSE(is_kiln_source_path("/home/me/myproj/nn/layers.cpp"));
  const auto dir = std::filesystem::temp_directory_path() / "kiln_error_test_project";
  std::filesystem::create_directories(dir / "nn");
  std::ofstream(dir / "nn" / "layers.h") << "// a user's header\n";
  CHECK_FALSE(is_kiln_source_path((dir / "nn" / "layers.h").string()));
  std::filesystem::remove_all(dir);
}
