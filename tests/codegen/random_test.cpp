// kiln.random (dropout_mask) compiled from a graph whose operand is the Philox key, against the
// scalar Philox of core/philox.h (an independent reference: the eager kernel is hand-written
// AVX) and the eager kernel, bit for bit: bool and floating masks, sizes that are not
// multiples of a block, counter offsets past 2^32 and 64-bit seeds.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <vector>

#include "codegen/codegen.h"
#include "core/philox.h"
#include "eager/dispatch.h"
#include "kiln/kiln.h"

using namespace kiln;

namespace {

struct MaskCase {
  std::vector<int64_t> shape;
  double p;
  uint64_t seed, offset;
};

Tensor key_tensor(uint64_t seed, uint64_t offset) {
  return from_vector<int64_t>({static_cast<int64_t>(seed), static_cast<int64_t>(offset)},
                              Shape{2});
}

/// The graph `key -> dropout_mask(shape, dtype, p)`, compiled for the CPU.
codegen::Executable mask_kernel(const MaskCase& c, DType dtype) {
  ir::Graph g;
  ir::Value key = g.input(DType::Int64, {2});
  OpAttrs a;
  a.dims = Dims(c.shape);
  a.dtype = dtype;
  a.p = c.p;
  g.output(g.op(OpKind::DropoutMask, {key}, a));
  return codegen::Executable(g);
}

/// Eager's mask for the same draw (its seed and offset as attributes).
Tensor eager_mask(const MaskCase& c, DType dtype) {
  OpAttrs a;
  a.dims = Dims(c.shape);
  a.dtype = dtype;
  a.p = c.p;
  a.seed = c.seed;
  a.offset = c.offset;
  return dispatch::call1({OpKind::DropoutMask, {}, a, Loc::current()});
}

const MaskCase kCases[] = {
    {{7}, 0.5, 1, 0},                                  // one block and a part
    {{3, 5, 9}, 0.1, 42, 17},                          // 135: not a multiple of 4
    {{64, 128}, 0.1, 0x0123456789abcdefULL, 5},        // the digits MLP's mask, 64-bit seed
    {{33, 31}, 0.75, 7, (uint64_t{1} << 32) + 3},      // counters past 2^32
    {{10}, 0.0, 3, 9},                                 // keeps everything
    {{10}, 1.0, 3, 9},                                 // keeps nothing
};

}  // namespace

TEST_CASE("codegen: dropout_mask from a key operand draws eager's mask bit for bit") {
  for (const MaskCase& c : kCases) {
    INFO("shape " << to_string(Dims(c.shape)) << " p " << c.p << " offset " << c.offset);
    const uint32_t threshold =
        static_cast<uint32_t>(std::min(std::ceil(c.p * 0x1.0p24), 0x1.0p24));
    Tensor got = mask_kernel(c, DType::Bool).run({key_tensor(c.seed, c.offset)}).at(0);
    REQUIRE(got.dtype() == DType::Bool);
    std::vector<bool> keep = got.to_vector<bool>();
    REQUIRE(static_cast<int64_t>(keep.size()) == numel(Dims(c.shape)));
    size_t wrong = 0, kept = 0;
    for (size_t i = 0; i < keep.size(); ++i) {
      const bool want = (philox::bits(c.seed, c.offset, i) >> 8) >= threshold;
      wrong += keep[i] != want;
      kept += keep[i];
    }
    CHECK(wrong == 0);
    if (c.p == 0.0) CHECK(kept == keep.size());
    if (c.p == 1.0) CHECK(kept == 0);
    CHECK(keep == eager_mask(c, DType::Bool).to_vector<bool>());
    // Floating masks: 1 / (1 - p) rounded to the dtype where kept, else 0 (eager's values).
    CHECK(mask_kernel(c, DType::Float32).run({key_tensor(c.seed, c.offset)}).at(0)
              .to_vector<float>() == eager_mask(c, DType::Float32).to_vector<float>());
    CHECK(mask_kernel(c, DType::Float64).run({key_tensor(c.seed, c.offset)}).at(0)
              .to_vector<double>() == eager_mask(c, DType::Float64).to_vector<double>());
  }
}

TEST_CASE("codegen: one dropout_mask kernel serves every key") {
  MaskCase c{{16, 8}, 0.5, 11, 0};
  codegen::Executable exe = mask_kernel(c, DType::Float32);
  for (uint64_t offset : {0ull, 32ull, 1ull << 40}) {
    c.offset = offset;
    CHECK(exe.run({key_tensor(c.seed, offset)}).at(0).to_vector<float>() ==
          eager_mask(c, DType::Float32).to_vector<float>());
  }
  // Different keys draw different masks.
  CHECK(exe.run({key_tensor(11, 0)}).at(0).to_vector<float>() !=
        exe.run({key_tensor(12, 0)}).at(0).to_vector<float>());
}

TEST_CASE("ir: dropout_mask in the IR takes a tensor<2xi64> key and a static shape") {
  OpAttrs a;
  a.dims = {4};
  a.dtype = DType::Bool;
  a.p = 0.5;
  {
    ir::Graph g;
    ir::Value wrong = g.input(DType::Int32, {2});
    CHECK_THROWS_WITH(g.op(OpKind::DropoutMask, {wrong}, a),
                      Catch::Contains("tensor<2xi64> (seed, offset)"));
  }
  {
    ir::Graph g;
    CHECK_THROWS_WITH(g.op(OpKind::DropoutMask, {}, a),
                      Catch::Contains("tensor<2xi64> (seed, offset)"));
  }
  {
    ir::Graph g;
    ir::Value key = g.input(DType::Int64, {2});
    a.p = 1.5;
    CHECK_THROWS_WITH(g.op(OpKind::DropoutMask, {key}, a), Catch::Contains("[0, 1]"));
  }
}
