// Composite ops (softmax, log_softmax, layer_norm, var, std, logsumexp, nll_loss, mse_loss)
// built with ir::Graph, decomposed by kiln-decompose and compiled by codegen::Executable; the
// compiled and the eager results are both checked against float64 references computed here
// with plain loops.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/parallel.h"
#include "codegen/codegen.h"
#include "kiln/kiln.h"

using namespace kiln;

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

std::vector<double> values(const Tensor& t) {
  Tensor c = t.contiguous();
  std::vector<double> v(static_cast<size_t>(c.numel()));
  for (size_t i = 0; i < v.size(); ++i) {
    switch (c.dtype()) {
      case DType::Float32:
        v[i] = c.data<float>()[i];
        break;
      case DType::Float64:
        v[i] = c.data<double>()[i];
        break;
      case DType::Int64:
        v[i] = static_cast<double>(c.data<int64_t>()[i]);
        break;
      case DType::Int32:
        v[i] = c.data<int32_t>()[i];
        break;
      default:
        FAIL("unexpected dtype");
    }
  }
  return v;
}

/// Normal(0, 2) samples, deterministic per seed.
std::vector<double> randv(int64_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<double> dist(0.0, 2.0);
  std::vector<double> v(static_cast<size_t>(n));
  for (double& x : v) x = dist(gen);
  return v;
}

Tensor make(const std::vector<double>& v, const Shape& shape, DType dt) {
  return from_vector<double>(v, shape).to(dt);
}

/// NaN, +inf, a row of -inf and one -inf in rows 0-3 of a row-major [rows, cols] matrix.
void add_specials(std::vector<double>& v, int64_t cols) {
  v[1] = kNaN;
  v[cols + 2] = kInf;
  for (int64_t j = 0; j < cols; ++j) v[2 * cols + j] = -kInf;
  v[3 * cols] = -kInf;
}

/// Every element within atol + rtol·|ref| of the float64 reference (rtol = atol = 1e-5 for
/// float32, 1e-12 for float64); NaN exactly where the reference is NaN, infinities equal.
void check_close(const Tensor& got, const std::vector<double>& ref, const Shape& shape, DType dt,
                 const std::string& what) {
  INFO(what);
  REQUIRE(got.dtype() == dt);
  REQUIRE(got.shape() == shape);
  std::vector<double> g = values(got);
  REQUIRE(g.size() == ref.size());
  double tol = dt == DType::Float32 ? 1e-5 : 1e-12;
  int bad = 0;
  std::string first;
  for (size_t i = 0; i < g.size(); ++i) {
    double r = ref[i], x = g[i];
    bool ok = std::isnan(r)   ? std::isnan(x)
              : std::isinf(r) ? x == r
                              : std::abs(x - r) <= tol + tol * std::abs(r);
    if (!ok && bad++ == 0)
      first = "element " + std::to_string(i) + ": got " + std::to_string(x) + ", expected " +
              std::to_string(r);
  }
  INFO(first);
  CHECK(bad == 0);
}

/// Compiled and eager results against the same reference.
void check_both(const Tensor& compiled, const Tensor& eager, const std::vector<double>& ref,
                const Shape& shape, DType dt, const std::string& what) {
  check_close(compiled, ref, shape, dt, what + " (compiled)");
  check_close(eager, ref, shape, dt, what + " (eager)");
}

/// [a, n, b] view of `shape` around `dim`.
struct Split {
  int64_t a = 1, n = 1, b = 1;
  Split(const Shape& s, int64_t dim) {
    int d = static_cast<int>(dim < 0 ? dim + s.size() : dim);
    for (int i = 0; i < s.size(); ++i) (i < d ? a : i == d ? n : b) *= s[i];
  }
  size_t at(int64_t i, int64_t k, int64_t j) const {
    return static_cast<size_t>((i * n + k) * b + j);
  }
};

double max_nan(const std::vector<double>& x, const Split& s, int64_t i, int64_t j) {
  double m = -kInf;
  for (int64_t k = 0; k < s.n; ++k) {
    double v = x[s.at(i, k, j)];
    if (std::isnan(v)) return kNaN;
    m = std::max(m, v);
  }
  return m;
}

