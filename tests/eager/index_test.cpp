// cat / stack / split / chunk and the index ops, with known values.
#include <catch2/catch.hpp>
#include <functional>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "backends/cpu/parallel.h"
#include "error_of.h"
#include "kiln/kiln.h"

using namespace kiln;

namespace {
using F = std::vector<float>;
using L = std::vector<int64_t>;

// The kiln::Error message of running fn, or "" if it did not throw.
template <class Fn> std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.message();
  }
  return "";
}
}  // namespace

TEST_CASE("cat along dims, promotion, strided and empty inputs") {
  Tensor a = tensor({{1.f, 2.f}, {3.f, 4.f}});
  Tensor b = tensor({{5.f, 6.f}});
  Tensor c0 = cat({a, b}, 0);
  CHECK(c0.shape() == Shape{3, 2});
  CHECK(c0.to_vector<float>() == F{1, 2, 3, 4, 5, 6});
  Tensor col = tensor({{7.f}, {8.f}});
  Tensor c1 = cat({a, col}, -1);
  CHECK(c1.shape() == Shape{2, 3});
  CHECK(c1.to_vector<float>() == F{1, 2, 7, 3, 4, 8});
  // int32 + float32 promotes; a transposed input is read through its strides.
  Tensor ints = tensor({{10, 20}, {30, 40}});
  Tensor mixed = cat({a.t(), ints}, 1);
  CHECK(mixed.dtype() == DType::Float32);
  CHECK(mixed.to_vector<float>() == F{1, 3, 10, 20, 2, 4, 30, 40});
  // Empty inputs contribute nothing.
  Tensor e = cat({zeros({0, 2}), a, zeros({0, 2})}, 0);
  CHECK(e.to_vector<float>() == F{1, 2, 3, 4});
  CHECK(cat({zeros({0, 2}), zeros({0, 2})}, 0).shape() == Shape{0, 2});
  // 3-D along the middle dim.
  Tensor x = arange(8).view({2, 2, 2}), y = arange(8, 12).view({2, 1, 2});
  CHECK(cat({x, y}, 1).to_vector<int64_t>() == L{0, 1, 2, 3, 8, 9, 4, 5, 6, 7, 10, 11});
  // bool
  CHECK(cat({tensor({true}), tensor({false, true})}).to_vector<bool>() ==
        std::vector<bool>{true, false, true});
  std::string msg = error_of([&] { cat({a, tensor({{1.f, 2.f, 3.f}})}, 0); });
  CHECK_THAT(msg, Catch::Contains("[2, 2]") && Catch::Contains("[1, 3]"));
  CHECK_THROWS_AS(cat({scalar_tensor(1.f)}), Error);
  CHECK_THROWS_AS(cat({}), Error);
  CHECK_THROWS_AS(cat({a, b}, 2), Error);
}

TEST_CASE("cat accepts PyTorch's legacy 1-D empty tensor beside tensors of any rank") {
  // PyTorch 1.13: cat([empty(0), x]) == x for 2-D x along either dim; the empty one takes part
  // in type promotion (float64 here) and gets an empty gradient.
  Tensor x = arange(6, DType::Float32).view({2, 3}).requires_grad_();
  Tensor e = empty({0}, DType::Float64).requires_grad_();
  Tensor r0 = cat({e, x}, 0), r1 = cat({x, e}, -1);
  CHECK(r0.shape() == Shape{2, 3});
  CHECK(r1.shape() == Shape{2, 3});
  CHECK(r0.dtype() == DType::Float64);
  CHECK(r0.to_vector<double>() == std::vector<double>{0, 1, 2, 3, 4, 5});
  CHECK(r1.to_vector<double>() == std::vector<double>{0, 1, 2, 3, 4, 5});
  sum(r0 * 2).backward();
  CHECK(x.grad().to_vector<float>() == F(6, 2.f));
  REQUIRE(e.grad().defined());
  CHECK(e.grad().shape() == Shape{0});
  // Out-of-range dims are still reported against the non-empty tensors' rank.
  CHECK_THAT(error_of([&] { cat({e, x}, 2); }), Catch::Contains("dim 2") && Catch::Contains("[-2, 1]"));
}

TEST_CASE("stack past the rank limit names stack") {
  // Found by a fresh-user trial: the error named kiln::unsqueeze, which stack calls.
  Tensor x = ones({1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2});
  try {
    stack({x, x});
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(e.op() == "stack");
    CHECK_THAT(e.message(), Catch::Contains("rank 13"));
  }
}

