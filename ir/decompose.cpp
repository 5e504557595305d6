// kiln-decompose: composite ops -> primitive kiln ops, with the formulas of eager's kernels
// (backends/cpu/normalization.cpp, reduce.cpp, loss.cpp), so that compiled results match eager
// up to summation order. Each decomposition ends in a value of the composite's exact type;
// an op whose decomposition fails (unsupported case, e.g. a dynamic class dim) is left as it is.
#include "ir/decompose.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <utility>

#include "core/error.h"
#include "core/meta.h"
#include "ir/dialect.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/PatternMatch.h"
#include "mlir/Transforms/GreedyPatternRewriteDriver.h"

namespace kiln::dialect {
namespace {

/// Builds primitive kiln ops at one insertion point.
struct Emitter {
  mlir::OpBuilder& b;
  mlir::Location loc;

  mlir::Value op(OpKind k, mlir::ValueRange in, const OpAttrs& a = {}) {
    return create_op(b, loc, k, in, a);
  }
  mlir::Value op(OpKind k, mlir::Value x) { return op(k, mlir::ValueRange{x}); }
  mlir::Value op(OpKind k, mlir::Value x, mlir::Value y) { return op(k, mlir::ValueRange{x, y}); }
  mlir::Value where(mlir::Value c, mlir::Value x, mlir::Value y) {
    return op(OpKind::Where, mlir::ValueRange{c, x, y});
  }
  /// Reduction `k` over the dims of `over` (dims / all_dims), with the given keepdim.
  mlir::Value reduce(OpKind k, mlir::Value x, const OpAttrs& over, bool keepdim) {
    OpAttrs a;
    a.dims = over.dims;
    a.all_dims = over.all_dims;
    a.keepdim = keepdim;
    return op(k, mlir::ValueRange{x}, a);
  }
  /// A 0-d constant: broadcasts to anything and, being 0-d, does not promote a tensor's dtype.
  mlir::Value scalar(mlir::Type t, double v) {
    return splat_constant(b, loc, mlir::RankedTensorType::get({}, t), v);
  }
};

mlir::RankedTensorType type_of(mlir::Value v) {
  return llvm::cast<mlir::RankedTensorType>(v.getType());
}
mlir::Type elem(mlir::Value v) { return type_of(v).getElementType(); }
bool is_float(mlir::Value v) { return llvm::isa<mlir::FloatType>(elem(v)); }

OpAttrs over_dim(int64_t d) {
  OpAttrs a;
  a.dims = Dims{d};
  return a;
}
OpAttrs over_all() {
  OpAttrs a;
  a.all_dims = true;
  return a;
}

/// Σ e over `over` for e = exp(...) >= 0 (or NaN), marked kNonnegativeTermsAttr.
mlir::Value sum_of_exps(Emitter& E, mlir::Value e, const OpAttrs& over, bool keepdim) {
  mlir::Value s = E.reduce(OpKind::Sum, e, over, keepdim);
  s.getDefiningOp()->setAttr(kNonnegativeTermsAttr, E.b.getUnitAttr());
  return s;
}

// softmax = exp(x - m) * (1 / Σ exp(x - m)); log_softmax = (x - m) - log Σ exp(x - m); m = amax
// (NaN wins, as in eager). Subtracting m first keeps the precision of large logits. The
// reciprocal, as in eager, is per row: after fusion it is loop-invariant in the inner loop, so
// the per-element work is a multiply, not a divide.
// Integer inputs are converted to the result's float type first, as eager does: `x - m` in
// int64 wraps for INT64_MIN (the fuzzer's softmax of a NaN cast to int64).
mlir::Value softmax(Emitter& E, mlir::Value x, int64_t dim, bool log, mlir::Type result) {
  if (!is_float(x)) {
    std::optional<DType> t = dtype_of(result);
    if (!t) return {};
    OpAttrs c;
    c.dtype = *t;
    x = E.op(OpKind::Cast, mlir::ValueRange{x}, c);
  }
  OpAttrs r = over_dim(dim);
  mlir::Value d = E.op(OpKind::Sub, x, E.reduce(OpKind::Amax, x, r, true));
  mlir::Value e = E.op(OpKind::Exp, d);
  mlir::Value s = sum_of_exps(E, e, r, true);
  return log ? E.op(OpKind::Sub, d, E.op(OpKind::Log, s))
             : E.op(OpKind::Mul, e, E.op(OpKind::Reciprocal, s));
}

/// x converted to element type t (x itself when it already has it).
mlir::Value cast_to(Emitter& E, mlir::Value x, mlir::Type t) {
  if (elem(x) == t) return x;
  std::optional<DType> d = dtype_of(t);
  if (!d) return {};
  OpAttrs c;
  c.dtype = *d;
  return E.op(OpKind::Cast, mlir::ValueRange{x}, c);
}

// var = Σ (x - mean)² / max(n - correction, 0) (inf, or nan for a constant row, when
// n <= correction, as PyTorch); std = sqrt(var).
// Computed in float64 and rounded once at the end, like eager's double accumulation: a
// float32 (x - mean)² overflows for |x - mean| > 1.8e19, so std of [3e38, -3e38] was inf.
mlir::Value variance(Emitter& E, mlir::Value x, const OpAttrs& a, bool is_std, mlir::Type result) {
  x = cast_to(E, x, E.b.getF64Type());
  mlir::Value d = E.op(OpKind::Sub, x, E.reduce(OpKind::Mean, x, a, true));
  mlir::Value s = E.reduce(OpKind::Sum, E.op(OpKind::Mul, d, d), a, a.keepdim);
  mlir::Type t = elem(s);
  auto xt = type_of(x);
  uint32_t mask = reduction_mask(a, static_cast<int>(xt.getRank()), "var", Loc::current());
  bool dynamic = false;
  int64_t n = 1;
  for (int64_t i = 0; i < xt.getRank(); ++i) {
    if (!(mask >> i & 1)) continue;
    if (xt.isDynamicDim(i))
      dynamic = true;
    else
      n *= xt.getDimSize(i);
  }
  mlir::Value v;
  if (!dynamic) {
    double denom = static_cast<double>(n) - static_cast<double>(a.mode);
    v = E.op(OpKind::Div, s, E.scalar(t, std::max(denom, 0.0)));
  } else {
    // n is known at run time only: count the elements (x == x || x != x holds for NaN too).
    mlir::Type i64 = E.b.getI64Type();
    mlir::Value all = E.op(OpKind::LogicalOr, E.op(OpKind::Eq, x, x), E.op(OpKind::Ne, x, x));
    mlir::Value denom =
        E.op(OpKind::Sub, E.reduce(OpKind::Sum, all, a, a.keepdim), E.scalar(i64, a.mode));
    v = E.op(OpKind::Div, s, E.op(OpKind::Maximum, denom, E.scalar(i64, 0)));
  }
  return cast_to(E, is_std ? E.op(OpKind::Sqrt, v) : v, result);
}

// logsumexp = m + log Σ exp(x - m), m = amax with ±inf replaced by 0 (eager, PyTorch), so a
// slice of -inf gives -inf rather than nan.
mlir::Value logsumexp(Emitter& E, mlir::Value x, const OpAttrs& a) {
  mlir::Type t = elem(x);
  auto finite_max = [&](bool keepdim) {
    mlir::Value m = E.reduce(OpKind::Amax, x, a, keepdim);
    mlir::Value inf = E.op(OpKind::Eq, E.op(OpKind::Abs, m), E.scalar(t, INFINITY));
    return E.where(inf, E.scalar(t, 0), m);
  };
  mlir::Value m = finite_max(true);
  mlir::Value s = sum_of_exps(E, E.op(OpKind::Exp, E.op(OpKind::Sub, x, m)), a, a.keepdim);
  // Without keepdim the max is reduced again rather than squeezed (views do not lower yet).
  return E.op(OpKind::Add, E.op(OpKind::Log, s), a.keepdim ? m : finite_max(false));
}

// layer_norm = (x - mean) * rsqrt(var_biased + eps) [* weight] [+ bias] over the trailing
// normalized_shape dims. mean and var in float64 (float32 (x - mean)² overflows where the
// result is O(1): [8.5e37, -2.8e19, 8.5e37, -2.8e19] gave 0, the answer is ±1); the
// normalisation itself stays in x's type. Rows with var > kLayerNormScaledVar are normalised as
// (x·s - mean·s)·(rstd/s), s = 1/16, so x - mean cannot overflow nor rstd be subnormal: the
// constants and formula of eager's kernel (backends/cpu/normalization.cpp), whose s = 1 rows
// compute exactly (x - mean)·rstd.
constexpr double kLayerNormScaledVar = 0x1p190;
constexpr double kLayerNormScale = 0x1p-4;

mlir::Value layer_norm(Emitter& E, mlir::ValueRange in, const OpAttrs& a) {
  mlir::Value x = in[0];
  mlir::Type t = elem(x), f64 = E.b.getF64Type();
  int64_t rank = type_of(x).getRank();
  OpAttrs r;
  for (int64_t i = rank - a.dims.size(); i < rank; ++i) r.dims.push_back(i);
  mlir::Value x64 = cast_to(E, x, f64);
  mlir::Value mean = E.reduce(OpKind::Mean, x64, r, true);
  mlir::Value d = E.op(OpKind::Sub, x64, mean);
  mlir::Value var = E.reduce(OpKind::Mean, E.op(OpKind::Mul, d, d), r, true);
  mlir::Value rstd = E.op(OpKind::Rsqrt, E.op(OpKind::Add, var, E.scalar(f64, a.eps)));
  mlir::Value s64 = E.where(E.op(OpKind::Gt, var, E.scalar(f64, kLayerNormScaledVar)),
                            E.scalar(f64, kLayerNormScale), E.scalar(f64, 1.0));
  mlir::Value s = cast_to(E, s64, t);
  mlir::Value mean_t = cast_to(E, mean, t);
  mlir::Value d_t = E.op(OpKind::Sub, E.op(OpKind::Mul, x, s), E.op(OpKind::Mul, mean_t, s));
  if (t != f64) {
    // x - mean as (x - mean_t) - mean_lo, mean_lo = mean - mean_t: eager's row_moments
    // (normalization.cpp) explains why; rows on a large offset with a small spread.
    mlir::Value lo = E.op(OpKind::Sub, mean, cast_to(E, mean_t, f64));
    d_t = E.op(OpKind::Sub, d_t, cast_to(E, E.op(OpKind::Mul, lo, s64), t));
  }
  mlir::Value rs = cast_to(E, E.op(OpKind::Div, rstd, s64), t);
  mlir::Value y = E.op(OpKind::Mul, d_t, rs);
  if (in.size() > 1) y = E.op(OpKind::Mul, y, in[1]);
  if (in.size() > 2) y = E.op(OpKind::Add, y, in[2]);
  return y;
}

// nll_loss: the target's log-prob is read with gather (x[n, t[n]]; the lowering clamps the
// index into [0, C), codegen/lower_index.cpp). Ignored targets give 0; mean divides by the
// number of the others (0/0 = nan, as eager). Out-of-range targets, which eager rejects, read a
// clamped class here: the tracer scans the targets after the compiled run and raises eager's
// error (tracer/plan.cpp, data_checked_inputs), eager CUDA ops before the kernel. It was a
// one-hot select against a [C, 1] constant of class ids: C reads per row, and for C > 64 a
// constant that CUDA kernels cannot read (cross_entropy on the GPU took the host path).
mlir::Value nll_loss(Emitter& E, mlir::Value x, mlir::Value target, const OpAttrs& a) {
  auto xt = type_of(x);
  const bool batched = xt.getRank() == 2;
  const int64_t class_dim = batched ? 1 : 0;
  if (xt.isDynamicDim(class_dim) || xt.getDimSize(class_dim) == 0) return {};
  mlir::Type t = xt.getElementType();
  OpAttrs at_class;
  at_class.dim = class_dim;
  mlir::Value index = E.op(OpKind::Unsqueeze, mlir::ValueRange{target}, at_class);
  mlir::Value gathered = E.op(OpKind::Gather, mlir::ValueRange{x, index}, at_class);
  mlir::Value picked = E.op(OpKind::Squeeze, mlir::ValueRange{gathered}, at_class);
  mlir::Value zero = E.scalar(t, 0);
  // ignore_index in the target's dtype: a 0-d operand does not promote, and lowering never
  // narrows. Compared in int64, as eager does: an int32 target compared with 2^32 + 1 narrowed
  // to 1 ignored every target 1 (break-it pass).
  mlir::Value wide = cast_to(E, target, E.b.getI64Type());
  mlir::Value ignore = splat_integer(E.b, E.loc, mlir::RankedTensorType::get({}, E.b.getI64Type()),
                                     a.ignore_index);  // exact: INT64_MAX as a sentinel too
  mlir::Value valid = E.op(OpKind::Ne, wide, ignore);
  mlir::Value loss = E.where(valid, E.op(OpKind::Neg, picked), zero);
  if (a.mode == 0) return loss;
  mlir::Value total = E.reduce(OpKind::Sum, loss, over_all(), false);
  if (a.mode == 2) return total;
  return E.op(OpKind::Div, total, E.reduce(OpKind::Sum, valid, over_all(), false));
}

// mse_loss = (a - b)², then mean / sum over everything (float inputs only). The mean is taken
// in float64 (as eager's double sum): float32 squares overflow past 1.8e19 where the mean of
// [2e19², 0] = 2e38 is representable. A sum that overflows is inf either way.
mlir::Value mse_loss(Emitter& E, mlir::Value x, mlir::Value y, const OpAttrs& a,
                     mlir::Type result) {
  if (!is_float(x) || !is_float(y)) return {};
  if (a.mode == 1) {
    x = cast_to(E, x, E.b.getF64Type());
    y = cast_to(E, y, E.b.getF64Type());
  }
  mlir::Value d = E.op(OpKind::Sub, x, y);
  mlir::Value sq = E.op(OpKind::Mul, d, d);
  if (a.mode == 0) return sq;
  if (a.mode == 2) return E.reduce(OpKind::Sum, sq, over_all(), false);
  return cast_to(E, E.reduce(OpKind::Mean, sq, over_all(), false), result);
}

/// The decomposition of `kind`, or a null value for ops that stay as they are.
mlir::Value decompose(Emitter& E, OpKind kind, mlir::ValueRange in, const OpAttrs& a,
                      mlir::Type result) {
  switch (kind) {
    case OpKind::Softmax:
    case OpKind::LogSoftmax:
      return softmax(E, in[0], a.dim, kind == OpKind::LogSoftmax, result);
    case OpKind::LayerNorm:
      return layer_norm(E, in, a);
    case OpKind::Var:
    case OpKind::Std:
      return variance(E, in[0], a, kind == OpKind::Std, result);
    case OpKind::LogSumExp:
      return is_float(in[0]) ? logsumexp(E, in[0], a) : mlir::Value();
    case OpKind::NllLoss:
      return nll_loss(E, in[0], in[1], a);
    case OpKind::MseLoss:
      return mse_loss(E, in[0], in[1], a, result);
    default:
      return {};
  }
}

/// transpose(a @ b) over the last two dims -> transpose(b) @ transpose(a), for a plain matmul
/// whose operands have the result's rank (a 2-D operand broadcast over a batch is left alone)
/// and whose only use is the transpose (through views that keep its type). The product of the
/// transposes is the same matrix; what changes is that lowering folds each operand transpose
/// into the GEMM's flags, or (with kiln.view's folder) it cancels against a transpose already
/// there. Autograd's weight gradient (xᵀ @ g)ᵀ then becomes one GEMM gᵀ @ x written in place,
/// instead of a GEMM into a temporary and a transposing copy (a gather loop: 20 % of the
/// digits MLP's compiled step).
struct TransposedProduct : mlir::OpRewritePattern<ViewOp> {
  using OpRewritePattern::OpRewritePattern;

