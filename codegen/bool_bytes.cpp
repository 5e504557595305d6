// Bool buffers as bytes at @main's boundary (see lower.h).
//
// kiln stores a bool as one byte. Left as memref<...xi1>, LLVM loads and stores each element
// with a scalar i1 access, which keeps the loop that reads it from vectorising: a dropout mask
// passed as bool made the digits MLP's compiled step 1.4x slower than a float mask. As i8, the
// load is a vector of bytes and the compare (or widening) fuses into the consumer's body.
#include "codegen/lower.h"
#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Linalg/IR/Linalg.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"

namespace kiln::codegen {
namespace {

bool is_bool_tensor(mlir::Type t) {
  auto rt = llvm::dyn_cast<mlir::RankedTensorType>(t);
  return rt && rt.getElementType().isInteger(1);
}

mlir::RankedTensorType with_element(mlir::RankedTensorType t, mlir::Type element) {
  return mlir::RankedTensorType::get(t.getShape(), element);
}

/// An elementwise linalg.generic from `in` to a tensor of `element` with the same (dynamic)
/// sizes, whose body is `convert(value)`.
mlir::Value convert_all(mlir::OpBuilder& b, mlir::Location loc, mlir::Value in, mlir::Type element,
                        llvm::function_ref<mlir::Value(mlir::OpBuilder&, mlir::Location, mlir::Value)> convert) {
  auto type = llvm::cast<mlir::RankedTensorType>(in.getType());
  llvm::SmallVector<mlir::Value> dyn;
  for (int64_t d = 0; d < type.getRank(); ++d)
    if (type.isDynamicDim(d)) dyn.push_back(mlir::tensor::DimOp::create(b, loc, in, d));
  mlir::Value init = mlir::tensor::EmptyOp::create(b, loc, type.getShape(), element, dyn);
  auto id = mlir::AffineMap::getMultiDimIdentityMap(type.getRank(), b.getContext());
  llvm::SmallVector<mlir::utils::IteratorType> iterators(type.getRank(),
                                                         mlir::utils::IteratorType::parallel);
  auto generic = mlir::linalg::GenericOp::create(
      b, loc, mlir::TypeRange{with_element(type, element)}, mlir::ValueRange{in},
      mlir::ValueRange{init}, llvm::SmallVector<mlir::AffineMap>{id, id}, iterators,
      [&](mlir::OpBuilder& nb, mlir::Location l, mlir::ValueRange args) {
        mlir::linalg::YieldOp::create(nb, l, convert(nb, l, args[0]));
      });
  return generic.getResult(0);
}

}  // namespace

void bools_as_bytes(mlir::func::FuncOp fn) {
  mlir::Block& body = fn.getBody().front();
  mlir::MLIRContext* ctx = fn.getContext();
  mlir::Type i8 = mlir::IntegerType::get(ctx, 8), i1 = mlir::IntegerType::get(ctx, 1);
  mlir::OpBuilder b(ctx);
  // Arguments: each use reads its own byte -> bool conversion, so that each conversion has one
  // use and fuses into its consumer (a shared one with several uses would be stored as i1).
  for (mlir::BlockArgument arg : body.getArguments()) {
    if (!is_bool_tensor(arg.getType())) continue;
    arg.setType(with_element(llvm::cast<mlir::RankedTensorType>(arg.getType()), i8));
    for (mlir::OpOperand& use : llvm::make_early_inc_range(arg.getUses())) {
      if (llvm::isa<mlir::tensor::DimOp>(use.getOwner())) continue;  // sizes are the same
      b.setInsertionPoint(use.getOwner());
      use.set(convert_all(b, arg.getLoc(), arg, i1, [&](mlir::OpBuilder& nb, mlir::Location l,
                                                         mlir::Value byte) -> mlir::Value {
        mlir::Value zero = mlir::arith::ConstantOp::create(nb, l, i8, nb.getIntegerAttr(i8, 0));
        return mlir::arith::CmpIOp::create(nb, l, mlir::arith::CmpIPredicate::ne, byte, zero);
      }));
    }
  }
  // Results: widened to a byte (0 or 1) right before the return.
  mlir::Operation* ret = body.getTerminator();
  b.setInsertionPoint(ret);
  for (mlir::OpOperand& r : ret->getOpOperands()) {
    if (!is_bool_tensor(r.get().getType())) continue;
    r.set(convert_all(b, ret->getLoc(), r.get(), i8,
                      [&](mlir::OpBuilder& nb, mlir::Location l, mlir::Value bit) -> mlir::Value {
                        return mlir::arith::ExtUIOp::create(nb, l, i8, bit);
                      }));
  }
  fn.setType(mlir::FunctionType::get(ctx, body.getArgumentTypes(), ret->getOperandTypes()));
}

}  // namespace kiln::codegen
