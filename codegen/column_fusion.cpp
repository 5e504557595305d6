// Column loops of a CPU row merged (row_fusion.h, fuse_column_loops).
#include "codegen/row_fusion.h"
#include "llvm/ADT/DenseMap.h"
#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/LLVMIR/LLVMAttrs.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

namespace kiln::codegen {
namespace {

bool same_bound(mlir::Value x, mlir::Value y) {
  auto cx = mlir::getConstantIntValue(x), cy = mlir::getConstantIntValue(y);
  return x == y || (cx && cy && *cx == *cy);
}

/// A combining op LLVM's vectorizer turns into a vector reduction: integer ones, min/max, and
/// float additions it may reassociate (lower.cpp marks sums `reassoc`; a product or an ordered
/// sum stays serial).
bool vector_reduction(mlir::Operation* op) {
  if (auto add = llvm::dyn_cast<mlir::arith::AddFOp>(op))
    return mlir::arith::bitEnumContainsAll(add.getFastmath(), mlir::arith::FastMathFlags::reassoc);
  return llvm::isa<mlir::arith::MaximumFOp, mlir::arith::MinimumFOp, mlir::arith::MaxNumFOp,
                   mlir::arith::MinNumFOp, mlir::arith::AddIOp, mlir::arith::MaxSIOp,
                   mlir::arith::MinSIOp, mlir::arith::MaxUIOp, mlir::arith::MinUIOp,
                   mlir::arith::OrIOp, mlir::arith::AndIOp, mlir::arith::XOrIOp>(op);
}

/// Whether `f` is a column loop fusion handles: no results; a body of loads, stores and pure
/// ops without regions; each element it writes either at the loop's index (a column buffer) or
/// an accumulator (a store at indices without it, in an allocation, which LLVM keeps in a
/// register) of a vector reduction of a load of the same element, so that the loop stays
/// vectorizable when another joins it.
bool plain_column_loop(mlir::scf::ForOp f) {
  if (f.getNumResults() != 0) return false;
  mlir::Value iv = f.getInductionVar();
  for (mlir::Operation& op : f.getBody()->without_terminator()) {
    if (auto store = llvm::dyn_cast<mlir::memref::StoreOp>(op)) {
      if (llvm::is_contained(store.getIndices(), iv)) continue;
      // Only the store uses the running value, and only the combine the loaded one (a running
      // sum stored in each column, a cumulative sum, is no reduction LLVM vectorizes).
      mlir::Operation* combine = store.getValue().getDefiningOp();
      if (!combine || combine->getBlock() != f.getBody() || !vector_reduction(combine) ||
          !combine->hasOneUse())
        return false;
      const bool of_element = llvm::any_of(combine->getOperands(), [&](mlir::Value v) {
        auto load = v.getDefiningOp<mlir::memref::LoadOp>();
        return load && load->hasOneUse() && load.getMemRef() == store.getMemRef() &&
               llvm::equal(load.getIndices(), store.getIndices());
      });
      // An output's element stays in memory: LLVM cannot tell it apart from the other
      // arguments the merged loop stores to (their noalias does not reach the LLVM IR).
      if (!of_element || !store.getMemRef().getDefiningOp<mlir::memref::AllocOp>()) return false;
      continue;
    }
    if (llvm::isa<mlir::memref::LoadOp>(op)) continue;
    if (op.getNumRegions() != 0 || !mlir::isMemoryEffectFree(&op)) return false;
  }
  return true;
}

/// Whether running `b`'s body right after `a`'s in each iteration keeps every value: each
/// buffer either writes is an allocation or an output argument (noalias) without views in
/// them, and one accessed by both is accessed everywhere in them at the same indices, the loop's
/// own index among them (the other indices from outside both): iteration j of either touches
/// only element j of it, which the other touches only in its iteration j.
bool independent_columns(mlir::scf::ForOp a, mlir::scf::ForOp b) {
  auto inside = [&](mlir::Operation* op) { return a->isAncestor(op) || b->isAncestor(op); };
  llvm::DenseMap<mlir::Value, int> written;  // 1: by a, 2: by b, 3: by both
  llvm::DenseMap<mlir::Value, int> accessed;
  for (auto [bit, loop] : {std::pair{1, a}, std::pair{2, b}})
    loop.walk([&](mlir::Operation* op) {
      mlir::Value m = accessed_memref(op);
      if (!m) return;
      accessed[m] |= bit;
      if (llvm::isa<mlir::memref::StoreOp>(op)) written[m] |= bit;
    });
  for (auto [m, by] : written) {
    if (!own_buffer(m, inside)) return false;
    if (!m.getDefiningOp<mlir::memref::AllocOp>() && !noalias_argument(m)) return false;
  }
  for (auto [m, by] : written) {
    if (accessed[m] != 3) continue;
    llvm::SmallVector<mlir::Value> first;  // the indices, b's index written as a's
    bool has_first = false, ok = true;
    for (mlir::scf::ForOp loop : {a, b})
      loop.walk([&](mlir::Operation* op) {
        if (accessed_memref(op) != m) return;
        llvm::SmallVector<mlir::Value> at;
        bool has_iv = false;
        for (mlir::Value v : access_index_values(op)) {
          const bool iv = v == loop.getInductionVar();
          has_iv |= iv;
          if (!iv && (v.getParentBlock() == a.getBody() || v.getParentBlock() == b.getBody()))
            ok = false;  // an index computed in a loop
          at.push_back(iv ? a.getInductionVar() : v);
        }
        ok &= has_iv && (!has_first || at == first);
        if (!has_first) first = at, has_first = true;
      });
    if (!ok) return false;
  }
  return true;
}

/// Whether the ops between loops `a` and `b` (the same block) may move above `a`: pure ops, or
/// loads and stores of allocations `a` does not access (an accumulator's initial value), used
/// only by loads, stores and deallocs (no view through which `a` could reach them).
bool movable_above(mlir::scf::ForOp a, mlir::scf::ForOp b) {
  for (mlir::Operation* op = a->getNextNode(); op != b.getOperation(); op = op->getNextNode()) {
    if (mlir::Value m = accessed_memref(op)) {
      if (!m.getDefiningOp<mlir::memref::AllocOp>()) return false;
      for (mlir::Operation* user : m.getUsers())
        if (a->isAncestor(user) || !llvm::isa<mlir::memref::LoadOp, mlir::memref::StoreOp,
                                               mlir::memref::DeallocOp>(user))
          return false;
      continue;
    }
    if (op->getNumRegions() != 0 || !mlir::isMemoryEffectFree(op)) return false;
  }
  return true;
}

bool fusible(mlir::scf::ForOp a, mlir::scf::ForOp b) {
  return a.getInductionVar().getType() == b.getInductionVar().getType() &&
         same_bound(a.getLowerBound(), b.getLowerBound()) &&
         same_bound(a.getUpperBound(), b.getUpperBound()) &&
         same_bound(a.getStep(), b.getStep()) && plain_column_loop(a) && plain_column_loop(b) &&
         movable_above(a, b) && independent_columns(a, b);
}

void fuse_into(mlir::scf::ForOp a, mlir::scf::ForOp b) {
  while (a->getNextNode() != b.getOperation()) a->getNextNode()->moveBefore(a);
  b.getInductionVar().replaceAllUsesWith(a.getInductionVar());
  mlir::Operation* end = a.getBody()->getTerminator();
  for (mlir::Operation& op : llvm::make_early_inc_range(b.getBody()->without_terminator()))
    op.moveBefore(end);
  b.erase();
}

/// The next scf.for after `op` in its block, or null.
mlir::scf::ForOp next_loop(mlir::Operation* op) {
  for (op = op->getNextNode(); op; op = op->getNextNode())
    if (auto f = llvm::dyn_cast<mlir::scf::ForOp>(op)) return f;
  return {};
}

/// Asks LLVM's vectorizer for float32's lanes in a merged loop that widens float32 values to
/// sum them in float64 (softmax's exp and its sum): it picks the lanes of the widest type,
/// float64's, which halves the float32 work's width (softmax [4096, 1024]: 1.4 ms instead of
/// 1.0). A width hint also lets it reorder float reductions; plain_column_loop allowed only
/// `reassoc` sums and min/max.
void vectorize_at_float_lanes(mlir::scf::ForOp loop) {
  constexpr int64_t kLanes = 16;
  // A short constant trip count (3 columns) cannot fill 16 lanes: the hint would fail.
  auto lb = mlir::getConstantIntValue(loop.getLowerBound());
  auto ub = mlir::getConstantIntValue(loop.getUpperBound());
  auto step = mlir::getConstantIntValue(loop.getStep());
  if (lb && ub && step && *step > 0 && (*ub - *lb) / *step < 4 * kLanes) return;
  bool widens = false;
  loop.walk([&](mlir::arith::ExtFOp e) { widens |= e.getIn().getType().isF32(); });
  if (!widens) return;
  mlir::MLIRContext* ctx = loop.getContext();
  auto width = mlir::IntegerAttr::get(mlir::IntegerType::get(ctx, 32), kLanes);
  auto vectorize = mlir::LLVM::LoopVectorizeAttr::get(
      ctx, /*disable=*/mlir::BoolAttr::get(ctx, false), /*predicateEnable=*/{},
      /*scalableEnable=*/{}, width, /*followupVectorized=*/{}, /*followupEpilogue=*/{},
      /*followupAll=*/{});
  loop->setAttr("llvm.loop_annotation",
                mlir::LLVM::LoopAnnotationAttr::get(ctx, {}, vectorize, {}, {}, {}, {}, {}, {}, {},
                                                    {}, {}, {}, {}, {}, {}));
}

}  // namespace

int fuse_column_loops(mlir::func::FuncOp fn) {
  int fused = 0;
  for (mlir::scf::ParallelOp rows : top_level_loops(fn)) {
    mlir::Block* body = rows.getBody();
    for (auto it = body->begin(); it != body->end(); ++it) {
      auto a = llvm::dyn_cast<mlir::scf::ForOp>(*it);
      if (!a) continue;
      int merged = 0;  // into `a`: only a merged loop passed plain_column_loop's checks
      while (mlir::scf::ForOp b = next_loop(a)) {
        if (!fusible(a, b)) break;
        fuse_into(a, b);
        ++merged;
      }
      if (merged) vectorize_at_float_lanes(a);
      fused += merged;
    }
  }
  return fused;
}

}  // namespace kiln::codegen
