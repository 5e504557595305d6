#include "tracer/generalize.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <optional>
#include <set>
#include <tuple>

#include "tracer/recorder.h"

namespace kiln::tracer {
namespace {

bool same(const Scalar& a, const Scalar& b) {
  if (a.kind() != b.kind()) return false;
  if (a.is_floating()) {
    double x = a.to<double>(), y = b.to<double>();
    return std::memcmp(&x, &y, sizeof x) == 0;
  }
  return a.to<int64_t>() == b.to<int64_t>();
}

// Attributes other than sizes / bounds / random counters must match exactly.
bool same_fixed_attrs(const OpAttrs& a, const OpAttrs& b) {
  return a.all_dims == b.all_dims && a.keepdim == b.keepdim && a.descending == b.descending &&
         a.dim == b.dim &&
         a.dim1 == b.dim1 && a.step == b.step && same(a.alpha, b.alpha) && same(a.beta, b.beta) &&
         a.has_low == b.has_low && a.has_high == b.has_high && a.eps == b.eps && a.p == b.p &&
         a.mode == b.mode && a.ignore_index == b.ignore_index &&
         a.indices_checked == b.indices_checked && a.dtype == b.dtype &&
         same(a.low, b.low) && same(a.high, b.high) && a.dims.size() == b.dims.size();
}

// "matmul at model.cpp:12" for refusal messages.
std::string describe(const Node& n) {
  std::string what = n.kind == Node::Kind::Read       ? "a host read"
                     : n.kind == Node::Kind::Callback ? "a callback"
                                                      : std::string(op_name(n.op));
  if (inside_kiln(n.loc))  // recorded from kiln's own code: a backward, a composite op
    return fmt::format("{} in kiln's backward or a composite op ({}:{})", what, n.loc.file_name(),
                       n.loc.line());
  return fmt::format("{} at {}:{}", what, n.loc.file_name(), n.loc.line());
}

// What made value `v`: "the result of matmul at model.cpp:12", "argument 0", ...
std::string origin(const Program& p, int v) {
  if (int s = p.values[v].source; s >= 0) {
    switch (p.sources[s].kind) {
      case SourceKind::Arg: return fmt::format("argument {}", p.sources[s].index);
      case SourceKind::Captured: return "a captured tensor";
      case SourceKind::Snapshot: return "a tensor made inside the function";
      default: return "an input";
    }
  }
  for (const Node& n : p.nodes)
    if (std::find(n.out.begin(), n.out.end(), v) != n.out.end())
      return "the result of " + describe(n);
  return "an intermediate";
}

// The first op that reads source `s`'s value: "mul at model.cpp:12".
std::string user_of_source(const Program& p, int s) {
  for (size_t v = 0; v < p.values.size(); ++v) {
    if (p.values[v].source != s) continue;
    for (const Node& n : p.nodes)
      if (std::find(n.in.begin(), n.in.end(), int(v)) != n.in.end()) return describe(n);
  }
  return "no op";
}

bool is_random(const Node& n) {
  return n.kind == Node::Kind::Op && op_info(n.op).category == OpCategory::Random;
}

// Random ops draw one generator block per four 32-bit words, from an offset that the earlier
// random ops' sizes set. When sizes change those offsets, each random op's words per element
// (Node::rng_draws) is found from both traces and the offsets follow the sizes.
std::string symbolic_rng(Program& g, const Program& old) {
  bool differ = g.rng_consumed != old.rng_consumed;
  for (size_t i = 0; i < g.nodes.size(); ++i)
    differ |= g.nodes[i].rng_delta != old.nodes[i].rng_delta;
  if (!differ) return {};
  uint64_t next_new = g.rng_consumed, next_old = old.rng_consumed;
  for (size_t i = g.nodes.size(); i-- > 0;) {
    Node& n = g.nodes[i];
    const Node& o = old.nodes[i];
    if (!is_random(n)) continue;
    if (n.rng_delta > next_new || o.rng_delta > next_old)
      return "random numbers were drawn outside the recorded ops";
    uint64_t used_new = next_new - n.rng_delta, used_old = next_old - o.rng_delta;
    auto numel_new = static_cast<uint64_t>(numel(g.values[n.out[0]].shape));
    auto numel_old = static_cast<uint64_t>(numel(old.values[o.out[0]].shape));
    for (int d = 1; d <= 8 && !n.rng_draws; ++d)
      if (philox::blocks(numel_new * d) == used_new && philox::blocks(numel_old * d) == used_old)
        n.rng_draws = d;
    if (!n.rng_draws)
      return fmt::format("the random numbers that {} draws do not follow its size", describe(n));
    next_new = n.rng_delta, next_old = o.rng_delta;
  }
  if (next_new != 0 || next_old != 0) return "random numbers were drawn outside the recorded ops";
  g.rng_symbolic = true;
  return {};
}

// Whether `trace` drew its random numbers at the offsets that `sym` computes for its sizes.
bool rng_conforms(const Program& trace, const Program& sym) {
  auto numel_of = [&](int v) { return numel(trace.values[v].shape); };
  if (!sym.rng_symbolic) {
    for (size_t i = 0; i < trace.nodes.size(); ++i)
      if (trace.nodes[i].rng_delta != sym.nodes[i].rng_delta) return false;
    return trace.rng_consumed == sym.rng_consumed;
  }
  for (size_t i = 0; i < trace.nodes.size(); ++i)
    if (is_random(trace.nodes[i]) &&
        trace.nodes[i].rng_delta != rng_offset_before(sym, i, numel_of))
      return false;
  return trace.rng_consumed == rng_offset_before(sym, sym.nodes.size(), numel_of);
}

// Ops whose attrs.dims hold sizes (not dim indices or a permutation).
bool dims_are_sizes(OpKind op) {
  return op == OpKind::View || op == OpKind::Expand || op == OpKind::LayerNorm ||
         op_info(op).category == OpCategory::Random;
}

// `s` at the argument sizes `shapes` and host-scalar arguments `scalars`, or nothing when it
// names a dim they lack or a scalar that is not an integer.
std::optional<int64_t> evaluate(const SymInt& s, const std::vector<Shape>& shapes,
                                const std::vector<Scalar>& scalars) {
  auto size = [&](int a, int d, bool scalar) -> std::optional<int64_t> {
    if (scalar) {
      if (a < 0 || a >= int(scalars.size()) || !scalars[a].is_integral()) return std::nullopt;
      return scalars[a].to<int64_t>();
    }
    if (a < 0 || a >= int(shapes.size()) || d >= shapes[a].size()) return std::nullopt;
    return shapes[a][d];
  };
  std::optional<int64_t> x = size(s.arg, s.dim, s.scalar);
  std::optional<int64_t> y = s.arg2 < 0 ? 1 : size(s.arg2, s.dim2, s.scalar2);
  if (!x || !y) return std::nullopt;
  if (s.arg2 >= 0) *y += s.offset2;
  return (s.factor * *x * *y + s.bias) / s.divisor * s.multiple + s.offset;
}

// Whether a candidate formula also fits every earlier trace (a Witness).
using Accept = std::function<bool(const SymInt&)>;

// A size formulas are made of, with its value in the new and the old trace: a changed dim of
// a tensor argument, or a changed integer host-scalar argument (`x.slice(0, 0, n)`).
struct SizeBase {
  SymInt sym;
  int64_t now, before;
};

// `a` times (`b` + shift) times factor.
SymInt product_of(const SymInt& a, const SymInt& b, int64_t factor, int64_t shift) {
  SymInt s = a;
  s.factor = factor;
  s.arg2 = b.arg, s.dim2 = b.dim, s.scalar2 = b.scalar, s.offset2 = shift;
  return s;
}

SymInt shifted(SymInt s, int64_t factor, int64_t offset) {
  s.factor = factor;
  s.offset = offset;
  return s;
}

struct Explainer {
  std::vector<SizeBase> sizes;  // changed, and > 0 in both traces
  const std::vector<Shape>&nsh, &osh;
  const std::vector<Scalar>&nsc, &osc;

