#include <catch2/catch.hpp>

#include <string>
#include <thread>

#include "core/meta.h"
#include "core/precision.h"

using namespace kiln;

TEST_CASE("promote_types follows PyTorch's table") {
  CHECK(promote_types(DType::Bool, DType::Int32) == DType::Int32);
  CHECK(promote_types(DType::Int32, DType::Int64) == DType::Int64);
  CHECK(promote_types(DType::Int64, DType::Float32) == DType::Float32);
  CHECK(promote_types(DType::Float32, DType::Float64) == DType::Float64);
  CHECK(promote_types(DType::Bool, DType::Bool) == DType::Bool);
  for (int a = 0; a < kNumDTypes; ++a)
    for (int b = 0; b < kNumDTypes; ++b)
      CHECK(promote_types(DType(a), DType(b)) == promote_types(DType(b), DType(a)));
}

TEST_CASE("result_type: host scalars do not promote a tensor of the same category") {
  TensorMeta i32{DType::Int32, {3}, false};
  TensorMeta f32{DType::Float32, {3}, false};
  TensorMeta f64_0d{DType::Float64, {}, false};
  TensorMeta int_scalar{DType::Int64, {}, true};
  TensorMeta float_scalar{DType::Float64, {}, true};
  TensorMeta bool_t{DType::Bool, {3}, false};
  CHECK(result_type(std::array{i32, int_scalar}) == DType::Int32);
  CHECK(result_type(std::array{i32, float_scalar}) == DType::Float32);  // default dtype
  CHECK(result_type(std::array{f32, float_scalar}) == DType::Float32);
  CHECK(result_type(std::array{f32, f64_0d}) == DType::Float32);        // 0-d same category
  CHECK(result_type(std::array{i32, f64_0d}) == DType::Float64);        // 0-d higher category
  CHECK(result_type(std::array{bool_t, int_scalar}) == DType::Int64);
}

TEST_CASE("broadcast_shapes and its error") {
  CHECK(broadcast_shapes({2, 1, 3}, {4, 1}, "add", Loc::current()) == Shape{2, 4, 3});
  CHECK(broadcast_shapes({}, {5}, "add", Loc::current()) == Shape{5});
  CHECK(broadcast_shapes({0, 1}, {1, 3}, "add", Loc::current()) == Shape{0, 3});
  try {
    broadcast_shapes({2, 3}, {4}, "add", Loc::current());
    FAIL("expected an error");
  } catch (const Error& e) {
    CHECK(e.op() == "add");
    CHECK_THAT(e.what(), Catch::Contains("[2, 3]") && Catch::Contains("[4]") &&
                             Catch::Contains("dtype_test.cpp"));
  }
}

TEST_CASE("op table names and categories") {
  CHECK(op_name(OpKind::Add) == "add");
  CHECK(op_info(OpKind::Sum).category == OpCategory::Reduction);
  CHECK(op_info(OpKind::Exp).dtype_rule == DTypeRule::ToFloat);
  CHECK(kNumOps > 80);
}

TEST_CASE("set_default_dtype of a DType out of range is an error, not a table read past its end") {
  // A break-it pass: static_cast<DType>(100) crashed, 5..7 raised with unrelated memory as the
  // dtype's name.
  for (int bad : {5, 7, 42, 100, 255}) {
    INFO("DType " << bad);
    CHECK_THROWS_WITH(set_default_dtype(static_cast<DType>(bad)),
                      Catch::Contains("invalid DType value " + std::to_string(bad)));
  }
  CHECK(default_dtype() == DType::Float32);
  CHECK_THROWS_WITH(set_default_dtype(DType::Int32), Catch::Contains("must be floating"));
}

TEST_CASE("MatmulPrecisionScope pins the calling thread's matmul precision") {
  // A compiled replay holds one: another thread's change reached its later products (those it
  // ran on eager kernels), mixing precisions within one call (a break-it pass).
  set_float32_matmul_precision("highest");
  {
    MatmulPrecisionScope outer;
    std::thread([] { set_float32_matmul_precision("medium"); }).join();
    CHECK(float32_matmul_precision() == MatmulPrecision::Highest);
    {
      MatmulPrecisionScope inner;  // nested: still the outer one's
      CHECK(float32_matmul_precision() == MatmulPrecision::Highest);
    }
    std::thread([] { CHECK(float32_matmul_precision() == MatmulPrecision::Medium); }).join();
    set_float32_matmul_precision("high");  // this thread's own change applies at once
    CHECK(float32_matmul_precision() == MatmulPrecision::High);
  }
  CHECK(float32_matmul_precision() == MatmulPrecision::High);
  set_float32_matmul_precision("highest");
}
