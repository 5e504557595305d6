// kiln.random -> linalg.generic computing Philox4x32-10 per element (core/philox.h), with the
// counter layout of the eager kernels (backends/cpu/random.cpp): element i of dropout_mask
// takes word i % 4 of the block at counter offset + i / 4, key = seed. So a generated kernel
// (an eager op on a CUDA tensor, codegen/cuda_kernels.cpp) draws exactly eager's mask.
//
// Each element computes its whole block (4 words) and keeps one: 4x the rounds of the eager
// kernel, which stores all four. On a GPU that is ~60 integer instructions per element, far
// cheaper than drawing on the host and copying the mask over PCIe.
#include <cmath>

#include "codegen/lower.h"
#include "core/error.h"
#include "core/philox.h"
#include "ir/dialect.h"
#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Linalg/IR/Linalg.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"

namespace kiln::codegen {
namespace {

using mlir::Value;

/// The four 32-bit words of Philox4x32-10 at counter (ctr_lo, ctr_hi = 0) with key (k0, k1),
/// built in arith ops (i32), the rounds of philox::philox4x32.
std::array<Value, 4> philox_words(mlir::OpBuilder& b, mlir::Location l, Value ctr, Value key) {
  mlir::Type i32 = b.getI32Type(), i64 = b.getI64Type();
  auto c32 = [&](uint32_t v) -> Value {
    return mlir::arith::ConstantOp::create(b, l, b.getIntegerAttr(i32, static_cast<int64_t>(v)));
  };
  auto hi_half = [&](Value v64) -> Value {
    Value s = mlir::arith::ShRUIOp::create(
        b, l, v64, mlir::arith::ConstantOp::create(b, l, b.getIntegerAttr(i64, 32)));
    return mlir::arith::TruncIOp::create(b, l, i32, s);
  };
  auto lo_half = [&](Value v64) -> Value { return mlir::arith::TruncIOp::create(b, l, i32, v64); };
  Value c0 = lo_half(ctr), c1 = hi_half(ctr), c2 = c32(0), c3 = c32(0);
  Value k0 = lo_half(key), k1 = hi_half(key);
  const Value m0 = c32(philox::kM0), m1 = c32(philox::kM1);
  const Value w0 = c32(philox::kW0), w1 = c32(philox::kW1);
  for (int r = 0; r < 10; ++r) {
    auto p0 = mlir::arith::MulUIExtendedOp::create(b, l, c0, m0);  // low, high of kM0 * c0
    auto p1 = mlir::arith::MulUIExtendedOp::create(b, l, c2, m1);
    Value n0 = mlir::arith::XOrIOp::create(
        b, l, mlir::arith::XOrIOp::create(b, l, p1.getHigh(), c1), k0);
    Value n2 = mlir::arith::XOrIOp::create(
        b, l, mlir::arith::XOrIOp::create(b, l, p0.getHigh(), c3), k1);
    c1 = p1.getLow();
    c3 = p0.getLow();
    c0 = n0;
    c2 = n2;
    k0 = mlir::arith::AddIOp::create(b, l, k0, w0);
    k1 = mlir::arith::AddIOp::create(b, l, k1, w1);
  }
  return {c0, c1, c2, c3};
}

/// kiln.random "dropout_mask" on a static shape: a generic over the result whose body reads
/// the key (seed, offset) from its operand, numbers the element in row-major order and keeps
/// it when the top 24 bits of its word are >= ceil(p * 2^24) (eager's dropout_threshold).
/// Result bool: keep; floating: keep ? 1 / (1 - p) rounded to the dtype : 0 (0 when p == 1).
struct LowerRandom : mlir::OpRewritePattern<kiln::dialect::RandomOp> {
  using OpRewritePattern::OpRewritePattern;
  mlir::LogicalResult matchAndRewrite(kiln::dialect::RandomOp op,
                                      mlir::PatternRewriter& rw) const override {
    if (kiln::dialect::op_kind_from_name(op.getKind()) != OpKind::DropoutMask)
      return rw.notifyMatchFailure(op, "kind not lowered yet");
    auto out = llvm::cast<mlir::RankedTensorType>(op.getResult().getType());
    if (!out.hasStaticShape()) return rw.notifyMatchFailure(op, "dynamic shape");
    const double p = op.getP().convertToDouble();
    const auto threshold =
        static_cast<uint32_t>(std::min(std::ceil(p * 0x1.0p24), 0x1.0p24));
    mlir::Location loc = op.getLoc();
    mlir::MLIRContext* ctx = rw.getContext();
    const int64_t rank = out.getRank();
    Value key = op.getKey();
    Value init = mlir::tensor::EmptyOp::create(rw, loc, out.getShape(), out.getElementType());
    llvm::SmallVector<mlir::utils::IteratorType> iterators(rank,
                                                           mlir::utils::IteratorType::parallel);
    llvm::SmallVector<mlir::AffineMap> maps = {
        mlir::AffineMap::getMultiDimIdentityMap(rank, ctx)};
    auto generic = mlir::linalg::GenericOp::create(
        rw, loc, mlir::TypeRange{out}, mlir::ValueRange{}, mlir::ValueRange{init}, maps,
        iterators, [&](mlir::OpBuilder& b, mlir::Location l, mlir::ValueRange) {
          mlir::Type i32 = b.getI32Type(), i64 = b.getI64Type();
          auto c64 = [&](int64_t v) -> Value {
            return mlir::arith::ConstantOp::create(b, l, b.getIntegerAttr(i64, v));
          };
          // Row-major element number, in i64.
          Value elem = c64(0);
          for (int64_t d = 0; d < rank; ++d) {
            Value i = mlir::arith::IndexCastOp::create(b, l, i64,
                                                       mlir::linalg::IndexOp::create(b, l, d));
            elem = mlir::arith::AddIOp::create(
                b, l, mlir::arith::MulIOp::create(b, l, elem, c64(out.getDimSize(d))), i);
          }
          auto read_key = [&](int64_t j) -> Value {
            Value at = mlir::arith::ConstantIndexOp::create(b, l, j);
            return mlir::tensor::ExtractOp::create(b, l, key, mlir::ValueRange{at});
          };
          Value seed = read_key(0), offset = read_key(1);
          Value ctr = mlir::arith::AddIOp::create(
              b, l, offset, mlir::arith::ShRUIOp::create(b, l, elem, c64(2)));
          std::array<Value, 4> w = philox_words(b, l, ctr, seed);
          Value lane = mlir::arith::TruncIOp::create(
              b, l, i32, mlir::arith::AndIOp::create(b, l, elem, c64(3)));
          Value word = w[3];
          for (int k = 2; k >= 0; --k) {
            Value is_k = mlir::arith::CmpIOp::create(
                b, l, mlir::arith::CmpIPredicate::eq, lane,
                mlir::arith::ConstantOp::create(b, l, b.getIntegerAttr(i32, k)));
            word = mlir::arith::SelectOp::create(b, l, is_k, w[k], word);
          }
          Value top24 = mlir::arith::ShRUIOp::create(
              b, l, word, mlir::arith::ConstantOp::create(b, l, b.getIntegerAttr(i32, 8)));
          Value keep = mlir::arith::CmpIOp::create(
              b, l, mlir::arith::CmpIPredicate::uge, top24,
              mlir::arith::ConstantOp::create(
                  b, l, b.getIntegerAttr(i32, static_cast<int64_t>(threshold))));
          Value result = keep;
          if (auto ft = llvm::dyn_cast<mlir::FloatType>(out.getElementType())) {
            const double scale = p >= 1.0 ? 0.0 : 1.0 / (1.0 - p);
            result = mlir::arith::SelectOp::create(
                b, l, keep, mlir::arith::ConstantOp::create(b, l, b.getFloatAttr(ft, scale)),
                mlir::arith::ConstantOp::create(b, l, b.getFloatAttr(ft, 0.0)));
          }
          mlir::linalg::YieldOp::create(b, l, result);
        });
    rw.replaceOp(op, generic.getResults());
    return mlir::success();
  }
};

}  // namespace

void populate_random_patterns(mlir::RewritePatternSet& patterns) {
  patterns.add<LowerRandom>(patterns.getContext());
}

}  // namespace kiln::codegen