TEST_CASE("stack, split and chunk values") {
  Tensor a = tensor({1, 2, 3}), b = tensor({4, 5, 6});
  Tensor s0 = stack({a, b});
  CHECK(s0.shape() == Shape{2, 3});
  CHECK(s0.to_vector<int32_t>() == std::vector<int32_t>{1, 2, 3, 4, 5, 6});
  Tensor s1 = stack({a, b}, 1);
  CHECK(s1.shape() == Shape{3, 2});
  CHECK(s1.to_vector<int32_t>() == std::vector<int32_t>{1, 4, 2, 5, 3, 6});
  CHECK_THROWS_AS(stack({a, tensor({1, 2})}), Error);

  Tensor r = arange(7);
  std::vector<Tensor> parts = split(r, 3);
  REQUIRE(parts.size() == 3);
  CHECK(parts[0].to_vector<int64_t>() == L{0, 1, 2});
  CHECK(parts[1].to_vector<int64_t>() == L{3, 4, 5});
  CHECK(parts[2].to_vector<int64_t>() == L{6});
  std::vector<Tensor> sized = split(r, std::vector<int64_t>{2, 0, 5});
  REQUIRE(sized.size() == 3);
  CHECK(sized[0].to_vector<int64_t>() == L{0, 1});
  CHECK(sized[1].numel() == 0);
  CHECK(sized[2].to_vector<int64_t>() == L{2, 3, 4, 5, 6});
  CHECK_THROWS_AS(split(r, std::vector<int64_t>{2, 2}), Error);
  std::vector<Tensor> ch = chunk(r, 3);
  REQUIRE(ch.size() == 3);
  CHECK(ch[0].to_vector<int64_t>() == L{0, 1, 2});
  CHECK(ch[2].to_vector<int64_t>() == L{6});
  Tensor m = arange(6).view({2, 3});
  std::vector<Tensor> cols = chunk(m, 2, 1);
  REQUIRE(cols.size() == 2);
  CHECK(cols[0].to_vector<int64_t>() == L{0, 1, 3, 4});
  CHECK(cols[1].to_vector<int64_t>() == L{2, 5});
  // An empty dim gives `chunks` empty pieces, as PyTorch's chunk does.
  std::vector<Tensor> empty_parts = chunk(zeros({2, 0}), 4, 1);
  REQUIRE(empty_parts.size() == 4);
  for (const Tensor& p : empty_parts) CHECK(p.shape() == Shape{2, 0});
  // Chunk counts near INT64_MAX (a break-it pass: size + chunks - 1 overflowed and split
  // raised for a size of 0; an empty dim's 2^40 pieces were a std::bad_alloc).
  std::vector<Tensor> many = chunk(m, INT64_MAX, 1);
  REQUIRE(many.size() == 3);
  CHECK(many[2].to_vector<int64_t>() == L{2, 5});
  CHECK_THROWS_WITH(chunk(zeros({0}), int64_t{1} << 40),
                    Catch::Contains("chunk") && Catch::Contains("1099511627776 chunks"));
  // Split size 0 is allowed for an empty dim only, as in PyTorch (review).
  std::vector<Tensor> zero_split = split(zeros({0, 3}), 0, 0);
  REQUIRE(zero_split.size() == 1);
  CHECK(zero_split[0].shape() == Shape{0, 3});
  CHECK_THROWS_WITH(split(m, 0, 1), Catch::Contains("split size must be positive"));
  CHECK_THROWS_WITH(split(scalar_tensor(1.0), 1), Catch::Contains("0-d"));
  // chunk and split by sizes name themselves and the caller's line too (review: kiln::size at
  // eager/ops.cpp).
  for (const auto& [op, call] : std::vector<std::pair<std::string, std::function<void()>>>{
           {"chunk", [] { chunk(scalar_tensor(1.0), 1); }},
           {"split", [] { split(scalar_tensor(1.0), std::vector<int64_t>{1}); }}}) {
    const Error e = kiln::testing::error_of(call);
    CHECK(e.op() == op);
    CHECK(std::string(e.what()).find("0-d") != std::string::npos);
    CHECK(std::string(e.where().file_name()).find("index_test.cpp") != std::string::npos);
  }
  // split then cat is the identity.
  CHECK(cat(split(m, 1, 1), 1).to_vector<int64_t>() == L{0, 1, 2, 3, 4, 5});
}

TEST_CASE("index_select") {
  Tensor x = arange(12).view({3, 4});
  CHECK(index_select(x, 0, tensor({2, 0}, {Int64})).to_vector<int64_t>() ==
        L{8, 9, 10, 11, 0, 1, 2, 3});
  Tensor cols = index_select(x, 1, tensor({3, 1, 1}));  // int32 index
  CHECK(cols.shape() == Shape{3, 3});
  CHECK(cols.to_vector<int64_t>() == L{3, 1, 1, 7, 5, 5, 11, 9, 9});
  CHECK(index_select(x, -1, tensor({3})).to_vector<int64_t>() == L{3, 7, 11});
  // 0-d index keeps the dim with size 1; an empty index gives an empty dim.
  Tensor one = index_select(x, 0, scalar_tensor(1, {Int64}));
  CHECK(one.shape() == Shape{1, 4});
  CHECK(one.to_vector<int64_t>() == L{4, 5, 6, 7});
  CHECK(index_select(x, 0, zeros({0}, {Int64})).shape() == Shape{0, 4});
  // Transposed input and a strided index.
  Tensor xt = x.t();  // [4, 3]
  Tensor idx = tensor({2, 9, 0, 9}, {Int64}).slice(0, 0, 4, 2);  // [2, 0]
  CHECK(index_select(xt, 0, idx).to_vector<int64_t>() == L{2, 6, 10, 0, 4, 8});
  CHECK(index_select(xt, 1, idx).to_vector<int64_t>() == L{8, 0, 9, 1, 10, 2, 11, 3});
  // 0-d input.
  CHECK(index_select(scalar_tensor(5.f), 0, tensor({0})).item<float>() == 5.f);

  std::string msg = error_of([&] { index_select(x, 0, tensor({1, 3})); });
  CHECK_THAT(msg, Catch::Contains("index 3") && Catch::Contains("size 3"));
  msg = error_of([&] { index_select(x, 1, tensor({-1}, {Int64})); });
  CHECK_THAT(msg, Catch::Contains("index -1") && Catch::Contains("negative"));
  CHECK_THROWS_AS(index_select(x, 0, tensor({0.f})), Error);           // float index
  CHECK_THROWS_AS(index_select(x, 0, tensor({{0, 1}}, {Int64})), Error);  // 2-D index
  CHECK_THROWS_AS(index_select(x, 2, tensor({0})), Error);
}

