// Buffer donation: outputs computed in an input's buffer (codegen/in_place.h).
#include "codegen/in_place.h"

#include "codegen/lower.h"
#include "llvm/ADT/SmallPtrSet.h"
#include "mlir/Dialect/Bufferization/IR/Bufferization.h"
#include "mlir/Dialect/Linalg/IR/Linalg.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"

namespace kiln::codegen {
namespace {

// Whether every use of `input`'s buffer other than `writer`'s own operand comes before `writer`
// in `body`. A linalg op only reads its input operands; any other op's tensor results may
// share the buffer (a view, a reshape, the result of a destination operand) and are followed.
bool only_read_before(mlir::Block* body, mlir::Operation* writer, mlir::BlockArgument input) {
  llvm::SmallVector<mlir::Value> work{input};
  llvm::SmallPtrSet<mlir::Value, 8> seen;
  seen.insert(input);
  while (!work.empty()) {
    mlir::Value v = work.pop_back_val();
    for (mlir::OpOperand& use : v.getUses()) {
      mlir::Operation* user = use.getOwner();
      if (user == writer) {
        if (v != input) return false;  // a view of the input, read in another order
        continue;
      }
      mlir::Operation* top = body->findAncestorOpInBlock(*user);
      if (!top || !top->isBeforeInBlock(writer)) return false;  // read by or after the writer
      auto linalg = llvm::dyn_cast<mlir::linalg::LinalgOp>(user);
      if (linalg && linalg.isDpsInput(&use)) continue;
      for (mlir::Value r : user->getResults())
        if (llvm::isa<mlir::TensorType>(r.getType()) && seen.insert(r).second) work.push_back(r);
    }
  }
  return true;
}

// Whether `loop` is the outermost loop of a scatter nest (index_add, index_copy, scatter_add:
// lower_index.cpp) in `body` whose result `res` starts from `input` itself: bufferization then
// writes the loops' updates into the input's buffer when nothing reads the input afterwards.
bool scatter_from_input(mlir::Block* body, mlir::OpResult res, mlir::BlockArgument input) {
  auto loop = llvm::dyn_cast<mlir::scf::ForOp>(res.getOwner());
  return loop && loop->getBlock() == body && loop->hasAttr(kScatterLoopAttr) &&
         loop.getInitArgs()[res.getResultNumber()] == input;
}

bool safe_in_place(mlir::func::FuncOp fn, mlir::Value result, mlir::BlockArgument input) {
  mlir::Block* body = &fn.getBody().front();
  auto res = llvm::dyn_cast<mlir::OpResult>(result);
  if (!res || result.getType() != input.getType() ||
      !llvm::isa<mlir::RankedTensorType>(input.getType()))
    return false;
  if (scatter_from_input(body, res, input)) return only_read_before(body, res.getOwner(), input);
  auto generic = llvm::dyn_cast<mlir::linalg::GenericOp>(res.getOwner());
  if (!generic || generic->getBlock() != body ||
      generic.getNumLoops() != generic.getNumParallelLoops())
    return false;
  // The result's init is a fresh tensor.empty the body does not read: a computed init would
  // let eliminate-empty-tensors move the write into the input's buffer to the op computing it,
  // before reads this check orders after the generic.
  mlir::OpOperand* init = generic.getDpsInitOperand(res.getResultNumber());
  if (!generic.getMatchingIndexingMap(init).isIdentity() ||
      !init->get().getDefiningOp<mlir::tensor::EmptyOp>() ||
      generic.payloadUsesValueFromOperand(init))
    return false;
  for (mlir::OpOperand& o : generic->getOpOperands())
    if (o.get() == input &&
        (generic.isDpsInit(&o) || !generic.getMatchingIndexingMap(&o).isIdentity()))
      return false;
  return only_read_before(body, generic, input);
}

}  // namespace

std::vector<std::pair<int, int>> in_place_pairs(mlir::func::FuncOp fn,
                                                const std::vector<std::pair<int, int>>& requested) {
  std::vector<std::pair<int, int>> out;
  mlir::Block& body = fn.getBody().front();
  auto ret = llvm::cast<mlir::func::ReturnOp>(body.getTerminator());
  const int outputs = static_cast<int>(ret.getNumOperands());
  const int inputs = static_cast<int>(body.getNumArguments());
  for (auto [output, input] : requested) {
    if (output < 0 || output >= outputs || input < 0 || input >= inputs) continue;
    bool taken = false;
    for (auto [o, i] : out) taken = taken || o == output || i == input;
    if (!taken && safe_in_place(fn, ret.getOperand(output), body.getArgument(input)))
      out.push_back({output, input});
  }
  return out;
}

mlir::Value donated_buffer(mlir::func::FuncOp fn, int input) {
  mlir::Block& body = fn.getBody().front();
  mlir::BlockArgument arg = body.getArgument(input);
  auto tensor = llvm::cast<mlir::RankedTensorType>(arg.getType());
  arg.setType(mlir::MemRefType::get(tensor.getShape(), tensor.getElementType()));
  mlir::OpBuilder b = mlir::OpBuilder::atBlockBegin(&body);
  // restrict: the analysis may take the buffer as the tensor's own. The output's destination
  // is a second view of the same memref, written only where in_place_pairs found it safe.
  // writable: a scatter nest starting from the input updates it in place (nothing reads it
  // after the nest), leaving no copy (tests/codegen/in_place_test.cpp counts them).
  auto read = mlir::bufferization::ToTensorOp::create(b, arg.getLoc(), tensor, arg,
                                                      /*restrict=*/true, /*writable=*/true);
  arg.replaceAllUsesExcept(read.getResult(), read);
  return arg;
}

}  // namespace kiln::codegen