  Explainer(const std::vector<Shape>& nsh, const std::vector<Shape>& osh,
            const std::vector<std::pair<int, int>>& dims, const std::vector<Scalar>& nsc,
            const std::vector<Scalar>& osc, const std::vector<int>& scalars)
      : nsh(nsh), osh(osh), nsc(nsc), osc(osc) {
    auto add = [&](SymInt s, int64_t now, int64_t before) {
      // Once each: `dims` may name a dim twice, and a size times itself fits two traces by
      // chance ((n * n + 6) / 15 + 2 took min(n, 10) at 11 and 3).
      for (const SizeBase& b : sizes)
        if (b.sym == s) return;
      if (now != before && now > 0 && before > 0) sizes.push_back({s, now, before});
    };
    for (auto [a, d] : dims) {
      SymInt s;
      s.arg = a, s.dim = d;
      add(s, nsh[a][d], osh[a][d]);
    }
    for (int a : scalars) {
      if (a >= int(nsc.size()) || a >= int(osc.size()) || !nsc[a].is_integral() ||
          !osc[a].is_integral() || nsc[a].is_bool())
        continue;
      // >= 2, as symbolic dims: compiled code does not broadcast symbolic sizes (the guard
      // specialises 0 and 1, ArgGuard::size_scalar).
      const int64_t now = nsc[a].to<int64_t>(), before = osc[a].to<int64_t>();
      if (now < 2 || before < 2) continue;
      SymInt s;
      s.arg = a, s.scalar = true;
      add(s, now, before);
    }
  }

  /// `s` in the new trace (`now`) or the old one.
  int64_t at(const SymInt& s, bool now) const {
    return evaluate(s, now ? nsh : osh, now ? nsc : osc).value_or(-1);
  }

  // The first formula, in this order, with new == formula(new sizes), old == formula(old
  // sizes) and accepted by `accept` (earlier traces): a changed size itself; a size plus a
  // constant (a shifted slice's T - 1); a multiple of a size; a multiple of the product of two
  // changed sizes, the second maybe shifted (B * (T - 1)); an affine function of a size; C++
  // integer division (divided()). Two traces whose sizes changed together (batch and length)
  // fit several; simpler formulas first, and a third trace decides.
  // `divisions`: also try divided(); its many formulas fit two traces by chance (2 * (n / 2)
  // took min(n, 10) at 11 and 2), so only where an earlier trace (a witness) must fit too.
  bool operator()(int64_t nv, int64_t ov, SymInt& out, const Accept& accept = nullptr,
                  bool divisions = false) const {
    auto take = [&](const SymInt& s) {
      if (accept && !accept(s)) return false;
      out = s;
      return true;
    };
    for (const SizeBase& b : sizes)
      if (nv == b.now && ov == b.before && take(b.sym)) return true;
    for (const SizeBase& b : sizes)
      if (nv != b.now && nv - b.now == ov - b.before && take(shifted(b.sym, 1, nv - b.now)))
        return true;
    auto fits = [&](int64_t ns, int64_t os) {
      return nv % ns == 0 && ov % os == 0 && nv / ns == ov / os && nv / ns != 0;
    };
    for (const SizeBase& b : sizes)
      if (fits(b.now, b.before) && take(shifted(b.sym, nv / b.now, 0))) return true;
    for (int64_t shift : {0, -1, 1, -2, 2})
      for (size_t i = 0; i < sizes.size(); ++i)
        for (size_t j = shift == 0 ? i + 1 : 0; j < sizes.size(); ++j) {
          if (i == j) continue;
          const SizeBase &x = sizes[i], &y = sizes[j];
          int64_t ns = x.now * (y.now + shift), os = x.before * (y.before + shift);
          if (ns > 0 && os > 0 && fits(ns, os) && take(product_of(x.sym, y.sym, nv / ns, shift)))
            return true;
        }
    for (const SizeBase& b : sizes) {
      if (nv == ov) continue;
      int64_t ds = b.now - b.before;
      if ((nv - ov) % ds != 0) continue;
      int64_t f = (nv - ov) / ds;
      if (take(shifted(b.sym, f, nv - f * b.now))) return true;
    }
    return divisions && divided(nv, ov, take);
  }

