#include "eager/factories.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <mutex>
#include <new>

#include <pthread.h>

#include "core/philox.h"
#include "eager/autograd.h"
#include "eager/dispatch.h"
#include "eager/ops.h"

namespace kiln {
namespace {

DType float_or(const TensorOptions& o) { return o.dtype.value_or(default_dtype()); }

TensorOptions options(DType dtype, std::optional<Device> device) {
  TensorOptions o(dtype);
  o.device = device;
  return o;
}
// Options of a *_like factory: the tensor's dtype and device unless `opts` says otherwise.
TensorOptions like(const Tensor& x, const TensorOptions& opts) {
  return options(opts.dtype.value_or(x.dtype()), opts.device.value_or(x.device()));
}
// A tensor built on the cpu by the factory `op`, moved to the requested device (a failed move
// names `op`, not `to`).
Tensor on_device(const char* op, const Tensor& t, const TensorOptions& opts, Loc loc) {
  Device d = opts.device.value_or(Device::cpu());
  return d.is_cpu() ? t : as_op(op, [&] { return t.to(d, loc); });
}

// Drawn where the tensor lives (attrs.device): counter-based Philox gives the same numbers on
// every device, and inside compile() the draw is a recorded op (a transfer could not be).
Tensor random_op(OpKind op, const Shape& shape, DType dtype, Scalar low, Scalar high,
                 uint64_t draws_per_element, Device device, Loc loc) {
  OpAttrs a;
  a.device = device;
  a.dims = shape;
  a.dtype = dtype;
  a.low = low;
  a.high = high;
  // A negative size raises in the op; it reserves nothing.
  const bool valid = std::all_of(shape.begin(), shape.end(), [](int64_t d) { return d >= 0; });
  const uint64_t n = valid ? static_cast<uint64_t>(numel(shape)) * draws_per_element : 0;
  return draw_random(n, [&](uint64_t seed, uint64_t offset) {
    a.seed = seed;
    a.offset = offset;
    return dispatch::call1({op, {}, a, loc});
  });
}

// Recursive: a compiled replay holds it (hold_generator) around its own generator calls.
// fork() waits for it (a replay on another thread holds it for the replay), so the child's copy
// is not held by a thread that does not exist there.
std::recursive_mutex g_rng_mu;
const bool g_rng_fork_handlers = [] {
  pthread_atfork([] { g_rng_mu.lock(); }, [] { g_rng_mu.unlock(); },
                 [] { new (&g_rng_mu) std::recursive_mutex(); });
  return true;
}();
GeneratorState g_rng{67280421310721ull, 0};  // guarded by g_rng_mu
thread_local GeneratorReseeds t_reseeds;
thread_local DrawLog* t_draw_log = nullptr;

}  // namespace

Tensor empty(const Shape& shape, TensorOptions opts, Loc loc) {
  check_dtype(float_or(opts), "empty", loc);
  if (opts.device) check_device(*opts.device, "empty", loc);
  check_shape(shape, itemsize(float_or(opts)), "empty", loc);
  return as_op("empty", [&] {  // the allocator's out-of-memory error names empty and this line
    return at_user_line(loc, [&] {
      return dispatch::empty(shape, float_or(opts), opts.device.value_or(Device::cpu()));
    });
  });
}
Tensor zeros(const Shape& shape, TensorOptions opts, Loc loc) {
  return as_op("zeros", [&] { return full(shape, 0, options(float_or(opts), opts.device), loc); });
}
Tensor ones(const Shape& shape, TensorOptions opts, Loc loc) {
  return as_op("ones", [&] { return full(shape, 1, options(float_or(opts), opts.device), loc); });
}
Tensor full(const Shape& shape, Scalar value, TensorOptions opts, Loc loc) {
  return as_op("full", [&] {
    // Filled where it lives: inside compile() a transfer cannot be recorded, and backward()'s
    // ones_like seed of a CUDA loss would raise.
    Tensor t = empty(shape, options(opts.dtype.value_or(value.dtype()), opts.device), loc);
    t.fill_(value, loc);
    return t;
  });
}

Tensor arange(Scalar end, TensorOptions opts, Loc loc) { return arange(0, end, 1, opts, loc); }
Tensor arange(Scalar start, Scalar end, Scalar step, TensorOptions opts, Loc loc) {
  bool all_int = !start.is_floating() && !end.is_floating() && !step.is_floating();
  DType t = opts.dtype.value_or(all_int ? DType::Int64 : default_dtype());
  double s = start.to<double>(), e = end.to<double>(), st = step.to<double>();
  KILN_CHECK(st != 0, "arange", loc, "step must be nonzero");
  KILN_CHECK(std::isfinite(s) && std::isfinite(e), "arange", loc, "bounds must be finite");
  KILN_CHECK((e - s) / st >= 0 || e == s, "arange", loc,
             "upper bound {} and step {} are inconsistent with lower bound {}", end.str(),
             step.str(), start.str());
  // The length, ceil((end - start) / step), in 128 bits for integers (end - start overflows
  // int64 for bounds far apart).
  constexpr double kMaxLength = 9.2e18;
  int64_t n = 0;
  if (all_int) {
    const __int128 i_start = start.to<int64_t>(), i_step = step.to<int64_t>();
    const __int128 span = static_cast<__int128>(end.to<int64_t>()) - i_start;
    const __int128 len = span == 0 ? 0 : (span - (i_step > 0 ? 1 : -1)) / i_step + 1;
    KILN_CHECK(len <= static_cast<__int128>(kMaxLength), "arange", loc,
               "[{}, {}) in steps of {} has too many elements", start.str(), end.str(),
               step.str());
    n = static_cast<int64_t>(std::max<__int128>(len, 0));
  } else {
    const double len = std::ceil((e - s) / st);
    KILN_CHECK(len <= kMaxLength, "arange", loc, "[{}, {}) in steps of {} has too many elements",
               start.str(), end.str(), step.str());
    n = std::max<int64_t>(static_cast<int64_t>(len), 0);
  }
  // Floating bounds into an integer dtype: start and step are truncated first and the values
  // counted in int64, as PyTorch (arange(-2.5, 2.5, 1.5, int64) is [-2, -1, 0, 1]; truncating
  // each double value gave [-2, -1, 0, 2]). The length stays the floating one.
  const bool int_values = all_int || (!is_floating(t) && t != DType::Bool);
  if (int_values && !all_int)  // truncated to int64: NaN or out of range raises, as PyTorch
    for (const Scalar& v : {start, step}) check_scalar_fits(v, DType::Int64, "arange", loc);
  const int64_t i_start = all_int ? start.to<int64_t>() : static_cast<int64_t>(s);
  const int64_t i_step = all_int ? step.to<int64_t>() : static_cast<int64_t>(st);
  KILN_CHECK(!int_values || i_step != 0, "arange", loc,
             "step {} is 0 in {} (it is truncated, as PyTorch does for an integer dtype)",
             step.str(), kiln::name(t));
  Tensor out = as_op("arange", [&] { return empty({n}, {t}, loc); });
  KILN_DISPATCH_ALL(t, T, {
    T* p = out.data<T>();
    for (int64_t i = 0; i < n; ++i)
      p[i] = int_values ? static_cast<T>(i_start + i * i_step)
                        : static_cast<T>(s + static_cast<double>(i) * st);
  });
  return on_device("arange", out, opts, loc);
}

Tensor linspace(double start, double end, int64_t steps, TensorOptions opts, Loc loc) {
  KILN_CHECK(steps >= 0, "linspace", loc, "number of steps must be non-negative, got {}", steps);
  const DType t = float_or(opts);
  // The values lie between start and end: both in range, or a kiln::Error as for full()
  // (NaN or 1e10 into int32 gave INT_MIN, an undefined conversion).
  if (steps > 0)
    for (double v : {start, end}) check_scalar_fits(Scalar(v), t, "linspace", loc);
  Tensor out = as_op("linspace", [&] { return empty({steps}, {t}, loc); });
  double step = steps > 1 ? (end - start) / static_cast<double>(steps - 1) : 0;
  KILN_DISPATCH_ALL(out.dtype(), T, {
    T* p = out.data<T>();
    // Fill from both ends (as PyTorch does) so the last value is exactly `end`.
    int64_t half = (steps + 1) / 2;
    for (int64_t i = 0; i < steps; ++i)
      p[i] = static_cast<T>(i < half ? start + step * static_cast<double>(i)
                                     : end - step * static_cast<double>(steps - 1 - i));
  });
  return on_device("linspace", out, opts, loc);
}

Tensor eye(int64_t n, int64_t m, TensorOptions opts, Loc loc) {
  KILN_CHECK(m >= -1, "eye", loc, "m must be non-negative (or -1 for n), got {}", m);
  if (m == -1) m = n;
  KILN_CHECK(n >= 0, "eye", loc, "n must be non-negative, got {}", n);
  check_dtype(float_or(opts), "eye", loc);
  check_shape({n, m}, itemsize(float_or(opts)), "eye", loc);  // before the aranges' buffers
  // No elements: no ramps either (eye(0, 2^40) would build a 2^40-element arange).
  if (n == 0 || m == 0) return zeros({n, m}, opts, loc);
  // Dispatched ops, not writes through data(): inside compile() the tracer does not see such
  // writes, so a replay lost the diagonal; arange's ramps also follow symbolic sizes.
  return as_op("eye", [&] {
    Tensor rows = arange(n, {DType::Int64}, loc).unsqueeze(1, loc);
    Tensor cols = arange(m, {DType::Int64}, loc).unsqueeze(0, loc);
    return on_device("eye", eq(rows, cols, loc).to(float_or(opts), loc), opts, loc);
  });
}

Tensor rand(const Shape& shape, TensorOptions opts, Loc loc) {
  return random_op(OpKind::Uniform, shape, float_or(opts), 0, 1, 2,
                   opts.device.value_or(Device::cpu()), loc);
}
Tensor randn(const Shape& shape, TensorOptions opts, Loc loc) {
  return random_op(OpKind::Normal, shape, float_or(opts), 0, 1, 4,
                   opts.device.value_or(Device::cpu()), loc);
}
Tensor randint(int64_t low, int64_t high, const Shape& shape, TensorOptions opts, Loc loc) {
  if (opts.dtype == DType::Bool) {  // as PyTorch: the bounds must lie in [0, 2]
    KILN_CHECK(low >= 0 && high <= 2, "randint", loc,
               "bounds [{}, {}) are out of range for bool (values must be 0 or 1)", low, high);
    return as_op("randint", [&] {
      return randint(low, high, shape, {DType::Int64, opts.device}, loc).to(DType::Bool, loc);
    });
  }
  return random_op(OpKind::RandInt, shape, opts.dtype.value_or(DType::Int64), low, high, 2,
                   opts.device.value_or(Device::cpu()), loc);
}

// The *_like factories: `fn` makes a tensor of x's shape with x's dtype and device unless
// `opts` says otherwise; errors name `op`.
template <class F>
Tensor like_factory(const char* op, const Tensor& x, TensorOptions opts, Loc loc, F fn) {
  KILN_CHECK(x.defined(), op, loc, "the tensor to take the shape of is undefined");
  return as_op(op, [&] { return fn(x.shape(), like(x, opts)); });
}

Tensor empty_like(const Tensor& x, TensorOptions opts, Loc loc) {
  return like_factory("empty_like", x, opts, loc,
                      [&](const Shape& s, TensorOptions o) { return empty(s, o, loc); });
}
Tensor zeros_like(const Tensor& x, TensorOptions opts, Loc loc) {
  return like_factory("zeros_like", x, opts, loc,
                      [&](const Shape& s, TensorOptions o) { return zeros(s, o, loc); });
}
Tensor ones_like(const Tensor& x, TensorOptions opts, Loc loc) {
  return like_factory("ones_like", x, opts, loc,
                      [&](const Shape& s, TensorOptions o) { return ones(s, o, loc); });
}
Tensor full_like(const Tensor& x, Scalar value, TensorOptions opts, Loc loc) {
  return like_factory("full_like", x, opts, loc,
                      [&](const Shape& s, TensorOptions o) { return full(s, value, o, loc); });
}
Tensor rand_like(const Tensor& x, TensorOptions opts, Loc loc) {
  return like_factory("rand_like", x, opts, loc,
                      [&](const Shape& s, TensorOptions o) { return rand(s, o, loc); });
}
Tensor randn_like(const Tensor& x, TensorOptions opts, Loc loc) {
  return like_factory("randn_like", x, opts, loc,
                      [&](const Shape& s, TensorOptions o) { return randn(s, o, loc); });
}

namespace detail {
template <class T>
Tensor from_vector(const std::vector<T>& values, const Shape& shape, Loc loc) {
  check_shape(shape, sizeof(T), "from_vector", loc);
  KILN_CHECK(static_cast<int64_t>(values.size()) == numel(shape), "from_vector", loc,
             "{} values do not fill shape {} ({} elements)", values.size(), to_string(shape),
             numel(shape));
  Tensor out = dispatch::empty(shape, dtype_of<T>());
  std::copy(values.begin(), values.end(), out.data<T>());
  return out;
}
}  // namespace detail

namespace {
// Values given for another dtype must fit it (a cast would wrap them silently).
template <class T> void check_values_fit(const std::vector<T>& values, TensorOptions opts, Loc loc) {
  if (opts.dtype && *opts.dtype != dtype_of<T>())
    for (const T& v : values) check_scalar_fits(Scalar(v), *opts.dtype, "tensor", loc);
}
}  // namespace

namespace detail {
template <class T>
Tensor tensor_1d(std::initializer_list<T> values, TensorOptions opts, Loc loc) {
  check_values_fit(std::vector<T>(values), opts, loc);
  Tensor t = from_vector(std::vector<T>(values), {static_cast<int64_t>(values.size())}, loc);
  Tensor typed = opts.dtype && *opts.dtype != t.dtype() ? t.to(*opts.dtype, loc) : t;
  return on_device("tensor", typed, opts, loc);
}

template <class T>
Tensor tensor_2d(std::initializer_list<std::initializer_list<T>> rows, TensorOptions opts,
                 Loc loc) {
  std::vector<T> flat;
  int64_t cols = rows.size() ? static_cast<int64_t>(rows.begin()->size()) : 0;
  for (const auto& r : rows) {
    KILN_CHECK(static_cast<int64_t>(r.size()) == cols, "tensor", loc,
               "rows have different lengths ({} and {})", cols, r.size());
    flat.insert(flat.end(), r.begin(), r.end());
  }
  check_values_fit(flat, opts, loc);
  Tensor t = from_vector(flat, {static_cast<int64_t>(rows.size()), cols}, loc);
  Tensor typed = opts.dtype && *opts.dtype != t.dtype() ? t.to(*opts.dtype, loc) : t;
  return on_device("tensor", typed, opts, loc);
}

#define KILN_INSTANTIATE(T)                                                                 \
  template Tensor from_vector<T>(const std::vector<T>&, const Shape&, Loc);                \
  template Tensor tensor_1d<T>(std::initializer_list<T>, TensorOptions, Loc);              \
  template Tensor tensor_2d<T>(std::initializer_list<std::initializer_list<T>>, TensorOptions, Loc);
KILN_INSTANTIATE(bool)
KILN_INSTANTIATE(int32_t)
KILN_INSTANTIATE(int64_t)
KILN_INSTANTIATE(float)
KILN_INSTANTIATE(double)
#undef KILN_INSTANTIATE
}  // namespace detail

Tensor scalar_tensor(Scalar value, TensorOptions opts, Loc loc) {
  return as_op("scalar_tensor", [&] { return full({}, value, opts, loc); });
}

void manual_seed(uint64_t seed, Loc loc) { set_generator_state({seed, 0}, loc); }
GeneratorState generator_state() {
  std::lock_guard<std::recursive_mutex> lock(g_rng_mu);
  return g_rng;
}
void set_generator_state(GeneratorState s, Loc loc) {
  std::lock_guard<std::recursive_mutex> lock(g_rng_mu);
  g_rng = s;
  ++t_reseeds.count;
  t_reseeds.last = loc;
}
GeneratorReseeds generator_reseeds() { return t_reseeds; }
std::unique_lock<std::recursive_mutex> hold_generator() {
  register_replay_fork_handlers();
  return std::unique_lock<std::recursive_mutex>(g_rng_mu);
}
void advance_generator(uint64_t blocks) {
  std::lock_guard<std::recursive_mutex> lock(g_rng_mu);
  if (t_draw_log) t_draw_log->push_back({g_rng.offset, blocks});
  g_rng.offset += blocks;
}
uint64_t reserve_random(uint64_t n) {
  std::lock_guard<std::recursive_mutex> lock(g_rng_mu);
  uint64_t at = g_rng.offset;
  g_rng.offset += philox::blocks(n);
  if (t_draw_log) t_draw_log->push_back({at, philox::blocks(n)});
  return at;
}
ReservedDraws reserve_draws(uint64_t n) {
  std::lock_guard<std::recursive_mutex> lock(g_rng_mu);
  const uint64_t seed = g_rng.seed;
  return {seed, reserve_random(n), philox::blocks(n)};
}
void give_back_draws(const ReservedDraws& r) {
  std::lock_guard<std::recursive_mutex> lock(g_rng_mu);
  if (g_rng.seed != r.seed || g_rng.offset != r.offset + r.blocks) return;  // drawn after them
  g_rng.offset = r.offset;
  if (t_draw_log && !t_draw_log->empty() && t_draw_log->back() == std::pair{r.offset, r.blocks})
    t_draw_log->pop_back();
}
DrawLog* set_draw_log(DrawLog* log) { return std::exchange(t_draw_log, log); }

}  // namespace kiln
