// kiln dialect -> linalg on tensors: kiln.elementwise and kiln.reduce.
//
// Broadcasting becomes the operands' indexing maps (a static size-1 dim against a larger result
// dim reads index 0; a `?` dim is assumed not to broadcast, as in TorchInductor), dtype promotion
// becomes arith casts in the body, and the body of floating ops is the formula of
// core/formulas.h instantiated with IrFloat, a scalar algebra over MLIR values.
#include <cstring>
#include <cmath>

#include "codegen/codegen.h"
#include "codegen/lower.h"
#include "core/error.h"
#include "core/meta.h"
#include "ir/graph_internal.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Transforms/Passes.h"
#include "core/formulas.h"
#include "ir/dialect.h"
#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Linalg/IR/Linalg.h"
#include "mlir/Dialect/Linalg/Passes.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "mlir/IR/AffineMap.h"
#include "mlir/IR/DialectRegistry.h"
#include "mlir/Transforms/GreedyPatternRewriteDriver.h"

namespace kiln::codegen {
namespace {

// ---------------------------------------------------------------------------------------------
// IrFloat: the scalar algebra of core/formulas.h over MLIR values of one float type. Constants
// (S(0.5)) need a builder, so the builder, location and type of the body being built are
// thread-local state, set by IrScope.

struct IrContext {
  mlir::OpBuilder* b = nullptr;
  mlir::Location loc = mlir::UnknownLoc();
  mlir::FloatType type;
};
thread_local IrContext* g_ir = nullptr;

struct IrScope {
  IrContext ctx;
  IrContext* saved;
  IrScope(mlir::OpBuilder& b, mlir::Location loc, mlir::FloatType t) : ctx{&b, loc, t}, saved(g_ir) {
    g_ir = &ctx;
  }
  ~IrScope() { g_ir = saved; }
};

struct IrFloat {
  mlir::Value v;
  IrFloat(mlir::Value value) : v(value) {}
  IrFloat(double c)
      : v(mlir::arith::ConstantOp::create(*g_ir->b, g_ir->loc, g_ir->type,
                                          mlir::FloatAttr::get(g_ir->type, c))) {}
};

/// A comparison result (i1), the mask type of the algebra.
struct IrMask {
  mlir::Value v;
};

template <class Op> IrFloat binary(IrFloat a, IrFloat b) {
  return IrFloat(Op::create(*g_ir->b, g_ir->loc, a.v, b.v).getResult());
}
template <class Op> IrFloat unary(IrFloat a) {
  return IrFloat(Op::create(*g_ir->b, g_ir->loc, a.v).getResult());
}
IrMask cmp(mlir::arith::CmpFPredicate p, IrFloat a, IrFloat b) {
  return {mlir::arith::CmpFOp::create(*g_ir->b, g_ir->loc, p, a.v, b.v).getResult()};
}
IrFloat operator+(IrFloat a, IrFloat b) { return binary<mlir::arith::AddFOp>(a, b); }
IrFloat operator-(IrFloat a, IrFloat b) { return binary<mlir::arith::SubFOp>(a, b); }
IrFloat operator*(IrFloat a, IrFloat b) { return binary<mlir::arith::MulFOp>(a, b); }
IrFloat operator/(IrFloat a, IrFloat b) { return binary<mlir::arith::DivFOp>(a, b); }
IrFloat operator-(IrFloat a) { return unary<mlir::arith::NegFOp>(a); }
// C++ semantics: every comparison with NaN is false except !=.
using P = mlir::arith::CmpFPredicate;
IrMask operator<(IrFloat a, IrFloat b) { return cmp(P::OLT, a, b); }
[[maybe_unused]] IrMask operator<=(IrFloat a, IrFloat b) { return cmp(P::OLE, a, b); }
IrMask operator>(IrFloat a, IrFloat b) { return cmp(P::OGT, a, b); }
[[maybe_unused]] IrMask operator>=(IrFloat a, IrFloat b) { return cmp(P::OGE, a, b); }
IrMask operator==(IrFloat a, IrFloat b) { return cmp(P::OEQ, a, b); }
IrMask operator!=(IrFloat a, IrFloat b) { return cmp(P::UNE, a, b); }
IrMask operator&&(IrMask a, IrMask b) {
  return {mlir::arith::AndIOp::create(*g_ir->b, g_ir->loc, a.v, b.v).getResult()};
}
IrMask operator||(IrMask a, IrMask b) {
  return {mlir::arith::OrIOp::create(*g_ir->b, g_ir->loc, a.v, b.v).getResult()};
}
IrMask operator!=(IrMask a, IrMask b) {
  return {mlir::arith::XOrIOp::create(*g_ir->b, g_ir->loc, a.v, b.v).getResult()};
}
IrFloat select(IrMask m, IrFloat a, IrFloat b) {
  return IrFloat(mlir::arith::SelectOp::create(*g_ir->b, g_ir->loc, m.v, a.v, b.v).getResult());
}
IrMask isnan(IrFloat a) { return cmp(P::UNO, a, a); }
// Math functions, found by argument-dependent lookup from the formulas.
IrFloat abs(IrFloat a) { return unary<mlir::math::AbsFOp>(a); }
IrFloat exp(IrFloat a);  // below: float32 has its own expansion
IrFloat fma(IrFloat a, IrFloat b, IrFloat c) {
  return IrFloat(mlir::math::FmaOp::create(*g_ir->b, g_ir->loc, a.v, b.v, c.v).getResult());
}
IrFloat bits_to_float(int32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return IrFloat(static_cast<double>(f));
}
IrFloat exp2(IrFloat a) { return unary<mlir::math::Exp2Op>(a); }
IrFloat expm1(IrFloat a) { return unary<mlir::math::ExpM1Op>(a); }
IrFloat log(IrFloat a) { return unary<mlir::math::LogOp>(a); }
IrFloat log2(IrFloat a) { return unary<mlir::math::Log2Op>(a); }
IrFloat log1p(IrFloat a) { return unary<mlir::math::Log1pOp>(a); }
IrFloat sqrt(IrFloat a) { return unary<mlir::math::SqrtOp>(a); }
IrFloat sin(IrFloat a) { return unary<mlir::math::SinOp>(a); }
IrFloat cos(IrFloat a) { return unary<mlir::math::CosOp>(a); }
IrFloat tan(IrFloat a) { return unary<mlir::math::TanOp>(a); }
IrFloat tanh(IrFloat a) { return unary<mlir::math::TanhOp>(a); }
IrFloat erf(IrFloat a) { return unary<mlir::math::ErfOp>(a); }
IrFloat erfc(IrFloat a) { return unary<mlir::math::ErfcOp>(a); }
IrFloat floor(IrFloat a) { return unary<mlir::math::FloorOp>(a); }
IrFloat ceil(IrFloat a) { return unary<mlir::math::CeilOp>(a); }
IrFloat trunc(IrFloat a) { return unary<mlir::math::TruncOp>(a); }
IrFloat nearbyint(IrFloat a) { return unary<mlir::math::RoundEvenOp>(a); }  // half to even
IrFloat fmod(IrFloat a, IrFloat b) { return binary<mlir::arith::RemFOp>(a, b); }
IrFloat copysign(IrFloat a, IrFloat b) { return binary<mlir::math::CopySignOp>(a, b); }
IrFloat pow(IrFloat a, IrFloat b) { return binary<mlir::math::PowFOp>(a, b); }
IrFloat atan2(IrFloat a, IrFloat b) { return binary<mlir::math::Atan2Op>(a, b); }

/// exp: float32 uses the algorithm of eager's kernels (xsimd's Cephes-style expf: k =
/// round(x / ln 2), Cody-Waite reduction, degree-5 polynomial, 2^k by exponent bits, 0 below
/// minlog and inf above maxlog), so compiled and eager give the same values; it is also about
/// half the instructions of MLIR's generic approximation. float64 keeps math.exp.
IrFloat exp(IrFloat a) {
  if (!g_ir->type.isF32()) return unary<mlir::math::ExpOp>(a);
  mlir::OpBuilder& b = *g_ir->b;
  mlir::Location loc = g_ir->loc;
  IrFloat k = nearbyint(a * bits_to_float(0x3fb8aa3b));            // 1 / ln 2
  IrFloat x = fma(-k, bits_to_float(0x3f318000), a);                // ln 2, high part
  x = fma(-k, bits_to_float(static_cast<int32_t>(0xb95e8083)), x);  // ln 2, low part
  IrFloat y = bits_to_float(0x3ab778cf);                            // Horner, highest first
  for (int32_t c : {0x3c098d8b, 0x3d2aa957, 0x3e2aa9a5, 0x3f000000}) y = fma(y, x, bits_to_float(c));
  IrFloat r = fma(y, x * x, x) + IrFloat(1.0);
  // r * 2^k: k + 127 in the exponent bits (k is within [-128, 128] where the result is kept).
  mlir::Type i32 = b.getI32Type();
  mlir::Value ki = mlir::arith::FPToSIOp::create(b, loc, i32, k.v);
  mlir::Value biased = mlir::arith::AddIOp::create(
      b, loc, ki, mlir::arith::ConstantOp::create(b, loc, i32, b.getI32IntegerAttr(127)));
  mlir::Value shifted = mlir::arith::ShLIOp::create(
      b, loc, biased, mlir::arith::ConstantOp::create(b, loc, i32, b.getI32IntegerAttr(23)));
  IrFloat scale(mlir::arith::BitcastOp::create(b, loc, g_ir->type, shifted).getResult());
  IrFloat result = select(a <= IrFloat(-88.3762626647949f), IrFloat(0.0), r * scale);
  return select(a >= IrFloat(88.3762626647949f), IrFloat(INFINITY), result);
}

// ---------------------------------------------------------------------------------------------

/// Converts scalar `v` to element type `to` (PyTorch semantics: bool -> 0/1).
mlir::Value convert(mlir::OpBuilder& b, mlir::Location loc, mlir::Value v, mlir::Type to) {
  mlir::Type from = v.getType();
  if (from == to) return v;
  bool from_bool = from.isInteger(1);
  if (llvm::isa<mlir::FloatType>(to)) {
    if (llvm::isa<mlir::FloatType>(from)) {
      if (from.getIntOrFloatBitWidth() < to.getIntOrFloatBitWidth())
        return mlir::arith::ExtFOp::create(b, loc, to, v);
      return mlir::arith::TruncFOp::create(b, loc, to, v);
    }
    if (from_bool) return mlir::arith::UIToFPOp::create(b, loc, to, v);
    return mlir::arith::SIToFPOp::create(b, loc, to, v);
  }
  // integer result from integer / bool input (the covered ops never narrow)
  if (from_bool) return mlir::arith::ExtUIOp::create(b, loc, to, v);
  return mlir::arith::ExtSIOp::create(b, loc, to, v);
}

/// An attribute scalar (alpha) as a constant of type `t`.
mlir::Value scalar_constant(mlir::OpBuilder& b, mlir::Location loc, mlir::Attribute a,
                            mlir::Type t) {
  double d = 1;
  if (auto f = llvm::dyn_cast_or_null<mlir::FloatAttr>(a)) d = f.getValueAsDouble();
  if (auto i = llvm::dyn_cast_or_null<mlir::IntegerAttr>(a))
    d = i.getType().isInteger(1) ? double(i.getValue().getBoolValue()) : double(i.getInt());
  if (auto ft = llvm::dyn_cast<mlir::FloatType>(t))
    return mlir::arith::ConstantOp::create(b, loc, t, mlir::FloatAttr::get(ft, d));
  return mlir::arith::ConstantOp::create(b, loc, t,
                                         mlir::IntegerAttr::get(t, static_cast<int64_t>(d)));
}

// Elementwise kinds lowered for floating compute types, as (OpKind, formula) pairs. Their result
// dtype is their compute dtype (comparisons, logical ops and where are not here yet).
#define KILN_FLOAT_UNARY(X)                                                                   \
  X(Neg) X(Abs) X(Sign) X(Exp) X(Exp2) X(Log) X(Log2) X(Log1p) X(Expm1) X(Sqrt) X(Rsqrt)      \
  X(Reciprocal) X(Sin) X(Cos) X(Tan) X(Tanh) X(Sigmoid) X(Relu) X(Silu) X(Erf) X(Floor)     \
  X(Ceil) X(Round) X(Trunc)
#define KILN_FLOAT_BINARY(X) \
  X(Mul) X(Div) X(FloorDivide) X(Remainder) X(Pow) X(Maximum) X(Minimum) X(Atan2)
// Bool-result ops (any compute type; the result is the formula's mask).
#define KILN_MASK_BINARY(X) \
  X(Eq) X(Ne) X(Lt) X(Le) X(Gt) X(Ge) X(LogicalAnd) X(LogicalOr) X(LogicalXor)

DType result_type_of(std::span<const TensorMeta> metas) { return kiln::result_type(metas); }

bool covered(OpKind k) {
  switch (k) {
#define X(K) case OpKind::K:
    KILN_FLOAT_UNARY(X)
    KILN_FLOAT_BINARY(X)
    KILN_MASK_BINARY(X)
#undef X
    case OpKind::LogicalNot:
    case OpKind::Where:
    case OpKind::Add:
    case OpKind::Sub:
    case OpKind::Gelu:
    case OpKind::Clamp: return true;
    default: return false;
  }
}

/// The body: `args` already converted to the compute type `t`.
mlir::Value emit_formula(mlir::OpBuilder& b, mlir::Location loc, OpKind k,
                         llvm::ArrayRef<mlir::Value> args, mlir::Value alpha, mlir::Value beta,
                         int64_t mode, mlir::Type t) {
  namespace f = kiln::formulas;
  if (k == OpKind::Where) {  // args[0] is the i1 condition (not converted)
    if (auto ft = llvm::dyn_cast<mlir::FloatType>(t)) {
      IrScope scope(b, loc, ft);
      return f::Where::eval(IrMask{args[0]}, IrFloat(args[1]), IrFloat(args[2])).v;
    }
    return mlir::arith::SelectOp::create(b, loc, args[0], args[1], args[2]);
  }
  if (auto ft = llvm::dyn_cast<mlir::FloatType>(t)) {
    IrScope scope(b, loc, ft);
    auto a = [&](int i) { return IrFloat(args[i]); };
    switch (k) {
#define X(K) \
  case OpKind::K: return f::K::eval(a(0)).v;
      KILN_FLOAT_UNARY(X)
#undef X
#define X(K) \
  case OpKind::K: return f::K::eval(a(0), a(1)).v;
      KILN_FLOAT_BINARY(X)
      KILN_MASK_BINARY(X)
#undef X
      case OpKind::LogicalNot: return f::LogicalNot::eval(a(0)).v;
      case OpKind::Add: return (alpha ? f::Add::eval(a(0), a(1), IrFloat(alpha)) : f::Add::eval(a(0), a(1))).v;
      case OpKind::Sub: return (alpha ? f::Sub::eval(a(0), a(1), IrFloat(alpha)) : f::Sub::eval(a(0), a(1))).v;
      case OpKind::Gelu:
        return (mode == 1 ? f::GeluTanh::eval(a(0)) : f::GeluErf::eval(a(0))).v;
      case OpKind::Clamp: {
        // formulas::Clamp = minimum(maximum(x, low), high); a missing bound skips its half.
        if (alpha && beta) return f::Clamp::eval(a(0), IrFloat(alpha), IrFloat(beta)).v;
        if (alpha) return f::Maximum::eval(a(0), IrFloat(alpha)).v;
        if (beta) return f::Minimum::eval(a(0), IrFloat(beta)).v;
        return {};
      }
      default: return {};
    }
  }
  // Integers: arith's addi/subi/muli wrap in two's complement, as formulas' wrapping_* do.
  using namespace mlir::arith;
  bool is_bool = t.isInteger(1);  // false < true: unsigned predicates
  auto cmpi = [&](CmpIPredicate sp, CmpIPredicate up, mlir::Value x, mlir::Value y) -> mlir::Value {
    return CmpIOp::create(b, loc, is_bool ? up : sp, x, y);
  };
  auto nonzero = [&](mlir::Value x) -> mlir::Value {
    mlir::Value zero = ConstantOp::create(b, loc, t, mlir::IntegerAttr::get(t, 0));
    return CmpIOp::create(b, loc, CmpIPredicate::ne, x, zero);
  };
  using CP = CmpIPredicate;
  switch (k) {
    case OpKind::Eq: return cmpi(CP::eq, CP::eq, args[0], args[1]);
    case OpKind::Ne: return cmpi(CP::ne, CP::ne, args[0], args[1]);
    case OpKind::Lt: return cmpi(CP::slt, CP::ult, args[0], args[1]);
    case OpKind::Le: return cmpi(CP::sle, CP::ule, args[0], args[1]);
    case OpKind::Gt: return cmpi(CP::sgt, CP::ugt, args[0], args[1]);
    case OpKind::Ge: return cmpi(CP::sge, CP::uge, args[0], args[1]);
    case OpKind::LogicalAnd: return AndIOp::create(b, loc, nonzero(args[0]), nonzero(args[1]));
    case OpKind::LogicalOr: return OrIOp::create(b, loc, nonzero(args[0]), nonzero(args[1]));
    case OpKind::LogicalXor: return XOrIOp::create(b, loc, nonzero(args[0]), nonzero(args[1]));
    case OpKind::LogicalNot: {
      mlir::Value zero = ConstantOp::create(b, loc, t, mlir::IntegerAttr::get(t, 0));
      return CmpIOp::create(b, loc, CmpIPredicate::eq, args[0], zero);
    }
    default: break;
  }
  if (is_bool) return {};  // bool arithmetic (add = or, ...) is not lowered yet
  switch (k) {
    case OpKind::Add:
    case OpKind::Sub: {
      mlir::Value rhs = alpha ? MulIOp::create(b, loc, alpha, args[1]).getResult() : args[1];
      if (k == OpKind::Add) return AddIOp::create(b, loc, args[0], rhs);
      return SubIOp::create(b, loc, args[0], rhs);
    }
    case OpKind::Mul: return MulIOp::create(b, loc, args[0], args[1]);
    case OpKind::Neg: {
      mlir::Value zero = ConstantOp::create(b, loc, t, mlir::IntegerAttr::get(t, 0));
      return SubIOp::create(b, loc, zero, args[0]);
    }
    default: return {};
  }
}

struct LowerElementwise : mlir::OpRewritePattern<kiln::dialect::ElementwiseOp> {
  using OpRewritePattern::OpRewritePattern;