  mlir::LogicalResult matchAndRewrite(ViewOp view, mlir::PatternRewriter& rw) const override {
    if (view.getKind() != "transpose") return mlir::failure();
    auto out = type_of(view.getResult());
    const int64_t r = out.getRank();
    if (r < 2 || swapped_dims(view) != std::pair<int64_t, int64_t>{r - 2, r - 1})
      return mlir::failure();
    mlir::Value src = view.getInput();
    while (auto v = src.getDefiningOp<ViewOp>()) {
      if (v.getKind() != "view" || v.getInput().getType() != v.getResult().getType() ||
          !v->hasOneUse())
        break;
      src = v.getInput();
    }
    auto mm = src.getDefiningOp<MatmulOp>();
    if (!mm || mm.getKind() != "matmul" || mm.getInputs().size() != 2 || !mm->hasOneUse() ||
        mm.getAlpha() || mm.getBeta())
      return mlir::failure();
    mlir::Value a = mm.getInputs()[0], b = mm.getInputs()[1];
    auto ta = type_of(a), tb = type_of(b);
    if (ta.getRank() != r || tb.getRank() != r || ta.getElementType() != tb.getElementType())
      return mlir::failure();
    // Batch dims broadcast the same way in either order, so equal ranks are all it takes.
    OpAttrs swap;
    swap.dim = r - 2;
    swap.dim1 = r - 1;
    mlir::Location loc = view.getLoc();
    mlir::Value bt = create_op(rw, loc, OpKind::Transpose, mlir::ValueRange{b}, swap);
    mlir::Value at = create_op(rw, loc, OpKind::Transpose, mlir::ValueRange{a}, swap);
    mlir::Value product = create_op(rw, loc, OpKind::Matmul, mlir::ValueRange{bt, at}, OpAttrs{});
    // (types follow from the checks above: [.., N, K] @ [.., K, M] -> [.., N, M])
    if (product.getType() != out) {  // not expected: undo and keep the graph as it was
      rw.eraseOp(product.getDefiningOp());
      rw.eraseOp(at.getDefiningOp());
      rw.eraseOp(bt.getDefiningOp());
      return mlir::failure();
    }
    rw.replaceOp(view, product);
    return mlir::success();
  }
};

/// cat(a₁, …, aₙ) + cat(b₁, …, bₘ) -> cat(s₁, …, sₖ), s_j = (piece j of the first) +
/// (piece j of the second), the pieces cut at every part boundary of either cat (static
/// boundaries, the same dim, no broadcasting). Autograd sums the gradients of a tensor's slices, each padded
/// to the whole tensor with zeros by a cat: attention's q, k and v weights are slices of one
/// [3E, E] in-projection weight. The sum then computes each slice of the gradient once,
/// written in place into the joined result, instead of adding whole-size temporaries; the
/// zeros stay as constants added in the loops, so the values are eager's.
struct SumOfCats : mlir::OpRewritePattern<ElementwiseOp> {
  using OpRewritePattern::OpRewritePattern;
  static constexpr size_t kMaxPieces = 16;  // each piece is a loop nest