std::vector<double> ref_softmax(const std::vector<double>& x, const Shape& shape, int64_t dim,
                                bool log) {
  Split s(shape, dim);
  std::vector<double> y(x.size());
  for (int64_t i = 0; i < s.a; ++i)
    for (int64_t j = 0; j < s.b; ++j) {
      double m = max_nan(x, s, i, j), sum = 0;
      for (int64_t k = 0; k < s.n; ++k) sum += std::exp(x[s.at(i, k, j)] - m);
      for (int64_t k = 0; k < s.n; ++k) {
        double d = x[s.at(i, k, j)] - m;
        y[s.at(i, k, j)] = log ? d - std::log(sum) : std::exp(d) / sum;
      }
    }
  return y;
}

/// var (or std) over one dim, with correction.
std::vector<double> ref_var(const std::vector<double>& x, const Shape& shape, int64_t dim,
                            int64_t correction, bool is_std) {
  Split s(shape, dim);
  std::vector<double> y;
  for (int64_t i = 0; i < s.a; ++i)
    for (int64_t j = 0; j < s.b; ++j) {
      double mean = 0, ss = 0;
      for (int64_t k = 0; k < s.n; ++k) mean += x[s.at(i, k, j)];
      mean /= static_cast<double>(s.n);
      for (int64_t k = 0; k < s.n; ++k) ss += (x[s.at(i, k, j)] - mean) * (x[s.at(i, k, j)] - mean);
      double denom = static_cast<double>(s.n - correction);
      double v = ss / std::max(denom, 0.0);  // inf, or NaN for a constant row (PyTorch)
      y.push_back(is_std ? std::sqrt(v) : v);
    }
  return y;
}

std::vector<double> ref_logsumexp(const std::vector<double>& x, const Shape& shape, int64_t dim) {
  Split s(shape, dim);
  std::vector<double> y;
  for (int64_t i = 0; i < s.a; ++i)
    for (int64_t j = 0; j < s.b; ++j) {
      double m = max_nan(x, s, i, j), sum = 0;
      if (std::isinf(m)) m = 0;
      for (int64_t k = 0; k < s.n; ++k) sum += std::exp(x[s.at(i, k, j)] - m);
      y.push_back(std::log(sum) + m);
    }
  return y;
}

/// layer_norm over the trailing `m` elements of each row; w/b empty when absent.
std::vector<double> ref_layer_norm(const std::vector<double>& x, int64_t m,
                                   const std::vector<double>& w, const std::vector<double>& b,
                                   double eps) {
  std::vector<double> y(x.size());
  for (size_t r = 0; r < x.size() / static_cast<size_t>(m); ++r) {
    const double* xr = x.data() + r * m;
    double mean = 0, var = 0;
    for (int64_t i = 0; i < m; ++i) mean += xr[i];
    mean /= static_cast<double>(m);
    for (int64_t i = 0; i < m; ++i) var += (xr[i] - mean) * (xr[i] - mean);
    var /= static_cast<double>(m);
    for (int64_t i = 0; i < m; ++i) {
      double v = (xr[i] - mean) / std::sqrt(var + eps);
      if (!w.empty()) v *= w[i];
      if (!b.empty()) v += b[i];
      y[r * m + i] = v;
    }
  }
  return y;
}

/// nll_loss of log-probs [n, c] at targets; mode 0 none, 1 mean, 2 sum.
std::vector<double> ref_nll(const std::vector<double>& x, int64_t c, const std::vector<double>& t,
                            int64_t ignore, int mode) {
  std::vector<double> loss;
  double total = 0, count = 0;
  for (size_t i = 0; i < t.size(); ++i) {
    auto ti = static_cast<int64_t>(t[i]);
    double l = ti == ignore ? 0.0 : -x[i * c + ti];
    loss.push_back(l);
    if (ti != ignore) {
      total += l;
      ++count;
    }
  }
  if (mode == 0) return loss;
  return {mode == 1 ? total / count : total};
}

const DType kFloats[] = {DType::Float32, DType::Float64};

std::string label(const char* op, DType dt, const Shape& shape, const std::string& extra = "") {
  return std::string(op) + " " + std::string(name(dt)) + " " + to_string(shape) + " " + extra;
}

}  // namespace