  mlir::LogicalResult matchAndRewrite(kiln::dialect::ElementwiseOp op,
                                      mlir::PatternRewriter& rw) const override {
    auto kind = kiln::dialect::op_kind_from_name(op.getKind());
    if (!kind || !covered(*kind)) return rw.notifyMatchFailure(op, "kind not lowered yet");
    auto result_type = llvm::cast<mlir::RankedTensorType>(op.getResult().getType());
    mlir::Type t = result_type.getElementType();
    // Compute type: the result's, except for bool-result ops, which compute in the promoted
    // type of their inputs (core's result_type, as infer_meta does).
    bool to_bool = op_info(*kind).dtype_rule == DTypeRule::ToBool;
    if (t.isInteger(1) && !to_bool && *kind != OpKind::Where) return rw.notifyMatchFailure(op, "bool arithmetic not lowered yet");
    mlir::Type ct = t;
    if (to_bool) {
      std::vector<TensorMeta> metas;
      for (mlir::Value in : op.getInputs()) {
        auto it = llvm::cast<mlir::RankedTensorType>(in.getType());
        TensorMeta m;
        m.dtype = *kiln::dialect::dtype_of(it.getElementType());
        m.shape.resize(static_cast<int>(it.getRank()), 1);
        metas.push_back(m);
      }
      ct = kiln::dialect::element_type(rw.getContext(), result_type_of(metas));
    }
    if (!llvm::isa<mlir::FloatType>(t) &&
        (*kind == OpKind::Div || op_info(*kind).dtype_rule == DTypeRule::ToFloat))
      return rw.notifyMatchFailure(op, "integer result for a float op");
    mlir::Location loc = op.getLoc();
    int64_t rank = result_type.getRank();
    mlir::MLIRContext* ctx = rw.getContext();

    // Indexing maps (right-aligned broadcasting) and the dynamic sizes of the result.
    llvm::SmallVector<mlir::AffineMap> maps;
    llvm::SmallVector<mlir::Value> dyn_sizes;
    for (mlir::Value in : op.getInputs()) {
      auto it = llvm::cast<mlir::RankedTensorType>(in.getType());
      int64_t off = rank - it.getRank();
      llvm::SmallVector<mlir::AffineExpr> exprs;
      for (int64_t p = 0; p < it.getRank(); ++p) {
        int64_t d = p + off;
        bool broadcast = !it.isDynamicDim(p) && it.getDimSize(p) == 1 &&
                         result_type.getShape()[d] != 1;
        exprs.push_back(broadcast ? rw.getAffineConstantExpr(0) : rw.getAffineDimExpr(d));
      }
      maps.push_back(mlir::AffineMap::get(rank, 0, exprs, ctx));
    }
    for (int64_t d = 0; d < rank; ++d) {
      if (!result_type.isDynamicDim(d)) continue;
      mlir::Value size;
      for (mlir::Value in : op.getInputs()) {
        auto it = llvm::cast<mlir::RankedTensorType>(in.getType());
        int64_t p = d - (rank - it.getRank());
        if (p >= 0 && it.isDynamicDim(p)) {
          size = mlir::tensor::DimOp::create(rw, loc, in, p);
          break;
        }
      }
      if (!size) return rw.notifyMatchFailure(op, "no operand gives a dynamic result size");
      dyn_sizes.push_back(size);
    }
    maps.push_back(mlir::AffineMap::getMultiDimIdentityMap(rank, ctx));
    mlir::Value init = mlir::tensor::EmptyOp::create(rw, loc, result_type.getShape(), t, dyn_sizes);
    llvm::SmallVector<mlir::utils::IteratorType> iterators(rank, mlir::utils::IteratorType::parallel);
    mlir::Attribute alpha_attr = op.getAlphaAttr();
    mlir::Attribute beta_attr = op.getBetaAttr();
    int64_t mode = static_cast<int64_t>(op.getMode().value_or(0));
    OpKind k = *kind;
    bool failed = false;
    auto generic = mlir::linalg::GenericOp::create(
        rw, loc, mlir::TypeRange{result_type}, op.getInputs(), mlir::ValueRange{init}, maps,
        iterators, [&](mlir::OpBuilder& b, mlir::Location l, mlir::ValueRange args) {
          llvm::SmallVector<mlir::Value> converted;
          for (auto [i, a] : llvm::enumerate(args.drop_back()))
            converted.push_back(k == OpKind::Where && i == 0 ? a : convert(b, l, a, ct));
          mlir::Value alpha =
              alpha_attr ? scalar_constant(b, l, alpha_attr, ct) : mlir::Value();
          mlir::Value beta = beta_attr ? scalar_constant(b, l, beta_attr, ct) : mlir::Value();
          mlir::Value r = emit_formula(b, l, k, converted, alpha, beta, mode, ct);
          if (!r) {
            failed = true;
            r = args.back();
          }
          mlir::linalg::YieldOp::create(b, l, r);
        });
    if (failed) {
      rw.eraseOp(generic);
      return rw.notifyMatchFailure(op, "no formula for this dtype");
    }
    rw.replaceOp(op, generic.getResults());
    return mlir::success();
  }
};

/// kiln.reduce sum/prod/amax/amin/mean -> linalg.fill + linalg.generic with reduction iterators
/// (mean: then one elementwise generic dividing by the count). Int sum/prod accumulate in int64.
struct LowerReduce : mlir::OpRewritePattern<kiln::dialect::ReduceOp> {
  using OpRewritePattern::OpRewritePattern;

