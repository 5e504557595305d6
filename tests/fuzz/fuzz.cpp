// Differential fuzzer: generator, interpreter, runner, shrinker, printer (see fuzz.h).
#include "fuzz/fuzz.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <random>

namespace kiln::fuzz {

namespace {

using Rng = std::mt19937_64;

int rnd(Rng& r, int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(r); }
bool chance(Rng& r, double p) { return std::uniform_real_distribution<double>(0, 1)(r) < p; }

std::string vname(const Program& p, int v) {
  int na = static_cast<int>(p.args.size());
  return v < na ? fmt::format("a{}", v) : fmt::format("v{}", v);
}

const char* dtype_cpp(DType t) {
  switch (t) {
    case DType::Bool: return "kiln::Bool";
    case DType::Int32: return "kiln::Int32";
    case DType::Int64: return "kiln::Int64";
    case DType::Float32: return "kiln::Float32";
    case DType::Float64: return "kiln::Float64";
  }
  return "?";
}

// Host scalars used by the scalar overloads: (value, C++ text).
struct HostScalar {
  Scalar s;
  const char* text;
};
const HostScalar kScalars[] = {
    {Scalar(2.0), "2.0"}, {Scalar(-1.5), "-1.5"}, {Scalar(0.5), "0.5"},
    {Scalar(int64_t(3)), "int64_t(3)"}, {Scalar(int64_t(0)), "int64_t(0)"},
    {Scalar(int64_t(-1)), "int64_t(-1)"}, {Scalar(true), "true"}};
constexpr int kNumScalars = sizeof(kScalars) / sizeof(kScalars[0]);

constexpr int kNumUnary = 12;
Tensor unary(int k, const Tensor& x) {
  switch (k % kNumUnary) {
    case 0: return kiln::neg(x);
    case 1: return kiln::abs(x);
    case 2: return kiln::relu(x);
    case 3: return kiln::tanh(x);
    case 4: return kiln::sigmoid(x);
    case 5: return kiln::exp(x);
    case 6: return kiln::sin(x);
    case 7: return kiln::sqrt(kiln::abs(x));
    case 8: return kiln::floor(x);
    case 9: return kiln::logical_not(x);
    case 10: return kiln::log1p(kiln::abs(x));
    default: return kiln::gelu(x);
  }
}
std::string unary_text(int k, const std::string& x) {
  switch (k % kNumUnary) {
    case 0: return fmt::format("kiln::neg({})", x);
    case 1: return fmt::format("kiln::abs({})", x);
    case 2: return fmt::format("kiln::relu({})", x);
    case 3: return fmt::format("kiln::tanh({})", x);
    case 4: return fmt::format("kiln::sigmoid({})", x);
    case 5: return fmt::format("kiln::exp({})", x);
    case 6: return fmt::format("kiln::sin({})", x);
    case 7: return fmt::format("kiln::sqrt(kiln::abs({}))", x);
    case 8: return fmt::format("kiln::floor({})", x);
    case 9: return fmt::format("kiln::logical_not({})", x);
    case 10: return fmt::format("kiln::log1p(kiln::abs({}))", x);
    default: return fmt::format("kiln::gelu({})", x);
  }
}

const DType kCasts[] = {DType::Float32, DType::Float64, DType::Int64, DType::Bool};

int wrap_dim(int p, int rank) { return rank <= 0 ? 0 : ((p % rank) + rank) % rank; }

// Values eager and compiled code may compute an ulp apart (their own exp/tanh/... polynomials,
// FMA contraction, another summation order), and the ops for which an ulp can flip the
// result (compare, floor, casts to int64/bool, `x > 0` conditions, branches on a sum, a divisor
// that may be near 0). The
// generator does not feed the first into the second: such a difference is the comparison's
// limit, not a kiln bug (tests/fuzz/README.md, finding 9).
bool inexact_unary(int p) {
  int k = p % kNumUnary;
  return k != 0 && k != 1 && k != 2 && k != 8 && k != 9;  // neg, abs, relu, floor, not
}

bool makes_inexact(const Node& n) {
  switch (n.op) {
    case Op::Unary: return inexact_unary(n.p[0]);
    case Op::Branch: return inexact_unary(n.p[0]) || inexact_unary(n.p[1]);  // either side
    case Op::Binary: return n.p[0] % 7 == 3;     // div
    case Op::BinScalar: return n.p[0] % 5 == 3;  // div
    case Op::Reduce: return n.p[0] % 3 == 1;                        // mean
    case Op::Softmax: case Op::LayerNorm: return true;
    default: return false;
  }
}

// The operands whose ulp matters for node n: bit i set for operand i (a, b, c).
int discontinuous_operands(const Node& n, const std::vector<Tensor>& vals) {
  switch (n.op) {
    case Op::Unary: {
      int k = n.p[0] % kNumUnary;
      return k == 8 || k == 9 ? 1 : 0;
    }
    case Op::Cast: {
      DType t = kCasts[n.p[0] % 4];
      return t == DType::Int64 || t == DType::Bool ? 1 : 0;
    }
    case Op::Binary: {
      int k = n.p[0] % 7;
      // logical_and; a divisor near 0 (log_softmax of a dominant element) amplifies an ulp
      return k == 6 ? 3 : k == 3 ? 2 : 0;
    }
    case Op::Compare: return 3;
    case Op::Where: return n.p[0] % 2 ? 1 : 0;        // kiln::gt(a, 0) as the condition
    case Op::Branch: return 1;
    case Op::InPlace: return is_floating(vals[n.a].dtype()) ? 0 : 2;  // into int64 / bool
    default: return 0;
  }
}

// Runs node n (value index `self`) on vals; appends its C++ text to code if given.
Tensor apply(const Program& p, const Node& n, int self, std::vector<Tensor>& vals,
             std::string* code) {
  const Tensor& A = vals[n.a];
  std::string out = vname(p, self), a = vname(p, n.a);
  std::string b = n.b >= 0 ? vname(p, n.b) : "", c = n.c >= 0 ? vname(p, n.c) : "";
  std::string text;
  Tensor r;
  int rank = A.dim();
  auto set = [&](std::string expr) { text = fmt::format("Tensor {} = {};", out, expr); };
  switch (n.op) {
    case Op::Unary:
      set(unary_text(n.p[0], a));
      if (code) break;
      r = unary(n.p[0], A);
      break;
    case Op::Cast: {
      DType t = kCasts[n.p[0] % 4];
      set(fmt::format("{}.to({})", a, dtype_cpp(t)));
      if (!code) r = A.to(t);
      break;
    }
    case Op::Binary: {
      static const char* names[] = {"add", "sub", "mul", "div", "maximum", "minimum",
                                    "logical_and"};
      int k = n.p[0] % 7;
      set(fmt::format("kiln::{}({}, {})", names[k], a, b));
      if (code) break;
      const Tensor& B = vals[n.b];
      switch (k) {
        case 0: r = kiln::add(A, B); break;
        case 1: r = kiln::sub(A, B); break;
        case 2: r = kiln::mul(A, B); break;
        case 3: r = kiln::div(A, B); break;
        case 4: r = kiln::maximum(A, B); break;
        case 5: r = kiln::minimum(A, B); break;
        default: r = kiln::logical_and(A, B); break;
      }
      break;
    }
    case Op::BinScalar: {
      const HostScalar& s = kScalars[n.p[1] % kNumScalars];
      int k = n.p[0] % 5;
      static const char* names[] = {"add", "sub", "mul", "div"};
      if (k < 4) set(fmt::format("kiln::{}({}, {})", names[k], a, s.text));
      else set(fmt::format("Scalar({}) - {}", s.text, a));
      if (code) break;
      switch (k) {
        case 0: r = kiln::add(A, s.s); break;
        case 1: r = kiln::sub(A, s.s); break;
        case 2: r = kiln::mul(A, s.s); break;
        case 3: r = kiln::div(A, s.s); break;
        default: r = s.s - A; break;
      }
      break;
    }
    case Op::Compare: {
      static const char* names[] = {"eq", "ne", "lt", "le", "gt", "ge"};
      int k = n.p[0] % 6;
      const HostScalar& s = kScalars[n.p[1] % kNumScalars];
      set(fmt::format("kiln::{}({}, {})", names[k], a, n.b >= 0 ? b : s.text));
      if (code) break;
      if (n.b >= 0) {
        const Tensor& B = vals[n.b];
        switch (k) {
          case 0: r = kiln::eq(A, B); break;
          case 1: r = kiln::ne(A, B); break;
          case 2: r = kiln::lt(A, B); break;
          case 3: r = kiln::le(A, B); break;
          case 4: r = kiln::gt(A, B); break;
          default: r = kiln::ge(A, B); break;
        }
      } else {
        switch (k) {
          case 0: r = kiln::eq(A, s.s); break;
          case 1: r = kiln::ne(A, s.s); break;
          case 2: r = kiln::lt(A, s.s); break;
          case 3: r = kiln::le(A, s.s); break;
          case 4: r = kiln::gt(A, s.s); break;
          default: r = kiln::ge(A, s.s); break;
        }
      }
      break;
    }
    case Op::Where: {
      std::string cond = n.p[0] % 2 ? fmt::format("kiln::gt({}, int64_t(0))", a) : a;
      const HostScalar& s = kScalars[n.p[1] % kNumScalars];
      set(fmt::format("kiln::where({}, {}, {})", cond, b, n.c >= 0 ? c : s.text));
      if (code) break;
      Tensor C = n.p[0] % 2 ? kiln::gt(A, Scalar(int64_t(0))) : A;
      r = n.c >= 0 ? kiln::where(C, vals[n.b], vals[n.c]) : kiln::where(C, vals[n.b], s.s);
      break;
    }
    case Op::Transpose: {
      int d0 = wrap_dim(n.p[0], rank), d1 = wrap_dim(n.p[1], rank);
      set(fmt::format("{}.transpose({}, {})", a, d0, d1));
      if (!code) r = A.transpose(d0, d1);
      break;
    }
    case Op::Permute: {
      std::vector<int64_t> order(rank);
      for (int i = 0; i < rank; ++i) order[i] = i;
      Rng g(n.p[0]);
      std::shuffle(order.begin(), order.end(), g);
      set(fmt::format("{}.permute({{{}}})", a, fmt::join(order, ", ")));
      if (!code) r = A.permute(Dims(order));
      break;
    }
    case Op::Slice: {
      // start 0 or 1; end: the size, the size - 1, start + 1 / start + 2, or size / 2 (equal
      // for sizes 2 and 3: automatic dynamic must not take it for a constant, finding 7).
      int d = wrap_dim(n.p[0], rank);
      int lo = n.p[1] % 2, kind = n.p[2] % 5, step = 1 + n.p[3] % 2;
      std::string hi_text = kind == 0   ? fmt::format("{}.size({})", a, d)
                            : kind == 1 ? fmt::format("{}.size({}) - 1", a, d)
                            : kind == 4 ? fmt::format("{}.size({}) / 2", a, d)
                                        : fmt::format("{}", lo + kind - 1);
      set(fmt::format("{}.slice({}, {}, {}, {})", a, d, lo, hi_text, step));
      if (!code) {
        int64_t sz = A.size(d);
        int64_t hi = kind == 0 ? sz : kind == 1 ? sz - 1 : kind == 4 ? sz / 2 : lo + kind - 1;
        r = A.slice(d, lo, hi, step);
      }
      break;
    }
    case Op::Flatten: {
      int s = wrap_dim(n.p[0], rank);
      int e = rank == 0 ? 0 : std::min(rank - 1, s + n.p[1] % 3);
      set(fmt::format("{}.flatten({}, {})", a, s, e));
      if (!code) r = A.flatten(s, e);
      break;
    }
    case Op::Reshape: {
      // p1: 0 insert a 1 before dim d, 1 after it, 2 split d into (2, size/2), 3 flatten to -1.
      // p2: view (0) or reshape (1).
      int d = wrap_dim(n.p[0], rank);
      int k = n.p[1] % 4;
      bool use_view = n.p[2] % 2 == 0;
      std::vector<std::string> sh_text;
      Shape sh;
      if (k == 3) {
        sh_text.push_back("-1");
        sh.push_back(-1);
      } else {
        for (int i = 0; i < rank; ++i) {
          std::string si = fmt::format("{}.size({})", a, i);
          int64_t v = A.size(i);
          if (i == d && k == 0) sh_text.push_back("1"), sh.push_back(1);
          if (i == d && k == 2) {
            sh_text.push_back("2"), sh.push_back(2);
            sh_text.push_back(si + " / 2"), sh.push_back(v / 2);
          } else {
            sh_text.push_back(si), sh.push_back(v);
          }
          if (i == d && k == 1) sh_text.push_back("1"), sh.push_back(1);
        }
        if (rank == 0) sh_text.push_back("1"), sh.push_back(1);
      }
      set(fmt::format("{}.{}({{{}}})", a, use_view ? "view" : "reshape", fmt::join(sh_text, ", ")));
      if (!code) r = use_view ? A.view(sh) : A.reshape(sh);
      break;
    }
    case Op::Unsqueeze: {
      int d = rank < 0 ? 0 : ((n.p[0] % (rank + 1)) + rank + 1) % (rank + 1);
      set(fmt::format("{}.unsqueeze({})", a, d));
      if (!code) r = A.unsqueeze(d);
      break;
    }
    case Op::Expand: {
      // Size-1 dims in mask p0 become 3; p1 odd: a new leading dim of 2. Others: -1 (kept).
      // The sizes depend on the call's shapes, so the repro prints the test, not phase A's sizes.
      std::vector<int64_t> sh;
      std::vector<std::string> sh_text;
      if (n.p[1] % 2) sh.push_back(2), sh_text.push_back("2");
      for (int i = 0; i < rank; ++i) {
        const bool grow = (n.p[0] >> i) & 1;
        sh.push_back(grow && A.size(i) == 1 ? 3 : -1);
        sh_text.push_back(grow ? fmt::format("{}.size({}) == 1 ? 3 : -1", a, i) : "-1");
      }
      set(fmt::format("{}.expand({{{}}})", a, fmt::join(sh_text, ", ")));
      if (!code) r = A.expand(Dims(sh));
      break;
    }
    case Op::Select: {
      int d = wrap_dim(n.p[0], rank);
      int idx = n.p[1] % 2 ? -1 : 0;
      set(fmt::format("{}.select({}, {})", a, d, idx));
      if (!code) r = A.select(d, idx);
      break;
    }
    case Op::Contiguous:
      set(fmt::format("{}.{}()", a, n.p[0] % 2 ? "clone" : "contiguous"));
      if (!code) r = n.p[0] % 2 ? A.clone() : A.contiguous();
      break;
    case Op::Reduce: {
      static const char* names[] = {"sum", "mean", "amax"};
      int k = n.p[0] % 3;
      std::vector<int64_t> dims;
      for (int i = 0; i < rank; ++i)
        if ((n.p[1] >> i) & 1) dims.push_back(i);
      bool keep = n.p[2] % 2;
      set(fmt::format("kiln::{}({}, {{{}}}, {})", names[k], a, fmt::join(dims, ", "), keep));
      if (code) break;
      Dims ds(dims);
      r = k == 0 ? kiln::sum(A, ds, keep) : k == 1 ? kiln::mean(A, ds, keep) : kiln::amax(A, ds, keep);
      break;
    }
    case Op::Matmul:
      set(fmt::format("kiln::matmul({}, {})", a, b));
      if (!code) r = kiln::matmul(A, vals[n.b]);
      break;
    case Op::MatmulT:
      if (rank >= 2) {
        set(fmt::format("kiln::matmul({0}, {0}.transpose(-2, -1))", a));
        if (!code) r = kiln::matmul(A, A.transpose(-2, -1));
      } else {
        set(fmt::format("kiln::matmul({0}, {0})", a));
        if (!code) r = kiln::matmul(A, A);
      }
      break;
    case Op::Softmax: {
      int d = wrap_dim(n.p[0], rank);
      bool log = n.p[1] % 2;
      set(fmt::format("kiln::{}({}, {})", log ? "log_softmax" : "softmax", a, d));
      if (!code) r = log ? kiln::log_softmax(A, d) : kiln::softmax(A, d);
      break;
    }
    case Op::LayerNorm:
      set(fmt::format("kiln::layer_norm({0}, {{{0}.size(-1)}})", a));
      if (!code) r = kiln::layer_norm(A, {A.size(-1)});
      break;
    case Op::InPlace: {
      // p0: 0 +=, 1 *=, 2 copy_, 3 fill_, 4 -=. Source: value b, or host scalar p1.
      int k = n.p[0] % 5;
      const HostScalar& s = kScalars[n.p[1] % kNumScalars];
      std::string src = n.b >= 0 ? b : fmt::format("Scalar({})", s.text);
      if (k == 3) text = fmt::format("{}.fill_({});", a, s.text);
      else if (k == 2) text = fmt::format("{}.copy_({});", a, n.b >= 0 ? b : a);
      else text = fmt::format("{} {}= {};", a, k == 0 ? "+" : k == 1 ? "*" : "-", src);
      text += fmt::format(" Tensor {} = {};", out, a);
      if (code) break;
      Tensor t = A;
      switch (k) {
        case 0: n.b >= 0 ? (t += vals[n.b]) : (t += s.s); break;
        case 1: n.b >= 0 ? (t *= vals[n.b]) : (t *= s.s); break;
        case 2: t.copy_(n.b >= 0 ? vals[n.b] : A); break;
        case 3: t.fill_(s.s); break;
        default: n.b >= 0 ? (t -= vals[n.b]) : (t -= s.s); break;
      }
      r = t;
      break;
    }
    case Op::Branch:
      text = fmt::format(
          "Tensor {0}; if ({1}.sum().item<double>() > 0) {0} = {2}; else {0} = {3};", out, a,
          unary_text(n.p[0], b), unary_text(n.p[1], b));
      if (code) break;
      r = A.sum().item<double>() > 0 ? unary(n.p[0], vals[n.b]) : unary(n.p[1], vals[n.b]);
      break;
    case Op::ItemScale:
      set(fmt::format("kiln::mul({}, {}.sum().item<double>())", b, a));
      if (!code) r = kiln::mul(vals[n.b], A.sum().item<double>());
      break;
    case Op::kCount: break;
  }
  if (code) *code = text;
  return r;
}

}  // namespace

std::vector<Tensor> interpret(const Program& p, std::vector<Tensor> vals,
                              std::vector<std::string>* code) {
  int na = static_cast<int>(p.args.size());
  for (size_t i = 0; i < p.nodes.size(); ++i) {
    if (code) {
      std::string t;
      apply(p, p.nodes[i], na + static_cast<int>(i), vals, &t);
      code->push_back(std::move(t));
    }
    vals.push_back(apply(p, p.nodes[i], na + static_cast<int>(i), vals, nullptr));
  }
  std::vector<Tensor> outs;
  for (int o : p.outputs) outs.push_back(vals[o]);
  return outs;
}

std::vector<Tensor> make_inputs(const Program& p, int phase) {
  Rng r(p.data_seed * 7919 + static_cast<uint64_t>(phase) * 104729 + 17);
  std::vector<Tensor> out;
  for (const Arg& a : p.args) {
    std::vector<int64_t> sh;
    for (int d : a.dims) sh.push_back(d >= 0 ? p.sym[phase][d] : d == -1 ? 1 : 0);
    int64_t n = 1;
    for (int64_t s : sh) n *= s;
    Shape shape(sh);
    if (a.dtype == DType::Float32 || a.dtype == DType::Float64) {
      std::vector<double> v(n);
      for (auto& x : v) {
        int k = rnd(r, 0, 199);
        if (k == 0) x = std::numeric_limits<double>::quiet_NaN();
        else if (k == 1) x = std::numeric_limits<double>::infinity();
        else if (k == 2) x = -std::numeric_limits<double>::infinity();
        else if (k == 3) x = -0.0;
        else x = rnd(r, -16, 16) / 8.0;
      }
      if (a.dtype == DType::Float64) {
        out.push_back(from_vector<double>(v, shape));
      } else {
        std::vector<float> f(v.begin(), v.end());
        out.push_back(from_vector<float>(f, shape));
      }
    } else {
      std::vector<int64_t> v(n);
      for (auto& x : v) x = a.dtype == DType::Bool ? rnd(r, 0, 1) : rnd(r, -3, 3);
      Tensor t = from_vector<int64_t>(v, shape);
      out.push_back(a.dtype == DType::Bool ? t.to(DType::Bool) : t);
    }
  }
  return out;
}

namespace {

std::vector<Tensor> clone_all(const std::vector<Tensor>& v) {
  std::vector<Tensor> c;
  for (const Tensor& t : v) c.push_back(t.clone());
  return c;
}

// Op weights for the generator.
const int kWeights[] = {
    /*Unary*/ 10, /*Cast*/ 3, /*Binary*/ 12, /*BinScalar*/ 8, /*Compare*/ 5, /*Where*/ 5,
    /*Transpose*/ 4, /*Permute*/ 3, /*Slice*/ 4, /*Flatten*/ 2, /*Reshape*/ 4, /*Unsqueeze*/ 3,
    /*Expand*/ 3, /*Select*/ 3, /*Contiguous*/ 2, /*Reduce*/ 8, /*Matmul*/ 4, /*MatmulT*/ 3,
    /*Softmax*/ 3, /*LayerNorm*/ 2, /*InPlace*/ 8, /*Branch*/ 3, /*ItemScale*/ 1};
static_assert(sizeof(kWeights) / sizeof(int) == static_cast<int>(Op::kCount));

Op pick_op(Rng& r) {
  int total = 0;
  for (int w : kWeights) total += w;
  int x = rnd(r, 0, total - 1);
  for (int i = 0; i < static_cast<int>(Op::kCount); ++i) {
    if (x < kWeights[i]) return static_cast<Op>(i);
    x -= kWeights[i];
  }
  return Op::Unary;
}

}  // namespace

Program generate(uint64_t seed, uint64_t index, bool large) {
  Rng r(seed * 1000003ULL + index * 7777777ULL + 12345 + (large ? 0x5bd1e995ULL : 0));
  Program p;
  p.data_seed = r();
  int nsym = rnd(r, 1, 3);
  static const int64_t kA[] = {2, 3, 4, 5};
  static const int64_t kLarge[] = {63, 64, 65, 257, 1000};
  p.sym.assign(3, std::vector<int64_t>(nsym));
  for (int s = 0; s < nsym; ++s) {
    p.sym[0][s] = large && s == 0 ? kLarge[rnd(r, 0, 4)] : kA[rnd(r, 0, 3)];
    p.sym[1][s] = p.sym[0][s] + rnd(r, 1, 3);
    p.sym[2][s] = p.sym[1][s] + rnd(r, 1, 3);
  }
  int nargs = rnd(r, 1, 3);
  for (int i = 0; i < nargs; ++i) {
    Arg a;
    int k = rnd(r, 0, 99);
    a.dtype = k < 60 ? DType::Float32 : k < 75 ? DType::Float64 : k < 90 ? DType::Int64 : DType::Bool;
    static const int kRanks[] = {0, 1, 1, 2, 2, 2, 3, 3, 4};
    int rank = kRanks[rnd(r, 0, 8)];
    bool has_large = false;
    for (int d = 0; d < rank; ++d) {
      int q = rnd(r, 0, 99);
      int dim = q < 2 ? -2 : q < 20 ? -1 : rnd(r, 0, nsym - 1);
      if (large && dim == 0 && std::exchange(has_large, true)) dim = -1;  // one large dim
      a.dims.push_back(dim);
    }
    p.args.push_back(a);
  }
  int nops = chance(r, 0.75) ? rnd(r, 1, 8) : rnd(r, 1, 30);

  // Generation by execution: each candidate op runs eagerly on phase A's values; one that
  // throws kiln::Error is usually dropped (sometimes kept: then the program ends with it, to
  // check that both modes raise the same error).
  std::vector<Tensor> vals = make_inputs(p, 0);
  std::vector<bool> inexact(vals.size(), false);  // see makes_inexact
  int attempts = 0;
  while (static_cast<int>(p.nodes.size()) < nops && attempts++ < nops * 20) {
    int nv = static_cast<int>(vals.size());
    auto pick_val = [&] {
      // Biased toward recent values.
      if (chance(r, 0.6)) return std::max(0, nv - 1 - rnd(r, 0, 2));
      return rnd(r, 0, nv - 1);
    };
    Node n;
    n.op = pick_op(r);
    n.a = pick_val();
    for (int& q : n.p) q = rnd(r, 0, 63);
    switch (n.op) {
      case Op::Binary: case Op::Matmul: n.b = pick_val(); break;
      case Op::Compare: if (chance(r, 0.5)) n.b = pick_val(); break;
      case Op::Where:
        n.b = pick_val();
        if (chance(r, 0.7)) n.c = pick_val();
        break;
      case Op::InPlace:
        if (chance(r, 0.7)) n.b = pick_val();
        if (chance(r, 0.3)) n.a = rnd(r, 0, nargs - 1);  // often an argument
        break;
      case Op::Branch: case Op::ItemScale: n.b = pick_val(); break;
      default: break;
    }
    int operands[3] = {n.a, n.b, n.c};
    bool from_inexact = false, blocked = false;
    int ulp_sensitive = discontinuous_operands(n, vals);
    for (int i = 0; i < 3; ++i) {
      int v = operands[i];
      if (v < 0 || !inexact[v]) continue;
      from_inexact = true;
      blocked |= (ulp_sensitive >> i & 1) != 0;
    }
    if (blocked) continue;
    int self = nv;
    // In-place ops must not corrupt `vals` when they fail half-way: they run on a deep copy.
    bool inplace = n.op == Op::InPlace;
    std::vector<Tensor> backup;
    if (inplace) backup = clone_all(vals);
    try {
      Tensor out = apply(p, n, self, vals, nullptr);
      if (large && out.numel() > (int64_t{1} << 21)) {  // [1000, 1000, 5]: too slow to check
        if (inplace)
          for (size_t i = 0; i < vals.size(); ++i) vals[i].copy_(backup[i]);
        continue;
      }
      vals.push_back(out);
      p.nodes.push_back(n);
      inexact.push_back(from_inexact || makes_inexact(n));
      if (n.op == Op::InPlace && inexact.back()) inexact[n.a] = true;
    } catch (const kiln::Error&) {
      if (inplace) {
        // Restore every value's contents (views of arguments share storage with them).
        for (size_t i = 0; i < vals.size(); ++i) {
          try { vals[i].copy_(backup[i]); } catch (...) {}
        }
      }
      if (chance(r, 0.02)) {
        p.nodes.push_back(n);
        break;
      }
    }
  }
  if (p.nodes.empty()) {
    Node n;
    n.op = Op::Unary;
    n.a = 0;
    p.nodes.push_back(n);
  }
  int last = nargs + static_cast<int>(p.nodes.size()) - 1;
  p.outputs.push_back(last);
  int extra = rnd(r, 0, 2);
  for (int i = 0; i < extra; ++i) {
    int v = rnd(r, 0, last);
    if (std::find(p.outputs.begin(), p.outputs.end(), v) == p.outputs.end()) p.outputs.push_back(v);
  }
  return p;
}

// ---------------------------------------------------------------------------------------------
// Runner

namespace {

struct Outcome {
  bool error = false;
  std::string err;  // "kiln::Error op: message" or "exception: what"
  bool unexpected = false;  // a non-kiln exception
  std::vector<Tensor> outs, args;
};

std::string describe_error(const std::exception& e) {
  if (auto* k = dynamic_cast<const kiln::Error*>(&e))
    return fmt::format("kiln::Error [{}] {}", k->op(), k->message());
  return fmt::format("exception: {}", e.what());
}

template <class F> Outcome run_outcome(F&& f, std::vector<Tensor> args) {
  Outcome o;
  try {
    o.outs = f(args);
  } catch (const kiln::Error& e) {
    o.error = true;
    o.err = describe_error(e);
  } catch (const std::exception& e) {
    o.error = o.unexpected = true;
    o.err = describe_error(e);
  }
  o.args = args;
  return o;
}

std::string shape_str(const Tensor& t) { return fmt::format("[{}]", fmt::join(t.shape().vec(), ", ")); }

// `f32_inside`: the program computes in float32 somewhere (a float32 argument, a cast to
// float32, an int/bool argument that a float op turns into the default dtype float32), so a
// float64 output may carry float32 rounding (gelu(x32).to(float64) differs by an ulp of
// float32): float64 outputs then get float32's tolerance.
std::string compare_tensor(const Tensor& c, const Tensor& e, const Tolerance& tol,
                           bool f32_inside) {
  if (c.dtype() != e.dtype())
    return fmt::format("dtype {} vs eager {}", name(c.dtype()), name(e.dtype()));
  if (!(c.shape() == e.shape()))
    return fmt::format("shape {} vs eager {}", shape_str(c), shape_str(e));
  std::vector<double> cv = c.to_vector<double>(), ev = e.to_vector<double>();
  bool fl = is_floating(e.dtype());
  double scale = 1;
  for (double x : ev)
    if (std::isfinite(x)) scale = std::max(scale, std::abs(x));
  bool f32 = e.dtype() == DType::Float32 || f32_inside;
  double rtol = f32 ? tol.rtol32 : tol.rtol64, atol = (f32 ? tol.atol32 : tol.atol64) * scale;
  for (size_t i = 0; i < ev.size(); ++i) {
    double x = cv[i], y = ev[i];
    bool ok;
    if (!fl) ok = x == y;
    else if (std::isnan(y) || std::isnan(x)) ok = std::isnan(x) && std::isnan(y);
    else if (std::isinf(y) || std::isinf(x)) ok = x == y;
    else ok = std::abs(x - y) <= atol + rtol * std::abs(y);
    if (!ok)
      return fmt::format("element {} (flat) is {} compiled vs {} eager (shape {}, {})", i, x, y,
                         shape_str(e), name(e.dtype()));
  }
  return "";
}

std::string compare_outcome(const Outcome& c, const Outcome& e, const Tolerance& tol,
                            bool f32_inside) {
  if (e.unexpected) return "eager raised a non-kiln exception: " + e.err;
  if (c.unexpected) return "compiled raised a non-kiln exception: " + c.err;
  if (c.error != e.error || c.err != e.err)
    return fmt::format("compiled: {}; eager: {}", c.error ? c.err : "no error",
                       e.error ? e.err : "no error");
  if (e.error) return "";
  if (c.outs.size() != e.outs.size()) return "output count differs";
  for (size_t i = 0; i < e.outs.size(); ++i)
    if (std::string d = compare_tensor(c.outs[i], e.outs[i], tol, f32_inside); !d.empty())
      return fmt::format("output {}: {}", i, d);
  for (size_t i = 0; i < e.args.size(); ++i)
    if (std::string d = compare_tensor(c.args[i], e.args[i], tol, f32_inside); !d.empty())
      return fmt::format("argument {} after the call: {}", i, d);
  return "";
}

using Call = std::function<std::vector<Tensor>(std::vector<Tensor>&)>;

Call compiled_call(const Program& prog) {
  auto p = std::make_shared<Program>(prog);
  switch (p->args.size()) {
    case 1: {
      auto cf = kiln::compile([p](const Tensor& a0) { return interpret(*p, {a0}); });
      return [cf](std::vector<Tensor>& v) { return cf(v[0]); };
    }
    case 2: {
      auto cf = kiln::compile(
          [p](const Tensor& a0, const Tensor& a1) { return interpret(*p, {a0, a1}); });
      return [cf](std::vector<Tensor>& v) { return cf(v[0], v[1]); };
    }
    default: {
      auto cf = kiln::compile([p](const Tensor& a0, const Tensor& a1, const Tensor& a2) {
        return interpret(*p, {a0, a1, a2});
      });
      return [cf](std::vector<Tensor>& v) { return cf(v[0], v[1], v[2]); };
    }
  }
}

// The compiled calls: phases A, A, B, B, C, C (each a trace or a replay).
constexpr int kCallsPerPhase = 2;

}  // namespace

static bool computes_in_float32(const Program& p) {
  for (const Arg& a : p.args)
    if (a.dtype != DType::Float64) return true;
  for (const Node& n : p.nodes)
    if (n.op == Op::Cast && kCasts[n.p[0] % 4] != DType::Float64) return true;
  return false;
}

std::string check(const Program& p, const Tolerance& tol) {
  bool f32_inside = computes_in_float32(p);
  Call eager = [&p](std::vector<Tensor>& v) { return interpret(p, v); };
  Call compiled = compiled_call(p);
  static const char* kPhase[] = {"A", "B", "C"};
  for (int ph = 0; ph < p.phases; ++ph) {
    Outcome e = run_outcome(eager, make_inputs(p, ph));
    for (int k = 0; k < kCallsPerPhase; ++k) {
      Outcome c = run_outcome(compiled, make_inputs(p, ph));
      if (std::string d = compare_outcome(c, e, tol, f32_inside); !d.empty())
        return fmt::format("call {} (inputs {}, compiled call #{}): {}", ph * kCallsPerPhase + k + 1,
                           kPhase[ph], ph * kCallsPerPhase + k + 1, d);
    }
  }
  return "";
}

// ---------------------------------------------------------------------------------------------
// Shrinker

namespace {

// Removes node i: uses of its value become uses of its first operand; later values shift down.
Program remove_node(const Program& p, size_t i) {
  Program q = p;
  int na = static_cast<int>(p.args.size());
  int v = na + static_cast<int>(i);
  int repl = p.nodes[i].a;
  auto fix = [&](int x) { return x == v ? repl : x > v ? x - 1 : x; };
  q.nodes.erase(q.nodes.begin() + static_cast<long>(i));
  for (Node& n : q.nodes) {
    if (n.a >= 0) n.a = fix(n.a);
    if (n.b >= 0) n.b = fix(n.b);
    if (n.c >= 0) n.c = fix(n.c);
  }
  std::vector<int> outs;
  for (int o : q.outputs) {
    int f = fix(o);
    if (std::find(outs.begin(), outs.end(), f) == outs.end()) outs.push_back(f);
  }
  q.outputs = outs;
  return q;
}

bool uses(const Program& p, int v) {
  for (const Node& n : p.nodes)
    if (n.a == v || n.b == v || n.c == v) return true;
  return std::find(p.outputs.begin(), p.outputs.end(), v) != p.outputs.end();
}

Program remove_arg(const Program& p, int i) {
  Program q = p;
  q.args.erase(q.args.begin() + i);
  auto fix = [&](int x) { return x > i ? x - 1 : x; };
  for (Node& n : q.nodes) {
    if (n.a >= 0) n.a = fix(n.a);
    if (n.b >= 0) n.b = fix(n.b);
    if (n.c >= 0) n.c = fix(n.c);
  }
  for (int& o : q.outputs) o = fix(o);
  return q;
}

}  // namespace

Program shrink(const Program& start, const Tolerance& tol, int budget, const Checker& checker) {
  Program best = start;
  int checks = 0;
  auto fails = [&](const Program& q) {
    if (checks >= budget) return false;
    ++checks;
    try {
      return !(checker ? checker(q) : check(q, tol)).empty();
    } catch (...) {
      return true;
    }
  };
  bool progress = true;
  while (progress && checks < budget) {
    progress = false;
    // Phases: fewer compiled calls.
    while (best.phases > 1) {
      Program q = best;
      q.phases = best.phases - 1;
      if (!fails(q)) break;
      best = q, progress = true;
    }
    // Ops: chunks of decreasing size (ddmin-style), from the end.
    for (size_t chunk = std::max<size_t>(1, best.nodes.size() / 2); chunk >= 1; chunk /= 2) {
      for (size_t i = best.nodes.size(); i-- > 0 && best.nodes.size() > 1;) {
        if (i + 1 < chunk) break;
        Program q = best;
        size_t lo = i + 1 - chunk;
        for (size_t j = i + 1; j-- > lo;) q = remove_node(q, j);
        if (q.nodes.empty()) continue;
        if (fails(q)) {
          best = q, progress = true;
          i = std::min(i, best.nodes.size());
        }
      }
      if (chunk == 1) break;
    }
    // Outputs.
    for (size_t i = best.outputs.size(); i-- > 0 && best.outputs.size() > 1;) {
      Program q = best;
      q.outputs.erase(q.outputs.begin() + static_cast<long>(i));
      if (fails(q)) best = q, progress = true;
    }
    // Unused arguments.
    for (int i = static_cast<int>(best.args.size()); i-- > 0 && best.args.size() > 1;) {
      if (uses(best, i)) continue;
      Program q = remove_arg(best, i);
      if (fails(q)) best = q, progress = true;
    }
    // Operands: replace b/c by a (fewer distinct values).
    for (size_t i = 0; i < best.nodes.size(); ++i) {
      for (int* f : {&best.nodes[i].b, &best.nodes[i].c}) {
        if (*f < 0 || *f == best.nodes[i].a) continue;
        Program q = best;
        Node& n = q.nodes[i];
        (f == &best.nodes[i].b ? n.b : n.c) = n.a;
        if (fails(q)) best = q, progress = true;
      }
    }
    // Shapes: drop dims, then sizes toward 1 / smaller symbols.
    for (size_t a = 0; a < best.args.size(); ++a) {
      for (size_t d = best.args[a].dims.size(); d-- > 0;) {
        Program q = best;
        q.args[a].dims.erase(q.args[a].dims.begin() + static_cast<long>(d));
        if (fails(q)) {
          best = q, progress = true;
          continue;
        }
        if (best.args[a].dims[d] != -1) {
          q = best;
          q.args[a].dims[d] = -1;
          if (fails(q)) best = q, progress = true;
        }
      }
    }
    for (size_t s = 0; s < best.sym[0].size(); ++s) {
      for (int64_t target : {2, 3}) {
        if (best.sym[0][s] <= target) continue;
        Program q = best;
        int64_t delta = q.sym[0][s] - target;
        for (auto& ph : q.sym) ph[s] -= delta;
        if (fails(q)) best = q, progress = true;
        break;
      }
    }
    // Params toward 0.
    for (size_t i = 0; i < best.nodes.size(); ++i)
      for (int k = 0; k < 4; ++k) {
        if (best.nodes[i].p[k] == 0) continue;
        Program q = best;
        q.nodes[i].p[k] = 0;
        if (fails(q)) best = q, progress = true;
      }
  }
  return best;
}

// ---------------------------------------------------------------------------------------------
// Serialization

std::string serialize(const Program& p) {
  std::vector<int64_t> v;
  v.push_back(static_cast<int64_t>(p.args.size()));
  for (const Arg& a : p.args) {
    v.push_back(static_cast<int64_t>(a.dtype));
    v.push_back(static_cast<int64_t>(a.dims.size()));
    for (int d : a.dims) v.push_back(d);
  }
  v.push_back(static_cast<int64_t>(p.sym[0].size()));
  for (const auto& ph : p.sym)
    for (int64_t x : ph) v.push_back(x);
  v.push_back(p.phases);
  v.push_back(static_cast<int64_t>(p.data_seed >> 32));
  v.push_back(static_cast<int64_t>(p.data_seed & 0xffffffffULL));
  v.push_back(static_cast<int64_t>(p.nodes.size()));
  for (const Node& n : p.nodes) {
    v.push_back(static_cast<int64_t>(n.op));
    v.push_back(n.a), v.push_back(n.b), v.push_back(n.c);
    for (int q : n.p) v.push_back(q);
  }
  v.push_back(static_cast<int64_t>(p.outputs.size()));
  for (int o : p.outputs) v.push_back(o);
  return fmt::format("{}", fmt::join(v, " "));
}

Program deserialize(const std::string& text) {
  std::vector<int64_t> v;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t used = 0;
    while (pos < text.size() && std::isspace(static_cast<unsigned char>(text[pos]))) ++pos;
    if (pos >= text.size()) break;
    v.push_back(std::stoll(text.substr(pos), &used));
    pos += used;
  }
  size_t i = 0;
  auto next = [&]() -> int64_t {
    KILN_CHECK(i < v.size(), "kiln-fuzz", Loc::current(), "truncated program text");
    return v[i++];
  };
  Program p;
  p.args.resize(next());
  for (Arg& a : p.args) {
    a.dtype = static_cast<DType>(next());
    a.dims.resize(next());
    for (int& d : a.dims) d = static_cast<int>(next());
  }
  int64_t nsym = next();
  p.sym.assign(3, std::vector<int64_t>(nsym));
  for (auto& ph : p.sym)
    for (int64_t& x : ph) x = next();
  p.phases = static_cast<int>(next());
  uint64_t hi = static_cast<uint64_t>(next()), lo = static_cast<uint64_t>(next());
  p.data_seed = (hi << 32) | lo;
  p.nodes.resize(next());
  for (Node& n : p.nodes) {
    n.op = static_cast<Op>(next());
    n.a = static_cast<int>(next()), n.b = static_cast<int>(next()), n.c = static_cast<int>(next());
    for (int& q : n.p) q = static_cast<int>(next());
  }
  p.outputs.resize(next());
  for (int& o : p.outputs) o = static_cast<int>(next());
  return p;
}

