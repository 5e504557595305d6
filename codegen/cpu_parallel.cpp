// Parallel loop nests of graphs that are not row-splittable (cpu_parallel.h).
#include "codegen/cpu_parallel.h"

#include <algorithm>
#include <optional>

#include "codegen/omp_runtime.h"
#include "core/error.h"
#include "mlir/Dialect/Utils/StaticValueUtils.h"
#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"

namespace kiln::codegen {
namespace {

constexpr char kWorkHint[] = "kiln_rt_parallel_work";

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

}  // namespace

void prepare_parallel_loops(mlir::ModuleOp m) {
  auto fn = m.lookupSymbol<mlir::func::FuncOp>("main");
  if (!fn) return;
  llvm::SmallVector<mlir::scf::ParallelOp> loops;
  fn.walk([&](mlir::scf::ParallelOp p) { loops.push_back(p); });
  if (loops.empty()) return;
  mlir::OpBuilder mb(m.getBodyRegion());
  mlir::Type index = mb.getIndexType();
  if (!m.lookupSymbol<mlir::func::FuncOp>(kWorkHint)) {
    mb.setInsertionPointToStart(m.getBody());
    auto decl = mlir::func::FuncOp::create(mb, m.getLoc(), kWorkHint,
                                           mb.getFunctionType({index}, {}));
    decl.setPrivate();
  }
  // walk() is post-order: loops nested in others come first and are made sequential before
  // their parent is rewritten (clone then copies the sequential form).
  for (mlir::scf::ParallelOp p : loops) {
    if (p.getNumResults() != 0)
      throw Error("codegen::Executable", "a parallel loop with reductions is not supported");
    if (p->getParentOp() != fn.getOperation()) {
      split_parallel(p, 0);
      continue;
    }
    // A nest with fewer iterations than the runtime would share out, known now: sequential,
    // so small graphs (the digits MLP's) pay no fork call per loop.
    std::optional<int64_t> iterations = int64_t{1};
    for (auto [lb, ub] : llvm::zip(p.getLowerBound(), p.getUpperBound())) {
      auto l = mlir::getConstantIntValue(lb), u = mlir::getConstantIntValue(ub);
      if (!l || !u) iterations.reset();
      else if (iterations) *iterations *= std::max<int64_t>(*u - *l, 0);
    }
    if (iterations && *iterations < kParallelMinIterations) {
      split_parallel(p, 0);
      continue;
    }
    // Iterations of the whole nest (the runtime runs small ones on the calling thread).
    mlir::OpBuilder b(p);
    mlir::Location loc = p.getLoc();
    mlir::Value work = mlir::arith::ConstantIndexOp::create(b, loc, 1);
    for (auto [lb, ub] : llvm::zip(p.getLowerBound(), p.getUpperBound()))
      work = mlir::arith::MulIOp::create(b, loc, work, mlir::arith::SubIOp::create(b, loc, ub, lb));
    mlir::func::CallOp::create(b, loc, kWorkHint, mlir::TypeRange{}, mlir::ValueRange{work});
    if (p.getNumLoops() > 1) split_parallel(p, p.getNumLoops() - 1);
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
