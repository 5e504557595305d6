// Pass `kiln-fuse-elementwise`: upstream linalg elementwise fusion with kiln's control.
//
// Upstream `linalg-fuse-elementwise-ops` fuses a producer only into its single consumer. In
// softmax, exp(x - max) feeds both the sum and the divide, so it would be written to memory and
// read back. Here a cheap elementwise producer is fused into every consumer (recomputed, as
// TorchInductor does); the original dies once its last use is fused.
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

/// A producer with several uses is duplicated into each consumer only while its body is this
/// small, so repeated fusion cannot blow up the code (each duplicate re-computes the body).
constexpr int kMaxRecomputedOps = 24;

bool should_fuse(mlir::OpOperand* operand) {
  mlir::Operation* producer = operand->get().getDefiningOp();
  if (!producer) return false;
  // A producer read with broadcasting (e.g. 1 / rowsum, [N, 1] into [N, K]) would be recomputed
  // for every element of the consumer: it stays a (small) loop nest of its own.
  if (auto consumer = llvm::dyn_cast<mlir::linalg::LinalgOp>(operand->getOwner()))
    if (!consumer.getMatchingIndexingMap(operand).isPermutation()) return false;
  if (producer->hasOneUse()) return true;
  auto generic = llvm::dyn_cast<mlir::linalg::GenericOp>(producer);
  if (!generic) return false;
  int ops = 0;
  generic.getBody()->walk([&](mlir::Operation*) { ++ops; });
  return ops <= kMaxRecomputedOps;
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
    if (mlir::failed(mlir::applyPatternsGreedily(getOperation(), std::move(patterns))))
      signalPassFailure();
  }
};

}  // namespace

std::unique_ptr<mlir::Pass> create_fuse_elementwise_pass() {
  return std::make_unique<FuseElementwisePass>();
}

void register_fusion_pass() { mlir::PassRegistration<FuseElementwisePass>(); }

}  // namespace kiln::codegen
