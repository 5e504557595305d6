// Rows spread over the lanes of a warp (codegen/README.md, "GPU", step "lanes"): a parallel loop
// whose threads each run serial loops along their row's contiguous dim (softmax, layer_norm, a
// row sum) reads a warp's 32 rows at 32 distant addresses per load. Here a row gets `lanes`
// threads instead: lane l runs columns l, l + lanes, ... (a warp's load is one contiguous run),
// keeps its part of each reduction in a register, and the lanes combine their parts with a
// butterfly of shuffles, after which every lane holds the row's result.
#include <algorithm>
#include <optional>

#include <fmt/format.h>

#include "codegen/gpu_lowering.h"
#include "codegen/row_fusion.h"
#include "core/error.h"
#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/LLVMIR/NVVMDialect.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/IRMapping.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"
#include "mlir/Pass/Pass.h"

namespace kiln::codegen {
namespace {

/// `acc[row] = combine(acc[row], v)` inside a column loop: `load` and `store` of one element of
/// a per-row buffer, `combine` an associative op with a neutral element (arith.addf, maximumf,
/// ...). `init` is the store that set acc[row] before the loop, when it is in the same row body
/// (its value is used directly and the store dropped); without one, acc[row] is loaded first.
struct Accumulator {
  mlir::memref::LoadOp load;
  mlir::memref::StoreOp store;
  mlir::Operation* combine = nullptr;
  mlir::TypedAttr neutral;
  mlir::memref::StoreOp init;
};

/// A column loop of the row body and the accumulators it updates.
struct ColumnLoop {
  mlir::scf::ForOp loop;
  llvm::SmallVector<Accumulator> accumulators;
};

bool same_index(mlir::Value a, mlir::Value b) {
  if (a == b) return true;
  auto ca = mlir::getConstantIntValue(a), cb = mlir::getConstantIntValue(b);
  return ca && cb && *ca == *cb;
}

bool same_indices(mlir::ValueRange a, mlir::ValueRange b) {
  if (a.size() != b.size()) return false;
  for (auto [x, y] : llvm::zip(a, b))
    if (!same_index(x, y)) return false;
  return true;
}

/// The plan for one row loop, or nullopt when its body is not of the form this rewrite knows to
/// be safe and worth it.
class RowPlan {
 public:
  static std::optional<RowPlan> make(mlir::scf::ParallelOp p, int64_t min_columns) {
    RowPlan plan(p);
    if (!plan.analyse(min_columns)) return std::nullopt;
    return plan;
  }

  /// Replaces the row loop by one over (rows, lanes); each lane's column loop computes up to
  /// `per_lane` of its columns per step (unrolled_columns).
  void apply(int lanes, int per_lane);

 private:
  explicit RowPlan(mlir::scf::ParallelOp p) : p_(p) {}
  bool analyse(int64_t min_columns);
  bool loop_shape_ok(mlir::scf::ForOp f, int64_t min_columns) const;
  bool accesses_ok();
  bool accumulators_ok();

