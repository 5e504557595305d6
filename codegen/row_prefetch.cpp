// Next-row prefetch in the CPU's row loops (row_fusion.h, prefetch_next_rows).
#include "codegen/row_fusion.h"
#include "llvm/ADT/SetVector.h"
#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"

namespace kiln::codegen {
namespace {

constexpr int64_t kCacheLine = 64;
// Bytes of next rows per row loop, all buffers together: a row larger than this streams on the
// hardware prefetchers, and more would push the current rows out of L1.
constexpr int64_t kMaxRowBytes = 16384;

/// The bytes of one row of `type` after its `k` row dims, when they are static, contiguous
/// (identity layout) and of whole bytes; else 0.
int64_t row_bytes(mlir::MemRefType type, unsigned k) {
  if (!type.getLayout().isIdentity() || type.getRank() <= k) return 0;
  const unsigned bits = type.getElementTypeBitWidth();
  if (bits % 8 != 0) return 0;
  int64_t elements = 1;
  for (unsigned d = k; d < type.getRank(); ++d) {
    if (type.isDynamicDim(d)) return 0;
    elements *= type.getDimSize(d);
  }
  return elements * (bits / 8);
}

/// The function arguments whose row the loop reads: loaded somewhere in `loop` with its row
/// IVs as the leading indices.
llvm::SetVector<mlir::Value> rows_read(mlir::scf::ParallelOp loop) {
  llvm::SetVector<mlir::Value> read;
  const unsigned k = loop.getNumLoops();
  loop.walk([&](mlir::memref::LoadOp load) {
    auto arg = llvm::dyn_cast<mlir::BlockArgument>(load.getMemRef());
    if (!arg || !llvm::isa<mlir::func::FuncOp>(arg.getOwner()->getParentOp())) return;
    if (load.getIndices().size() <= k) return;
    for (unsigned d = 0; d < k; ++d)
      if (load.getIndices()[d] != loop.getInductionVars()[d]) return;
    read.insert(arg);
  });
  loop.walk([&](mlir::memref::StoreOp store) { read.remove(store.getMemRef()); });
  return read;
}

/// Prefetches the next row of `buffer` in `loop` when it has kCacheLine to `budget` bytes.
/// Returns the bytes prefetched (0: none).
int64_t prefetch_next_row(mlir::scf::ParallelOp loop, mlir::Value buffer, int64_t budget) {
  const unsigned k = loop.getNumLoops();
  auto type = llvm::cast<mlir::MemRefType>(buffer.getType());
  const int64_t bytes = row_bytes(type, k);
  if (bytes < kCacheLine || bytes > budget) return 0;
  const int64_t element_bytes = type.getElementTypeBitWidth() / 8;
  mlir::Location loc = loop.getLoc();
  mlir::OpBuilder b = mlir::OpBuilder::atBlockBegin(loop.getBody());
  auto index = [&](int64_t v) { return mlir::arith::ConstantIndexOp::create(b, loc, v); };
  // The next row along the innermost row dim, clamped to the last (the last row prefetches
  // itself again: cheaper than a branch, and never outside the buffer).
  mlir::Value iv = loop.getInductionVars()[k - 1];
  mlir::Value last = mlir::arith::SubIOp::create(b, loc, loop.getUpperBound()[k - 1], index(1));
  mlir::Value next = mlir::arith::MinSIOp::create(
      b, loc, mlir::arith::AddIOp::create(b, loc, iv, loop.getStep()[k - 1]), last);
  llvm::SmallVector<mlir::Value> indices = llvm::to_vector(loop.getInductionVars());
  indices[k - 1] = next;
  const int64_t step = kCacheLine / element_bytes;
  const int64_t elements = bytes / element_bytes;
  for (int64_t e = 0; e < elements; e += step) {
    llvm::SmallVector<mlir::Value> at(indices);
    int64_t rest = e;  // e's indices in the trailing dims, innermost last
    llvm::SmallVector<mlir::Value> trailing;
    for (unsigned d = type.getRank(); d-- > k;) {
      trailing.push_back(index(rest % type.getDimSize(d)));
      rest /= type.getDimSize(d);
    }
    at.append(trailing.rbegin(), trailing.rend());
    mlir::memref::PrefetchOp::create(b, loc, buffer, at, /*isWrite=*/false,
                                     /*localityHint=*/3, /*isDataCache=*/true);
  }
  return bytes;
}

}  // namespace

int prefetch_next_rows(mlir::func::FuncOp fn) {
  int prefetched = 0;
  for (mlir::scf::ParallelOp loop : top_level_loops(fn)) {
    int64_t budget = kMaxRowBytes;
    for (mlir::Value buffer : rows_read(loop)) {
      const int64_t bytes = prefetch_next_row(loop, buffer, budget);
      budget -= bytes;
      prefetched += bytes > 0;
    }
  }
  return prefetched;
}

}  // namespace kiln::codegen