TEST_CASE("composite: softmax and log_softmax, dims -1 and 0, NaN/Inf rows") {
  for (DType dt : kFloats)
    for (Shape shape : {Shape{4, 7}, Shape{5, 37}, Shape{6, 16}})
      for (int64_t dim : {-1, 0})
        for (bool log : {false, true}) {
          OpKind k = log ? OpKind::LogSoftmax : OpKind::Softmax;
          std::string what =
              label(log ? "log_softmax" : "softmax", dt, shape, "dim " + std::to_string(dim));
          std::vector<double> v = randv(numel(shape), 7);
          add_specials(v, shape[1]);
          Tensor x = make(v, shape, dt);
          ir::Graph g;
          OpAttrs a;
          a.dim = dim;
          g.output(g.op(k, {g.input(dt, shape.vec())}, a));
          codegen::Executable exe(g);
          Tensor eager = log ? log_softmax(x, dim) : softmax(x, dim);
          check_both(exe.run({x})[0], eager, ref_softmax(values(x), shape, dim, log), shape, dt,
                     what);
        }
}

TEST_CASE("composite: layer_norm with and without weight / bias, over 1 and 2 trailing dims") {
  for (DType dt : kFloats)
    for (Shape shape : {Shape{4, 37}, Shape{2, 3, 16}})
      for (int k : {1, 2})
        for (int variant = 0; variant < 4; ++variant) {  // bit 0: weight, bit 1: bias
          bool has_w = variant & 1, has_b = variant & 2;
          Shape ns;
          for (int i = shape.size() - k; i < shape.size(); ++i) ns.push_back(shape[i]);
          std::string what = label("layer_norm", dt, shape,
                                   to_string(ns) + (has_w ? " w" : "") + (has_b ? " b" : ""));
          std::vector<double> v = randv(numel(shape), 11);
          v[3] = kNaN;  // a NaN row (row of the first normalized slice)
          std::vector<double> wv = has_w ? randv(numel(ns), 12) : std::vector<double>{};
          std::vector<double> bv = has_b ? randv(numel(ns), 13) : std::vector<double>{};
          Tensor x = make(v, shape, dt);
          Tensor w = has_w ? make(wv, ns, dt) : Tensor();
          Tensor b = has_b ? make(bv, ns, dt) : Tensor();
          ir::Graph g;
          OpAttrs a;
          a.dims = ns;
          a.eps = 1e-3;
          std::vector<ir::Value> in = {g.input(dt, shape.vec())};
          std::vector<Tensor> args = {x};
          in.push_back(has_w ? g.input(dt, ns.vec()) : ir::Value{});
          in.push_back(has_b ? g.input(dt, ns.vec()) : ir::Value{});
          if (has_w) args.push_back(w);
          if (has_b) args.push_back(b);
          g.output(g.op(OpKind::LayerNorm, in, a));
          codegen::Executable exe(g);
          Tensor eager = layer_norm(x, ns, w, b, 1e-3);
          check_both(exe.run(args)[0], eager,
                     ref_layer_norm(values(x), numel(ns), has_w ? values(w) : wv,
                                    has_b ? values(b) : bv, 1e-3),
                     shape, dt, what);
        }
}

