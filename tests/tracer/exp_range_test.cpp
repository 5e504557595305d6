// float32 exp / exp2 / expm1 over the whole float range, eager and compiled, against float64
// libm: no early overflow to inf (exp was inf from 88.38, torch: finite up to 88.72) and denormal
// results instead of 0 (exp(-100) was 0, torch 3.78e-44).
#include <catch2/catch.hpp>
#include <cmath>
#include <functional>
#include <limits>
#include <vector>

#include "kiln/kiln.h"

using namespace kiln;

namespace {

// |got - want| in units of the float spacing at want (denormal spacing 2^-149 at the bottom).
double ulps(float got, double want) {
  float w = static_cast<float>(want);
  if (std::isnan(w)) return std::isnan(got) ? 0 : 1e9;
  if (std::isinf(w) || std::isinf(got)) return got == w ? 0 : 1e9;
  double spacing = std::max(std::abs(std::nextafter(w, INFINITY) - w), 0x1p-149f);
  return std::abs(double(got) - want) / spacing;
}

std::vector<float> grid(float lo, float hi, float step, std::vector<float> extra) {
  for (float x = lo; x <= hi; x += step) extra.push_back(x);
  return extra;
}

using Op = Tensor (*)(const Tensor&, Loc);

// Checks eager and compiled (trace + two replays) results of `op` on `xs` against `ref`.
void check(Op op, double (*ref)(double), const std::vector<float>& xs, double max_ulps) {
  Tensor x = from_vector(xs, {static_cast<int64_t>(xs.size())});
  auto f = compile([op](const Tensor& a) { return op(a, Loc::current()); });
  std::vector<std::pair<const char*, Tensor>> runs = {{"eager", op(x, Loc::current())}};
  for (int i = 0; i < 3; ++i) runs.push_back({"compiled", f(x)});
  for (auto& [mode, t] : runs) {
    std::vector<float> got = t.to_vector<float>();
    for (size_t i = 0; i < xs.size(); ++i) {
      double want = ref(double(xs[i]));
      INFO(mode << " x = " << xs[i] << " got " << got[i] << " want " << want);
      CHECK(ulps(got[i], want) <= max_ulps);
    }
  }
}

double ref_exp(double x) { return std::exp(x); }
double ref_exp2(double x) { return std::exp2(x); }
double ref_expm1(double x) { return std::expm1(x); }
constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNan = std::numeric_limits<float>::quiet_NaN();

}  // namespace

TEST_CASE("float32 exp: within 2 ulp from overflow (88.72) down through the denormals",
          "[compile][exp]") {
  check(exp, ref_exp,
        grid(-106.f, 90.f, 0.173f,
             {88.376f, 88.5f, 88.7f, 88.72f, 88.7228f, 88.7229f, 88.73f, -88.376f, -88.5f,
              -95.f, -100.f, -103.f, -103.9f, -103.97f, -103.98f, -104.f, -1e-8f, 0.f, 1e-8f,
              0.5f, -0.34657f, 0.34657f, kInf, -kInf, kNan, 1e30f, -1e30f}),
        2);
  // PyTorch 1.13's values for the reported points
  std::vector<float> e = exp(tensor({88.5f, -88.5f, -100.f, -103.f})).to_vector<float>();
  CHECK(e[0] == Approx(2.723087918e38).epsilon(1e-6));
  CHECK(e[1] == Approx(3.672301610e-39).epsilon(1e-6));
  CHECK(e[2] == 27 * 0x1p-149f);  // 3.783505854e-44, a denormal
  CHECK(e[3] == 0x1p-149f);       // 1.401298464e-45
}

TEST_CASE("float32 exp2: within 2 ulp up to 128 and down to 2^-149", "[compile][exp]") {
  check(exp2, ref_exp2,
        grid(-152.f, 130.f, 0.211f,
             {127.5f, 127.99f, 128.f, -126.f, -126.5f, -140.f, -149.f, -149.5f, -150.f,
              -150.01f, 0.f, 0.5f, -0.5f, kInf, -kInf, kNan}),
        2);
  std::vector<float> e = exp2(tensor({127.5f, -140.f})).to_vector<float>();
  CHECK(e[0] == Approx(2.406159651e38).epsilon(1e-6));
  CHECK(e[1] == 0x1p-140f);  // 7.174648137e-43
}

TEST_CASE("float32 expm1: finite up to 88.72, accurate near 0", "[compile][exp]") {
  check(expm1, ref_expm1,
        grid(-30.f, 90.f, 0.173f,
             {88.5f, 88.72f, 88.73f, 19.99f, 20.f, 20.01f, 1e-6f, -1e-6f, 1e-30f, 0.f, -kInf,
              kInf, kNan}),
        2);
}

TEST_CASE("float32 softmax and sigmoid keep denormal results, eager as compiled", "[compile][exp]") {
  Tensor x = tensor({0.f, -100.f});
  auto f = compile([](const Tensor& a) { return softmax(a, 0); });
  for (Tensor s : {softmax(x, 0), f(x), f(x)}) {
    std::vector<float> v = s.to_vector<float>();
    CHECK(v[0] == 1.f);
    CHECK(ulps(v[1], std::exp(-100.0)) <= 2);
  }
  auto g = compile([](const Tensor& a) { return sigmoid(a); });
  Tensor y = tensor({-88.5f, -88.7f});  // e^88.5 is finite in float32 now: 3.672e-39 (PyTorch)
  for (Tensor s : {sigmoid(y), g(y), g(y)}) {
    std::vector<float> v = s.to_vector<float>();
    CHECK(ulps(v[0], 1 / (1 + std::exp(88.5))) <= 2);
    CHECK(ulps(v[1], 1 / (1 + std::exp(double(88.7f)))) <= 2);
  }
}

namespace {
double ref_sigmoid(double x) { return 1 / (1 + std::exp(-x)); }
}  // namespace

TEST_CASE("float32 sigmoid: within 3 ulp over the whole range, denormal tail included "
          "(sigmoid(-100) was 0: 1 / (1 + e^100) with e^100 = inf; PyTorch 3.78e-44)",
          "[compile][exp]") {
  std::vector<float> xs = grid(-110.f, 110.f, 0.37f, {-1e30f, -100.f, -88.f, -20.f, -1e-30f, -0.f,
                                                      0.f, 1e-30f, 20.f, 1e30f, kInf, -kInf});
  check(sigmoid, ref_sigmoid, xs, 3);
  Tensor n = sigmoid(tensor({kNan}));
  CHECK(std::isnan(n.item<float>()));
}
