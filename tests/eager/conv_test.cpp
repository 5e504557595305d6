// unfold / fold, conv2d, max_pool2d and avg_pool2d against direct nested-loop references in
// float64 (written here, on copied vectors), their gradients by finite differences, and their
// errors at the caller's line.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <vector>

#include "error_of.h"
#include "gradcheck.h"
#include "kiln/kiln.h"
#include "kiln/nn.h"

using namespace kiln;
using kiln::testing::check_error;
using kiln::testing::gradcheck;
using kiln::testing::uniform;

namespace {

struct Geometry {
  int64_t kh, kw, sh = 1, sw = 1, ph = 0, pw = 0, dh = 1, dw = 1;
};

int64_t positions(int64_t size, int64_t k, int64_t s, int64_t p, int64_t d) {
  return (size + 2 * p - d * (k - 1) - 1) / s + 1;
}

// Direct conv2d of x [n, c, h, w] with weight [o, c/groups, kh, kw] and bias [o] (or none).
std::vector<double> conv_ref(const std::vector<double>& x, const Shape& xs,
                             const std::vector<double>& wt, int64_t o,
                             const std::vector<double>& bias, const Geometry& g,
                             int64_t groups) {
  const int64_t n = xs[0], c = xs[1], h = xs[2], w = xs[3], cg = c / groups, og = o / groups;
  const int64_t ho = positions(h, g.kh, g.sh, g.ph, g.dh);
  const int64_t wo = positions(w, g.kw, g.sw, g.pw, g.dw);
  std::vector<double> y(n * o * ho * wo);
  for (int64_t b = 0; b < n; ++b)
    for (int64_t oc = 0; oc < o; ++oc)
      for (int64_t i = 0; i < ho; ++i)
        for (int64_t j = 0; j < wo; ++j) {
          double acc = bias.empty() ? 0 : bias[oc];
          const int64_t grp = oc / og;
          for (int64_t ic = 0; ic < cg; ++ic)
            for (int64_t ki = 0; ki < g.kh; ++ki)
              for (int64_t kj = 0; kj < g.kw; ++kj) {
                const int64_t r = i * g.sh - g.ph + ki * g.dh, q = j * g.sw - g.pw + kj * g.dw;
                if (r < 0 || r >= h || q < 0 || q >= w) continue;
                acc += x[((b * c + grp * cg + ic) * h + r) * w + q] *
                       wt[((oc * cg + ic) * g.kh + ki) * g.kw + kj];
              }
          y[((b * o + oc) * ho + i) * wo + j] = acc;
        }
  return y;
}

// Direct pooling: max (padding never wins) or mean with the padding counted as 0.
std::vector<double> pool_ref(const std::vector<double>& x, const Shape& xs, const Geometry& g,
                             bool is_max) {
  const int64_t nc = xs[0] * xs[1], h = xs[2], w = xs[3];
  const int64_t ho = positions(h, g.kh, g.sh, g.ph, g.dh);
  const int64_t wo = positions(w, g.kw, g.sw, g.pw, g.dw);
  std::vector<double> y(nc * ho * wo);
  for (int64_t p = 0; p < nc; ++p)
    for (int64_t i = 0; i < ho; ++i)
      for (int64_t j = 0; j < wo; ++j) {
        double acc = is_max ? -std::numeric_limits<double>::infinity() : 0;
        for (int64_t ki = 0; ki < g.kh; ++ki)
          for (int64_t kj = 0; kj < g.kw; ++kj) {
            const int64_t r = i * g.sh - g.ph + ki * g.dh, q = j * g.sw - g.pw + kj * g.dw;
            if (r < 0 || r >= h || q < 0 || q >= w) continue;
            const double v = x[(p * h + r) * w + q];
            acc = is_max ? std::max(acc, v) : acc + v;
          }
        y[(p * ho + i) * wo + j] = is_max ? acc : acc / double(g.kh * g.kw);
      }
  return y;
}

// Direct im2col: row c*kh*kw + ki*kw + kj, column i*wo + j.
std::vector<double> unfold_ref(const std::vector<double>& x, const Shape& xs, const Geometry& g) {
  const int64_t n = xs[0], c = xs[1], h = xs[2], w = xs[3];
  const int64_t ho = positions(h, g.kh, g.sh, g.ph, g.dh);
  const int64_t wo = positions(w, g.kw, g.sw, g.pw, g.dw);
  const int64_t rows = c * g.kh * g.kw, l = ho * wo;
  std::vector<double> y(n * rows * l, 0.0);
  for (int64_t b = 0; b < n; ++b)
    for (int64_t ch = 0; ch < c; ++ch)
      for (int64_t ki = 0; ki < g.kh; ++ki)
        for (int64_t kj = 0; kj < g.kw; ++kj)
          for (int64_t i = 0; i < ho; ++i)
            for (int64_t j = 0; j < wo; ++j) {
              const int64_t r = i * g.sh - g.ph + ki * g.dh, q = j * g.sw - g.pw + kj * g.dw;
              if (r < 0 || r >= h || q < 0 || q >= w) continue;
              const int64_t row = (ch * g.kh + ki) * g.kw + kj;
              y[(b * rows + row) * l + i * wo + j] = x[((b * c + ch) * h + r) * w + q];
            }
  return y;
}

std::vector<double> values(const Tensor& t) { return t.to(DType::Float64).to_vector<double>(); }

void check_close(const std::vector<double>& got, const std::vector<double>& want, double tol) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    INFO("element " << i << ": got " << got[i] << ", want " << want[i]);
    CHECK(std::fabs(got[i] - want[i]) <= tol * (1 + std::fabs(want[i])));
  }
}