// ---------------------------------------------------------------------------------------------
// Printer

namespace {

std::string tensor_literal(const Tensor& t) {
  std::string shape = fmt::format("{{{}}}", fmt::join(t.shape().vec(), ", "));
  std::vector<std::string> vals;
  switch (t.dtype()) {
    case DType::Float32:
    case DType::Float64: {
      bool f32 = t.dtype() == DType::Float32;
      for (double x : t.to_vector<double>()) {
        std::string s;
        if (std::isnan(x)) s = "NAN";
        else if (std::isinf(x)) s = x > 0 ? "INFINITY" : "-INFINITY";
        else s = fmt::format("{}", x);
        if (s.find_first_of(".eNI") == std::string::npos) s += ".0";
        if (f32 && s.find_first_of("NI") == std::string::npos) s += "f";
        vals.push_back(s);
      }
      return fmt::format("kiln::from_vector<{}>({{{}}}, {})", f32 ? "float" : "double",
                         fmt::join(vals, ", "), shape);
    }
    default: {
      for (int64_t x : t.to_vector<int64_t>()) vals.push_back(fmt::format("{}", x));
      std::string base =
          fmt::format("kiln::from_vector<int64_t>({{{}}}, {})", fmt::join(vals, ", "), shape);
      return t.dtype() == DType::Bool ? base + ".to(kiln::Bool)" : base;
    }
  }
}

}  // namespace