  // (factor * size + bias) / divisor * multiple + offset, a product of two sizes in place of
  // the size: what C++ integer division of sizes makes (`n / 2`, `(n + 1) / 2`, `n / 2 - 1`,
  // `(n * m) / 3`, `n - n / 3` = (2n + 2) / 3, `3 * (n / 2)`). Smaller terms first; a factor
  // only alone (with offset and multiple too, (4n + 1) / 5 + 1 fit min(n, 10) at 2, 3 and 11).
  // A value may be 0 in one trace (`n / 4` at n = 3), not in both.
  template <class Take> bool divided(int64_t nv, int64_t ov, Take&& take) const {
    // The sizes or products to divide; not two sizes equal in both traces (duck-sized: a
    // square, which fit min(n, 10) of x [n, 3] and y [n] at 10 and 11).
    std::vector<SizeBase> operands = sizes;
    for (size_t i = 0; i < sizes.size(); ++i)
      for (size_t j = i + 1; j < sizes.size(); ++j)
        if (sizes[i].now != sizes[j].now || sizes[i].before != sizes[j].before)
          operands.push_back({product_of(sizes[i].sym, sizes[j].sym, 1, 0),
                              sizes[i].now * sizes[j].now, sizes[i].before * sizes[j].before});
    // Each candidate (offset, multiple, factor, operand) with the divisors `divisors` gives.
    auto each = [&](auto&& divisors) {
      for (int64_t offset : {0, -1, 1, -2, 2})
        for (int64_t multiple = 1; multiple <= 8; ++multiple) {
          const int64_t t = nv - offset, to = ov - offset;
          // A 0 divides by any multiple: 7 * (n / 5) took a bound 0 at n = 4 and 7 at 6.
          if (t < 0 || to < 0 || t + to == 0 || t % multiple || to % multiple ||
              (multiple > 1 && t * to == 0))
            continue;
          for (int64_t factor = 1; factor <= (offset == 0 && multiple == 1 ? 4 : 1); ++factor)
            for (SizeBase operand : operands) {
              SymInt& s = operand.sym;
              s.factor = factor, s.multiple = multiple, s.offset = offset;
              const int64_t p = factor * operand.now, po = factor * operand.before;
              // (p + b) / k == t needs k * t - p <= b <= k * t + k - 1 - p, so k > p / (t + 1).
              const int64_t k_low =
                  std::max({int64_t(2), p / (t / multiple + 1) + 1, po / (to / multiple + 1) + 1});
              auto [k_from, k_to] = divisors(k_low);
              for (int64_t k = k_from; k < k_to; ++k)
                if (quotient(s, k, p, po, t / multiple, to / multiple, take)) return true;
            }
        }
      return false;
    };
    // Small divisors first, smallest first over all the rest (n / 3 fits (n + 1) / 2 - 1 at
    // 2, 3 and 4 too); then larger ones (n / 128), from the smallest the sizes allow.
    constexpr int64_t kSmall = 16;
    for (int64_t k = 2; k <= kSmall; ++k)
      if (each([&](int64_t k_low) { return std::pair{std::max(k, k_low), k + 1}; })) return true;
    return each([&](int64_t k_low) {
      const int64_t from = std::max(k_low, kSmall + 1);
      return std::pair{from, from + 64};
    });
  }