  mlir::scf::ParallelOp p_;
  llvm::SmallVector<ColumnLoop> loops_;
  llvm::SmallDenseSet<mlir::Operation*, 4> dropped_inits_;
  // Buffers the body writes that hold per-row values (every lane stores the same bits), as
  // accesses_ok finds them; the others it writes are column buffers (lane-owned elements).
  llvm::SmallDenseSet<mlir::Value, 8> row_buffers_;
};

/// A column loop the rewrite handles: from 0 by 1 over a bound from outside the row body, no
/// loop-carried values, a body of loads, stores and pure ops; its index used directly only as
/// the last index of an access (the contiguous dim: a column sum, whose loop runs over rows,
/// is coalesced already with a thread per column), at least once.
bool RowPlan::loop_shape_ok(mlir::scf::ForOp f, int64_t min_columns) const {
  if (!mlir::isConstantIntValue(f.getLowerBound(), 0) ||
      !mlir::isConstantIntValue(f.getStep(), 1) || f.getNumRegionIterArgs() != 0 ||
      p_->isAncestor(f.getUpperBound().getParentBlock()->getParentOp()))
    return false;
  if (auto n = mlir::getConstantIntValue(f.getUpperBound()); n && *n < min_columns) return false;
  bool contiguous = false;
  for (mlir::Operation& op : f.getBody()->without_terminator()) {
    bool access = llvm::isa<mlir::memref::LoadOp, mlir::memref::StoreOp>(op);
    if (op.getNumRegions() != 0 || !(access || mlir::isMemoryEffectFree(&op))) return false;
    if (!access) continue;
    mlir::ValueRange idx = access_index_values(&op);
    for (size_t d = 0; d < idx.size(); ++d)
      if (idx[d] == f.getInductionVar()) {
        if (d + 1 != idx.size()) return false;
        contiguous = true;
      }
  }
  return contiguous;
}

bool RowPlan::analyse(int64_t min_columns) {
  for (auto [lb, step] : llvm::zip(p_.getLowerBound(), p_.getStep()))
    if (!mlir::isConstantIntValue(lb, 0) || !mlir::isConstantIntValue(step, 1)) return false;
  for (mlir::Operation& op : p_.getBody()->without_terminator()) {
    if (auto f = llvm::dyn_cast<mlir::scf::ForOp>(op)) {
      if (!loop_shape_ok(f, min_columns)) return false;
      loops_.push_back({f, {}});
      continue;
    }
    bool access = llvm::isa<mlir::memref::LoadOp, mlir::memref::StoreOp>(op);
    if (op.getNumRegions() != 0 || !(access || mlir::isMemoryEffectFree(&op))) return false;
  }
  return !loops_.empty() && accesses_ok() && accumulators_ok();
}

/// Every buffer the body writes is one of its own (own_buffer: no view inside the loop reads its
/// elements under another name), and each access of it indexes the row dims by the row indices,
/// then constants and at most the enclosing column loop's index. With the index, element
/// (row, j) is read and written only by lane j % lanes (a column buffer); without, every lane of
/// the row reads and writes the same value (row_buffers_, checked by accumulators_ok).
bool RowPlan::accesses_ok() {
  llvm::SmallDenseSet<mlir::Value, 8> written;
  p_.walk([&](mlir::memref::StoreOp s) { written.insert(s.getMemRef()); });
  const unsigned rows = p_.getNumLoops();
  llvm::SmallDenseMap<mlir::Value, bool, 8> is_column;
  auto inside = [&](mlir::Operation* op) { return p_->isAncestor(op); };
  for (mlir::Value m : written)
    if (!own_buffer(m, inside)) return false;
  bool ok = true;
  p_.walk([&](mlir::Operation* op) {
    if (!llvm::isa<mlir::memref::LoadOp, mlir::memref::StoreOp>(op)) {
      for (mlir::Value v : op->getOperands()) ok &= !written.contains(v);
      return;
    }
    mlir::Value m = accessed_memref(op);
    if (!written.contains(m)) return;
    mlir::ValueRange idx = access_index_values(op);
    if (idx.size() < rows) {
      ok = false;
      return;
    }
    for (unsigned d = 0; d < rows; ++d) ok &= idx[d] == p_.getInductionVars()[d];
    auto f = llvm::dyn_cast<mlir::scf::ForOp>(op->getParentOp());
    int column_uses = 0;
    for (mlir::Value i : idx.drop_front(rows)) {
      if (f && i == f.getInductionVar()) ++column_uses;
      else ok &= mlir::getConstantIntValue(i).has_value();
    }
    ok &= column_uses <= 1;
    auto [it, fresh] = is_column.try_emplace(m, column_uses == 1);
    ok &= it->second == (column_uses == 1);
  });
  for (auto [m, column] : is_column)
    if (!column) row_buffers_.insert(m);
  return ok;
}

/// Row buffers: each accumulator in a column loop is recognised (see Accumulator), and after the
/// rewrite every row buffer is stored once in the body, before any load of it (the initial
/// load of an accumulator without an init store excepted: a warp sync orders it before the
/// stores), so no lane can read another lane's store of a different value.
bool RowPlan::accumulators_ok() {
  mlir::Block* body = p_.getBody();
  auto position = [&](mlir::Operation* op) { return body->findAncestorOpInBlock(*op); };
  // Row buffers' accesses, in body order.
  llvm::MapVector<mlir::Value, llvm::SmallVector<mlir::Operation*>> row_accesses;
  body->walk([&](mlir::Operation* op) {
    if (mlir::Value m = accessed_memref(op); m && row_buffers_.contains(m))
      row_accesses[m].push_back(op);
  });
  for (ColumnLoop& c : loops_) {
    mlir::Block* lb = c.loop.getBody();
    for (mlir::Operation& op : lb->without_terminator()) {
      auto st = llvm::dyn_cast<mlir::memref::StoreOp>(op);
      if (!st) continue;
      auto it = row_accesses.find(st.getMemRef());
      if (it == row_accesses.end()) continue;  // a column buffer
      Accumulator a;
      a.store = st;
      a.combine = st.getValueToStore().getDefiningOp();
      if (!a.combine || a.combine->getBlock() != lb || a.combine->getNumOperands() != 2 ||
          a.combine->getNumResults() != 1)
        return false;
      for (mlir::Value v : a.combine->getOperands())
        if (auto l = v.getDefiningOp<mlir::memref::LoadOp>();
            l && l.getMemRef() == st.getMemRef() && same_indices(l.getIndices(), st.getIndices()))
          a.load = l;
      // The running value must not be used but by its store: after the rewrite it is a lane's
      // part (a running sum stored per column, a cumsum, would store parts).
      if (!a.load || !a.load->hasOneUse() || !a.combine->getResult(0).hasOneUse() ||
          a.combine->getOperand(0) == a.combine->getOperand(1))
        return false;
      auto neutral = mlir::arith::getNeutralElement(a.combine);
      mlir::Type t = st.getValueToStore().getType();
      if (!neutral || !(t.isF32() || t.isF64() || t.isInteger(32) || t.isInteger(64)))
        return false;
      a.neutral = *neutral;
      // getNeutralElement gives +0.0 for addf; -0.0 is its neutral element (-0.0 + -0.0 = -0.0).
      if (llvm::isa<mlir::arith::AddFOp>(a.combine))
        a.neutral = mlir::FloatAttr::get(t, -0.0);
      // The element is the same in every iteration (loaded before and stored after the loop).
      for (mlir::Value i : st.getIndices())
        if (c.loop->isAncestor(i.getParentBlock()->getParentOp())) return false;
      // No other access of the buffer in this loop.
      for (mlir::Operation& other : lb->without_terminator())
        if (&other != a.load && &other != st && accessed_memref(&other) == st.getMemRef()) return false;
      // The init: the last access of the buffer before the loop, a store to the same element.
      mlir::Operation* before = nullptr;
      for (mlir::Operation* x : it->second)
        if (position(x)->isBeforeInBlock(c.loop)) before = x;
      if (auto init = llvm::dyn_cast_or_null<mlir::memref::StoreOp>(before);
          init && init->getBlock() == body && same_indices(init.getIndices(), st.getIndices())) {
        a.init = init;
        dropped_inits_.insert(init);
      } else if (before) {
        return false;
      }
      c.accumulators.push_back(a);
    }
  }
  // One store per row buffer once the init stores are dropped, and no load before it other than
  // an accumulator's own.
  llvm::SmallDenseSet<mlir::Operation*, 8> own_loads;
  for (ColumnLoop& c : loops_)
    for (Accumulator& a : c.accumulators) own_loads.insert(a.load);
  for (auto& [m, accesses] : row_accesses) {
    int stores = 0;
    for (mlir::Operation* x : accesses) {
      if (dropped_inits_.contains(x)) continue;
      if (llvm::isa<mlir::memref::StoreOp>(x)) ++stores;
      else if (stores == 0 && !own_loads.contains(x)) return false;
    }
    if (stores > 1) return false;
  }
  return true;
}

/// How many columns a lane's loop over `f`'s columns computes per step: `per_lane`, each
/// column's loads cloned before any column's store so that a lane has that many loads in flight
/// (kernel arguments are not noalias: the device compiler cannot move a load above an earlier
/// store, and a merged row's elementwise loop would wait for each load in turn), or 1 when a
/// load follows a store in the body (it reads what the column wrote and must stay after it).
/// Moving one column's loads above another's stores is safe: a column buffer's element belongs
/// to one column, and every other buffer the loop reads is not written in the row body.
int unrolled_columns(mlir::scf::ForOp f, int per_lane) {
  bool stored = false;
  for (mlir::Operation& op : f.getBody()->without_terminator()) {
    if (stored && llvm::isa<mlir::memref::LoadOp>(op)) return 1;
    stored |= llvm::isa<mlir::memref::StoreOp>(op);
  }
  return std::max(per_lane, 1);
}

/// `combine` applied to (acc, v) in the operand order of the original combine (`acc_first`).
mlir::Value combine_like(mlir::OpBuilder& b, mlir::Operation* combine, bool acc_first,
                         mlir::Value acc, mlir::Value v) {
  mlir::Operation* c = b.clone(*combine);
  c->setOperand(acc_first ? 0 : 1, acc);
  c->setOperand(acc_first ? 1 : 0, v);
  return c->getResult(0);
}

void RowPlan::apply(int lanes, int per_lane) {
  // The value each row buffer's element holds once stored (every lane stores the same bits):
  // later loads of it use the value, not memory (the device compiler must assume a store of
  // another buffer may change it, and reloads it in every iteration).
  struct Stored {
    mlir::ValueRange indices;  // the original store's
    mlir::Value value;         // in the new loop
  };
  llvm::SmallDenseMap<mlir::Value, Stored, 8> stored;
  mlir::OpBuilder b(p_);
  mlir::Location loc = p_.getLoc();
  auto index = [&](int64_t v) { return mlir::arith::ConstantIndexOp::create(b, loc, v); };
  llvm::SmallVector<mlir::Value> lbs(p_.getLowerBound()), ubs(p_.getUpperBound()),
      steps(p_.getStep());
  lbs.push_back(index(0));
  ubs.push_back(index(lanes));
  steps.push_back(index(1));
  auto q = mlir::scf::ParallelOp::create(b, loc, lbs, ubs, steps);
  b.setInsertionPoint(q.getBody()->getTerminator());
  mlir::IRMapping map;
  for (auto [from, to] : llvm::zip(p_.getInductionVars(), q.getInductionVars()))
    map.map(from, to);
  mlir::Value lane = q.getInductionVars().back();
  // Clones `op` into the new loop (through `with`), a load of a stored row value becoming that
  // value.
  auto clone_with = [&](mlir::Operation& op, mlir::IRMapping& with) {
    if (auto l = llvm::dyn_cast<mlir::memref::LoadOp>(op))
      if (auto it = stored.find(l.getMemRef());
          it != stored.end() && same_indices(it->second.indices, l.getIndices())) {
        with.map(l.getResult(), it->second.value);
        return;
      }
    mlir::Operation* c = b.clone(op, with);
    auto s = llvm::dyn_cast<mlir::memref::StoreOp>(op);
    if (s && row_buffers_.contains(s.getMemRef()))
      stored[s.getMemRef()] = {s.getIndices(), llvm::cast<mlir::memref::StoreOp>(c).getValue()};
  };
  auto clone = [&](mlir::Operation& op) { clone_with(op, map); };
  auto column_loop = [&](mlir::scf::ForOp f) -> ColumnLoop* {
    for (ColumnLoop& c : loops_)
      if (c.loop == f) return &c;
    return nullptr;
  };
  for (mlir::Operation& op : p_.getBody()->without_terminator()) {
    if (dropped_inits_.contains(&op)) continue;
    ColumnLoop* c = nullptr;
    if (auto f = llvm::dyn_cast<mlir::scf::ForOp>(op)) c = column_loop(f);
    if (!c) {
      clone(op);
      continue;
    }
    // Each lane's part of every accumulator starts at the combine's neutral element.
    llvm::SmallVector<mlir::Value> parts;
    for (Accumulator& a : c->accumulators)
      parts.push_back(mlir::arith::ConstantOp::create(b, loc, a.neutral));
    // Lane l's columns l, l + lanes, ..., `unroll` of them per step: column j of a step is
    // base + j * lanes, read at base (the step's first column, always in bounds) when it is
    // past the end, its stores skipped and its accumulator parts kept.
    int unroll = unrolled_columns(c->loop, per_lane);
    // No more per step than a lane has columns (64 columns: 2 per lane, not 4).
    if (auto n = mlir::getConstantIntValue(c->loop.getUpperBound()))
      unroll = static_cast<int>(std::clamp<int64_t>((*n + lanes - 1) / lanes, 1, unroll));
    mlir::Value columns = map.lookupOrDefault(c->loop.getUpperBound());
    auto g = mlir::scf::ForOp::create(b, loc, lane, columns, index(int64_t{lanes} * unroll),
                                      parts);
    {
      mlir::OpBuilder::InsertionGuard guard(b);
      // The builder gives a loop without values a yield of its own: ours replaces it.
      if (g.getBody()->mightHaveTerminator()) g.getBody()->getTerminator()->erase();
      b.setInsertionPointToStart(g.getBody());
      mlir::Value base = g.getInductionVar();
      llvm::SmallVector<mlir::Value> acc(g.getRegionIterArgs());
      std::vector<mlir::IRMapping> maps(unroll, map);
      std::vector<mlir::Value> in_bounds(unroll);
      auto accumulator_access = [&](mlir::Operation& inner) {
        for (Accumulator& a : c->accumulators)
          if (&inner == a.load || &inner == a.store) return true;
        return false;
      };
      for (int j = 0; j < unroll; ++j) {
        mlir::Value column = base;
        if (j > 0) {
          mlir::Value at = mlir::arith::AddIOp::create(b, loc, base, index(int64_t{j} * lanes));
          in_bounds[j] =
              mlir::arith::CmpIOp::create(b, loc, mlir::arith::CmpIPredicate::ult, at, columns);
          column = mlir::arith::SelectOp::create(b, loc, in_bounds[j], at, base);
        }
        maps[j].map(c->loop.getInductionVar(), column);
        for (auto [a, part] : llvm::zip(c->accumulators, acc))
          maps[j].map(a.load.getResult(), part);
        // One column in the body's order; several with every store after all the loads.
        for (mlir::Operation& inner : c->loop.getBody()->without_terminator())
          if (!accumulator_access(inner) &&
              (unroll == 1 || !llvm::isa<mlir::memref::StoreOp>(inner)))
            clone_with(inner, maps[j]);
        for (auto [a, part] : llvm::zip(c->accumulators, acc)) {
          mlir::Value next = maps[j].lookup(a.combine->getResult(0));
          part = j == 0 ? next : mlir::arith::SelectOp::create(b, loc, in_bounds[j], next, part);
        }
      }
      const bool stores = llvm::any_of(c->loop.getBody()->without_terminator(),
                                       [&](mlir::Operation& inner) {
                                         return llvm::isa<mlir::memref::StoreOp>(inner) &&
                                                !accumulator_access(inner);
                                       });
      for (int j = 0; j < unroll && unroll > 1 && stores; ++j) {
        mlir::OpBuilder::InsertionGuard store_guard(b);
        if (j > 0)
          b.setInsertionPointToStart(
              mlir::scf::IfOp::create(b, loc, in_bounds[j], /*withElseRegion=*/false)
                  .thenBlock());
        for (mlir::Operation& inner : c->loop.getBody()->without_terminator())
          if (!accumulator_access(inner) && llvm::isa<mlir::memref::StoreOp>(inner))
            clone_with(inner, maps[j]);
      }
      mlir::scf::YieldOp::create(b, loc, acc);
    }
    for (auto [a, part] : llvm::zip(c->accumulators, g.getResults())) {
      // The butterfly: after step k every lane holds the combination of its 2k neighbours'
      // parts; the same operations in every lane, so every lane ends with the same bits.
      mlir::Value total = part;
      for (int offset = lanes / 2; offset >= 1; offset /= 2) {
        auto s = mlir::gpu::ShuffleOp::create(b, loc, total, offset, lanes,
                                              mlir::gpu::ShuffleMode::XOR);
        total = combine_like(b, a.combine, true, total, s.getShuffleResult());
      }
      bool acc_first = a.combine->getOperand(0) == a.load.getResult();
      mlir::Value init;
      if (a.init) {
        init = map.lookupOrDefault(a.init.getValueToStore());
      } else {
        // Loaded before the loop; the warp sync below keeps every lane's load before any
        // lane's store.
        mlir::OpBuilder::InsertionGuard guard(b);
        b.setInsertionPoint(g);
        init = b.clone(*a.load, map)->getResult(0);
      }
      mlir::Value result = combine_like(b, a.combine, acc_first, init, total);
      if (!a.init && lanes > 1)
        mlir::NVVM::SyncWarpOp::create(
            b, loc, mlir::arith::ConstantIntOp::create(b, loc, b.getI32Type(), -1));
      llvm::cast<mlir::memref::StoreOp>(b.clone(*a.store, map)).setOperand(0, result);
      stored[a.store.getMemRef()] = {a.store.getIndices(), result};
    }
  }
  p_.erase();
}

/// kiln-gpu-row-lanes{lanes=32}: spread_rows_over_lanes on every function, for lit tests
/// (tests/ir/gpu-row-lanes.mlir).
struct RowLanesPass : mlir::PassWrapper<RowLanesPass, mlir::OperationPass<mlir::func::FuncOp>> {
  MLIR_DEFINE_EXPLICIT_INTERNAL_INLINE_TYPE_ID(RowLanesPass)
  RowLanesPass() = default;
  RowLanesPass(const RowLanesPass& other) : PassWrapper(other) {}
  llvm::StringRef getArgument() const override { return "kiln-gpu-row-lanes"; }
  llvm::StringRef getDescription() const override {
    return "spread row reductions over the lanes of a warp (codegen/gpu_row_lanes.cpp)";
  }
  void getDependentDialects(mlir::DialectRegistry& r) const override {
    r.insert<mlir::gpu::GPUDialect, mlir::NVVM::NVVMDialect>();
  }
  void runOnOperation() override {
    try {
      spread_rows_over_lanes(getOperation(), lanes, 256, per_lane);
    } catch (const Error& e) {
      getOperation().emitError(e.what());
      signalPassFailure();
    }
  }
  Option<int> lanes{*this, "lanes", llvm::cl::desc("threads per row (1 or 32)"),
                    llvm::cl::init(32)};
  Option<int> per_lane{*this, "per-lane",
                       llvm::cl::desc("columns a lane computes per step of a column loop"),
                       llvm::cl::init(1)};
};

/// kiln-gpu-static-rows{lanes=32}: fuse_static_row_loops on every function, a group merging
/// where spreads_over_lanes(lanes) takes the loops it becomes, for lit tests
/// (tests/ir/gpu-static-rows.mlir).
struct StaticRowsPass
    : mlir::PassWrapper<StaticRowsPass, mlir::OperationPass<mlir::func::FuncOp>> {
  MLIR_DEFINE_EXPLICIT_INTERNAL_INLINE_TYPE_ID(StaticRowsPass)
  StaticRowsPass() = default;
  StaticRowsPass(const StaticRowsPass& other) : PassWrapper(other) {}
  llvm::StringRef getArgument() const override { return "kiln-gpu-static-rows"; }
  llvm::StringRef getDescription() const override {
    return "merge static loops over shared rows where a warp's lanes will share each row "
           "(codegen/row_fusion.cpp)";
  }
  void runOnOperation() override {
    if (getOperation().isExternal()) return;
    fuse_static_row_loops(getOperation(), [&](mlir::scf::ParallelOp p, int64_t) {
      return spreads_over_lanes(p, lanes);
    });
  }
  Option<int> lanes{*this, "lanes", llvm::cl::desc("threads per row (1 or 32)"),
                    llvm::cl::init(32)};
};

}  // namespace

void register_gpu_row_lanes_pass(mlir::DialectRegistry& registry) {
  registry.insert<mlir::scf::SCFDialect, mlir::gpu::GPUDialect, mlir::NVVM::NVVMDialect>();
  mlir::PassRegistration<RowLanesPass>();
  mlir::PassRegistration<StaticRowsPass>();
}

namespace {

/// On a GPU, rows shorter than two warps keep a thread each (most lanes would idle); in the
/// emulation (lanes == 1) every row loop is rewritten, so tests reach it with small shapes.
int64_t min_columns_for(int lanes) { return lanes > 1 ? 2 * int64_t{lanes} : 0; }

}  // namespace

bool spreads_over_lanes(mlir::scf::ParallelOp p, int lanes) {
  return RowPlan::make(p, min_columns_for(lanes)).has_value();
}

int spread_rows_over_lanes(mlir::func::FuncOp fn, int lanes, int threads_per_block,
                           int per_lane) {
  // A row's lanes must be one whole warp: NVVM's shuffle masks cover lanes [0, width), and a
  // block that is not whole warps would split a row's lanes.
  if (lanes != 1 && (lanes != 32 || threads_per_block % 32 != 0))
    throw Error("codegen (gpu)", fmt::format("row lanes must be 1 or 32 (a warp) with a multiple "
                                             "of 32 threads per block, got {} lanes and {} "
                                             "threads per block",
                                             lanes, threads_per_block));
  llvm::SmallVector<mlir::scf::ParallelOp> candidates;
  for (mlir::Operation& op : fn.getBody().front())
    if (auto p = llvm::dyn_cast<mlir::scf::ParallelOp>(op)) candidates.push_back(p);
  const int64_t min_columns = min_columns_for(lanes);
  int rewritten = 0;
  for (mlir::scf::ParallelOp p : candidates)
    if (auto plan = RowPlan::make(p, min_columns)) {
      plan->apply(lanes, per_lane);
      ++rewritten;
    }
  return rewritten;
}

}  // namespace kiln::codegen
