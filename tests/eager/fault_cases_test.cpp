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

TEST_CASE("sizes that overflow, negative expand sizes and bad in-place targets raise") {
  CHECK_THROWS_WITH(zeros({int64_t{1} << 62, 4}), Catch::Contains("too large"));
  CHECK_THROWS_WITH(zeros({3037000500LL, 3037000500LL}), Catch::Contains("too large"));
  CHECK_THROWS_AS(eye(int64_t{1} << 32), Error);
  CHECK_THROWS_AS(arange(0, int64_t{1} << 62, 1), Error);
  CHECK_THROWS_WITH(ones({1}).expand({-5}), Catch::Contains("invalid size -5"));
  CHECK_THROWS_WITH(ones({1}).expand({int64_t{1} << 62, 4}), Catch::Contains("too large"));
  CHECK(zeros({int64_t{1} << 62, 0}).numel() == 0);
  Tensor b = zeros({1});
  CHECK_THROWS_WITH(b.expand({3}) += tensor({1.f, 2.f, 3.f}), Catch::Contains("single memory location"));
  CHECK_THROWS_WITH(b.expand({3}).copy_(tensor({1.f, 2.f, 3.f})), Catch::Contains("single memory location"));
  // PyTorch 1.13 allows fill_ there (zeros(1, 2).expand(3, 2).fill_(5) sets the row to 5s).
  Tensor row = zeros({1, 2});
  row.expand({3, 2}).fill_(5);
  CHECK(row.to_vector<float>() == std::vector<float>{5, 5});
  Tensor big = zeros({1 << 20, 1});
  big.expand({1 << 20, 64}).fill_(2);  // the parallel path, each location written once
  CHECK(big.sum().item<double>() == double(2 << 20));
  CHECK_THROWS_WITH(full({2}, 1e20, {DType::Int32}), Catch::Contains("overflow"));
  CHECK_THROWS_AS(scalar_tensor(1.0).size(0), Error);
}

TEST_CASE("copy_ from overlapping memory copies a snapshot") {
  Tensor a = arange(9, {Float32}).view({3, 3});
  a.copy_(a.t());
  CHECK(a.to_vector<float>() == std::vector<float>{0, 3, 6, 1, 4, 7, 2, 5, 8});
  Tensor b = arange(100000, {Float32});
  b.slice(0, 1, 100000).copy_(b.slice(0, 0, 99999));
  CHECK(b.select(0, 99999).item<float>() == 99998);
  CHECK(b.select(0, 1).item<float>() == 0);
}

TEST_CASE("int64 values print exactly") {
  CHECK(tensor({(int64_t{1} << 53) + 1}).str() == "tensor([9007199254740993])");
  CHECK(arange(INT64_MAX - 1, INT64_MAX).str() == "tensor([9223372036854775806])");
}