  // Takes (factor * operand + b) / k with the first bias 0 <= b < k that gives t now and to
  // before (p and po: factor * operand then).
  template <class Take>
  static bool quotient(SymInt& s, int64_t k, int64_t p, int64_t po, int64_t t, int64_t to,
                       Take&& take) {
    const int64_t b_low = std::max({int64_t(0), k * t - p, k * to - po});
    const int64_t b_high = std::min({k - 1, k * t + k - 1 - p, k * to + k - 1 - po});
    for (int64_t b = b_low; b <= b_high; ++b) {
      s.divisor = k, s.bias = b;
      if (take(s)) return true;
    }
    return false;
  }
};

// A wrapped constant that follows a changed size in both traces: an affine function of it (a
// mean's element count in its backward, std's N - correction) or a number divided by one
// (mse_loss's 2/n, var's 2/(N - correction)). Two traces fit many formulas; the confirming
// trace of each new size set refutes a wrong one (conforms()).
std::optional<SizeFormula> size_formula(
    const Scalar& nv, const Scalar& ov, const Explainer& explain, bool divisions,
    const std::function<bool(const SizeFormula&)>& accept = nullptr) {
  if (nv.kind() != ov.kind() || nv.is_bool()) return std::nullopt;
  double n = nv.to<double>(), o = ov.to<double>();
  SizeFormula f;
  auto integral = [](double x) {
    return std::isfinite(x) && x == std::trunc(x) && std::fabs(x) < 0x1p50;
  };
  auto fits = [&](int64_t ns, int64_t os) {
    return same(size_value(f, f.sym.factor * ns, nv), nv) &&
           same(size_value(f, f.sym.factor * os, ov), ov);
  };
  // Integers (and floats holding them): a multiple, product or affine function of sizes.
  auto accept_sym = [&](const SymInt& s) {
    SizeFormula g = f;
    g.sym = s;
    return !accept || accept(g);
  };
  if (integral(n) && integral(o) &&
      explain(int64_t(n), int64_t(o), f.sym, accept_sym, divisions))
    return f;
  if (!nv.is_floating() || n == 0 || o == 0 || n == o || !std::isfinite(n) || !std::isfinite(o))
    return std::nullopt;
  f.reciprocal = true;
  for (const SizeBase& b : explain.sizes) {
    const int64_t ns = b.now, os = b.before;
    // numerator / (factor * size + offset): offset 0, or a small correction (var's N - 1),
    // with the factor that n * (factor * ns + offset) == o * (factor * os + offset) gives.
    for (int64_t offset : {0, -1, 1, -2, 2, -3, 3}) {
      double factor = offset == 0 ? 1.0 : double(offset) * (o - n) / (n * ns - o * os);
      if (!std::isfinite(factor) || std::round(factor) < 1 || std::fabs(factor) > 0x1p30)
        continue;
      f.sym = shifted(b.sym, int64_t(std::round(factor)), 0);
      f.offset = offset;
      f.numerator = n * double(f.sym.factor * ns + offset);
      if (fits(ns, os) && (!accept || accept(f))) return f;
    }
  }
  // numerator / count, the count any integer formula above: a mean over x[:n / 2] of 3
  // columns has 1 / (3 * (n / 2)) in its backward, mse_loss 2 / count.
  f.offset = 0;
  for (double numerator : {1.0, 2.0}) {
    const double count = std::round(numerator / n), count_before = std::round(numerator / o);
    if (count < 1 || count_before < 1 || !integral(count) || !integral(count_before)) continue;
    f.numerator = numerator;
    auto exact = [&](const SymInt& s) {
      SizeFormula g = f;
      g.sym = s;
      return same(size_value(g, explain.at(s, true), nv), nv) &&
             same(size_value(g, explain.at(s, false), ov), ov) && (!accept || accept(g));
    };
    if (explain(int64_t(count), int64_t(count_before), f.sym, exact, divisions)) return f;
  }
  // numerator / sqrt(size + offset) (a scale 1 / std::sqrt(d)) or numerator * sqrt(size +
  // offset) (`x / std::sqrt(d)` divides by the constant sqrt(d)): the numerator recovered is
  // off by rounding; a whole number near it is what the C++ wrote.
  f.root = true;
  for (bool reciprocal : {true, false}) {
    f.reciprocal = reciprocal;
    for (const SizeBase& b : explain.sizes) {
      f.sym = b.sym;
      for (int64_t offset : {0, -1, 1, -2, 2}) {
        if (b.now + offset < 1 || b.before + offset < 1) continue;
        f.offset = offset;
        const double root = std::sqrt(double(b.now + offset));
        const double guess = reciprocal ? n * root : n / root;
        for (double numerator : {std::round(guess), guess}) {
          f.numerator = numerator;
          if (numerator != 0 && fits(b.now, b.before) && (!accept || accept(f))) return f;
        }
      }
    }
  }
  return std::nullopt;
}

int value_of_source(const Program& p, int source) {
  for (size_t v = 0; v < p.values.size(); ++v)
    if (p.values[v].source == source) return int(v);
  return -1;
}

// Whether snapshot value `v` is only ever the destination of one fill_/copy_, which writes all
// of it: its contents are never read (zeros/ones/full are an `empty` then fill_).
bool overwritten_before_read(const Program& p, int v) {
  int uses = 0;
  bool written = false;
  for (const Node& n : p.nodes)
    for (size_t k = 0; k < n.in.size(); ++k) {
      if (n.in[k] != v) continue;
      ++uses;
      written = k == 0 && n.kind == Node::Kind::Op && n.in_place &&
                (n.op == OpKind::Fill || n.op == OpKind::CopyInto);
    }
  for (int o : p.outputs) uses += o == v;
  return uses == 1 && written;
}

// (start, step) when `t` is a 1-D integer tensor start + i * step of at least 2 elements
// (arange), else nothing.
std::optional<std::pair<int64_t, int64_t>> ramp_of(const Tensor& t) {
  if (!t.defined() || t.dim() != 1 || t.numel() < 2 || t.dtype() == DType::Bool)
    return std::nullopt;
  if (!is_integral(t.dtype())) {
    // A float arange of whole numbers (arange(n, Float32)), each exact in its dtype, is
    // materialised by arange as exactly.
    if (t.dtype() != DType::Float32 && t.dtype() != DType::Float64) return std::nullopt;
    const double exact = t.dtype() == DType::Float32 ? 0x1p24 : 0x1p53;
    std::vector<double> f = untraced([&] { return t.to_vector<double>(); });
    for (double e : f)
      if (!(std::fabs(e) <= exact) || e != std::trunc(e)) return std::nullopt;
  }
  std::vector<int64_t> x = untraced([&] { return t.to(DType::Int64).to_vector<int64_t>(); });
  int64_t step = x[1] - x[0];
  for (size_t i = 2; i < x.size(); ++i)
    if (x[i] - x[i - 1] != step) return std::nullopt;
  return std::make_pair(x[0], step);
}

bool same_contents(const Tensor& a, const Tensor& b) {
  if (a.defined() != b.defined()) return false;
  if (!a.defined()) return true;
  if (a.dtype() != b.dtype() || a.shape() != b.shape()) return false;
  Tensor x = a.contiguous(), y = b.contiguous();
  return std::memcmp(x.raw_data(), y.raw_data(), x.numel() * x.itemsize()) == 0;
}

// Empty when `a` and `b` ran the same ops on the same values, apart from integers that sizes
// may change (value dims, view sizes, slice bounds) and wrapped constants; else the difference.
std::string same_structure(const Program& a, const Program& b) {
  if (a.nodes.size() != b.nodes.size()) {
    size_t i = 0;
    while (i < a.nodes.size() && i < b.nodes.size() && a.nodes[i].kind == b.nodes[i].kind &&
           a.nodes[i].op == b.nodes[i].op)
      ++i;
    if (i < a.nodes.size() && i < b.nodes.size())
      return fmt::format("the traces ran different ops at #{}: {} vs {}", i, describe(a.nodes[i]),
                         describe(b.nodes[i]));
    const Program& longer = i < a.nodes.size() ? a : b;
    return fmt::format("one trace ran {} op(s) more than the other, from #{}: {}",
                       longer.nodes.size() - i, i, describe(longer.nodes[i]));
  }
  if (a.values.size() != b.values.size() || a.sources.size() != b.sources.size())
    return "the two traces have different values or inputs";
  for (size_t v = 0; v < a.values.size(); ++v)
    if (a.values[v].dtype != b.values[v].dtype || a.values[v].shape.size() != b.values[v].shape.size() ||
        a.values[v].source != b.values[v].source)
      return fmt::format("value %{} differs in dtype or rank", v);
  for (size_t i = 0; i < a.nodes.size(); ++i) {
    const Node& n = a.nodes[i];
    const Node& o = b.nodes[i];
    if (n.kind != o.kind || n.op != o.op)
      return fmt::format("the traces ran different ops at #{}: {} vs {}", i, describe(n),
                         describe(o));
    if (n.in != o.in || n.out != o.out || n.in_place != o.in_place)
      return fmt::format("op #{} ({}) used different values in the two traces", i, describe(n));
    if (n.kind == Node::Kind::Read) {
      if (!same(n.read_value, o.read_value)) return "a host read saw a different value";
      continue;
    }
    if (n.kind != Node::Kind::Op) continue;
    if (!same_fixed_attrs(n.attrs, o.attrs))
      return fmt::format("attributes of op #{} ({}: a fill value, clamp bounds, a dim) differ "
                         "between the traces",
                         i, describe(n));
    for (int k = 0; k < n.attrs.dims.size(); ++k)
      if (!dims_are_sizes(n.op) && n.attrs.dims[k] != o.attrs.dims[k])
        return fmt::format("a shape attribute of {} is not symbolic", op_name(n.op));
  }
  for (size_t s = 0; s < a.sources.size(); ++s) {
    const Source& ns = a.sources[s];
    const Source& os = b.sources[s];
    auto scalar_kind = [](SourceKind k) {
      return k == SourceKind::Constant || k == SourceKind::ScalarArg || k == SourceKind::SizeOf;
    };
    bool scalar_kinds = scalar_kind(ns.kind) && scalar_kind(os.kind);
    if (!scalar_kinds && (ns.kind != os.kind || ns.index != os.index))
      return "the traces' inputs differ";
    // A non-contiguous .grad's strides follow its sizes: the generalised guard cannot say which.
    if (ns.kind == SourceKind::GradOf && (!ns.contiguous || !os.contiguous))
      return "a .grad the function reads is not contiguous";
    if (ns.kind == SourceKind::Captured &&
        (ns.captured.owner_before(os.captured) || os.captured.owner_before(ns.captured)))
      return "a different tensor was captured";
  }
  if (a.outputs != b.outputs || a.write_backs != b.write_backs ||
      a.grad_assignments != b.grad_assignments ||
      a.grad_undefined_at_call != b.grad_undefined_at_call || a.grad_reach != b.grad_reach ||
      a.grad_sharing != b.grad_sharing || a.grad_same_as != b.grad_same_as ||
      a.args_sharing_captured != b.args_sharing_captured ||
      a.backward_begin != b.backward_begin || a.aliased_mutation != b.aliased_mutation ||
      a.output_constants.size() != b.output_constants.size())
    return "the traces' results differ";
  for (size_t k = 0; k < a.output_constants.size(); ++k)
    if (!same(a.output_constants[k], b.output_constants[k]))
      return "a host value returned by the function depends on the sizes";
  return {};
}

}  // namespace

bool same_ops(const Program& a, const Program& b) { return same_structure(a, b).empty(); }

namespace {

std::string describe(const SymInt& s) {
  auto size = [](int a, int d, bool scalar) {
    return scalar ? fmt::format("arg{}", a) : fmt::format("s{}.{}", a, d);
  };
  std::string e = size(s.arg, s.dim, s.scalar);
  if (s.factor != 1) e = fmt::format("{} * {}", s.factor, e);
  if (s.arg2 >= 0) {
    std::string second = size(s.arg2, s.dim2, s.scalar2);
    if (s.offset2) second = fmt::format("({} {} {})", second, s.offset2 < 0 ? '-' : '+',
                                        std::abs(s.offset2));
    e += " * " + second;
  }
  if (s.divisor != 1) {
    if (s.bias) e = fmt::format("({} + {})", e, s.bias);
    e = fmt::format("{} / {}", e, s.divisor);
    if (s.multiple != 1) e = fmt::format("{} * ({})", s.multiple, e);
  }
  if (s.offset) e = fmt::format("{} {} {}", e, s.offset < 0 ? '-' : '+', std::abs(s.offset));
  return e;
}

bool plain(const SymInt& s) {
  return s.factor == 1 && s.arg2 < 0 && s.divisor == 1 && s.offset == 0;
}

}  // namespace

std::string describe_formulas(const Program& p, size_t limit) {
  std::vector<std::string> all;
  for (const Node& n : p.nodes)
    for (const SymAttr& a : n.sym_attrs)
      if (!plain(a.sym))
        all.push_back(fmt::format("{} {} = {}", describe(n),
                                  a.field == SymAttr::Start ? "start"
                                  : a.field == SymAttr::End ? "end"
                                                            : fmt::format("size {}", a.index),
                                  describe(a.sym)));
  for (size_t s = 0; s < p.sources.size(); ++s) {
    const Source& src = p.sources[s];
    if (src.kind != SourceKind::SizeOf) continue;
    const SizeFormula& f = src.size;
    std::string e = describe(f.sym);
    if (f.offset) e = fmt::format("{} {} {}", e, f.offset < 0 ? '-' : '+', std::abs(f.offset));
    if (f.root) e = fmt::format("sqrt({})", e);
    if (f.reciprocal)
      e = fmt::format("{} / {}", Scalar(f.numerator).str(), f.root ? e : "(" + e + ")");
    else if (f.root && f.numerator != 1) e = fmt::format("{} * {}", Scalar(f.numerator).str(), e);
    all.push_back(fmt::format("a constant used by {} = {}", user_of_source(p, int(s)), e));
  }
  std::string out;
  for (size_t i = 0; i < all.size() && i < limit; ++i) out += (i ? "; " : "") + all[i];
  if (all.size() > limit) out += fmt::format("; and {} more", all.size() - limit);
  return out;
}

std::vector<int> size_scalars(const Program& p) {
  std::vector<int> out;
  auto note = [&](const SymInt& s) {
    for (auto [is_scalar, a] : {std::pair{s.scalar, s.arg}, std::pair{s.scalar2, s.arg2}})
      if (is_scalar && a >= 0 && std::ranges::find(out, a) == out.end()) out.push_back(a);
  };
  for (const ValueInfo& v : p.values)
    for (const SymInt& s : v.sym) note(s);
  for (const Node& n : p.nodes)
    for (const SymAttr& a : n.sym_attrs) note(a.sym);
  for (const Source& s : p.sources)
    if (s.kind == SourceKind::SizeOf) note(s.size.sym);
  return out;
}

Scalar size_value(const SizeFormula& f, int64_t n, const Scalar& traced) {
  if (f.reciprocal)
    return Scalar(f.numerator / (f.root ? std::sqrt(double(n + f.offset)) : double(n + f.offset)));
  if (f.root) return Scalar(f.numerator * std::sqrt(double(n + f.offset)));
  return traced.is_floating() ? Scalar(double(n + f.offset)) : Scalar(n + f.offset);
}

namespace {
template <class F> void for_each_broadcast(const Program& p, F&& fn);
}  // namespace

std::string generalize(Program& nw, const Program& old, const std::vector<Shape>& new_shapes,
                       const std::vector<Shape>& old_shapes,
                       const std::vector<Scalar>& new_scalars,
                       const std::vector<Scalar>& old_scalars,
                       const std::vector<std::pair<int, int>>& dims,
                       const std::vector<int>& scalars, const std::vector<Witness>& earlier) {
  if (std::string why = same_structure(nw, old); !why.empty()) return why;
  std::vector<const Witness*> witnesses;  // earlier traces that ran the same ops
  for (const Witness& w : earlier)
    if (w.program && same_structure(nw, *w.program).empty()) witnesses.push_back(&w);
  // Whether formula `s` gives, at every witness's sizes, what `traced(witness)` was there.
  auto fits_witnesses = [&](const SymInt& s, auto&& traced) {
    for (const Witness* w : witnesses)
      if (evaluate(s, w->shapes, w->scalars) != std::optional<int64_t>(traced(*w->program)))
        return false;
    return true;
  };
  for (auto [a, d] : dims) {
    if (a >= int(new_shapes.size()) || a >= int(old_shapes.size()) || d >= new_shapes[a].size() ||
        d >= old_shapes[a].size())
      return "an argument changed rank";
    if (new_shapes[a][d] != old_shapes[a][d] && (new_shapes[a][d] < 2 || old_shapes[a][d] < 2))
      return "a changed size is 0 or 1 (specialised, as broadcasting depends on it)";
  }
  // Likewise a host integer sizes may follow (a trace at 1 compared with one at 7 took the
  // bound k for 3 * rows - 11).
  for (int a : scalars)
    if (a < int(new_scalars.size()) && a < int(old_scalars.size()) &&
        new_scalars[a].is_integral() && !new_scalars[a].is_bool() &&
        !same(new_scalars[a], old_scalars[a]) &&
        std::min(new_scalars[a].to<int64_t>(), old_scalars[a].to<int64_t>()) < 2)
      return fmt::format("host-scalar argument {} changed from or to {} (integers 0 and 1 are "
                         "specialised, as sizes may follow them)", a,
                         std::min(new_scalars[a].to<int64_t>(), old_scalars[a].to<int64_t>()));
  Explainer explain(new_shapes, old_shapes, dims, new_scalars, old_scalars, scalars);
  // Divisions fit two traces by chance (2 * (n / 2) took min(n, 10) at 2 and 11): a third
  // trace of the same ops must fit them too.
  const bool divisions = !witnesses.empty();
  // Value dims that an op broadcasts (size 1 against another size) in either trace. Compiled
  // regions read a symbolic dim as one that does not broadcast, so such a dim cannot follow a
  // formula: a slice's length 0 in one trace and 1 in the other, broadcast against 3 there,
  // came out of the replay as 1 (kiln-fuzz --seed 2 --index 175).
  std::set<std::pair<int, int>> broadcast;
  for (const Program* p : {static_cast<const Program*>(&nw), &old})
    for_each_broadcast(*p, [&](size_t i, size_t k, int d) {
      broadcast.insert({p->nodes[i].in[k], d});
    });
  Program g = nw;  // work on a copy; commit on success
  for (size_t v = 0; v < g.values.size(); ++v) {
    ValueInfo& nv = g.values[v];
    const ValueInfo& ov = old.values[v];
    nv.sym.assign(nv.shape.size(), SymInt{});
    for (int d = 0; d < nv.shape.size(); ++d) {
      if (nv.shape[d] == ov.shape[d]) continue;
      if (broadcast.count({int(v), d}))
        return fmt::format("a size ({} vs {}, of {}) is 1 where an op broadcasts it "
                           "(specialised: compiled code does not broadcast symbolic sizes)",
                           nv.shape[d], ov.shape[d], origin(g, int(v)));
      auto accept = [&](const SymInt& s) {
        return fits_witnesses(s, [&](const Program& w) { return w.values[v].shape[d]; });
      };
      // A formula the witnesses refute is still taken if none fits them all: the confirming
      // trace of each new size set decides (no divisions there: Explainer::operator()).
      if (!explain(nv.shape[d], ov.shape[d], nv.sym[d], accept, divisions) &&
          !explain(nv.shape[d], ov.shape[d], nv.sym[d], nullptr, false)) {
        return fmt::format("a size ({} vs {}, of {}) follows no formula of the changed argument "
                           "sizes (a multiple, product, affine function or integer division)",
                           nv.shape[d], ov.shape[d], origin(g, int(v)));
      }
    }
  }
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    Node& n = g.nodes[i];
    const Node& o = old.nodes[i];
    if (n.kind != Node::Kind::Op) continue;
    n.sym_attrs.clear();
    auto check = [&](int64_t a, int64_t b, SymAttr::Field f, int idx) {
      if (a == b) return true;
      SymAttr s{f, idx, {}};
      auto accept = [&](const SymInt& sym) {
        return fits_witnesses(sym, [&](const Program& w) {
          const OpAttrs& wa = w.nodes[i].attrs;
          return f == SymAttr::Dims ? wa.dims[idx] : f == SymAttr::Start ? wa.start : wa.end;
        });
      };
      if (!explain(a, b, s.sym, accept, divisions) && !explain(a, b, s.sym, nullptr, false))
        return false;
      n.sym_attrs.push_back(s);
      return true;
    };
    for (int k = 0; k < n.attrs.dims.size(); ++k)
      if (!check(n.attrs.dims[k], o.attrs.dims[k], SymAttr::Dims, k))
        return fmt::format("a shape attribute of {} is not symbolic", op_name(n.op));
    if (!check(n.attrs.start, o.attrs.start, SymAttr::Start, 0) ||
        !check(n.attrs.end, o.attrs.end, SymAttr::End, 0))
      return fmt::format("a bound of {} is not symbolic", op_name(n.op));
  }
  if (std::string why = symbolic_rng(g, old); !why.empty()) return why;
  for (size_t s = 0; s < g.sources.size(); ++s) {
    Source& ns = g.sources[s];
    const Source& os = old.sources[s];
    // A tensor made from host data (a scalar loss's backward seed, a mask from a vector) stays
    // a snapshot if it did not change; conforms() checks it again for each new size set. The
    // inside of zeros()/ones() and arange's ramp follow the sizes.
    if (ns.kind == SourceKind::Snapshot) {
      // Never read, so never compared: equal contents in two traces were the allocator's
      // leftovers (a backward's ones_like seed), which a shape-only run does not write.
      int v = value_of_source(g, int(s));
      if (v >= 0 && overwritten_before_read(g, v)) {
        ns.overwritten = true;
        continue;
      }
      if (same_contents(ns.snapshot, os.snapshot)) continue;
      auto nr = ramp_of(ns.snapshot), orr = ramp_of(os.snapshot);
      if (v >= 0 && nr && nr == orr && g.values[v].sym[0].arg >= 0) {
        ns.ramp = true;
        std::tie(ns.ramp_start, ns.ramp_step) = *nr;
        continue;
      }
      return fmt::format("a tensor the function creates from host data ({} {}, read first by "
                         "{}) differs between the sizes and is neither an arange of whole "
                         "numbers nor overwritten by fill_/copy_",
                         name(ns.snapshot.dtype()), to_string(ns.snapshot.shape()),
                         user_of_source(g, int(s)));
    }
    if (ns.kind != SourceKind::Constant || same(ns.scalar, os.scalar)) continue;
    bool found = false;
    for (int a : scalars)
      if (a < int(new_scalars.size()) && same(ns.scalar, new_scalars[a]) &&
          same(os.scalar, old_scalars[a])) {
        ns.kind = SourceKind::ScalarArg;
        ns.index = a;
        found = true;
        break;
      }
    auto accept = [&](const SizeFormula& f) {
      for (const Witness* w : witnesses) {
        // The witness's traced value (its source may have become SizeOf since).
        const Scalar& traced = w->program->sources[s].scalar;
        std::optional<int64_t> n = evaluate(f.sym, w->shapes, w->scalars);
        if (!n || !same(traced, size_value(f, *n, traced))) return false;
      }
      return true;
    };
    std::optional<SizeFormula> f;
    if (!found && !(f = size_formula(ns.scalar, os.scalar, explain, divisions, accept)))
      f = size_formula(ns.scalar, os.scalar, explain, false);
    if (!found && f) {
      ns.kind = SourceKind::SizeOf;
      ns.size = *f;
      found = true;
    }
    if (!found)
      return fmt::format("a constant ({} vs {}), used by {}, is neither a host-scalar argument "
                         "nor a multiple, reciprocal or reciprocal square root of a changed "
                         "size", ns.scalar.str(), os.scalar.str(), user_of_source(g, int(s)));
  }
  nw = std::move(g);
  return {};
}

