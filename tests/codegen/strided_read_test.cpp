// codegen/strided_read.h: a strided view (a slice, a step, a select, under a transpose) read as
// view ops on the contiguous block of its storage, as eager ops on CUDA tensors pass such
// views to their kernels. Checked on the CPU (and with the GPU loop rewrites emulated) against
// the view's values.
#include <catch2/catch.hpp>

#include "codegen/codegen.h"
#include "codegen/strided_read.h"
#include "kiln/kiln.h"

using namespace kiln;

namespace {

/// The view's contiguous block of storage as a tensor of `block` shape (what the CUDA path
/// passes; `v` lies in a buffer with room after it for the block's last row).
Tensor block_of(const Tensor& v, const Shape& block) {
  auto impl = std::make_shared<TensorImpl>(*v.impl());
  impl->shape = block;
  impl->strides = contiguous_strides(block);
  return Tensor(std::move(impl));
}

/// Compiles block -> view ops -> neg (a kernel reading the view) and checks it against -view.
void check_read(const Tensor& view, bool emulate_gpu) {
  INFO("shape " << to_string(view.shape()) << " strides " << to_string(view.strides()));
  auto read = codegen::strided_read(view.shape(), view.strides());
  REQUIRE(read);
  ir::Graph g;
  ir::Value in = g.input(view.dtype(), read->block.vec());
  g.output(g.op(OpKind::Neg, {codegen::apply_strided_read(g, in, *read)}));
  codegen::CompileOptions o;
  o.disk_cache = false;
  o.emulate_gpu_loops = emulate_gpu;
  Tensor got = codegen::Executable(g, o).run({block_of(view, read->block)}).at(0);
  CHECK(got.shape() == view.shape());
  CHECK(got.to_vector<float>() == neg(view).contiguous().to_vector<float>());
}

/// A tensor of `shape` at the start of a larger buffer (room for a block's last row).
Tensor padded(const Shape& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return arange(2 * n + 64, DType::Float32).slice(0, 0, n).view(shape);
}

}  // namespace

TEST_CASE("strided read: slices, steps, selects and transposes as view ops on a block") {
  Tensor x = padded({4, 6, 10});
  std::vector<Tensor> views = {
      x.slice(1, 1, 6),                          // x[:, 1:]: an LM's shifted logits
      x.slice(2, 0, 9),                          // x[..., :-1]
      x.slice(2, 3, 10, 2),                      // x[..., 3::2]: the last dim's stride is 2
      x.select(2, 4),                            // a column: stride 10, then 60
      x.slice(1, 0, 3).transpose(1, 2),          // sliced, then transposed
      x.slice(2, 2, 5).permute({2, 0, 1}),       // a permuted slice
      x.slice(1, 2, 3),                          // a size-1 dim in the middle
      x.select(1, 5).slice(1, 1, 8).unsqueeze(0)  // size-1 dims around a strided one
  };
  for (const Tensor& v : views) {
    INFO("view " << to_string(v.shape()) << " strides " << to_string(v.strides()));
    REQUIRE_FALSE(v.is_non_overlapping_and_dense());
    check_read(v, false);
    check_read(v, true);
  }
}

TEST_CASE("strided read: the block's shape and ops") {
  // x[:, 1:] of [4, 6, 10]: rows of 60 hold 6 rows of 10, 5 kept; no permute, no extra dim.
  auto r = codegen::strided_read({4, 5, 10}, {60, 10, 1});
  REQUIRE(r);
  CHECK(r->block == Shape({4, 6, 10}));
  CHECK(r->kept == Shape({4, 5, 10}));
  CHECK_FALSE(r->extra_inner);
  // x[..., ::2] of [3, 8]: the smallest stride 2 is an extra inner dim read at 0.
  r = codegen::strided_read({3, 4}, {8, 2});
  REQUIRE(r);
  CHECK(r->block == Shape({3, 4, 2}));
  CHECK(r->extra_inner);
}

TEST_CASE("strided read: overlapping, broadcast, empty and non-nesting views have none") {
  CHECK_FALSE(codegen::strided_read({3, 4}, {0, 1}));     // broadcast
  CHECK_FALSE(codegen::strided_read({3, 4}, {2, 1}));     // rows overlap
  CHECK_FALSE(codegen::strided_read({3, 4}, {10, 3}));    // 10 is not a multiple of 3
  CHECK_FALSE(codegen::strided_read({0, 4}, {8, 1}));     // empty
  CHECK_FALSE(codegen::strided_read({1, 1}, {5, 7}));     // one element
}
