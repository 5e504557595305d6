#pragma once
/// kiln::compile — capture eager code into compiled graphs, like torch.compile / tf.function /
/// jax.jit.
///
///   auto f = [](const Tensor& x, double s) { return (x * x + x) * s; };
///   auto cf = kiln::compile(f);          // same signature as f
///   Tensor y = cf(x, 2.0);                // 1st call: runs f eagerly while recording its ops,
///                                         // compiles them; later calls replay compiled code
///   std::cout << cf.explain();            // graphs, guards, recompiles, kernels
///
/// Semantics (tf.function's replay semantics; see tracer/README.md):
///  * Host side effects in `fn` (printing, counters, reading globals) happen only while
///    tracing, not on replay. Use kiln::print(t) for a print that runs on every call.
///  * A specialisation is guarded by: each tensor argument's dtype, device, rank, sizes
///    (symbolic ones: only "size >= 2"), contiguity (strides when not contiguous), requires_grad
///    and aliasing with other arguments; each host scalar's value (its type once dynamic);
///    grad mode and the default dtype; captured tensors (tensors `fn` uses without taking them
///    as arguments) must still be alive with the same dtype and shape — they are graph inputs,
///    never baked-in constants, so an optimizer updating them does not recompile.
///  * Automatic dynamic: a recompile caused only by a size (or host-scalar value) change makes
///    it symbolic, so a third size does not compile again.
///  * A host read (item(), to_vector()) ends a graph segment; the value read is a guarded
///    decision and each value seen gets its own continuation (a trace tree).
///  * Host state read through kiln::guarded, Module::is_training() (Dropout, the Transformer
///    layers) or Module::setting() (Dropout's p, LayerNorm's eps, ...) is guarded by value:
///    train() / eval() picks another cache entry, a changed dropout p traces again.
///  * Optimizer hyperparameters (lr, momentum, betas, eps, weight_decay, ...) are runtime
///    inputs read on every call (dispatch::host_input): a learning-rate schedule takes effect
///    on the next call without recompiling; only a change of a host branch (weight_decay or
///    momentum becoming 0 or not, nesterov) recompiles.
///  * In-place ops on arguments and captured tensors are functionalised and written back at the
///    end of the call; a function whose views see its own in-place writes runs its recorded
///    ops on eager kernels with real aliasing instead.
///  * When arguments or captured tensors require grad, the backward is traced with the forward;
///    outputs carry a grad_fn that runs the compiled backward. A function that calls backward()
///    and steps an optimizer is captured whole.
///  * State kept across calls (optimizer moments) must be updated in place (x.copy_(...),
///    x += ...), not rebound to new tensors: host assignments do not happen on replay.
///  * KILN_COMPILE=0 turns every compiled function into plain eager calls.
///  * KILN_LOGS=recompiles,guards,graph,breaks prints those events to stderr.
#include <array>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <ranges>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "eager/dispatch.h"
#include "eager/factories.h"
#include "tracer/function.h"

