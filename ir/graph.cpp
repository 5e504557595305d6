#include "ir/graph.h"
#include "ir/graph_internal.h"

#include "core/error.h"
#include "ir/dialect.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/Verifier.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Transforms/Passes.h"
#include "llvm/Support/ErrorHandling.h"

#include <mutex>

namespace kiln::ir {

namespace {
[[noreturn]] void llvm_fatal_error(void*, const char* reason, bool) {
  throw Error("LLVM fatal error (in kiln's MLIR/LLVM code)", reason);
}
// LLVM's failed allocations (safe_malloc, SmallVector growth) report here, not to the fatal
// handler: without it a compile that ran out of memory aborted the process (break-it pass).
[[noreturn]] void llvm_bad_alloc(void*, const char* reason, bool) {
  throw Error("compile", std::string("out of memory in MLIR/LLVM while building compiled "
                                     "code (") + reason + ")");
}
}  // namespace

void install_llvm_error_handler() {
  static std::once_flag once;
  std::call_once(once, [] {
    llvm::install_fatal_error_handler(llvm_fatal_error, nullptr);
    llvm::install_bad_alloc_error_handler(llvm_bad_alloc, nullptr);
  });
}

struct Graph::Impl {
  mlir::MLIRContext ctx;
  mlir::OwningOpRef<mlir::ModuleOp> module;
  mlir::func::FuncOp func;
  mlir::func::ReturnOp ret;
  std::vector<mlir::Value> values;  // Value::id -> MLIR value
  std::vector<ValueType> types;

  Impl() {
    install_llvm_error_handler();
    ctx.loadDialect<kiln::dialect::KilnDialect, mlir::func::FuncDialect>();
    mlir::OpBuilder b(&ctx);
    auto loc = b.getUnknownLoc();
    module = mlir::ModuleOp::create(loc);
    b.setInsertionPointToEnd(module->getBody());
    func = mlir::func::FuncOp::create(b, loc, "main", b.getFunctionType({}, {}));
    mlir::Block* entry = func.addEntryBlock();
    b.setInsertionPointToEnd(entry);
    ret = mlir::func::ReturnOp::create(b, loc);
  }

  void update_signature() {
    mlir::Builder b(&ctx);
    func.setFunctionType(b.getFunctionType(func.getBody().front().getArgumentTypes(),
                                           ret.getOperandTypes()));
  }

  mlir::Value get(Value v, const char* what) const {
    KILN_CHECK(v.id >= 0 && v.id < static_cast<int32_t>(values.size()), what, Loc::current(),
               "value %{} does not belong to this graph", v.id);
    return values[v.id];
  }

  Value add(mlir::Value v) {
    auto t = llvm::cast<mlir::RankedTensorType>(v.getType());
    ValueType vt;
    vt.dtype = *kiln::dialect::dtype_of(t.getElementType());
    for (int64_t s : t.getShape()) vt.shape.push_back(mlir::ShapedType::isDynamic(s) ? kDynamic : s);
    values.push_back(v);
    types.push_back(std::move(vt));
    return Value{static_cast<int32_t>(values.size() - 1)};
  }

  mlir::Location loc_of(Loc loc) {
    return mlir::FileLineColLoc::get(&ctx, loc.file_name(), loc.line(), loc.column());
  }

