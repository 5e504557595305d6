// kiln.index -> linalg.generic: the Index rows of the op table that read or select elements
// (one_hot, tril, triu, masked_fill, index_select, gather, embedding). index_add, index_copy
// and scatter_add, which write through indices, become a nest of scf.for loops on tensors
// (tensor.extract / tensor.insert into the result, bufferized in place), tagged
// kScatterLoopAttr: on the CPU they run in order, as eager's kernel does; for the GPU
// (codegen/gpu_lowering.cpp) an add's nest becomes one parallel loop of atomic adds (a copy's
// stays serial: a repeated index must keep its last slice).
//
// index_select, gather and embedding read their source with tensor.extract at an index loaded
// from the index tensor, clamped to the source's size along the indexed dim: an index outside
// it reads a wrong element, never outside the buffer. Eager raises for such an index; compiled
// code cannot, so the tracer scans the indices of these ops (tracer/plan.cpp,
// data_checked_inputs) and eager GPU ops check them before the kernel runs
// (codegen/cuda_kernels.cpp), both with eager's check (eager/value_checks.h).
#include <functional>

#include "codegen/lower.h"
#include "core/error.h"
#include "ir/dialect.h"
#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Linalg/IR/Linalg.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"

namespace kiln::codegen {
namespace {

using mlir::Value;

Value i64_constant(mlir::OpBuilder& b, mlir::Location l, int64_t v) {
  return mlir::arith::ConstantOp::create(b, l, b.getIntegerAttr(b.getI64Type(), v));
}

/// Loop `d` of the enclosing linalg.generic as an i64.
Value loop_index(mlir::OpBuilder& b, mlir::Location l, int64_t d) {
  return mlir::arith::IndexCastOp::create(b, l, b.getI64Type(),
                                          mlir::linalg::IndexOp::create(b, l, d));
}

/// `s` (a Scalar attribute) as a constant of element type `t`, converted as eager's
/// Scalar::to<T> does: one rounding to float32 (an int64 above 2^53 went through double, two).
Value scalar_of_type(mlir::OpBuilder& b, mlir::Location l, const Scalar& s, mlir::Type t) {
  if (auto ft = llvm::dyn_cast<mlir::FloatType>(t)) {
    const double v = ft.isF32() ? static_cast<double>(s.to<float>()) : s.to<double>();
    return mlir::arith::ConstantOp::create(b, l, t, mlir::FloatAttr::get(ft, v));
  }
  if (t.isInteger(1))
    return mlir::arith::ConstantOp::create(b, l, t, b.getIntegerAttr(t, s.to<bool>() ? 1 : 0));
  return mlir::arith::ConstantOp::create(b, l, t, b.getIntegerAttr(t, s.to<int64_t>()));
}

Value zero_of_type(mlir::OpBuilder& b, mlir::Location l, mlir::Type t) {
  if (auto ft = llvm::dyn_cast<mlir::FloatType>(t))
    return mlir::arith::ConstantOp::create(b, l, t, mlir::FloatAttr::get(ft, 0.0));
  return mlir::arith::ConstantOp::create(b, l, t, b.getIntegerAttr(t, 0));
}

/// A parallel linalg.generic over `out` (identity output map) reading `inputs` through `maps`;
/// `body` gets the inputs' elements and returns the result element.
mlir::linalg::GenericOp parallel_generic(
    mlir::PatternRewriter& rw, mlir::Location loc, mlir::RankedTensorType out,
    llvm::ArrayRef<Value> dynamic_sizes, mlir::ValueRange inputs,
    llvm::SmallVector<mlir::AffineMap> maps,
    llvm::function_ref<Value(mlir::OpBuilder&, mlir::Location, mlir::ValueRange)> body) {
  const int64_t rank = out.getRank();
  maps.push_back(mlir::AffineMap::getMultiDimIdentityMap(rank, rw.getContext()));
  Value init = mlir::tensor::EmptyOp::create(rw, loc, out.getShape(), out.getElementType(),
                                             dynamic_sizes);
  llvm::SmallVector<mlir::utils::IteratorType> iterators(rank,
                                                         mlir::utils::IteratorType::parallel);
  return mlir::linalg::GenericOp::create(
      rw, loc, mlir::TypeRange{out}, inputs, mlir::ValueRange{init}, maps, iterators,
      [&](mlir::OpBuilder& b, mlir::Location l, mlir::ValueRange args) {
        mlir::linalg::YieldOp::create(b, l, body(b, l, args.drop_back()));
      });
}

/// The `?` sizes of `out`, each from `size_of(j)` for result dim j.
llvm::SmallVector<Value> dynamic_sizes_of(mlir::RankedTensorType out,
                                          llvm::function_ref<Value(int64_t)> size_of) {
  llvm::SmallVector<Value> sizes;
  for (int64_t j = 0; j < out.getRank(); ++j)
    if (out.isDynamicDim(j)) sizes.push_back(size_of(j));
  return sizes;
}

Value dim_of(mlir::PatternRewriter& rw, mlir::Location loc, Value t, int64_t d) {
  return mlir::tensor::DimOp::create(rw, loc, t, d);
}

/// kiln.index "one_hot": out[..., c] = int64(x[...] == c), one generic over the result whose
/// input map drops the class dim, so it fuses with the cast and multiply that follow it in
/// nll_loss's backward. A class index outside [0, C) equals no c: its row is all zeros (eager
/// raises; the index checks above keep eager's error).
Value lower_one_hot(mlir::PatternRewriter& rw, mlir::Location loc, Value x,
                    mlir::RankedTensorType out) {
  mlir::MLIRContext* ctx = rw.getContext();
  const int64_t rank = out.getRank();
  llvm::SmallVector<mlir::AffineExpr> exprs;
  for (int64_t d = 0; d + 1 < rank; ++d) exprs.push_back(mlir::getAffineDimExpr(d, ctx));
  auto sizes = dynamic_sizes_of(out, [&](int64_t j) { return dim_of(rw, loc, x, j); });
  return parallel_generic(rw, loc, out, sizes, {x}, {mlir::AffineMap::get(rank, 0, exprs, ctx)},
                          [&](mlir::OpBuilder& b, mlir::Location l, mlir::ValueRange a) {
                            Value eq = mlir::arith::CmpIOp::create(
                                b, l, mlir::arith::CmpIPredicate::eq, a[0],
                                loop_index(b, l, rank - 1));
                            return mlir::arith::ExtUIOp::create(b, l, b.getI64Type(), eq)
                                .getResult();
                          })
      .getResult(0);
}

/// kiln.index "tril" / "triu": element (…, i, j) is kept when j − i <= diagonal (tril) or
/// j − i >= diagonal (triu), else 0, as eager's kernel (backends/cpu/index.cpp). j − i is
/// formed in i64, so no diagonal overflows.
Value lower_triangle(mlir::PatternRewriter& rw, mlir::Location loc, Value x,
                     mlir::RankedTensorType out, bool lower, int64_t diagonal) {
  const int64_t rank = out.getRank();
  auto sizes = dynamic_sizes_of(out, [&](int64_t j) { return dim_of(rw, loc, x, j); });
  auto identity = mlir::AffineMap::getMultiDimIdentityMap(rank, rw.getContext());
  return parallel_generic(
             rw, loc, out, sizes, {x}, {identity},
             [&](mlir::OpBuilder& b, mlir::Location l, mlir::ValueRange a) {
               Value diff = mlir::arith::SubIOp::create(b, l, loop_index(b, l, rank - 1),
                                                        loop_index(b, l, rank - 2));
               Value keep = mlir::arith::CmpIOp::create(
                   b, l, lower ? mlir::arith::CmpIPredicate::sle : mlir::arith::CmpIPredicate::sge,
                   diff, i64_constant(b, l, diagonal));
               return mlir::arith::SelectOp::create(
                          b, l, keep, a[0], zero_of_type(b, l, out.getElementType()))
                   .getResult();
             })
      .getResult(0);
}

/// kiln.index "masked_fill": value where the mask (broadcast to x's shape) is true, else x.
Value lower_masked_fill(mlir::PatternRewriter& rw, mlir::Location loc, Value x, Value mask,
                        mlir::RankedTensorType out, const Scalar& value) {
  const int64_t rank = out.getRank();
  auto sizes = dynamic_sizes_of(out, [&](int64_t j) { return dim_of(rw, loc, x, j); });
  auto mask_type = llvm::cast<mlir::RankedTensorType>(mask.getType());
  llvm::SmallVector<mlir::AffineMap> maps = {
      mlir::AffineMap::getMultiDimIdentityMap(rank, rw.getContext()),
      broadcast_map(mask_type, out, rank)};
  return parallel_generic(rw, loc, out, sizes, {x, mask}, maps,
                          [&](mlir::OpBuilder& b, mlir::Location l, mlir::ValueRange a) {
                            Value fill = scalar_of_type(b, l, value, out.getElementType());
                            return mlir::arith::SelectOp::create(b, l, a[1], fill, a[0])
                                .getResult();
                          })
      .getResult(0);
}

/// `index` clamped into [0, last] (an i64), as an index value.
Value clamped_index(mlir::OpBuilder& b, mlir::Location l, Value index, Value last) {
  if (!index.getType().isInteger(64))
    index = mlir::arith::ExtSIOp::create(b, l, b.getI64Type(), index);
  index = mlir::arith::MaxSIOp::create(b, l, index, i64_constant(b, l, 0));
  index = mlir::arith::MinSIOp::create(b, l, index, last);
  return mlir::arith::IndexCastOp::create(b, l, b.getIndexType(), index);
}

/// x's size along `axis` minus 1, in i64; nullptr when that size is 0 or `?` (nothing to clamp
/// an index into).
Value last_index(mlir::PatternRewriter& rw, mlir::Location loc, Value x, int64_t axis) {
  auto type = llvm::cast<mlir::RankedTensorType>(x.getType());
  if (type.isDynamicDim(axis) || type.getDimSize(axis) == 0) return nullptr;
  return i64_constant(rw, loc, type.getDimSize(axis) - 1);
}

/// index_select, gather, embedding: out[e] = source[e with dim `axis` replaced by
/// clamp(index[idx_map(e)], 0, size − 1)], where size is the source's size along `axis`.
/// `coords(b, l, i)` gives the source coordinates for the clamped index i (an index value).
/// Fails (nullptr) when the source's size along `axis` is 0 or `?` (nothing to clamp into).
Value lower_take(mlir::PatternRewriter& rw, mlir::Location loc, Value source, Value index,
                 mlir::RankedTensorType out, int64_t axis, mlir::AffineMap index_map,
                 llvm::ArrayRef<Value> sizes,
                 llvm::function_ref<llvm::SmallVector<Value>(mlir::OpBuilder&, mlir::Location,
                                                             Value)>
                     coords) {
  Value last = last_index(rw, loc, source, axis);  // computed once, outside the loops
  if (!last) return nullptr;
  return parallel_generic(
             rw, loc, out, sizes, {index}, {index_map},
             [&](mlir::OpBuilder& b, mlir::Location l, mlir::ValueRange a) {
               Value at = clamped_index(b, l, a[0], last);
               return mlir::tensor::ExtractOp::create(b, l, source, coords(b, l, at))
                   .getResult();
             })
      .getResult(0);
}

/// The coordinates (loop k for every dim k of a rank-`rank` source but `axis`, which takes
/// `at`) of index_select and gather.
llvm::SmallVector<Value> axis_replaced(mlir::OpBuilder& b, mlir::Location l, int64_t rank,
                                       int64_t axis, Value at) {
  llvm::SmallVector<Value> c;
  for (int64_t k = 0; k < rank; ++k)
    c.push_back(k == axis ? at : mlir::linalg::IndexOp::create(b, l, k).getResult());
  return c;
}

/// index_add, index_copy (`kind`) and scatter_add: the result starts as x, then for every
/// element e of the iteration space (index_add, index_copy: the source's; scatter_add: the
/// index's), in row-major order, result[e with dim `axis` replaced by clamp(i)] += source[e]
/// (index_copy: = source[e], so a repeated index keeps its last slice, as eager's kernel),
/// where i is index[e_axis] (index_add, index_copy) or index[e] (scatter_add). One scf.for per
/// dim, the result carried through them, each tagged kScatterLoopAttr (the loop over `axis`
/// kScatterAxisAttr too, which stays serial: cpu_parallel.cpp). Bool index_add / scatter_add
/// (logical or) are not lowered.
Value lower_scatter(mlir::PatternRewriter& rw, mlir::Location loc, Value x, Value index,
                    Value source, mlir::RankedTensorType out, int64_t axis, OpKind kind) {
  mlir::Type element = llvm::cast<mlir::RankedTensorType>(x.getType()).getElementType();
  const bool copy = kind == OpKind::IndexCopy, along_source = kind != OpKind::ScatterAdd;
  // (before any op is made: the pattern fails clean)
  if (element.isInteger(1) && !copy) return nullptr;
  Value last = last_index(rw, loc, x, axis);
  if (!last) return nullptr;
  Value space = along_source ? source : index;
  const int64_t rank = llvm::cast<mlir::RankedTensorType>(space.getType()).getRank();
  const bool index_is_0d = llvm::cast<mlir::RankedTensorType>(index.getType()).getRank() == 0;
  Value zero = mlir::arith::ConstantIndexOp::create(rw, loc, 0);
  Value one = mlir::arith::ConstantIndexOp::create(rw, loc, 1);
  // The bounds, made before the loops: a `?` size read inside one would end the perfect nest
  // that the GPU lowering makes parallel.
  llvm::SmallVector<Value> sizes;
  for (int64_t d = 0; d < rank; ++d) sizes.push_back(dim_of(rw, loc, space, d));
  llvm::SmallVector<Value> ivs;
  // The innermost body: one element of the source added (or copied) into the result.
  auto add_one = [&](mlir::OpBuilder& b, mlir::Location l, Value acc) -> Value {
    llvm::SmallVector<Value> at_index;
    if (!along_source) at_index = ivs;
    else if (!index_is_0d) at_index = {ivs[axis]};
    Value i = mlir::tensor::ExtractOp::create(b, l, index, at_index);
    llvm::SmallVector<Value> target(ivs);
    target[axis] = clamped_index(b, l, i, last);
    Value v = mlir::tensor::ExtractOp::create(b, l, source, ivs);
    if (copy) return mlir::tensor::InsertOp::create(b, l, v, acc, target);
    Value old = mlir::tensor::ExtractOp::create(b, l, acc, target);
    Value sum = llvm::isa<mlir::FloatType>(element)
                    ? mlir::arith::AddFOp::create(b, l, old, v).getResult()
                    : mlir::arith::AddIOp::create(b, l, old, v).getResult();
    return mlir::tensor::InsertOp::create(b, l, sum, acc, target);
  };
  std::function<Value(mlir::OpBuilder&, mlir::Location, Value)> nest =
      [&](mlir::OpBuilder& b, mlir::Location l, Value acc) -> Value {
    const int64_t d = static_cast<int64_t>(ivs.size());
    if (d == rank) return add_one(b, l, acc);
    auto loop = mlir::scf::ForOp::create(
        b, l, zero, sizes[d], one, mlir::ValueRange{acc},
        [&](mlir::OpBuilder& nb, mlir::Location nl, Value iv, mlir::ValueRange carried) {
          ivs.push_back(iv);
          Value r = nest(nb, nl, carried[0]);
          ivs.pop_back();
          mlir::scf::YieldOp::create(nb, nl, r);
        });
    // Every loop of the nest is tagged: canonicalization removes a loop of one iteration.
    loop->setAttr(kScatterLoopAttr, rw.getUnitAttr());
    if (d == axis) loop->setAttr(kScatterAxisAttr, rw.getUnitAttr());
    return loop.getResult(0);
  };
  // The loops write x's buffer in place when x is an intermediate; bufferization copies a
  // graph input first (inputs are not writable: executable.cpp). The op's type may have `?`
  // where x's has a size (ir/dialect.cpp relaxes some): the result is cast (a cast of the
  // init would hide a shared init from unshare_inits).
  Value result = nest(rw, loc, x);
  if (result.getType() != out) result = mlir::tensor::CastOp::create(rw, loc, out, result);
  return result;
}

struct LowerIndex : mlir::OpRewritePattern<kiln::dialect::IndexOp> {
  using OpRewritePattern::OpRewritePattern;
  mlir::LogicalResult matchAndRewrite(kiln::dialect::IndexOp op,
                                      mlir::PatternRewriter& rw) const override {
    auto kind = kiln::dialect::op_kind_from_name(op.getKind());
    if (!kind) return rw.notifyMatchFailure(op, "unknown kind");
    const OpAttrs a = kiln::dialect::attrs_from_op(*kind, op);
    auto out = llvm::cast<mlir::RankedTensorType>(op.getResult().getType());
    mlir::Location loc = op.getLoc();
    mlir::MLIRContext* ctx = rw.getContext();
    auto in = op.getInputs();
    const int64_t rank = out.getRank();
    Value result;
    switch (*kind) {
      case OpKind::OneHot: result = lower_one_hot(rw, loc, in[0], out); break;
      case OpKind::Tril:
      case OpKind::Triu:
        result = lower_triangle(rw, loc, in[0], out, *kind == OpKind::Tril, a.mode);
        break;
      case OpKind::MaskedFill:
        result = lower_masked_fill(rw, loc, in[0], in[1], out, a.alpha);
        break;
      case OpKind::IndexSelect: {
        if (rank == 0) return rw.notifyMatchFailure(op, "0-d source");
        const int64_t axis = a.dim < 0 ? a.dim + rank : a.dim;
        const bool vector = llvm::cast<mlir::RankedTensorType>(in[1].getType()).getRank() == 1;
        auto map = vector ? mlir::AffineMap::get(rank, 0, {mlir::getAffineDimExpr(axis, ctx)}, ctx)
                          : mlir::AffineMap::get(rank, 0, {}, ctx);
        auto sizes = dynamic_sizes_of(out, [&](int64_t j) {
          return j == axis ? dim_of(rw, loc, in[1], 0) : dim_of(rw, loc, in[0], j);
        });
        result = lower_take(rw, loc, in[0], in[1], out, axis, map, sizes,
                            [&](mlir::OpBuilder& b, mlir::Location l, Value at) {
                              return axis_replaced(b, l, rank, axis, at);
                            });
        break;
      }
      case OpKind::Gather: {
        if (rank == 0) return rw.notifyMatchFailure(op, "0-d source");
        const int64_t axis = a.dim < 0 ? a.dim + rank : a.dim;
        auto sizes = dynamic_sizes_of(out, [&](int64_t j) { return dim_of(rw, loc, in[1], j); });
        result = lower_take(rw, loc, in[0], in[1], out, axis,
                            mlir::AffineMap::getMultiDimIdentityMap(rank, ctx), sizes,
                            [&](mlir::OpBuilder& b, mlir::Location l, Value at) {
                              return axis_replaced(b, l, rank, axis, at);
                            });
        break;
      }
      case OpKind::Embedding: {
        llvm::SmallVector<mlir::AffineExpr> exprs;
        for (int64_t d = 0; d + 1 < rank; ++d) exprs.push_back(mlir::getAffineDimExpr(d, ctx));
        auto sizes = dynamic_sizes_of(out, [&](int64_t j) {
          return j + 1 < rank ? dim_of(rw, loc, in[1], j) : dim_of(rw, loc, in[0], 1);
        });
        result = lower_take(rw, loc, in[0], in[1], out, 0,
                            mlir::AffineMap::get(rank, 0, exprs, ctx), sizes,
                            [&](mlir::OpBuilder& b, mlir::Location l, Value at) {
                              llvm::SmallVector<Value> c = {
                                  at, mlir::linalg::IndexOp::create(b, l, rank - 1)};
                              return c;
                            });
        break;
      }
      case OpKind::IndexAdd:
      case OpKind::IndexCopy:
      case OpKind::ScatterAdd: {
        if (rank == 0) return rw.notifyMatchFailure(op, "0-d input");
        const int64_t axis = a.dim < 0 ? a.dim + rank : a.dim;
        result = lower_scatter(rw, loc, in[0], in[1], in[2], out, axis, *kind);
        break;
      }
      default: return rw.notifyMatchFailure(op, "kind not lowered yet");
    }
    if (!result) return rw.notifyMatchFailure(op, "indexed dim of size 0 or `?`, or bool");
    rw.replaceOp(op, result);
    return mlir::success();
  }
};

}  // namespace

void populate_index_patterns(mlir::RewritePatternSet& patterns) {
  patterns.add<LowerIndex>(patterns.getContext());
}

}  // namespace kiln::codegen