// A [n, c, h, w] input made as a permuted view of [n, h, w, c] (non-contiguous) or contiguous.
Tensor input(const Shape& s, DType dtype, bool permuted, uint64_t seed) {
  if (!permuted) return uniform(s, -1, 1, seed).to(dtype);
  return uniform({s[0], s[2], s[3], s[1]}, -1, 1, seed).to(dtype).permute({0, 3, 1, 2});
}

}  // namespace

TEST_CASE("unfold and fold match direct im2col / col2im loops and are each other's adjoint",
          "[conv]") {
  const std::vector<Geometry> cases = {
      {3, 3}, {2, 3, 2, 1, 1, 0, 1, 1}, {3, 2, 1, 2, 1, 1, 2, 1}, {1, 1, 3, 2, 0, 0, 1, 1}};
  for (const Geometry& g : cases)
    for (bool permuted : {false, true}) {
      INFO("kernel " << g.kh << "x" << g.kw << " stride " << g.sh << "," << g.sw << " padding "
                     << g.ph << "," << g.pw << " dilation " << g.dh << "," << g.dw
                     << (permuted ? " permuted" : ""));
      const Shape s{2, 3, 7, 6};
      Tensor x = input(s, DType::Float64, permuted, 3);
      Tensor cols = unfold(x, {g.kh, g.kw}, {g.dh, g.dw}, {g.ph, g.pw}, {g.sh, g.sw});
      const std::vector<double> want = unfold_ref(values(x), s, g);
      check_close(values(cols), want, 0);
      // fold is the adjoint: <unfold(x), y> = <x, fold(y)> for any y.
      Tensor y = uniform(cols.shape(), -1, 1, 5);
      Tensor back = fold(y, {7, 6}, {g.kh, g.kw}, {g.dh, g.dw}, {g.ph, g.pw}, {g.sh, g.sw});
      REQUIRE(back.shape() == s);
      const double lhs = sum(cols * y).item<double>(), rhs = sum(x * back).item<double>();
      CHECK(lhs == Approx(rhs).epsilon(1e-12));
      // float32 gives the same copies.
      check_close(values(unfold(x.to(DType::Float32), {g.kh, g.kw}, {g.dh, g.dw}, {g.ph, g.pw},
                                {g.sh, g.sw})),
                  values(cols.to(DType::Float32)), 0);
    }
}

TEST_CASE("fold sums overlapping windows: a 2x2 kernel, stride 1, over ones", "[conv]") {
  // Each element of a 3x3 output lies in as many of the 4 windows as cover it.
  Tensor cols = ones({1, 4, 4}, {DType::Float64});
  CHECK(values(fold(cols, {3, 3}, 2)) == std::vector<double>{1, 2, 1, 2, 4, 2, 1, 2, 1});
}

