#pragma once
/// The formula of every elementwise op, written once.
///
/// Each op of the Unary, Binary and Ternary categories in core/ops.def has one struct here,
/// named like its OpKind (formulas::Exp for OpKind::Exp; gelu has GeluErf and GeluTanh, one per
/// `approximate` mode), whose static `eval` is a function template over a scalar algebra type S.
/// Attributes are extra arguments (Add::eval(a, b, alpha), Clamp::eval(x, low, high)).
/// The same template is instantiated
///   * with float / double / int32_t / int64_t (scalar loops, tests),
///   * with xsimd::batch<float> / batch<double> (the eager CPU kernels), and
///   * later with an MLIR value builder (the compiled kernels),
/// so eager and compiled code compute the same formula.
///
/// What S must provide: + - * / and comparisons (a comparison gives S's mask type: bool for
/// scalars, a batch_bool for SIMD), && || ! on masks, construction from a double constant
/// (S(0.5)), and the free functions used below (exp, log, erfc, floor, nearbyint, isnan, select,
/// fma, ...). Scalars get them from <cmath> and from `select` below; other types supply overloads in
/// their own namespace, found by argument-dependent lookup. Nothing here includes xsimd or MLIR.
///
/// Some ops keep a scalar-only branch (`if constexpr (kIsInteger<S>)`): integer division,
/// remainder and power need data-dependent control flow; the kernels run them in scalar loops.
#include <bit>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <type_traits>

