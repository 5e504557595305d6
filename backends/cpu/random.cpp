// Random ops on counter-based Philox4x32-10 (core/philox.h).
//
// Counter layout — the contract compiled code follows too. `w(j)` is 32-bit word j of the
// op's draw: w(j) = philox::bits(attrs.seed, attrs.offset, j), i.e. word j % 4 of the Philox
// block at counter attrs.offset + j / 4. Element i is the i-th element in row-major order.
//   rand    float32: u = to_uniform_float(w(2i))                    (w(2i+1) unused)
//           float64: u = to_uniform_double(w(2i), w(2i+1))          (w(2i) high bits)
//           value   = low + (high - low) · u, computed in the output type
//   randn   u1 = to_uniform_double(w(4i), w(4i+1)), u2 = to_uniform_double(w(4i+2), w(4i+3)),
//           z = sqrt(-2 log(1 - u1)) · cos(2π u2) in double (Box–Muller; 1 - u1 ∈ (0, 1]),
//           value = mean + std · z (mean = attrs.low, std = attrs.high), then cast
//   randint x = (w(2i) << 32) | w(2i+1) (64 bits), value = low + x mod (high - low)
//   dropout keep element i iff to_uniform_float(w(i)) >= p (compared in double); kept: x · (1 / (1 - p)) with the
//           scale rounded to x's dtype; dropped (and everything when p == 1): 0
// The eager factories reserve 2, 4, 2 and 1 words per element respectively (eager/factories.cpp,
// eager/ops.cpp), so consecutive draws never share counters.
#include <cmath>
#include <limits>
#include <numbers>

#include "backends/cpu/kernels.h"
#include "backends/cpu/loops.h"
#include "core/philox.h"

namespace kiln::cpu {
namespace {

// Elements per parallel chunk; each element costs a share of a Philox block (~10 ns).
constexpr int64_t kRandomGrain = 8192;

// Word j of the draw, computing each Philox block once while j advances sequentially.
class WordStream {
 public:
  WordStream(uint64_t seed, uint64_t offset) : seed_(seed), offset_(offset) {}
  uint32_t operator()(uint64_t j) {
    uint64_t block = j / 4;
    if (block != block_) {
      words_ = philox::philox4x32(offset_ + block, 0, seed_);
      block_ = block;
    }
    return words_[j % 4];
  }

 private:
  uint64_t seed_, offset_;
  uint64_t block_ = std::numeric_limits<uint64_t>::max();
  std::array<uint32_t, 4> words_{};
};

template <class T, class Fn> void generate(const Tensor& out, Fn&& element) {
  T* p = out.data<T>();
  parallel_for(0, out.numel(), kRandomGrain, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) p[i] = element(i);
  });
}

void uniform(const OpCall& call, const Tensor& out) {
  const OpAttrs& a = call.attrs;
  KILN_DISPATCH_FLOAT(out.dtype(), T, {
    const T low = a.low.to<T>(), span = a.high.to<T>() - low;
    T* p = out.data<T>();
    parallel_for(0, out.numel(), kRandomGrain, [&](int64_t lo, int64_t hi) {
      WordStream w(a.seed, a.offset);
      for (int64_t i = lo; i < hi; ++i) {
        const uint64_t j = 2 * static_cast<uint64_t>(i);
        T u;
        if constexpr (std::is_same_v<T, float>) u = philox::to_uniform_float(w(j));
        else u = philox::to_uniform_double(w(j), w(j + 1));
        p[i] = low + span * u;
      }
    });
  });
}

void normal(const OpCall& call, const Tensor& out) {
  const OpAttrs& a = call.attrs;
  const double mean = a.low.to<double>(), std = a.high.to<double>();
  KILN_DISPATCH_FLOAT(out.dtype(), T, {
    generate<T>(out, [&](int64_t i) {
      // Four words per element: exactly one Philox block.
      std::array<uint32_t, 4> w =
          philox::philox4x32(a.offset + static_cast<uint64_t>(i), 0, a.seed);
      const double u1 = philox::to_uniform_double(w[0], w[1]);
      const double u2 = philox::to_uniform_double(w[2], w[3]);
      const double z = std::sqrt(-2.0 * std::log(1.0 - u1)) * std::cos(2.0 * std::numbers::pi * u2);
      return static_cast<T>(mean + std * z);
    });
  });
}

void randint(const OpCall& call, const Tensor& out) {
  const OpAttrs& a = call.attrs;
  const int64_t low = a.low.to<int64_t>(), high = a.high.to<int64_t>();
  if (out.dtype() == DType::Int32) {
    KILN_CHECK(low >= std::numeric_limits<int32_t>::min() &&
                   high - 1 <= std::numeric_limits<int32_t>::max(),
               call.name(), call.loc, "range [{}, {}) does not fit dtype int32", low, high);
  }
  // high - low as unsigned: correct even when it exceeds INT64_MAX.
  const uint64_t range = static_cast<uint64_t>(high) - static_cast<uint64_t>(low);
  KILN_DISPATCH_NUMERIC(out.dtype(), T, {
    T* p = out.data<T>();
    parallel_for(0, out.numel(), kRandomGrain, [&](int64_t lo, int64_t hi) {
      WordStream w(a.seed, a.offset);
      for (int64_t i = lo; i < hi; ++i) {
        const uint64_t j = 2 * static_cast<uint64_t>(i);
        const uint64_t x = static_cast<uint64_t>(w(j)) << 32 | w(j + 1);
        p[i] = static_cast<T>(static_cast<int64_t>(static_cast<uint64_t>(low) + x % range));
      }
    });
  });
}

void dropout(const OpCall& call, const Tensor& out) {
  const OpAttrs& a = call.attrs;
  const Tensor& x = call.inputs[0];
  const bool drop_all = a.p >= 1.0;
  KILN_DISPATCH_FLOAT(out.dtype(), T, {
    const T scale = drop_all ? T(0) : static_cast<T>(1.0 / (1.0 - a.p));
    StridedLoop<2> loop(out.shape(), {&out, &x});
    const int64_t os = loop.inner_stride(0), xs = loop.inner_stride(1);
    parallel_for(0, loop.numel(), kRandomGrain, [&](int64_t lo, int64_t hi) {
      WordStream w(a.seed, a.offset);
      uint64_t i = static_cast<uint64_t>(lo);  // flat element index of the run's start
      loop.run(lo, hi, [&](const std::array<char*, 2>& ptr, int64_t n) {
        for (int64_t e = 0; e < n; ++e, ++i) {
          const bool keep = !drop_all && static_cast<double>(philox::to_uniform_float(w(i))) >= a.p;
          const T v = *reinterpret_cast<const T*>(ptr[1] + e * xs);
          *reinterpret_cast<T*>(ptr[0] + e * os) = keep ? v * scale : T(0);
        }
      });
    });
  });
}

}  // namespace

void random_kernel(const OpCall& call, const InferredMeta& meta, std::span<Tensor> outs) {
  switch (call.op) {
    case OpKind::Uniform: uniform(call, outs[0]); break;
    case OpKind::Normal: normal(call, outs[0]); break;
    case OpKind::RandInt: randint(call, outs[0]); break;
    case OpKind::Dropout: dropout(call, outs[0]); break;
    default: throw Error(call.name(), "not a random op", call.loc);
  }
}

}  // namespace kiln::cpu