TEST_CASE("conv2d matches a direct float64 convolution: strides, padding, dilation, groups",
          "[conv]") {
  struct Case {
    Geometry g;
    int64_t c, o, groups;
    bool bias;
  };
  const std::vector<Case> cases = {
      {{3, 3, 1, 1, 1, 1}, 3, 4, 1, true},
      {{3, 2, 2, 1, 0, 1}, 4, 6, 2, false},
      {{2, 3, 1, 2, 2, 1, 2, 1}, 2, 3, 1, true},
      {{3, 3, 2, 2, 1, 1, 1, 1}, 4, 4, 4, true},  // depthwise: groups = C
      {{1, 1}, 3, 5, 1, true},
  };
  for (const Case& cs : cases)
    for (DType dtype : {DType::Float64, DType::Float32})
      for (bool permuted : {false, true})
        for (int64_t n : {2, 1}) {
          const Geometry& g = cs.g;
          INFO("kernel " << g.kh << "x" << g.kw << " stride " << g.sh << "," << g.sw
                         << " padding " << g.ph << "," << g.pw << " dilation " << g.dh << ","
                         << g.dw << " groups " << cs.groups << " " << name(dtype) << " n " << n
                         << (permuted ? " permuted" : ""));
          const Shape s{n, cs.c, 8, 7};
          Tensor x = input(s, dtype, permuted, 11);
          Tensor w = uniform({cs.o, cs.c / cs.groups, g.kh, g.kw}, -1, 1, 12).to(dtype);
          Tensor b = cs.bias ? uniform({cs.o}, -1, 1, 13).to(dtype) : Tensor();
          Tensor y = conv2d(x, w, b, {g.sh, g.sw}, {g.ph, g.pw}, {g.dh, g.dw}, cs.groups);
          REQUIRE(y.dtype() == dtype);
          REQUIRE(y.shape() == Shape{n, cs.o, positions(8, g.kh, g.sh, g.ph, g.dh),
                                     positions(7, g.kw, g.sw, g.pw, g.dw)});
          const std::vector<double> want =
              conv_ref(values(x), s, values(w), cs.o, cs.bias ? values(b) : std::vector<double>{},
                       g, cs.groups);
          check_close(values(y), want, dtype == DType::Float64 ? 1e-13 : 1e-5);
        }
}

TEST_CASE("conv2d, the pools and unfold take a batch of 0", "[conv]") {
  Tensor x = zeros({0, 3, 6, 6});
  Tensor w = ones({4, 3, 3, 3});
  CHECK(conv2d(x, w, ones({4}), 1, 1).shape() == Shape{0, 4, 6, 6});
  CHECK(max_pool2d(x, 2).shape() == Shape{0, 3, 3, 3});
  CHECK(avg_pool2d(x, 3, 1, 1).shape() == Shape{0, 3, 6, 6});
  CHECK(unfold(x, 2).shape() == Shape{0, 12, 25});
  CHECK(fold(zeros({0, 12, 25}), 6, 2).shape() == Shape{0, 3, 6, 6});
  // The gradient of an empty batch: empty, of the input's shape; the weight's is 0.
  Tensor xg = zeros({0, 3, 6, 6}).requires_grad_(), wg = ones({4, 3, 3, 3}).requires_grad_();
  conv2d(xg, wg, Tensor(), 1, 1).sum().backward();
  CHECK(xg.grad().shape() == Shape{0, 3, 6, 6});
  CHECK(wg.grad().abs().sum().item<float>() == 0);
}

TEST_CASE("max_pool2d and avg_pool2d match direct pooling (padding: -inf for max, 0 for avg)",
          "[conv]") {
  const std::vector<Geometry> cases = {{2, 2, 2, 2},
                                       {3, 3, 2, 2, 1, 1},
                                       {3, 2, 1, 2, 1, 0},
                                       {2, 2, 1, 1, 1, 1, 2, 2},
                                       {3, 3, 3, 3}};
  for (const Geometry& g : cases)
    for (DType dtype : {DType::Float64, DType::Float32})
      for (bool permuted : {false, true}) {
        INFO("kernel " << g.kh << "x" << g.kw << " stride " << g.sh << "," << g.sw
                       << " padding " << g.ph << "," << g.pw << " dilation " << g.dh << ","
                       << g.dw << " " << name(dtype) << (permuted ? " permuted" : ""));
        const Shape s{2, 3, 7, 8};
        // All negative: a padding of 0 would win every window that reaches it.
        Tensor x = input(s, dtype, permuted, 21) - 2.0;
        Tensor mx = max_pool2d(x, {g.kh, g.kw}, Size2{g.sh, g.sw}, {g.ph, g.pw}, {g.dh, g.dw});
        check_close(values(mx), pool_ref(values(x), s, g, true), 0);
        if (g.dh == 1 && g.dw == 1) {
          Tensor av = avg_pool2d(x, {g.kh, g.kw}, Size2{g.sh, g.sw}, {g.ph, g.pw});
          check_close(values(av), pool_ref(values(x), s, g, false),
                      dtype == DType::Float64 ? 1e-14 : 1e-6);
        }
      }
  // stride defaults to the kernel size.
  Tensor x = arange(16, DType::Float32).view({1, 1, 4, 4});
  CHECK(max_pool2d(x, 2).to_vector<float>() == std::vector<float>{5, 7, 13, 15});
  CHECK(avg_pool2d(x, 2).to_vector<float>() == std::vector<float>{2.5, 4.5, 10.5, 12.5});
}