  mlir::LogicalResult matchAndRewrite(ElementwiseOp add, mlir::PatternRewriter& rw) const override {
    if (add.getKind() != "add" || add.getInputs().size() != 2) return mlir::failure();
    auto ca = add.getInputs()[0].getDefiningOp<ShapeOp>();
    auto cb = add.getInputs()[1].getDefiningOp<ShapeOp>();
    if (!ca || !cb || ca.getKind() != "cat" || cb.getKind() != "cat") return mlir::failure();
    auto out = type_of(add.getResult());
    if (type_of(ca.getResult()) != out || type_of(cb.getResult()) != out) return mlir::failure();
    const int64_t r = out.getRank();
    auto dim_of = [&](ShapeOp c) {
      const auto d = static_cast<int64_t>(c.getDim().value_or(0));
      return d < 0 ? d + r : d;
    };
    const int64_t d = dim_of(ca);
    if (dim_of(cb) != d || d < 0 || d >= r || out.isDynamicDim(d)) return mlir::failure();
    // Offsets of each part along d, then the end.
    auto bounds = [&](ShapeOp c, llvm::SmallVector<int64_t>& b) {
      b.assign(1, 0);
      for (mlir::Value v : c.getInputs()) {
        if (type_of(v).isDynamicDim(d)) return false;
        b.push_back(b.back() + type_of(v).getDimSize(d));
      }
      return true;
    };
    llvm::SmallVector<int64_t> ba, bb;
    if (!bounds(ca, ba) || !bounds(cb, bb)) return mlir::failure();
    std::vector<int64_t> cuts(ba.begin(), ba.end());
    cuts.insert(cuts.end(), bb.begin(), bb.end());
    std::sort(cuts.begin(), cuts.end());
    cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
    if (cuts.size() - 1 > kMaxPieces) return mlir::failure();
    mlir::Location loc = add.getLoc();
    // Rows [lo, hi) along d of cat c: its part there, sliced if the part is larger; a
    // broadcast constant (autograd's zeros) is broadcast to the piece's shape instead.
    auto piece = [&](ShapeOp c, const llvm::SmallVector<int64_t>& b, int64_t lo,
                     int64_t hi) -> mlir::Value {
      size_t k = static_cast<size_t>(std::upper_bound(b.begin(), b.end(), lo) - b.begin()) - 1;
      mlir::Value part = c.getInputs()[k];
      if (lo == b[k] && hi == b[k + 1]) return part;
      auto shape = type_of(part).getShape();
      auto expand = part.getDefiningOp<ViewOp>();
      if (expand && expand.getKind() == "expand" && type_of(part).hasStaticShape() &&
          expand.getInput().getDefiningOp<ConstantOp>() &&
          type_of(expand.getInput()).getRank() == 0) {
        OpAttrs e;
        e.dims = Dims(std::vector<int64_t>(shape.begin(), shape.end()));
        e.dims[static_cast<int>(d)] = hi - lo;
        return create_op(rw, loc, OpKind::Expand, mlir::ValueRange{expand.getInput()}, e);
      }
      OpAttrs sl;
      sl.dim = d;
      sl.start = lo - b[k];
      sl.end = hi - b[k];
      sl.step = 1;
      return create_op(rw, loc, OpKind::Slice, mlir::ValueRange{part}, sl);
    };
    const OpAttrs add_attrs = attrs_from_op(OpKind::Add, add);
    llvm::SmallVector<mlir::Value> sums;
    for (size_t j = 0; j + 1 < cuts.size(); ++j) {
      if (cuts[j] == cuts[j + 1]) continue;
      mlir::Value x = piece(ca, ba, cuts[j], cuts[j + 1]), y = piece(cb, bb, cuts[j], cuts[j + 1]);
      sums.push_back(create_op(rw, loc, OpKind::Add, mlir::ValueRange{x, y}, add_attrs));
    }
    OpAttrs cat;
    cat.dim = d;
    rw.replaceOp(add, create_op(rw, loc, OpKind::Cat, sums, cat));
    return mlir::success();
  }
};

struct DecomposePass : mlir::PassWrapper<DecomposePass, mlir::OperationPass<mlir::ModuleOp>> {
  MLIR_DEFINE_EXPLICIT_INTERNAL_INLINE_TYPE_ID(DecomposePass)
  llvm::StringRef getArgument() const override { return "kiln-decompose"; }
  llvm::StringRef getDescription() const override {
    return "Rewrite composite kiln ops (softmax, log_softmax, layer_norm, var, std, logsumexp, "
           "nll_loss, mse_loss) into primitive kiln ops, turn transposed matmul results into "
           "matmuls of transposes, and sums of cats into cats of sums";
  }
  void runOnOperation() override {
    llvm::SmallVector<mlir::Operation*> ops;
    getOperation().walk([&](mlir::Operation* op) {
      if (llvm::isa<CompositeOp, ReduceOp>(op)) ops.push_back(op);
    });
    for (mlir::Operation* op : ops) {
      auto kind = op_kind_from_name(op->getAttrOfType<mlir::StringAttr>("kind").getValue());
      if (!kind) continue;
      mlir::OpBuilder b(op);
      Emitter E{b, op->getLoc()};
      mlir::Operation* before = op->getPrevNode();
      mlir::Value r;
      try {
        r = decompose(E, *kind, op->getOperands(), attrs_from_op(*kind, op),
                      llvm::cast<mlir::RankedTensorType>(op->getResult(0).getType()).getElementType());
      } catch (const Error&) {
        r = {};  // a case the primitives do not cover: keep the composite
      }
      if (r && r.getType() == op->getResult(0).getType()) {
        op->getResult(0).replaceAllUsesWith(r);
        op->erase();
        continue;
      }
      // Drop what a failed decomposition built (users come after their operands).
      while (op->getPrevNode() != before) op->getPrevNode()->erase();
    }
    // Then products whose result is transposed, with the kiln folders (x * 1, double
    // transposes) that expose them and clean up after them, and sums of cats.
    mlir::RewritePatternSet patterns(&getContext());
    patterns.add<TransposedProduct, SumOfCats>(&getContext());
    // Not converging within the driver's iteration limit leaves a valid graph: no failure.
    // Constants stay where they are (no hoisting or merging: the graph keeps its order).
    mlir::GreedyRewriteConfig config;
    config.enableConstantCSE(false);
    (void)mlir::applyPatternsGreedily(getOperation(), std::move(patterns), config);
  }
};

}  // namespace

std::unique_ptr<mlir::Pass> create_decompose_pass() { return std::make_unique<DecomposePass>(); }

void register_decompose_pass() { mlir::PassRegistration<DecomposePass>(); }

}  // namespace kiln::dialect