TEST_CASE("FC-19: index_select with a repeated index") {
  Tensor y = tensor({{1.f, 1.f}, {5.f, 5.f}});
  Tensor idx = tensor({0, 0}, {Int64});
  Tensor z = y.index_select(0, idx);
  CHECK(z.shape() == Shape{2, 2});
  CHECK(z.to_vector<float>() == F{1, 1, 1, 1});
  CHECK(y.to_vector<float>() == F{1, 1, 5, 5});  // the input is untouched
}

TEST_CASE("gather") {
  Tensor x = tensor({{1, 2}, {3, 4}});
  CHECK(gather(x, 1, tensor({{0, 0}, {1, 0}}, {Int64})).to_vector<int32_t>() ==
        std::vector<int32_t>{1, 1, 4, 3});
  CHECK(gather(x, 0, tensor({{1, 0}, {0, 0}}, {Int64})).to_vector<int32_t>() ==
        std::vector<int32_t>{3, 2, 1, 2});
  // Index smaller than the input in the other dims; int32 index; transposed input.
  Tensor m = arange(9, {Float32}).view({3, 3});
  Tensor g = gather(m, 1, tensor({{0}, {2}}));
  CHECK(g.shape() == Shape{2, 1});
  CHECK(g.to_vector<float>() == F{0, 5});
  CHECK(gather(m.t(), 1, tensor({{2, 1}, {0, 0}})).to_vector<float>() == F{6, 3, 1, 1});
  // More index entries along dim than the input has.
  CHECK(gather(tensor({7.f, 8.f}), 0, tensor({1, 1, 0, 1})).to_vector<float>() == F{8, 8, 7, 8});
  CHECK(gather(x, 0, zeros({0, 2}, {Int64})).shape() == Shape{0, 2});

  std::string msg = error_of([&] { gather(x, 1, tensor({{0, 2}, {0, 0}})); });
  CHECK_THAT(msg, Catch::Contains("index 2") && Catch::Contains("size 2"));
  CHECK_THROWS_AS(gather(x, 1, tensor({{-1, 0}, {0, 0}})), Error);
  CHECK_THROWS_AS(gather(x, 1, tensor({0, 1})), Error);  // rank mismatch
}

TEST_CASE("embedding") {
  Tensor w = arange(8, {Float32}).view({4, 2});
  Tensor e = embedding(w, tensor({{3, 0}, {1, 1}}, {Int64}));
  CHECK(e.shape() == Shape{2, 2, 2});
  CHECK(e.to_vector<float>() == F{6, 7, 0, 1, 2, 3, 2, 3});
  CHECK(embedding(w, scalar_tensor(2, {Int64})).to_vector<float>() == F{4, 5});
  CHECK(embedding(w, tensor({2})).shape() == Shape{1, 2});  // int32 indices
  CHECK(embedding(w, zeros({0}, {Int64})).shape() == Shape{0, 2});
  // A transposed table.
  Tensor wt = arange(8, {Float32}).view({2, 4}).t();  // [4, 2]: rows (0,4), (1,5), ...
  CHECK(embedding(wt, tensor({3, 1})).to_vector<float>() == F{3, 7, 1, 5});
  std::string msg = error_of([&] { embedding(w, tensor({0, 4})); });
  CHECK_THAT(msg, Catch::Contains("index 4") && Catch::Contains("size 4"));
  CHECK_THROWS_AS(embedding(w, tensor({-2})), Error);
  CHECK_THROWS_AS(embedding(arange(4, {Float32}), tensor({0})), Error);
}

TEST_CASE("one_hot") {
  Tensor o = one_hot(tensor({0, 2, 1}, {Int64}), 3);
  CHECK(o.dtype() == DType::Int64);
  CHECK(o.shape() == Shape{3, 3});
  CHECK(o.to_vector<int64_t>() == L{1, 0, 0, 0, 0, 1, 0, 1, 0});
  Tensor o2 = one_hot(tensor({{1, 0}, {1, 1}}, {Int64}).t(), 2);  // [[1, 1], [0, 1]], strided
  CHECK(o2.shape() == Shape{2, 2, 2});
  CHECK(o2.to_vector<int64_t>() == L{0, 1, 0, 1, 1, 0, 0, 1});
  CHECK(one_hot(scalar_tensor(1, {Int64}), 4).to_vector<int64_t>() == L{0, 1, 0, 0});
  std::string msg = error_of([&] { one_hot(tensor({0, 3}, {Int64}), 3); });
  CHECK_THAT(msg, Catch::Contains("index 3") && Catch::Contains("3"));
  CHECK_THROWS_AS(one_hot(tensor({-1}, {Int64}), 3), Error);
  CHECK_THROWS_AS(one_hot(tensor({0}), 3), Error);  // int32 rejected, as in PyTorch
}

