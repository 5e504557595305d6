// Sample inputs per op category (see samples.h and README.md).
#include "samples.h"

#include <cmath>
#include <limits>

namespace conf {
namespace {

using kiln::Scalar;
constexpr DType F32 = DType::Float32, F64 = DType::Float64, I32 = DType::Int32,
                I64 = DType::Int64, B = DType::Bool;
const std::vector<DType> kAll = {F32, F64, I32, I64, B};

double float_value(Pool pool, int64_t i, int salt) {
  const double inf = std::numeric_limits<double>::infinity();
  static const std::vector<double> special = {
      0.0, -0.0, 1.5, -2.25, 0.5, -0.1, 3.0, -7.5, 100.0, -100.0, inf, -inf, NAN,
      1e-40 /* float32 denormal */, 2.0, -1.0, 0.75, 1e-310 /* float64 denormal */, -3.5, 1.0,
      0.25, -0.5, 1e10, -3e38, 40.0, 2.5};
  static const std::vector<double> finite = {0.5, -1.25, 2.0, -0.75, 1.5, -2.5, 0.25, 3.0,
                                             -0.125, 1.0, -3.0, 0.625, 0.0, -0.0, 4.5, -6.0, 1.75};
  size_t j = static_cast<size_t>(i * 7 + salt * 5);
  int64_t h = (i * 37 + salt * 11) % 97;
  switch (pool) {
    case Pool::Special: return special[j % special.size()];
    case Pool::NegInf: return j % 6 == 5 ? -inf : finite[j % finite.size()];
    case Pool::Smooth: return (h % 2 ? -1.0 : 1.0) * (0.2 + 1.2 * static_cast<double>(h) / 97.0);
    case Pool::Positive: return 0.3 + 1.2 * static_cast<double>(h) / 97.0;
    default: return finite[j % finite.size()];
  }
}

template <class I> int64_t int_value(Pool pool, int64_t i, int salt) {
  static const std::vector<int64_t> special = {0, 1, -1, 7, -13, std::numeric_limits<I>::min(),
                                               std::numeric_limits<I>::max(), 2, 3, -4, 100,
                                               -100, 5, 6, -2, 11, 31};
  static const std::vector<int64_t> finite = {1, -2, 3, 0, 5, -4, 2, 7, -1, 6, -3};
  size_t j = static_cast<size_t>(i * 7 + salt * 5);
  return pool == Pool::Special ? special[j % special.size()] : finite[j % finite.size()];
}

template <class T> Tensor build(const Ix& shape, int salt, Pool pool, int64_t bound) {
  int64_t n = numel(shape);
  std::vector<T> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    T x;
    if (pool == Pool::Index) x = static_cast<T>((i * 3 + salt) % std::max<int64_t>(bound, 1));
    else if constexpr (std::is_same_v<T, bool>) x = ((i * 3 + salt) % 5) < 2;
    else if (pool == Pool::Mask) x = static_cast<T>(((i * 3 + salt) % 5) < 2);
    else if constexpr (std::is_floating_point_v<T>) x = static_cast<T>(float_value(pool, i, salt));
    else x = static_cast<T>(int_value<T>(pool, i, salt));
    v[static_cast<size_t>(i)] = x;
  }
  return kiln::from_vector<T>(v, kiln::Shape(shape));
}

}  // namespace

Tensor make(DType dt, const Ix& shape, int salt, Pool pool, Layout layout, int64_t bound) {
  Ix phys = shape;
  if (layout == Layout::Transposed && shape.size() >= 2) std::swap(phys[phys.size() - 1], phys[phys.size() - 2]);
  if (layout == Layout::Expanded && !shape.empty()) phys.back() = 1;
  Tensor t;
  switch (dt) {
    case F32: t = build<float>(phys, salt, pool, bound); break;
    case F64: t = build<double>(phys, salt, pool, bound); break;
    case I32: t = build<int32_t>(phys, salt, pool, bound); break;
    case I64: t = build<int64_t>(phys, salt, pool, bound); break;
    default: t = build<bool>(phys, salt, pool, bound); break;
  }
  if (layout == Layout::Transposed && shape.size() >= 2) return t.transpose(-2, -1);
  if (layout == Layout::Expanded && !shape.empty()) return t.expand(kiln::Shape(shape));
  return t;
}

namespace {

OpAttrs with(std::function<void(OpAttrs&)> f) {
  OpAttrs a;
  f(a);
  return a;
}
std::string dn(DType d) { return std::string(kiln::name(d)); }

bool positive_domain(OpKind k) {
  switch (k) {
    case OpKind::Log: case OpKind::Log2: case OpKind::Log1p: case OpKind::Sqrt: case OpKind::Rsqrt:
    case OpKind::Pow: case OpKind::FloorDivide: case OpKind::Remainder:
      return true;
    default: return false;
  }
}

}  // namespace