// Row-split graphs run their loop nests row by row inside each block of rows, with one-row
// intermediates; softmax computes exp in its output row (codegen/row_fusion.h). Enough rows for
// several blocks and a partial last one, with NaN/Inf rows, on 1 and 2 threads.
TEST_CASE("composite: softmax and layer_norm over many row blocks equal float64") {
  const Shape shape{3001, 333};
  std::vector<double> v = randv(numel(shape), 23);
  add_specials(v, shape[1]);
  v[1500 * 333 + 7] = kNaN;
  Tensor x = make(v, shape, DType::Float32);
  std::vector<double> wv = randv(333, 24), bv = randv(333, 25);
  Tensor w = make(wv, {333}, DType::Float32), b = make(bv, {333}, DType::Float32);
  ir::Graph sg, lg;
  OpAttrs last, ln;
  last.dim = -1;
  sg.output(sg.op(OpKind::Softmax, {sg.input(DType::Float32, shape.vec())}, last));
  ln.dims = {333};
  ln.eps = 1e-5;
  lg.output(lg.op(OpKind::LayerNorm,
                  {lg.input(DType::Float32, shape.vec()), lg.input(DType::Float32, {333}),
                   lg.input(DType::Float32, {333})},
                  ln));
  codegen::Executable softmax_exe(sg), layer_norm_exe(lg);
  CHECK(softmax_exe.row_parallel());
  CHECK(layer_norm_exe.row_parallel());
  const std::vector<double> softmax_ref = ref_softmax(v, shape, -1, false);
  const std::vector<double> layer_norm_ref = ref_layer_norm(v, 333, wv, bv, 1e-5);
  for (int threads : {1, 2}) {
    cpu::set_num_threads(threads);
    const std::string on = std::to_string(threads) + " thread(s)";
    check_both(softmax_exe.run({x})[0], softmax(x, -1), softmax_ref, shape, DType::Float32,
               "softmax [3001, 333] " + on);
    check_both(layer_norm_exe.run({x, w, b})[0], layer_norm(x, Shape{333}, w, b, 1e-5),
               layer_norm_ref, shape, DType::Float32, "layer_norm [3001, 333] " + on);
  }
}

TEST_CASE("composite: var and std (correction 0, 1 and > n), logsumexp, keepdim, NaN/Inf") {
  for (DType dt : kFloats)
    for (Shape shape : {Shape{4, 37}, Shape{5, 3}})
      for (int64_t dim : {-1, 0})
        for (bool keepdim : {false, true}) {
          std::vector<double> v = randv(numel(shape), 17);
          add_specials(v, shape[1]);
          Tensor x = make(v, shape, dt);
          Shape out = shape;
          int d = static_cast<int>(dim < 0 ? dim + 2 : dim);
          if (keepdim)
            out[d] = 1;
          else
            out.erase(d);
          OpAttrs a;
          a.dims = {dim};
          a.keepdim = keepdim;
          for (int64_t corr : {0, 1, 40}) {
            std::string what = label("var/std", dt, shape,
                                     "dim " + std::to_string(dim) + " correction " +
                                         std::to_string(corr) + (keepdim ? " keepdim" : ""));
            a.mode = corr;
            ir::Graph g;
            ir::Value xi = g.input(dt, shape.vec());
            g.output(g.op(OpKind::Var, {xi}, a));
            g.output(g.op(OpKind::Std, {xi}, a));
            codegen::Executable exe(g);
            std::vector<Tensor> res = exe.run({x});
            check_both(res[0], var(x, {dim}, corr, keepdim),
                       ref_var(values(x), shape, dim, corr, false), out, dt, "var " + what);
            check_both(res[1], kiln::std(x, {dim}, corr, keepdim),
                       ref_var(values(x), shape, dim, corr, true), out, dt, "std " + what);
          }
          a.mode = 0;
          ir::Graph g;
          g.output(g.op(OpKind::LogSumExp, {g.input(dt, shape.vec())}, a));
          codegen::Executable exe(g);
          check_both(exe.run({x})[0], logsumexp(x, {dim}, keepdim),
                     ref_logsumexp(values(x), shape, dim), out, dt,
                     label("logsumexp", dt, shape, "dim " + std::to_string(dim)));
        }
}

