// Opt-in slow conformance: tensors past 2^31 bytes (64-bit offsets and indexing in eager kernels
// and in compiled code). Hidden tag, not in ctest's default run (about 10 GB of memory and a
// minute on 2 cores):   build/tests/test_conformance "[.large]"
// Values are small integers (i mod 7 - 3), so every result below is exact in float32 and is
// checked against a closed formula at elements on both sides of the 2^31-byte boundary.
#include <catch2/catch.hpp>

#include <cstring>

#include "kiln/kiln.h"

using namespace kiln;

namespace {

constexpr int64_t kRows = (int64_t{1} << 15) + 1, kCols = int64_t{1} << 14;  // 2^31 + 64 KiB
constexpr int64_t kN = kRows * kCols;

float value_at(int64_t i) { return static_cast<float>(i % 7 - 3); }

Tensor pattern() {
  Tensor x = empty({kRows, kCols}, Float32);
  float* d = x.data<float>();
  for (int64_t i = 0; i < kN; ++i) d[i] = value_at(i);
  return x;
}

// Flat indices on both sides of element 2^29 (byte 2^31), and the last one.
const int64_t kProbes[] = {0, (int64_t{1} << 29) - 1, int64_t{1} << 29, (int64_t{1} << 29) + 12345,
                           kN - 1};

}  // namespace

TEST_CASE("conformance (large): elementwise, reductions and views past 2^31 bytes",
          "[.large]") {
  Tensor x = pattern();
  REQUIRE(x.numel() * 4 > (int64_t{1} << 31));
  auto f = [](const Tensor& t) {
    return std::vector<Tensor>{t * t + t, kiln::amax(t, {1}, false),
                               kiln::sum(t.slice(0, kRows - 2, kRows), {0}, false)};
  };
  auto cf = compile(f);
  std::vector<Tensor> eager = f(x);
  for (int call = 0; call < 2; ++call) {  // the trace, then the compiled replay
    std::vector<Tensor> c = cf(x);
    for (const std::vector<Tensor>* r : {&eager, &c}) {
      const float* y = (*r)[0].data<float>();
      for (int64_t i : kProbes) {
        float v = value_at(i);
        INFO("element " << i);
        CHECK(y[i] == v * v + v);
      }
      // amax over each row of 2^14 consecutive values of i mod 7 - 3: 3 everywhere.
      std::vector<float> rowmax = (*r)[1].to_vector<float>();
      CHECK(rowmax.front() == 3.f);
      CHECK(rowmax.back() == 3.f);
      // The last two rows summed column-wise (a slice starting past 2^31 bytes).
      std::vector<float> cols = (*r)[2].to_vector<float>();
      for (int64_t j : {int64_t{0}, kCols - 1}) {
        int64_t a = (kRows - 2) * kCols + j, b = (kRows - 1) * kCols + j;
        CHECK(cols[j] == value_at(a) + value_at(b));
      }
    }
    CHECK(std::memcmp(c[0].data<float>(), eager[0].data<float>(), kN * sizeof(float)) == 0);
  }
}
