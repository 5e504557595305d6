// Loop nests merged (row_fusion.h): nests over the same rows into one loop over rows (GPU
// kernels with a thread or warp per row; CPU code whose row intermediates stay in L1), and GPU
// loops over one iteration space that touch their own elements into one kernel.
#include "codegen/row_fusion.h"

#include <algorithm>
#include <tuple>

#include "codegen/jit.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/SmallPtrSet.h"
#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/IRMapping.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"
#include "mlir/Interfaces/ViewLikeInterface.h"
#include "mlir/Pass/Pass.h"

namespace kiln::codegen {

/// The top-level parallel loops of `fn`.
llvm::SmallVector<mlir::scf::ParallelOp> top_level_loops(mlir::func::FuncOp fn) {
  llvm::SmallVector<mlir::scf::ParallelOp> loops;
  for (mlir::Operation& op : fn.getBody().front())
    if (auto p = llvm::dyn_cast<mlir::scf::ParallelOp>(op)) loops.push_back(p);
  return loops;
}

namespace {

/// Whether `op` or an op reached through its results (and theirs) satisfies `inside`.
bool reaches(mlir::Operation* op, const std::function<bool(mlir::Operation*)>& inside,
             llvm::SmallPtrSetImpl<mlir::Operation*>& seen) {
  if (!seen.insert(op).second) return false;
  if (inside(op)) return true;
  for (mlir::Value r : op->getResults())
    for (mlir::Operation* u : r.getUsers())
      if (reaches(u, inside, seen)) return true;
  return false;
}

bool has_serial_loop(mlir::scf::ParallelOp p) {
  bool found = false;
  p.walk([&](mlir::scf::ForOp) { found = true; });
  return found;
}

/// Rewrites a parallel loop over (d0, d1, ...) as a parallel loop over its first `row_dims`
/// dims whose body loops over the other dims sequentially (one thread per row). Returns the new
/// loop (`p` when it has `row_dims` dims already).
mlir::scf::ParallelOp keep_rows_parallel(mlir::scf::ParallelOp p, unsigned row_dims) {
  if (p.getNumLoops() == row_dims) return p;
  mlir::OpBuilder b(p);
  mlir::Location loc = p.getLoc();
  auto outer = mlir::scf::ParallelOp::create(b, loc, p.getLowerBound().take_front(row_dims),
                                             p.getUpperBound().take_front(row_dims),
                                             p.getStep().take_front(row_dims));
  b.setInsertionPoint(outer.getBody()->getTerminator());
  llvm::SmallVector<mlir::Value> ivs(outer.getInductionVars());
  for (unsigned d = row_dims; d < p.getNumLoops(); ++d) {
    auto loop = mlir::scf::ForOp::create(b, loc, p.getLowerBound()[d], p.getUpperBound()[d],
                                         p.getStep()[d]);
    ivs.push_back(loop.getInductionVar());
    b.setInsertionPoint(loop.getBody()->getTerminator());
  }
  mlir::IRMapping map;
  for (auto [old_iv, new_iv] : llvm::zip(p.getInductionVars(), ivs)) map.map(old_iv, new_iv);
  for (mlir::Operation& op : p.getBody()->without_terminator()) b.clone(op, map);
  p.erase();
  return outer;
}

bool is_row_loop(mlir::scf::ParallelOp p) {
  return !mlir::getConstantIntValue(p.getUpperBound()[0]).has_value();
}

/// How many leading dims the row loops `rows` can all keep parallel: 1 (dim 0, which the
/// row-split analysis checked), or more when every row loop runs over the same leading dims
/// (from 0, step 1; the same constant sizes after dim 0) and every memref they write is only
/// read and written at those dims' own indices, so that "row" (i0, ..., ik) of each loop reads
/// only row (i0, ..., ik) of what the loops before it wrote. Softmax over the last dim of
/// [B, H, L, S] then gets a thread per (b, h, l) — B * H * L threads — instead of B threads
/// each doing H * L rows. `verify`: no analysis vouched for dim 0 (a run of loops between GEMMs):
/// dim 0 is checked like the others (the same bound, the same value or constant, in every
/// loop), and 0 is returned when even it does not hold.
unsigned shared_row_dims(llvm::ArrayRef<mlir::scf::ParallelOp> rows, bool verify) {
  const unsigned unverified = verify ? 0 : 1;
  if (rows.empty()) return unverified;
  auto same = [](mlir::Value a, mlir::Value b) {
    auto ca = mlir::getConstantIntValue(a), cb = mlir::getConstantIntValue(b);
    return a == b || (ca && cb && *ca == *cb);
  };
  mlir::scf::ParallelOp first = rows.front();
  unsigned k = first.getNumLoops();
  for (mlir::scf::ParallelOp p : rows) {
    k = std::min(k, p.getNumLoops());
    for (unsigned d = 0; d < k; ++d) {
      bool ok = mlir::isConstantIntValue(p.getLowerBound()[d], 0) &&
                mlir::isConstantIntValue(p.getStep()[d], 1) &&
                ((d == 0 && !verify) || same(p.getUpperBound()[d], first.getUpperBound()[d]));
      if (!ok) k = d;
    }
  }
  // Memrefs the row loops write. Each must be a buffer of its own (an allocation or an argument)
  // used only by loads and stores: a view of it (a reshape for attention's heads) reads other
  // rows' elements through another value, which the index check below would not see. A GEMM
  // after the loops reads it through its pointer (extracted outside the loops), which is fine.
  llvm::SmallDenseSet<mlir::Value, 8> written;
  for (mlir::scf::ParallelOp p : rows) {
    p.walk([&](mlir::memref::StoreOp s) { written.insert(s.getMemRef()); });
    p.walk([&](mlir::memref::AtomicRMWOp a) { written.insert(a.getMemref()); });  // scatters
  }
  // In verify mode, a view or pointer of it is fine when only code outside the loops uses it
  // (attention's probabilities reshaped for the GEMM after them); the row-separable path keeps
  // the stricter rule.
  auto inside_rows = [&](mlir::Operation* op) {
    return !verify ||
           llvm::any_of(rows, [&](mlir::scf::ParallelOp p) { return p->isAncestor(op); });
  };
  for (mlir::Value m : written)
    if (!own_buffer(m, inside_rows)) return unverified;
  // The largest k at which every access of a written memref indexes dims < k by the row IVs.
  auto separable = [&](unsigned k) {
    for (mlir::scf::ParallelOp p : rows) {
      bool ok = true;
      auto check = [&](mlir::Value memref, mlir::ValueRange indices) {
        if (!written.contains(memref)) return;
        if (indices.size() < k) {
          ok = false;
          return;
        }
        for (unsigned d = 0; d < k; ++d) ok &= indices[d] == p.getInductionVars()[d];
      };
      p.walk([&](mlir::Operation* op) {
        if (auto l = llvm::dyn_cast<mlir::memref::LoadOp>(op)) check(l.getMemRef(), l.getIndices());
        if (auto s = llvm::dyn_cast<mlir::memref::StoreOp>(op))
          check(s.getMemRef(), s.getIndices());
        // Any other use of a written memref inside the loops (a subview, a copy) is unknown.
        if (!llvm::isa<mlir::memref::LoadOp, mlir::memref::StoreOp>(op))
          for (mlir::Value v : op->getOperands()) ok &= !written.contains(v);
      });
      if (!ok) return false;
    }
    return true;
  };
  while (k > unverified && !separable(k)) --k;
  return k >= 1 ? k : unverified;
}

}  // namespace

mlir::Value view_root(mlir::Value m) {
  while (auto view = m.getDefiningOp<mlir::ViewLikeOpInterface>()) m = view.getViewSource();
  if (llvm::isa<mlir::BlockArgument>(m) || m.getDefiningOp<mlir::memref::AllocOp>()) return m;
  return {};
}

namespace {

/// Loops standing before a GEMM call that cannot touch their buffers move after it, in order, so
/// that they join the row loops after it: a reduction's fill that bufferization placed before
/// the GEMM whose result the reduction sums (softmax's backward in attention). The call's
/// buffers are those whose pointers its operands extract; a loop moves when every buffer it
/// loads or stores has a known root (view_root) that none of them shares. Returns whether any
/// loop moved.
bool sink_loops_past_gemms(mlir::Block& block) {
  bool sunk = false;
  for (auto call : llvm::to_vector(block.getOps<mlir::func::CallOp>())) {
    // kiln_rt_gemm_* in the CPU emulation.
    if (!call.getCallee().starts_with("kiln_rt_cuda_gemm") &&
        !call.getCallee().starts_with("kiln_rt_gemm"))
      continue;
    llvm::SmallDenseSet<mlir::Value, 4> call_roots;
    bool known = true;
    for (mlir::Value v : call.getOperands()) {
      mlir::Operation* def = v.getDefiningOp();
      if (auto ptr = llvm::dyn_cast_or_null<mlir::memref::ExtractAlignedPointerAsIndexOp>(def)) {
        mlir::Value root = view_root(ptr.getSource());
        known &= static_cast<bool>(root);
        call_roots.insert(root);
      } else {
        known &= !def || llvm::isa<mlir::arith::ConstantOp, mlir::memref::DimOp,
                                   mlir::memref::ExtractStridedMetadataOp>(def);
      }
    }
    if (!known) continue;
    llvm::SmallVector<mlir::scf::ParallelOp> moving;  // nearest the call first
    for (mlir::Operation* op = call->getPrevNode(); op; op = op->getPrevNode()) {
      // Pure ops and allocations stay (a loop cannot use a buffer allocated after it).
      if ((mlir::isMemoryEffectFree(op) && op->getNumRegions() == 0) ||
          llvm::isa<mlir::memref::AllocOp>(op))
        continue;
      auto loop = llvm::dyn_cast<mlir::scf::ParallelOp>(op);
      if (!loop || loop->getNumResults() != 0) break;
      bool apart = true;
      loop.walk([&](mlir::Operation* inner) {
        if (inner == loop.getOperation()) return;
        for (mlir::Value v : inner->getOperands())
          if (llvm::isa<mlir::MemRefType>(v.getType())) {
            mlir::Value root = view_root(v);
            apart &= root && !call_roots.contains(root);
          }
        // Only loads, stores and pure ops: nothing else whose effects are unknown.
        apart &= llvm::isa<mlir::memref::LoadOp, mlir::memref::StoreOp, mlir::scf::ForOp,
                           mlir::scf::YieldOp, mlir::scf::ReduceOp, mlir::scf::IfOp>(inner) ||
                 mlir::isMemoryEffectFree(inner);
      });
      if (!apart) break;
      moving.push_back(loop);
    }
    mlir::Operation* after = call;
    for (mlir::scf::ParallelOp loop : llvm::reverse(moving)) {
      loop->moveAfter(after);
      after = loop;
      sunk = true;
    }
  }
  return sunk;
}

/// Merges runs of top-level parallel loops of `block`: a loop that `candidate` accepts, after a
/// leader with only pure ops between them, joins the leader when `joins(leader, loop)` and the
/// ops between can move before the leader (their operands are defined before it): its body goes
/// after the leader's, its first `shared_dims(loop)` indices being the leader's. Otherwise it
/// becomes the leader. Any other op ends a run. Returns whether any loop joined another.
bool merge_loop_runs(
    mlir::Block& block, llvm::function_ref<bool(mlir::scf::ParallelOp)> candidate,
    llvm::function_ref<bool(mlir::scf::ParallelOp, mlir::scf::ParallelOp)> joins,
    llvm::function_ref<unsigned(mlir::scf::ParallelOp)> shared_dims) {
  bool merged = false;
  mlir::scf::ParallelOp leader;
  llvm::SmallVector<mlir::Operation*> between;  // pure ops after the leader
  for (mlir::Operation& op : llvm::make_early_inc_range(block)) {
    auto p = llvm::dyn_cast<mlir::scf::ParallelOp>(op);
    if (!p || !candidate(p)) {
      bool pure = mlir::isMemoryEffectFree(&op) && op.getNumRegions() == 0;
      if (leader && pure) {
        between.push_back(&op);
      } else {  // ops that stay between loops: nothing before them merges with what follows
        leader = nullptr;
        between.clear();
      }
      continue;
    }
    bool movable = leader != nullptr && joins(leader, p);
    for (mlir::Operation* x : between)
      for (mlir::Value v : x->getOperands())
        if (mlir::Operation* def = v.getDefiningOp();
            movable && def && def->getBlock() == &block && !def->isBeforeInBlock(leader) &&
            !llvm::is_contained(between, def))
          movable = false;
    if (!movable) {
      leader = p;
      between.clear();
      continue;
    }
    for (mlir::Operation* x : between) x->moveBefore(leader);
    between.clear();
    mlir::OpBuilder b(leader.getBody()->getTerminator());
    mlir::IRMapping map;
    for (unsigned d = 0; d < shared_dims(p); ++d)
      map.map(p.getInductionVars()[d], leader.getInductionVars()[d]);
    for (mlir::Operation& inner : p.getBody()->without_terminator()) b.clone(inner, map);
    p.erase();
    merged = true;
  }
  return merged;
}

/// Allocations go up to where their sizes are known, so they do not separate loops.
void hoist_allocations(mlir::Block& block) {
  for (auto alloc : llvm::to_vector(block.getOps<mlir::memref::AllocOp>())) {
    mlir::Operation* after = nullptr;
    for (mlir::Value v : alloc->getOperands())
      if (mlir::Operation* def = v.getDefiningOp();
          def && (!after || after->isBeforeInBlock(def)))
        after = def;
    if (after) alloc->moveAfter(after);
    else alloc->moveBefore(&block.front());
  }
}

/// The attribute that names a static row group's loops (fuse_static_row_loops) while they are
/// tried and merged.
constexpr llvm::StringLiteral kRowGroup = "kiln.row_group";

/// Merges the loops of `fn` tagged with a row group in `groups` (id -> row dims): each becomes a
/// loop over its group's row dims (keep_rows_parallel), then consecutive loops of one group
/// merge (merge_loop_runs).
void merge_row_groups(mlir::func::FuncOp fn, const llvm::DenseMap<int64_t, unsigned>& groups) {
  auto group_of = [](mlir::scf::ParallelOp p) -> int64_t {
    auto id = p->getAttrOfType<mlir::IntegerAttr>(kRowGroup);
    return id ? id.getInt() : -1;
  };
  for (mlir::scf::ParallelOp p : top_level_loops(fn)) {
    const int64_t id = group_of(p);
    auto it = groups.find(id);
    if (it == groups.end()) continue;
    mlir::scf::ParallelOp q = keep_rows_parallel(p, it->second);
    q->setAttr(kRowGroup, mlir::IntegerAttr::get(mlir::IntegerType::get(q.getContext(), 64), id));
  }
  merge_loop_runs(
      fn.getBody().front(), [&](mlir::scf::ParallelOp p) { return groups.contains(group_of(p)); },
      [&](mlir::scf::ParallelOp leader, mlir::scf::ParallelOp p) {
        return group_of(leader) == group_of(p);
      },
      [&](mlir::scf::ParallelOp p) { return groups.lookup(group_of(p)); });
}

}  // namespace

bool fuse_row_loops(mlir::func::FuncOp fn, bool verify) {
  mlir::Block& block = fn.getBody().front();
  auto loops = top_level_loops(fn);
  if (loops.size() < 2 || llvm::none_of(loops, has_serial_loop)) return false;
  hoist_allocations(block);
  if (verify && sink_loops_past_gemms(block))
    log_module("GPU rows: loops moved after GEMMs", fn->getParentOfType<mlir::ModuleOp>());
  auto stays = [](mlir::Operation& op) {  // an op no loop merges across
    auto p = llvm::dyn_cast<mlir::scf::ParallelOp>(op);
    if (p) return !is_row_loop(p);
    return !(mlir::isMemoryEffectFree(&op) && op.getNumRegions() == 0);
  };
  // The groups of row loops that share row dims: all of them, or (verify) each run.
  llvm::SmallVector<llvm::SmallVector<mlir::scf::ParallelOp>> groups(1);
  for (mlir::Operation& op : block) {
    if (verify && stays(op) && !groups.back().empty()) groups.emplace_back();
    if (auto p = llvm::dyn_cast<mlir::scf::ParallelOp>(op); p && is_row_loop(p))
      groups.back().push_back(p);
  }
  llvm::DenseMap<mlir::Operation*, unsigned> row_dims;  // of the loops that may merge
  for (auto& group : groups) {
    if (verify && (group.size() < 2 || llvm::none_of(group, has_serial_loop))) continue;
    const unsigned dims = shared_row_dims(group, verify);
    if (dims == 0) continue;
    for (mlir::scf::ParallelOp p : group) row_dims[keep_rows_parallel(p, dims)] = dims;
  }
  return merge_loop_runs(
      block, [&](mlir::scf::ParallelOp p) { return row_dims.contains(p); },
      [&](mlir::scf::ParallelOp leader, mlir::scf::ParallelOp p) {
        return row_dims.lookup(leader) == row_dims.lookup(p);
      },
      [&](mlir::scf::ParallelOp p) { return row_dims.lookup(p); });
}

bool fuse_static_row_loops(mlir::func::FuncOp fn,
                           llvm::function_ref<bool(mlir::scf::ParallelOp, int64_t)> accept) {
  mlir::Block& block = fn.getBody().front();
  auto loops = top_level_loops(fn);
  if (loops.size() < 2 || llvm::none_of(loops, has_serial_loop)) return false;
  hoist_allocations(block);
  auto is_static = [](mlir::scf::ParallelOp p) {
    if (p->getNumResults() != 0) return false;
    for (auto [lb, ub, step] : llvm::zip(p.getLowerBound(), p.getUpperBound(), p.getStep()))
      if (!mlir::isConstantIntValue(lb, 0) || !mlir::isConstantIntValue(step, 1) ||
          !mlir::getConstantIntValue(ub))
        return false;
    return true;
  };
  // Runs of static loops with only pure ops between them, cut greedily into groups that share
  // at least one row dim.
  llvm::SmallVector<llvm::SmallVector<mlir::scf::ParallelOp>> groups(1);
  for (mlir::Operation& op : block) {
    auto p = llvm::dyn_cast<mlir::scf::ParallelOp>(op);
    if (p && is_static(p)) {
      llvm::SmallVector<mlir::scf::ParallelOp>& group = groups.back();
      group.push_back(p);
      if (group.size() > 1 && shared_row_dims(group, /*verify=*/true) == 0) {
        group.pop_back();
        groups.push_back({p});
      }
      continue;
    }
    if (!(mlir::isMemoryEffectFree(&op) && op.getNumRegions() == 0) && !groups.back().empty())
      groups.emplace_back();
  }
  llvm::DenseMap<int64_t, unsigned> dims;       // group id -> row dims
  llvm::DenseMap<int64_t, int64_t> iterations;  // group id -> its largest loop's iterations
  mlir::Builder b(fn.getContext());
  for (auto [id, group] : llvm::enumerate(groups)) {
    if (group.size() < 2 || llvm::none_of(group, has_serial_loop)) continue;
    dims[id] = shared_row_dims(group, /*verify=*/true);
    for (mlir::scf::ParallelOp p : group) {
      p->setAttr(kRowGroup, b.getI64IntegerAttr(id));
      int64_t n = 1;
      for (mlir::Value ub : p.getUpperBound()) n *= *mlir::getConstantIntValue(ub);
      iterations[id] = std::max(iterations.lookup(id), n);
    }
  }
  if (dims.empty()) return false;
  // Each group is merged in a copy first: it merges only if every loop it becomes is one that
  // `accept`s.
  llvm::DenseMap<int64_t, unsigned> accepted = dims;
  auto trial = llvm::cast<mlir::func::FuncOp>(fn->clone());
  merge_row_groups(trial, dims);
  for (mlir::scf::ParallelOp p : top_level_loops(trial))
    if (auto id = p->getAttrOfType<mlir::IntegerAttr>(kRowGroup);
        id && !accept(p, iterations.lookup(id.getInt())))
      accepted.erase(id.getInt());
  trial->erase();
  merge_row_groups(fn, accepted);
  for (mlir::scf::ParallelOp p : top_level_loops(fn)) p->removeAttr(kRowGroup);
  return !accepted.empty();
}


bool own_buffer(mlir::Value m, const std::function<bool(mlir::Operation*)>& inside) {
  llvm::SmallPtrSet<mlir::Operation*, 16> seen;
  // A reshape of an argument or allocation is that buffer under another shape (an output that
  // forward_output_copies put in a temporary's place: [n] expanded back to a keepdim
  // reduction's [rows, 1]) when nothing else reaches the buffer inside the loops; other uses
  // after them (the optimizer reading a gradient) are fine.
  mlir::Value root = m;
  mlir::Operation* reshape = m.getDefiningOp();
  if (llvm::isa_and_nonnull<mlir::memref::ExpandShapeOp, mlir::memref::CollapseShapeOp>(reshape))
    root = reshape->getOperand(0);
  else
    reshape = nullptr;
  // An argument of the function, not of a loop (an iter_arg may be any buffer).
  auto arg = llvm::dyn_cast<mlir::BlockArgument>(root);
  const bool function_argument =
      arg && arg.getOwner()->isEntryBlock() &&
      llvm::isa<mlir::func::FuncOp>(arg.getOwner()->getParentOp());
  if (!function_argument && !root.getDefiningOp<mlir::memref::AllocOp>()) return false;
  auto reaches_inside = [&](mlir::Value buffer, mlir::Operation* except) {
    for (mlir::Operation* user : buffer.getUsers())
      if (user != except &&
          !llvm::isa<mlir::memref::LoadOp, mlir::memref::StoreOp, mlir::memref::DeallocOp,
                     mlir::memref::DimOp>(user) &&
          reaches(user, inside, seen))
        return true;
    return false;
  };
  if (reaches_inside(m, nullptr)) return false;
  if (!reshape) return true;
  // The buffer under its own shape: no other access or view of it inside the loops.
  seen.clear();
  for (mlir::Operation* user : root.getUsers())
    if (user != reshape && (inside(user) || reaches(user, inside, seen))) return false;
  return true;
}

mlir::Value accessed_memref(mlir::Operation* op) {
  if (auto l = llvm::dyn_cast<mlir::memref::LoadOp>(op)) return l.getMemRef();
  if (auto s = llvm::dyn_cast<mlir::memref::StoreOp>(op)) return s.getMemRef();
  return {};
}

mlir::ValueRange access_index_values(mlir::Operation* op) {
  if (auto l = llvm::dyn_cast<mlir::memref::LoadOp>(op)) return l.getIndices();
  return llvm::cast<mlir::memref::StoreOp>(op).getIndices();
}

bool noalias_argument(mlir::Value root) {
  auto arg = llvm::dyn_cast<mlir::BlockArgument>(root);
  if (!arg) return false;
  auto fn = llvm::dyn_cast<mlir::func::FuncOp>(arg.getOwner()->getParentOp());
  return fn && fn.getArgAttr(arg.getArgNumber(), "llvm.noalias");
}

namespace {

mlir::MutableOperandRange access_indices(mlir::Operation* op) {
  if (auto l = llvm::dyn_cast<mlir::memref::LoadOp>(op)) return l.getIndicesMutable();
  return llvm::cast<mlir::memref::StoreOp>(op).getIndicesMutable();
}


/// An allocation used only by loads and stores inside one top-level parallel loop, at that
/// loop's indices in its leading dims (and by its dealloc), becomes one slice: those dims 1,
/// indexed 0. Valid because the CPU runs the loop's iterations one after another. Returns the
/// new allocation and its loop, or nulls.
std::pair<mlir::memref::AllocOp, mlir::scf::ParallelOp> contract_to_one_row(
    mlir::memref::AllocOp alloc) {
  mlir::scf::ParallelOp loop;
  llvm::SmallVector<mlir::Operation*> accesses;
  for (mlir::Operation* user : alloc->getUsers()) {
    if (llvm::isa<mlir::memref::DeallocOp>(user)) continue;
    if (!llvm::isa<mlir::memref::LoadOp, mlir::memref::StoreOp>(user)) return {};
    auto p = user->getParentOfType<mlir::scf::ParallelOp>();
    while (p && p->getParentOfType<mlir::scf::ParallelOp>())
      p = p->getParentOfType<mlir::scf::ParallelOp>();
    if (!p || (loop && p != loop)) return {};
    loop = p;
    accesses.push_back(user);
  }
  // The loop must be top-level, beside the allocation: inside a serial loop the buffer would
  // carry each row's values from one of its iterations to the next.
  if (!loop || loop->getBlock() != alloc->getBlock()) return {};
  const unsigned k = loop.getNumLoops();
  mlir::MemRefType type = alloc.getType();
  if (type.getRank() < k || !type.getLayout().isIdentity()) return {};
  for (mlir::Operation* op : accesses)
    for (unsigned d = 0; d < k; ++d)
      if (access_indices(op)[d].get() != loop.getInductionVars()[d]) return {};
  llvm::SmallVector<int64_t> shape(type.getShape());
  llvm::SmallVector<mlir::Value> sizes;  // the dynamic sizes of dims k and after
  unsigned dynamic = 0;
  for (unsigned d = 0; d < shape.size(); ++d) {
    bool is_dynamic = mlir::ShapedType::isDynamic(shape[d]);
    if (d >= k && is_dynamic) sizes.push_back(alloc.getDynamicSizes()[dynamic]);
    dynamic += is_dynamic;
    if (d < k) shape[d] = 1;
  }
  mlir::OpBuilder b(alloc);
  auto row = mlir::memref::AllocOp::create(
      b, alloc.getLoc(), mlir::MemRefType::get(shape, type.getElementType()), sizes,
      alloc.getAlignmentAttr());
  auto zero = mlir::arith::ConstantIndexOp::create(b, alloc.getLoc(), 0);
  for (mlir::Operation* op : accesses)
    for (unsigned d = 0; d < k; ++d) access_indices(op)[d].set(zero);
  alloc->replaceAllUsesWith(row);
  alloc.erase();
  return {row, loop};
}

/// A one-row buffer `row` (contract_to_one_row) of the row loop `loop` whose last reader is a
/// loop `last` that copies it, element for element, into the row's slice of an output buffer
/// written nowhere else becomes that slice: softmax's exp is stored in the output row and scaled
/// there in place, as eager's kernel does, instead of being stored, read back and stored again.
/// The output must be an argument marked llvm.noalias, with the row's shape after the row dims.
void compute_in_output_row(mlir::memref::AllocOp row, mlir::scf::ParallelOp loop) {
  const unsigned k = loop.getNumLoops();
  llvm::SmallVector<mlir::Operation*> row_uses;
  for (mlir::Operation* user : row->getUsers()) {
    if (llvm::isa<mlir::memref::DeallocOp>(user)) continue;
    if (!llvm::isa<mlir::memref::LoadOp, mlir::memref::StoreOp>(user)) return;
    row_uses.push_back(user);
  }
  // The top-level op of the loop body that holds the last use of the row.
  mlir::Block* body = loop.getBody();
  mlir::Operation* last = nullptr;
  for (mlir::Operation* use : row_uses) {
    mlir::Operation* top = body->findAncestorOpInBlock(*use);
    if (!top) return;
    if (!last || last->isBeforeInBlock(top)) last = top;
  }
  auto copy_loop = llvm::dyn_cast_or_null<mlir::scf::ForOp>(last);
  if (!copy_loop) return;
  // The output: the first argument marked llvm.noalias that a store in that loop writes.
  mlir::Value out;
  copy_loop.walk([&](mlir::memref::StoreOp s) {
    if (!out && s.getMemRef() != row.getResult() && noalias_argument(s.getMemRef()))
      out = s.getMemRef();
  });
  if (!out) return;
  auto out_type = llvm::cast<mlir::MemRefType>(out.getType());
  mlir::MemRefType row_type = row.getType();
  if (out_type.getRank() != row_type.getRank() || !out_type.getLayout().isIdentity() ||
      out_type.getElementType() != row_type.getElementType())
    return;
  for (unsigned d = k; d < row_type.getRank(); ++d)
    if (out_type.getDimSize(d) != row_type.getDimSize(d) || row_type.isDynamicDim(d)) return;
  // Every access of the output is in the copy loop, at the row's own indices.
  for (mlir::Operation* user : out.getUsers()) {
    if (llvm::isa<mlir::memref::DimOp>(user)) continue;
    if (!llvm::isa<mlir::memref::LoadOp, mlir::memref::StoreOp>(user) ||
        !copy_loop->isAncestor(user))
      return;
    for (unsigned d = 0; d < k; ++d)
      if (access_indices(user)[d].get() != loop.getInductionVars()[d]) return;
  }
  // In the copy loop, directly in its body, the row is only loaded and the output only stored,
  // every load before the first store, all at the same trailing indices, which include the
  // loop's index: each element is read from the row, then written to the output, in one
  // iteration, and nothing reads the row after the output took its place.
  llvm::SmallVector<mlir::Operation*> in_copy;
  bool copies = true;
  mlir::Operation* first_store = nullptr;
  copy_loop.walk([&](mlir::Operation* op) {
    if (!llvm::isa<mlir::memref::LoadOp, mlir::memref::StoreOp>(op)) return;
    const bool of_row = accessed_memref(op) == row.getResult();
    if (!of_row && accessed_memref(op) != out) return;
    const bool store = llvm::isa<mlir::memref::StoreOp>(op);
    copies &= op->getBlock() == copy_loop.getBody() && store != of_row &&
              (store || !first_store);
    if (store && !first_store) first_store = op;
    in_copy.push_back(op);
  });
  if (!copies) return;
  mlir::Value iv = copy_loop.getInductionVar();
  for (mlir::Operation* op : in_copy) {
    auto first = access_indices(in_copy.front()), mine = access_indices(op);
    bool has_iv = false;
    for (unsigned d = k; d < row_type.getRank(); ++d) {
      if (mine[d].get() != first[d].get()) return;
      has_iv |= mine[d].get() == iv;
    }
    if (!has_iv) return;
  }
  for (mlir::Operation* op : row_uses) {
    for (unsigned d = 0; d < k; ++d) access_indices(op)[d].set(loop.getInductionVars()[d]);
    // The buffer is operand 0 of a load, 1 of a store (after the value).
    op->setOperand(llvm::isa<mlir::memref::LoadOp>(op) ? 0 : 1, out);
  }
  for (mlir::Operation* user : llvm::to_vector(row->getUsers())) user->erase();  // the dealloc
  row.erase();
}

/// Whether `a` and `b` run over the same iteration space: the same lower and upper bounds and
/// steps (the same values, or equal constants) in every dim.
bool same_domain(mlir::scf::ParallelOp a, mlir::scf::ParallelOp b) {
  if (a.getNumLoops() != b.getNumLoops()) return false;
  auto same = [](mlir::Value x, mlir::Value y) {
    auto cx = mlir::getConstantIntValue(x), cy = mlir::getConstantIntValue(y);
    return x == y || (cx && cy && *cx == *cy);
  };
  for (unsigned d = 0; d < a.getNumLoops(); ++d)
    if (!same(a.getLowerBound()[d], b.getLowerBound()[d]) ||
        !same(a.getUpperBound()[d], b.getUpperBound()[d]) ||
        !same(a.getStep()[d], b.getStep()[d]))
      return false;
  return true;
}

/// Whether the bodies of `a` and of `b` (after it, same_domain) may run one after the other in
/// each iteration: every buffer either writes is its own (own_buffer) and every access of it in
/// both loops is at the same indices — each a loop index (the same dim in both) or a value from
/// outside the loops — which use every loop index unless the loops have one iteration. Each
/// iteration then touches only its own elements of what they write.
bool same_elements(mlir::scf::ParallelOp a, mlir::scf::ParallelOp b) {
  // Only loads, stores, loops and pure ops: a write of another kind (an atomic of a scatter, a
  // copy, a call) would escape the index checks below.
  llvm::SmallDenseSet<mlir::Value, 8> written;
  bool known = true;
  for (mlir::scf::ParallelOp p : {a, b}) {
    p.walk([&](mlir::Operation* op) {
      if (auto st = llvm::dyn_cast<mlir::memref::StoreOp>(op)) written.insert(st.getMemRef());
      else if (!llvm::isa<mlir::memref::LoadOp, mlir::scf::ParallelOp, mlir::scf::ForOp,
                          mlir::scf::IfOp, mlir::scf::YieldOp, mlir::scf::ReduceOp,
                          mlir::scf::ReduceReturnOp>(op))
        known &= op->getNumRegions() == 0 && mlir::isMemoryEffectFree(op);
    });
  }
  if (!known) return false;
  auto inside = [&](mlir::Operation* op) { return a->isAncestor(op) || b->isAncestor(op); };
  for (mlir::Value m : written)
    if (!own_buffer(m, inside)) return false;
  bool one_iteration = true;
  for (unsigned d = 0; d < a.getNumLoops(); ++d) {
    auto lb = mlir::getConstantIntValue(a.getLowerBound()[d]);
    auto ub = mlir::getConstantIntValue(a.getUpperBound()[d]);
    one_iteration &= lb && ub && *ub - *lb <= 1;
  }
  // An index: the loop dim it is, a constant, or a value from outside the loops.
  enum Kind { kLoopDim, kConstant, kOutside };
  using Index = std::tuple<Kind, int64_t, mlir::Value>;
  llvm::DenseMap<mlir::Value, llvm::SmallVector<Index>> first;  // per written buffer
  bool ok = true;
  for (mlir::scf::ParallelOp p : {a, b}) {
    p.walk([&](mlir::Operation* op) {
      mlir::Value m;
      mlir::ValueRange indices;
      if (auto l = llvm::dyn_cast<mlir::memref::LoadOp>(op)) {
        m = l.getMemRef();
        indices = l.getIndices();
      } else if (auto st = llvm::dyn_cast<mlir::memref::StoreOp>(op)) {
        m = st.getMemRef();
        indices = st.getIndices();
      } else {
        for (mlir::Value v : op->getOperands()) ok &= !written.contains(v);  // a view, a copy
        return;
      }
      if (!written.contains(m)) return;
      llvm::SmallVector<Index> key;
      llvm::SmallVector<bool> used(p.getNumLoops(), false);
      for (mlir::Value v : indices) {
        auto ivs = p.getInductionVars();
        auto it = llvm::find(ivs, v);
        if (it != ivs.end()) {
          const auto d = static_cast<size_t>(it - ivs.begin());
          used[d] = true;
          key.push_back({kLoopDim, static_cast<int64_t>(d), {}});
        } else {
          mlir::Operation* def = v.getDefiningOp();
          auto arg = llvm::dyn_cast<mlir::BlockArgument>(v);
          ok &= (def && !inside(def)) ||
                (arg && !inside(arg.getOwner()->getParentOp()) &&
                 arg.getOwner()->getParentOp() != a.getOperation() &&
                 arg.getOwner()->getParentOp() != b.getOperation());
          if (auto c = mlir::getConstantIntValue(v)) key.push_back({kConstant, *c, {}});
          else key.push_back({kOutside, 0, v});
        }
      }
      ok &= one_iteration || llvm::all_of(used, [](bool u) { return u; });
      auto [it, fresh] = first.try_emplace(m, key);
      ok &= fresh || it->second == key;
    });
  }
  return ok;
}

/// kiln-cpu-row-loops{verify=false}: cpu_row_loops on every function, for lit tests
/// (tests/ir/cpu-row-loops.mlir).
struct CpuRowLoopsPass
    : mlir::PassWrapper<CpuRowLoopsPass, mlir::OperationPass<mlir::func::FuncOp>> {
  MLIR_DEFINE_EXPLICIT_INTERNAL_INLINE_TYPE_ID(CpuRowLoopsPass)
  CpuRowLoopsPass() = default;
  CpuRowLoopsPass(const CpuRowLoopsPass& other) : PassWrapper(other) {}
  llvm::StringRef getArgument() const override { return "kiln-cpu-row-loops"; }
  llvm::StringRef getDescription() const override {
    return "merge the CPU's row loops, shrink row buffers to one row, compute rows in the "
           "outputs, merge column loops, prefetch rows (codegen/row_fusion.cpp)";
  }
  // fuse_column_loops marks loops with LLVM loop annotations.
  void getDependentDialects(mlir::DialectRegistry& registry) const override {
    registry.insert<mlir::LLVM::LLVMDialect>();
  }
  void runOnOperation() override {
    if (!getOperation().isExternal()) cpu_row_loops(getOperation(), verify);
  }
  Option<bool> verify{*this, "verify",
                      llvm::cl::desc("check that dim 0 is shared (no row-split analysis)"),
                      llvm::cl::init(false)};
};

/// kiln-fuse-same-domain-loops: fuse_same_domain_loops on every function, for lit tests
/// (tests/ir/fuse-same-domain-loops.mlir).
struct SameDomainLoopsPass
    : mlir::PassWrapper<SameDomainLoopsPass, mlir::OperationPass<mlir::func::FuncOp>> {
  MLIR_DEFINE_EXPLICIT_INTERNAL_INLINE_TYPE_ID(SameDomainLoopsPass)
  llvm::StringRef getArgument() const override { return "kiln-fuse-same-domain-loops"; }
  llvm::StringRef getDescription() const override {
    return "merge consecutive parallel loops over one iteration space that touch their own "
           "elements (codegen/row_fusion.cpp)";
  }
  void runOnOperation() override {
    if (!getOperation().isExternal()) fuse_same_domain_loops(getOperation());
  }
};

}  // namespace

bool cpu_row_loops(mlir::func::FuncOp fn, bool verify) {
  fuse_row_loops(fn, verify);
  mlir::Block& body = fn.getBody().front();
  for (auto alloc : llvm::to_vector(body.getOps<mlir::memref::AllocOp>()))
    if (auto [row, loop] = contract_to_one_row(alloc); row) compute_in_output_row(row, loop);
  fuse_column_loops(fn);
  block_float32_sums(fn);
  block_float64_sums(fn);
  prefetch_next_rows(fn);
  bool per_row = true;
  fn.walk([&](mlir::memref::AllocOp a) { per_row &= a.getDynamicSizes().empty(); });
  return per_row;
}

bool fuse_same_domain_loops(mlir::func::FuncOp fn) {
  return merge_loop_runs(
      fn.getBody().front(), [](mlir::scf::ParallelOp p) { return p->getNumResults() == 0; },
      [](mlir::scf::ParallelOp leader, mlir::scf::ParallelOp p) {
        return same_domain(leader, p) && same_elements(leader, p);
      },
      [](mlir::scf::ParallelOp p) { return p.getNumLoops(); });
}

void register_cpu_row_loops_pass(mlir::DialectRegistry& registry) {
  registry.insert<mlir::scf::SCFDialect, mlir::memref::MemRefDialect>();
  mlir::PassRegistration<CpuRowLoopsPass>();
  mlir::PassRegistration<SameDomainLoopsPass>();
}

}  // namespace kiln::codegen
