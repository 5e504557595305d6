// kiln.random -> linalg.generic computing Philox4x32-10 per element (core/philox.h), with the
// counter layout of the eager kernels (backends/cpu/random.cpp): word j of a draw is word j % 4
// of the block at counter offset + j / 4, key = seed; element i of dropout_mask takes word i,
// of rand and randint words 2i and 2i + 1, of randn words 4i to 4i + 3. So a generated kernel
// (an eager op on a CUDA tensor, codegen/cuda_kernels.cpp) draws eager's numbers: the same
// mask, uniform and integer values (up to the rounding of low + span * u, which a C++ compiler
// may contract into an fma), and normal values to a few ulp (log and cos: libm, libmvec or
// CUDA's libdevice).
//
// Each element computes its whole block (4 words) and keeps what it needs: for a mask 4x the
// rounds of the eager kernel, which stores all four. On a GPU that is ~60 integer
// instructions per element, far cheaper than drawing on the host and copying over PCIe.
#include <algorithm>
#include <cmath>
#include <numbers>

#include "codegen/lower.h"
#include "core/error.h"
#include "core/philox.h"
#include "ir/dialect.h"
#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Linalg/IR/Linalg.h"
#include "mlir/Dialect/Math/IR/Math.h"
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

/// 32-bit words each element of a draw takes (backends/cpu/random.cpp's layout).
int words_per_element(OpKind k) {
  switch (k) {
    case OpKind::Uniform:
    case OpKind::RandInt: return 2;
    case OpKind::Normal: return 4;
    default: return 1;  // dropout_mask
  }
}

/// The element's value from its words `w` (words_per_element of them), as eager's kernels
/// compute it (backends/cpu/random.cpp): dropout_mask keeps an element when the top 24 bits
/// of its word are >= ceil(p * 2^24) (result bool: keep; floating: keep ? 1 / (1 - p) rounded
/// to the dtype : 0); rand is low + (high - low) * u with u from 24 (float32) or 53 (float64)
/// bits, in the dtype; randn is Box-Muller in float64, mean + std * sqrt(-2 log(1 - u1)) *
/// cos(2 pi u2), then converted; randint is low + the high half of the 64-bit word pair times
/// (high - low).
Value element_value(mlir::OpBuilder& b, mlir::Location l, OpKind kind, const OpAttrs& a,
                    mlir::Type out, llvm::ArrayRef<Value> w) {
  mlir::Type i32 = b.getI32Type(), i64 = b.getI64Type(), f64 = b.getF64Type();
  auto c32 = [&](int64_t v) -> Value {
    return mlir::arith::ConstantOp::create(b, l, b.getIntegerAttr(i32, v));
  };
  auto c64 = [&](int64_t v) -> Value {
    return mlir::arith::ConstantOp::create(b, l, b.getIntegerAttr(i64, v));
  };
  auto fconst = [&](mlir::Type t, double v) -> Value {
    return mlir::arith::ConstantOp::create(b, l, b.getFloatAttr(t, v));
  };
  // (hi << 32) | lo of two words, as i64.
  auto pair = [&](Value hi, Value lo) -> Value {
    Value h = mlir::arith::ShLIOp::create(b, l, mlir::arith::ExtUIOp::create(b, l, i64, hi),
                                          c64(32));
    return mlir::arith::OrIOp::create(b, l, h, mlir::arith::ExtUIOp::create(b, l, i64, lo));
  };
  // philox::to_uniform_double: the top 53 bits of the pair times 2^-53.
  auto uniform_double = [&](Value hi, Value lo) -> Value {
    Value bits = mlir::arith::ShRUIOp::create(b, l, pair(hi, lo), c64(11));
    return mlir::arith::MulFOp::create(b, l, mlir::arith::UIToFPOp::create(b, l, f64, bits),
                                       fconst(f64, 0x1.0p-53));
  };
  switch (kind) {
    case OpKind::DropoutMask: {
      const double p = a.p;
      const auto threshold = static_cast<int64_t>(std::min(std::ceil(p * 0x1.0p24), 0x1.0p24));
      Value top24 = mlir::arith::ShRUIOp::create(b, l, w[0], c32(8));
      Value keep =
          mlir::arith::CmpIOp::create(b, l, mlir::arith::CmpIPredicate::uge, top24, c32(threshold));
      auto ft = llvm::dyn_cast<mlir::FloatType>(out);
      if (!ft) return keep;
      return mlir::arith::SelectOp::create(b, l, keep, fconst(ft, p >= 1.0 ? 0.0 : 1.0 / (1.0 - p)),
                                           fconst(ft, 0.0));
    }
    case OpKind::Uniform: {
      Value u;
      double low, span;
      if (out.isF32()) {  // philox::to_uniform_float
        Value top24 = mlir::arith::ShRUIOp::create(b, l, w[0], c32(8));
        u = mlir::arith::MulFOp::create(b, l, mlir::arith::UIToFPOp::create(b, l, out, top24),
                                        fconst(out, 0x1.0p-24));
        const float lo = a.low.to<float>();
        low = lo, span = a.high.to<float>() - lo;
      } else {
        u = uniform_double(w[0], w[1]);
        low = a.low.to<double>(), span = a.high.to<double>() - low;
      }
      return mlir::arith::AddFOp::create(
          b, l, fconst(out, low), mlir::arith::MulFOp::create(b, l, fconst(out, span), u));
    }
    case OpKind::Normal: {
      Value u1 = uniform_double(w[0], w[1]), u2 = uniform_double(w[2], w[3]);
      Value radius = mlir::math::SqrtOp::create(
          b, l,
          mlir::arith::MulFOp::create(
              b, l, fconst(f64, -2.0),
              mlir::math::LogOp::create(
                  b, l, mlir::arith::SubFOp::create(b, l, fconst(f64, 1.0), u1))));
      Value angle = mlir::arith::MulFOp::create(b, l, fconst(f64, 2.0 * std::numbers::pi), u2);
      Value z = mlir::arith::MulFOp::create(b, l, radius, mlir::math::CosOp::create(b, l, angle));
      Value v = mlir::arith::AddFOp::create(
          b, l, fconst(f64, a.low.to<double>()),
          mlir::arith::MulFOp::create(b, l, fconst(f64, a.high.to<double>()), z));
      return out.isF64() ? v : mlir::arith::TruncFOp::create(b, l, out, v).getResult();
    }
    case OpKind::RandInt: {
      const int64_t low = a.low.to<int64_t>();
      // high - low as unsigned (the bits of an i64 constant): exact above INT64_MAX too.
      const uint64_t range = static_cast<uint64_t>(a.high.to<int64_t>()) -
                             static_cast<uint64_t>(low);
      auto product = mlir::arith::MulUIExtendedOp::create(b, l, pair(w[0], w[1]),
                                                          c64(static_cast<int64_t>(range)));
      Value v = mlir::arith::AddIOp::create(b, l, c64(low), product.getHigh());
      if (out.isInteger(64)) return v;
      if (auto it = llvm::dyn_cast<mlir::IntegerType>(out))
        return mlir::arith::TruncIOp::create(b, l, it, v);
      return mlir::arith::SIToFPOp::create(b, l, out, v);
    }
    default: return {};
  }
}