TEST_CASE("masked_fill") {
  Tensor x = tensor({{1.f, 2.f}, {3.f, 4.f}});
  Tensor col_mask = tensor({true, false});  // broadcast over rows: column 0
  CHECK(masked_fill(x, col_mask, 9.f).to_vector<float>() == F{9, 2, 9, 4});
  Tensor row_mask = tensor({{false}, {true}});
  CHECK(masked_fill(x, row_mask, -1).to_vector<float>() == F{1, 2, -1, -1});
  CHECK(masked_fill(x.t(), tensor({{true, false}, {false, false}}), 0.5)
            .to_vector<float>() == F{0.5, 3, 2, 4});
  CHECK(masked_fill(tensor({1, 2, 3}, {Int64}), tensor({false, true, true}), 7)
            .to_vector<int64_t>() == L{1, 7, 7});
  CHECK(masked_fill(x, scalar_tensor(true), 0).to_vector<float>() == F{0, 0, 0, 0});
  CHECK(x.to_vector<float>() == F{1, 2, 3, 4});
  CHECK_THROWS_AS(masked_fill(x, tensor({1, 0}), 0), Error);                  // not bool
  // A larger mask broadcasts x (PyTorch 1.13: [[0, 2], [0, 0]]), gradients sum back.
  Tensor v = tensor({1.0, 2.0}).requires_grad_();
  Tensor y = masked_fill(v, tensor({{true, false}, {true, true}}), 0);
  CHECK(y.shape() == Shape{2, 2});
  CHECK(y.to_vector<double>() == std::vector<double>{0, 2, 0, 0});
  y.sum().backward();
  CHECK(v.grad().to_vector<double>() == std::vector<double>{0, 1});
  CHECK_THROWS_WITH(masked_fill(tensor({1.f, 2.f}), tensor({true, false, true}), 0),
                    Catch::Contains("masked_fill"));  // shapes that do not broadcast
}

TEST_CASE("tril and triu") {
  Tensor x = arange(1, 13).view({3, 4});
  // 1 2 3 4 / 5 6 7 8 / 9 10 11 12
  CHECK(tril(x).to_vector<int64_t>() == L{1, 0, 0, 0, 5, 6, 0, 0, 9, 10, 11, 0});
  CHECK(tril(x, 1).to_vector<int64_t>() == L{1, 2, 0, 0, 5, 6, 7, 0, 9, 10, 11, 12});
  CHECK(tril(x, -1).to_vector<int64_t>() == L{0, 0, 0, 0, 5, 0, 0, 0, 9, 10, 0, 0});
  CHECK(triu(x).to_vector<int64_t>() == L{1, 2, 3, 4, 0, 6, 7, 8, 0, 0, 11, 12});
  CHECK(triu(x, 2).to_vector<int64_t>() == L{0, 0, 3, 4, 0, 0, 0, 8, 0, 0, 0, 0});
  CHECK(triu(x, -1).to_vector<int64_t>() == L{1, 2, 3, 4, 5, 6, 7, 8, 0, 10, 11, 12});
  CHECK(tril(x, -5).to_vector<int64_t>() == L(12, 0));
  CHECK(triu(x, 10).to_vector<int64_t>() == L(12, 0));
  // Batched and transposed.
  Tensor b = arange(8, {Float32}).view({2, 2, 2});
  CHECK(tril(b).to_vector<float>() == F{0, 0, 2, 3, 4, 0, 6, 7});
  CHECK(triu(b.transpose(1, 2)).to_vector<float>() == F{0, 2, 0, 3, 4, 6, 0, 7});
  CHECK(tril(ones({2, 2}, {Bool})).to_vector<bool>() == std::vector<bool>{true, false, true, true});
  CHECK(tril(zeros({0, 3})).shape() == Shape{0, 3});
  CHECK_THROWS_AS(tril(arange(3)), Error);
}

TEST_CASE("tril / triu of matrices with no columns are empty, not a division by zero") {
  // Was SIGFPE (rows of all matrices = numel / cols with cols 0); PyTorch returns the input.
  for (Shape s : {Shape{3, 0}, Shape{2, 3, 0}, Shape{0, 3}, Shape{0, 0}}) {
    CHECK(tril(zeros(s)).shape() == s);
    CHECK(triu(zeros(s), 1).shape() == s);
  }
}

TEST_CASE("arange with floating bounds into an integer dtype truncates start and step first") {
  // PyTorch 1.13's values (a break-it pass: each double value was truncated instead).
  using I = std::vector<int64_t>;
  CHECK(arange(-2.5, 2.5, 1.5, kiln::Int64).to_vector<int64_t>() == I{-2, -1, 0, 1});
  CHECK(arange(0, 5, 1.5, kiln::Int32).to_vector<int32_t>() == std::vector<int32_t>{0, 1, 2, 3});
  CHECK_THROWS_WITH(arange(0, 2.5, 0.5, kiln::Int64),
                    Catch::Contains("step 0.5 is 0 in int64"));
  // Floating dtypes and integer bounds are as before.
  CHECK(arange(0, 2.5, 0.5).to_vector<float>() == F{0, 0.5f, 1, 1.5f, 2});
  CHECK(arange(1, 7, 2, kiln::Float32).to_vector<float>() == F{1, 3, 5});
}

TEST_CASE("linspace and floating arange raise for values an integer dtype cannot hold") {
  // A break-it pass: linspace(0, 1e10, 3, int32) gave [0, INT_MIN, INT_MIN] and a NaN end
  // INT_MIN everywhere (undefined conversions); PyTorch raises, as kiln's full() does.
  CHECK_THROWS_WITH(linspace(0, 1e10, 3, kiln::Int32),
                    Catch::Contains("linspace") && Catch::Contains("10000000000") &&
                        Catch::Contains("cannot be converted to int32"));
  CHECK_THROWS_WITH(linspace(0, NAN, 3, kiln::Int64), Catch::Contains("cannot be converted"));
  CHECK_THROWS_WITH(linspace(-9.3e18, 9.3e18, 3, kiln::Int64),
                    Catch::Contains("cannot be converted to int64"));
  CHECK_THROWS_WITH(arange(-1e19, -1e19 + 2e6, 1e6, kiln::Int64),
                    Catch::Contains("arange") && Catch::Contains("cannot be converted"));
  // In range, and no steps, are as before.
  CHECK(linspace(0, 1e9, 3, kiln::Int32).to_vector<int32_t>() ==
        std::vector<int32_t>{0, 500000000, 1000000000});
  CHECK(linspace(0, 1e10, 0, kiln::Int32).numel() == 0);
  CHECK(linspace(0, 1e10, 2).to_vector<float>() == F{0, 1e10f});
}