TEST_CASE("max_pool2d propagates NaN and gives a tie's gradient to the window's first maximum",
          "[conv]") {
  Tensor x = tensor<float>({1, 3, 3, 0, NAN, 2, 2, 1}).view({1, 1, 2, 4}).requires_grad_();
  Tensor y = max_pool2d(x, {2, 2});
  const std::vector<float> v = y.to_vector<float>();
  CHECK(std::isnan(v[0]));
  CHECK(v[1] == 3);
  y.sum().backward();
  // Window 0 (columns 0-1): the NaN takes it; window 1 (columns 2-3): its 3 at (0, 2).
  CHECK(x.grad().to_vector<float>() == std::vector<float>{0, 0, 1, 0, 1, 0, 0, 0});
  Tensor same = full({1, 1, 2, 2}, 4.0).requires_grad_();
  max_pool2d(same, 2).sum().backward();
  CHECK(same.grad().to_vector<float>() == std::vector<float>{1, 0, 0, 0});
}

TEST_CASE("gradients of conv2d, the pools, unfold and fold equal finite differences",
          "[conv][autograd]") {
  SECTION("conv2d: input, weight and bias; groups, stride, padding, dilation") {
    gradcheck([](const std::vector<Tensor>& t) { return conv2d(t[0], t[1], t[2], 1, 1); },
              {uniform({2, 3, 5, 4}, -1, 1, 1), uniform({4, 3, 3, 3}, -1, 1, 2),
               uniform({4}, -1, 1, 3)});
    gradcheck(
        [](const std::vector<Tensor>& t) {
          return conv2d(t[0].permute({0, 3, 1, 2}), t[1], t[2], {2, 1}, {1, 0}, {1, 2}, 2);
        },
        {uniform({2, 6, 7, 4}, -1, 1, 4), uniform({6, 2, 2, 3}, -1, 1, 5),
         uniform({6}, -1, 1, 6)});
    gradcheck(  // depthwise
        [](const std::vector<Tensor>& t) { return conv2d(t[0], t[1], Tensor(), 2, 1, 1, 3); },
        {uniform({1, 3, 5, 5}, -1, 1, 7), uniform({3, 1, 3, 3}, -1, 1, 8)});
  }
  SECTION("max_pool2d (distinct values) and avg_pool2d") {
    // A permutation of spaced values: no ties, so finite differences see one maximum.
    Tensor x = sin(arange(2 * 2 * 6 * 5, DType::Float64) * 0.37).view({2, 2, 6, 5});
    gradcheck([](const std::vector<Tensor>& t) { return max_pool2d(t[0], 3, 2, 1); }, {x});
    gradcheck([](const std::vector<Tensor>& t) { return max_pool2d(t[0], 2, 1, 0, 2); }, {x});
    gradcheck([](const std::vector<Tensor>& t) { return avg_pool2d(t[0], {3, 2}, 2, 1); }, {x});
  }
  SECTION("unfold and fold") {
    gradcheck([](const std::vector<Tensor>& t) { return unfold(t[0], {2, 3}, 1, 1, {2, 1}); },
              {uniform({2, 2, 5, 4}, -1, 1, 9)});
    gradcheck([](const std::vector<Tensor>& t) { return fold(t[0], {5, 4}, {2, 3}, 1, 1, 1); },
              {uniform({2, 12, 24}, -1, 1, 10)});
  }
}

