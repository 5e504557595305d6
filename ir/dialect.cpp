#include "ir/dialect.h"

#include <algorithm>
#include <string>
#include <utility>

#include "core/error.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/DialectImplementation.h"
#include "mlir/IR/OpImplementation.h"

#include "ir/KilnDialect.cpp.inc"
#define GET_OP_CLASSES
#include "ir/KilnOps.cpp.inc"

namespace kiln::dialect {

void KilnDialect::initialize() {
  addOperations<
#define GET_OP_LIST
#include "ir/KilnOps.cpp.inc"
      >();
}

mlir::Operation* KilnDialect::materializeConstant(mlir::OpBuilder& b, mlir::Attribute value,
                                                  mlir::Type type, mlir::Location loc) {
  auto elements = llvm::dyn_cast<mlir::ElementsAttr>(value);
  if (!elements || elements.getType() != type) return nullptr;
  return ConstantOp::create(b, loc, type, elements);
}

// ---------------------------------------------------------------------------------------------
// Op table glue

std::optional<OpKind> op_kind_from_name(llvm::StringRef name) {
  for (int i = 0; i < kNumOps; ++i) {
    auto k = static_cast<OpKind>(i);
    if (op_name(k) == std::string_view(name.data(), name.size())) return k;
  }
  return std::nullopt;
}

const char* dialect_op_for(OpKind op) {
  switch (op_info(op).category) {
    case OpCategory::Unary:
    case OpCategory::Binary:
    case OpCategory::Ternary: return "elementwise";
    case OpCategory::Reduction:
    case OpCategory::IndexReduction: return "reduce";
    case OpCategory::Matmul: return "matmul";
    case OpCategory::View: return "view";
    case OpCategory::Normalization:
    case OpCategory::Loss: return "composite";
    // `to` is elementwise (a convert per element), so it fuses with its neighbours; the other
    // Copy rows are in-place or identities the tracer handles itself.
    case OpCategory::Copy: return op == OpKind::Cast ? "elementwise" : nullptr;
    // The Index rows: reads and selections of elements, and index_add / index_copy /
    // scatter_add, which add (copy) through indices.
    case OpCategory::Index: return "index";
    case OpCategory::Shape: return "shape";  // cat
    // The Random rows that draw from a Philox key (codegen/lower_random.cpp): the key is an
    // operand, so the op is pure. Dropout itself is x times its mask.
    case OpCategory::Random: return op == OpKind::Dropout ? nullptr : "random";
    // argsort and cumsum have no dialect op: a compiled replay runs them on eager kernels
    // between its compiled regions (tracer/plan.cpp, lowerable).
    case OpCategory::Scan: return nullptr;
    // unfold / fold (and so conv2d and the pools) likewise: not lowered to codegen yet.
    case OpCategory::Window: return nullptr;
    default: return nullptr;
  }
}

mlir::Type element_type(mlir::MLIRContext* ctx, DType dtype) {
  mlir::Builder b(ctx);
  switch (dtype) {
    case DType::Bool: return b.getI1Type();
    case DType::Int32: return b.getI32Type();
    case DType::Int64: return b.getI64Type();
    case DType::Float32: return b.getF32Type();
    case DType::Float64: return b.getF64Type();
  }
  return {};
}

std::optional<DType> dtype_of(mlir::Type t) {
  if (t.isInteger(1)) return DType::Bool;
  if (t.isInteger(32)) return DType::Int32;
  if (t.isInteger(64)) return DType::Int64;
  if (t.isF32()) return DType::Float32;
  if (t.isF64()) return DType::Float64;
  return std::nullopt;
}

namespace {

// Dynamic dims. infer_meta works on concrete sizes, so each `?` is replaced by a size before
// calling it: for elementwise ops by a static size > 1 found at the same (right-aligned)
// position of another operand (the result is then that size whether `?` is 1 or not), for
// matmul's contracted dim by the other operand's static size, and otherwise by kSymbolic
// (placeholder_for: a smaller prime where many `?` dims would overflow). Result dims that are
// multiples of the placeholder become `?` again. (A static dim that is a multiple of it thus
// also infers as `?`, which is only less precise, never wrong.)
constexpr int64_t kSymbolic = 10007;

// The placeholder for this op's `?` dims: kSymbolic, or the largest smaller prime for which
// placeholder^(all operands' `?` dims) times the largest static part of an operand, in 8-byte
// elements, stays within int64 (infer_meta checks each shape's bytes). With kSymbolic, 5 `?`
// dims raised "shape [10007, 10007, 10007, 10007, 10007] is too large" (found by review).
int64_t placeholder_for(llvm::ArrayRef<mlir::RankedTensorType> operands) {
  int dynamic = 0;
  int64_t largest_static = 1;
  for (auto t : operands) {
    int64_t part = 1;
    for (int64_t d = 0; d < t.getRank(); ++d) {
      if (t.isDynamicDim(d)) {
        ++dynamic;
      } else if (__builtin_mul_overflow(part, std::max<int64_t>(t.getDimSize(d), 1), &part)) {
        return kSymbolic;  // too large at any placeholder: infer_meta reports it
      }
    }
    largest_static = std::max(largest_static, part);
  }
  for (int64_t p : {kSymbolic, int64_t{1021}, int64_t{61}, int64_t{7}}) {
    int64_t n = 8 * 4;  // headroom for results that broadcast `?` dims of several operands
    bool fits = !__builtin_mul_overflow(n, largest_static, &n);
    for (int i = 0; fits && i < dynamic; ++i) fits = !__builtin_mul_overflow(n, p, &n);
    if (fits) return p;
  }
  return 2;
}

bool is_elementwise(OpKind op) {
  auto c = op_info(op).category;
  return c == OpCategory::Unary || c == OpCategory::Binary || c == OpCategory::Ternary;
}

}  // namespace

std::vector<mlir::RankedTensorType> infer_result_types(
    mlir::MLIRContext* ctx, OpKind op, llvm::ArrayRef<mlir::RankedTensorType> operands,
    const OpAttrs& attrs, Loc loc) {
  // The number of operands is checked by infer_meta (layer_norm takes 1 to 3).
  const char* name = op_info(op).name.data();
  if (op_info(op).category == OpCategory::Random) {
    // The only operand is the Philox key; the result's shape and dtype are attributes.
    auto i64 = mlir::IntegerType::get(ctx, 64);
    KILN_CHECK(operands.size() == 1 && operands[0].getElementType() == i64 &&
                   operands[0].getShape() == llvm::ArrayRef<int64_t>{2},
               name, loc, "takes one key operand, tensor<2xi64> (seed, offset)");
    InferredMeta inferred = infer_meta(op, {}, attrs, loc);
    const OutputMeta& o = inferred.outputs.at(0);
    llvm::SmallVector<int64_t> shape(o.shape.begin(), o.shape.end());
    return {mlir::RankedTensorType::get(shape, element_type(ctx, o.dtype))};
  }
  std::vector<TensorMeta> metas;
  int max_rank = 0;
  for (auto t : operands) {
    auto dt = dtype_of(t.getElementType());
    std::string ts;
    llvm::raw_string_ostream os(ts);
    os << t;
    KILN_CHECK(dt.has_value(), name, loc, "unsupported element type in {}", ts);
    KILN_CHECK(t.getRank() <= kMaxRank, name, loc, "rank {} exceeds kiln's maximum {}",
               t.getRank(), kMaxRank);
    TensorMeta m;
    m.dtype = *dt;
    m.shape.resize(static_cast<int>(t.getRank()));
    metas.push_back(m);
    max_rank = std::max<int>(max_rank, static_cast<int>(t.getRank()));
  }
  // view/reshape of a dynamic-shaped input: no size to substitute keeps the element count, so
  // the -1 dim becomes `?` (checked again at run time) and the other sizes are taken as given.
  if (op == OpKind::View && operands.size() == 1 && !operands[0].hasStaticShape()) {
    int inferred = 0;
    llvm::SmallVector<int64_t> shape;
    for (int64_t s : attrs.dims) {
      KILN_CHECK(s >= -1, name, loc, "invalid size {} in shape {}", s, to_string(attrs.dims));
      if (s == -1) ++inferred;
      shape.push_back(s == -1 ? mlir::ShapedType::kDynamic : s);
    }
    KILN_CHECK(inferred <= 1, name, loc, "only one dim can be -1 in shape {}",
               to_string(attrs.dims));
    return {mlir::RankedTensorType::get(shape, operands[0].getElementType())};
  }
  // cat's joined dim (wrapped as infer_meta does; out of range: infer_meta raises).
  int cat_dim = -1;
  if (op == OpKind::Cat && !operands.empty()) {
    const int64_t r = operands[0].getRank();
    cat_dim = static_cast<int>(attrs.dim < 0 ? attrs.dim + r : attrs.dim);
  }
  // Fill in sizes: static dims as they are, dynamic ones substituted.
  const int64_t symbolic = placeholder_for(operands);
  for (size_t i = 0; i < operands.size(); ++i) {
    auto t = operands[i];
    int rank = static_cast<int>(t.getRank());
    for (int d = 0; d < rank; ++d) {
      if (!t.isDynamicDim(d)) {
        metas[i].shape[d] = t.getDimSize(d);
        continue;
      }
      int64_t size = symbolic;
      if (is_elementwise(op)) {
        int from_right = rank - d;
        for (auto u : operands) {
          int64_t pos = u.getRank() - from_right;
          if (pos >= 0 && !u.isDynamicDim(pos) && u.getDimSize(pos) > 1) size = u.getDimSize(pos);
        }
      } else if (op_info(op).category == OpCategory::Matmul && operands.size() >= 2) {
        // a: [..., M, K], b: [..., K, N] (or [K]); the contracted dims must agree.
        size_t a = operands.size() == 3 ? 1 : 0, b = a + 1;
        auto ta = operands[a], tb = operands[b];
        if (i == a && d == rank - 1 && tb.getRank() >= 1) {
          int64_t kb = tb.getRank() == 1 ? 0 : tb.getRank() - 2;
          if (!tb.isDynamicDim(kb)) size = tb.getDimSize(kb);
        } else if (i == b && d == (rank == 1 ? 0 : rank - 2) && ta.getRank() >= 1) {
          if (!ta.isDynamicDim(ta.getRank() - 1)) size = ta.getDimSize(ta.getRank() - 1);
        }
      } else if (op == OpKind::Cat) {
        // The joined dim adds up (a `?` in any input makes the result's `?`, below); the
        // others must agree: an input's static size stands for the `?`.
        if (d == cat_dim) size = 1;
        for (auto u : operands)
          if (d != cat_dim && u.getRank() == rank && !u.isDynamicDim(d)) size = u.getDimSize(d);
      }
      metas[i].shape[d] = size;
    }
  }
  InferredMeta inferred = infer_meta(op, metas, attrs, loc);
  std::vector<mlir::RankedTensorType> out;
  for (const OutputMeta& o : inferred.outputs) {
    llvm::SmallVector<int64_t> shape;
    for (int64_t s : o.shape)
      shape.push_back(s != 0 && s % symbolic == 0 ? mlir::ShapedType::kDynamic : s);
    if (op == OpKind::Cat && cat_dim >= 0 && cat_dim < static_cast<int>(shape.size()))
      for (auto u : operands)
        if (u.getRank() == static_cast<int64_t>(shape.size()) && u.isDynamicDim(cat_dim))
          shape[cat_dim] = mlir::ShapedType::kDynamic;
    out.push_back(mlir::RankedTensorType::get(shape, element_type(ctx, o.dtype)));
  }
  return out;
}

namespace {

mlir::TypedAttr scalar_attr(mlir::Builder& b, const Scalar& s) {
  if (s.is_floating()) return b.getF64FloatAttr(s.to<double>());
  if (s.is_bool()) return b.getBoolAttr(s.to<bool>());
  return b.getI64IntegerAttr(s.to<int64_t>());
}

std::optional<Scalar> scalar_from(mlir::Attribute a) {
  if (auto f = llvm::dyn_cast_or_null<mlir::FloatAttr>(a)) return Scalar(f.getValueAsDouble());
  if (auto i = llvm::dyn_cast_or_null<mlir::IntegerAttr>(a)) {
    if (i.getType().isInteger(1)) return Scalar(i.getValue().getBoolValue());
    return Scalar(i.getInt());
  }
  return std::nullopt;
}

bool is_one(const Scalar& s) { return !s.is_bool() && s.to<double>() == 1.0; }

}  // namespace

void attrs_to_named(OpKind kind, const OpAttrs& a, mlir::Builder& b,
                    llvm::SmallVectorImpl<mlir::NamedAttribute>& out) {
  auto add = [&](const char* n, mlir::Attribute v) { out.push_back(b.getNamedAttr(n, v)); };
  auto dims = [&] { return b.getDenseI64ArrayAttr(llvm::ArrayRef<int64_t>(a.dims.data(), a.dims.size())); };
  switch (op_info(kind).category) {
    case OpCategory::Unary:
    case OpCategory::Binary:
    case OpCategory::Ternary:
      if (kind == OpKind::Clamp) {
        if (a.has_low) add("alpha", scalar_attr(b, a.alpha));
        if (a.has_high) add("beta", scalar_attr(b, a.beta));
      } else if (!is_one(a.alpha)) {
        add("alpha", scalar_attr(b, a.alpha));
      }
      if (a.mode != 0) add("mode", b.getI64IntegerAttr(a.mode));
      break;
    case OpCategory::Reduction:
    case OpCategory::IndexReduction:
      // argmax/argmin: `dims = [dim]`, or all dims (the flattened index) when absent.
      if (op_info(kind).category == OpCategory::IndexReduction) {
        if (!a.all_dims) add("dims", b.getDenseI64ArrayAttr({a.dim}));
      } else if (!a.all_dims && !a.dims.empty()) {
        add("dims", dims());
      }
      if (a.keepdim) add("keepdim", b.getUnitAttr());
      if (a.mode != 0) add("mode", b.getI64IntegerAttr(a.mode));
      break;
    case OpCategory::Matmul:
      if (!is_one(a.alpha)) add("alpha", scalar_attr(b, a.alpha));
      if (!is_one(a.beta)) add("beta", scalar_attr(b, a.beta));
      break;
    case OpCategory::View:
      if (!a.dims.empty() || (kind == OpKind::Squeeze && a.all_dims)) add("dims", dims());  // squeeze(): dims = []
      if (a.dim != 0) add("dim", b.getI64IntegerAttr(a.dim));
      if (a.dim1 != 0) add("dim1", b.getI64IntegerAttr(a.dim1));
      if (kind == OpKind::Slice || kind == OpKind::Select) {
        add("start", b.getI64IntegerAttr(a.start));
        if (kind == OpKind::Slice) {
          add("end", b.getI64IntegerAttr(a.end));
          add("step", b.getI64IntegerAttr(a.step));
        }
      }
      break;
    case OpCategory::Normalization:
      if (kind == OpKind::LayerNorm) {
        add("dims", dims());
        add("eps", b.getF64FloatAttr(a.eps));
      } else if (a.dim != 0) {
        add("dim", b.getI64IntegerAttr(a.dim));
      }
      break;
    case OpCategory::Copy:
      if (kind == OpKind::Cast) add("dtype", mlir::TypeAttr::get(element_type(b.getContext(), a.dtype)));
      break;
    case OpCategory::Index:
      // one_hot: num_classes; tril / triu: the diagonal.
      if (kind == OpKind::OneHot || a.mode != 0) add("mode", b.getI64IntegerAttr(a.mode));
      if (kind == OpKind::IndexSelect || kind == OpKind::Gather || kind == OpKind::IndexAdd ||
          kind == OpKind::IndexCopy || kind == OpKind::ScatterAdd)
        add("dim", b.getI64IntegerAttr(a.dim));
      if (kind == OpKind::MaskedFill) add("alpha", scalar_attr(b, a.alpha));
      break;
    case OpCategory::Shape: add("dim", b.getI64IntegerAttr(a.dim)); break;  // cat
    case OpCategory::Random:
      add("p", b.getF64FloatAttr(a.p));
      if (kind != OpKind::DropoutMask) {
        add("low", scalar_attr(b, a.low));
        add("high", scalar_attr(b, a.high));
      }
      break;
    case OpCategory::Loss:
      if (a.mode != 0) add("mode", b.getI64IntegerAttr(a.mode));
      if (kind == OpKind::NllLoss && a.ignore_index != OpAttrs().ignore_index)
        add("ignore_index", b.getI64IntegerAttr(a.ignore_index));
      break;
    default: break;
  }
}

OpAttrs attrs_from_op(OpKind kind, mlir::Operation* op) {
  OpAttrs a;
  auto i64 = [&](const char* n, int64_t& field) {
    if (auto v = op->getAttrOfType<mlir::IntegerAttr>(n)) field = v.getInt();
  };
  if (auto s = scalar_from(op->getAttr("alpha"))) {
    a.alpha = *s;
    a.has_low = true;
  }
  if (auto s = scalar_from(op->getAttr("beta"))) {
    a.beta = *s;
    a.has_high = true;
  }
  if (auto d = op->getAttrOfType<mlir::DenseI64ArrayAttr>("dims"))
    a.dims = Dims(std::vector<int64_t>(d.asArrayRef().begin(), d.asArrayRef().end()));
  a.keepdim = op->hasAttr("keepdim");
  i64("mode", a.mode);
  i64("dim", a.dim);
  i64("dim1", a.dim1);
  i64("start", a.start);
  i64("end", a.end);
  i64("step", a.step);
  i64("ignore_index", a.ignore_index);
  if (auto e = op->getAttrOfType<mlir::FloatAttr>("eps")) a.eps = e.getValueAsDouble();
  if (auto t = op->getAttrOfType<mlir::TypeAttr>("dtype"))
    if (auto d = dtype_of(t.getValue())) a.dtype = *d;
  if (op_info(kind).category == OpCategory::IndexReduction) {
    a.all_dims = a.dims.size() != 1;
    if (!a.all_dims) a.dim = a.dims[0];
  }
  if (kind == OpKind::Squeeze) a.all_dims = op->hasAttr("dims");
  if (op_info(kind).category == OpCategory::Random) {
    if (auto p = op->getAttrOfType<mlir::FloatAttr>("p")) a.p = p.getValueAsDouble();
    if (auto s = scalar_from(op->getAttr("low"))) a.low = *s;
    if (auto s = scalar_from(op->getAttr("high"))) a.high = *s;
    // The drawn shape and dtype are the result's (a `?` dim reads as -1, which infer_meta
    // rejects: random ops have static shapes).
    if (op->getNumResults() == 1) {
      auto t = llvm::cast<mlir::RankedTensorType>(op->getResult(0).getType());
      a.dims = Dims(std::vector<int64_t>(t.getShape().begin(), t.getShape().end()));
      for (int64_t& d : a.dims) d = mlir::ShapedType::isDynamic(d) ? -1 : d;
      if (auto d = dtype_of(t.getElementType())) a.dtype = *d;
    }
  }
  return a;
}

mlir::Value create_op(mlir::OpBuilder& b, mlir::Location loc, OpKind kind,
                      mlir::ValueRange operands, const OpAttrs& attrs, Loc where) {
  const char* name = op_info(kind).name.data();
  const char* mnemonic = dialect_op_for(kind);
  KILN_CHECK(mnemonic != nullptr, name, where, "is not supported by the kiln IR yet");
  llvm::SmallVector<mlir::RankedTensorType> types;
  for (mlir::Value v : operands) types.push_back(llvm::cast<mlir::RankedTensorType>(v.getType()));
  auto results = infer_result_types(b.getContext(), kind, types, attrs, where);
  KILN_CHECK(results.size() == 1, name, where, "ops with {} results are not supported yet",
             results.size());
  llvm::SmallVector<mlir::NamedAttribute> named;
  named.push_back(b.getNamedAttr("kind", b.getStringAttr(name)));
  attrs_to_named(kind, attrs, b, named);
  mlir::OperationState state(loc, std::string("kiln.") + mnemonic);
  state.addOperands(operands);
  state.addTypes(mlir::Type(results[0]));
  state.addAttributes(named);
  // ODS ops with Variadic operands do not need operandSegmentSizes (one variadic group).
  return b.create(state)->getResult(0);
}

mlir::Value splat_constant(mlir::OpBuilder& b, mlir::Location loc, mlir::RankedTensorType type,
                           double value) {
  mlir::Type e = type.getElementType();
  mlir::Attribute scalar =
      llvm::isa<mlir::FloatType>(e)
          ? mlir::Attribute(b.getFloatAttr(e, value))
          : mlir::Attribute(b.getIntegerAttr(e, static_cast<int64_t>(value)));
  return ConstantOp::create(b, loc, type, mlir::DenseElementsAttr::get(type, scalar));
}

mlir::Value splat_integer(mlir::OpBuilder& b, mlir::Location loc, mlir::RankedTensorType type,
                          int64_t value) {
  mlir::Attribute scalar = b.getIntegerAttr(type.getElementType(), value);
  return ConstantOp::create(b, loc, type, mlir::DenseElementsAttr::get(type, scalar));
}

// ---------------------------------------------------------------------------------------------
// Verifiers: every op checks `kind` against the op table and its types against infer_meta.

namespace {

mlir::LogicalResult verify_kiln_op(mlir::Operation* op, llvm::StringRef kind_name,
                                   const char* mnemonic) {
  auto kind = op_kind_from_name(kind_name);
  if (!kind) return op->emitOpError() << "unknown op kind \"" << kind_name << "\"";
  const char* expected = dialect_op_for(*kind);
  if (!expected || llvm::StringRef(expected) != mnemonic)
    return op->emitOpError() << "op kind \"" << kind_name << "\" belongs to "
                             << (expected ? "kiln." + std::string(expected)
                                          : std::string("no kiln op yet"));
  if (*kind == OpKind::Cast && !op->hasAttr("dtype"))
    return op->emitOpError() << "\"to\" needs its target element type in `dtype`";
  llvm::SmallVector<mlir::RankedTensorType> operands;
  for (mlir::Value v : op->getOperands()) operands.push_back(llvm::cast<mlir::RankedTensorType>(v.getType()));
  std::vector<mlir::RankedTensorType> inferred;
  try {
    inferred = infer_result_types(op->getContext(), *kind, operands, attrs_from_op(*kind, op));
  } catch (const Error& e) {
    return op->emitOpError() << e.op() << ": " << e.message();
  }
  if (inferred.size() != op->getNumResults())
    return op->emitOpError() << "has " << op->getNumResults() << " results, \"" << kind_name
                             << "\" produces " << inferred.size();
  for (unsigned i = 0; i < inferred.size(); ++i) {
    auto declared = llvm::cast<mlir::RankedTensorType>(op->getResult(i).getType());
    auto want = inferred[i];
    bool ok = declared.getElementType() == want.getElementType() &&
              declared.getRank() == want.getRank();
    for (int64_t d = 0; ok && d < want.getRank(); ++d)
      ok = declared.isDynamicDim(d) || want.isDynamicDim(d) ||
           declared.getDimSize(d) == want.getDimSize(d);
    if (!ok)
      return op->emitOpError() << "result type " << declared << " does not match the type "
                               << want << " inferred for \"" << kind_name << "\"";
  }
  return mlir::success();
}

}  // namespace

mlir::LogicalResult ElementwiseOp::verify() {
  return verify_kiln_op(getOperation(), getKind(), "elementwise");
}
mlir::LogicalResult ReduceOp::verify() { return verify_kiln_op(getOperation(), getKind(), "reduce"); }
mlir::LogicalResult MatmulOp::verify() { return verify_kiln_op(getOperation(), getKind(), "matmul"); }
mlir::LogicalResult ViewOp::verify() { return verify_kiln_op(getOperation(), getKind(), "view"); }
mlir::LogicalResult IndexOp::verify() { return verify_kiln_op(getOperation(), getKind(), "index"); }
mlir::LogicalResult ShapeOp::verify() { return verify_kiln_op(getOperation(), getKind(), "shape"); }
mlir::LogicalResult RandomOp::verify() {
  return verify_kiln_op(getOperation(), getKind(), "random");
}
mlir::LogicalResult CompositeOp::verify() {
  return verify_kiln_op(getOperation(), getKind(), "composite");
}

mlir::LogicalResult ConstantOp::verify() {
  auto type = llvm::cast<mlir::RankedTensorType>(getResult().getType());
  if (getValue().getType() != type)
    return emitOpError() << "value type " << getValue().getType() << " differs from result type "
                         << type;
  if (!dtype_of(type.getElementType()))
    return emitOpError() << "element type " << type.getElementType() << " is not a kiln dtype";
  return mlir::success();
}

// ---------------------------------------------------------------------------------------------
// Folders

mlir::OpFoldResult ConstantOp::fold(FoldAdaptor) { return getValue(); }

namespace {

/// Whether `v` is a kiln.constant whose every element is 1 (float or integer).
bool is_splat_one(mlir::Value v) {
  auto c = v.getDefiningOp<ConstantOp>();
  if (!c) return false;
  auto dense = llvm::dyn_cast<mlir::DenseElementsAttr>(c.getValue());
  if (!dense || !dense.isSplat()) return false;
  mlir::Type t = dense.getElementType();
  if (llvm::isa<mlir::FloatType>(t)) return dense.getSplatValue<llvm::APFloat>().isExactlyValue(1.0);
  if (t.isInteger(1)) return false;  // bool * true is a logical and, kept as written
  if (llvm::isa<mlir::IntegerType>(t)) return dense.getSplatValue<llvm::APInt>().isOne();
  return false;
}

}  // namespace

std::pair<int64_t, int64_t> swapped_dims(ViewOp t) {
  int64_t r = llvm::cast<mlir::RankedTensorType>(t.getInput().getType()).getRank();
  auto wrap = [&](int64_t d) { return d < 0 ? d + r : d; };
  int64_t a = wrap(t.getDim().value_or(0)), b = wrap(t.getDim1().value_or(0));
  return {std::min(a, b), std::max(a, b)};
}

/// x * 1 -> x when the product has x's type (no broadcast, no promotion): exact for every
/// value, NaN and -0 included. Autograd's addmm backward scales the weight gradient by alpha = 1;
/// without the multiply in between, lowering sees the GEMM whose result is transposed.
mlir::OpFoldResult ElementwiseOp::fold(FoldAdaptor) {
  if (getKind() != "mul" || getInputs().size() != 2) return {};
  for (int i = 0; i < 2; ++i) {
    mlir::Value x = getInputs()[i], other = getInputs()[1 - i];
    if (x.getType() == getResult().getType() && is_splat_one(other)) return x;
  }
  return {};
}

mlir::OpFoldResult ViewOp::fold(FoldAdaptor) {
  auto kind = op_kind_from_name(getKind());
  if (!kind) return {};
  // transpose(transpose(x)) of the same two dims is x (the backward of x.t() in x @ W.t()).
  if (*kind == OpKind::Transpose)
    if (auto inner = getInput().getDefiningOp<ViewOp>())
      if (inner.getKind() == "transpose" && swapped_dims(inner) == swapped_dims(*this) &&
          inner.getInput().getType() == getResult().getType())
        return inner.getInput();
  auto in = llvm::cast<mlir::RankedTensorType>(getInput().getType());
  auto out = llvm::cast<mlir::RankedTensorType>(getResult().getType());
  if (in != out || !in.hasStaticShape()) return {};
  switch (*kind) {
    case OpKind::View:
    case OpKind::Expand:
    case OpKind::Squeeze: return getInput();  // same static shape: no-op
    case OpKind::Transpose:
      if (getDim().value_or(0) == getDim1().value_or(0)) return getInput();
      return {};
    case OpKind::Permute: {
      auto dims = getDims();
      if (!dims) return {};
      for (size_t i = 0; i < dims->size(); ++i)
        if ((*dims)[i] != static_cast<int64_t>(i)) return {};
      return getInput();
    }
    default: return {};
  }
}

}  // namespace kiln::dialect