TEST_CASE("tril, triu, arange and slice with extreme integers (no overflow)") {
  Tensor x = ones({3, 3});
  CHECK(tril(x, INT64_MAX).sum().item<double>() == 9);  // was 0: i + diag + 1 wrapped
  CHECK(tril(x, INT64_MAX - 1).sum().item<double>() == 9);
  CHECK(tril(x, INT64_MIN).sum().item<double>() == 0);
  CHECK(triu(x, INT64_MAX).sum().item<double>() == 0);
  CHECK(triu(x, INT64_MIN).sum().item<double>() == 9);
  CHECK(triu(x, -1).sum().item<double>() == 8);  // an ordinary diagonal still counts
  CHECK(arange(0, 10, INT64_MAX).to_vector<int64_t>() == std::vector<int64_t>{0});
  CHECK(arange(10, 0, INT64_MIN).to_vector<int64_t>() == std::vector<int64_t>{10});
  CHECK(arange(INT64_MAX - 2, INT64_MAX, 1).to_vector<int64_t>() ==
        std::vector<int64_t>{INT64_MAX - 2, INT64_MAX - 1});
  CHECK(arange(7, 0, -3).to_vector<int64_t>() == std::vector<int64_t>{7, 4, 1});
  CHECK_THROWS_WITH(arange(INT64_MIN, INT64_MAX, 1), Catch::Contains("too many elements"));
  CHECK_THROWS_WITH(arange(0.0, 1e300, 1.0), Catch::Contains("too many elements"));
  Tensor s = x.slice(1, 0, 3, INT64_MAX);  // was "negative size -1"
  CHECK(s.shape() == Shape{3, 1});
  CHECK(x.slice(1, 1, INT64_MAX, INT64_MAX).shape() == Shape{3, 1});
  CHECK(arange(10).slice(0, 2, 9, 3).to_vector<int64_t>() == std::vector<int64_t>{2, 5, 8});
}

TEST_CASE("bad indices: the first one in the index's order is named, any layout, int32/int64") {
  Tensor x = arange(12, {DType::Float32}).view({3, 4});
  for (DType it : {DType::Int64, DType::Int32}) {
    // Row-major order of the index: 9 (row 0) comes before -2 (row 1).
    Tensor idx = tensor({{0, 1, 9}, {-2, 0, 1}}).to(it);
    CHECK_THROWS_WITH(gather(x, 1, idx), Catch::Contains("index 9 is out of range for dim 1 of "
                                                         "size 4"));
    // Transposed (strided) index: its first row is [0, -2].
    CHECK_THROWS_WITH(gather(x, 1, idx.t()),
                      Catch::Contains("index -2 is out of range for dim 1 of size 4"));
    CHECK_THROWS_WITH(index_select(x, 0, tensor({0, 2, 3, 5}).to(it)),
                      Catch::Contains("index 3 is out of range for dim 0 of size 3"));
    // A long valid index (several vector widths, a tail) passes and gathers the right values.
    Tensor ok = (arange(2 * 37, {DType::Int64}) % 4).view({2, 37}).to(it);
    Tensor wide = arange(8, {DType::Float32}).view({2, 4});
    CHECK(equal(gather(wide, 1, ok), ok.to(DType::Float32) + tensor({{0.f}, {4.f}})));
  }
}

TEST_CASE("one_hot: num_classes inferred from the largest index must fit int64") {
  const int64_t big = std::numeric_limits<int64_t>::max();
  CHECK_THROWS_WITH(one_hot(tensor({big}).to(DType::Int64)),
                    Catch::Contains("the largest index 9223372036854775807 leaves no "
                                    "num_classes"));
  CHECK(one_hot(tensor({0, 2}).to(DType::Int64)).shape() == Shape{2, 3});
}

// Break-it pass: scatter_add / index_add named the op's dim whichever dim did not fit, and
// max / min of a bool tensor described an int32 copy of it.
TEST_CASE("shape errors name the dim that does not fit and the user's dtype") {
  const Tensor input = zeros({2, 3});
  std::string msg = error_of([&] { scatter_add(input, 1, zeros({5, 2}, {Int64}), ones({5, 2})); });
  CHECK_THAT(msg, Catch::Contains("index's size in dim 0 (5) exceeds the input's (2)"));
  msg = error_of([&] { scatter_add(input, 1, zeros({2, 4}, {Int64}), ones({2, 3})); });
  CHECK_THAT(msg, Catch::Contains("index's size in dim 1 (4) exceeds the source's (3)"));
  msg = error_of([&] { index_add(input, 0, from_vector<int64_t>({1}, {1}), ones({1, 2})); });
  CHECK_THAT(msg, Catch::Contains("source's size in dim 1 must be 3 (the input's), got 2"));
  msg = error_of([&] { index_add(input, 0, from_vector<int64_t>({1, 0}, {2}), ones({3, 3})); });
  CHECK_THAT(msg, Catch::Contains("source's size in dim 0 must be 2 (the index's length)"));
  for (bool is_max : {true, false}) {
    const Tensor b = zeros({0, 3}, {Bool});
    msg = error_of([&] { is_max ? max(b, 0) : min(b, 0); });
    CHECK_THAT(msg, Catch::Contains("got bool [0, 3]") && !Catch::Contains("int32"));
    msg = error_of([&] { is_max ? max(b, 5) : min(b, 5); });
    CHECK_THAT(msg, Catch::Contains("dim 5 out of range") && !Catch::Contains("int32"));
  }
  // Still right where they fit: a bool max per row, index_add of two rows.
  CHECK(max(tensor({{0, 1}, {0, 0}}, {Bool}), 1).values.to_vector<bool>() ==
        std::vector<bool>{true, false});
  CHECK(index_add(input, 0, from_vector<int64_t>({1, 0}, {2}), ones({2, 3})).sum().item<float>() ==
        6.f);
}