  // Runs `fn`, turning MLIR diagnostics into one kiln::Error.
  template <class F> void with_diagnostics(const char* what, F&& fn) {
    std::string messages;
    mlir::ScopedDiagnosticHandler handler(&ctx, [&](mlir::Diagnostic& d) {
      llvm::raw_string_ostream os(messages);
      os << d.getLocation() << ": " << d << "\n";
      return mlir::success();
    });
    if (mlir::failed(fn())) throw Error(what, messages.empty() ? "failed" : messages);
  }
};

bool supports(OpKind op) { return kiln::dialect::dialect_op_for(op) != nullptr; }

Graph::Graph() : impl_(std::make_unique<Impl>()) {}
Graph::~Graph() = default;
Graph::Graph(Graph&&) noexcept = default;
Graph& Graph::operator=(Graph&&) noexcept = default;

Value Graph::input(DType dtype, const std::vector<int64_t>& shape) {
  llvm::SmallVector<int64_t> dims;
  for (int64_t s : shape) {
    KILN_CHECK(s >= 0 || s == kDynamic, "input", Loc::current(), "invalid size {}", s);
    dims.push_back(s == kDynamic ? mlir::ShapedType::kDynamic : s);
  }
  auto type = mlir::RankedTensorType::get(dims, kiln::dialect::element_type(&impl_->ctx, dtype));
  mlir::Value arg = impl_->func.getBody().front().addArgument(type, impl_->func.getLoc());
  impl_->update_signature();
  return impl_->add(arg);
}

Value Graph::op(OpKind kind, const std::vector<Value>& inputs, const OpAttrs& attrs, Loc loc) {
  const char* name = op_info(kind).name.data();
  mlir::OpBuilder b(impl_->ret);  // insert before the return
  mlir::Location mloc = impl_->loc_of(loc);
  llvm::SmallVector<mlir::Value> operands;
  for (size_t i = 0; i < inputs.size(); ++i) {
    // layer_norm's weight and bias are optional (an invalid Value, as eager's undefined Tensor).
    bool optional = kind == OpKind::LayerNorm && i > 0;
    if (optional && !inputs[i].valid()) continue;
    if (optional && i == 2 && operands.size() == 1) {
      // Bias without weight: weight = ones (exact), since the operand list is positional.
      mlir::Type t = llvm::cast<mlir::RankedTensorType>(operands[0].getType()).getElementType();
      auto type = mlir::RankedTensorType::get(
          llvm::ArrayRef<int64_t>(attrs.dims.data(), attrs.dims.size()), t);
      operands.push_back(kiln::dialect::splat_constant(b, mloc, type, 1.0));
    }
    operands.push_back(impl_->get(inputs[i], name));
  }
  return impl_->add(kiln::dialect::create_op(b, mloc, kind, operands, attrs, loc));
}

Value Graph::constant(const Scalar& value, DType dtype) {
  mlir::MLIRContext* ctx = &impl_->ctx;
  mlir::Type et = kiln::dialect::element_type(ctx, dtype);
  auto type = mlir::RankedTensorType::get({}, et);
  mlir::Attribute element;
  if (is_floating(dtype)) {
    element = mlir::FloatAttr::get(et, value.to<double>());
  } else if (dtype == DType::Bool) {
    element = mlir::IntegerAttr::get(et, value.to<bool>() ? 1 : 0);
  } else {
    int64_t v = value.to<int64_t>();
    KILN_CHECK(!value.is_floating() || static_cast<double>(v) == value.to<double>(), "constant",
               Loc::current(), "{} is not an integer of dtype {}", value.to<double>(), name(dtype));
    KILN_CHECK(dtype != DType::Int32 || (v >= INT32_MIN && v <= INT32_MAX), "constant",
               Loc::current(), "{} does not fit dtype int32", v);
    element = mlir::IntegerAttr::get(et, v);
  }
  mlir::OpBuilder b(impl_->ret);
  auto op = kiln::dialect::ConstantOp::create(b, impl_->func.getLoc(), type,
                                              mlir::DenseElementsAttr::get(type, element));
  return impl_->add(op.getResult());
}

void Graph::output(Value v) {
  mlir::Value value = impl_->get(v, "output");
  impl_->ret->insertOperands(impl_->ret->getNumOperands(), value);
  impl_->update_signature();
}

const ValueType& Graph::type(Value v) const {
  impl_->get(v, "type");
  return impl_->types[v.id];
}

int Graph::num_inputs() const { return static_cast<int>(impl_->func.getNumArguments()); }
int Graph::num_outputs() const { return static_cast<int>(impl_->ret->getNumOperands()); }

std::string Graph::to_mlir(bool with_locations) const {
  std::string text;
  llvm::raw_string_ostream os(text);
  mlir::OpPrintingFlags flags;
  if (with_locations) flags.enableDebugInfo(/*enable=*/true, /*prettyForm=*/false);
  impl_->module->print(os, flags);
  return text;
}

void Graph::verify() const {
  impl_->with_diagnostics("verify", [&] { return mlir::verify(*impl_->module); });
}

void Graph::simplify() {
  impl_->with_diagnostics("simplify", [&] {
    mlir::PassManager pm(&impl_->ctx);
    pm.addPass(mlir::createCanonicalizerPass());
    pm.addPass(mlir::createCSEPass());
    return pm.run(*impl_->module);
  });
  // Results may have been replaced; refresh the handles of the outputs. Graph values other
  // than inputs and outputs are invalid after simplify().
  impl_->ret = llvm::cast<mlir::func::ReturnOp>(impl_->func.getBody().front().getTerminator());
}

mlir::ModuleOp GraphAccess::module(const Graph& g) { return *g.impl_->module; }

}  // namespace kiln::ir