  mlir::LogicalResult matchAndRewrite(kiln::dialect::ReduceOp op,
                                      mlir::PatternRewriter& rw) const override {
    auto kind = kiln::dialect::op_kind_from_name(op.getKind());
    if (!kind || !(*kind == OpKind::Sum || *kind == OpKind::Prod || *kind == OpKind::Amax ||
                   *kind == OpKind::Amin || *kind == OpKind::Mean))
      return rw.notifyMatchFailure(op, "kind not lowered yet");
    auto in_type = llvm::cast<mlir::RankedTensorType>(op.getInput().getType());
    auto out_type = llvm::cast<mlir::RankedTensorType>(op.getResult().getType());
    mlir::Type t = out_type.getElementType();
    if (t.isInteger(1)) return rw.notifyMatchFailure(op, "bool reductions not lowered yet");
    mlir::Location loc = op.getLoc();
    mlir::MLIRContext* ctx = rw.getContext();
    int rank = static_cast<int>(in_type.getRank());
    OpAttrs attrs = kiln::dialect::attrs_from_op(*kind, op);
    uint32_t mask;
    try {
      mask = kiln::reduction_mask(attrs, rank, op_info(*kind).name.data(), Loc::current());
    } catch (const Error&) {
      return rw.notifyMatchFailure(op, "bad dims");
    }
    bool keepdim = op.getKeepdim();

    llvm::SmallVector<mlir::AffineExpr> out_exprs;
    llvm::SmallVector<mlir::utils::IteratorType> iterators;
    llvm::SmallVector<mlir::Value> dyn_sizes;
    mlir::Value count;  // number of reduced elements (index), for mean
    for (int d = 0; d < rank; ++d) {
      bool reduced = mask >> d & 1;
      iterators.push_back(reduced ? mlir::utils::IteratorType::reduction
                                  : mlir::utils::IteratorType::parallel);
      if (!reduced) {
        out_exprs.push_back(rw.getAffineDimExpr(d));
        if (in_type.isDynamicDim(d)) dyn_sizes.push_back(mlir::tensor::DimOp::create(rw, loc, op.getInput(), d));
      } else {
        if (keepdim) out_exprs.push_back(rw.getAffineConstantExpr(0));
        mlir::Value size = in_type.isDynamicDim(d)
                               ? mlir::tensor::DimOp::create(rw, loc, op.getInput(), d).getResult()
                               : mlir::arith::ConstantIndexOp::create(rw, loc, in_type.getDimSize(d)).getResult();
        count = count ? mlir::arith::MulIOp::create(rw, loc, count, size).getResult() : size;
      }
    }
    if (static_cast<int64_t>(out_exprs.size()) != out_type.getRank())
      return rw.notifyMatchFailure(op, "unexpected result rank");
    // Result dims that are dynamic must come from the input; static ones are static there too.
    if (dyn_sizes.size() != static_cast<size_t>(out_type.getNumDynamicDims()))
      return rw.notifyMatchFailure(op, "result and input dynamic dims differ");

    // Identity of the accumulation.
    mlir::TypedAttr identity;
    OpKind k = *kind;
    if (auto ft = llvm::dyn_cast<mlir::FloatType>(t)) {
      double v = k == OpKind::Prod ? 1.0 : k == OpKind::Amax ? -INFINITY : k == OpKind::Amin ? INFINITY : 0.0;
      identity = mlir::FloatAttr::get(ft, v);
    } else {
      unsigned bits = t.getIntOrFloatBitWidth();
      llvm::APInt v = k == OpKind::Prod   ? llvm::APInt(bits, 1)
                      : k == OpKind::Amax ? llvm::APInt::getSignedMinValue(bits)
                      : k == OpKind::Amin ? llvm::APInt::getSignedMaxValue(bits)
                                          : llvm::APInt(bits, 0);
      identity = mlir::IntegerAttr::get(t, v);
      if (k == OpKind::Mean) return rw.notifyMatchFailure(op, "integer mean");
    }
    mlir::Value init = mlir::tensor::EmptyOp::create(rw, loc, out_type.getShape(), t, dyn_sizes);
    mlir::Value id = mlir::arith::ConstantOp::create(rw, loc, identity);
    mlir::Value filled =
        mlir::linalg::FillOp::create(rw, loc, mlir::ValueRange{id}, mlir::ValueRange{init}).getResult(0);
    llvm::SmallVector<mlir::AffineMap> maps = {mlir::AffineMap::getMultiDimIdentityMap(rank, ctx),
                                               mlir::AffineMap::get(rank, 0, out_exprs, ctx)};
    auto generic = mlir::linalg::GenericOp::create(
        rw, loc, mlir::TypeRange{out_type}, mlir::ValueRange{op.getInput()},
        mlir::ValueRange{filled}, maps, iterators,
        [&](mlir::OpBuilder& b, mlir::Location l, mlir::ValueRange args) {
          mlir::Value x = convert(b, l, args[0], t), acc = args[1], r;
          namespace f = kiln::formulas;
          if (auto ft = llvm::dyn_cast<mlir::FloatType>(t)) {
            IrScope scope(b, l, ft);
            IrFloat a(x), c(acc);
            switch (k) {
              case OpKind::Prod: r = f::Mul::eval(c, a).v; break;
              // NaN wins, as in eager; arith.maximumf/minimumf (IEEE 754-2019 maximum) rather
              // than the compare-and-select of formulas::Maximum, so LLVM vectorises the loop.
              case OpKind::Amax: r = mlir::arith::MaximumFOp::create(b, l, x, acc); break;
              case OpKind::Amin: r = mlir::arith::MinimumFOp::create(b, l, x, acc); break;
              default: r = f::Add::eval(c, a).v; break;  // sum, mean
            }
            // Like eager's vectorised reductions, the accumulation may be re-associated (LLVM
            // then keeps several partial sums in vector lanes); the elementwise math is not.
            if (auto add = r.getDefiningOp<mlir::arith::AddFOp>())
              add.setFastmath(mlir::arith::FastMathFlags::reassoc);
          } else {
            switch (k) {
              case OpKind::Prod: r = mlir::arith::MulIOp::create(b, l, acc, x); break;
              case OpKind::Amax: r = mlir::arith::MaxSIOp::create(b, l, acc, x); break;
              case OpKind::Amin: r = mlir::arith::MinSIOp::create(b, l, acc, x); break;
              default: r = mlir::arith::AddIOp::create(b, l, acc, x); break;
            }
          }
          mlir::linalg::YieldOp::create(b, l, r);
        });
    mlir::Value result = generic.getResult(0);
    if (k == OpKind::Mean) {
      auto ft = llvm::cast<mlir::FloatType>(t);
      mlir::Value n = count ? count : mlir::arith::ConstantIndexOp::create(rw, loc, 1).getResult();
      mlir::Value n_i64 = mlir::arith::IndexCastOp::create(rw, loc, rw.getI64Type(), n);
      mlir::Value n_f = mlir::arith::SIToFPOp::create(rw, loc, ft, n_i64);
      int64_t orank = out_type.getRank();
      mlir::Value empty = mlir::tensor::EmptyOp::create(rw, loc, out_type.getShape(), t, dyn_sizes);
      auto id_map = mlir::AffineMap::getMultiDimIdentityMap(orank, ctx);
      result = mlir::linalg::GenericOp::create(
                   rw, loc, mlir::TypeRange{out_type}, mlir::ValueRange{result},
                   mlir::ValueRange{empty}, llvm::SmallVector<mlir::AffineMap>{id_map, id_map},
                   llvm::SmallVector<mlir::utils::IteratorType>(orank, mlir::utils::IteratorType::parallel),
                   [&](mlir::OpBuilder& b, mlir::Location l, mlir::ValueRange args) {
                     IrScope scope(b, l, ft);
                     mlir::linalg::YieldOp::create(
                         b, l, kiln::formulas::Div::eval(IrFloat(args[0]), IrFloat(n_f)).v);
                   })
                   .getResult(0);
    }
    rw.replaceOp(op, result);
    return mlir::success();
  }
};

/// kiln.matmul "matmul" on 2-D operands of the result's float type -> linalg.matmul into a
/// zero-filled init (no alpha/beta, batch dims or 1-D operands yet).
struct LowerMatmul : mlir::OpRewritePattern<kiln::dialect::MatmulOp> {
  using OpRewritePattern::OpRewritePattern;