std::string summary(const Program& p) {
  static const char* kNames[] = {"unary", "cast", "binary", "bin_scalar", "compare", "where",
                                 "transpose", "permute", "slice", "flatten", "reshape",
                                 "unsqueeze", "expand", "select", "contiguous", "reduce",
                                 "matmul", "matmul_t", "softmax", "layer_norm", "inplace",
                                 "branch", "item_scale"};
  std::vector<std::string> args, ops;
  for (const Arg& a : p.args) {
    std::vector<std::string> d;
    for (int x : a.dims) d.push_back(x >= 0 ? fmt::format("s{}", x) : x == -1 ? "1" : "0");
    args.push_back(fmt::format("{}[{}]", name(a.dtype), fmt::join(d, ",")));
  }
  for (const Node& n : p.nodes) ops.push_back(kNames[static_cast<int>(n.op)]);
  return fmt::format("args {} ops {}", fmt::join(args, " "), fmt::join(ops, " "));
}

std::string to_cpp(const Program& p, const std::string& failure) {
  std::vector<std::string> code;
  // The statements, resolved against phase A's ranks (ranks do not change between phases).
  std::vector<Tensor> vals = make_inputs(p, 0);
  int na = static_cast<int>(p.args.size());
  for (size_t i = 0; i < p.nodes.size(); ++i) {
    std::string t;
    try {
      apply(p, p.nodes[i], na + static_cast<int>(i), vals, &t);
      code.push_back(t);
      vals.push_back(apply(p, p.nodes[i], na + static_cast<int>(i), vals, nullptr));
    } catch (const std::exception&) {
      code.push_back(t);  // the op that raises: nothing after it runs
      break;
    }
  }
  std::string s;
  s += "// kiln-fuzz repro (" + summary(p) + ")\n";
  s += "// failure: " + failure + "\n";
  s += "#include <fmt/format.h>\n#include \"kiln/kiln.h\"\nusing namespace kiln;\n\n";
  std::vector<std::string> params, names;
  for (int i = 0; i < na; ++i) params.push_back(fmt::format("Tensor a{}", i)),
                               names.push_back(fmt::format("a{}", i));
  s += fmt::format("static std::vector<Tensor> f({}) {{\n", fmt::join(params, ", "));
  for (const std::string& c : code) s += "  " + c + "\n";
  std::vector<std::string> outs;
  for (int o : p.outputs) outs.push_back(vname(p, o));
  s += fmt::format("  return {{{}}};\n}}\n\n", fmt::join(outs, ", "));
  s += "static void show(const char* what, const std::vector<Tensor>& outs, "
       "std::vector<Tensor> args) {\n"
       "  for (const Tensor& t : outs) fmt::print(\"{} out: {}\\n\", what, t);\n"
       "  for (const Tensor& t : args) fmt::print(\"{} arg after: {}\\n\", what, t);\n}\n\n";
  s += "int main() {\n";
  std::vector<std::string> cparams;
  for (int i = 0; i < na; ++i) cparams.push_back(fmt::format("const Tensor& a{}", i));
  s += fmt::format("  auto cf = kiln::compile([]({}) {{ return f({}); }});\n",
                   fmt::join(cparams, ", "), fmt::join(names, ", "));
  static const char* kPhase[] = {"A", "B", "C"};
  for (int ph = 0; ph < p.phases; ++ph) {
    std::vector<Tensor> in = make_inputs(p, ph);
    std::vector<std::string> lits;
    for (const Tensor& t : in) lits.push_back(tensor_literal(t));
    s += fmt::format("  auto inputs_{} = [] {{ return std::vector<Tensor>{{\n      {}}}; }};\n",
                     kPhase[ph], fmt::join(lits, ",\n      "));
    std::vector<std::string> idx;
    for (int i = 0; i < na; ++i) idx.push_back(fmt::format("in[{}]", i));
    s += fmt::format(
        "  {{\n    auto in = inputs_{0}();\n    try {{ show(\"eager    {0}\", f({1}), in); }} "
        "catch (const kiln::Error& e) {{ fmt::print(\"eager    {0}: {{}}\\n\", e.what()); }}\n"
        "    for (int k = 0; k < {2}; ++k) {{\n      auto in = inputs_{0}();\n"
        "      try {{ show(\"compiled {0}\", cf({1}), in); }} catch (const kiln::Error& e) {{ "
        "fmt::print(\"compiled {0}: {{}}\\n\", e.what()); }}\n    }}\n  }}\n",
        kPhase[ph], fmt::join(idx, ", "), kCallsPerPhase);
  }
  s += "}\n";
  return s;
}

}  // namespace kiln::fuzz