TEST_CASE("conv2d, the pools, unfold and fold name the caller's line for bad arguments",
          "[conv][errors]") {
  Tensor x = zeros({2, 4, 6, 6});
  Tensor w = zeros({8, 4, 3, 3});
  // (__LINE__ - 1: the failing call is on the line before.)
  check_error([&] { conv2d(x.view({8, 6, 6}), w); }, "conv2d", "expects a 4-D input", __LINE__);
  check_error([&] { conv2d(x, w.view({8, 4, 9})); }, "conv2d", "weight must be 4-D", __LINE__);
  check_error([&] { conv2d(x, zeros({8, 4, 3, 3}), {}, 1, 0, 1, 3); }, "conv2d",
              "must both be divisible by groups (3)", __LINE__ - 1);
  check_error([&] { conv2d(x, zeros({8, 3, 3, 3})); }, "conv2d",
              "takes 3 input channels, but the input [2, 4, 6, 6] has 4", __LINE__ - 1);
  check_error([&] { conv2d(x, zeros({8, 4, 7, 3})); }, "conv2d",
              "the kernel [7, 3] (dilated: [7, 3]) is larger than the padded input [6, 6]",
              __LINE__ - 2);
  check_error([&] { conv2d(x, w, {}, 0); }, "conv2d", "stride must be positive, got [0, 0]",
              __LINE__ - 1);
  check_error([&] { conv2d(x, w, {}, 1, 1, {1, 0}); }, "conv2d",
              "dilation must be positive, got [1, 0]", __LINE__ - 1);
  check_error([&] { conv2d(x, w, {}, 1, -1); }, "conv2d",
              "padding must be non-negative, got [-1, -1]", __LINE__ - 1);
  check_error([&] { conv2d(x, w, zeros({4})); }, "conv2d", "the bias must be [8]", __LINE__);
  // Break-it: a padding of 2^62 overflowed the padded size in the message (signed overflow).
  check_error([&] { conv2d(x, w, {}, 1, Size2(int64_t{1} << 62, 0)); }, "conv2d",
              "must be below 2^31", __LINE__ - 1);
  check_error([&] { conv2d(x, w.to(DType::Float64)); }, "conv2d", "same dtype", __LINE__);
  check_error([&] { max_pool2d(x, 2, 2, 2); }, "max_pool2d", "at most half the kernel",
              __LINE__ - 1);
  check_error([&] { max_pool2d(x, 7); }, "max_pool2d", "is larger than the padded input",
              __LINE__ - 1);
  check_error([&] { avg_pool2d(x.view({2, 4, 36}), 2); }, "avg_pool2d", "expects a 4-D input",
              __LINE__ - 1);
  check_error([&] { unfold(x.to(DType::Int64), 2); }, "unfold", "takes float32 or float64",
              __LINE__ - 1);
  check_error([&] { unfold(x, {0, 2}); }, "unfold", "kernel_size must be positive", __LINE__);
  check_error([&] { fold(zeros({2, 10, 25}), 6, 2); }, "fold", "not a multiple of the kernel",
              __LINE__ - 1);
  check_error([&] { fold(zeros({2, 8, 24}), 6, 2); }, "fold", "gives 25 windows", __LINE__);
  check_error([&] { nn::Conv2d(6, 4, 3, 1, 0, 1, 4); }, "Conv2d", "divisible by groups",
              __LINE__ - 1);
}

TEST_CASE("nn::Conv2d, MaxPool2d and AvgPool2d: PyTorch's shapes and initialisation", "[conv]") {
  manual_seed(3);
  nn::Conv2d conv(4, 6, {3, 2}, 1, 1, 1, 2);
  REQUIRE(conv.weight.shape() == Shape{6, 2, 3, 2});
  REQUIRE(conv.bias.shape() == Shape{6});
  // kaiming_uniform with a = sqrt(5): bound 1/sqrt(fan_in), fan_in = 2*3*2 = 12, as the bias.
  const double bound = 1 / std::sqrt(12.0);
  CHECK(amax(abs(conv.weight)).item<float>() <= bound);
  CHECK(amax(abs(conv.bias)).item<float>() <= bound);
  CHECK(amax(abs(conv.weight)).item<float>() > 0.8 * bound);
  CHECK(conv.parameters().size() == 2);
  Tensor x = randn({2, 4, 5, 5});
  CHECK(values(conv.forward(x)) == values(conv2d(x, conv.weight, conv.bias, 1, 1, 1, 2)));
  // A bad input names conv2d and this line, not nn/layers.cpp's.
  check_error([&] { conv(randn({2, 6, 5, 5})); }, "conv2d", "takes 4 input channels", __LINE__);
  CHECK(nn::Conv2d(4, 6, 3, 1, 0, 1, 1, false).bias.defined() == false);
  nn::MaxPool2d mp(3, 2, 1);
  nn::AvgPool2d ap(2);
  CHECK(values(mp.forward(x)) == values(max_pool2d(x, 3, 2, 1)));
  CHECK(ap.forward(x).shape() == Shape{2, 4, 2, 2});
  CHECK(mp.parameters().empty());
}
