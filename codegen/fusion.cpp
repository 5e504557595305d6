// Pass `kiln-fuse-elementwise`: upstream linalg elementwise fusion with kiln's control.
//
// Upstream `linalg-fuse-elementwise-ops` fuses a producer only into its single consumer. In
// softmax, exp(x - max) feeds both the sum and the divide, so it would be written to memory and
// read back. Here a cheap elementwise producer that feeds a reduction is fused into every
// consumer (recomputed, as TorchInductor does); the original dies once its last use is fused.
// A producer read with broadcasting is not fused (it would be recomputed per element), unless
// it only copies an element of its input.
#include "codegen/lower.h"
#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Affine/IR/AffineOps.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Linalg/IR/Linalg.h"
#include "mlir/Dialect/Linalg/Transforms/Transforms.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "mlir/Dialect/Tensor/Transforms/Transforms.h"
#include "mlir/IR/Matchers.h"
#include "mlir/Pass/Pass.h"
#include "mlir/Transforms/GreedyPatternRewriteDriver.h"

namespace kiln::codegen {
namespace {

/// A producer with several uses is duplicated into a consumer only while the fused body stays
/// this small: each duplicate re-computes the producer, and without a bound on the result a
/// DAG such as (a + b, a - b) repeated n times would become a tree of 2^n ops (fault case FC-34).
constexpr int kMaxRecomputedOps = 24;

/// Nor does any fusion make a body larger than this: fusing a chain of n elementwise ops one
/// producer at a time clones the growing body each time, and LLVM's vectoriser is quadratic in
/// a loop body's size too, so a 1,000-op chain took 6 s to compile (5,000 ops: 123 s). A chain
/// becomes loops of at most this many body ops, each still one pass over memory.
constexpr int kMaxFusedOps = 128;

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

int64_t element_bytes(mlir::Value v) {
  auto t = llvm::dyn_cast<mlir::ShapedType>(v.getType());
  return t ? std::max<int64_t>(1, (t.getElementTypeBitWidth() + 7) / 8) : 0;
}

/// Whether recomputing `producer` inside the consumer of `operand` reads no more memory than
/// reading its stored result would: the full-size tensors the producer reads and the consumer
/// does not read already take at most the result's bytes per element. `x - mean` (one new
/// float per element) qualifies; a residual add with a dropout mask (`a + where(m, b * s, 0)`,
/// 9 bytes per element) does not, and recomputing such producers chained them: in the
/// Transformer step each layer_norm reduction re-read every tensor back to the previous
/// layer_norm's input (20 operands per loop nest), slower than eager's kernels.
bool recompute_reads_less(mlir::linalg::GenericOp producer, mlir::OpOperand* operand) {
  auto consumer = llvm::dyn_cast<mlir::linalg::LinalgOp>(operand->getOwner());
  if (!consumer) return false;
  llvm::SmallPtrSet<mlir::Value, 8> read;
  for (mlir::OpOperand& in : consumer->getOpOperands()) read.insert(in.get());
  int64_t added = 0;
  for (mlir::OpOperand* in : producer.getDpsInputOperands()) {
    mlir::AffineMap map = producer.getMatchingIndexingMap(in);
    bool full_size = map.isPermutation() && map.getNumResults() == producer.getNumLoops();
    if (full_size && !read.contains(in->get())) added += element_bytes(in->get());
  }
  return added <= element_bytes(operand->get());
}

/// A generic that copies one element of its input (a select of a 0-d value): fused into a
/// consumer it is one load of that element, even where the consumer reads it broadcast.
/// AdamW's bias corrections, one element each of a [parameters] vector of step counts, were
/// kernels of their own, two per parameter (1-thread launches on a GPU). Larger copies keep
/// upstream's rule: one with several users is stored once rather than read strided by each.
bool copies_one_element(mlir::Operation* op) {
  auto generic = llvm::dyn_cast<mlir::linalg::GenericOp>(op);
  if (!generic || generic.getNumDpsInputs() != 1 || generic->getNumResults() != 1 ||
      generic.getNumReductionLoops() > 0)
    return false;
  auto type = llvm::dyn_cast<mlir::RankedTensorType>(generic->getResult(0).getType());
  if (!type || !type.hasStaticShape() || type.getNumElements() != 1) return false;
  auto yield = llvm::cast<mlir::linalg::YieldOp>(generic.getBody()->getTerminator());
  return &generic.getBody()->front() == yield.getOperation() &&
         yield.getOperand(0) == generic.getBody()->getArgument(0);
}

/// Body ops (its yield included) of a producer that GPU code recomputes in every elementwise
/// consumer, whatever they are, when that reads no more memory (recompute_reads_less): a bias
/// add, x + b[col], whose stored result costs a write and a read per consumer where recomputing
/// costs only the consumers' reads of x.
constexpr int kMaxLightOps = 3;

/// Whether `op` is a linalg op reading an operand through a permutation other than the
/// identity (a generalised transpose, or a loop it was fused into).
bool reads_across(mlir::Operation* op) {
  auto linalg = llvm::dyn_cast<mlir::linalg::LinalgOp>(op);
  if (!linalg) return false;
  for (mlir::OpOperand* in : linalg.getDpsInputOperands()) {
    mlir::AffineMap map = linalg.getMatchingIndexingMap(in);
    if (map.isPermutation() && !map.isIdentity()) return true;
  }
  return false;
}

/// Whether every use of the transpose `t` is an input of an elementwise linalg.generic that
/// does not read t's source too (p + p.t() keeps its copy, after which the add may write p's
/// buffer in place: codegen/in_place.h).
bool read_elementwise(mlir::linalg::TransposeOp t) {
  for (mlir::OpOperand& use : t->getResult(0).getUses()) {
    auto user = llvm::dyn_cast<mlir::linalg::GenericOp>(use.getOwner());
    if (!user || !user.isDpsInput(&use) || user.getNumLoops() != user.getNumParallelLoops() ||
        llvm::is_contained(user->getOperands(), t.getInput()))
      return false;
  }
  return !t->getResult(0).use_empty();
}

/// `recompute_math`: a producer calling math functions, or of up to kMaxFusedOps body ops, may
/// be recomputed too (GPU code, where a kernel has about 14 flops to spare per byte it moves on
/// an H200: softmax's exp(x - max) recomputed in the sum and the divide, instead of written to
/// memory and read back twice).
bool should_fuse(mlir::OpOperand* operand, bool recompute_math) {
  mlir::Operation* producer = operand->get().getDefiningOp();
  if (!producer) return false;
  // A named matmul stays one: the reshape-by-expansion patterns would fold lower.cpp's
  // collapse/expand of its rows into it and generalise it, and only named matmuls become
  // GEMM calls (kiln-extern-calls).
  auto named_matmul = [](mlir::Operation* op) {
    return llvm::isa<mlir::linalg::MatmulOp, mlir::linalg::BatchMatmulOp>(op);
  };
  if (named_matmul(producer) || named_matmul(operand->getOwner())) return false;
  if (copies_one_element(producer)) return true;
  // CPU loops that read an operand across memory run in tiles (transposed_tiles.h), which a
  // reduction's loops do not get: such a producer stays a loop of its own there.
  if (!recompute_math && reads_across(producer))
    if (auto consumer = llvm::dyn_cast<mlir::linalg::LinalgOp>(operand->getOwner()))
      if (consumer.getNumReductionLoops() > 0) return false;
  // A producer read with broadcasting (e.g. 1 / rowsum, [N, 1] into [N, K]) would be recomputed
  // for every element of the consumer: it stays a (small) loop nest of its own.
  if (auto consumer = llvm::dyn_cast<mlir::linalg::LinalgOp>(operand->getOwner()))
    if (!consumer.getMatchingIndexingMap(operand).isPermutation()) return false;
  if (body_size(producer) + body_size(operand->getOwner()) > kMaxFusedOps) return false;
  if (producer->hasOneUse()) return true;
  if (!llvm::isa<mlir::linalg::GenericOp>(producer)) return false;
  auto generic = llvm::cast<mlir::linalg::GenericOp>(producer);
  if (recompute_math && body_size(producer) <= kMaxLightOps &&
      generic.getNumReductionLoops() == 0 && !transcendental(producer) &&
      recompute_reads_less(generic, operand))
    return true;
  // Recompute only for a reduction among the users (softmax's exp feeds a sum and a divide):
  // that saves writing and re-reading a full-size intermediate. Purely elementwise sharing is
  // left to upstream's rule (store once, read twice), which keeps long DAGs linear to compile.
  bool feeds_reduction = llvm::any_of(producer->getUsers(), [](mlir::Operation* user) {
    auto linalg = llvm::dyn_cast<mlir::linalg::LinalgOp>(user);
    return linalg && linalg.getNumReductionLoops() > 0;
  });
  // On the CPU computed once and stored (eager does the same). GPU code recomputes it, as
  // TorchInductor's looped softmax kernels recompute exp(x - max) in their last loop; the
  // body bound is then kMaxFusedOps (an exp is about 40 ops).
  if (!recompute_math && transcendental(producer)) return false;
  const int max_ops = recompute_math ? kMaxFusedOps : kMaxRecomputedOps;
  return feeds_reduction &&
         body_size(producer) + body_size(operand->getOwner()) <= max_ops &&
         recompute_reads_less(generic, operand);
}

/// x @ w + bias: a float linalg.matmul / batch_matmul into a zero fill (possibly expanded back
/// from collapsed rows, lower.cpp), whose only use is an elementwise `addf` with a tensor that
/// does not vary along the collapsed rows (a bias [N], or a full [M, N] addend without collapse).
/// The addend is broadcast into the GEMM's C instead (a copy loop), and the GEMM accumulates
/// into it (beta = 1 in the extern call, as eager's addmm): one pass over the output instead
/// of a GEMM into a temporary and then an add loop. Run before fusion, while the add is still
/// a generic of its own. Not when the add's only user is elementwise (gelu(x @ w + b) in a
/// forward pass): fusion puts the add into that user's loop, which costs less again.
/// Whether `user` and tensor.dim ops with a constant index are the only users of `v`.
bool only_use_but_dims(mlir::Value v, mlir::Operation* user) {
  bool found = false;
  for (mlir::Operation* u : v.getUsers()) {
    if (u == user && !found) {
      found = true;
      continue;
    }
    auto dim = llvm::dyn_cast<mlir::tensor::DimOp>(u);
    if (!dim || !dim.getConstantIndex()) return false;
  }
  return found;
}

/// Whether the add's only user is an elementwise generic reading it element for element (relu
/// after a linear layer): fusion then puts the add into that loop, so a GEMM into a temporary
/// and one loop of add and user cost less than a broadcast loop writing C, the GEMM reading it
/// back, and the user's loop (the digits MLP's forward: one pass over [64, 128] less per layer).
bool feeds_one_elementwise_op(mlir::linalg::GenericOp add) {
  mlir::Value r = add->getResult(0);
  if (!r.hasOneUse()) return false;
  mlir::OpOperand& use = *r.getUses().begin();
  auto user = llvm::dyn_cast<mlir::linalg::GenericOp>(use.getOwner());
  return user && user.isDpsInput(&use) &&
         user.getNumLoops() == user.getNumParallelLoops() &&
         user.getMatchingIndexingMap(&use).isIdentity();
}

/// Whether every use of `v`, through reshapes, is an input of a linalg.generic that reads it
/// element for element (a permutation map: an elementwise op, a transpose copy, a reduction's
/// operand), so that a cheap producer of `v` can be recomputed in each (should_fuse).
bool read_only_by_generics(mlir::Value v) {
  for (mlir::OpOperand& use : v.getUses()) {
    mlir::Operation* user = use.getOwner();
    if (llvm::isa<mlir::tensor::ExpandShapeOp, mlir::tensor::CollapseShapeOp>(user)) {
      if (!read_only_by_generics(user->getResult(0))) return false;
      continue;
    }
    if (llvm::isa<mlir::tensor::DimOp>(user)) continue;
    auto generic = llvm::dyn_cast<mlir::linalg::GenericOp>(user);
    if (!generic || !generic.isDpsInput(&use) ||
        !generic.getMatchingIndexingMap(&use).isPermutation())
      return false;
  }
  return true;
}

void fold_addend_into_gemm(mlir::ModuleOp module, bool for_gpu) {
  llvm::SmallVector<mlir::linalg::GenericOp> adds;
  module.walk([&](mlir::linalg::GenericOp g) { adds.push_back(g); });
  for (mlir::linalg::GenericOp add : adds) {
    if (add.getNumDpsInputs() != 2 || add.getNumDpsInits() != 1 || add->getNumResults() != 1 ||
        add.getNumReductionLoops() != 0)
      continue;
    mlir::Block* body = add.getBody();
    auto addf = llvm::dyn_cast<mlir::arith::AddFOp>(body->front());
    if (!addf || &body->front() == body->getTerminator() || addf->getNextNode() != body->getTerminator() ||
        body->getTerminator()->getOperand(0) != addf.getResult() ||
        addf.getFastmath() != mlir::arith::FastMathFlags::none)
      continue;
    mlir::Value in0 = body->getArgument(0), in1 = body->getArgument(1);
    if (!((addf.getLhs() == in0 && addf.getRhs() == in1) || (addf.getLhs() == in1 && addf.getRhs() == in0)))
      continue;
    llvm::SmallVector<mlir::AffineMap> maps = add.getIndexingMapsArray();
    int64_t rank = add.getNumLoops();
    if (!maps[2].isIdentity() || feeds_one_elementwise_op(add)) continue;
    // GPU code recomputes a bias add in each of its consumers (kMaxLightOps): the GEMM writes
    // its product once and each consumer reads it, where the folded addend cost a broadcast
    // pass writing C and the GEMM reading C back (a Linear before gelu, whose backward reads
    // the pre-activation again; attention's projections before their head transposes).
    if (for_gpu && read_only_by_generics(add->getResult(0))) continue;
    for (int mi = 0; mi < 2; ++mi) {
      mlir::Value prod = add.getDpsInputs()[mi], addend = add.getDpsInputs()[1 - mi];
      if (!maps[mi].isIdentity() || !only_use_but_dims(prod, add)) continue;
      auto expand = prod.getDefiningOp<mlir::tensor::ExpandShapeOp>();
      mlir::Value mmv = expand ? expand.getSrc() : prod;
      mlir::Operation* mm = mmv.getDefiningOp();
      if (!mm || !llvm::isa<mlir::linalg::MatmulOp, mlir::linalg::BatchMatmulOp>(mm) ||
          !only_use_but_dims(mmv, expand ? expand.getOperation() : add.getOperation()))
        continue;
      auto dps = llvm::cast<mlir::linalg::LinalgOp>(mm);
      auto fill = dps.getDpsInits()[0].getDefiningOp<mlir::linalg::FillOp>();
      if (!fill || !fill->getResult(0).hasOneUse() ||
          !mlir::matchPattern(fill.getDpsInputs()[0], mlir::m_AnyZeroFloat()))
        continue;
      auto mt = llvm::cast<mlir::RankedTensorType>(mmv.getType());
      auto at = llvm::cast<mlir::RankedTensorType>(addend.getType());
      if (at.getElementType() != mt.getElementType()) continue;
      // The addend's map in the GEMM's result space: with an expand of groups
      // [[0, ..., lead], [lead + 1], ...], the addend must not vary along dims 0..lead.
      int64_t lead = rank - mt.getRank();
      if (expand) {
        auto groups = expand.getReassociationIndices();
        bool plain = static_cast<int64_t>(groups.size()) == mt.getRank();
        for (size_t g = 0; plain && g < groups.size(); ++g)
          plain = static_cast<int64_t>(groups[g].size()) == (g == 0 ? lead + 1 : 1);
        if (!plain) continue;
      } else if (lead != 0) {
        continue;
      }
      // The addend's dims in the GEMM's result space (increasing: a linalg.broadcast, whose
      // init kiln-fuse-elementwise's patterns leave alone, unlike a generic's; then the GEMM's
      // C can be the graph's output buffer).
      llvm::SmallVector<int64_t> kept;
      bool ok = true;
      for (mlir::AffineExpr e : maps[1 - mi].getResults()) {
        auto d = llvm::dyn_cast<mlir::AffineDimExpr>(e);
        int64_t pos = d ? d.getPosition() : -1;
        if (!d || (lead > 0 && pos <= lead)) {
          ok = false;
          break;
        }
        pos = lead > 0 ? pos - lead : pos;
        if (!kept.empty() && pos <= kept.back()) ok = false;
        kept.push_back(pos);
      }
      if (!ok) continue;
      // The sizes read from the old results (the add's init): from the GEMM's init instead.
      mlir::Value init = fill.getDpsInits()[0];
      for (mlir::Value v : {prod, mmv}) {
        for (mlir::Operation* user : llvm::make_early_inc_range(v.getUsers())) {
          auto dim = llvm::dyn_cast<mlir::tensor::DimOp>(user);
          if (!dim) continue;
          mlir::OpBuilder db(dim);
          int64_t d = *dim.getConstantIndex();
          mlir::Value size;
          if (v == mmv) {
            size = mlir::tensor::DimOp::create(db, dim.getLoc(), init, d);
          } else {
            mlir::OpFoldResult s = expand.getMixedOutputShape()[d];
            size = llvm::isa<mlir::Value>(s)
                       ? llvm::cast<mlir::Value>(s)
                       : mlir::arith::ConstantIndexOp::create(
                             db, dim.getLoc(), *mlir::getConstantIntValue(s)).getResult();
          }
          dim.getResult().replaceAllUsesWith(size);
          dim->erase();
        }
      }
      // At the add: the addend and the GEMM's operands dominate it.
      mlir::OpBuilder b(add);
      mlir::Location loc = add.getLoc();
      int64_t mrank = mt.getRank();
      llvm::SmallVector<int64_t> added;
      for (int64_t d = 0; d < mrank; ++d)
        if (!llvm::is_contained(kept, d)) added.push_back(d);
      mlir::Value c =
          added.empty()
              ? mlir::linalg::CopyOp::create(b, loc, addend, init)->getResult(0)
              : mlir::linalg::BroadcastOp::create(b, loc, addend, init, added)->getResult(0);
      mlir::Operation* mm2 = b.clone(*mm);
      llvm::cast<mlir::linalg::LinalgOp>(mm2).getDpsInitsMutable()[0].set(c);
      mlir::Value r = mm2->getResult(0);
      if (expand) {
        mlir::Operation* e2 = b.clone(*expand.getOperation());
        e2->setOperand(0, r);
        r = e2->getResult(0);
      }
      add->getResult(0).replaceAllUsesWith(r);
      add->erase();
      if (expand) expand->erase();
      mm->erase();
      fill->erase();
      break;
    }
  }
}

/// An elementwise producer whose other uses all return its value from the function (AdamW's
/// new moments m and v, which the parameter update reads again) becomes a second result of its
/// elementwise consumer's loop nest: computed and stored in the same loop, not stored by one
/// loop and read back by the next. Upstream's fusion pattern cannot do it: it recomputes such
/// a producer in the consumer and keeps the original loop for the returned value.
/// `fuseElementwiseOps` yields the producer's value from the fused op; here the return reads
/// that result too, so the producer dies. AdamW's update of one parameter goes from three
/// loops (m, v, parameter) to one.
/// Returns the merged loop nest, or null when no producer of `consumer` qualifies.
mlir::linalg::GenericOp merge_returned_producer(mlir::RewriterBase& rewriter,
                                                mlir::linalg::GenericOp consumer) {
  if (consumer.getNumReductionLoops() != 0 || !consumer.hasPureTensorSemantics()) return {};
  for (mlir::OpOperand* operand : consumer.getDpsInputOperands()) {
    auto producer = operand->get().getDefiningOp<mlir::linalg::GenericOp>();
    if (!producer || producer->getNumResults() != 1 || producer.getNumReductionLoops() != 0 ||
        producer.getNumLoops() != consumer.getNumLoops() ||
        !consumer.getMatchingIndexingMap(operand).isIdentity() ||
        !mlir::linalg::areElementwiseOpsFusable(operand))
      continue;
    mlir::Value value = producer->getResult(0);
    int consumer_uses = 0;
    bool others_after = true;
    mlir::Block* block = consumer->getBlock();
    for (mlir::OpOperand& use : value.getUses()) {
      if (use.getOwner() == consumer.getOperation()) {
        ++consumer_uses;
        continue;
      }
      mlir::Operation* user = block->findAncestorOpInBlock(*use.getOwner());
      others_after &= user && consumer->isBeforeInBlock(user);
    }
    // A single use is upstream's ordinary fusion.
    if (consumer_uses != 1 || !others_after || value.hasOneUse() ||
        body_size(producer) + body_size(consumer) > kMaxFusedOps)
      continue;
    rewriter.setInsertionPoint(consumer);
    mlir::FailureOr<mlir::linalg::ElementwiseOpFusionResult> fused =
        mlir::linalg::fuseElementwiseOps(rewriter, operand);
    if (mlir::failed(fused)) continue;
    for (auto [original, replacement] : fused->replacements)
      rewriter.replaceUsesWithIf(original, replacement, [&](mlir::OpOperand& use) {
        return use.getOwner() != fused->fusedOp;
      });
    rewriter.eraseOp(consumer);
    rewriter.eraseOp(producer);
    return llvm::cast<mlir::linalg::GenericOp>(fused->fusedOp);
  }
  return {};
}

void merge_returned_producers(mlir::ModuleOp module) {
  mlir::IRRewriter rewriter(module.getContext());
  llvm::SmallVector<mlir::linalg::GenericOp> generics;
  module.walk([&](mlir::linalg::GenericOp g) { generics.push_back(g); });
  // One pass in program order: a merge erases the consumer (this entry) and its producer (an
  // earlier entry, defined before its use), and the merged nest may take another producer.
  for (mlir::linalg::GenericOp g : generics)
    while (g) g = merge_returned_producer(rewriter, g);
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
  FuseElementwisePass() = default;
  FuseElementwisePass(const FuseElementwisePass& other) : PassWrapper(other) {}
  explicit FuseElementwisePass(bool gpu) { recompute_math = gpu; }
  Option<bool> recompute_math{
      *this, "recompute-math",
      llvm::cl::desc("recompute producers calling math functions into several consumers "
                     "(GPU code)"),
      llvm::cl::init(false)};

  void runOnOperation() override {
    mlir::MLIRContext* ctx = &getContext();
    {
      // Transposes that stay copies (attention's head transposes) become generics, which fuse
      // with their producer (a projection's bias add) and consumer (q's scaling) into one loop;
      // a named transpose was a loop of its own, and q's was stored both unscaled and scaled.
      // On the CPU only those read by elementwise loops: those loops then read across memory
      // in tiles (transposed_tiles.h), where (x.t() * 2 + 1).tanh() wrote and read back x.t()
      // (32.6 ms against eager's 11.6 for x [4096, 2048]).
      llvm::SmallVector<mlir::linalg::TransposeOp> transposes;
      getOperation().walk([&](mlir::linalg::TransposeOp t) {
        if (recompute_math || read_elementwise(t)) transposes.push_back(t);
      });
      mlir::IRRewriter rewriter(ctx);
      for (mlir::linalg::TransposeOp t : transposes) {
        rewriter.setInsertionPoint(t);
        if (mlir::failed(mlir::linalg::generalizeNamedOp(rewriter, t))) return signalPassFailure();
      }
    }
    fold_addend_into_gemm(getOperation(), recompute_math);
    mlir::RewritePatternSet patterns(ctx);
    // The same pattern set as upstream's pass, with kiln's control function.
    const bool math = recompute_math;
    auto control = [math](mlir::OpOperand* operand) { return should_fuse(operand, math); };
    mlir::linalg::populateElementwiseOpsFusionPatterns(patterns, control);
    mlir::linalg::populateFoldReshapeOpsByExpansionPatterns(patterns, control);
    mlir::tensor::populateBubbleUpExpandShapePatterns(patterns);
    mlir::affine::AffineApplyOp::getCanonicalizationPatterns(patterns, ctx);
    mlir::linalg::GenericOp::getCanonicalizationPatterns(patterns, ctx);
    mlir::tensor::ExpandShapeOp::getCanonicalizationPatterns(patterns, ctx);
    mlir::tensor::CollapseShapeOp::getCanonicalizationPatterns(patterns, ctx);
    ctx->getLoadedDialect<mlir::linalg::LinalgDialect>()->getCanonicalizationPatterns(patterns);
    mlir::linalg::populateConstantFoldLinalgOperations(patterns, control);
    // Region simplification after every round made long graphs quadratic (FC-34); CSE and
    // canonicalization run as passes after this one.
    mlir::GreedyRewriteConfig config;
    config.setRegionSimplificationLevel(mlir::GreedySimplifyRegionLevel::Disabled);
    if (mlir::failed(mlir::applyPatternsGreedily(getOperation(), std::move(patterns), config)))
      signalPassFailure();
    merge_returned_producers(getOperation());
  }
};

}  // namespace

std::unique_ptr<mlir::Pass> create_fuse_elementwise_pass(bool for_gpu) {
  return std::make_unique<FuseElementwisePass>(for_gpu);
}

void register_fusion_pass() { mlir::PassRegistration<FuseElementwisePass>(); }

}  // namespace kiln::codegen
