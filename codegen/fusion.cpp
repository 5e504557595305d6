// Pass `kiln-fuse-elementwise`: upstream linalg elementwise fusion with kiln's control.
//
// Upstream `linalg-fuse-elementwise-ops` fuses a producer only into its single consumer. In
// softmax, exp(x - max) feeds both the sum and the divide, so it would be written to memory and
// read back. Here a cheap elementwise producer that feeds a reduction is fused into every
// consumer (recomputed, as TorchInductor does); the original dies once its last use is fused.
// A producer read with broadcasting is never fused (it would be recomputed per element).
#include "codegen/lower.h"
#include "mlir/Dialect/Affine/IR/AffineOps.h"
#include "mlir/Dialect/Linalg/IR/Linalg.h"
#include "mlir/Dialect/Linalg/Transforms/Transforms.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "mlir/Dialect/Tensor/Transforms/Transforms.h"
#include "mlir/Pass/Pass.h"
#include "mlir/Transforms/GreedyPatternRewriteDriver.h"

namespace kiln::codegen {
namespace {

/// A producer with several uses is duplicated into a consumer only while the fused body stays
/// this small: each duplicate re-computes the producer, and without a bound on the result a
/// DAG such as (a + b, a - b) repeated n times would become a tree of 2^n ops (fault case FC-34).
constexpr int kMaxRecomputedOps = 24;

int body_size(mlir::Operation* op) {
  int ops = 0;
  if (auto generic = llvm::dyn_cast<mlir::linalg::GenericOp>(op))
    generic.getBody()->walk([&](mlir::Operation*) { ++ops; });
  return ops;
}

/// Whether a generic's body calls a math-dialect function (exp, tanh, ...): dozens of
/// instructions each as polynomials, more than writing and re-reading the value from cache.
bool transcendental(mlir::Operation* op) {
  bool found = false;
  op->walk([&](mlir::Operation* inner) {
    found |= inner->getDialect() && inner->getDialect()->getNamespace() == "math";
  });
  return found;
}

bool should_fuse(mlir::OpOperand* operand) {
  mlir::Operation* producer = operand->get().getDefiningOp();
  if (!producer) return false;
  // A named matmul stays one: the reshape-by-expansion patterns would fold lower.cpp's
  // collapse/expand of its rows into it and generalise it, and only named matmuls become
  // GEMM calls (kiln-extern-calls).
  auto named_matmul = [](mlir::Operation* op) {
    return llvm::isa<mlir::linalg::MatmulOp, mlir::linalg::BatchMatmulOp>(op);
  };
  if (named_matmul(producer) || named_matmul(operand->getOwner())) return false;
  // A producer read with broadcasting (e.g. 1 / rowsum, [N, 1] into [N, K]) would be recomputed
  // for every element of the consumer: it stays a (small) loop nest of its own.
  if (auto consumer = llvm::dyn_cast<mlir::linalg::LinalgOp>(operand->getOwner()))
    if (!consumer.getMatchingIndexingMap(operand).isPermutation()) return false;
  if (producer->hasOneUse()) return true;
  if (!llvm::isa<mlir::linalg::GenericOp>(producer)) return false;
  // Recompute only for a reduction among the users (softmax's exp feeds a sum and a divide):
  // that saves writing and re-reading a full-size intermediate. Purely elementwise sharing is
  // left to upstream's rule (store once, read twice), which keeps long DAGs linear to compile.
  bool feeds_reduction = llvm::any_of(producer->getUsers(), [](mlir::Operation* user) {
    auto linalg = llvm::dyn_cast<mlir::linalg::LinalgOp>(user);
    return linalg && linalg.getNumReductionLoops() > 0;
  });
  if (transcendental(producer)) return false;  // computed once, stored (eager does the same)
  return feeds_reduction &&
         body_size(producer) + body_size(operand->getOwner()) <= kMaxRecomputedOps;
}

struct FuseElementwisePass
    : mlir::PassWrapper<FuseElementwisePass, mlir::OperationPass<mlir::ModuleOp>> {
  MLIR_DEFINE_EXPLICIT_INTERNAL_INLINE_TYPE_ID(FuseElementwisePass)
  llvm::StringRef getArgument() const override { return "kiln-fuse-elementwise"; }
  llvm::StringRef getDescription() const override {
    return "fuse elementwise linalg producers into all their consumers (recomputing cheap ones)";
  }
  void getDependentDialects(mlir::DialectRegistry& r) const override {
    r.insert<mlir::affine::AffineDialect, mlir::linalg::LinalgDialect,
             mlir::tensor::TensorDialect>();
  }
  void runOnOperation() override {
    mlir::MLIRContext* ctx = &getContext();
    mlir::RewritePatternSet patterns(ctx);
    // The same pattern set as upstream's pass, with kiln's control function.
    mlir::linalg::populateElementwiseOpsFusionPatterns(patterns, should_fuse);
    mlir::linalg::populateFoldReshapeOpsByExpansionPatterns(patterns, should_fuse);
    mlir::tensor::populateBubbleUpExpandShapePatterns(patterns);
    mlir::affine::AffineApplyOp::getCanonicalizationPatterns(patterns, ctx);
    mlir::linalg::GenericOp::getCanonicalizationPatterns(patterns, ctx);
    mlir::tensor::ExpandShapeOp::getCanonicalizationPatterns(patterns, ctx);
    mlir::tensor::CollapseShapeOp::getCanonicalizationPatterns(patterns, ctx);
    ctx->getLoadedDialect<mlir::linalg::LinalgDialect>()->getCanonicalizationPatterns(patterns);
    mlir::linalg::populateConstantFoldLinalgOperations(patterns, should_fuse);
    // Region simplification after every round made long graphs quadratic (FC-34); CSE and
    // canonicalization run as passes after this one.
    mlir::GreedyRewriteConfig config;
    config.setRegionSimplificationLevel(mlir::GreedySimplifyRegionLevel::Disabled);
    if (mlir::failed(mlir::applyPatternsGreedily(getOperation(), std::move(patterns), config)))
      signalPassFailure();
  }
};

}  // namespace

std::unique_ptr<mlir::Pass> create_fuse_elementwise_pass() {
  return std::make_unique<FuseElementwisePass>();
}

void register_fusion_pass() { mlir::PassRegistration<FuseElementwisePass>(); }

}  // namespace kiln::codegen
