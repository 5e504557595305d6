// Row intermediates recomputed where they are read (row_fusion.h, recompute_row_intermediates).
#include <optional>

#include "codegen/row_fusion.h"
#include "llvm/ADT/DenseSet.h"
#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/IR/IRMapping.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"
#include "mlir/Interfaces/ViewLikeInterface.h"
#include "mlir/Pass/Pass.h"

namespace kiln::codegen {
namespace {

/// Pure ops of a stored value's computation (its loads not counted) that each reader repeats:
/// dropout's backward (a mask compare, a select or two multiplies) fits.
constexpr size_t kMaxRecomputedOps = 8;

/// The allocation or function argument `m` is a view of; null for anything else.
mlir::Value buffer_root(mlir::Value m) {
  while (auto view = m.getDefiningOp<mlir::ViewLikeOpInterface>()) m = view.getViewSource();
  auto arg = llvm::dyn_cast<mlir::BlockArgument>(m);
  if (arg && arg.getOwner()->isEntryBlock() &&
      llvm::isa<mlir::func::FuncOp>(arg.getOwner()->getParentOp()))
    return m;
  if (m.getDefiningOp<mlir::memref::AllocOp>()) return m;
  return {};
}

bool is_function_argument(mlir::Value root) { return llvm::isa<mlir::BlockArgument>(root); }

/// A function argument not marked llvm.noalias: it may be another argument's buffer too.
bool may_alias_arguments(mlir::Value root) {
  auto arg = llvm::dyn_cast<mlir::BlockArgument>(root);
  if (!arg) return false;
  auto fn = llvm::cast<mlir::func::FuncOp>(arg.getOwner()->getParentOp());
  return !fn.getArgAttr(arg.getArgNumber(), "llvm.noalias");
}

/// Whether `op` itself may write memory (loops and ifs count by what they hold, walked apart).
bool may_write(mlir::Operation* op) {
  return !llvm::isa<mlir::memref::LoadOp>(op) &&
         !op->hasTrait<mlir::OpTrait::HasRecursiveMemoryEffects>() &&
         !mlir::isMemoryEffectFree(op);
}

/// The buffers (roots) that ops inside `loop` other than `except` write; nullopt when one
/// writes something unknown (a buffer without a root, or an op whose writes are not stores).
std::optional<llvm::SmallDenseSet<mlir::Value, 8>> written_roots(mlir::scf::ParallelOp loop,
                                                                mlir::Operation* except) {
  llvm::SmallDenseSet<mlir::Value, 8> roots;
  bool known = true;
  loop.walk([&](mlir::Operation* op) {
    if (op == except || !may_write(op)) return;
    mlir::Value memref;
    if (auto s = llvm::dyn_cast<mlir::memref::StoreOp>(op)) memref = s.getMemRef();
    if (auto a = llvm::dyn_cast<mlir::memref::AtomicRMWOp>(op)) memref = a.getMemref();
    if (auto a = llvm::dyn_cast<mlir::memref::GenericAtomicRMWOp>(op)) memref = a.getMemref();
    mlir::Value root = memref ? buffer_root(memref) : mlir::Value();
    if (root) roots.insert(root);
    else known = false;
  });
  if (!known) return std::nullopt;
  return roots;
}

/// A buffer that one column loop of a row loop stores and later loops of the same row only
/// load, with what it takes to compute each loaded element again.
struct RowIntermediate {
  mlir::memref::AllocOp alloc;
  mlir::memref::StoreOp store;
  mlir::scf::ForOp column_loop;
  unsigned column_dim = 0;                       // the index the column loop's IV addresses
  llvm::SmallVector<mlir::memref::LoadOp> loads;  // in later loops of the row
  llvm::SmallVector<mlir::Operation*> slice;      // the stored value's ops, in order
};

/// The top-level parallel loop (a direct child of the function's body) that holds `op`.
mlir::scf::ParallelOp top_level_loop(mlir::Operation* op, mlir::Block& body) {
  mlir::Operation* top = body.findAncestorOpInBlock(*op);
  return top ? llvm::dyn_cast<mlir::scf::ParallelOp>(top) : mlir::scf::ParallelOp();
}

/// The element bytes of a memref (0 for non-scalar elements).
unsigned element_bytes(mlir::Value memref) {
  mlir::Type t = llvm::cast<mlir::MemRefType>(memref.getType()).getElementType();
  return t.isIntOrFloat() ? (t.getIntOrFloatBitWidth() + 7) / 8 : 0;
}

/// Whether `alloc` is a row intermediate (see recompute_row_intermediates) that can be computed
/// again at each of its loads.
std::optional<RowIntermediate> match(mlir::memref::AllocOp alloc, mlir::Block& body) {
  RowIntermediate r;
  r.alloc = alloc;
  mlir::scf::ParallelOp row_loop;
  for (mlir::Operation* user : alloc->getUsers()) {
    if (llvm::isa<mlir::memref::DeallocOp>(user)) continue;
    auto load = llvm::dyn_cast<mlir::memref::LoadOp>(user);
    auto store = llvm::dyn_cast<mlir::memref::StoreOp>(user);
    if (!load && !store) return std::nullopt;
    if (store && (r.store || store.getValueToStore() == alloc.getResult())) return std::nullopt;
    mlir::scf::ParallelOp p = top_level_loop(user, body);
    if (!p || (row_loop && p != row_loop)) return std::nullopt;
    row_loop = p;
    if (store) r.store = store;
    else r.loads.push_back(load);
  }
  if (!r.store || r.loads.empty()) return std::nullopt;
  // The store: directly in a column loop (from 0, step 1) directly in the row loop's body, at
  // the row loop's IVs (each of them, so no other row writes the element), the column loop's IV
  // (once) and constants; the column loop covers the whole dim.
  r.column_loop = llvm::dyn_cast<mlir::scf::ForOp>(r.store->getParentOp());
  if (!r.column_loop || r.column_loop->getParentOp() != row_loop.getOperation() ||
      !mlir::isConstantIntValue(r.column_loop.getLowerBound(), 0) ||
      !mlir::isConstantIntValue(r.column_loop.getStep(), 1))
    return std::nullopt;
  mlir::Value column = r.column_loop.getInductionVar();
  mlir::ValueRange indices = r.store.getIndices();
  unsigned columns = 0;
  llvm::SmallPtrSet<void*, 4> rows;
  for (auto [d, index] : llvm::enumerate(indices)) {
    if (index == column) {
      r.column_dim = d;
      ++columns;
    } else if (llvm::is_contained(row_loop.getInductionVars(), index)) {
      rows.insert(index.getAsOpaquePointer());
    } else if (!mlir::getConstantIntValue(index)) {
      return std::nullopt;
    }
  }
  if (columns != 1 || rows.size() != row_loop.getNumLoops()) return std::nullopt;
  mlir::MemRefType type = alloc.getType();
  mlir::Value upper = r.column_loop.getUpperBound();
  if (type.isDynamicDim(r.column_dim)
          ? alloc.getDynamicSizes()[type.getDynamicDimIndex(r.column_dim)] != upper
          : !mlir::isConstantIntValue(upper, type.getDimSize(r.column_dim)))
    return std::nullopt;
  // Each load: in a loop of the row after the column loop, at the store's indices but the
  // column's.
  mlir::Block* row_body = row_loop.getBody();
  for (mlir::memref::LoadOp load : r.loads) {
    mlir::Operation* top = row_body->findAncestorOpInBlock(*load);
    if (!top || top == r.column_loop.getOperation() || !r.column_loop->isBeforeInBlock(top))
      return std::nullopt;
    for (auto [d, index] : llvm::enumerate(load.getIndices()))
      if (d != r.column_dim && index != indices[d] &&
          !(mlir::getConstantIntValue(index) &&
            mlir::getConstantIntValue(index) == mlir::getConstantIntValue(indices[d])))
        return std::nullopt;
  }
  // The stored value's computation: pure ops (no math functions: each reader repeats them) and
  // loads of buffers nothing in the row loop writes, all directly in the column loop's body,
  // from its IV and values defined before it.
  auto written = written_roots(row_loop, r.store);
  if (!written) return std::nullopt;
  // Outputs marked llvm.noalias are buffers of their own; other written arguments may be a
  // loaded argument under another name.
  const bool writes_arguments = llvm::any_of(*written, may_alias_arguments);
  llvm::SmallPtrSet<mlir::Operation*, 16> in_slice;
  llvm::SmallVector<mlir::Value> pending{r.store.getValueToStore()};
  unsigned load_bytes = 0;
  size_t pure_ops = 0;
  mlir::Block* column_body = r.column_loop.getBody();
  while (!pending.empty()) {
    mlir::Value v = pending.pop_back_val();
    if (auto arg = llvm::dyn_cast<mlir::BlockArgument>(v)) {
      if (arg.getOwner() == column_body && v != column) return std::nullopt;  // an iter_arg
      continue;
    }
    mlir::Operation* def = v.getDefiningOp();
    if (def->getBlock() != column_body) {
      if (r.column_loop->isAncestor(def)) return std::nullopt;  // inside a nested region
      continue;  // defined before the column loop: it dominates the later loops too
    }
    if (!in_slice.insert(def).second) continue;
    if (auto load = llvm::dyn_cast<mlir::memref::LoadOp>(def)) {
      mlir::Value root = buffer_root(load.getMemRef());
      if (!root || root == alloc.getResult() || written->contains(root) ||
          (is_function_argument(root) && writes_arguments))
        return std::nullopt;
      load_bytes += element_bytes(load.getMemRef());
    } else if (!mlir::isMemoryEffectFree(def) || def->getNumRegions() != 0 ||
               def->getDialect()->getNamespace() == "math" || ++pure_ops > kMaxRecomputedOps) {
      return std::nullopt;
    }
    for (mlir::Value operand : def->getOperands()) pending.push_back(operand);
  }
  // Readers load the inputs again, from cache when the row was just read; the element itself
  // is then never stored. Inputs of more than twice its bytes could cost more than they save
  // when rows outgrow the cache.
  if (load_bytes > 2 * element_bytes(alloc.getResult())) return std::nullopt;
  for (mlir::Operation& op : *column_body)
    if (in_slice.contains(&op)) r.slice.push_back(&op);
  return r;
}

/// Whether `loop` has no results and writes nothing: it can go.
bool dead_loop(mlir::scf::ForOp loop) {
  if (loop->getNumResults() != 0) return false;
  bool writes = false;
  loop.walk([&](mlir::Operation* op) { writes |= may_write(op); });
  return !writes;
}

void recompute(RowIntermediate& r) {
  for (mlir::memref::LoadOp load : r.loads) {
    mlir::OpBuilder b(load);
    mlir::IRMapping map;
    map.map(r.column_loop.getInductionVar(), load.getIndices()[r.column_dim]);
    for (mlir::Operation* op : r.slice) b.clone(*op, map);
    load.replaceAllUsesWith(map.lookupOrDefault(r.store.getValueToStore()));
    load.erase();
  }
  r.store.erase();
  if (dead_loop(r.column_loop)) r.column_loop.erase();
  for (mlir::Operation* user : llvm::to_vector(r.alloc->getUsers())) user->erase();  // deallocs
  r.alloc.erase();
}

/// kiln-gpu-row-recompute: recompute_row_intermediates on every function, for lit tests
/// (tests/ir/gpu-row-recompute.mlir).
struct RowRecomputePass
    : mlir::PassWrapper<RowRecomputePass, mlir::OperationPass<mlir::func::FuncOp>> {
  MLIR_DEFINE_EXPLICIT_INTERNAL_INLINE_TYPE_ID(RowRecomputePass)
  llvm::StringRef getArgument() const override { return "kiln-gpu-row-recompute"; }
  llvm::StringRef getDescription() const override {
    return "compute a row loop's intermediates again where later loops of the row read them, "
           "instead of storing them (codegen/row_recompute.cpp)";
  }
  void runOnOperation() override {
    if (!getOperation().isExternal()) recompute_row_intermediates(getOperation());
  }
};

}  // namespace

int recompute_row_intermediates(mlir::func::FuncOp fn) {
  mlir::Block& body = fn.getBody().front();
  int removed = 0;
  // Again until none is left: an intermediate computed from another matches only once the
  // other is recomputed (it then loads the other's inputs, which nothing writes).
  for (bool again = true; again;) {
    again = false;
    for (auto alloc : llvm::to_vector(body.getOps<mlir::memref::AllocOp>()))
      if (auto r = match(alloc, body)) {
        recompute(*r);
        ++removed;
        again = true;
      }
  }
  return removed;
}

void register_gpu_row_recompute_pass(mlir::DialectRegistry& registry) {
  registry.insert<mlir::scf::SCFDialect, mlir::memref::MemRefDialect>();
  mlir::PassRegistration<RowRecomputePass>();
}

}  // namespace kiln::codegen