namespace kiln {

namespace tracer::detail {

template <class T> struct is_tuple : std::false_type {};
template <class... T> struct is_tuple<std::tuple<T...>> : std::true_type {};
template <class A, class B> struct is_tuple<std::pair<A, B>> : std::true_type {};

// String arguments are guarded by their characters (the caller may rewrite the buffer a view
// or pointer shows): std::basic_string_view, and pointers to (arrays of) char, wchar_t,
// char8_t, char16_t, char32_t. ArgValue::other points at the caller's string view, or at the
// characters of a pointer or array (kNullText for a null pointer).
template <class C>
inline constexpr bool is_char_v =
    std::is_same_v<C, char> || std::is_same_v<C, wchar_t> || std::is_same_v<C, char8_t> ||
    std::is_same_v<C, char16_t> || std::is_same_v<C, char32_t>;
template <class D> struct text_char { using type = void; };
template <class C> struct text_char<std::basic_string_view<C>> { using type = C; };
template <class C>
  requires is_char_v<std::remove_const_t<C>>
struct text_char<C*> { using type = std::remove_const_t<C>; };
inline constexpr char kNullText = 0;
template <class D, class C = typename text_char<D>::type>
std::optional<std::basic_string_view<C>> text_of(const void* p) {
  if constexpr (!std::is_pointer_v<D>) return std::basic_string_view<C>(*static_cast<const D*>(p));
  if (p == &kNullText) return std::nullopt;
  return std::basic_string_view<C>(static_cast<const C*>(p));
}

template <class T> struct is_optional : std::false_type {};
template <class T> struct is_optional<std::optional<T>> : std::true_type {};
template <class T> struct is_pair : std::false_type {};
template <class A, class B> struct is_pair<std::pair<A, B>> : std::true_type {};

// The equality of a guard on a value: floating-point numbers by their bits, NaN equal to NaN
// (-0.0 and 0.0 differ: x / v[0] is -inf and inf), as host scalar arguments are compared;
// optionals, pairs and ranges (vector, array) element by element; anything else with ==.
// (Break-it pass: a std::vector<double>{-0.0} replayed the trace of {0.0}, and an optional NaN
// never equalled itself, tracing until the cache limit.)
template <class T> bool same_value(const T& a, const T& b) {
  if constexpr (std::is_floating_point_v<T>) {
    return std::memcmp(&a, &b, sizeof a) == 0 || (a != a && b != b);
  } else if constexpr (is_optional<T>::value) {
    return a.has_value() == b.has_value() && (!a || same_value(*a, *b));
  } else if constexpr (is_pair<T>::value) {
    return same_value(a.first, b.first) && same_value(a.second, b.second);
  } else if constexpr (std::ranges::forward_range<const T>) {
    using E = std::remove_cvref_t<std::ranges::range_reference_t<const T>>;
    if constexpr (std::is_same_v<E, T>) {  // a range of itself (a path): no recursion
      return static_cast<bool>(a == b);
    } else {
      auto i = std::ranges::begin(a), j = std::ranges::begin(b);
      for (; i != std::ranges::end(a) && j != std::ranges::end(b); ++i, ++j)
        if (!same_value<E>(*i, *j)) return false;
      return i == std::ranges::end(a) && j == std::ranges::end(b);
    }
  } else {
    return static_cast<bool>(a == b);
  }
}

// Guards an argument of a copyable, equality-comparable type by its value (same_value).
template <class D> void guard_by_value(const D& a, ArgValue& v) {
  v.other = &a;
  v.other_copy = [](const void* p) -> std::shared_ptr<const void> {
    return std::make_shared<D>(*static_cast<const D*>(p));
  };
  v.other_equal = [](const void* x, const void* y) {
    return same_value(*static_cast<const D*>(x), *static_cast<const D*>(y));
  };
}

// Aggregates of tensors other than std::vector<Tensor> and std::optional<Tensor>: their
// tensors would be neither guarded nor graph inputs (Tensor == Tensor is elementwise).
template <class D> struct holds_tensors : std::false_type {};
template <class A, class B>
struct holds_tensors<std::pair<A, B>>
    : std::bool_constant<std::is_same_v<std::decay_t<A>, Tensor> ||
                         std::is_same_v<std::decay_t<B>, Tensor> || holds_tensors<A>::value ||
                         holds_tensors<B>::value> {};
template <class... T>
struct holds_tensors<std::tuple<T...>>
    : std::bool_constant<((std::is_same_v<std::decay_t<T>, Tensor> ||
                           holds_tensors<std::decay_t<T>>::value) || ...)> {};
template <class T, size_t N>
struct holds_tensors<std::array<T, N>>
    : std::bool_constant<std::is_same_v<T, Tensor> || holds_tensors<T>::value> {};

// One address per C++ type (no RTTI needed): ArgValue::type.
template <class D> inline constexpr char type_tag = 0;

template <class A> ArgValue to_arg(const A& a) {
  using D = std::decay_t<A>;
  static_assert(!holds_tensors<D>::value,
                "compile(): a pair, tuple or array of tensors is not a supported argument (its "
                "tensors would be neither guarded nor inputs of the compiled graph); pass "
                "separate Tensor arguments or a std::vector<Tensor>");
  ArgValue v;
  v.type = &type_tag<D>;
  if constexpr (std::is_same_v<D, Tensor>) {
    v.kind = a.defined() ? ArgValue::Kind::Tensor : ArgValue::Kind::Undefined;
    v.tensor = a;
  } else if constexpr (std::is_same_v<D, std::optional<Tensor>>) {
    // An optional tensor: as the Tensor it holds, or as an undefined tensor (PyTorch's None).
    v.kind = a && a->defined() ? ArgValue::Kind::Tensor : ArgValue::Kind::Undefined;
    if (a) v.tensor = *a;
  } else if constexpr (std::is_unsigned_v<D> && sizeof(D) >= sizeof(int64_t) &&
                       !std::is_same_v<D, bool>) {
    // Unsigned 64-bit values above INT64_MAX do not fit kiln's Scalar: guarded by value.
    if (a > static_cast<D>(INT64_MAX)) {
      guard_by_value(a, v);
    } else {
      v.kind = ArgValue::Kind::Scalar;
      v.scalar = Scalar(static_cast<int64_t>(a));
    }
  } else if constexpr (std::is_arithmetic_v<D> || std::is_same_v<D, Scalar>) {
    // A kiln::Scalar is a host number like a double (it has no operator==, so it would
    // otherwise pass through and be a constant of the trace).
    v.kind = ArgValue::Kind::Scalar;
    v.scalar = Scalar(a);
  } else if constexpr (std::is_enum_v<D>) {
    v.kind = ArgValue::Kind::Scalar;
    v.scalar = Scalar(static_cast<int64_t>(a));
    v.fixed = true;
  } else if constexpr (std::is_same_v<D, std::vector<Tensor>>) {
    v.kind = ArgValue::Kind::TensorList;
    v.list = a;
  } else if constexpr (!std::is_void_v<typename text_char<D>::type>) {
    using C = typename text_char<D>::type;
    using Text = std::optional<std::basic_string<C>>;
    if constexpr (!std::is_pointer_v<D>) {
      v.other = &a;
    } else {  // a pointer, or an array (a literal) that decays to one
      const C* chars = a;
      v.other = chars ? static_cast<const void*>(chars) : &kNullText;
    }
    v.other_copy = [](const void* p) -> std::shared_ptr<const void> {
      auto t = text_of<D>(p);
      return std::make_shared<Text>(t ? Text(std::basic_string<C>(*t)) : std::nullopt);
    };
    v.other_equal = [](const void* traced, const void* now) {
      const Text& before = *static_cast<const Text*>(traced);
      auto after = text_of<D>(now);
      return before.has_value() == after.has_value() && (!before || *before == *after);
    };
  } else if constexpr (std::equality_comparable<D> && std::copy_constructible<D> &&
                       !holds_tensors<D>::value) {
    guard_by_value(a, v);
  } else {
    // Passed through: a struct's Tensor members the trace used are guarded by identity; an
    // object of a polymorphic class (a module) by its address too.
    v.other = &a;
    v.other_size = sizeof(D);
    v.by_identity = std::is_polymorphic_v<D>;
    if constexpr (requires { a.lifetime_token(); }) v.lifetime = a.lifetime_token();
  }
  return v;
}

template <class R> void to_outs(const R& r, std::vector<OutValue>& out) {
  using D = std::decay_t<R>;
  if constexpr (std::is_same_v<D, Tensor>) {
    out.push_back({true, r, {}});
  } else if constexpr (std::is_arithmetic_v<D>) {
    out.push_back({false, Tensor(), Scalar(r)});
  } else if constexpr (std::is_same_v<D, std::vector<Tensor>>) {
    // Its length first (a host value of the result), so that what follows it is found again.
    out.push_back({false, Tensor(), Scalar(static_cast<int64_t>(r.size())), true});
    for (const Tensor& t : r) out.push_back({true, t, {}});
  } else if constexpr (is_tuple<D>::value) {
    std::apply([&](const auto&... e) { (to_outs(e, out), ...); }, r);
  } else {
    static_assert(sizeof(D) == 0,
                  "compile(): results must be Tensor, a host number, std::vector<Tensor>, or a "
                  "tuple/pair of those");
  }
}

template <class R> R from_outs(const std::vector<OutValue>& outs, size_t& i, size_t count) {
  using D = std::decay_t<R>;
  if constexpr (std::is_same_v<D, Tensor>) {
    return outs[i++].tensor;
  } else if constexpr (std::is_arithmetic_v<D>) {
    return outs[i++].scalar.template to<D>();
  } else if constexpr (std::is_same_v<D, std::vector<Tensor>>) {
    std::vector<Tensor> v;
    size_t n = i < count ? static_cast<size_t>(outs[i++].scalar.template to<int64_t>()) : 0;
    for (size_t k = 0; k < n && i < count; ++k) v.push_back(outs[i++].tensor);
    return v;
  } else if constexpr (is_tuple<D>::value) {
    return std::apply(
        [&](auto... proto) { return D{from_outs<decltype(proto)>(outs, i, count)...}; }, D{});
  }
}

/// Calls fn(args...) with each Tensor (std::optional<Tensor>, std::vector<Tensor>) argument
/// replaced by the one in `in` (same position), passed as an lvalue (so `Tensor&` parameters
/// bind); other arguments as the caller passed them (a module by non-const reference).
template <class F, class... A>
std::vector<OutValue> invoke_with(F& fn, const std::tuple<A&...>& args,
                                  const std::vector<ArgValue>& in) {
  std::vector<Tensor> tensors(in.size());
  std::vector<std::optional<Tensor>> optionals(in.size());
  std::vector<std::vector<Tensor>> lists(in.size());
  return [&]<size_t... I>(std::index_sequence<I...>) {
    auto pick = [&]<size_t J>(std::integral_constant<size_t, J>) -> decltype(auto) {
      using D = std::remove_cv_t<std::tuple_element_t<J, std::tuple<A...>>>;
      if constexpr (std::is_same_v<D, Tensor>) {
        return (tensors[J] = in[J].tensor);
      } else if constexpr (std::is_same_v<D, std::optional<Tensor>>) {
        if (std::get<J>(args)) optionals[J] = in[J].tensor;
        return (optionals[J]);
      } else if constexpr (std::is_same_v<D, std::vector<Tensor>>) {
        return (lists[J] = in[J].list);
      } else {
        return (std::get<J>(args));
      }
    };
    std::vector<OutValue> o;
    if constexpr (std::is_void_v<decltype(fn(pick(std::integral_constant<size_t, I>{})...))>)
      fn(pick(std::integral_constant<size_t, I>{})...);
    else
      to_outs(fn(pick(std::integral_constant<size_t, I>{})...), o);
    return o;
  }(std::index_sequence_for<A...>{});
}

}  // namespace tracer::detail

namespace tracer {
/// Copies of the tensor arguments (same values, dtype, requires_grad), for runs that must not
/// see each other's in-place writes.
std::vector<ArgValue> fresh_copies(const std::vector<ArgValue>& args);
/// CompileOptions::check: runs `eager` on copies of `args`, then `compiled` (the compiled call
/// on the caller's arguments) from the same state: the caller's generator state, and the
/// tensors and .grad that the eager run wrote given back their old values (a training step's
/// parameters and optimizer state; tracer::StateJournal). Compares the outputs and the written
/// tensors; on a difference, gives the written state back, finds the first diverging op with
/// kiln::compare and throws kiln::Error naming it; the call then has no effect. Otherwise
/// returns the compiled outputs, the state left as the compiled run left it.
/// The outputs compared are tensors and host numbers, and the tensor arguments after the call
/// (what the function wrote into them). Errors are reported at `where` (the compile() line).
std::vector<OutValue> checked_call(
    const std::vector<ArgValue>& args, const std::function<std::vector<OutValue>()>& compiled,
    const std::function<std::vector<OutValue>(const std::vector<ArgValue>&)>& eager,
    const CompileOptions& options, Loc where);
}  // namespace tracer

/// A compiled function: call it like the function it wraps (a braced list needs its type spelled:
/// cf(std::vector<Tensor>{a, b}), not cf({a, b}), as the arguments go through a template).
template <class F> class Compiled {
 public:
  Compiled(F fn, CompileOptions options, std::string name, Loc loc = Loc::current())
      : fn_(std::make_shared<F>(std::move(fn))),
        impl_(std::make_shared<tracer::CompiledFunction>(std::move(name), std::move(options),
                                                         loc)),
        loc_(loc) {}

  /// Calls the function: replays a compiled specialisation whose guards pass, or traces and
  /// compiles a new one (running `fn` eagerly once). Errors are eager mode's kiln::Error,
  /// naming the op and the user's line.
  template <class... A> decltype(auto) operator()(A&&... args) const {
    using R = std::invoke_result_t<F&, A&&...>;
    std::vector<tracer::ArgValue> av{tracer::detail::to_arg(args)...};
    // check: not while an outer compiled function (or kiln::compare) records this call, which
    // checks the whole; this call's eager run and undo would be recorded into it.
    if (impl_->options().check && !tracer::compile_disabled() && !dispatch::tracer_hook()) {
      std::tuple<std::remove_reference_t<A>&...> tup(args...);
      auto eager = [&](const std::vector<tracer::ArgValue>& in) {
        return tracer::detail::invoke_with(*fn_, tup, in);
      };
      std::vector<tracer::OutValue> outs = tracer::checked_call(
          av, [&] { return impl_->call(av, [&] { return eager(av); }, loc_); }, eager,
          impl_->options(), loc_);
      if constexpr (!std::is_void_v<R>) {
        size_t i = 0;
        return tracer::detail::from_outs<R>(outs, i, outs.size());
      }
    } else if constexpr (std::is_void_v<R>) {
      impl_->call(av, [&]() -> std::vector<tracer::OutValue> {
        (*fn_)(std::forward<A>(args)...);
        return {};
      }, loc_);
    } else {
      std::vector<tracer::OutValue> outs = impl_->call(
          av,
          [&]() {
            std::vector<tracer::OutValue> o;
            tracer::detail::to_outs((*fn_)(std::forward<A>(args)...), o);
            return o;
          },
          loc_);
      size_t i = 0;
      return tracer::detail::from_outs<R>(outs, i, outs.size());
    }
  }

  /// A report of the graphs, segments, ops, fused kernels, guards, recompiles (with the guard
  /// that failed) and cache entries.
  std::string explain() const { return impl_->explain(); }
  /// Traces (each with its compile) so far.
  int compile_count() const { return impl_->compile_count(); }
  /// Specialisations (guard sets x trace-tree branches) cached now.
  int cache_entries() const { return impl_->cache_entries(); }
  /// Drops every specialisation (the next call traces again).
  void reset() { impl_->reset(); }
  const CompileOptions& options() const { return impl_->options(); }

 private:
  std::shared_ptr<F> fn_;
  std::shared_ptr<tracer::CompiledFunction> impl_;
  Loc loc_;  // where compile() was called
};

/// Wraps `fn` (a lambda, function pointer or functor over Tensors and host numbers) for
/// compiled execution. Arguments: Tensor (also by non-const reference), std::optional<Tensor>
/// (as the tensor or an undefined one) and std::vector<Tensor> (guarded per tensor; a list
/// by its length too), arithmetic host scalars and kiln::Scalar (guarded by value until they
/// become dynamic; a uint64_t above INT64_MAX by value), enums and other copyable,
/// equality-comparable values (a std::string mode; guarded by value: a different value traces
/// again), anything else (a
/// module, a reference to a struct: passed through — what `fn` reads from it is a constant of
/// the trace, except its Tensor members, guarded by identity, reads through kiln::guarded and
/// Module::is_training(), which are guarded, and optimizer options, which are runtime inputs).
/// A pair, tuple or array of tensors is rejected at compile time. Results: Tensor,
/// std::vector<Tensor>, tuples/pairs of those, host numbers (constants of the specialisation).
/// The returned object shares its cache between copies; the cache and its compiled code are
/// freed with the last copy.
template <class F>
Compiled<std::decay_t<F>> compile(F&& fn, CompileOptions options = {},
                                  std::string name = "fn", Loc loc = Loc::current()) {
  return Compiled<std::decay_t<F>>(std::forward<F>(fn), std::move(options), std::move(name), loc);
}

/// Returns `variable` and, inside a compiled function, makes the function's specialisation
/// depend on it: the value is guarded like an argument, re-read on every call before anything
/// replays, and each value seen gets its own cache entry (a changed value traces again, with
/// the reason in explain(); a value seen before replays its entry). Use it for host state that
/// is not an argument — a flag, a mode, a counter the function branches on — since C++ reads
/// of such state are invisible to the tracer and would otherwise be constants of the trace:
///   auto h = kiln::compile([&](const Tensor& x) {
///     return kiln::guarded(m.flag) ? x * x : x * x + 1.0; });
/// It does not split the graph. Module::is_training() is guarded the same way, so train() /
/// eval() select the matching compiled entry. The variable must outlive the compiled function
/// (it is read by reference). T: a bool, integer or floating-point type.
template <class T> T guarded(const T& variable, Loc loc = Loc::current()) {
  static_assert(std::is_arithmetic_v<T>, "kiln::guarded: a bool, integer or floating variable");
  dispatch::note_host_value(&variable, "kiln::guarded", [p = &variable] {
    return HostReader([p]() -> std::optional<Scalar> { return Scalar(*p); });
  }, loc);
  return variable;
}

/// Prints `t` (its str()) to stdout on every call, traced or replayed: a host callback kept in
/// the graph (C++ side effects in a compiled function otherwise happen only while tracing).
void print(const Tensor& t, const std::string& label = "", Loc loc = Loc::current());

/// Runs `fn` on `args` eagerly and compiled (a fresh compile) and reports, per output, the
/// max abs / rel difference, and where they differ beyond tolerance, the first recorded op whose
/// compiled value diverges from eager (its op name and source line). Both runs start from the
/// caller's state, which compare leaves as it found it: tensors the function writes in place
/// (a training step's parameters and optimizer state) and .grad are given back after each run.
struct CompareReport {
  struct Output {
    double max_abs = 0, max_rel = 0;
    bool ok = true;
  };
  std::vector<Output> outputs;
  bool ok = true;
  std::string first_divergence;  ///< "op 'exp' at file.cpp:12: max abs diff ..." or ""
  std::string str() const;
};

namespace tracer {
/// Type-erased kiln::compare (tracer/compare.cpp): `call` runs the function on the given
/// arguments (compare passes fresh copies of the tensors to each run).
CompareReport compare(
    const std::vector<ArgValue>& args,
    const std::function<std::vector<OutValue>(const std::vector<ArgValue>&)>& call,
    const CompileOptions& options);
}  // namespace tracer

template <class F, class... A>
CompareReport compare(F&& fn, A&&... args) {
  // Non-tensor arguments are passed as the caller passed them (a module by non-const
  // reference), as compile() passes them.
  std::tuple<std::remove_reference_t<A>&...> tup(args...);
  std::vector<tracer::ArgValue> av{tracer::detail::to_arg(args)...};
  return tracer::compare(
      av, [&](const std::vector<tracer::ArgValue>& in) {
        return tracer::detail::invoke_with(fn, tup, in);
      },
      CompileOptions{});
}

}  // namespace kiln