TEST_CASE("index_select and embedding of tables read across their memory order: every element") {
  // Sources whose elements along the output's last dim lie a cache line or more apart go a
  // block of output columns at a time (backends/cpu/index.cpp, take_in_column_blocks): a
  // transposed table (its rows are columns of memory), a step-sliced one, index_select along
  // the last dim of a transposed source. Sizes that are not multiples of a block, repeated
  // indices, 1-, 4- and 8-byte elements (blocks of 64, 16 and 8 columns); values by index
  // arithmetic, at 1 and 2 threads.
  const int64_t rows = 300, cols = 157, picks = 250;
  std::vector<int64_t> pick;
  for (int64_t i = 0; i < picks; ++i) pick.push_back(i * 37 % rows);
  const Tensor index = from_vector(pick, {picks});
  const int saved = cpu::num_threads();
  for (int threads : {1, 2}) {
    cpu::set_num_threads(threads);
    for (DType t : {DType::Float32, DType::Float64, DType::Int32, DType::Bool}) {
      // table[r][c] = (r * cols + c) % 101 (as bool: whether it is not 0), stored transposed.
      auto value = [&](int64_t v) -> int64_t { return t == DType::Bool ? v != 0 : v; };
      Tensor flat = arange(rows * cols, DType::Int64) % 101;
      Tensor table = flat.view({rows, cols}).t().contiguous().to(t).t();  // [rows, cols]
      REQUIRE(table.stride(1) == rows);
      std::vector<int64_t> want;
      for (int64_t i : pick)
        for (int64_t c = 0; c < cols; ++c) want.push_back(value((i * cols + c) % 101));
      CHECK(index_select(table, 0, index).to(DType::Int64).to_vector<int64_t>() == want);
      CHECK(embedding(table, index.view({10, 25})).to(DType::Int64).to_vector<int64_t>() == want);
      // Every other row of a twice-as-long transposed table (the row step 2 * 300 elements).
      Tensor doubled = stack({table, table}, 1).view({2 * rows, cols});  // each row twice
      Tensor wide = doubled.t().contiguous().t().slice(0, 0, 2 * rows, 2);
      CHECK(index_select(wide, 0, index).to(DType::Int64).to_vector<int64_t>() == want);
      // Along the last dim: out[r][j] = table[r][pick'[j]], the index stepping whole columns.
      std::vector<int64_t> col_pick, want_cols;
      for (int64_t j = 0; j < 140; ++j) col_pick.push_back(j * 11 % cols);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c : col_pick) want_cols.push_back(value((r * cols + c) % 101));
      CHECK(index_select(table, 1, from_vector(col_pick, {140})).to(DType::Int64)
                .to_vector<int64_t>() == want_cols);
    }
  }
  cpu::set_num_threads(saved);
}

namespace {
// x with src added at index along dim 0 of a 2-D x, one element at a time in index order
// (float32 sums, the order fixing every bit).
std::vector<float> scatter_add_by_hand(std::vector<float> x, int64_t x_cols,
                                       const std::vector<int64_t>& idx, int64_t idx_cols,
                                       const std::vector<float>& src, int64_t src_cols) {
  const int64_t idx_rows = static_cast<int64_t>(idx.size()) / idx_cols;
  for (int64_t i = 0; i < idx_rows; ++i)
    for (int64_t j = 0; j < idx_cols; ++j)
      x[static_cast<size_t>(idx[i * idx_cols + j] * x_cols + j)] +=
          src[static_cast<size_t>(i * src_cols + j)];
  return x;
}
}  // namespace