std::string stale_trace_difference(const Program& replayed, const Program& fresh) {
  constexpr const char* kHostState =
      "C++ reads of host state are constants of the trace: pass the value as an argument, or "
      "read it with kiln::guarded";
  auto source_of = [](const Program& p, int v) -> const Source* {
    return v >= 0 && p.values[v].source >= 0 ? &p.sources[p.values[v].source] : nullptr;
  };
  auto same_data = [](const Tensor& a, const Tensor& b) {
    return a.shape() == b.shape() && a.dtype() == b.dtype() &&
           untraced([&] { return a.to_vector<double>() == b.to_vector<double>(); });
  };
  const size_t common = std::min(replayed.nodes.size(), fresh.nodes.size());
  for (size_t i = 0; i < common; ++i) {
    const Node& r = replayed.nodes[i];
    const Node& f = fresh.nodes[i];
    if (r.kind != f.kind || r.op != f.op)
      return fmt::format("the compiled code runs {} where eager now runs {}: the function took "
                         "another path than when it was traced; {}",
                         describe(r), describe(f), kHostState);
    if (r.kind != Node::Kind::Op) continue;
    for (size_t k = 0; k < r.in.size() && k < f.in.size(); ++k) {
      const Source* a = source_of(replayed, r.in[k]);
      const Source* b = source_of(fresh, f.in[k]);
      if (!a || !b || a->kind != b->kind) continue;
      if (a->kind == SourceKind::Constant && !same(a->scalar, b->scalar))
        return fmt::format("{} uses the constant {} it was traced with; eager now uses {}: {}",
                           describe(r), a->scalar.str(), b->scalar.str(), kHostState);
      if (a->kind == SourceKind::Captured &&
          (a->captured.owner_before(b->captured) || b->captured.owner_before(a->captured)))
        return fmt::format("{} reads the captured tensor it was traced with; eager now reads "
                           "another (a captured variable reassigned while the old tensor lives)",
                           describe(r));
      if (a->kind == SourceKind::Snapshot && !a->overwritten && !a->ramp &&
          a->snapshot.defined() && b->snapshot.defined() && !same_data(a->snapshot, b->snapshot))
        return fmt::format("{} reads a tensor made from host data inside the function, as it "
                           "was when traced; the data has changed since: {}",
                           describe(r), kHostState);
    }
    if (!same_fixed_attrs(r.attrs, f.attrs))
      return fmt::format("{} has the attributes (a fill value, clamp bounds, a dim) it was "
                         "traced with; eager now passes others: {}",
                         describe(r), kHostState);
  }
  if (replayed.nodes.size() != fresh.nodes.size()) {
    const Program& longer = replayed.nodes.size() > fresh.nodes.size() ? replayed : fresh;
    return fmt::format("the compiled code runs {} op(s), eager now {}, from {}: the function "
                       "took another path than when it was traced; {}",
                       replayed.nodes.size(), fresh.nodes.size(), describe(longer.nodes[common]),
                       kHostState);
  }
  return {};
}

