// Row splitting of compiled graphs over the thread pool: relaxation and analysis (row_split.h).
#include "codegen/row_split.h"

#include "core/error.h"
#include "ir/dialect.h"
#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Linalg/IR/Linalg.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "mlir/IR/Verifier.h"

namespace kiln::codegen {

namespace {

/// Whether view `v` of a value whose dim 0 becomes `?` keeps dim 0 in place (transpose or permute
/// of other dims; a view whose dim 0 is the input's); rewrites such a view's sizes to dim 0 = -1
/// (`in`, `out`: the static types before relaxation).
bool keeps_rows(kiln::dialect::ViewOp v, mlir::RankedTensorType in, mlir::RankedTensorType out) {
  int64_t r = in.getRank();
  auto wrap = [&](int64_t d) { return d < 0 ? d + r : d; };
  llvm::StringRef kind = v.getKind();
  if (kind == "transpose")
    return wrap(v.getDim().value_or(0)) != 0 && wrap(v.getDim1().value_or(0)) != 0;
  if (kind == "permute") return v.getDims() && !v.getDims()->empty() && wrap((*v.getDims())[0]) == 0;
  if (kind != "view" || !v.getDims() || out.getRank() == 0 || !out.hasStaticShape() ||
      out.getDimSize(0) != in.getDimSize(0))
    return false;
  llvm::SmallVector<int64_t> dims(out.getShape());  // any other -1 resolved
  dims[0] = -1;
  v.setDimsAttr(mlir::DenseI64ArrayAttr::get(v.getContext(), dims));
  return true;
}

}  // namespace

bool relax_leading_dim(mlir::ModuleOp m) {
  auto fn = m.lookupSymbol<mlir::func::FuncOp>("main");
  if (!fn || fn.getBody().empty()) return false;
  mlir::Block& body = fn.getBody().front();
  auto ret = llvm::dyn_cast<mlir::func::ReturnOp>(body.getTerminator());
  if (!ret || ret.getNumOperands() == 0) return false;
  auto out0 = llvm::cast<mlir::RankedTensorType>(ret.getOperand(0).getType());
  if (out0.getRank() == 0 || out0.isDynamicDim(0) || out0.getDimSize(0) <= 1) return false;
  int64_t rows = out0.getDimSize(0);
  for (mlir::Operation& op : body.without_terminator()) {
    if (!llvm::isa<kiln::dialect::ElementwiseOp, kiln::dialect::ReduceOp,
                   kiln::dialect::MatmulOp, kiln::dialect::ConstantOp,
                   kiln::dialect::CompositeOp, kiln::dialect::IndexOp,  // re-inferred like the others
                   kiln::dialect::ViewOp>(op))  // only of values that keep their type (below)
      return false;
    // index_add / index_copy / scatter_add write rows at indices: not split by rows, and their
    // indexed dim must stay static (codegen/lower_index.cpp).
    if (auto index = llvm::dyn_cast<kiln::dialect::IndexOp>(op);
        index && (index.getKind() == "index_add" || index.getKind() == "index_copy" ||
                  index.getKind() == "scatter_add"))
      return false;
  }

  llvm::DenseMap<mlir::Value, mlir::Type> before;  // the graph's own types
  for (mlir::BlockArgument a : body.getArguments()) before[a] = a.getType();
  for (mlir::Operation& op : body.without_terminator())
    for (mlir::Value r : op.getResults()) before[r] = r.getType();
  bool relaxed = false;
  for (mlir::BlockArgument a : body.getArguments()) {
    auto t = llvm::cast<mlir::RankedTensorType>(a.getType());
    if (t.getRank() == 0 || t.isDynamicDim(0) || t.getDimSize(0) != rows) continue;
    // An input that views read keeps its sizes (a [3E, E] in-projection weight when 3E = rows).
    if (llvm::any_of(a.getUsers(), [](mlir::Operation* u) {
          return llvm::isa<kiln::dialect::ViewOp>(u);
        }))
      continue;
    llvm::SmallVector<int64_t> shape(t.getShape());
    shape[0] = mlir::ShapedType::kDynamic;
    a.setType(mlir::RankedTensorType::get(shape, t.getElementType()));
    relaxed = true;
  }
  if (!relaxed) return false;
  try {
    for (mlir::Operation& op : body.without_terminator()) {
      if (llvm::isa<kiln::dialect::ConstantOp>(op)) continue;
      // A view carries sizes in its attributes: views of values without rows (a weight sliced
      // into q/k/v parts, transposed) stay, computed whole by every row block; views of values
      // with rows only when they keep dim 0 (attention's heads: x.view(B, T, H, D).transpose(1,
      // 2)), a view's dim 0 then becoming -1.
      if (auto view = llvm::dyn_cast<kiln::dialect::ViewOp>(op);
          view && view.getInput().getType() != before[view.getInput()] &&
          !keeps_rows(view, llvm::cast<mlir::RankedTensorType>(before[view.getInput()]),
                      llvm::cast<mlir::RankedTensorType>(before[view.getResult()])))
        return false;
      auto kind = kiln::dialect::op_kind_from_name(
          op.getAttrOfType<mlir::StringAttr>("kind").getValue());
      if (!kind) return false;
      llvm::SmallVector<mlir::RankedTensorType> types;
      for (mlir::Value v : op.getOperands())
        types.push_back(llvm::cast<mlir::RankedTensorType>(v.getType()));
      auto results = kiln::dialect::infer_result_types(
          m.getContext(), *kind, types, kiln::dialect::attrs_from_op(*kind, &op));
      if (results.size() != op.getNumResults()) return false;
      for (auto [r, t] : llvm::zip(op.getResults(), results)) r.setType(t);
    }
  } catch (const Error&) {
    return false;
  }
  fn.setType(mlir::FunctionType::get(m.getContext(), body.getArgumentTypes(),
                                     ret.getOperandTypes()));
  return mlir::succeeded(mlir::verify(m));
}

namespace {

enum class Rows { kNone, kYes, kInit };  // kInit: tensor.empty, an init of either kind

/// How an operand's indexing map uses loop d0: as its dim 0 only (rows), not at all (whole), or
/// otherwise (not splittable).
std::optional<bool> map_uses_rows(mlir::AffineMap map) {
  bool uses = false;
  for (unsigned i = 0; i < map.getNumResults(); ++i) {
    bool here = map.getResult(i).isFunctionOfDim(0);
    if (here && !(i == 0 && map.getResult(0) == mlir::getAffineDimExpr(0, map.getContext())))
      return std::nullopt;
    uses |= here;
  }
  return uses;
}

bool first_group_is_dim0(llvm::ArrayRef<mlir::ReassociationIndices> groups) {
  return !groups.empty() && groups[0].size() == 1 && groups[0][0] == 0;
}

bool has_dynamic_rows(mlir::Value v) {
  auto t = llvm::cast<mlir::RankedTensorType>(v.getType());
  return t.getRank() > 0 && t.isDynamicDim(0);
}

/// Values whose dim 0 is known to be the same size (up to a collapse's factor): a loop nest's
/// row loop runs over all its operands and results read by rows, so they must be. Two `?` dims
/// joined by no nest may differ at run time: [s - 1, ...] and [s, ...] of a traced function.
class RowClasses {
 public:
  void join(mlir::Value a, mlir::Value b) { parent_[root(a)] = root(b); }
  bool same(mlir::Value a, mlir::Value b) { return root(a) == root(b); }

