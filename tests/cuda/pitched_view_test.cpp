// pitched_view: strided views as the rows that the driver's 2-D copies and memsets write
// (codegen/cuda_kernels.cpp's fill_ / copy_ into a strided CUDA view). Checked against the
// element offsets the strides give, in the view's element order.
#include <catch2/catch.hpp>
#include <algorithm>
#include <functional>
#include <random>
#include <vector>

#include "backends/cuda/copy.h"

using namespace kiln;
using kiln::cuda::PitchedCalls;
using kiln::cuda::PitchedView;
using kiln::cuda::pitched_calls;
using kiln::cuda::pitched_view;

namespace {

/// Offsets of a view's elements in row-major order of its index, from its strides.
std::vector<int64_t> offsets(const Shape& shape, const Strides& strides) {
  std::vector<int64_t> out;
  std::function<void(int, int64_t)> walk = [&](int d, int64_t at) {
    if (d == shape.size()) return out.push_back(at);
    for (int64_t i = 0; i < shape[d]; ++i) walk(d + 1, at + i * strides[d]);
  };
  walk(0, 0);
  return out;
}

/// Offsets a pitched copy writes, in the order it takes its contiguous source's elements.
std::vector<int64_t> offsets(const PitchedView& v) {
  std::vector<int64_t> out;
  for (int64_t p = 0; p < v.planes; ++p)
    for (int64_t r = 0; r < v.height; ++r)
      for (int64_t w = 0; w < v.width; ++w) out.push_back(p * v.plane_stride + r * v.pitch + w);
  return out;
}

/// (destination offset, source offset) of each element the driver calls of `v` copy.
std::vector<std::pair<int64_t, int64_t>> copied(const PitchedView& v) {
  const PitchedCalls c = pitched_calls(v);
  std::vector<std::pair<int64_t, int64_t>> out;
  for (int64_t k = 0; k < c.calls; ++k)
    for (int64_t r = 0; r < c.rows; ++r)
      for (int64_t w = 0; w < v.width; ++w)
        out.push_back({k * c.call_stride + r * c.row_pitch + w,
                       k * c.src_call_stride + r * c.src_row_pitch + w});
  return out;
}

Strides contiguous(const Shape& s) {
  Strides st = Strides::filled(static_cast<int>(s.size()), 0);
  int64_t n = 1;
  for (int d = static_cast<int>(s.size()) - 1; d >= 0; --d) st[d] = n, n *= s[d];
  return st;
}

}  // namespace

TEST_CASE("pitched_view: a KV cache's slot, a column and a block") {
  // [B, H, T, D] = [2, 3, 5, 4], slot t: [2, 3, 1, 4] -> 6 rows of 4, pitch 20.
  auto slot = pitched_view({2, 3, 1, 4}, {60, 20, 4, 1});
  REQUIRE(slot);
  CHECK(slot->width == 4);
  CHECK(slot->height == 6);
  CHECK(slot->pitch == 20);
  CHECK(slot->planes == 1);
  // x[:, 2] of [7, 9]: 7 rows of 1, pitch 9.
  auto column = pitched_view({7}, {9});
  REQUIRE(column);
  CHECK(column->width == 1);
  CHECK(column->height == 7);
  CHECK(column->pitch == 9);
  // x[:, 1:3, :2] of [4, 5, 6]: 4 planes (30 apart) of 2 rows of 2 (pitch 6).
  auto block = pitched_view({4, 2, 2}, {30, 6, 1});
  REQUIRE(block);
  CHECK(block->planes == 4);
  CHECK(block->plane_stride == 30);
  CHECK(offsets(*block) == offsets({4, 2, 2}, {30, 6, 1}));
  // 4 planes of 2 rows: 2 calls, one per row, each running down the 4 planes.
  PitchedCalls calls = pitched_calls(*block);
  CHECK(calls.calls == 2);
  CHECK(calls.rows == 4);
  CHECK(calls.row_pitch == 30);
  CHECK(calls.src_row_pitch == 4);
}

TEST_CASE("pitched_view: views it cannot describe") {
  CHECK_FALSE(pitched_view({4, 3, 2, 2}, {100, 20, 6, 1}));  // four levels
  CHECK_FALSE(pitched_view({3, 4}, {1, 3}));                  // transposed: rows overlap
  CHECK_FALSE(pitched_view({3, 4}, {2, 1}));                  // rows overlap
  CHECK_FALSE(pitched_view({3, 4}, {0, 1}));                  // broadcast
  CHECK_FALSE(pitched_view({0, 4}, {4, 1}));                  // empty
}

TEST_CASE("pitched_view: random slices of random tensors write exactly the view's elements") {
  std::mt19937 rng(7);
  auto pick = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  int described = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    const int rank = static_cast<int>(pick(1, 4));
    Shape base = Shape::filled(rank, 1);
    for (int d = 0; d < rank; ++d) base[d] = pick(1, 6);
    Strides base_strides = contiguous(base);
    Shape shape = Shape::filled(rank, 1);
    Strides strides = Strides::filled(rank, 1);
    for (int d = 0; d < rank; ++d) {  // x[start : start + n * step : step] along each dim
      const int64_t step = pick(1, 2), start = pick(0, base[d] - 1);
      shape[d] = std::max<int64_t>(1, (base[d] - start + step - 1) / step - pick(0, 1));
      strides[d] = base_strides[d] * step;
    }
    std::optional<PitchedView> v = pitched_view(shape, strides);
    if (!v) continue;
    ++described;
    INFO("shape " << to_string(shape) << " strides " << to_string(strides));
    CHECK(offsets(*v) == offsets(shape, strides));
    // The driver calls write element i of the contiguous source to the view's element i,
    // in as few calls as planes or rows.
    std::vector<int64_t> view = offsets(shape, strides);
    std::vector<std::pair<int64_t, int64_t>> pairs = copied(*v);
    REQUIRE(pairs.size() == view.size());
    bool same = true;
    for (auto [d, src] : pairs) same &= view.at(src) == d;
    CHECK(same);
    CHECK(pitched_calls(*v).calls == std::min(v->planes, v->height));
  }
  CHECK(described > 1000);
}