TEST_CASE("scatter_add and index_add in parallel: index-order sums, the same bits at any thread "
          "count") {
  // The kernels split the dims other than the indexed one across threads, each output element
  // summed by one thread in index order (backends/cpu/scatter.cpp). Float32 sums of values
  // that round differently in another order, repeated indices, an index smaller than the
  // source and the input, a transposed source and index, a middle dim; against sums by hand.
  const int64_t x_rows = 37, x_cols = 1000, idx_rows = 100, idx_cols = 900, src_cols = 1000;
  std::vector<float> x0(x_rows * x_cols), src(120 * src_cols);
  for (size_t i = 0; i < x0.size(); ++i) x0[i] = static_cast<float>(i % 7) * 0.1f;
  for (size_t i = 0; i < src.size(); ++i) src[i] = 1.f / static_cast<float>(i % 97 + 3);
  std::vector<int64_t> idx(idx_rows * idx_cols);
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = static_cast<int64_t>((i * 7919 + i / 13) % 37);
  const std::vector<float> want =
      scatter_add_by_hand(x0, x_cols, idx, idx_cols, src, src_cols);
  Tensor x = from_vector(x0, {x_rows, x_cols});
  Tensor s = from_vector(src, {120, src_cols});
  Tensor ix = from_vector(idx, {idx_rows, idx_cols});
  // Along the last dim: the same sums with x, index and source transposed.
  Tensor xt = x.t().contiguous(), st = s.t().contiguous(), it = ix.t().contiguous();
  // index_add along the middle dim of [4, 37, 250]: rows r of source slice k go to idx1[k].
  std::vector<int64_t> idx1;
  for (int64_t k = 0; k < 150; ++k) idx1.push_back(k * 5 % 37);
  Tensor x3 = from_vector(std::vector<float>(x0.begin(), x0.begin() + 4 * 37 * 250), {4, 37, 250});
  std::vector<float> s3_values(4 * 150 * 250);
  for (size_t i = 0; i < s3_values.size(); ++i) s3_values[i] = 1.f / static_cast<float>(i % 89 + 2);
  Tensor s3 = from_vector(s3_values, {4, 150, 250});
  std::vector<float> want3 = x3.to_vector<float>();
  const std::vector<float> s3v = s3.to_vector<float>();
  for (int64_t a = 0; a < 4; ++a)
    for (int64_t k = 0; k < 150; ++k)
      for (int64_t c = 0; c < 250; ++c)
        want3[static_cast<size_t>((a * 37 + idx1[k]) * 250 + c)] +=
            s3v[static_cast<size_t>((a * 150 + k) * 250 + c)];
  const int saved = cpu::num_threads();
  for (int threads : {1, 2, 3}) {
    cpu::set_num_threads(threads);
    CHECK(scatter_add(x, 0, ix, s).to_vector<float>() == want);
    CHECK(scatter_add(xt, 1, it, st).t().contiguous().to_vector<float>() == want);
    CHECK(scatter_add(xt.t(), 0, it.t(), st.t()).to_vector<float>() == want);  // transposed
    CHECK(index_add(x3, 1, from_vector(idx1, {150}), s3).to_vector<float>() == want3);
    CHECK(index_add(x3, 1, from_vector(idx1, {150}).to(DType::Int32), s3).to_vector<float>() ==
          want3);
  }
  cpu::set_num_threads(saved);
  // Integers and bool (a logical or), exact by construction.
  Tensor counts =
      scatter_add(zeros({37, 900}, {DType::Int64}), 0, ix, ones({100, 900}, {DType::Int64}));
  std::vector<int64_t> want_counts(37 * 900, 0);
  for (size_t i = 0; i < idx.size(); ++i)
    ++want_counts[static_cast<size_t>(idx[i] * 900 + i % 900)];
  CHECK(counts.to_vector<int64_t>() == want_counts);
  Tensor hit = scatter_add(zeros({37, 900}, {DType::Bool}), 0, ix, ones({100, 900}, {DType::Bool}));
  std::vector<bool> want_hit;
  for (int64_t c : want_counts) want_hit.push_back(c > 0);
  CHECK(hit.to_vector<bool>() == want_hit);
}

namespace {
// index_copy by index arithmetic on [outer, n, inner] blocks around dim d of x's shape: x's
// values, then source slice i written at index[i] in order (the last of a repeated index wins).
std::vector<double> index_copy_by_hand(const Tensor& x, int d, const std::vector<int64_t>& index,
                                       const Tensor& source) {
  std::vector<double> out = x.to(DType::Float64).contiguous().to_vector<double>();
  const std::vector<double> src = source.to(DType::Float64).contiguous().to_vector<double>();
  int64_t outer = 1, inner = 1;
  for (int i = 0; i < d; ++i) outer *= x.shape()[i];
  for (int i = d + 1; i < x.dim(); ++i) inner *= x.shape()[i];
  const int64_t n = x.shape()[d], m = static_cast<int64_t>(index.size());
  for (int64_t a = 0; a < outer; ++a)
    for (int64_t i = 0; i < m; ++i)
      for (int64_t k = 0; k < inner; ++k)
        out[static_cast<size_t>((a * n + index[static_cast<size_t>(i)]) * inner + k)] =
            src[static_cast<size_t>((a * m + i) * inner + k)];
  return out;
}
}  // namespace