namespace kiln::formulas {

// ================================ the scalar algebra ================================
// Math functions for float/double come from <cmath>; a SIMD or IR value type brings its own
// (found by ADL), so formulas call them unqualified.
using std::abs;
using std::atan2;
using std::ceil;
using std::copysign;
using std::cos;
using std::erf;
using std::erfc;
using std::exp;
using std::exp2;
using std::expm1;
using std::floor;
using std::fma;
using std::fmod;
using std::isnan;
using std::log;
using std::log1p;
using std::log2;
using std::nearbyint;
using std::pow;
using std::sin;
using std::sqrt;
using std::tan;
using std::tanh;
using std::trunc;

/// Whether S is an integer type (formulas with integer-specific semantics branch on it).
/// Specialise it for value types that model integers.
template <class S> inline constexpr bool kIsInteger = std::is_integral_v<S>;

/// mask ? a : b, elementwise. SIMD and IR types provide their own `select(mask, a, b)`.
template <class S> S select(bool mask, S a, S b) { return mask ? a : b; }

/// Two's-complement arithmetic for integers (wraps on overflow like PyTorch, no undefined
/// behaviour); plain arithmetic for floating types.
template <class S> S wrapping_add(S a, S b) {
  if constexpr (kIsInteger<S>) {
    using U = std::make_unsigned_t<S>;
    return static_cast<S>(static_cast<U>(a) + static_cast<U>(b));
  } else {
    return a + b;
  }
}
template <class S> S wrapping_sub(S a, S b) {
  if constexpr (kIsInteger<S>) {
    using U = std::make_unsigned_t<S>;
    return static_cast<S>(static_cast<U>(a) - static_cast<U>(b));
  } else {
    return a - b;
  }
}
template <class S> S wrapping_mul(S a, S b) {
  if constexpr (kIsInteger<S>) {
    using U = std::make_unsigned_t<S>;
    return static_cast<S>(static_cast<U>(a) * static_cast<U>(b));
  } else {
    return a * b;
  }
}
template <class S> S wrapping_neg(S a) {
  if constexpr (kIsInteger<S>) {
    using U = std::make_unsigned_t<S>;
    return static_cast<S>(U{0} - static_cast<U>(a));
  } else {
    return S(-1) * a;  // not 0 - a (which some SIMD libraries use): -(+0) must be -0
  }
}

// ============================ float32 exponentials ============================
// e^x and 2^x for float32 over the whole float range, written once: eager's float kernels
// (F32Exp below) and the compiled float32 code (codegen/lower.cpp) both evaluate these.
// Results are within ~1 ulp, up to the largest float (exp overflows to inf only from
// ln(FLT_MAX) = 88.7228, exp2 from 128) and down through the denormals (exp gives 0 only below
// -103.97, exp2 below -150): the SIMD library's Cephes version cut both ends at ±88.376.

/// x rounded to the nearest integer, ties to even (nearbyint in the default rounding mode), for
/// |x| < 2^22. The IR algebra overloads it (codegen/lower.cpp) with two additions, x + 1.5·2^23
/// − 1.5·2^23 (no fraction bits are left after the first): the same values without a
/// float-to-int conversion, which a GPU runs at 1/4 to 1/8 of its fma rate. On a CPU the one
/// rounding instruction is cheaper than two additions.
template <class S> S round_small(S x) { return nearbyint(x); }

/// e^r · 2^k, for |r| <= ~0.35 and an integral-valued k in [-151, 129]. e^r: Cephes' degree-5
/// polynomial (the coefficients of xsimd's expf). 2^k is applied in two steps, 2^h · 2^(k-h) with
/// h = floor(k / 2), so each factor is a normal float: e^r · 2^h is exact, and the one rounding
/// is the last multiply's (an overflow to inf, or a denormal result rounded, not flushed to 0).
/// `pow2i(n)` gives 2^n for an integral-valued n in [-76, 65] from S's exponent bits.
///
/// The roundings are round_small's, so compiled code rounds without float-to-int conversions:
/// four of them per element made a fused gelu chain instruction-bound on the H200 (63 % of copy
/// bandwidth).
template <class S, class P> S exp_f32_scaled(S k, S r, const P& pow2i) {
  S y(0x1.6ef19ep-10);
  for (double c : {0x1.131b16p-7, 0x1.5552aep-5, 0x1.55534ap-3, 0.5}) y = fma(y, r, S(c));
  S p = fma(y, r * r, r) + S(1);
  S h = round_small(fma(k, S(0.5), S(-0.25)));  // floor(k / 2): k / 2 - 1/4 is exact
  return p * pow2i(h) * pow2i(k - h);
}

/// x clamped to [low, high] with NaN taken as `low` (the result for NaN is selected apart).
template <class S> S clamp_not_nan(S x, double low, double high) {
  S c = select(x > S(low), x, S(low));
  return select(c < S(high), c, S(high));
}

/// float32 e^x: k = round(x / ln 2), r = x − k·ln 2 in two parts (Cody-Waite), e^r · 2^k.
/// x is clamped to [-104, 89] first, where e^x already rounds to 0 and inf.
template <class S, class P> S exp_f32(S x, const P& pow2i) {
  S xc = clamp_not_nan(x, -104.0, 89.0);
  S k = round_small(xc * S(0x1.715476p+0));  // 1 / ln 2
  S r = fma(-k, S(0x1.63p-1), xc);         // ln 2, high part (exact k·ln2_hi)
  r = fma(-k, S(-0x1.bd0106p-13), r);      // ln 2, low part
  return select(isnan(x), x, exp_f32_scaled(k, r, pow2i));
}

/// float32 2^x: k = round(x), e^((x − k)·ln 2) · 2^k; x is clamped to [-151, 129] first.
template <class S, class P> S exp2_f32(S x, const P& pow2i) {
  S xc = clamp_not_nan(x, -151.0, 129.0);
  S k = round_small(xc);
  S r = (xc - k) * S(0.69314718055994530942);
  return select(isnan(x), x, exp_f32_scaled(k, r, pow2i));
}

/// Whether S's exp / exp2 / expm1 are the float32 versions above (Exp, Exp2 and Expm1 below
/// branch on it); such an algebra specialises F32Exp with `static S pow2i(S n)`. float is
/// specialised here, xsimd::batch<float> in backends/cpu/simd_exp.h; the IR algebra (whose
/// type is known only at run time) calls exp_f32 / exp2_f32 from its own exp / exp2.
template <class S> struct F32Exp {
  static constexpr bool kEnabled = false;
};
template <> struct F32Exp<float> {
  static constexpr bool kEnabled = true;
  static float pow2i(float n) { return std::bit_cast<float>((static_cast<int32_t>(n) + 127) << 23); }
};

/// float32 e^x − 1 from `lib`, the library's expm1(x) (accurate near 0, but it overflows from
/// 88.38), taken up to 20; above, e^x − 1 rounds to e^x, which exp_f32 gives.
template <class S, class P> S expm1_f32(S x, S lib, const P& pow2i) {
  return select(x > S(20), exp_f32(x, pow2i), lib);
}

/// a·b − p exactly, for p the rounded a·b (the product's rounding error, itself representable):
/// fma(a, b, −p) where S's fma rounds once, as for scalars (libm's fma) and compiled code.
/// backends/cpu/simd_exp.h specialises it for SIMD batches, whose fma rounds twice in builds
/// for CPUs without one (KILN_NATIVE=OFF: SSE2): Dekker's product of Veltkamp halves there.
template <class S> struct ProductError {
  static S of(S a, S b, S p) { return fma(a, b, -p); }
};

// ============================ float64 SIMD ranges ============================

/// Whether S's exp / exp2 / expm1 / erf / erfc are a SIMD library's float64 versions that fail
/// before the double range ends: xsimd's exp overflows from 709.44 (ln DBL_MAX is 709.78) and
/// gives 0 from −708.4 (e^x is a denormal down to −745.1), exp2 overflows from 1023, erf and
/// erfc give NaN for huge |x| (and erfc is off by 3e-9 relative at 21). Exp, Exp2 and Expm1
/// below then use the full-range forms that follow, Erf and GeluErf the specialisation's
/// `static S erf(S)` / `erfc(S)`, Sin, Cos and Tan its `sin` / `cos` / `tan`. Specialised for
/// xsimd::batch<double> in backends/cpu/simd_exp.h; scalar double uses libm and compiled code
/// MLIR's math lowering (libm's erf / erfc for float64), both correct.
template <class S> struct F64Range {
  static constexpr bool kEnabled = false;
};

/// e^x from a library exp exact on [−700, 700]: e^(x − k)·e^k with k = ±700 beyond it (x − k is
/// exact there, by Sterbenz's lemma; e^±700 is rounded once, so the result is within ~1.5 ulp).
template <class S> S exp_f64(S x) {
  S k = select(x > S(700), S(700), select(x < S(-700), S(-700), S(0)));
  S scale = select(x > S(700), S(0x1.d945df4f8ec8ep+1009),
                   select(x < S(-700), S(0x1.14f2b0fb9307fp-1010), S(1)));
  return exp(x - k) * scale;
}
/// 2^x as 2^(x − k)·2^k with k = ±1000 beyond [−1000, 1000] (both factors exact).
template <class S> S exp2_f64(S x) {
  S k = select(x > S(1000), S(1000), select(x < S(-1000), S(-1000), S(0)));
  S scale = select(x > S(1000), S(0x1p+1000), select(x < S(-1000), S(0x1p-1000), S(1)));
  return exp2(x - k) * scale;
}
/// Whether S (a SIMD batch of float or double) has vector forms of atan2 and pow
/// (kAtan2Pow: `static S atan2(S, S)`, `pow(S, S)`, with IEEE / libm special values) and an
/// exact fmod (kFmod: `static S fmod(S, S)`, equal to libm's fmod for every input). Atan2, Pow,
/// Remainder and FloorDivide below use them; everything else (scalars, the IR algebra, SIMD
/// builds without them) calls atan2 / pow / fmod. Specialised in backends/cpu/simd_exp.h.
template <class S> struct VecMath {
  static constexpr bool kAtan2Pow = false;
  static constexpr bool kFmod = false;
  static constexpr bool kTrig = false;  // float32 sin / cos / tan (static S sin(S) ...)
};
/// fmod(a, b), exactly (IEEE fmod is exact): VecMath's where it has one.
template <class S> S exact_fmod(S a, S b) {
  if constexpr (VecMath<S>::kFmod) return VecMath<S>::fmod(a, b);
  else return fmod(a, b);
}

// ================================ unary ================================

/// -x (integers wrap: -INT_MIN = INT_MIN).
struct Neg {
  template <class S> static S eval(S x) { return wrapping_neg(x); }
};

/// |x| (integers wrap: |INT_MIN| = INT_MIN).
struct Abs {
  template <class S> static S eval(S x) {
    if constexpr (kIsInteger<S>) {
      return x < S(0) ? wrapping_neg(x) : x;
    } else {
      return abs(x);
    }
  }
};

/// -1, 0 or +1; zeros and NaN are returned unchanged.
struct Sign {
  // Zeros and NaN pass through as x + 0: NaN stays NaN and -0 becomes +0 (PyTorch's
  // (0 < x) - (x < 0) gives +0 for -0).
  template <class S> static S eval(S x) {
    return select(x > S(0), S(1), select(x < S(0), S(-1), x + S(0)));
  }
};

struct Exp {
  template <class S> static S eval(S x) {
    if constexpr (F32Exp<S>::kEnabled) return exp_f32(x, F32Exp<S>::pow2i);
    else if constexpr (F64Range<S>::kEnabled) return exp_f64(x);
    else return exp(x);
  }
};
struct Exp2 {
  template <class S> static S eval(S x) {
    if constexpr (F32Exp<S>::kEnabled) return exp2_f32(x, F32Exp<S>::pow2i);
    else if constexpr (F64Range<S>::kEnabled) return exp2_f64(x);
    else return exp2(x);
  }
};
struct Log {
  template <class S> static S eval(S x) { return log(x); }
};
struct Log2 {
  template <class S> static S eval(S x) { return log2(x); }
};
/// log(1 + x); ±0 is returned as it is (xsimd's log1p(−0) gave +0; IEEE and PyTorch give −0).
struct Log1p {
  template <class S> static S eval(S x) { return select(x == S(0), x, log1p(x)); }
};
/// e^x − 1; ±0 is returned as it is (IEEE and PyTorch: expm1(−0) = −0).
struct Expm1 {
  template <class S> static S eval(S x) { return select(x == S(0), x, any_range(x)); }
  template <class S> static S any_range(S x) {
    if constexpr (F32Exp<S>::kEnabled) return expm1_f32(x, expm1(x), F32Exp<S>::pow2i);
    // e^x − 1 rounds to e^x above 40 (e^40 > 2^53)
    else if constexpr (F64Range<S>::kEnabled) return select(x > S(40), exp_f64(x), expm1(x));
    else return expm1(x);
  }
};
struct Sqrt {
  template <class S> static S eval(S x) { return sqrt(x); }
};
/// 1 / sqrt(x), exactly rounded parts (not a hardware estimate).
struct Rsqrt {
  template <class S> static S eval(S x) { return S(1) / sqrt(x); }
};
struct Reciprocal {
  template <class S> static S eval(S x) { return S(1) / x; }
};
/// sin, cos, tan; float64 SIMD lanes through F64Range, float32 ones through VecMath (libmvec:
/// an exact argument reduction, a lane's result its own).
struct Sin {
  template <class S> static S eval(S x) {
    if constexpr (F64Range<S>::kEnabled) return F64Range<S>::sin(x);
    else if constexpr (VecMath<S>::kTrig) return VecMath<S>::sin(x);
    else return sin(x);
  }
};
struct Cos {
  template <class S> static S eval(S x) {
    if constexpr (F64Range<S>::kEnabled) return F64Range<S>::cos(x);
    else if constexpr (VecMath<S>::kTrig) return VecMath<S>::cos(x);
    else return cos(x);
  }
};
struct Tan {
  template <class S> static S eval(S x) {
    if constexpr (F64Range<S>::kEnabled) return F64Range<S>::tan(x);
    else if constexpr (VecMath<S>::kTrig) return VecMath<S>::tan(x);
    else return tan(x);
  }
};
struct Tanh {
  template <class S> static S eval(S x) { return tanh(x); }
};
/// erf; ±0 is returned as it is (compiled float32's polynomial gave +0 for −0).
struct Erf {
  template <class S> static S eval(S x) {
    if constexpr (F64Range<S>::kEnabled) return F64Range<S>::erf(x);
    else return select(x == S(0), x, erf(x));
  }
};

/// a / b for b in [1, +inf] (the 1 + e^-x of sigmoid, silu and gelu): exact division here and
/// on the CPU. Compiled code marks it approximable (codegen/lower.cpp), and a GPU divides with
/// PTX div.full.f32 (within 2 ulp over the whole range, a few instructions) instead of IEEE
/// division's ~10 and its slow path (codegen/gpu_lowering.cpp, divide_full_range).
template <class S> S divide_by_at_least_one(S a, S b) { return a / b; }

/// 1 / (1 + e^-x), evaluated from e = e^-|x| (at most 1, never overflows): 1 / (1 + e) for
/// x >= 0, e / (1 + e) for x < 0, so sigmoid(-100) is the denormal 3.8e-44, not 1/inf = 0.
struct Sigmoid {
  template <class S> static S eval(S x) {
    S e = Exp::eval(select(x < S(0), x, -x));
    S r = divide_by_at_least_one(S(1), S(1) + e);
    return select(x < S(0), e * r, r);
  }
};

/// max(x, 0); NaN stays NaN (a NaN is not < 0).
struct Relu {
  template <class S> static S eval(S x) { return select(x < S(0), S(0), x); }
};

/// The part of the real constant c that S(c) leaves out, for S of float32 or float64 elements,
/// given c's float64 residual: S(c) − S(float(c)) is 0 in float32 and exactly c's float32
/// residual in float64 (Sterbenz's lemma), which picks the right residual without naming S's
/// element type (the IR algebra has one type for both).
template <class S> S residual_of(double c, double float64_residual) {
  const double f = static_cast<float>(c);
  return S(c - f) - (S(c) - S(f)) + S(float64_residual);
}

/// float32 erfc(x) within ~3 ulp over the whole range (0 from 10.0546875 on), and e^(−x²)
/// beside it (gelu's derivative takes its φ from it: no second exp). The approximation MLIR's
/// compiled float32 erfc uses, after Shepherd and Laframboise, "Chebyshev approximation of
/// (1 + 2x)·exp(x²)·erfc x in 0 <= x < inf" (Math. Comp. 36, 1981): for a = |x|,
/// (1 + 2a)·e^(a²)·erfc(a) − 1 is a degree-9 polynomial in q = (a − 2)/(a + 2), then divided
/// by 1 + 2a and multiplied by e^(−a²); erfc(x) = 2 − erfc(a) for x < 0. e^(−a²) is e^(−s) for
/// s = a² rounded, times 1 − ds for s's exact error ds (ProductError): the rounding of s
/// alone put erfc up to 70 ulp off from 8 on, as in the SIMD library's erfc (also 5 ulp off
/// near 0: erfc(0) = 0.99999988, so gelu'(0) was 0.49999994). The two divisions are left
/// uncorrected (each ~1 ulp of q or of the result; gelu stays within 5.3 ulp): a Newton step
/// on each made eager gelu 29 % slower than with the SIMD library's erfc (gelu_erf_16M), and
/// in-cache compute 50 % slower; on q alone 12 %.
template <class S> struct ErfcGauss {
  S erfc, gauss;  // erfc(x) and e^(−x²)
};
template <class S> ErfcGauss<S> erfc_gauss_f32(S x) {
  const S a = abs(x), one(1), two(2);
  S p(-0x1.a4a000p-12);
  const S q = (a - two) / (a + two);
  for (double c : {-0x1.42a260p-10, 0x1.585714p-10, 0x1.1adcc4p-07, -0x1.081b82p-07,
                   -0x1.bc0b6ap-05, 0x1.4ffc46p-03, -0x1.540840p-03, -0x1.7bf616p-04,
                   0x1.1ba03ap-02})
    p = fma(p, q, S(c));
  S r = (p + one) / fma(two, a, one);
  const S s = a * a;
  const S ds = select(s < S(1e4), ProductError<S>::of(a, a, s), S(0));  // not s = inf's
  const S ex = Exp::eval(-s);
  r = fma(r, ex, r * ex * -ds);            // e^(−a²) = e^(−s)·(1 − (a² − s))
  r = select(a < S(INFINITY), r, x + x);   // NaN stays NaN; erfc(±inf) below
  r = select(a > S(10.0546875), S(0), r);  // erfc rounds to 0 from there on
  return {select(x < S(0), two - r, r), fma(ex, -ds, ex)};
}

/// gelu with approximate="none": x·Φ(x) = 0.5·x·(1 + erf(x/√2)), evaluated as
/// 0.5·x·erfc(z), z = −x/√2 (the same value, without the cancellation of 1 + erf for x ≪ 0).
/// erfc(z) changes by a relative −R(z)·dz for a change dz of z, R(z) = 2e^(−z²)/(√π·erfc(z)),
/// about 2z for z >= 1: the rounding of z alone put float32 gelu(−12.9) 196 ulp off (relative
/// 1.6e-5; found by a break-it pass). So z's rounding error dz is computed exactly
/// (ProductError, and 1/√2's own residual) and erfc(z) scaled by 1 − 2z·dz where z > 0 (x < 0),
/// which leaves under an ulp (R(z) − 2z is at most 0.64 at z = 1, where dz is below an ulp of
/// z). Past z = 30 erfc(z) is 0 in float64 too, and 2z·dz could overflow. erfc's sign is
/// dropped: the SIMD library's erfc gave −0 for huge z, so gelu(−3e7) was +0 (compiled, and
/// PyTorch: −0). float32 erfc is erfc_gauss_f32 (eager; compiled code's math.erfc is MLIR's form of
/// it), float64 F64Range's where a SIMD library's would fail.
struct GeluErf {
  static constexpr double kInvSqrt2 = 0.70710678118654752440;
  /// 2Φ(x) = erfc(−x/√2), z's rounding corrected (gelu's and its derivative's Φ). float32
  /// eager (erfc_gauss_f32) also gives e^(−x²/2) = e^(−z²)·(1 − 2z·dz) in *gauss where asked.
  template <class S> static S two_cdf(S x, S* gauss = nullptr) {
    const S c = S(-kInvSqrt2), c_lo = -residual_of<S>(kInvSqrt2, -4.8336466567264567e-17);
    S z = x * c;
    S dz = ProductError<S>::of(x, c, z) + x * c_lo;
    auto erfc_of = [&](S v) -> S {
      if constexpr (F64Range<S>::kEnabled) {
        return F64Range<S>::erfc(v);
      } else if constexpr (F32Exp<S>::kEnabled) {
        ErfcGauss<S> p = erfc_gauss_f32(v);
        if (gauss) *gauss = p.gauss * (S(1) - select(abs(v) < S(30), S(2) * v * dz, S(0)));
        return p.erfc;
      } else {
        return erfc(v);
      }
    };
    S e = erfc_of(z);
    S scale = S(1) - select(z > S(0) && z < S(30), S(2) * z * dz, S(0));
    return abs(e) * scale;
  }
  template <class S> static S eval(S x) { return S(0.5) * x * two_cdf(x); }
};

/// gelu with approximate="tanh": 0.5·x·(1 + tanh(u)), u = √(2/π)·(x + 0.044715·x³),
/// evaluated as x / (1 + e^(−2u)) (identical since 0.5·(1 + tanh u) = sigmoid(2u)): one exp,
/// and no cancellation for x ≪ 0.
struct GeluTanh {
  template <class S> static S eval(S x) {
    S u2 = S(2 * 0.79788456080286535588) * (x + S(0.044715) * x * x * x);
    return divide_by_at_least_one(x, S(1) + Exp::eval(-u2));
  }
};

/// g · d gelu(x)/dx for approximate="none": g·(Φ(x) + x·φ(x)), Φ(x) = erfc(−x/√2)/2,
/// φ(x) = e^(−x²/2)/√(2π) (Hendrycks & Gimpel, 2016). For eager backward (cpu::gelu_backward);
/// a trace records eager/derivatives.cpp's formula instead.
/// Φ as gelu's (GeluErf::two_cdf); e^(−x²/2) corrected for the rounding of x² (up to 40 ulp
/// in float32 for x near −13): float32 eager takes it from erfc's own e^(−z²) (two_cdf's
/// gauss; one exp instead of two), other types from s = x² and its exact error ds as
/// e^(−s/2)·(1 − ds/2).
struct GeluErfBackward {
  template <class S> static S eval(S x, S g) {
    constexpr double kInvSqrt2Pi = 0.39894228040143267794;
    if constexpr (F32Exp<S>::kEnabled && !F64Range<S>::kEnabled) {
      S gauss;  // e^(−x²/2), from erfc's own exp
      S cdf = S(0.5) * GeluErf::two_cdf(x, &gauss);
      return g * (cdf + x * (gauss * S(kInvSqrt2Pi)));
    }
    S cdf = S(0.5) * GeluErf::two_cdf(x);
    S s = x * x;
    S ds = select(s < S(1e4), ProductError<S>::of(x, x, s), S(0));  // not s = inf's
    S pdf = Exp::eval(S(-0.5) * s) * (S(1) - S(0.5) * ds) * S(kInvSqrt2Pi);
    return g * (cdf + x * pdf);
  }
};

/// g · d gelu(x)/dx for approximate="tanh": with s = sigmoid(2u) = (1 + tanh u)/2 and
/// u = k·(x + c·x³) (k = √(2/π), c = 0.044715), d/dx = s + 2k·x·s·(1 − s)·(1 + 3c·x²).
struct GeluTanhBackward {
  template <class S> static S eval(S x, S g) {
    constexpr double k = 0.79788456080286535588, c = 0.044715;
    S s = Sigmoid::eval(S(2 * k) * (x + S(c) * x * x * x));
    return g * (s + S(2 * k) * x * s * (S(1) - s) * (S(1) + S(3 * c) * x * x));
  }
};

/// x · sigmoid(x), as x / (1 + e^-x) like PyTorch (silu(-100) is -0 in float32 there too).
struct Silu {
  template <class S> static S eval(S x) { return divide_by_at_least_one(x, S(1) + Exp::eval(-x)); }
};

/// Rounding ops are the identity on integers.
struct Floor {
  template <class S> static S eval(S x) {
    if constexpr (kIsInteger<S>)
      return x;
    else
      return floor(x);
  }
};
struct Ceil {
  template <class S> static S eval(S x) {
    if constexpr (kIsInteger<S>)
      return x;
    else
      return ceil(x);
  }
};
/// Round half to even (nearbyint in the default rounding mode), like PyTorch.
struct Round {
  template <class S> static S eval(S x) {
    if constexpr (kIsInteger<S>)
      return x;
    else
      return nearbyint(x);
  }
};
struct Trunc {
  template <class S> static S eval(S x) {
    if constexpr (kIsInteger<S>)
      return x;
    else
      return trunc(x);
  }
};

/// x == 0 (a mask: bool for scalars).
struct LogicalNot {
  template <class S> static auto eval(S x) { return x == S(0); }
};

// ================================ binary ================================

/// a + alpha·b (integers wrap).
struct Add {
  template <class S> static S eval(S a, S b) { return wrapping_add(a, b); }
  template <class S> static S eval(S a, S b, S alpha) {
    return wrapping_add(a, wrapping_mul(alpha, b));
  }
};

/// a − alpha·b (integers wrap).
struct Sub {
  template <class S> static S eval(S a, S b) { return wrapping_sub(a, b); }
  template <class S> static S eval(S a, S b, S alpha) {
    return wrapping_sub(a, wrapping_mul(alpha, b));
  }
};

/// a·b (integers wrap).
struct Mul {
  template <class S> static S eval(S a, S b) { return wrapping_mul(a, b); }
};

/// True division (floating types only; integers are converted before).
struct Div {
  template <class S> static S eval(S a, S b) { return a / b; }
};

/// floor(a / b).
/// Integers: INT_MIN / −1 wraps to INT_MIN without executing that division (it traps on
/// x86); b = 0 returns 0 and must be rejected by the caller. Floats: as PyTorch (and Python's
/// //): from fmod so that a = q·b + r holds exactly; b = 0 gives a / b (±inf or nan).
struct FloorDivide {
  template <class S> static S eval(S a, S b) {
    if constexpr (kIsInteger<S>) {
      if (b == S(0)) return S(0);
      if (b == S(-1)) return wrapping_neg(a);
      S q = a / b;
      S r = a % b;
      return (r != 0 && ((r < 0) != (b < 0))) ? S(q - 1) : q;
    } else {
      S mod = exact_fmod(a, b);
      S div = (a - mod) / b;
      div = select(mod != S(0) && ((b < S(0)) != (mod < S(0))), div - S(1), div);
      S fl = floor(div);
      fl = select(div - fl > S(0.5), fl + S(1), fl);
      S q = select(div == S(0), copysign(S(0), a / b), fl);
      return select(b == S(0), a / b, q);
    }
  }
};

/// a − floor(a/b)·b: the result has the sign of the divisor (Python's %).
/// Integers: INT_MIN % −1 = 0; b = 0 returns 0 and must be rejected by the caller.
/// Floats: fmod adjusted by b; b = 0 gives nan.
struct Remainder {
  template <class S> static S eval(S a, S b) {
    if constexpr (kIsInteger<S>) {
      if (b == S(0) || b == S(-1)) return S(0);
      S r = a % b;
      return (r != 0 && ((r < 0) != (b < 0))) ? S(r + b) : r;
    } else {
      S mod = exact_fmod(a, b);
      return select(mod != S(0) && ((b < S(0)) != (mod < S(0))), mod + b, mod);
    }
  }
};

/// a^b. Floats: IEEE pow. Integers: exact by repeated squaring (wrapping); a negative exponent
/// gives 1/a^|b| truncated: 1 for a = 1, ±1 for a = −1, 0 otherwise (a = 0 is for the caller
/// to reject; it returns 0 here).
struct Pow {
  template <class S> static S eval(S a, S b) {
    if constexpr (kIsInteger<S>) {
      if (b < S(0)) {
        if (a == S(1)) return S(1);
        if (a == S(-1)) return (b & S(1)) ? S(-1) : S(1);
        return S(0);
      }
      using U = std::make_unsigned_t<S>;
      U result = 1, base = static_cast<U>(a);
      for (U e = static_cast<U>(b); e != 0; e >>= 1) {
        if (e & 1) result *= base;
        base *= base;
      }
      return static_cast<S>(result);
    } else if constexpr (VecMath<S>::kAtan2Pow) {
      return VecMath<S>::pow(a, b);
    } else {
      return pow(a, b);
    }
  }
};

/// The larger of a and b; NaN if either is NaN; a when they are equal (-0 and +0 too, as
/// PyTorch's std::max: maximum(-0., 0.) = -0., clamp(-0., 0, 1) = -0.).
struct Maximum {
  template <class S> static S eval(S a, S b) { return select(a < b || isnan(b), b, a); }
};

/// The smaller of a and b; NaN if either is NaN; a when they are equal.
struct Minimum {
  template <class S> static S eval(S a, S b) { return select(b < a || isnan(b), b, a); }
};

struct Atan2 {
  template <class S> static S eval(S a, S b) {
    if constexpr (VecMath<S>::kAtan2Pow) return VecMath<S>::atan2(a, b);
    // A float in double, as the SIMD form: rounded once (0.5 ulp; atan2f is 1.2 ulp off).
    else if constexpr (std::is_same_v<S, float>)
      return static_cast<float>(std::atan2(static_cast<double>(a), static_cast<double>(b)));
    else return atan2(a, b);
  }
};

// Comparisons and logical ops give masks (bool for scalars).
struct Eq {
  template <class S> static auto eval(S a, S b) { return a == b; }
};
struct Ne {
  template <class S> static auto eval(S a, S b) { return a != b; }
};
struct Lt {
  template <class S> static auto eval(S a, S b) { return a < b; }
};
struct Le {
  template <class S> static auto eval(S a, S b) { return a <= b; }
};
struct Gt {
  template <class S> static auto eval(S a, S b) { return a > b; }
};
struct Ge {
  template <class S> static auto eval(S a, S b) { return a >= b; }
};
struct LogicalAnd {
  template <class S> static auto eval(S a, S b) { return (a != S(0)) && (b != S(0)); }
};
struct LogicalOr {
  template <class S> static auto eval(S a, S b) { return (a != S(0)) || (b != S(0)); }
};
struct LogicalXor {
  template <class S> static auto eval(S a, S b) { return (a != S(0)) != (b != S(0)); }
};

// ================================ ternary ================================

/// cond ? a : b.
struct Where {
  template <class M, class S> static S eval(M cond, S a, S b) { return select(cond, a, b); }
};

// ================================ unary, built on binary ================================

/// min(max(x, low), high) with NaN propagation (as PyTorch: low > high gives high). An absent
/// bound is passed as −inf/+inf (or the integer type's limits), which leaves x unchanged.
struct Clamp {
  template <class S> static S eval(S x, S low, S high) {
    return Minimum::eval(Maximum::eval(x, low), high);
  }
};

}  // namespace kiln::formulas
