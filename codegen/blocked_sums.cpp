// Sums of the CPU's loops in partials per block of columns (row_fusion.h, block_float32_sums,
// block_float64_sums).
#include <optional>

#include "codegen/row_fusion.h"
#include "ir/dialect.h"
#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"
#include "mlir/Interfaces/ViewLikeInterface.h"

namespace kiln::codegen {
namespace {

// Columns per float32 partial sum: eager's kBlock (backends/cpu/reduce_simd.h).
constexpr int64_t kBlockColumns = 4096;
// Marks the loop over blocks that block_sums makes: its sums of partials are not blocked again.
constexpr llvm::StringLiteral kBlocksAttr = "kiln_column_blocks";

/// A float64 running sum in a loop: `acc[i] = acc[i] + term` (reassoc), acc[i] the same
/// element in every iteration; term is `extf(t)` of a float32 t for a widened float32 sum.
struct RunningSum {
  mlir::memref::LoadOp load;
  mlir::arith::AddFOp add;
  mlir::memref::StoreOp store;
  mlir::arith::ExtFOp widen;  // of the float32 term; null for a float64 sum
  /// What the partials add: the float32 term of a widened sum, else the float64 term.
  mlir::Value term;
  /// Terms >= 0 (kNonnegativeTermsAttr: softmax's Σ exp): a float32 partial overflows only
  /// where the float32 total does. Other partials may overflow where the total does not
  /// ([3e38, 3e38, -3e38, -3e38]): such a block is summed again in float64, as eager does.
  bool nonnegative = false;
};

/// The float64 running sum `store` writes in `loop`, if it is one.
std::optional<RunningSum> running_sum(mlir::memref::StoreOp store, mlir::scf::ForOp loop) {
  auto add = store.getValue().getDefiningOp<mlir::arith::AddFOp>();
  if (!add || add->getBlock() != loop.getBody() || !add->hasOneUse() || !add.getType().isF64() ||
      !mlir::arith::bitEnumContainsAll(add.getFastmath(), mlir::arith::FastMathFlags::reassoc))
    return std::nullopt;
  for (mlir::Value i : store.getIndices())
    if (!loop.isDefinedOutsideOfLoop(i)) return std::nullopt;
  for (int k = 0; k < 2; ++k) {
    auto load = add->getOperand(k).getDefiningOp<mlir::memref::LoadOp>();
    if (load && load->getBlock() == loop.getBody() && load->hasOneUse() &&
        load.getMemRef() == store.getMemRef() &&
        llvm::equal(load.getIndices(), store.getIndices()))
      return RunningSum{load, add, store, nullptr, add->getOperand(1 - k),
                        add->hasAttr(kiln::dialect::kNonnegativeTermsAttr)};
  }
  return std::nullopt;
}

/// The sum `store` writes, when it is a float64 sum of widened float32 terms that the reduce's
/// lowering made (marked kWidenedFloat32SumAttr): a float64 sum the user asked for (sum of
/// x.to(float64)) must stay one.
std::optional<RunningSum> widened_sum(mlir::memref::StoreOp store, mlir::scf::ForOp loop) {
  std::optional<RunningSum> sum = running_sum(store, loop);
  if (!sum || !sum->add->hasAttr(kiln::dialect::kWidenedFloat32SumAttr)) return std::nullopt;
  auto ext = sum->term.getDefiningOp<mlir::arith::ExtFOp>();
  if (!ext || !ext.getIn().getType().isF32()) return std::nullopt;
  sum->widen = ext;
  sum->term = ext.getIn();
  return sum;
}

/// Whether in `loop` nothing but the running sums `sums` accesses the buffer of `sum`'s
/// accumulator (an allocation or an output argument of its own, or a view of one: a sum
/// written into its part of a cat's result). Then adding partials into it once per block
/// changes nothing else: the sums only add into their elements, in any order (reassoc), even
/// where two of them add into one element.
bool accumulator_private(RunningSum sum, llvm::ArrayRef<RunningSum> sums,
                         mlir::scf::ForOp loop) {
  mlir::Value root = view_root(sum.store.getMemRef());
  if (!root || (!root.getDefiningOp<mlir::memref::AllocOp>() && !noalias_argument(root)))
    return false;
  llvm::SmallVector<mlir::Value> views{root};
  for (size_t k = 0; k < views.size(); ++k) {
    for (mlir::Operation* user : views[k].getUsers()) {
      if (auto view = llvm::dyn_cast<mlir::ViewLikeOpInterface>(user);
          view && view.getViewSource() == views[k]) {
        views.push_back(view->getResult(0));
      } else if (loop->isAncestor(user) && !llvm::any_of(sums, [&](const RunningSum& s) {
                   return user == s.load || user == s.store;
                 })) {
        return false;
      }
    }
  }
  return true;
}

/// Whether float32 partials keep `sum`'s result: its accumulator is an allocation that, in the
/// loop, only the sum touches, and that outside it is only stored, freed, or loaded to be
/// rounded to float32 (softmax's sum), possibly after a division (a mean's by its count). A
/// float64 result used further keeps its float64 sum.
bool rounded_to_float32(RunningSum sum, mlir::scf::ForOp loop) {
  mlir::Value acc = sum.store.getMemRef();
  if (!acc.getDefiningOp<mlir::memref::AllocOp>() && !acc.getDefiningOp<mlir::memref::AllocaOp>())
    return false;
  for (mlir::Operation* user : acc.getUsers()) {
    if (loop->isAncestor(user)) {
      if (user != sum.load && user != sum.store) return false;
    } else if (auto load = llvm::dyn_cast<mlir::memref::LoadOp>(user)) {
      auto rounded = [](mlir::Operation* use) {
        auto trunc = llvm::dyn_cast<mlir::arith::TruncFOp>(use);
        return trunc && trunc.getType().isF32();
      };
      for (mlir::Operation* use : load->getUsers()) {
        auto div = llvm::dyn_cast<mlir::arith::DivFOp>(use);
        if (div && div.getLhs() == load.getResult() &&
            llvm::all_of(div->getUsers(), rounded))
          continue;
        if (!rounded(use)) return false;
      }
    } else if (!llvm::isa<mlir::memref::StoreOp, mlir::memref::DeallocOp>(user)) {
      return false;
    }
  }
  return true;
}

/// Whether running `loop`'s body again over a block changes nothing but `sums`' accumulators:
/// it writes no other memory and calls nothing.
bool redoable(mlir::scf::ForOp loop, llvm::ArrayRef<RunningSum> sums) {
  bool ok = true;
  loop.getBody()->walk([&](mlir::Operation* op) {
    if (auto store = llvm::dyn_cast<mlir::memref::StoreOp>(op)) {
      ok &= llvm::any_of(sums, [&](const RunningSum& s) { return s.store == store; });
    } else if (!mlir::isPure(op) && !llvm::isa<mlir::memref::LoadOp, mlir::scf::YieldOp>(op)) {
      ok = false;
    }
  });
  return ok;
}

/// `loop` (no results) rewritten to sum `sums` in partials of their terms' type (float32 for
/// widened sums, float64), each added to its float64 accumulator once per block of
/// kBlockColumns iterations. The partials start at -0.0, the sum's identity, so an empty block
/// leaves the accumulator as it was. With `redo_not_finite`, a block whose partials are not all
/// finite runs the original loop over its columns instead, summing in float64 (eager's kernels
/// redo such a row).
void block_sums(mlir::scf::ForOp loop, llvm::MutableArrayRef<RunningSum> sums,
                bool redo_not_finite) {
  mlir::OpBuilder b(loop);
  mlir::Location loc = loop.getLoc();
  mlir::scf::ForOp redo =
      redo_not_finite ? llvm::cast<mlir::scf::ForOp>(b.clone(*loop)) : nullptr;
  if (redo) redo->remove();
  mlir::Value lb = loop.getLowerBound(), ub = loop.getUpperBound(), step = loop.getStep();
  auto trips = loop.getStaticTripCount();
  mlir::Value block_lb = lb, block_ub = ub;
  if (!trips || trips->ugt(kBlockColumns)) {
    mlir::Value block_step = mlir::arith::MulIOp::create(
        b, loc, step, mlir::arith::ConstantIndexOp::create(b, loc, kBlockColumns));
    auto blocks = mlir::scf::ForOp::create(b, loc, lb, ub, block_step);
    blocks->setAttr(kBlocksAttr, b.getUnitAttr());
    b.setInsertionPointToStart(blocks.getBody());
    block_lb = blocks.getInductionVar();
    block_ub = mlir::arith::MinSIOp::create(
        b, loc, mlir::arith::AddIOp::create(b, loc, block_lb, block_step), ub);
  }
  llvm::SmallVector<mlir::Value> inits;
  for (const RunningSum& sum : sums)
    inits.push_back(mlir::arith::ConstantOp::create(
        b, loc, b.getFloatAttr(sum.term.getType(), llvm::APFloat::getZero(
                                   llvm::cast<mlir::FloatType>(sum.term.getType())
                                       .getFloatSemantics(),
                                   /*Negative=*/true))));
  auto inner = mlir::scf::ForOp::create(b, loc, block_lb, block_ub, step, inits);
  inner->setDiscardableAttrs(loop->getDiscardableAttrDictionary());
  mlir::Block* body = inner.getBody();
  body->getOperations().splice(body->end(), loop.getBody()->getOperations(),
                               loop.getBody()->begin(), std::prev(loop.getBody()->end()));
  loop.getInductionVar().replaceAllUsesWith(inner.getInductionVar());

  struct Accumulator {
    mlir::Value memref;
    llvm::SmallVector<mlir::Value> indices;
    mlir::arith::FastMathFlags flags;
  };
  llvm::SmallVector<mlir::Value> partials;
  llvm::SmallVector<Accumulator> accumulators;
  for (auto [k, sum] : llvm::enumerate(sums)) {
    b.setInsertionPoint(sum.add);
    const mlir::arith::FastMathFlags flags = sum.add.getFastmath();
    partials.push_back(
        mlir::arith::AddFOp::create(b, loc, inner.getRegionIterArgs()[k], sum.term, flags));
    accumulators.push_back({sum.store.getMemRef(), llvm::to_vector(sum.store.getIndices()), flags});
    sum.store.erase();
    sum.add.erase();
    sum.load.erase();
    if (sum.widen && sum.widen->use_empty()) sum.widen.erase();
  }
  b.setInsertionPointToEnd(body);
  mlir::scf::YieldOp::create(b, loc, partials);

  b.setInsertionPointAfter(inner);
  if (redo) {
    // p - p is 0 for a finite p, NaN for ±inf and NaN.
    mlir::Value zero = mlir::arith::ConstantOp::create(b, loc, b.getF32FloatAttr(0.0f));
    mlir::Value finite;
    for (mlir::Value partial : inner.getResults()) {
      mlir::Value diff = mlir::arith::SubFOp::create(b, loc, partial, partial);
      mlir::Value ok = mlir::arith::CmpFOp::create(b, loc, mlir::arith::CmpFPredicate::OEQ,
                                                   diff, zero);
      finite = finite ? mlir::arith::AndIOp::create(b, loc, finite, ok).getResult() : ok;
    }
    auto branch = mlir::scf::IfOp::create(b, loc, finite, /*withElseRegion=*/true);
    b.setInsertionPoint(branch.elseBlock()->getTerminator());
    b.insert(redo);
    redo.setLowerBound(block_lb);
    redo.setUpperBound(block_ub);
    b.setInsertionPoint(branch.thenBlock()->getTerminator());
  }
  for (auto [k, acc] : llvm::enumerate(accumulators)) {
    mlir::Value old = mlir::memref::LoadOp::create(b, loc, acc.memref, acc.indices);
    mlir::Value wide = inner.getResult(k);
    if (!wide.getType().isF64())
      wide = mlir::arith::ExtFOp::create(b, loc, b.getF64Type(), wide);
    mlir::Value sum = mlir::arith::AddFOp::create(b, loc, old, wide, acc.flags);
    mlir::memref::StoreOp::create(b, loc, sum, acc.memref, acc.indices);
  }
  loop.erase();
}

}  // namespace

int block_float32_sums(mlir::func::FuncOp fn) {
  int blocked = 0;
  for (mlir::scf::ParallelOp rows : top_level_loops(fn)) {
    llvm::SmallVector<mlir::scf::ForOp> loops;
    rows.walk([&](mlir::scf::ForOp f) { loops.push_back(f); });
    for (mlir::scf::ForOp loop : loops) {
      if (loop.getNumResults() != 0) continue;
      llvm::SmallVector<RunningSum> sums;
      for (auto store : loop.getBody()->getOps<mlir::memref::StoreOp>())
        if (auto sum = widened_sum(store, loop); sum && rounded_to_float32(*sum, loop))
          sums.push_back(*sum);
      // A sum that may need its block redone only where the loop can be run again.
      if (!redoable(loop, sums))
        llvm::erase_if(sums, [](const RunningSum& s) { return !s.nonnegative; });
      if (sums.empty()) continue;
      block_sums(loop, sums,
                 llvm::any_of(sums, [](const RunningSum& s) { return !s.nonnegative; }));
      blocked += static_cast<int>(sums.size());
    }
  }
  return blocked;
}

/// How many terms `sum` adds into its element: `loop`'s trips times those of the enclosing
/// loops in which its element stays the same (a whole-tensor sum of [100000, 100] is 100 terms
/// a row, 10^7 into one element); UINT64_MAX where a trip count is not known.
uint64_t terms_into_element(RunningSum sum, mlir::scf::ForOp loop) {
  auto trips = [](mlir::scf::ForOp f) {
    auto n = f.getStaticTripCount();
    return n && n->getActiveBits() <= 63 ? n->getZExtValue() : UINT64_MAX;
  };
  uint64_t terms = trips(loop);
  for (auto outer = loop->getParentOfType<mlir::scf::ForOp>();
       outer && outer->isProperAncestor(loop) && terms != UINT64_MAX;
       outer = outer->getParentOfType<mlir::scf::ForOp>()) {
    if (outer->hasAttr(kBlocksAttr) ||
        !llvm::all_of(sum.store.getIndices(),
                      [&](mlir::Value i) { return outer.isDefinedOutsideOfLoop(i); }))
      break;
    const uint64_t n = trips(outer);
    terms = n != 0 && terms > UINT64_MAX / n ? UINT64_MAX : terms * n;
  }
  return terms;
}

int block_float64_sums(mlir::func::FuncOp fn) {
  int blocked = 0;
  llvm::SmallVector<mlir::scf::ForOp> loops;
  fn.walk([&](mlir::scf::ForOp f) { loops.push_back(f); });
  for (mlir::scf::ForOp loop : loops) {
    if (loop.getNumResults() != 0 || loop->hasAttr(kBlocksAttr)) continue;
    llvm::SmallVector<RunningSum> all, sums;
    for (auto store : loop.getBody()->getOps<mlir::memref::StoreOp>())
      if (auto sum = running_sum(store, loop)) all.push_back(*sum);
    for (const RunningSum& sum : all)
      if (accumulator_private(sum, all, loop) && terms_into_element(sum, loop) > kBlockColumns)
        sums.push_back(sum);
    if (sums.empty()) continue;
    block_sums(loop, sums, /*redo_not_finite=*/false);
    blocked += static_cast<int>(sums.size());
  }
  return blocked;
}

}  // namespace kiln::codegen
