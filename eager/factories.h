#pragma once
/// Tensor factories and the global random generator.
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <mutex>
#include <type_traits>
#include <vector>

#include "core/tensor.h"

namespace kiln {

/// Options for factories: dtype (default: float32 / the default dtype) and device (default:
/// the cpu; for the *_like factories, the device of the given tensor). On a CUDA device,
/// factories that compute their values (full, arange, rand, tensor, ...) compute them on the
/// host and copy them over (random tensors thus hold the same values on every device);
/// empty() allocates on the device directly.
struct TensorOptions {
  std::optional<DType> dtype;
  std::optional<Device> device;
  TensorOptions() = default;
  TensorOptions(DType t) : dtype(t) {}  // NOLINT: lets users write zeros({2}, kiln::Int64)
  TensorOptions(Device d) : device(d) {}  // NOLINT: zeros({2}, Device::cuda())
  TensorOptions(std::optional<DType> t, std::optional<Device> d) : dtype(t), device(d) {}
};

inline constexpr DType Bool = DType::Bool;
inline constexpr DType Int32 = DType::Int32;
inline constexpr DType Int64 = DType::Int64;
inline constexpr DType Float32 = DType::Float32;
inline constexpr DType Float64 = DType::Float64;

/// Uninitialised elements.
Tensor empty(const Shape& shape, TensorOptions opts = {}, Loc loc = Loc::current());
Tensor zeros(const Shape& shape, TensorOptions opts = {}, Loc loc = Loc::current());
Tensor ones(const Shape& shape, TensorOptions opts = {}, Loc loc = Loc::current());
/// Every element `value`; dtype defaults to the value's (bool, int64, default float).
Tensor full(const Shape& shape, Scalar value, TensorOptions opts = {}, Loc loc = Loc::current());
/// [start, end) in steps of `step` (≠ 0). Integer bounds give int64, else the default float.
Tensor arange(Scalar end, TensorOptions opts = {}, Loc loc = Loc::current());
Tensor arange(Scalar start, Scalar end, Scalar step = 1, TensorOptions opts = {},
              Loc loc = Loc::current());
/// `steps` evenly spaced values from start to end inclusive.
Tensor linspace(double start, double end, int64_t steps, TensorOptions opts = {},
                Loc loc = Loc::current());
/// n×m identity (m = -1, the default, gives n). Throws kiln::Error for n < 0 or m < -1.
Tensor eye(int64_t n, int64_t m = -1, TensorOptions opts = {}, Loc loc = Loc::current());
/// Uniform [0, 1) from the global Philox generator.
Tensor rand(const Shape& shape, TensorOptions opts = {}, Loc loc = Loc::current());
/// Standard normal (Box–Muller on Philox draws).
Tensor randn(const Shape& shape, TensorOptions opts = {}, Loc loc = Loc::current());
/// Uniform integers in [low, high) (int64 unless opts says otherwise; bool needs 0 <= low and
/// high <= 2).
Tensor randint(int64_t low, int64_t high, const Shape& shape, TensorOptions opts = {},
               Loc loc = Loc::current());

Tensor empty_like(const Tensor& x, TensorOptions opts = {}, Loc loc = Loc::current());
Tensor zeros_like(const Tensor& x, TensorOptions opts = {}, Loc loc = Loc::current());
Tensor ones_like(const Tensor& x, TensorOptions opts = {}, Loc loc = Loc::current());
Tensor full_like(const Tensor& x, Scalar value, TensorOptions opts = {}, Loc loc = Loc::current());
Tensor rand_like(const Tensor& x, TensorOptions opts = {}, Loc loc = Loc::current());
Tensor randn_like(const Tensor& x, TensorOptions opts = {}, Loc loc = Loc::current());

/// The C++ element types tensors are made from: bool, int32_t, int64_t, float, double (one per
/// DType). Others (long long, unsigned, int8_t) do not compile: convert to one of these.
template <class T>
concept TensorElement = std::is_same_v<T, bool> || std::is_same_v<T, int32_t> ||
                        std::is_same_v<T, int64_t> || std::is_same_v<T, float> ||
                        std::is_same_v<T, double>;

namespace detail {
// Defined in factories.cpp for each TensorElement. Unconstrained, so that their symbols are
// mangled alike by every compiler (clang 17+ mangles a constrained template parameter, g++ 12
// does not: a g++-built program could not link against a clang-built kiln).
template <class T> Tensor from_vector(const std::vector<T>& values, const Shape& shape, Loc loc);
template <class T> Tensor tensor_1d(std::initializer_list<T> values, TensorOptions opts, Loc loc);
template <class T>
Tensor tensor_2d(std::initializer_list<std::initializer_list<T>> rows, TensorOptions opts,
                 Loc loc);
}  // namespace detail

/// A tensor of `shape` holding `values` (row-major); values.size() must equal numel(shape).
template <TensorElement T>
Tensor from_vector(const std::vector<T>& values, const Shape& shape, Loc loc = Loc::current()) {
  return detail::from_vector(values, shape, loc);
}
/// A 1-D tensor: tensor({1.f, 2.f}) is float32, tensor({1, 2}) int32, tensor({1.0}) float64
/// unless dtype is given (then values are converted).
template <TensorElement T>
Tensor tensor(std::initializer_list<T> values, TensorOptions opts = {}, Loc loc = Loc::current()) {
  return detail::tensor_1d(values, opts, loc);
}
/// A 2-D tensor from nested lists: tensor({{1.f, 2.f}, {3.f, 4.f}}). Rows must be equal length.
template <TensorElement T>
Tensor tensor(std::initializer_list<std::initializer_list<T>> rows, TensorOptions opts = {},
              Loc loc = Loc::current()) {
  return detail::tensor_2d(rows, opts, loc);
}
/// A 0-d tensor.
Tensor scalar_tensor(Scalar value, TensorOptions opts = {}, Loc loc = Loc::current());

// ---- the global random generator (Philox4x32-10, see core/philox.h) ----
/// Seeds the generator and resets its counter offset to 0. A compiled function that calls it
/// (or set_generator_state) runs eagerly: a replay draws from the caller's generator state
/// and would not reseed it; `loc` names the call in the reason (explain(), stderr).
void manual_seed(uint64_t seed, Loc loc = Loc::current());
/// Generator state: the seed, and the counter offset of the next draw.
struct GeneratorState {
  uint64_t seed;
  uint64_t offset;
};
GeneratorState generator_state();
void set_generator_state(GeneratorState s, Loc loc = Loc::current());
/// How many times manual_seed / set_generator_state ran on this thread, and where the last did
/// (for compile(), which compares the count before and after tracing a function on the calling
/// thread: another thread's manual_seed does not make it eager).
struct GeneratorReseeds {
  uint64_t count = 0;
  Loc last;
};
GeneratorReseeds generator_reseeds();
/// Reserves `n` 32-bit draws (rounded up to whole Philox blocks) and returns the counter
/// offset at which they start; random ops call this so each draw uses fresh counters.
uint64_t reserve_random(uint64_t n);
/// Runs a random op `op(seed, offset)` on `n` fresh 32-bit draws reserved at `offset` (as
/// reserve_random). When it throws (a bad size, dtype or bound; out of memory) the draws are
/// given back, as PyTorch's generator is untouched by a failed call — unless another thread
/// drew after them, in which case they stay used (never drawn twice).
/// `op` is a callable Tensor(uint64_t seed, uint64_t offset); a template, so that a random op
/// pays no std::function allocation.
template <class Op> Tensor draw_random(uint64_t n, Op&& op);
/// draw_random's halves: the seed and offset of `n` reserved draws, and their return when
/// nothing was drawn after them.
struct ReservedDraws {
  uint64_t seed, offset, blocks;
};
ReservedDraws reserve_draws(uint64_t n);
void give_back_draws(const ReservedDraws& r);
template <class Op> Tensor draw_random(uint64_t n, Op&& op) {
  const ReservedDraws r = reserve_draws(n);
  try {
    return op(r.seed, r.offset);
  } catch (...) {
    give_back_draws(r);
    throw;
  }
}
/// Holds the generator for a run of random ops whose draws are counted after they ran (a
/// compiled replay reads generator_state(), runs, then advance_generator()s): the other
/// threads' draws wait meanwhile, so that no counter is drawn twice. The holding thread may
/// call the functions above.
std::unique_lock<std::recursive_mutex> hold_generator();
/// Moves the generator's counter offset on by `blocks` Philox blocks (not a reseed).
void advance_generator(uint64_t blocks);
/// The counters the calling thread reserved while a log is set ({offset, blocks}, in order):
/// a trace measures its random ops' offsets in its own thread's draws, so that another thread's
/// draws meanwhile are not baked into the trace. Returns the previous log.
using DrawLog = std::vector<std::pair<uint64_t, uint64_t>>;
DrawLog* set_draw_log(DrawLog* log);

}  // namespace kiln