  mlir::LogicalResult matchAndRewrite(kiln::dialect::MatmulOp op,
                                      mlir::PatternRewriter& rw) const override {
    if (op.getKind() != "matmul" || op.getInputs().size() != 2 || op.getAlpha() || op.getBeta())
      return rw.notifyMatchFailure(op, "only plain 2-D matmul is lowered yet");
    mlir::Value a = op.getInputs()[0], b = op.getInputs()[1];
    auto ta = llvm::cast<mlir::RankedTensorType>(a.getType());
    auto tb = llvm::cast<mlir::RankedTensorType>(b.getType());
    auto out = llvm::cast<mlir::RankedTensorType>(op.getResult().getType());
    mlir::Type t = out.getElementType();
    if (ta.getRank() != 2 || tb.getRank() != 2 || !llvm::isa<mlir::FloatType>(t) ||
        ta.getElementType() != t || tb.getElementType() != t)
      return rw.notifyMatchFailure(op, "only 2-D same-dtype float matmul is lowered yet");
    mlir::Location loc = op.getLoc();
    llvm::SmallVector<mlir::Value> dyn;
    if (out.isDynamicDim(0)) {
      if (!ta.isDynamicDim(0)) return rw.notifyMatchFailure(op, "dynamic M without source");
      dyn.push_back(mlir::tensor::DimOp::create(rw, loc, a, 0));
    }
    if (out.isDynamicDim(1)) {
      if (!tb.isDynamicDim(1)) return rw.notifyMatchFailure(op, "dynamic N without source");
      dyn.push_back(mlir::tensor::DimOp::create(rw, loc, b, 1));
    }
    mlir::Value init = mlir::tensor::EmptyOp::create(rw, loc, out.getShape(), t, dyn);
    mlir::Value zero = mlir::arith::ConstantOp::create(
        rw, loc, mlir::FloatAttr::get(llvm::cast<mlir::FloatType>(t), 0.0));
    mlir::Value filled =
        mlir::linalg::FillOp::create(rw, loc, mlir::ValueRange{zero}, mlir::ValueRange{init}).getResult(0);
    auto mm = mlir::linalg::MatmulOp::create(rw, loc, mlir::TypeRange{out}, mlir::ValueRange{a, b},
                                             mlir::ValueRange{filled});
    rw.replaceOp(op, mm->getResults());
    return mlir::success();
  }
};

/// kiln.view "transpose" / "permute" -> linalg.transpose (a copy: values, not aliases, in the IR).
struct LowerTranspose : mlir::OpRewritePattern<kiln::dialect::ViewOp> {
  using OpRewritePattern::OpRewritePattern;