namespace {

// Whether `op` broadcasts size-1 dims of its inputs (right-aligned against its output): the
// elementwise ops, matmul's batch dims and addmm's bias, expand, copy_'s source, masked_fill's
// mask and mse_loss. Other ops' input sizes equal their output's or are not aligned with it
// (embedding's indices, a reduced or concatenated dim): counting those made an index [1]
// against an embedding's [1, D] output a broadcast, so mark_dynamic at size 1 was dropped.
bool broadcasts_inputs(OpKind op) {
  switch (op_info(op).category) {
    case OpCategory::Binary:
    case OpCategory::Ternary:
    case OpCategory::Matmul: return true;
    default:
      return op == OpKind::Expand || op == OpKind::CopyInto || op == OpKind::MaskedFill ||
             op == OpKind::MseLoss;
  }
}

// Calls `fn(node, input position, dim)` for each size-1 dim of an op's input that the op
// broadcast to another size (0 included): against its output, or for mse_loss, whose output
// is reduced, against the other input.
template <class F> void for_each_broadcast(const Program& p, F&& fn) {
  for (size_t i = 0; i < p.nodes.size(); ++i) {
    const Node& n = p.nodes[i];
    if (n.kind != Node::Kind::Op || n.out.empty() || n.out[0] < 0 || !broadcasts_inputs(n.op))
      continue;
    Shape to = p.values[n.out[0]].shape;
    if (n.op == OpKind::MseLoss && n.in.size() == 2 && n.in[0] >= 0 && n.in[1] >= 0) {
      const Shape &a = p.values[n.in[0]].shape, &b = p.values[n.in[1]].shape;
      to = a.size() >= b.size() ? a : b;
      const Shape& shorter = a.size() >= b.size() ? b : a;
      for (int d = 0; d < shorter.size(); ++d) {
        int64_t& t = to[to.size() - shorter.size() + d];
        if (t == 1) t = shorter[d];
      }
    }
    for (size_t k = 0; k < n.in.size(); ++k) {
      const int v = n.in[k];
      if (v < 0 || p.values[v].wrapped) continue;
      const Shape& in = p.values[v].shape;
      for (int d = 0; d < in.size(); ++d) {
        int od = int(to.size()) - (int(in.size()) - d);
        if (in[d] == 1 && od >= 0 && to[od] != 1) fn(i, k, d);
      }
    }
  }
}

}  // namespace

