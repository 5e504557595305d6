#include <catch2/catch.hpp>

#include "kiln/kiln.h"

using namespace kiln;

TEST_CASE("factories and views alias storage") {
  Tensor x = arange(6, {Float32}).view({2, 3});
  CHECK(x.shape() == Shape{2, 3});
  CHECK(x.to_vector<float>() == std::vector<float>{0, 1, 2, 3, 4, 5});
  Tensor t = x.t();
  CHECK(t.shape() == Shape{3, 2});
  CHECK_FALSE(t.is_contiguous());
  CHECK(t.to_vector<float>() == std::vector<float>{0, 3, 1, 4, 2, 5});
  CHECK(t.contiguous().to_vector<float>() == std::vector<float>{0, 3, 1, 4, 2, 5});
  Tensor row = x.select(0, 1);
  row.fill_(7);
  CHECK(x.to_vector<float>() == std::vector<float>{0, 1, 2, 7, 7, 7});
  CHECK(x.version() == row.version());
}