TEST_CASE("composite: nll_loss (none/mean/sum, ignore_index, int32/int64 targets), cross entropy") {
  const int64_t n = 6, c = 5;
  for (DType dt : kFloats)
    for (DType tt : {DType::Int64, DType::Int32})
      for (int64_t ignore : {-100, 2})
        for (int mode : {0, 1, 2}) {
          std::vector<double> tv = {0, 4, 2, static_cast<double>(ignore), 1, 2};
          std::string what = label("nll_loss", dt, {n, c},
                                   std::string(name(tt)) + " ignore " + std::to_string(ignore) +
                                       " mode " + std::to_string(mode));
          std::vector<double> v = randv(n * c, 23);
          v[3] = kNaN;  // not a target class of sample 0: must not leak into its loss
          Tensor x = make(v, {n, c}, dt);
          Tensor t = make(tv, {n}, tt);
          OpAttrs a;
          a.mode = mode;
          a.ignore_index = ignore;
          // Separate graphs: two scalar outputs of one graph hit the aliasing bug tested below.
          ir::Graph g;
          g.output(g.op(OpKind::NllLoss, {g.input(dt, {n, c}), g.input(tt, {n})}, a));
          ir::Graph ce;
          OpAttrs rows;
          rows.dim = 1;
          ir::Value logits = ce.input(dt, {n, c});
          ce.output(ce.op(OpKind::NllLoss,
                          {ce.op(OpKind::LogSoftmax, {logits}, rows), ce.input(tt, {n})}, a));
          std::vector<Tensor> res = {codegen::Executable(g).run({x, t})[0],
                                     codegen::Executable(ce).run({x, t})[0]};
          Shape out = mode == 0 ? Shape{n} : Shape{};
          auto red = static_cast<Reduction>(mode);
          check_both(res[0], nll_loss(x, t, red, ignore), ref_nll(values(x), c, tv, ignore, mode),
                     out, dt, what);
          check_both(res[1], cross_entropy(x, t, red, ignore),
                     ref_nll(ref_softmax(values(x), {n, c}, 1, true), c, tv, ignore, mode), out, dt,
                     "cross entropy " + what);
        }
  // 1-D log-probs with a 0-d target, and every target ignored (mean = 0/0 = nan).
  for (DType dt : kFloats) {
    std::vector<double> v = randv(c, 29);
    Tensor x = make(v, {c}, dt);
    ir::Graph g;
    OpAttrs a;
    a.mode = 1;
    g.output(g.op(OpKind::NllLoss, {g.input(dt, {c}), g.input(DType::Int64, {})}, a));
    codegen::Executable exe(g);
    for (double target : {3.0, -100.0}) {
      Tensor t = make({target}, {}, DType::Int64);
      check_both(exe.run({x, t})[0], nll_loss(x, t, Reduction::Mean),
                 ref_nll(values(x), c, {target}, -100, 1), {}, dt,
                 label("nll_loss 1-D", dt, {c}, "target " + std::to_string(target)));
    }
  }
}

TEST_CASE("composite: mse_loss with broadcasting, none/mean/sum") {
  for (DType dt : kFloats)
    for (int mode : {0, 1, 2}) {
      std::vector<double> av = randv(4 * 19, 31), bv = randv(19, 32);
      Tensor at = make(av, {4, 19}, dt), bt = make(bv, {19}, dt);
      ir::Graph g;
      OpAttrs a;
      a.mode = mode;
      g.output(g.op(OpKind::MseLoss, {g.input(dt, {4, 19}), g.input(dt, {19})}, a));
      codegen::Executable exe(g);
      std::vector<double> sq, ax = values(at), bx = values(bt);
      double total = 0;
      for (size_t i = 0; i < ax.size(); ++i) {
        double d = ax[i] - bx[i % 19];
        sq.push_back(d * d);
        total += d * d;
      }
      std::vector<double> ref =
          mode == 0 ? sq : std::vector<double>{mode == 1 ? total / 76 : total};
      check_both(exe.run({at, bt})[0], mse_loss(at, bt, static_cast<Reduction>(mode)), ref,
                 mode == 0 ? Shape{4, 19} : Shape{}, dt,
                 label("mse_loss", dt, {4, 19}, std::to_string(mode)));
    }
}