TEST_CASE("index_copy writes source's slices at the indices along every dim, the last of a "
          "repeated index winning, at any thread count") {
  manual_seed(11);
  const Tensor x = randn({4, 6, 5});
  const L rows = {5, 0, 3, 0};  // 0 twice: the slice at position 3 wins
  const int saved = cpu::num_threads();
  for (int threads : {1, 2, 3}) {
    cpu::set_num_threads(threads);
    for (int64_t dim : {0, 1, 2, -1, -2}) {
      INFO("threads " << threads << ", dim " << dim);
      const int d = static_cast<int>(dim < 0 ? dim + 3 : dim);
      L index;
      for (int64_t r : rows) index.push_back(r % x.shape()[d]);
      Shape ss = x.shape();
      ss[d] = static_cast<int64_t>(index.size());
      const Tensor source = randn(ss);
      const Tensor i64 = from_vector(index, {static_cast<int64_t>(index.size())});
      const std::vector<double> want = index_copy_by_hand(x, d, index, source);
      CHECK(index_copy(x, dim, i64, source).to(DType::Float64).to_vector<double>() == want);
      CHECK(x.index_copy(dim, i64.to(DType::Int32), source).to(DType::Float64)
                .to_vector<double>() == want);
      // Non-contiguous x and source: a transposed copy of each, read through its strides.
      const Tensor xt = x.transpose(0, 2).contiguous().transpose(0, 2);
      const Tensor st = source.transpose(0, 2).contiguous().transpose(0, 2);
      REQUIRE_FALSE(xt.is_contiguous());
      CHECK(index_copy(xt, dim, i64, st).to(DType::Float64).to_vector<double>() == want);
      // In place: x's own storage, returned as itself.
      Tensor y = x.clone();
      Tensor& same = y.index_copy_(dim, i64, source);
      CHECK(&same == &y);
      CHECK(y.to(DType::Float64).to_vector<double>() == want);
    }
  }
  cpu::set_num_threads(saved);
  // Integers and bool, exact; a large repeated-index copy split across threads.
  const Tensor counts = arange(12, {DType::Int64}).view({3, 4});
  CHECK(index_copy(counts, 1, from_vector<int64_t>({3, 1, 3}, {3}),
                   from_vector<int64_t>({-1, -2, -3, -4, -5, -6, -7, -8, -9}, {3, 3}))
            .to_vector<int64_t>() == L{0, -2, 2, -3, 4, -5, 6, -6, 8, -8, 10, -9});
  CHECK(index_copy(zeros({3}, {Bool}), 0, from_vector<int64_t>({2}, {1}), ones({1}, {Bool}))
            .to_vector<bool>() == std::vector<bool>{false, false, true});
  const Tensor big = zeros({64, 300});
  L many;
  for (int64_t i = 0; i < 200; ++i) many.push_back(i * 7 % 64);
  const Tensor src = randn({200, 300});
  const std::vector<double> want_big = index_copy_by_hand(big, 0, many, src);
  for (int threads : {1, 2, 3}) {
    cpu::set_num_threads(threads);
    CHECK(index_copy(big, 0, from_vector(many, {200}), src).to(DType::Float64)
              .to_vector<double>() == want_big);
    CHECK(index_copy(big.t(), 1, from_vector(many, {200}), src.t()).t().to(DType::Float64)
              .to_vector<double>() == want_big);
  }
  cpu::set_num_threads(saved);
  // 0-size: an empty index leaves x as it is; an empty x along another dim stays empty.
  CHECK(index_copy(x, 1, zeros({0}, {DType::Int64}), zeros({4, 0, 5})).to_vector<float>() ==
        x.to_vector<float>());
  CHECK(index_copy(zeros({0, 3}), 1, from_vector<int64_t>({2}, {1}), zeros({0, 1})).shape() ==
        Shape{0, 3});
  // In place from a source that shares x's storage: the old rows are read (a kernel writing
  // into x directly would copy row 0 twice here, and x's row 0 into both rows of the swap).
  Tensor r = arange(8, {DType::Float32}).view({4, 2});
  void* const storage = r.raw_data();
  r.index_copy_(0, from_vector<int64_t>({1, 2}, {2}), r.slice(0, 0, 2));
  CHECK(r.to_vector<float>() == F{0, 1, 0, 1, 2, 3, 6, 7});
  CHECK(r.raw_data() == storage);
  Tensor swap = arange(4, {DType::Float32}).view({2, 2});  // x itself as the source: a swap
  swap.index_copy_(0, from_vector<int64_t>({1, 0}, {2}), swap);
  CHECK(swap.to_vector<float>() == F{2, 3, 0, 1});
  // A 0-d index writes one slice, as a 1-element one.
  CHECK(index_copy(zeros({3, 2}), 0, scalar_tensor(int64_t{1}, {DType::Int64}), ones({1, 2}))
            .to_vector<float>() == F{0, 0, 1, 1, 0, 0});
}

TEST_CASE("index_copy and index_copy_: errors name the op, the values and the caller's line, "
          "and leave x as it was") {
  const Tensor x = zeros({4, 3});
  const Tensor two = from_vector<int64_t>({0, 2}, {2});
  const auto check = kiln::testing::check_error;
  check([&] { index_copy(x, 2, two, ones({4, 2})); }, "index_copy", "out of range",
        __LINE__ - 1);
  check([&] { index_copy(x, 0, two.view({2, 1}), ones({2, 3})); }, "index_copy",
        "index must be 1-D, got shape [2, 1]", __LINE__ - 1);
  check([&] { index_copy(x, 0, two.to(DType::Float32), ones({2, 3})); }, "index_copy",
        "indices must be int64 or int32, got float32", __LINE__ - 1);
  check([&] { index_copy(x, 0, two, ones({3, 3})); }, "index_copy",
        "source's size in dim 0 must be 2 (the index's length), got 3", __LINE__ - 1);
  check([&] { index_copy(x, 0, two, ones({2, 4})); }, "index_copy",
        "source's size in dim 1 must be 3 (the input's), got 4", __LINE__ - 1);
  check([&] { index_copy(x, 0, two, ones({2, 3}, {DType::Float64})); }, "index_copy",
        "source dtype float64 must match input dtype float32", __LINE__ - 1);
  check([&] { index_copy(x, 0, from_vector<int64_t>({1, 4}, {2}), ones({2, 3})); }, "index_copy",
        "index 4 is out of range for dim 0 of size 4", __LINE__ - 1);
  check([&] { index_copy(x, 1, from_vector<int64_t>({-1}, {1}), ones({4, 1})); }, "index_copy",
        "index -1 is out of range for dim 1 of size 3", __LINE__ - 1);
  Tensor y = zeros({4, 3});
  check([&] { y.index_copy_(0, from_vector<int64_t>({1, 4}, {2}), ones({2, 3})); },
        "index_copy_", "index 4 is out of range for dim 0 of size 4", __LINE__ - 1);
  check([&] { y.index_copy_(0, two, ones({2, 3}, {DType::Int64})); }, "index_copy_",
        "source dtype int64 must match input dtype float32", __LINE__ - 1);
  CHECK(y.to_vector<float>() == F(12, 0.f));
}