 private:
  mlir::Value root(mlir::Value v) {
    auto it = parent_.find(v);
    if (it == parent_.end() || it->second == v) return v;
    mlir::Value r = root(it->second);
    parent_[v] = r;
    return r;
  }
  llvm::DenseMap<mlir::Value, mlir::Value> parent_;
};

// Whether size `v` (a row count) is used only as the rows of new tensors: dim 0 of a
// tensor.empty, or of a tensor.expand_shape's result, directly or through integer arithmetic
// (a collapse's rows * T).
bool sizes_rows_only(mlir::Value v) {
  for (mlir::OpOperand& use : v.getUses()) {
    mlir::Operation* user = use.getOwner();
    if (auto empty = llvm::dyn_cast<mlir::tensor::EmptyOp>(user)) {
      auto t = llvm::cast<mlir::RankedTensorType>(empty.getType());
      if (!t.isDynamicDim(0) || use.getOperandNumber() != 0) return false;
    } else if (auto expand = llvm::dyn_cast<mlir::tensor::ExpandShapeOp>(user)) {
      auto t = llvm::cast<mlir::RankedTensorType>(expand.getType());
      // output_shape's dynamic sizes follow the source operand: the first is dim 0's.
      if (!t.isDynamicDim(0) || use.getOperandNumber() != 1) return false;
    } else if (llvm::isa<mlir::arith::MulIOp, mlir::arith::DivUIOp, mlir::arith::DivSIOp>(user)) {
      if (!sizes_rows_only(user->getResult(0))) return false;
    } else {
      return false;
    }
  }
  return true;
}

}  // namespace

RowSplitPlan plan_row_split(mlir::func::FuncOp fn, const std::vector<bool>& equal_rows) {
  RowSplitPlan plan;
  RowClasses classes;
  mlir::Block& body = fn.getBody().front();
  llvm::DenseMap<mlir::Value, Rows> rows;  // what is known of each tensor value
  // Arguments: sliced when any use reads them by rows (checked for consistency below).
  for (mlir::BlockArgument a : body.getArguments()) {
    auto t = llvm::cast<mlir::RankedTensorType>(a.getType());
    if (t.getRank() == 0 || !t.isDynamicDim(0)) {
      // Cannot carry rows (they are `?`): passed whole. Any read by rows is rejected below;
      // reads through a view's map (a weight's slice: d0 + 32) are loop nests without rows.
      rows[a] = Rows::kNone;
      plan.sliced_input.push_back(false);
      continue;
    }
    bool by_rows = false;
    for (mlir::OpOperand& use : a.getUses()) {
      mlir::Operation* user = use.getOwner();
      if (llvm::isa<mlir::func::ReturnOp>(user)) by_rows = true;
      if (auto linalg = llvm::dyn_cast<mlir::linalg::LinalgOp>(user)) {
        auto uses = map_uses_rows(linalg.getMatchingIndexingMap(&use));
        if (!uses) return plan;
        by_rows |= *uses;
      }
      if (llvm::isa<mlir::tensor::ExpandShapeOp, mlir::tensor::CollapseShapeOp>(user))
        by_rows = true;
    }
    rows[a] = by_rows ? Rows::kYes : Rows::kNone;
    plan.sliced_input.push_back(by_rows);
  }
  mlir::Value known_equal;  // the first argument of `equal_rows`
  for (mlir::BlockArgument a : body.getArguments()) {
    if (a.getArgNumber() >= equal_rows.size() || !equal_rows[a.getArgNumber()]) continue;
    if (known_equal) classes.join(a, known_equal);
    else known_equal = a;
  }
  auto kind_of = [&](mlir::Value v) {
    auto it = rows.find(v);
    return it == rows.end() ? std::optional<Rows>() : std::optional<Rows>(it->second);
  };
  // Rows of a value per row of the block (1 but after a collapse of the leading dims).
  llvm::DenseMap<mlir::Value, int64_t> per_row;
  auto multiplier = [&](mlir::Value v) {
    auto it = per_row.find(v);
    return it == per_row.end() ? int64_t{1} : it->second;
  };
  for (mlir::Operation& op : body) {
    if (llvm::isa<mlir::tensor::EmptyOp>(op)) {
      rows[op.getResult(0)] = Rows::kInit;
      continue;
    }
    if (llvm::isa<mlir::arith::ConstantOp>(op)) {  // read whole by every block
      rows[op.getResult(0)] = Rows::kNone;
      continue;
    }
    if (auto dim = llvm::dyn_cast<mlir::tensor::DimOp>(op)) {
      // Dim 0 of a sliced value is the block's rows: it may size only results' rows. The rows
      // of a value passed whole, or rows sizing another dim, do not follow the block: a graph
      // whose only read of x [?, 1, 1] was x.size(0) (x + x.t() folded to a constant) filled
      // [n, 1, n] into each block of rows, and overran it (kiln-fuzz --large).
      std::optional<int64_t> d = dim.getConstantIndex();
      if (!d) return plan;
      if (*d == 0 && has_dynamic_rows(dim.getSource()) &&
          (kind_of(dim.getSource()) != Rows::kYes || !sizes_rows_only(dim.getResult())))
        return plan;
      continue;
    }
    if (auto slice = llvm::dyn_cast<mlir::tensor::ExtractSliceOp>(op)) {
      // A prefix of a value without rows (lower.cpp's slices from 0): read whole by every block.
      if (kind_of(slice.getSource()) != Rows::kNone) return plan;
      rows[slice.getResult()] = Rows::kNone;
      continue;
    }
    if (auto ret = llvm::dyn_cast<mlir::func::ReturnOp>(op)) {
      for (mlir::Value v : ret.getOperands())
        if (kind_of(v) != Rows::kYes || multiplier(v) != 1) return plan;
      // Every block's rows are rows of each result and of each argument sliced.
      llvm::SmallVector<mlir::Value> row_values(ret.getOperands());
      for (mlir::BlockArgument a : body.getArguments())
        if (rows[a] == Rows::kYes) row_values.push_back(a);
      for (mlir::Value v : row_values)
        if (!classes.same(v, row_values.front())) return plan;
      continue;
    }
    if (llvm::isa<mlir::tensor::ExpandShapeOp, mlir::tensor::CollapseShapeOp>(op)) {
      bool expand = llvm::isa<mlir::tensor::ExpandShapeOp>(op);
      auto groups = expand ? llvm::cast<mlir::tensor::ExpandShapeOp>(op).getReassociationIndices()
                           : llvm::cast<mlir::tensor::CollapseShapeOp>(op).getReassociationIndices();
      auto src = kind_of(op.getOperand(0));
      if (!src) return plan;
      rows[op.getResult(0)] = *src;
      classes.join(op.getResult(0), op.getOperand(0));
      if (*src == Rows::kInit) continue;  // lower.cpp's GEMM init: the output's empty, collapsed
      if (first_group_is_dim0(groups)) {
        if (*src == Rows::kYes && !has_dynamic_rows(op.getResult(0))) return plan;
        per_row[op.getResult(0)] = multiplier(op.getOperand(0));
        continue;
      }
      // The leading dims collapsed into one (lower.cpp's x [?, T, K] -> [? * T, K] before a
      // GEMM) or expanded back: each block row is `multiplier` rows of the value. Static inner
      // dims only, and an expand must divide exactly what a collapse multiplied.
      if (*src != Rows::kYes || groups.empty() || groups[0][0] != 0 ||
          !has_dynamic_rows(op.getResult(0)))
        return plan;
      auto shaped = llvm::cast<mlir::RankedTensorType>(expand ? op.getResult(0).getType()
                                                              : op.getOperand(0).getType());
      int64_t inner = 1;
      for (size_t i = 1; i < groups[0].size(); ++i) {
        if (shaped.isDynamicDim(groups[0][i])) return plan;
        inner *= shaped.getDimSize(groups[0][i]);
      }
      int64_t mult = multiplier(op.getOperand(0));
      if (expand && (inner == 0 || mult % inner != 0)) return plan;
      per_row[op.getResult(0)] = expand ? mult / inner : mult * inner;
      continue;
    }
    auto linalg = llvm::dyn_cast<mlir::linalg::LinalgOp>(op);
    plan.gemm |= llvm::isa<mlir::linalg::MatmulOp, mlir::linalg::BatchMatmulOp>(op);
    // A loop nest over values without rows only (a weight's transpose or slice) with static
    // results: every block computes it whole (it cannot carry rows: those are `?`).
    if (linalg && llvm::none_of(op.getResults(), has_dynamic_rows) &&
        llvm::all_of(op.getOpOperands(), [&](mlir::OpOperand& operand) {
          if (!llvm::isa<mlir::RankedTensorType>(operand.get().getType())) return true;
          auto known = kind_of(operand.get());
          return known && (*known == Rows::kNone ||
                           (*known == Rows::kInit && linalg.isDpsInit(&operand)));
        })) {
      for (mlir::Value r : op.getResults()) rows[r] = Rows::kNone;
      continue;
    }
    if (!linalg || linalg.getNumLoops() == 0 ||
        linalg.getIteratorTypesArray()[0] != mlir::utils::IteratorType::parallel)
      return plan;
    // The loop body must not read the row index: in a block it would count from the block's start.
    bool reads_row_index = false;
    op.walk([&](mlir::linalg::IndexOp index) { reads_row_index |= index.getDim() == 0; });
    if (reads_row_index) return plan;
    std::optional<int64_t> mult;  // every operand read by rows: the same rows per block row
    for (mlir::OpOperand& operand : op.getOpOperands()) {
      if (!llvm::isa<mlir::RankedTensorType>(operand.get().getType())) continue;  // scalars
      auto uses = map_uses_rows(linalg.getMatchingIndexingMap(&operand));
      auto known = kind_of(operand.get());
      if (!uses || !known) return plan;
      bool is_init = linalg.isDpsInit(&operand);
      if (is_init && !*uses) return plan;  // every result must carry rows
      if (*known != Rows::kInit && (*known == Rows::kYes) != *uses) return plan;
      if (*known == Rows::kYes && !is_init) {  // inits follow their sizes (tensor.dim of inputs)
        if (mult && *mult != multiplier(operand.get())) return plan;
        mult = multiplier(operand.get());
      }
      if (*uses && op.getNumResults() > 0) classes.join(operand.get(), op.getResult(0));
    }
    for (mlir::Value r : op.getResults()) {
      classes.join(r, op.getResult(0));
      if (!has_dynamic_rows(r)) return plan;  // a static size would not follow the block
      rows[r] = Rows::kYes;
      if (mult && *mult != 1) per_row[r] = *mult;
    }
  }
  plan.splittable = true;
  return plan;
}

}  // namespace kiln::codegen