/// kiln.random on a static shape: a generic over the result whose body reads the key (seed,
/// offset) from its operand, numbers the element in row-major order, computes the Philox
/// block holding its words and keeps them.
struct LowerRandom : mlir::OpRewritePattern<kiln::dialect::RandomOp> {
  using OpRewritePattern::OpRewritePattern;
  mlir::LogicalResult matchAndRewrite(kiln::dialect::RandomOp op,
                                      mlir::PatternRewriter& rw) const override {
    auto kind = kiln::dialect::op_kind_from_name(op.getKind());
    if (!kind || (*kind != OpKind::DropoutMask && *kind != OpKind::Uniform &&
                  *kind != OpKind::Normal && *kind != OpKind::RandInt))
      return rw.notifyMatchFailure(op, "kind not lowered yet");
    auto out = llvm::cast<mlir::RankedTensorType>(op.getResult().getType());
    if (!out.hasStaticShape()) return rw.notifyMatchFailure(op, "dynamic shape");
    const OpAttrs a = kiln::dialect::attrs_from_op(*kind, op);
    if (*kind == OpKind::RandInt && out.getElementType().isInteger(32) &&
        !philox::randint_fits_int32(a.low.to<int64_t>(), a.high.to<int64_t>()))
      return rw.notifyMatchFailure(op, "randint's range does not fit int32 (eager raises)");
    const int words = words_per_element(*kind);
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
          // The element's first word, j = words * elem: word j % 4 of block offset + j / 4.
          // Its words share that block (words is 1, 2 or 4).
          Value first = mlir::arith::MulIOp::create(b, l, elem, c64(words));
          Value ctr = mlir::arith::AddIOp::create(
              b, l, offset, mlir::arith::ShRUIOp::create(b, l, first, c64(2)));
          std::array<Value, 4> block = philox_words(b, l, ctr, seed);
          Value lane = mlir::arith::TruncIOp::create(
              b, l, i32, mlir::arith::AndIOp::create(b, l, first, c64(3)));
          llvm::SmallVector<Value, 4> w;
          for (int k = 0; k < words; ++k) {
            if (words == 4) {  // the whole block
              w.push_back(block[k]);
              continue;
            }
            Value at = mlir::arith::AddIOp::create(
                b, l, lane, mlir::arith::ConstantOp::create(b, l, b.getIntegerAttr(i32, k)));
            Value word = block[3];
            for (int j = 2; j >= 0; --j) {
              Value is_j = mlir::arith::CmpIOp::create(
                  b, l, mlir::arith::CmpIPredicate::eq, at,
                  mlir::arith::ConstantOp::create(b, l, b.getIntegerAttr(i32, j)));
              word = mlir::arith::SelectOp::create(b, l, is_j, block[j], word);
            }
            w.push_back(word);
          }
          mlir::linalg::YieldOp::create(
              b, l, element_value(b, l, *kind, a, out.getElementType(), w));
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
