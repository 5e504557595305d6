#pragma once
/// Philox4x32-10, the counter-based generator of Salmon et al., "Parallel Random Numbers:
/// As Easy as 1, 2, 3" (SC'11) — the same generator cuRAND and PyTorch's CUDA RNG use.
///
/// A draw is a pure function of (key = seed, counter): element i of a random op with counter
/// offset `o` uses counter (o + i / 4) and takes word i % 4. Eager kernels and compiled code
/// therefore produce identical numbers for the same seed and offset, in any order and on any
/// number of threads.
#include <array>
#include <cmath>
#include <cstdint>

namespace kiln::philox {

inline constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
inline constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;

/// Ten rounds of Philox4x32 on counter `ctr` (128 bits) with key `key` (64 bits).
inline std::array<uint32_t, 4> philox4x32(uint64_t ctr_lo, uint64_t ctr_hi, uint64_t key) {
  uint32_t c0 = static_cast<uint32_t>(ctr_lo), c1 = static_cast<uint32_t>(ctr_lo >> 32);
  uint32_t c2 = static_cast<uint32_t>(ctr_hi), c3 = static_cast<uint32_t>(ctr_hi >> 32);
  uint32_t k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
  for (int r = 0; r < 10; ++r) {
    uint64_t p0 = static_cast<uint64_t>(kM0) * c0;
    uint64_t p1 = static_cast<uint64_t>(kM1) * c2;
    uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1 ^ k0;
    uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c3 ^ k1;
    c1 = static_cast<uint32_t>(p1);
    c3 = static_cast<uint32_t>(p0);
    c0 = n0;
    c2 = n2;
    k0 += kW0;
    k1 += kW1;
  }
  return {c0, c1, c2, c3};
}

/// Counter blocks that `words` 32-bit draws take: element i uses block i / 4.
inline constexpr uint64_t blocks(uint64_t words) { return (words + 3) / 4; }

/// 32 random bits for element `i` of a draw at counter offset `offset` with key `seed`.
inline uint32_t bits(uint64_t seed, uint64_t offset, uint64_t i) {
  return philox4x32(offset + i / 4, 0, seed)[i % 4];
}

/// Whether randint's values in [low, high) all fit int32 (else an int32 draw raises). high > low.
inline constexpr bool randint_fits_int32(int64_t low, int64_t high) {
  return low >= -(int64_t{1} << 31) && high <= (int64_t{1} << 31);  // high - 1 <= INT32_MAX
}

/// Uniform float in [0, 1) from 32 bits (24 significant bits, like cuRAND's curand_uniform
/// shifted to exclude 1).
inline float to_uniform_float(uint32_t x) { return static_cast<float>(x >> 8) * 0x1.0p-24f; }
/// Uniform double in [0, 1) from 64 bits (53 significant bits).
inline double to_uniform_double(uint32_t hi, uint32_t lo) {
  return static_cast<double>(((static_cast<uint64_t>(hi) << 32) | lo) >> 11) * 0x1.0p-53;
}

}  // namespace kiln::philox
