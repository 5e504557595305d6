// Parallel loop nests of graphs that are not row-splittable (cpu_parallel.h).
#include "codegen/cpu_parallel.h"

#include <algorithm>

#include "codegen/lower.h"
#include "codegen/omp_runtime.h"
#include "codegen/transposed_tiles.h"
#include "core/error.h"
#include "mlir/Dialect/Utils/StaticValueUtils.h"
#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

namespace kiln::codegen {
namespace {

constexpr char kWorkHint[] = "kiln_rt_parallel_work";
constexpr char kColumnBlockFn[] = "kiln_rt_column_block";

/// Replaces `p` by an scf.parallel over its first `keep` dims (none: no parallel loop) around
/// scf.for loops over the others, with the same body.
void split_parallel(mlir::scf::ParallelOp p, unsigned keep) {
  mlir::OpBuilder b(p);
  mlir::Location loc = p.getLoc();
  auto lbs = p.getLowerBound(), ubs = p.getUpperBound(), steps = p.getStep();
  mlir::Block* body = p.getBody();
  mlir::IRMapping map;
  auto build_fors = [&](mlir::OpBuilder& b, unsigned from) {
    for (unsigned d = from; d < p.getNumLoops(); ++d) {
      auto f = mlir::scf::ForOp::create(b, loc, lbs[d], ubs[d], steps[d]);
      map.map(body->getArgument(d), f.getInductionVar());
      b.setInsertionPoint(f.getBody()->getTerminator());
    }
    for (mlir::Operation& op : body->without_terminator()) b.clone(op, map);
  };
  if (keep == 0) {
    build_fors(b, 0);
  } else {
    mlir::scf::ParallelOp::create(
        b, loc, lbs.take_front(keep), ubs.take_front(keep), steps.take_front(keep),
        [&](mlir::OpBuilder& nb, mlir::Location, mlir::ValueRange ivs) {
          for (unsigned d = 0; d < keep; ++d) map.map(body->getArgument(d), ivs[d]);
          build_fors(nb, keep);
        });
  }
  p.erase();
}

/// (lower, upper) bounds of every loop of a nest.
using Bounds = llvm::SmallVector<std::pair<mlir::Value, mlir::Value>>;

void append_bounds(Bounds& out, mlir::ValueRange lbs, mlir::ValueRange ubs) {
  for (auto [lb, ub] : llvm::zip(lbs, ubs)) out.emplace_back(lb, ub);
}

/// A nest with fewer iterations than the runtime would share out, known now: it stays
/// sequential code, so small graphs (the digits MLP's) pay no fork call per loop.
bool statically_small(const Bounds& nest) {
  int64_t iterations = 1;
  for (auto [lb, ub] : nest) {
    auto l = mlir::getConstantIntValue(lb), u = mlir::getConstantIntValue(ub);
    if (!l || !u) return false;
    iterations *= std::max<int64_t>(*u - *l, 0);
  }
  return iterations < kParallelMinIterations;
}

/// kiln_rt_parallel_work(iterations of the whole nest) at `b`'s insertion point (the runtime
/// runs small ones on the calling thread).
void call_work_hint(mlir::OpBuilder& b, mlir::Location loc, const Bounds& nest) {
  mlir::Value work = mlir::arith::ConstantIndexOp::create(b, loc, 1);
  for (auto [lb, ub] : nest)
    work = mlir::arith::MulIOp::create(b, loc, work, mlir::arith::SubIOp::create(b, loc, ub, lb));
  mlir::func::CallOp::create(b, loc, kWorkHint, mlir::TypeRange{}, mlir::ValueRange{work});
}

constexpr char kInterchanged[] = "kiln.reduction_outside_columns";

/// A reduction over leading dims (a bias gradient: [rows, cols] -> [cols]) lowers to
///   scf.for %i (rows) { scf.parallel %j (cols) { out[j] += in[i, j] } }
/// whose parallel loop, nested in a sequential one, would run on one thread. Rewritten as
///   scf.parallel %jb (blocks of w cols) { scf.for %i { scf.for %j in block {...} } }
/// so the column blocks are shared out and the innermost loop still runs over contiguous
/// columns. The width w comes from the runtime (kiln_rt_column_block: one block per thread),
/// so each row's run of a block is as long as it can be: with 64-column blocks every row of a
/// [1024, 1024] sum read 256 bytes from each input and then jumped a page, and the FFN bias
/// gradient's nest took 1.2 ms instead of 0.8. Legal because the nests come from linalg ops,
/// whose output elements are indexed by the parallel dims only: different columns never touch the same element, and each column
/// still adds its rows in the same order. Only perfect nests (each loop body holds just the
/// next loop) of scf.for loops without iter_args around one scf.parallel with step-1 loops are
/// rewritten; small static nests are left alone, and the others get the work hint like other
/// nests (`outer` is then erased).
void interchange_reduction_nest(mlir::scf::ForOp outer) {
  llvm::SmallVector<mlir::scf::ForOp> fors;
  mlir::scf::ParallelOp par;
  if (!match_reduction_nest(outer, fors, par)) return;
  Bounds nest;
  for (mlir::scf::ForOp f : fors)
    append_bounds(nest, f.getLowerBound(), f.getUpperBound());
  append_bounds(nest, par.getLowerBound(), par.getUpperBound());
  if (statically_small(nest)) return;

  mlir::OpBuilder b(outer);
  mlir::Location loc = outer.getLoc();
  auto cst = [&](int64_t v) { return mlir::arith::ConstantIndexOp::create(b, loc, v).getResult(); };
  call_work_hint(b, loc, nest);

  const unsigned n = par.getNumLoops();
  mlir::Value col_lb = par.getLowerBound()[n - 1], col_ub = par.getUpperBound()[n - 1];
  mlir::Value one = cst(1), zero = cst(0);
  mlir::Value cols = mlir::arith::SubIOp::create(b, loc, col_ub, col_lb);
  mlir::Value block = mlir::func::CallOp::create(b, loc, kColumnBlockFn,
                                                 mlir::TypeRange{b.getIndexType()},
                                                 mlir::ValueRange{cols})
                          .getResult(0);
  mlir::Value blocks = mlir::arith::CeilDivSIOp::create(b, loc, cols, block);
  llvm::SmallVector<mlir::Value> lbs(par.getLowerBound().take_front(n - 1));
  llvm::SmallVector<mlir::Value> ubs(par.getUpperBound().take_front(n - 1));
  llvm::SmallVector<mlir::Value> steps(par.getStep().take_front(n - 1));
  lbs.push_back(zero), ubs.push_back(blocks), steps.push_back(one);
  mlir::Block* body = par.getBody();
  auto np = mlir::scf::ParallelOp::create(
      b, loc, lbs, ubs, steps, [&](mlir::OpBuilder& nb, mlir::Location, mlir::ValueRange ivs) {
        mlir::IRMapping map;
        for (unsigned d = 0; d + 1 < n; ++d) map.map(body->getArgument(d), ivs[d]);
        mlir::Value first = mlir::arith::AddIOp::create(
            nb, loc, col_lb, mlir::arith::MulIOp::create(nb, loc, ivs[n - 1], block));
        mlir::Value last = mlir::arith::MinSIOp::create(
            nb, loc, mlir::arith::AddIOp::create(nb, loc, first, block), col_ub);
        for (mlir::scf::ForOp f : fors) {
          auto nf = mlir::scf::ForOp::create(nb, loc, f.getLowerBound(), f.getUpperBound(),
                                             f.getStep());
          map.map(f.getInductionVar(), nf.getInductionVar());
          nb.setInsertionPoint(nf.getBody()->getTerminator());
        }
        auto col_loop = mlir::scf::ForOp::create(nb, loc, first, last, one);
        map.map(body->getArgument(n - 1), col_loop.getInductionVar());
        nb.setInsertionPoint(col_loop.getBody()->getTerminator());
        for (mlir::Operation& op : body->without_terminator()) nb.clone(op, map);
      });
  np->setAttr(kInterchanged, b.getUnitAttr());
  if (par->hasAttr(kScatterLoopAttr)) np->setAttr(kScatterLoopAttr, b.getUnitAttr());
  outer.erase();
}

/// Replaces loops fors[first, last) of a perfect nest by one scf.parallel over them (the loops
/// after them and the innermost body inside it), tagged kScatterLoopAttr.
void loops_to_parallel(llvm::MutableArrayRef<mlir::scf::ForOp> fors, size_t first, size_t last) {
  mlir::OpBuilder b(fors[first]);
  mlir::Location loc = fors[first].getLoc();
  llvm::SmallVector<mlir::Value> lbs, ubs, steps;
  for (size_t i = first; i < last; ++i) {
    lbs.push_back(fors[i].getLowerBound());
    ubs.push_back(fors[i].getUpperBound());
    steps.push_back(fors[i].getStep());
  }
  auto par = mlir::scf::ParallelOp::create(
      b, loc, lbs, ubs, steps, [&](mlir::OpBuilder& nb, mlir::Location, mlir::ValueRange ivs) {
        mlir::IRMapping map;
        for (size_t i = first; i < last; ++i) map.map(fors[i].getInductionVar(), ivs[i - first]);
        for (size_t i = last; i < fors.size(); ++i) {
          auto nf = mlir::scf::ForOp::create(nb, loc, map.lookupOrDefault(fors[i].getLowerBound()),
                                             map.lookupOrDefault(fors[i].getUpperBound()),
                                             map.lookupOrDefault(fors[i].getStep()));
          map.map(fors[i].getInductionVar(), nf.getInductionVar());
          nb.setInsertionPoint(nf.getBody()->getTerminator());
        }
        for (mlir::Operation& op : fors.back().getBody()->without_terminator()) nb.clone(op, map);
      });
  par->setAttr(kScatterLoopAttr, b.getUnitAttr());
  fors[first].erase();
}

/// prepare_parallel_loops' first step for index_add / scatter_add nests (cpu_parallel.h).
void share_out_scatter_nests(mlir::func::FuncOp fn) {
  llvm::SmallVector<mlir::scf::ForOp> outers;
  for (mlir::Operation& op : fn.getBody().front())
    if (auto f = llvm::dyn_cast<mlir::scf::ForOp>(op); f && f->hasAttr(kScatterLoopAttr))
      outers.push_back(f);
  for (mlir::scf::ForOp outer : outers) {
    llvm::SmallVector<mlir::scf::ForOp> fors;
    if (!match_scatter_nest(outer, fors)) continue;
    size_t axis = fors.size();  // none: its loop had one iteration and was folded away
    for (size_t i = 0; i < fors.size(); ++i)
      if (fors[i]->hasAttr(kScatterAxisAttr)) axis = i;
    if (axis + 1 < fors.size()) loops_to_parallel(fors, axis + 1, fors.size());
    else if (axis > 0) loops_to_parallel(fors, 0, axis);
  }
}

/// The innermost loops of index_add / scatter_add nests read the index and clamp it per
/// element; when that does not change along the loop (index_add's row index, over a row's
/// columns), those ops move before it. The store's address is then affine in the loop and
/// LLVM vectorises it (a load it cannot prove unaliased with the store would stay). Loads
/// move only from buffers the nest never writes.
void hoist_scatter_invariants(mlir::func::FuncOp fn) {
  auto in_scatter = [&](mlir::Operation* op) -> mlir::Operation* {  // its outermost tagged op
    mlir::Operation* root = nullptr;
    for (mlir::Operation* a = op; a && a != fn.getOperation(); a = a->getParentOp())
      if (a->hasAttr(kScatterLoopAttr)) root = a;
    return root;
  };
  auto is_loop = [](mlir::Operation* op) {
    return llvm::isa<mlir::scf::ForOp, mlir::scf::ParallelOp>(op);
  };
  llvm::SmallVector<std::pair<mlir::Operation*, mlir::Operation*>> innermost;  // (loop, root)
  fn.walk([&](mlir::Operation* op) {
    if (!is_loop(op)) return;
    mlir::Operation* root = in_scatter(op);
    if (!root) return;
    bool nested = false;
    op->walk([&](mlir::Operation* x) { nested |= x != op && is_loop(x); });
    if (!nested) innermost.emplace_back(op, root);
  });
  for (auto [loop, root] : innermost) {
    llvm::SmallDenseSet<mlir::Value, 4> written;
    root->walk([&](mlir::memref::StoreOp s) { written.insert(s.getMemRef()); });
    root->walk([&](mlir::memref::AtomicRMWOp a) { written.insert(a.getMemref()); });
    auto outside = [&](mlir::Value v) {
      return !loop->isAncestor(v.getParentBlock()->getParentOp());
    };
    for (mlir::Operation& op : llvm::make_early_inc_range(loop->getRegion(0).front())) {
      if (op.getNumRegions() != 0 || op.hasTrait<mlir::OpTrait::IsTerminator>() ||
          !llvm::all_of(op.getOperands(), outside))
        continue;
      auto load = llvm::dyn_cast<mlir::memref::LoadOp>(op);
      if (mlir::isMemoryEffectFree(&op) || (load && !written.contains(load.getMemRef())))
        op.moveBefore(loop);
    }
  }
}

}  // namespace

bool match_scatter_nest(mlir::scf::ForOp outer, llvm::SmallVectorImpl<mlir::scf::ForOp>& fors) {
  fors.assign({outer});
  for (;;) {
    mlir::scf::ForOp f = fors.back();
    if (!f->hasAttr(kScatterLoopAttr) || f.getNumResults() != 0) return false;
    mlir::Block* body = f.getBody();
    auto inner = llvm::dyn_cast<mlir::scf::ForOp>(body->front());
    if (!inner) return true;
    if (body->getOperations().size() != 2) return false;  // the next loop and the yield
    fors.push_back(inner);
  }
}

bool match_reduction_nest(mlir::scf::ForOp outer, llvm::SmallVectorImpl<mlir::scf::ForOp>& fors,
                          mlir::scf::ParallelOp& par) {
  fors.assign({outer});
  par = nullptr;
  for (;;) {
    mlir::scf::ForOp f = fors.back();
    if (!f.getInitArgs().empty() || f.getNumResults() != 0) return false;
    mlir::Block* body = f.getBody();
    if (body->getOperations().size() != 2) return false;  // the next loop and the yield
    mlir::Operation* next = &body->front();
    if (auto inner = llvm::dyn_cast<mlir::scf::ForOp>(next)) {
      fors.push_back(inner);
      continue;
    }
    par = llvm::dyn_cast<mlir::scf::ParallelOp>(next);
    break;
  }
  if (!par || par.getNumResults() != 0) return false;
  for (mlir::Value step : par.getStep())
    if (mlir::getConstantIntValue(step) != 1) return false;
  // Loop bounds must come from outside the nest (they are hoisted constants or dims).
  auto outside = [&](mlir::Value v) {
    return !outer->isAncestor(v.getParentBlock()->getParentOp());
  };
  for (mlir::scf::ForOp f : fors)
    if (!outside(f.getLowerBound()) || !outside(f.getUpperBound()) || !outside(f.getStep()))
      return false;
  for (mlir::Value v : llvm::concat<const mlir::Value>(par.getLowerBound(), par.getUpperBound()))
    if (!outside(v)) return false;
  return true;
}

void prepare_parallel_loops(mlir::ModuleOp m) {
  auto fn = m.lookupSymbol<mlir::func::FuncOp>("main");
  if (!fn) return;
  share_out_scatter_nests(fn);
  bool any = false;
  fn.walk([&](mlir::scf::ParallelOp) { any = true; });
  if (!any) return;
  mlir::OpBuilder mb(m.getBodyRegion());
  mlir::Type index = mb.getIndexType();
  auto declare = [&](const char* name, mlir::FunctionType type) {
    if (m.lookupSymbol<mlir::func::FuncOp>(name)) return;
    mb.setInsertionPointToStart(m.getBody());
    mlir::func::FuncOp::create(mb, m.getLoc(), name, type).setPrivate();
  };
  declare(kWorkHint, mb.getFunctionType({index}, {}));
  declare(kColumnBlockFn, mb.getFunctionType({index}, {index}));
  // Reductions over leading dims first; their new parallel loops are finished already.
  llvm::SmallVector<mlir::scf::ForOp> top_fors;
  for (mlir::Operation& op : fn.getBody().front())
    if (auto f = llvm::dyn_cast<mlir::scf::ForOp>(op)) top_fors.push_back(f);
  for (mlir::scf::ForOp f : top_fors) interchange_reduction_nest(f);
  hoist_scatter_invariants(fn);
  llvm::SmallVector<mlir::scf::ParallelOp> loops;
  fn.walk([&](mlir::scf::ParallelOp p) {
    if (!p->hasAttr(kInterchanged)) loops.push_back(p);
  });
  // walk() is post-order: loops nested in others come first and are made sequential before
  // their parent is rewritten (clone then copies the sequential form).
  for (mlir::scf::ParallelOp p : loops) {
    if (p.getNumResults() != 0)
      throw Error("codegen::Executable", "a parallel loop with reductions is not supported");
    if (p->getParentOp() != fn.getOperation()) {
      split_parallel(p, 0);
      continue;
    }
    Bounds nest;
    append_bounds(nest, p.getLowerBound(), p.getUpperBound());
    // A scatter's parallel loop around its sequential loops (share_out_scatter_nests): their
    // iterations are its work too.
    if (p->hasAttr(kScatterLoopAttr))
      p.getBody()->walk([&](mlir::scf::ForOp f) {
        auto outside = [&](mlir::Value v) {
          return !p->isAncestor(v.getParentBlock()->getParentOp());
        };
        if (outside(f.getLowerBound()) && outside(f.getUpperBound()))
          append_bounds(nest, f.getLowerBound(), f.getUpperBound());
      });
    if (statically_small(nest)) {
      split_parallel(p, 0);
      continue;
    }
    mlir::OpBuilder b(p);
    call_work_hint(b, p.getLoc(), nest);
    if (p.getNumLoops() > 1 && !p->hasAttr(kTileLoopsAttr)) split_parallel(p, p.getNumLoops() - 1);
  }
}

void finish_parallel_loops(mlir::ModuleOp m) {
  llvm::SmallVector<mlir::memref::AllocaScopeOp> scopes;
  m.walk([&](mlir::memref::AllocaScopeOp s) { scopes.push_back(s); });
  for (mlir::memref::AllocaScopeOp s : scopes) {
    bool allocates = false;
    s.walk([&](mlir::memref::AllocaOp) { allocates = true; });
    if (allocates || s.getNumResults() != 0) continue;
    mlir::Block& body = s.getBodyRegion().front();
    body.getTerminator()->erase();
    s->getBlock()->getOperations().splice(mlir::Block::iterator(s), body.getOperations());
    s.erase();
  }
}

}  // namespace kiln::codegen