std::string conforms(const Program& trace, const Program& sym, const std::vector<Shape>& shapes,
                     const std::vector<Scalar>& scalars) {
  if (std::string why = same_structure(trace, sym); !why.empty()) return why;
  auto at = [&](const SymInt& s) { return evaluate(s, shapes, scalars); };
  // Symbolic dims must follow their formulas, and static ones keep their size: compiled regions
  // are built with them (a guard may let a dim vary that two traces saw equal). Static sizes 0
  // and 1 are left to the replay, which re-infers them (a marked dim traced at size 1 leaves
  // broadcast results static), except in tensors the replay allocates from the formulas
  // (zeros/ones, arange).
  for (size_t v = 0; v < trace.values.size(); ++v) {
    const ValueInfo& tv = trace.values[v];
    const ValueInfo& sv = sym.values[v];
    const bool allocated = sv.source >= 0 && (sym.sources[sv.source].overwritten ||
                                              sym.sources[sv.source].ramp);
    for (int d = 0; d < tv.shape.size() && d < int(sv.sym.size()); ++d) {
      if (sv.sym[d].arg < 0 && sv.shape[d] <= 1 && !allocated) continue;
      int64_t expected = sv.sym[d].arg < 0 ? sv.shape[d] : at(sv.sym[d]).value_or(-1);
      if (tv.shape[d] != expected)
        return fmt::format("value %{} ({}) has size {} in dim {}, the symbolic trace gives {}", v,
                           origin(trace, int(v)), tv.shape[d], d, expected);
    }
  }
  for (size_t i = 0; i < trace.nodes.size(); ++i) {
    const Node& tn = trace.nodes[i];
    const Node& sn = sym.nodes[i];
    if (tn.kind != Node::Kind::Op) continue;
    OpAttrs expected = sn.attrs;
    for (const SymAttr& s : sn.sym_attrs) {
      int64_t x = at(s.sym).value_or(-1);
      if (s.field == SymAttr::Dims) expected.dims[s.index] = x;
      if (s.field == SymAttr::Start) expected.start = x;
      if (s.field == SymAttr::End) expected.end = x;
    }
    if (tn.attrs.dims != expected.dims || tn.attrs.start != expected.start ||
        tn.attrs.end != expected.end)
      return fmt::format("a size or bound of op #{} ({}) at {}:{} is not what the symbolic trace "
                         "gives", i, op_name(tn.op), tn.loc.file_name(), tn.loc.line());
  }
  // Compiled regions are built with the symbolic trace's broadcasts: an operand that has size 1
  // only now (a marked dim traced at 1 with another operand also at 1, then called with 4 and 1)
  // would be read as if it had the other's size, past its end. (A broadcast of the symbolic
  // trace that is no longer one, 1 against 1 now, computes the same.)
  std::set<std::tuple<size_t, size_t, int>> sym_broadcasts;
  for_each_broadcast(sym, [&](size_t i, size_t k, int d) { sym_broadcasts.insert({i, k, d}); });
  std::string broadcast_differs;
  for_each_broadcast(trace, [&](size_t i, size_t k, int d) {
    if (broadcast_differs.empty() && !sym_broadcasts.count({i, k, d}))
      broadcast_differs = fmt::format(
          "op #{} ({}) at {}:{} broadcasts a size-1 dim of its input {} that the symbolic trace "
          "did not broadcast", i, op_name(trace.nodes[i].op), trace.nodes[i].loc.file_name(),
          trace.nodes[i].loc.line(), k);
  });
  if (!broadcast_differs.empty()) return broadcast_differs;
  if (!rng_conforms(trace, sym))
    return "the random ops drew at other generator offsets than the symbolic trace gives";
  for (size_t s = 0; s < trace.sources.size(); ++s) {
    const Source& ts = trace.sources[s];
    const Source& ss = sym.sources[s];
    if (ss.kind == SourceKind::ScalarArg) {
      if (ss.index >= int(scalars.size()) || !same(ts.scalar, scalars[ss.index]))
        return "a constant is no longer the host-scalar argument";
    } else if (ss.kind == SourceKind::SizeOf) {
      std::optional<int64_t> n = at(ss.size.sym);
      if (!n || ts.kind != SourceKind::Constant ||
          !same(ts.scalar, size_value(ss.size, *n, ts.scalar)))
        return fmt::format("a constant ({}), used by {}, does not follow the size it followed "
                           "in the symbolic trace", ts.scalar.str(), user_of_source(trace, int(s)));
    } else if (ts.kind == SourceKind::Constant) {
      if (ss.kind != SourceKind::Constant || !same(ts.scalar, ss.scalar))
        return fmt::format("a constant used by {} changed ({} vs {})",
                           user_of_source(trace, int(s)), ts.scalar.str(), ss.scalar.str());
    } else if (ts.kind == SourceKind::Snapshot && !ss.overwritten) {
      bool same = ss.ramp ? ramp_of(ts.snapshot) == std::make_pair(ss.ramp_start, ss.ramp_step)
                          : same_contents(ts.snapshot, ss.snapshot);
      if (!same)
        return fmt::format("a tensor the function created from host data, used by {}, changed",
                           user_of_source(trace, int(s)));
    }
  }
  return {};
}

