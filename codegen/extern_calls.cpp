// Extern kernels (as TorchInductor's): after bufferization, float32/float64 linalg.matmul and
// linalg.batch_matmul on memrefs whose rows are unit-stride become a func.call to the runtime's
// GEMM (codegen/runtime.cpp: BLAS sgemm / kiln's blocked gemm): C = op(A)·op(B) + beta·C (op: a
// transpose when the op's indexing maps read that operand transposed), beta = 1 as
// the linalg op accumulates, or 0 when the zero fill of C just before is folded in. Pointers, offsets, sizes and
// strides come from memref.extract_aligned_pointer_as_index / extract_strided_metadata, all as
// `index`, so the runtime function takes int64_t arguments only.
#include <cstdlib>
#include <optional>
#include <utility>

#include "codegen/lower.h"
#include "core/env.h"
#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Linalg/IR/Linalg.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/IR/Matchers.h"
#include "mlir/Pass/PassRegistry.h"

namespace kiln::codegen {
namespace {

/// Rank 2 or 3 memref of f32/f64 whose last dim has static stride 1.
bool unit_rows(mlir::Type t, mlir::Type elem) {
  auto mt = llvm::dyn_cast<mlir::MemRefType>(t);
  if (!mt || mt.getElementType() != elem || mt.getRank() < 2) return false;
  llvm::SmallVector<int64_t> strides;
  int64_t offset;
  return mlir::succeeded(mt.getStridesAndOffset(strides, offset)) && strides.back() == 1;
}

/// (trans_a, trans_b) of a matmul / batch_matmul whose indexing maps are the plain ones or
/// read A and/or B transposed in their last two dims (linalg.matmul_transpose_a/b, ...:
/// lower.cpp folds a weight's transpose into them), A of a batch_matmul possibly without a
/// batch dim (broadcast: batch stride 0); nullopt for any other maps.
std::optional<std::pair<bool, bool>> transpose_flags(mlir::linalg::LinalgOp op) {
  llvm::SmallVector<mlir::AffineMap> maps = op.getIndexingMapsArray();
  if (maps.size() != 3) return std::nullopt;
  unsigned nb = op.getNumLoops() - 3;  // batch loops (0 or 1)
  auto d = [&](unsigned i) { return mlir::getAffineDimExpr(i, op.getContext()); };
  // bcast: the operand has no batch dim (A of a batch_matmul read by every batch: 2-D @ 3-D).
  auto is = [&](mlir::AffineMap m, unsigned x, unsigned y, bool bcast = false) {
    unsigned lead = bcast ? 0 : nb;
    if (m.getNumResults() != lead + 2) return false;
    for (unsigned i = 0; i < lead; ++i)
      if (m.getResult(i) != d(i)) return false;
    return m.getResult(lead) == d(x) && m.getResult(lead + 1) == d(y);
  };
  unsigned m = nb, n = nb + 1, k = nb + 2;
  if (!is(maps[2], m, n)) return std::nullopt;
  bool bcast = nb == 1 && maps[0].getNumResults() == 2;
  bool ta = is(maps[0], k, m, bcast), tb = is(maps[1], n, k);
  if (!ta && !is(maps[0], m, k, bcast)) return std::nullopt;
  if (!tb && !is(maps[1], k, n)) return std::nullopt;
  return std::make_pair(ta, tb);
}

struct ExternCallsPass : mlir::PassWrapper<ExternCallsPass, mlir::OperationPass<mlir::ModuleOp>> {
  MLIR_DEFINE_EXPLICIT_INTERNAL_INLINE_TYPE_ID(ExternCallsPass)
  llvm::StringRef getArgument() const override { return "kiln-extern-calls"; }
  llvm::StringRef getDescription() const override {
    return "Replace float matmul / batch_matmul on memrefs by calls to the runtime's GEMM";
  }
  void getDependentDialects(mlir::DialectRegistry& r) const override {
    r.insert<mlir::arith::ArithDialect, mlir::func::FuncDialect, mlir::memref::MemRefDialect>();
  }