  mlir::LogicalResult matchAndRewrite(kiln::dialect::ViewOp op,
                                      mlir::PatternRewriter& rw) const override {
    auto in = llvm::cast<mlir::RankedTensorType>(op.getInput().getType());
    auto out = llvm::cast<mlir::RankedTensorType>(op.getResult().getType());
    int64_t rank = in.getRank();
    auto wrap = [&](int64_t d) { return d < 0 ? d + rank : d; };
    llvm::SmallVector<int64_t> perm;
    for (int64_t i = 0; i < rank; ++i) perm.push_back(i);
    if (op.getKind() == "transpose") {
      if (rank == 0) return rw.notifyMatchFailure(op, "0-d");
      int64_t d0 = wrap(static_cast<int64_t>(op.getDim().value_or(0)));
      int64_t d1 = wrap(static_cast<int64_t>(op.getDim1().value_or(0)));
      if (d0 < 0 || d0 >= rank || d1 < 0 || d1 >= rank) return rw.notifyMatchFailure(op, "dims");
      std::swap(perm[d0], perm[d1]);
    } else if (op.getKind() == "permute" && op.getDims()) {
      perm.clear();
      llvm::ArrayRef<int64_t> dims = *op.getDims();
      for (int64_t d : dims) perm.push_back(wrap(d));
    } else {
      return rw.notifyMatchFailure(op, "view kind not lowered yet");
    }
    mlir::Location loc = op.getLoc();
    llvm::SmallVector<mlir::Value> dyn;
    for (int64_t i = 0; i < rank; ++i)
      if (out.isDynamicDim(i)) {
        if (!in.isDynamicDim(perm[i])) return rw.notifyMatchFailure(op, "dynamic dim mismatch");
        dyn.push_back(mlir::tensor::DimOp::create(rw, loc, op.getInput(), perm[i]));
      }
    mlir::Value init = mlir::tensor::EmptyOp::create(rw, loc, out.getShape(), out.getElementType(), dyn);
    auto tr = mlir::linalg::TransposeOp::create(rw, loc, op.getInput(), init, perm);
    rw.replaceOp(op, tr->getResults());
    return mlir::success();
  }
};

struct KilnToLinalgPass
    : mlir::PassWrapper<KilnToLinalgPass, mlir::OperationPass<mlir::ModuleOp>> {
  MLIR_DEFINE_EXPLICIT_INTERNAL_INLINE_TYPE_ID(KilnToLinalgPass)
  llvm::StringRef getArgument() const override { return "convert-kiln-to-linalg"; }
  llvm::StringRef getDescription() const override {
    return "Lower kiln.elementwise to linalg.generic on tensors";
  }
  void getDependentDialects(mlir::DialectRegistry& r) const override {
    r.insert<mlir::arith::ArithDialect, mlir::linalg::LinalgDialect, mlir::math::MathDialect,
             mlir::tensor::TensorDialect>();
  }
  void runOnOperation() override {
    mlir::RewritePatternSet patterns(&getContext());
    populate_kiln_to_linalg_patterns(patterns);
    // tensor.dim of a lowered result -> dim of its init -> the size it was built from, so the
    // generics do not keep extra uses that would stop producer-consumer fusion.
    mlir::tensor::DimOp::getCanonicalizationPatterns(patterns, &getContext());
    mlir::tensor::EmptyOp::getCanonicalizationPatterns(patterns, &getContext());
    if (mlir::failed(mlir::applyPatternsGreedily(getOperation(), std::move(patterns))))
      signalPassFailure();
  }
};

}  // namespace

/// kiln.constant -> arith.constant with the same dense value (a tensor constant).
struct LowerConstant : mlir::OpRewritePattern<kiln::dialect::ConstantOp> {
  using OpRewritePattern::OpRewritePattern;
  mlir::LogicalResult matchAndRewrite(kiln::dialect::ConstantOp op,
                                      mlir::PatternRewriter& rw) const override {
    auto value = llvm::dyn_cast<mlir::TypedAttr>(op.getValue());
    if (!value) return rw.notifyMatchFailure(op, "not a typed attribute");
    rw.replaceOpWithNewOp<mlir::arith::ConstantOp>(op, value);
    return mlir::success();
  }
};

void populate_kiln_to_linalg_patterns(mlir::RewritePatternSet& patterns) {
  patterns.add<LowerElementwise, LowerReduce, LowerMatmul, LowerTranspose, LowerConstant>(
      patterns.getContext());
}

std::unique_ptr<mlir::Pass> create_kiln_to_linalg_pass() {
  return std::make_unique<KilnToLinalgPass>();
}

void register_codegen(mlir::DialectRegistry& registry) {
  registry.insert<mlir::arith::ArithDialect, mlir::linalg::LinalgDialect, mlir::math::MathDialect,
                  mlir::tensor::TensorDialect>();
  mlir::PassRegistration<KilnToLinalgPass>();
  register_fusion_pass();
  mlir::registerLinalgPasses();  // linalg-fuse-elementwise-ops, ...
}

std::string lower_to_linalg(const ir::Graph& g, bool fuse) {
  mlir::ModuleOp original = ir::GraphAccess::module(g);
  mlir::OwningOpRef<mlir::ModuleOp> module(original.clone());
  mlir::MLIRContext* ctx = module->getContext();
  std::string messages;
  mlir::ScopedDiagnosticHandler handler(ctx, [&](mlir::Diagnostic& d) {
    llvm::raw_string_ostream os(messages);
    os << d.getLocation() << ": " << d << "\n";
    return mlir::success();
  });
  mlir::PassManager pm(ctx);
  pm.addPass(kiln::dialect::create_decompose_pass());
  pm.addPass(create_kiln_to_linalg_pass());
  if (fuse) {
    pm.addPass(mlir::createCanonicalizerPass());
    pm.addPass(create_fuse_elementwise_pass());
    pm.addPass(mlir::createCSEPass());
  }
  if (mlir::failed(pm.run(*module))) throw Error("lower_to_linalg", messages);
  std::string text;
  llvm::raw_string_ostream os(text);
  module->print(os);
  return text;
}

}  // namespace kiln::codegen