TEST_CASE("composite: dynamic leading dim runs at two sizes") {
  using ir::kDynamic;
  for (DType dt : kFloats) {
    ir::Graph g;
    ir::Value x = g.input(dt, {kDynamic, 37});
    ir::Value w = g.input(dt, {37});
    ir::Value b = g.input(dt, {37});
    ir::Value t = g.input(DType::Int64, {kDynamic});
    OpAttrs last;
    last.dim = -1;
    g.output(g.op(OpKind::Softmax, {x}, last));
    OpAttrs ln;
    ln.dims = {37};
    g.output(g.op(OpKind::LayerNorm, {x, w, b}, ln));
    OpAttrs col;  // var over the dynamic dim: the count is computed at run time
    col.dims = {0};
    col.mode = 1;
    g.output(g.op(OpKind::Var, {x}, col));
    OpAttrs none;  // nll_loss, reduction none: a dynamic output
    g.output(g.op(OpKind::NllLoss, {x, t}, none));
    codegen::Executable exe(g);
    for (int64_t n : {3, 70}) {
      Shape shape{n, 37};
      std::vector<double> v = randv(n * 37, 41), tv;
      for (int64_t i = 0; i < n; ++i) tv.push_back(static_cast<double>((i * 7) % 37));
      Tensor xt = make(v, shape, dt), wt = make(randv(37, 42), {37}, dt),
             bt = make(randv(37, 43), {37}, dt), tt = make(tv, {n}, DType::Int64);
      std::vector<Tensor> res = exe.run({xt, wt, bt, tt});
      REQUIRE(res.size() == 4);
      std::string sz = "n = " + std::to_string(n);
      check_both(res[0], softmax(xt, -1), ref_softmax(values(xt), shape, -1, false), shape, dt,
                 label("softmax", dt, shape, sz));
      check_both(res[1], layer_norm(xt, {37}, wt, bt),
                 ref_layer_norm(values(xt), 37, values(wt), values(bt), 1e-5), shape, dt,
                 label("layer_norm", dt, shape, sz));
      check_both(res[2], var(xt, {0}, 1), ref_var(values(xt), shape, 0, 1, false), {37}, dt,
                 label("var", dt, shape, sz));
      check_both(res[3], nll_loss(xt, tt, Reduction::None), ref_nll(values(xt), 37, tv, -100, 0),
                 {n}, dt, label("nll_loss", dt, shape, sz));
    }
  }
}

TEST_CASE("composite: no kiln op is left after lowering; kernel counts (printed)") {
  ir::Graph g;
  ir::Value x = g.input(DType::Float32, {ir::kDynamic, 37});
  OpAttrs last;
  last.dim = -1;
  g.output(g.op(OpKind::Softmax, {x}, last));
  std::string text = codegen::lower_to_linalg(g);
  INFO(text);
  CHECK(text.find("kiln.") == std::string::npos);
  // The graph itself keeps the composite.
  CHECK(g.to_mlir().find("kiln.composite \"softmax\"") != std::string::npos);

  codegen::Executable sm(g);
  ir::Graph h;
  OpAttrs ln;
  ln.dims = {37};
  h.output(h.op(OpKind::LayerNorm,
                {h.input(DType::Float32, {ir::kDynamic, 37}), h.input(DType::Float32, {37}),
                 h.input(DType::Float32, {37})},
                ln));
  codegen::Executable lnx(h);
  std::printf(
      "kernels after fusion (loop nests): softmax [?, 37]: %d (%d), layer_norm [?, 37] "
      "(weight, bias): %d (%d)\n",
      sm.num_kernels(), sm.num_loop_nests(), lnx.num_kernels(), lnx.num_loop_nests());
  CHECK(sm.num_kernels() > 0);
  CHECK(lnx.num_kernels() > 0);
  // Row splitting over threads (decided before decomposition): printed, not asserted.
  ir::Graph st;
  st.output(st.op(OpKind::Softmax, {st.input(DType::Float32, {4096, 37})}, last));
  std::printf("softmax [4096, 37] row_parallel: %d\n", codegen::Executable(st).row_parallel());
}