  void runOnOperation() override {
    // KILN_NO_EXTERN_GEMM=1 keeps the generated loops (to compare them, see codegen/README.md).
    if (env_flag("KILN_NO_EXTERN_GEMM")) return;
    mlir::ModuleOp module = getOperation();
    llvm::SmallVector<mlir::linalg::LinalgOp> todo;
    module.walk([&](mlir::linalg::LinalgOp op) {
      if (llvm::isa<mlir::linalg::MatmulOp, mlir::linalg::BatchMatmulOp>(op.getOperation()))
        todo.push_back(op);
    });
    for (mlir::linalg::LinalgOp op : todo) {
      if (!op.hasPureBufferSemantics()) continue;
      auto trans = transpose_flags(op);
      if (!trans) continue;
      auto [trans_a, trans_b] = *trans;
      mlir::Value a = op.getDpsInputs()[0], b = op.getDpsInputs()[1], c = op.getDpsInits()[0];
      mlir::Type elem = llvm::cast<mlir::MemRefType>(c.getType()).getElementType();
      if (!(elem.isF32() || elem.isF64()) || !unit_rows(a.getType(), elem) ||
          !unit_rows(b.getType(), elem) || !unit_rows(c.getType(), elem))
        continue;
      // A zero fill of C just before: drop it and let the GEMM overwrite C (beta = 0).
      auto fill = llvm::dyn_cast_or_null<mlir::linalg::FillOp>(op->getPrevNode());
      bool overwrite = fill && fill.hasPureBufferSemantics() && fill.getDpsInits()[0] == c &&
                       mlir::matchPattern(fill.getDpsInputs()[0], mlir::m_AnyZeroFloat());
      mlir::OpBuilder builder(op);
      mlir::Location loc = op.getLoc();
      int64_t rank = llvm::cast<mlir::MemRefType>(c.getType()).getRank();
      mlir::Value zero = mlir::arith::ConstantIndexOp::create(builder, loc, 0);
      mlir::Value one = mlir::arith::ConstantIndexOp::create(builder, loc, 1);
      // Per operand: pointer, offset, batch stride, leading dim; plus the sizes of C and A.
      llvm::SmallVector<mlir::Value> args(4, one);
      llvm::SmallVector<mlir::Value> c_sizes, a_sizes;
      for (int i = 0; i < 3; ++i) {
        mlir::Value v = i == 0 ? a : i == 1 ? b : c;
        // A 2-D A of a batch_matmul (broadcast over the batch): batch stride 0.
        int64_t rv = llvm::cast<mlir::MemRefType>(v.getType()).getRank();
        auto md = mlir::memref::ExtractStridedMetadataOp::create(builder, loc, v);
        args.push_back(mlir::memref::ExtractAlignedPointerAsIndexOp::create(builder, loc, v));
        args.push_back(md.getOffset());
        args.push_back(rv == 3 ? md.getStrides()[0] : zero);
        args.push_back(md.getStrides()[rv - 2]);
        if (i == 2) c_sizes.assign(md.getSizes().begin(), md.getSizes().end());
        if (i == 0) a_sizes.assign(md.getSizes().begin(), md.getSizes().end());
      }
      // Whether the rows that share one B (C's rows; with a broadcast A or B, all of a batch's)
      // scale with a row-split run's block: a row-split graph's buffers are dynamic only in its
      // relaxed rows (and in symbolic sizes, which this takes for split rows too), so a dynamic
      // row (or, for a batch sharing B, batch) dim of C does. The runtime then counts the run's rows, not the block's, when it decides
      // whether to round to bfloat16 (runtime.h, GemmRunScope), as eager matmul decides.
      auto c_shape = llvm::cast<mlir::MemRefType>(c.getType()).getShape();
      const bool b_batched = llvm::cast<mlir::MemRefType>(b.getType()).getRank() == 3;
      const bool rows_split =
          mlir::ShapedType::isDynamic(c_shape[rank - 2]) ||
          (rank == 3 && !b_batched && mlir::ShapedType::isDynamic(c_shape[0]));
      args.push_back(rows_split ? one : zero);
      args.push_back(overwrite ? zero : one);  // beta
      args.push_back(trans_a ? one : zero);
      args.push_back(trans_b ? one : zero);
      if (overwrite) fill->erase();
      if (rank == 3) args[0] = c_sizes[0];
      args[1] = c_sizes[rank - 2];                         // m
      args[2] = c_sizes[rank - 1];                         // n
      int64_t ra = static_cast<int64_t>(a_sizes.size());
      args[3] = a_sizes[trans_a ? ra - 2 : ra - 1];  // k
      std::string name = elem.isF32() ? "kiln_rt_gemm_f32" : "kiln_rt_gemm_f64";
      if (!module.lookupSymbol<mlir::func::FuncOp>(name)) {
        mlir::OpBuilder mb = mlir::OpBuilder::atBlockBegin(module.getBody());
        llvm::SmallVector<mlir::Type> types(args.size(), mb.getIndexType());
        auto fn = mlir::func::FuncOp::create(mb, loc, name, mb.getFunctionType(types, {}));
        fn.setPrivate();
      }
      mlir::func::CallOp::create(builder, loc, name, mlir::TypeRange{}, args);
      op->erase();
    }
  }
};

}  // namespace

std::unique_ptr<mlir::Pass> create_extern_calls_pass() { return std::make_unique<ExternCallsPass>(); }

void register_extern_calls_pass() {
  static bool once = [] {
    mlir::PassRegistration<ExternCallsPass>();
    return true;
  }();
  (void)once;
}

}  // namespace kiln::codegen