std::vector<Sample> samples(OpKind k, bool grad, std::string& missing) {
  std::vector<Sample> out;
  using Mk = std::function<std::vector<Tensor>()>;
  auto S = [&](std::string what, Mk mk, OpAttrs a = {}, bool comp = false) {
    out.push_back({std::move(what), std::move(mk), a, comp});
  };
  const std::vector<DType> dts = grad ? std::vector<DType>{F64} : kAll;
  const Pool pool = grad ? (positive_domain(k) ? Pool::Positive : Pool::Smooth) : Pool::Special;
  const Pool fin = grad ? pool : Pool::Finite;
  const kiln::OpInfo& info = kiln::op_info(k);
  using L = Layout;
  switch (info.category) {
    case kiln::OpCategory::Unary: {
      for (DType d : dts) {
        bool fl = is_float(d);
        std::vector<OpAttrs> as = {OpAttrs{}};
        if (k == OpKind::Gelu) as.push_back(with([](OpAttrs& a) { a.mode = 1; }));
        if (k == OpKind::Clamp) {
          Scalar lo = grad ? Scalar(-0.5) : fl ? Scalar(-1.5) : Scalar(int64_t(-4));
          Scalar hi = grad ? Scalar(0.9) : fl ? Scalar(2.5) : Scalar(int64_t(7));
          as = {with([&](OpAttrs& a) { a.alpha = lo; a.beta = hi; a.has_low = a.has_high = true; }),
                with([&](OpAttrs& a) { a.alpha = lo; a.has_low = true; }),
                with([&](OpAttrs& a) { a.beta = hi; a.has_high = true; })};
          // (Bounds outside int32's range raise, as in PyTorch: tests/eager/tensor_test.cpp.)
          if (!fl && !grad)
            as.push_back(with([](OpAttrs& a) { a.alpha = Scalar(0.5); a.has_low = true; }));  // promotes
        }
        for (size_t q = 0; q < as.size(); ++q) {
          std::string t = " " + dn(d) + " attrs#" + std::to_string(q);
          S("[4,5]" + t, [=] { return std::vector<Tensor>{make(d, {4, 5}, 0, pool)}; }, as[q], true);
          S("transposed" + t, [=] { return std::vector<Tensor>{make(d, {3, 4}, 1, pool, L::Transposed)}; }, as[q], d == F32);
          if (grad) continue;
          S("0-d" + t, [=] { return std::vector<Tensor>{make(d, {}, 3, pool)}; }, as[q]);
          S("empty" + t, [=] { return std::vector<Tensor>{make(d, {0, 3}, 0, pool)}; }, as[q]);
          S("expanded" + t, [=] { return std::vector<Tensor>{make(d, {4, 5}, 2, pool, L::Expanded)}; }, as[q]);
        }
        if (k == OpKind::Clamp && !grad)
          S("no bounds " + dn(d), [=] { return std::vector<Tensor>{make(d, {4, 5}, 0, pool)}; });
      }
      break;
    }
    case kiln::OpCategory::Binary: {
      for (DType d : dts) {
        bool fl = is_float(d);
        std::vector<OpAttrs> as = {OpAttrs{}};
        if ((k == OpKind::Add || k == OpKind::Sub) && d != B) {
          as.push_back(with([](OpAttrs& a) { a.alpha = Scalar(int64_t(2)); }));
          if (fl) as.push_back(with([](OpAttrs& a) { a.alpha = Scalar(0.5); }));
        }
        DType d2 = d == F32 ? I32 : F32;
        Pool p2 = pool;
        for (size_t q = 0; q < as.size(); ++q) {
          std::string t = " " + dn(d) + " attrs#" + std::to_string(q);
          S("[4,5]" + t, [=] { return std::vector<Tensor>{make(d, {4, 5}, 0, pool), make(d, {4, 5}, 1, p2)}; }, as[q], true);
          S("transposed" + t, [=] { return std::vector<Tensor>{make(d, {3, 4}, 0, pool, L::Transposed), make(d, {3, 4}, 3, p2)}; }, as[q], d == F32);
          S("broadcast" + t, [=] { return std::vector<Tensor>{make(d, {3, 1}, 1, pool), make(d, {1, 4}, 2, p2)}; }, as[q], d == F32);
          if (grad) continue;
          S("0-d with [3]" + t, [=] { return std::vector<Tensor>{make(d, {}, 4, pool), make(d, {3}, 2, p2)}; }, as[q]);
          S("empty" + t, [=] { return std::vector<Tensor>{make(d, {0, 3}, 0, pool), make(d, {1, 3}, 2, p2)}; }, as[q]);
          S("mixed " + dn(d2) + t, [=] { return std::vector<Tensor>{make(d, {4, 5}, 5, pool), make(d2, {4, 5}, 6, p2)}; }, as[q], d == F32);
          S("expanded" + t, [=] { return std::vector<Tensor>{make(d, {4, 5}, 5, pool, L::Expanded), make(d, {4, 5}, 6, p2)}; }, as[q]);
          S("bad shapes" + t, [=] { return std::vector<Tensor>{make(d, {3}, 0, pool), make(d, {4}, 1, p2)}; }, as[q]);
        }
        if (!grad && (k == OpKind::FloorDivide || k == OpKind::Remainder || k == OpKind::Pow || k == OpKind::Div)) {
          bool pw = k == OpKind::Pow;
          S("nonzero divisor / small exponent " + dn(d), [=] {
            return std::vector<Tensor>{make(d, {4, 5}, 2, Pool::Special),
                                       pw ? make(d, {4, 5}, 1, Pool::Index, L::Contiguous, 4)
                                          : make(d, {4, 5}, 1, Pool::Index, L::Contiguous, 5) };
          }, {}, true);
          if (!pw)  // divisor 1..5 (index pool shifted is not available: use finite nonzero ints)
            S("finite " + dn(d), [=] { return std::vector<Tensor>{make(d, {4, 5}, 3, Pool::Finite), make(d, {4, 5}, 0, Pool::Finite)}; });
        }
      }
      break;
    }
    case kiln::OpCategory::Ternary: {
      for (DType d : dts)
        for (DType d2 : grad ? std::vector<DType>{d} : std::vector<DType>{d, F64}) {
          std::string t = " " + dn(d) + "/" + dn(d2);
          S("[4,5]" + t, [=] { return std::vector<Tensor>{make(B, {4, 5}, 0, Pool::Mask), make(d, {4, 5}, 1, pool), make(d2, {4, 5}, 2, pool)}; }, {}, d == d2);
          S("broadcast" + t, [=] { return std::vector<Tensor>{make(B, {3, 1}, 0, Pool::Mask), make(d, {1, 4}, 1, pool), make(d2, {}, 2, pool)}; }, {}, d == F32);
          S("transposed" + t, [=] { return std::vector<Tensor>{make(B, {3, 4}, 1, Pool::Mask, L::Transposed), make(d, {3, 4}, 1, pool, L::Transposed), make(d2, {3, 4}, 2, pool)}; });
          if (grad) continue;
          S("empty" + t, [=] { return std::vector<Tensor>{make(B, {0, 3}, 0, Pool::Mask), make(d, {0, 3}, 1, pool), make(d2, {1, 3}, 2, pool)}; });
          S("float condition" + t, [=] { return std::vector<Tensor>{make(F32, {4, 5}, 0, pool), make(d, {4, 5}, 1, pool), make(d2, {4, 5}, 2, pool)}; });
          S("bad shapes" + t, [=] { return std::vector<Tensor>{make(B, {3}, 0, Pool::Mask), make(d, {4}, 1, pool), make(d2, {3}, 2, pool)}; });
        }
      break;
    }
    case kiln::OpCategory::Reduction:
    case kiln::OpCategory::IndexReduction: {
      bool index = info.category == kiln::OpCategory::IndexReduction;
      auto dims = [&](std::vector<int64_t> ds, bool keep, bool all = false) {
        return with([&](OpAttrs& a) {
          if (index) {
            a.all_dims = all;
            if (!ds.empty()) a.dim = ds[0];
          } else {
            a.dims = kiln::Dims(ds);
            a.all_dims = all;
          }
          a.keepdim = keep;
          if (k == OpKind::Var || k == OpKind::Std) a.mode = 1;
        });
      };
      Pool rp = k == OpKind::Prod ? fin : pool;
      struct R { std::string what; Ix shape; L layout; OpAttrs a; bool comp; };
      std::vector<R> rs = {{"[4,5] all", {4, 5}, L::Contiguous, dims({}, false, true), true},
                           {"[4,5] dim 1", {4, 5}, L::Contiguous, dims({1}, false), true},
                           {"[4,5] dim 0 keepdim", {4, 5}, L::Contiguous, dims({0}, true), false},
                           {"transposed dim -1", {3, 4}, L::Transposed, dims({-1}, false), false}};
      if (!grad) {
        std::vector<R> more = {{"0-d", {}, L::Contiguous, dims({}, false, true), false},
                               {"0-d dim 0", {}, L::Contiguous, dims({0}, false), false},
                               {"empty [0,3] dim 1", {0, 3}, L::Contiguous, dims({1}, false), false},
                               {"empty [0,3] dim 0", {0, 3}, L::Contiguous, dims({0}, false), false},
                               {"expanded dim 1", {4, 5}, L::Expanded, dims({1}, false), false},
                               {"dim 2 of [4,5]", {4, 5}, L::Contiguous, dims({2}, false), false}};
        if (!index) more.push_back({"[2,3,4] dims {0,2}", {2, 3, 4}, L::Contiguous, dims({0, 2}, false), false});
        rs.insert(rs.end(), more.begin(), more.end());
      }
      if (k == OpKind::Var || k == OpKind::Std) {
        rs.push_back({"[4,5] dim 1 correction 0", {4, 5}, L::Contiguous, with([](OpAttrs& a) { a.dims = kiln::Dims({1}); a.mode = 0; }), false});
        if (!grad) rs.push_back({"[1,5] dim 0 correction 1", {1, 5}, L::Contiguous, with([](OpAttrs& a) { a.dims = kiln::Dims({0}); a.mode = 1; }), false});
        // N - correction <= 0 on rows that are not constant: inf (PyTorch), eager and compiled.
        if (!grad) rs.push_back({"[4,5] dim 1 correction 6", {4, 5}, L::Contiguous, with([](OpAttrs& a) { a.dims = kiln::Dims({1}); a.mode = 6; }), true});
      }
      for (DType d : dts)
        for (const R& r : rs)
          S(r.what + " " + dn(d), [=] { return std::vector<Tensor>{make(d, r.shape, 0, rp, r.layout)}; }, r.a, r.comp);
      break;
    }
    case kiln::OpCategory::Normalization: {
      if (k == OpKind::LayerNorm) {
        for (DType d : grad ? dts : std::vector<DType>{F32, F64, I64}) {
          std::string t = " " + dn(d);
          DType wd = is_float(d) ? d : F32;
          auto ns = [](std::vector<int64_t> v) { return with([&](OpAttrs& a) { a.dims = kiln::Dims(v); }); };
          S("[4,5] weight bias" + t, [=] { return std::vector<Tensor>{make(d, {4, 5}, 0, fin), make(wd, {5}, 1, fin), make(wd, {5}, 2, fin)}; }, ns({5}), true);
          S("[2,3,4] over [3,4] weight" + t, [=] { return std::vector<Tensor>{make(d, {2, 3, 4}, 0, fin), make(wd, {3, 4}, 1, fin), Tensor()}; }, ns({3, 4}));
          S("transposed no affine" + t, [=] { return std::vector<Tensor>{make(d, {3, 4}, 0, fin, L::Transposed), Tensor(), Tensor()}; }, ns({4}), d == F32);
          if (grad) continue;
          S("empty [0,5]" + t, [=] { return std::vector<Tensor>{make(d, {0, 5}, 0, fin), Tensor(), Tensor()}; }, ns({5}));
          S("bad normalized_shape" + t, [=] { return std::vector<Tensor>{make(d, {4, 5}, 0, fin), Tensor(), Tensor()}; }, ns({4}));
          S("bad weight shape" + t, [=] { return std::vector<Tensor>{make(d, {4, 5}, 0, fin), make(wd, {4}, 1, fin), Tensor()}; }, ns({5}));
        }
        break;
      }
      Pool np = grad ? pool : Pool::NegInf;
      auto dim = [](int64_t d) { return with([&](OpAttrs& a) { a.dim = d; }); };
      for (DType d : grad ? dts : std::vector<DType>{F32, F64, I64, B}) {
        std::string t = " " + dn(d);
        S("[4,5] dim -1" + t, [=] { return std::vector<Tensor>{make(d, {4, 5}, 0, np)}; }, dim(-1), true);
        S("[4,5] dim 0" + t, [=] { return std::vector<Tensor>{make(d, {4, 5}, 1, np)}; }, dim(0));
        S("transposed dim 1" + t, [=] { return std::vector<Tensor>{make(d, {3, 4}, 2, np, L::Transposed)}; }, dim(1), d == F32);
        if (grad) continue;
        S("special values dim 1" + t, [=] { return std::vector<Tensor>{make(d, {4, 5}, 0, Pool::Special)}; }, dim(1));
        S("0-d" + t, [=] { return std::vector<Tensor>{make(d, {}, 2, np)}; }, dim(0));
        S("empty [0,3] dim 1" + t, [=] { return std::vector<Tensor>{make(d, {0, 3}, 0, np)}; }, dim(1));
        S("dim 2 of [4,5]" + t, [=] { return std::vector<Tensor>{make(d, {4, 5}, 0, np)}; }, dim(2));
      }
      break;
    }
    case kiln::OpCategory::Matmul: {
      Pool mp = grad ? pool : Pool::Finite;
      if (k == OpKind::Matmul) {
        struct M { std::string what; Ix a, b; L la; bool comp; };
        std::vector<M> ms = {{"2-D", {3, 4}, {4, 5}, L::Contiguous, true},
                             {"1-D @ 2-D", {4}, {4, 5}, L::Contiguous, false},
                             {"2-D @ 1-D", {3, 4}, {4}, L::Contiguous, false},
                             {"1-D @ 1-D", {4}, {4}, L::Contiguous, false},
                             {"batched", {2, 3, 4}, {2, 4, 5}, L::Contiguous, true},
                             {"broadcast batch", {1, 3, 4}, {2, 4, 5}, L::Contiguous, false},
                             {"transposed", {3, 4}, {4, 5}, L::Transposed, true}};
        if (!grad) {
          std::vector<M> more = {{"2-D @ 3-D", {3, 4}, {2, 4, 5}, L::Contiguous, false},
                                 {"empty K", {3, 0}, {0, 5}, L::Contiguous, false},
                                 {"empty M", {0, 4}, {4, 5}, L::Contiguous, false},
                                 {"mismatch", {3, 4}, {5, 6}, L::Contiguous, false},
                                 {"0-d", {}, {4}, L::Contiguous, false}};
          ms.insert(ms.end(), more.begin(), more.end());
        }
        for (DType d : dts)
          for (const M& m : ms)
            S(m.what + " " + dn(d), [=] { return std::vector<Tensor>{make(d, m.a, 0, is_float(d) ? mp : Pool::Special, m.la), make(d, m.b, 1, is_float(d) ? mp : Pool::Special)}; }, {}, m.comp && (d == F32 || d == I64 || grad));
        if (!grad)
          S("mixed float32/int32", [=] { return std::vector<Tensor>{make(F32, {3, 4}, 0, mp), make(I32, {4, 5}, 1, mp)}; });
      } else {
        for (DType d : dts) {
          bool fl = is_float(d);
          std::vector<OpAttrs> as = {OpAttrs{},
              with([&](OpAttrs& a) { a.alpha = fl ? Scalar(0.5) : Scalar(int64_t(2)); a.beta = fl ? Scalar(-1.5) : Scalar(int64_t(3)); })};
          struct M { std::string what; Ix bias; L la; };
          std::vector<M> ms = {{"bias [5]", {5}, L::Contiguous}, {"bias [3,5]", {3, 5}, L::Contiguous},
                               {"bias [1,5] transposed a", {1, 5}, L::Transposed}};
          if (!grad) ms.push_back({"bias 0-d", {}, L::Contiguous}), ms.push_back({"bias [4]", {4}, L::Contiguous});
          for (const M& m : ms)
            for (size_t q = 0; q < as.size(); ++q)
              S(m.what + " " + dn(d) + " attrs#" + std::to_string(q), [=] {
                Pool p = fl ? mp : Pool::Special;
                return std::vector<Tensor>{make(d, m.bias, 2, p), make(d, {3, 4}, 0, p, m.la), make(d, {4, 5}, 1, p)};
              }, as[q], q == 0 && m.bias.size() == 1 && d != B);
          if (!grad)
            S("3-D " + dn(d), [=] { return std::vector<Tensor>{make(d, {5}, 2, mp), make(d, {2, 3, 4}, 0, mp), make(d, {2, 4, 5}, 1, mp)}; });
        }
      }
      break;
    }
    case kiln::OpCategory::View: {
      struct V { std::string what; Ix shape; L layout; OpAttrs a; };
      std::vector<V> vs;
      auto dims = [](std::vector<int64_t> ds) { return with([&](OpAttrs& a) { a.dims = kiln::Dims(ds); }); };
      auto dim = [](int64_t d, int64_t d1 = 0) { return with([&](OpAttrs& a) { a.dim = d; a.dim1 = d1; }); };
      auto slice = [](int64_t d, int64_t s, int64_t e, int64_t st) {
        return with([&](OpAttrs& a) { a.dim = d; a.start = s; a.end = e; a.step = st; });
      };
      auto select = [](int64_t d, int64_t i) { return with([&](OpAttrs& a) { a.dim = d; a.start = i; }); };
      const L C = L::Contiguous, T = L::Transposed;
      switch (k) {
        case OpKind::View:
          vs = {{"[4,5] -> [20]", {4, 5}, C, dims({20})}, {"[4,5] -> [5,-1]", {4, 5}, C, dims({5, -1})},
                {"0-d -> [1]", {}, C, dims({1})}, {"empty -> [3,0]", {0, 3}, C, dims({3, 0})},
                {"[4,5] -> [2,2,5]", {4, 5}, C, dims({2, 2, 5})},
                {"bad numel", {4, 5}, C, dims({3, 7})}, {"two -1", {4, 5}, C, dims({-1, -1})}};
          break;
        case OpKind::Transpose:
          vs = {{"[4,5]", {4, 5}, C, dim(0, 1)}, {"[2,3,4] 0,-1", {2, 3, 4}, C, dim(0, -1)},
                {"0-d", {}, C, dim(0, 0)}, {"transposed", {4, 5}, T, dim(1, 0)},
                {"dim out of range", {4, 5}, C, dim(0, 2)}};
          break;
        case OpKind::Permute:
          vs = {{"[2,3,4]", {2, 3, 4}, C, dims({2, 0, 1})}, {"transposed", {4, 5}, T, dims({1, 0})},
                {"repeated", {4, 5}, C, dims({0, 0})}, {"wrong rank", {4, 5}, C, dims({0})}};
          break;
        case OpKind::Slice:
          vs = {{"step 2", {4, 6}, C, slice(1, 1, 5, 2)}, {"negative start", {4, 6}, C, slice(1, -3, 100, 1)},
                {"empty", {4, 6}, C, slice(0, 2, 2, 1)}, {"transposed", {4, 6}, T, slice(0, 1, 4, 2)},
                {"step 0", {4, 6}, C, slice(0, 0, 4, 0)}, {"0-d", {}, C, slice(0, 0, 1, 1)}};
          break;
        case OpKind::Select:
          vs = {{"[4,6] dim 1", {4, 6}, C, select(1, -2)}, {"[4,6] dim 0", {4, 6}, C, select(0, 3)},
                {"[5] -> 0-d", {5}, C, select(0, 1)}, {"transposed", {4, 6}, T, select(1, 2)},
                {"index out of range", {4, 6}, C, select(0, 4)}, {"0-d", {}, C, select(0, 0)}};
          break;
        case OpKind::Expand:
          vs = {{"[4,1] -> [4,5]", {4, 1}, C, dims({4, 5})}, {"[5] -> [3,5]", {5}, C, dims({3, 5})},
                {"0-d -> [2,3]", {}, C, dims({2, 3})}, {"[4,1] -> [-1,5]", {4, 1}, C, dims({-1, 5})},
                {"[4,1] -> [0,4,0]", {4, 1}, C, dims({0, 4, 0})},
                {"[4,2] -> [4,5]", {4, 2}, C, dims({4, 5})}, {"fewer dims", {4, 1}, C, dims({5})}};
          break;
        case OpKind::Squeeze:
          vs = {{"[4,1,5] dim 1", {4, 1, 5}, C, dim(1)}, {"[1] dim 0", {1}, C, dim(0)},
                {"[4,5] dim 0 (not 1)", {4, 5}, C, dim(0)}, {"transposed [1,4] dim -1", {4, 1}, T, dim(-2)},
                {"dim out of range", {4, 5}, C, dim(3)}};
          break;
        case OpKind::Unsqueeze:
          vs = {{"[4,5] dim 0", {4, 5}, C, dim(0)}, {"[4,5] dim -1", {4, 5}, C, dim(-1)},
                {"0-d", {}, C, dim(0)}, {"transposed dim 1", {4, 5}, T, dim(1)},
                {"dim out of range", {4, 5}, C, dim(4)}};
          break;
        default: missing = "no view samples for this op in samples.cpp"; return {};
      }
      for (DType d : dts)
        for (const V& v : vs)
          S(v.what + " " + dn(d), [=] { return std::vector<Tensor>{make(d, v.shape, 0, pool, v.layout)}; }, v.a, d == F32 || d == I64);
      break;
    }
    case kiln::OpCategory::Copy: {
      switch (k) {
        case OpKind::Contiguous:
          for (DType d : dts) {
            S("transposed " + dn(d), [=] { return std::vector<Tensor>{make(d, {4, 5}, 0, pool, L::Transposed)}; }, {}, true);
            S("expanded " + dn(d), [=] { return std::vector<Tensor>{make(d, {4, 5}, 1, pool, L::Expanded)}; });
            if (grad) continue;
            S("0-d " + dn(d), [=] { return std::vector<Tensor>{make(d, {}, 1, pool)}; });
            S("empty " + dn(d), [=] { return std::vector<Tensor>{make(d, {0, 3}, 1, pool)}; });
          }
          break;
        case OpKind::Cast:
          for (DType from : dts)
            for (DType to : grad ? std::vector<DType>{F64} : kAll) {
              OpAttrs a = with([&](OpAttrs& x) { x.dtype = to; });
              std::string t = " " + dn(from) + " to " + dn(to);
              // Special floats only where the conversion is defined (not NaN/inf/huge → int).
              Pool p = grad ? pool : (is_float(from) && is_int(to)) ? Pool::Finite : Pool::Special;
              S("[4,5]" + t, [=] { return std::vector<Tensor>{make(from, {4, 5}, 0, p)}; }, a, true);
              S("transposed" + t, [=] { return std::vector<Tensor>{make(from, {3, 4}, 1, p, L::Transposed)}; }, a);
              if (!grad) S("0-d" + t, [=] { return std::vector<Tensor>{make(from, {}, 2, p)}; }, a);
            }
          break;
        case OpKind::CopyInto:
          for (DType d : dts)
            for (DType s : grad ? std::vector<DType>{d} : std::vector<DType>{d, d == F64 ? I32 : F64}) {
              std::string t = " " + dn(s) + " into " + dn(d);
              Pool p = (is_float(s) && is_int(d)) ? Pool::Finite : pool;
              S("[1,5] into [4,5]" + t, [=] { return std::vector<Tensor>{make(d, {4, 5}, 0, pool), make(s, {1, 5}, 1, p)}; }, {}, s == d);
              S("transposed source" + t, [=] { return std::vector<Tensor>{make(d, {3, 4}, 0, pool), make(s, {3, 4}, 1, p, L::Transposed)}; });
              if (!grad) S("bad shapes" + t, [=] { return std::vector<Tensor>{make(d, {4, 5}, 0, pool), make(s, {3}, 1, p)}; });
            }
          break;
        case OpKind::Fill:
          for (DType d : dts) {
            std::vector<Scalar> vals = {Scalar(2.5), Scalar(int64_t(-7)), Scalar(true)};
            if (!grad && !is_float(d) && d != B) vals.push_back(Scalar(1e20));  // overflow: raises
            for (size_t q = 0; q < vals.size(); ++q) {
              OpAttrs a = with([&](OpAttrs& x) { x.alpha = vals[q]; });
              S("[4,5] value#" + std::to_string(q) + " " + dn(d), [=] { return std::vector<Tensor>{make(d, {4, 5}, 0, pool)}; }, a, q == 0);
              S("transposed value#" + std::to_string(q) + " " + dn(d), [=] { return std::vector<Tensor>{make(d, {3, 4}, 0, pool, L::Transposed)}; }, a);
            }
          }
          break;
        default: missing = "no copy samples for this op in samples.cpp"; return {};
      }
      break;
    }
    case kiln::OpCategory::Shape: {  // cat
      auto dim = [](int64_t d) { return with([&](OpAttrs& a) { a.dim = d; }); };
      for (DType d : dts) {
        std::string t = " " + dn(d);
        DType d2 = grad ? d : d == F64 ? I32 : F64;
        S("[2,3]+[4,3] dim 0" + t, [=] { return std::vector<Tensor>{make(d, {2, 3}, 0, pool), make(d, {4, 3}, 1, pool)}; }, dim(0), true);
        S("3 tensors dim -1 mixed" + t, [=] { return std::vector<Tensor>{make(d, {2, 3}, 0, pool), make(d2, {2, 1}, 1, pool), make(d, {2, 2}, 2, pool, L::Transposed)}; }, dim(-1));
        if (grad) continue;
        S("with empty" + t, [=] { return std::vector<Tensor>{make(d, {0, 3}, 0, pool), make(d, {2, 3}, 1, pool)}; }, dim(0));
        S("single" + t, [=] { return std::vector<Tensor>{make(d, {2, 3}, 0, pool)}; }, dim(1));
        S("0-d" + t, [=] { return std::vector<Tensor>{make(d, {}, 0, pool), make(d, {}, 1, pool)}; }, dim(0));
        S("mismatch" + t, [=] { return std::vector<Tensor>{make(d, {2, 3}, 0, pool), make(d, {2, 4}, 1, pool)}; }, dim(0));
        S("dim out of range" + t, [=] { return std::vector<Tensor>{make(d, {2, 3}, 0, pool), make(d, {2, 3}, 1, pool)}; }, dim(2));
      }
      break;
    }
    case kiln::OpCategory::Index: {
      auto dim = [](int64_t d) { return with([&](OpAttrs& a) { a.dim = d; }); };
      auto idx = [](DType d, Ix shape, int salt, int64_t bound) { return make(d, shape, salt, Pool::Index, L::Contiguous, bound); };
      auto fixed = [](std::vector<int64_t> v, DType d = I64) {
        Ix s = {static_cast<int64_t>(v.size())};
        if (d == I32) return kiln::from_vector<int32_t>(std::vector<int32_t>(v.begin(), v.end()), kiln::Shape(s));
        if (d == F32) return kiln::from_vector<float>(std::vector<float>(v.begin(), v.end()), kiln::Shape(s));
        return kiln::from_vector<int64_t>(v, kiln::Shape(s));
      };
      for (DType d : dts) {
        std::string t = " " + dn(d);
        switch (k) {
          case OpKind::IndexSelect:
            S("dim 0 repeated" + t, [=] { return std::vector<Tensor>{make(d, {4, 5}, 0, pool), fixed({3, 0, 3})}; }, dim(0), true);
            S("dim 1 int32 transposed" + t, [=] { return std::vector<Tensor>{make(d, {4, 5}, 1, pool, L::Transposed), fixed({4, 1}, I32)}; }, dim(1));
            if (grad) break;
            S("0-d index" + t, [=] { return std::vector<Tensor>{make(d, {4, 5}, 0, pool), kiln::scalar_tensor(Scalar(int64_t(2)), {I64})}; }, dim(0));
            S("empty index" + t, [=] { return std::vector<Tensor>{make(d, {4, 5}, 0, pool), fixed({})}; }, dim(1));
            S("out of range" + t, [=] { return std::vector<Tensor>{make(d, {4, 5}, 0, pool), fixed({1, 4})}; }, dim(0));
            S("float index" + t, [=] { return std::vector<Tensor>{make(d, {4, 5}, 0, pool), fixed({1, 2}, F32)}; }, dim(0));
            S("2-D index" + t, [=] { return std::vector<Tensor>{make(d, {4, 5}, 0, pool), idx(I64, {2, 2}, 0, 4)}; }, dim(0));
            break;
          case OpKind::Gather:
            S("dim 0" + t, [=] { return std::vector<Tensor>{make(d, {4, 5}, 0, pool), idx(I64, {3, 5}, 1, 4)}; }, dim(0), true);
            S("dim 1 transposed" + t, [=] { return std::vector<Tensor>{make(d, {4, 5}, 1, pool, L::Transposed), idx(I64, {4, 2}, 2, 5)}; }, dim(1));
            if (grad) break;
            S("int32 index" + t, [=] { return std::vector<Tensor>{make(d, {4, 5}, 0, pool), idx(I32, {2, 3}, 1, 5)}; }, dim(-1));
            S("empty index" + t, [=] { return std::vector<Tensor>{make(d, {4, 5}, 0, pool), idx(I64, {0, 5}, 1, 4)}; }, dim(0));
            S("out of range" + t, [=] { return std::vector<Tensor>{make(d, {4, 5}, 0, pool), idx(I64, {3, 5}, 1, 6)}; }, dim(0));
            S("rank mismatch" + t, [=] { return std::vector<Tensor>{make(d, {4, 5}, 0, pool), idx(I64, {3}, 1, 4)}; }, dim(0));
            break;
          case OpKind::Embedding:
            S("[2,3] indices" + t, [=] { return std::vector<Tensor>{make(d, {6, 3}, 0, pool), idx(I64, {2, 3}, 1, 6)}; }, {}, true);
            S("transposed weight" + t, [=] { return std::vector<Tensor>{make(d, {6, 3}, 0, pool, L::Transposed), idx(I64, {4}, 2, 6)}; });
            if (grad) break;
            S("0-d index" + t, [=] { return std::vector<Tensor>{make(d, {6, 3}, 0, pool), kiln::scalar_tensor(Scalar(int64_t(5)), {I64})}; });
            S("out of range" + t, [=] { return std::vector<Tensor>{make(d, {6, 3}, 0, pool), fixed({0, 6})}; });
            S("1-D weight" + t, [=] { return std::vector<Tensor>{make(d, {6}, 0, pool), fixed({0, 1})}; });
            S("float indices" + t, [=] { return std::vector<Tensor>{make(d, {6, 3}, 0, pool), fixed({0, 1}, F32)}; });
            break;
          case OpKind::OneHot: {
            if (grad || d != I64) break;
            auto cls = [](int64_t n) { return with([&](OpAttrs& a) { a.mode = n; }); };
            S("[6] classes 4", [=] { return std::vector<Tensor>{idx(I64, {6}, 1, 4)}; }, cls(4), true);
            S("[2,3] classes -1", [=] { return std::vector<Tensor>{idx(I64, {2, 3}, 2, 5)}; }, cls(-1));
            S("0-d classes 3", [=] { return std::vector<Tensor>{kiln::scalar_tensor(Scalar(int64_t(2)), {I64})}; }, cls(3));
            S("transposed classes 7", [=] { return std::vector<Tensor>{make(I64, {3, 4}, 0, Pool::Index, L::Transposed, 7)}; }, cls(7));
            S("empty classes 2", [=] { return std::vector<Tensor>{idx(I64, {0}, 0, 2)}; }, cls(2));
            S("out of range", [=] { return std::vector<Tensor>{fixed({0, 4})}; }, cls(4));
            S("negative", [=] { return std::vector<Tensor>{fixed({0, -1})}; }, cls(4));
            S("int32 indices", [=] { return std::vector<Tensor>{fixed({0, 1}, I32)}; }, cls(4));
            S("float indices", [=] { return std::vector<Tensor>{fixed({0, 1}, F32)}; }, cls(4));
            break;
          }
          case OpKind::MaskedFill: {
            Scalar v = is_float(d) ? Scalar(2.5) : d == B ? Scalar(true) : Scalar(int64_t(-9));
            OpAttrs a = with([&](OpAttrs& x) { x.alpha = v; });
            S("[4,5] mask [4,1]" + t, [=] { return std::vector<Tensor>{make(d, {4, 5}, 0, pool), make(B, {4, 1}, 1, Pool::Mask)}; }, a, true);
            S("transposed" + t, [=] { return std::vector<Tensor>{make(d, {3, 4}, 0, pool, L::Transposed), make(B, {3, 4}, 2, Pool::Mask)}; }, a);
            if (grad) break;
            S("nan value" + t, [=] { return std::vector<Tensor>{make(d, {4, 5}, 0, pool), make(B, {5}, 3, Pool::Mask)}; },
              with([&](OpAttrs& x) { x.alpha = is_float(d) ? Scalar(NAN) : v; }));
            S("0-d" + t, [=] { return std::vector<Tensor>{make(d, {}, 0, pool), make(B, {}, 0, Pool::Mask)}; }, a);
            S("float mask" + t, [=] { return std::vector<Tensor>{make(d, {4, 5}, 0, pool), make(F32, {4, 5}, 1, pool)}; }, a);
            S("mask does not broadcast" + t, [=] { return std::vector<Tensor>{make(d, {4, 1}, 0, pool), make(B, {4, 5}, 1, Pool::Mask)}; }, a);
            break;
          }
          case OpKind::IndexAdd:
            S("dim 0 repeated" + t, [=] { return std::vector<Tensor>{make(d, {5, 3}, 0, pool), fixed({0, 2, 0, 4}), make(d, {4, 3}, 1, pool)}; }, dim(0), true);
            S("dim 1 transposed source" + t, [=] { return std::vector<Tensor>{make(d, {3, 4}, 0, pool), fixed({3, 1}), make(d, {3, 2}, 1, pool, L::Transposed)}; }, dim(1));
            if (grad) break;
            S("out of range" + t, [=] { return std::vector<Tensor>{make(d, {5, 3}, 0, pool), fixed({0, 5}), make(d, {2, 3}, 1, pool)}; }, dim(0));
            S("source dtype differs" + t, [=] { return std::vector<Tensor>{make(d, {5, 3}, 0, pool), fixed({0, 1}), make(d == F64 ? F32 : F64, {2, 3}, 1, pool)}; }, dim(0));
            S("bad source shape" + t, [=] { return std::vector<Tensor>{make(d, {5, 3}, 0, pool), fixed({0, 1}), make(d, {2, 4}, 1, pool)}; }, dim(0));
            break;
          case OpKind::IndexCopy:
            // A repeated index keeps its last slice (kiln's rule; PyTorch leaves it undefined).
            S("dim 0 repeated" + t, [=] { return std::vector<Tensor>{make(d, {5, 3}, 0, pool), fixed({0, 2, 0, 4}), make(d, {4, 3}, 1, pool)}; }, dim(0), true);
            S("dim -1 transposed source" + t, [=] { return std::vector<Tensor>{make(d, {3, 4}, 0, pool), fixed({3, 1}), make(d, {3, 2}, 1, pool, L::Transposed)}; }, dim(-1), true);
            if (grad) break;
            S("[2,3,4] dim 1 transposed input int32" + t, [=] { return std::vector<Tensor>{make(d, {2, 3, 4}, 0, pool, L::Transposed), fixed({1}, I32), make(d, {2, 1, 4}, 1, pool)}; }, dim(1));
            S("empty index" + t, [=] { return std::vector<Tensor>{make(d, {5, 3}, 0, pool), fixed({}), make(d, {0, 3}, 1, pool)}; }, dim(0));
            S("out of range" + t, [=] { return std::vector<Tensor>{make(d, {5, 3}, 0, pool), fixed({0, 5}), make(d, {2, 3}, 1, pool)}; }, dim(0));
            S("negative index" + t, [=] { return std::vector<Tensor>{make(d, {5, 3}, 0, pool), fixed({-1}), make(d, {1, 3}, 1, pool)}; }, dim(0));
            S("source dtype differs" + t, [=] { return std::vector<Tensor>{make(d, {5, 3}, 0, pool), fixed({0, 1}), make(d == F64 ? F32 : F64, {2, 3}, 1, pool)}; }, dim(0));
            S("bad source shape" + t, [=] { return std::vector<Tensor>{make(d, {5, 3}, 0, pool), fixed({0, 1}), make(d, {2, 4}, 1, pool)}; }, dim(0));
            S("dim out of range" + t, [=] { return std::vector<Tensor>{make(d, {5, 3}, 0, pool), fixed({0, 1}), make(d, {2, 3}, 1, pool)}; }, dim(2));
            break;
          case OpKind::ScatterAdd:
            S("dim 0" + t, [=] { return std::vector<Tensor>{make(d, {4, 5}, 0, pool), idx(I64, {3, 5}, 1, 4), make(d, {3, 5}, 1, pool)}; }, dim(0), true);
            S("dim 1 transposed src" + t, [=] { return std::vector<Tensor>{make(d, {3, 4}, 0, pool), idx(I64, {3, 2}, 2, 4), make(d, {3, 4}, 2, pool, L::Transposed)}; }, dim(1));
            if (grad) break;
            S("out of range" + t, [=] { return std::vector<Tensor>{make(d, {4, 5}, 0, pool), idx(I64, {3, 5}, 1, 7), make(d, {3, 5}, 1, pool)}; }, dim(0));
            S("source dtype differs" + t, [=] { return std::vector<Tensor>{make(d, {4, 5}, 0, pool), idx(I64, {3, 5}, 1, 4), make(d == F64 ? F32 : F64, {3, 5}, 1, pool)}; }, dim(0));
            break;
          case OpKind::Tril:
          case OpKind::Triu: {
            auto diag = [](int64_t n) { return with([&](OpAttrs& a) { a.mode = n; }); };
            S("[4,5]" + t, [=] { return std::vector<Tensor>{make(d, {4, 5}, 0, pool)}; }, diag(0), true);
            S("[2,3,4] diagonal 1 transposed" + t, [=] { return std::vector<Tensor>{make(d, {2, 3, 4}, 1, pool, L::Transposed)}; }, diag(1));
            if (grad) break;
            S("[4,5] diagonal -2" + t, [=] { return std::vector<Tensor>{make(d, {4, 5}, 2, pool)}; }, diag(-2));
            S("empty" + t, [=] { return std::vector<Tensor>{make(d, {0, 3}, 2, pool)}; }, diag(0));
            S("1-D" + t, [=] { return std::vector<Tensor>{make(d, {5}, 2, pool)}; }, diag(0));
            break;
          }
          default: missing = "no index samples for this op in samples.cpp"; return {};
        }
      }
      break;
    }
    case kiln::OpCategory::Random: {
      // Checked by property (conformance_test.cpp: check_random); attrs as the factories set them.
      auto rnd = [](std::vector<int64_t> size, DType dt, Scalar lo, Scalar hi, double p = 0.5) {
        return with([&](OpAttrs& a) { a.dims = kiln::Dims(size); a.dtype = dt; a.low = lo; a.high = hi; a.p = p; });
      };
      switch (k) {
        case OpKind::Uniform:
          if (grad) break;
          S("float32 [50,40] in [-2,3)", [] { return std::vector<Tensor>{}; }, rnd({50, 40}, F32, -2.0, 3.0), true);
          S("float64 [2000]", [] { return std::vector<Tensor>{}; }, rnd({2000}, F64, 0.0, 1.0), true);
          S("empty", [] { return std::vector<Tensor>{}; }, rnd({0, 3}, F32, 0.0, 1.0));
          S("int64 dtype", [] { return std::vector<Tensor>{}; }, rnd({4}, I64, 0.0, 1.0));
          S("negative size", [] { return std::vector<Tensor>{}; }, rnd({-1}, F32, 0.0, 1.0));
          break;
        case OpKind::Normal:
          if (grad) break;
          S("float32 [50,40] mean 1 std 2", [] { return std::vector<Tensor>{}; }, rnd({50, 40}, F32, 1.0, 2.0), true);
          S("float64 [2000]", [] { return std::vector<Tensor>{}; }, rnd({2000}, F64, 0.0, 1.0), true);
          S("int32 dtype", [] { return std::vector<Tensor>{}; }, rnd({4}, I32, 0.0, 1.0));
          break;
        case OpKind::RandInt:
          if (grad) break;
          S("int64 [2000] in [-3,5)", [] { return std::vector<Tensor>{}; }, rnd({2000}, I64, int64_t(-3), int64_t(5)), true);
          S("int32 [40,50] in [0,2)", [] { return std::vector<Tensor>{}; }, rnd({40, 50}, I32, int64_t(0), int64_t(2)), true);
          S("bool dtype", [] { return std::vector<Tensor>{}; }, rnd({4}, B, int64_t(0), int64_t(2)));
          S("low >= high", [] { return std::vector<Tensor>{}; }, rnd({4}, I64, int64_t(3), int64_t(3)));
          break;
        case OpKind::DropoutMask:
          if (grad) break;
          S("float32 [2000] p 0.25", [] { return std::vector<Tensor>{}; }, rnd({2000}, F32, 0.0, 1.0, 0.25), true);
          S("float64 [40,50] p 0.5", [] { return std::vector<Tensor>{}; }, rnd({40, 50}, F64, 0.0, 1.0, 0.5), true);
          S("p 1.5", [] { return std::vector<Tensor>{}; }, rnd({4}, F32, 0.0, 1.0, 1.5));
          break;
        case OpKind::Dropout:
          for (DType d : grad ? dts : std::vector<DType>{F32, F64, I64}) {
            Pool p = grad ? pool : Pool::Special;
            S("[40,50] p 0.3 " + dn(d), [=] { return std::vector<Tensor>{make(d, {40, 50}, 0, p)}; }, rnd({}, F32, 0.0, 1.0, 0.3), true);
            S("transposed p 0.6 " + dn(d), [=] { return std::vector<Tensor>{make(d, {30, 40}, 1, p, L::Transposed)}; }, rnd({}, F32, 0.0, 1.0, 0.6));
            if (!grad) S("p -0.5 " + dn(d), [=] { return std::vector<Tensor>{make(d, {4}, 1, p)}; }, rnd({}, F32, 0.0, 1.0, -0.5));
          }
          break;
        default: missing = "no random samples for this op in samples.cpp"; return {};
      }
      break;
    }
    case kiln::OpCategory::Loss: {
      auto idx_or = [](DType d, int64_t n, int64_t bound, int salt = 2) {
        return make(d, {n}, salt, Pool::Index, Layout::Contiguous, bound);
      };
      auto red = [](int64_t m, int64_t ignore = -100) { return with([&](OpAttrs& a) { a.mode = m; a.ignore_index = ignore; }); };
      for (DType d : grad ? dts : std::vector<DType>{F32, F64, I64}) {
        std::string t = " " + dn(d);
        for (int64_t m : {0, 1, 2}) {
          std::string r = " reduction " + std::to_string(m) + t;
          if (k == OpKind::NllLoss) {
            S("[4,5]" + r, [=] { return std::vector<Tensor>{make(d, {4, 5}, 0, fin), idx_or(I64, 4, 5)}; }, red(m), m == 1);
            S("ignore_index 2, transposed" + r, [=] { return std::vector<Tensor>{make(d, {4, 5}, 1, fin, L::Transposed), idx_or(I64, 4, 5)}; }, red(m, 2));
          } else {
            S("[4,5]" + r, [=] { return std::vector<Tensor>{make(d, {4, 5}, 0, fin), make(d, {4, 5}, 1, fin)}; }, red(m), m == 1);
            S("transposed" + r, [=] { return std::vector<Tensor>{make(d, {3, 4}, 0, fin, L::Transposed), make(d, {3, 4}, 1, fin)}; }, red(m));
          }
        }
        if (grad) continue;
        if (k == OpKind::NllLoss) {
          S("1-D with 0-d target" + t, [=] { return std::vector<Tensor>{make(d, {5}, 0, fin), kiln::scalar_tensor(Scalar(int64_t(3)), {I64})}; }, red(1));
          S("target out of range" + t, [=] { return std::vector<Tensor>{make(d, {2, 5}, 0, fin), kiln::from_vector<int64_t>({1, 5}, {2})}; }, red(1));
          S("float target" + t, [=] { return std::vector<Tensor>{make(d, {4, 5}, 0, fin), make(F32, {4}, 0, fin)}; }, red(1));
          S("target length" + t, [=] { return std::vector<Tensor>{make(d, {4, 5}, 0, fin), idx_or(I64, 3, 5)}; }, red(1));
        } else {
          S("mixed dtypes" + t, [=] { return std::vector<Tensor>{make(d, {4, 5}, 0, fin), make(d == F64 ? F32 : F64, {4, 5}, 1, fin)}; }, red(1));
          S("bad shapes" + t, [=] { return std::vector<Tensor>{make(d, {4, 5}, 0, fin), make(d, {3, 5}, 1, fin)}; }, red(1));
          S("bad reduction" + t, [=] { return std::vector<Tensor>{make(d, {4, 5}, 0, fin), make(d, {4, 5}, 1, fin)}; }, red(5));
        }
      }
      break;
    }
    case kiln::OpCategory::Scan: {  // argsort (attr mode = k, -1: all), cumsum
      const bool sort = k == OpKind::ArgSort;
      // cumsum's `descending` is its backward's reverse sum.
      auto along = [=](int64_t d, bool descending, int64_t top = -1) {
        return with([&](OpAttrs& a) {
          a.dim = d;
          a.descending = descending;
          a.mode = sort ? top : 0;
        });
      };
      for (DType d : dts) {
        std::string t = " " + dn(d);
        S("[4,5] dim -1" + t, [=] { return std::vector<Tensor>{make(d, {4, 5}, 0, pool)}; }, along(-1, false), true);
        S("[4,5] dim 0 descending" + t, [=] { return std::vector<Tensor>{make(d, {4, 5}, 1, pool)}; }, along(0, true));
        S("transposed dim 1" + t, [=] { return std::vector<Tensor>{make(d, {3, 4}, 2, pool, L::Transposed)}; }, along(1, false), d == F32);
        if (grad) continue;
        // Ties (repeated finite values), NaN, ±inf, ±0, integer extremes.
        S("[3,9] ties dim 1" + t, [=] { return std::vector<Tensor>{make(d, {3, 9}, 3, Pool::Finite)}; }, along(1, false));
        S("[3,9] ties dim 1 descending" + t, [=] { return std::vector<Tensor>{make(d, {3, 9}, 3, Pool::Finite)}; }, along(1, true), true);
        S("expanded dim 1" + t, [=] { return std::vector<Tensor>{make(d, {4, 5}, 0, pool, L::Expanded)}; }, along(1, false));
        S("0-d" + t, [=] { return std::vector<Tensor>{make(d, {}, 2, pool)}; }, along(0, false));
        S("empty [0,3] dim 0" + t, [=] { return std::vector<Tensor>{make(d, {0, 3}, 0, pool)}; }, along(0, false));
        S("empty [3,0] dim 1" + t, [=] { return std::vector<Tensor>{make(d, {3, 0}, 0, pool)}; }, along(1, true));
        S("dim 2 of [4,5]" + t, [=] { return std::vector<Tensor>{make(d, {4, 5}, 0, pool)}; }, along(2, false));
        if (!sort) continue;
        S("top 2 dim 1" + t, [=] { return std::vector<Tensor>{make(d, {4, 5}, 0, pool)}; }, along(1, true, 2), true);
        S("top 0 dim 0" + t, [=] { return std::vector<Tensor>{make(d, {4, 5}, 0, pool)}; }, along(0, false, 0));
        S("top 3 of [3,9] ties" + t, [=] { return std::vector<Tensor>{make(d, {3, 9}, 3, Pool::Finite)}; }, along(1, false, 3));
        S("0-d top 1" + t, [=] { return std::vector<Tensor>{make(d, {}, 2, pool)}; }, along(-1, true, 1));
        S("k 6 of 5" + t, [=] { return std::vector<Tensor>{make(d, {4, 5}, 0, pool)}; }, along(1, true, 6));
        S("k -2" + t, [=] { return std::vector<Tensor>{make(d, {4, 5}, 0, pool)}; }, along(1, true, -2));
      }
      break;
    }
    case kiln::OpCategory::Window: {  // unfold, fold: attr dims = the geometry (fold: H, W first)
      const bool is_fold = k == OpKind::Fold;
      // {kh, kw, dilation h, w, padding h, w, stride h, w}; unfold's padding reads attr alpha.
      auto geo = [=](const Ix& g, double pad = 0) {
        return with([&](OpAttrs& a) {
          if (is_fold) a.dims = {5, 6};
          for (int64_t v : g) a.dims.push_back(v);
          a.alpha = pad;
        });
      };
      // unfold: a [2, 3, 5, 6] input; fold: the [2, 3*kh*kw, L] columns unfold makes of one.
      auto input = [=](DType d, const Ix& g, int salt, Pool p, Layout layout) {
        if (!is_fold) return make(d, {2, 3, 5, 6}, salt, p, layout);
        const int64_t ho = (5 + 2 * g[4] - g[2] * (g[0] - 1) - 1) / g[6] + 1;
        const int64_t wo = (6 + 2 * g[5] - g[3] * (g[1] - 1) - 1) / g[7] + 1;
        return make(d, {2, 3 * g[0] * g[1], ho * wo}, salt, p, layout);
      };
      const std::vector<Ix> geos = {{3, 3, 1, 1, 1, 1, 1, 1}, {2, 3, 2, 1, 0, 1, 2, 1}, {1, 2, 1, 1, 0, 0, 3, 2}};
      // fold sums: finite values (float32 overflow in a partial sum is order-dependent).
      const Pool p = is_fold ? fin : pool;
      for (DType d : dts) {
        std::string t = " " + dn(d);
        for (size_t q = 0; q < geos.size(); ++q) {
          const Ix g = geos[q];
          std::string gs = " geometry#" + std::to_string(q) + t;
          S("contiguous" + gs, [=] { return std::vector<Tensor>{input(d, g, 0, p, L::Contiguous)}; }, geo(g), q == 0);
          S("transposed" + gs, [=] { return std::vector<Tensor>{input(d, g, 1, p, L::Transposed)}; }, geo(g), q == 1 && d == F32);
        }
        if (grad) continue;
        const Ix g = geos[0];
        if (!is_fold) S("-inf padding" + t, [=] { return std::vector<Tensor>{input(d, g, 2, p, L::Contiguous)}; }, geo(g, -INFINITY), true);
        S("expanded" + t, [=] { return std::vector<Tensor>{input(d, g, 3, p, L::Expanded)}; }, geo(g));
        S("batch 0" + t, [=] { return std::vector<Tensor>{is_fold ? make(d, {0, 27, 30}, 0, p) : make(d, {0, 3, 5, 6}, 0, p)}; }, geo(g));
        S("kernel larger than the padded input" + t, [=] { return std::vector<Tensor>{input(d, g, 0, p, L::Contiguous)}; }, geo({8, 3, 1, 1, 1, 1, 1, 1}));
        S("stride 0" + t, [=] { return std::vector<Tensor>{input(d, g, 0, p, L::Contiguous)}; }, geo({3, 3, 1, 1, 1, 1, 0, 1}));
        S("dilation 0" + t, [=] { return std::vector<Tensor>{input(d, g, 0, p, L::Contiguous)}; }, geo({3, 3, 1, 0, 1, 1, 1, 1}));
        S("negative padding" + t, [=] { return std::vector<Tensor>{input(d, g, 0, p, L::Contiguous)}; }, geo({3, 3, 1, 1, -1, 1, 1, 1}));
        S("3-D input" + t, [=] { return std::vector<Tensor>{make(d, is_fold ? Ix{27, 30} : Ix{3, 5, 6}, 0, p)}; }, geo(g));
        if (is_fold) {
          S("29 columns, 30 windows" + t, [=] { return std::vector<Tensor>{make(d, {2, 27, 29}, 0, p)}; }, geo(g));
          S("26 rows for a 3x3 kernel" + t, [=] { return std::vector<Tensor>{make(d, {2, 26, 30}, 0, p)}; }, geo(g));
        }
      }
      break;
    }
    default: missing = "no sampler for this op's category in samples.cpp"; return {};
  }
  if (out.empty() && !grad) missing = "no samples for this op in samples.cpp";
  return out;
}

}  // namespace conf