bool broadcasts_size_one(const Program& p) {
  bool any = false;
  for_each_broadcast(p, [&](size_t, size_t, int) { any = true; });
  // squeeze drops a dim because it is 1 (the compiled region keeps a symbolic one).
  for (const Node& n : p.nodes)
    any |= n.kind == Node::Kind::Op && n.op == OpKind::Squeeze && !n.in.empty() &&
           n.in[0] >= 0 && !n.out.empty() && n.out[0] >= 0 &&
           p.values[n.out[0]].shape.size() < p.values[n.in[0]].shape.size();
  return any;
}

void mark_symbolic(Program& p, const std::vector<Shape>& shapes,
                   const std::vector<std::pair<int, int>>& dims) {
  auto match = [&](int64_t v, SymInt& out) {
    for (auto [a, d] : dims)
      if (shapes[a][d] >= 2 && v == shapes[a][d]) {
        out = {a, d, 1};
        return true;
      }
    return false;
  };
  for (ValueInfo& v : p.values) {
    v.sym.assign(v.shape.size(), SymInt{});
    if (v.source >= 0 && p.sources[v.source].kind == SourceKind::Arg) {
      int a = p.sources[v.source].index;
      for (auto [da, d] : dims)
        if (da == a && d < v.shape.size()) v.sym[d] = {a, d, 1};
      continue;
    }
    for (int d = 0; d < v.shape.size(); ++d) match(v.shape[d], v.sym[d]);
  }
  for (Node& n : p.nodes) {
    if (n.kind != Node::Kind::Op || !dims_are_sizes(n.op) ||
        op_info(n.op).category == OpCategory::Random)
      continue;
    for (int k = 0; k < n.attrs.dims.size(); ++k) {
      SymAttr s{SymAttr::Dims, k, {}};
      if (match(n.attrs.dims[k], s.sym)) n.sym_attrs.push_back(s);
    }
  }
}

}  // namespace kiln::tracer