TEST_CASE("composite: large row counts (row-split execution where the plan allows it)") {
  const int64_t rows = 4096;
  for (DType dt : kFloats) {
    std::vector<double> v = randv(rows * 64, 61);
    add_specials(v, 64);
    Shape shape{rows, 64};
    Tensor x = make(v, shape, dt), w = make(randv(64, 62), {64}, dt),
           b = make(randv(64, 63), {64}, dt);
    for (int64_t dim : {-1, 0}) {
      ir::Graph g;
      OpAttrs a;
      a.dim = dim;
      g.output(g.op(OpKind::Softmax, {g.input(dt, shape.vec())}, a));
      codegen::Executable exe(g);
      std::printf("softmax %s [4096, 64] dim %lld row_parallel: %d\n", name(dt).data(),
                  static_cast<long long>(dim), exe.row_parallel());
      check_both(exe.run({x})[0], softmax(x, dim), ref_softmax(values(x), shape, dim, false), shape,
                 dt, label("softmax", dt, shape, "dim " + std::to_string(dim)));
    }
    ir::Graph g;
    OpAttrs ln;
    ln.dims = {64};
    g.output(g.op(OpKind::LayerNorm,
                  {g.input(dt, shape.vec()), g.input(dt, {64}), g.input(dt, {64})}, ln));
    codegen::Executable exe(g);
    std::printf("layer_norm %s [4096, 64] row_parallel: %d\n", name(dt).data(), exe.row_parallel());
    check_both(exe.run({x, w, b})[0], layer_norm(x, {64}, w, b),
               ref_layer_norm(values(x), 64, values(w), values(b), 1e-5), shape, dt,
               label("layer_norm", dt, shape));
    ir::Graph vg;
    OpAttrs col;
    col.dims = {0};
    col.mode = 1;
    vg.output(vg.op(OpKind::Var, {vg.input(dt, shape.vec())}, col));
    check_both(codegen::Executable(vg).run({x})[0], var(x, {0}, 1),
               ref_var(values(x), shape, 0, 1, false), {64}, dt, label("var dim 0", dt, shape));
  }
}

// Two graph outputs that are reductions: CSE merges their zero-filled inits into one
// linalg.fill; Executable gives each its own again (unshare_inits), else eliminate-empty-tensors
// made both outputs share one buffer and output 1 came back equal to output 0.
TEST_CASE("Executable: two scalar reductions as outputs get separate buffers") {
  ir::Graph g;
  ir::Value x = g.input(DType::Float32, {6});
  g.output(g.op(OpKind::Sum, {x}));
  g.output(g.op(OpKind::Sum, {g.op(OpKind::Exp, {x})}));
  codegen::Executable exe(g);
  std::vector<double> v = randv(6, 51);
  Tensor xt = make(v, {6}, DType::Float32);
  std::vector<Tensor> r = exe.run({xt});
  double s = 0, se = 0;
  for (double e : values(xt)) {
    s += e;
    se += std::exp(e);
  }
  check_close(r[0], {s}, {}, DType::Float32, "sum");
  check_close(r[1], {se}, {}, DType::Float32, "sum of exp");
}

TEST_CASE("compiled float32 atan2 is within 2 ulp of float64 over a grid") {
  // Found by a fresh-user trial: MLIR's polynomial for float32 atan2 was off by up to 40.5 ulp
  // (eager: 1.4); codegen/lower.cpp now evaluates Cephes' atanf on the first octant.
  std::vector<float> ys, xs;
  for (int i = -150; i <= 150; ++i)
    for (int j = -150; j <= 150; ++j) {
      ys.push_back(i * 0.37f);
      xs.push_back(j * 0.53f + 0.01f);
    }
  for (float t : {1e-30f, 3e-39f, 1e30f, 0.41421356f, 2.4142135f}) {  // scales, octant edges
    ys.push_back(t), xs.push_back(1.0f);
    ys.push_back(1.0f), xs.push_back(-t);
  }
  const int64_t n = static_cast<int64_t>(ys.size());
  ir::Graph g;
  ir::Value y = g.input(DType::Float32, {n}), x = g.input(DType::Float32, {n});
  g.output(g.op(OpKind::Atan2, {y, x}, OpAttrs{}));
  codegen::Executable exe(g);
  std::vector<float> got =
      exe.run({from_vector<float>(ys, {n}), from_vector<float>(xs, {n})}).at(0).to_vector<float>();
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    double ref = std::atan2(double(ys[i]), double(xs[i]));
    float r = static_cast<float>(std::fabs(ref));
    double ulp = double(std::nextafter(r, INFINITY)) - double(r);
    if (r < 0x1p-126f) ulp = 0x1p-149;  // denormal results
    worst = std::max(worst, std::fabs(got[i] - ref) / ulp);
    INFO("atan2(" << ys[i] << ", " << xs[i] << ") = " << got[i] << ", exact " << ref);
    CHECK(std::fabs(got[i] - ref) <= 2.01 * ulp);
  }
  std::printf("compiled float32 atan2: max error %.2f ulp over %lld points\n", worst, (long long)n);
}
