// Eager-mode halves of ../shared/cases/fault-cases.md (the compiled halves come with compile()).
#include <catch2/catch.hpp>

#include "kiln/kiln.h"

using namespace kiln;

TEST_CASE("FC-17 an op documented to return its input is an alias (eager)") {
  Tensor x = ones({2, 2});
  Tensor y = dropout(x, 0.5, /*training=*/false);
  CHECK(y.is_same(x));
  y += y;
  CHECK(y.to_vector<float>() == std::vector<float>{2, 2, 2, 2});
  CHECK(x.to_vector<float>() == std::vector<float>{2, 2, 2, 2});
  // contiguous() of a contiguous tensor and to() of the same dtype are aliases too.
  CHECK(x.contiguous().is_same(x));
  CHECK(x.to(DType::Float32).is_same(x));
}

TEST_CASE("FC-25 contiguous() of a transposed tensor has fresh row-major strides (eager)") {
  Tensor x = tensor({{1.f, 2.f, 3.f}, {4.f, 5.f, 6.f}});
  Tensor c = x.t().contiguous();
  CHECK(c.strides() == Strides{2, 1});
  CHECK(c.view({6}).to_vector<float>() == std::vector<float>{1, 4, 2, 5, 3, 6});
  CHECK(x.t().contiguous().flatten().to_vector<float>() == std::vector<float>{1, 4, 2, 5, 3, 6});
  CHECK((c + 1).to_vector<float>() == std::vector<float>{2, 5, 3, 6, 4, 7});
}

TEST_CASE("FC-27 out-of-range indices raise, naming the index and the dim size (eager)") {
  Tensor x = randn({2, 2, 2, 2});
  CHECK_THROWS_WITH(index_select(x, 0, tensor({2}).to(DType::Int64)),
                    Catch::Contains("2") && Catch::Contains("size 2"));
  Tensor w = tensor({{10.f, 20.f}, {30.f, 40.f}, {50.f, 60.f}, {70.f, 80.f}});
  CHECK_THROWS_WITH(embedding(w, tensor({2, -2}).to(DType::Int64)),
                    Catch::Contains("-2") && Catch::Contains("size 4"));
}
