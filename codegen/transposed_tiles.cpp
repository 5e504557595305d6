// Tiles for loop nests that read a buffer across its memory order (transposed_tiles.h).
#include "codegen/transposed_tiles.h"

#include <algorithm>
#include <map>
#include <tuple>

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/LLVMIR/LLVMAttrs.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/OpenMP/OpenMPDialect.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Utils/StaticValueUtils.h"
#include "mlir/Dialect/Vector/IR/VectorOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"
#include "mlir/Interfaces/ViewLikeInterface.h"

namespace kiln::codegen {
namespace {

constexpr char kTileBuffer[] = "kiln_tile_buffer";
/// Tile buffers per nest. Two 16 KiB tiles and the output's lines stayed in a 48 KiB L1; three
/// spill some to L2 and were still faster than smaller tiles: x.t() + y.t() + z.t() (2048 x
/// 2048 float32, 1 thread) took 19.4-19.5 ms with two of the inputs in tiles, 5.9 ms with
/// three 64 x 64 tiles, 11.8-12.0 ms with three of 32 x 32.
constexpr size_t kMaxBuffers = 4;

/// Tile edge: 64 x 64 elements of 4 bytes or less (eager's kTile), 32 x 32 of 8 bytes.
int64_t tile_edge(mlir::Type element) {
  return element.getIntOrFloatBitWidth() > 32 ? 32 : 64;
}

/// The position of `v` among `p`'s induction variables, or -1.
int loop_of(mlir::scf::ParallelOp p, mlir::Value v) {
  auto arg = llvm::dyn_cast<mlir::BlockArgument>(v);
  if (!arg || arg.getOwner() != p.getBody()) return -1;
  return static_cast<int>(arg.getArgNumber());
}

/// The buffer a view (subview, reshape, cast) reads.
mlir::Value root_of(mlir::Value v) {
  while (auto view = v.getDefiningOp<mlir::ViewLikeOpInterface>()) v = view.getViewSource();
  return v;
}

/// The loop whose index is `load`'s last subscript (of unit stride) when the innermost loop's
/// index is an earlier one: the load reads across memory along the innermost loop. -1 when
/// not, or when its buffer or a subscript is computed inside the nest (the tile's copy, before
/// the body, could not use them).
int across_loop(mlir::scf::ParallelOp p, mlir::memref::LoadOp load) {
  auto indices = load.getIndices();
  auto type = load.getMemRefType();
  if (indices.size() < 2 || !type.isLastDimUnitStride() || !type.getElementType().isIntOrFloat())
    return -1;
  auto inside = [&](mlir::Value v) { return p->isAncestor(v.getParentBlock()->getParentOp()); };
  if (inside(load.getMemRef())) return -1;
  const int inner = static_cast<int>(p.getNumLoops()) - 1;
  const int last = loop_of(p, indices.back());
  if (last < 0 || last == inner) return -1;
  bool inner_seen = false;
  for (mlir::Value v : indices) {
    if (loop_of(p, v) == inner) inner_seen = true;
    else if (loop_of(p, v) < 0 && inside(v)) return -1;
  }
  return inner_seen ? last : -1;
}

/// Loads, stores and pure ops without regions: an elementwise nest whose iterations may run in
/// any order and whose body can be cloned into the tile's loops.
bool straight_line(mlir::scf::ParallelOp p) {
  if (p.getNumResults() != 0 || p.getNumLoops() < 2) return false;
  for (mlir::Value s : p.getStep())
    if (mlir::getConstantIntValue(s) != 1) return false;
  for (mlir::Operation& op : p.getBody()->without_terminator())
    if (op.getNumRegions() != 0 ||
        !(llvm::isa<mlir::memref::LoadOp, mlir::memref::StoreOp>(op) || mlir::isPure(&op)))
      return false;
  return true;
}

/// `loop` marked for LLVM not to vectorise: the copy into the tile writes a column of it per
/// row read, which vectorised becomes scatters (eager's blocked transpose found the same).
void no_vectorize(mlir::scf::ForOp loop) {
  mlir::MLIRContext* ctx = loop.getContext();
  auto vectorize = mlir::LLVM::LoopVectorizeAttr::get(
      ctx, /*disable=*/mlir::BoolAttr::get(ctx, true), {}, {}, {}, {}, {}, {});
  loop->setAttr("llvm.loop_annotation",
                mlir::LLVM::LoopAnnotationAttr::get(ctx, {}, vectorize, {}, {}, {}, {}, {}, {}, {},
                                                    {}, {}, {}, {}, {}, {}));
}

/// Lanes of the copy's square blocks for `element`: rows of 64 bytes, at least 8 and at most
/// 16 lanes (16 x 16 float32, int32 or bytes; 8 x 8 float64 or int64); 0 for widths that are
/// not whole bytes (i1: a vector of them is packed in memory, a memref element is a byte).
int64_t block_lanes(mlir::Type element) {
  const unsigned bits = element.getIntOrFloatBitWidth();
  if (bits % 8 != 0) return 0;
  return std::clamp<int64_t>(512 / bits, 8, 16);
}

/// `rows` (`lanes` vectors of `lanes` elements) transposed in registers: each round
/// interleaves row k with row k + lanes/2 (unpcklps/unpckhps-like shuffles), which rotates an
/// element's (row, column) index bits by one; log2(lanes) rounds swap row and column.
llvm::SmallVector<mlir::Value> transpose_in_registers(mlir::OpBuilder& b, mlir::Location loc,
                                                      llvm::SmallVector<mlir::Value> rows) {
  const int64_t lanes = static_cast<int64_t>(rows.size()), half = lanes / 2;
  llvm::SmallVector<int64_t> low, high;
  for (int64_t j = 0; j < half; ++j) {
    low.append({j, lanes + j});
    high.append({half + j, lanes + half + j});
  }
  for (int64_t round = 1; round < lanes; round *= 2) {
    llvm::SmallVector<mlir::Value> next;
    for (int64_t k = 0; k < half; ++k) {
      next.push_back(mlir::vector::ShuffleOp::create(b, loc, rows[k], rows[k + half], low));
      next.push_back(mlir::vector::ShuffleOp::create(b, loc, rows[k], rows[k + half], high));
    }
    rows = std::move(next);
  }
  return rows;
}

/// Rewrites `p` into tiles over its loops `across` and innermost, each tile copying the
/// `loads` (read across along the innermost loop, with `across` as their last subscript) into
/// stack buffers first.
void tile_nest(mlir::scf::ParallelOp p, unsigned across,
               llvm::ArrayRef<mlir::memref::LoadOp> loads) {
  mlir::OpBuilder b(p);
  mlir::Location loc = p.getLoc();
  const unsigned inner = p.getNumLoops() - 1;
  int64_t edge = 64;
  for (mlir::memref::LoadOp l : loads)
    edge = std::min(edge, tile_edge(l.getMemRefType().getElementType()));
  mlir::Value tile = mlir::arith::ConstantIndexOp::create(b, loc, edge);
  mlir::Value zero = mlir::arith::ConstantIndexOp::create(b, loc, 0);
  mlir::Value one = mlir::arith::ConstantIndexOp::create(b, loc, 1);
  llvm::SmallVector<mlir::Value> steps(p.getStep());
  steps[across] = steps[inner] = tile;
  auto ubs = p.getUpperBound();
  mlir::Block* body = p.getBody();
  auto tiles = mlir::scf::ParallelOp::create(
      b, loc, p.getLowerBound(), ubs, steps,
      [&](mlir::OpBuilder& nb, mlir::Location, mlir::ValueRange ivs) {
        auto extent = [&](unsigned d) {  // of the tile along loop d
          mlir::Value left = mlir::arith::SubIOp::create(nb, loc, ubs[d], ivs[d]);
          return mlir::arith::MinSIOp::create(nb, loc, tile, left).getResult();
        };
        mlir::Value na = extent(across), nn = extent(inner);
        // The nest's indices at the tile's offsets (ta, tn) along the across and inner loops.
        auto indices_at = [&](mlir::IRMapping& map, mlir::Value ta, mlir::Value tn) {
          for (unsigned d = 0; d <= inner; ++d) map.map(body->getArgument(d), ivs[d]);
          map.map(body->getArgument(across), mlir::arith::AddIOp::create(nb, loc, ivs[across], ta));
          map.map(body->getArgument(inner), mlir::arith::AddIOp::create(nb, loc, ivs[inner], tn));
        };
        // Loops over [a0, a1) x [n0, n1) of the tile: `a` (the across loop) then the innermost,
        // in that order or the other, their body seeing the nest's indices.
        auto tile_loops = [&](bool across_outer, mlir::Value a0, mlir::Value a1, mlir::Value n0,
                              mlir::Value n1, auto&& fill) {
          mlir::OpBuilder::InsertionGuard guard(nb);
          auto outer = mlir::scf::ForOp::create(nb, loc, across_outer ? a0 : n0,
                                                across_outer ? a1 : n1, one);
          nb.setInsertionPoint(outer.getBody()->getTerminator());
          auto in = mlir::scf::ForOp::create(nb, loc, across_outer ? n0 : a0,
                                             across_outer ? n1 : a1, one);
          nb.setInsertionPoint(in.getBody()->getTerminator());
          mlir::Value ta = across_outer ? outer.getInductionVar() : in.getInductionVar();
          mlir::Value tn = across_outer ? in.getInductionVar() : outer.getInductionVar();
          mlir::IRMapping map;
          indices_at(map, ta, tn);
          fill(map, ta, tn);
          return in;
        };
        llvm::DenseMap<mlir::Operation*, mlir::Value> buffers;
        for (mlir::memref::LoadOp l : loads) {
          mlir::Type element = l.getMemRefType().getElementType();
          auto type = mlir::MemRefType::get({edge, edge}, element);
          auto buffer = mlir::memref::AllocaOp::create(nb, loc, type);
          buffer->setAttr(kTileBuffer, nb.getUnitAttr());
          buffers[l] = buffer;
          // The copy reads the input's rows (the across loop innermost) and writes the tile's
          // columns: buffer[a][n], so that the body's innermost loop reads it contiguously.
          auto scalar_copy = [&](mlir::Value a0, mlir::Value a1, mlir::Value n0, mlir::Value n1) {
            auto copy = tile_loops(false, a0, a1, n0, n1,
                                   [&](mlir::IRMapping& map, mlir::Value ta, mlir::Value tn) {
                                     llvm::SmallVector<mlir::Value> at;
                                     for (mlir::Value v : l.getIndices())
                                       at.push_back(map.lookupOrDefault(v));
                                     mlir::Value v =
                                         mlir::memref::LoadOp::create(nb, loc, l.getMemRef(), at);
                                     mlir::memref::StoreOp::create(nb, loc, v, buffer,
                                                                   mlir::ValueRange{ta, tn});
                                   });
            no_vectorize(copy);
          };
          // Whole blocks of lanes x lanes: `lanes` rows of the input loaded as vectors,
          // transposed in registers, stored as the buffer's rows; the rest element by element.
          // The across loop's index must be the last subscript only (one vector per row).
          const int64_t lanes = block_lanes(element);
          const bool across_once = llvm::count(l.getIndices(), body->getArgument(across)) == 1;
          if (lanes == 0 || !across_once) {
            scalar_copy(zero, na, zero, nn);
            continue;
          }
          mlir::Value step = mlir::arith::ConstantIndexOp::create(nb, loc, lanes);
          auto whole = [&](mlir::Value n) {  // n rounded down to whole blocks
            mlir::Value blocks = mlir::arith::DivUIOp::create(nb, loc, n, step);
            return mlir::arith::MulIOp::create(nb, loc, blocks, step).getResult();
          };
          mlir::Value na_whole = whole(na), nn_whole = whole(nn);
          auto rows = mlir::scf::ForOp::create(nb, loc, zero, nn_whole, step);
          {
            mlir::OpBuilder::InsertionGuard guard(nb);
            nb.setInsertionPoint(rows.getBody()->getTerminator());
            auto cols = mlir::scf::ForOp::create(nb, loc, zero, na_whole, step);
            nb.setInsertionPoint(cols.getBody()->getTerminator());
            mlir::Value ta = cols.getInductionVar(), tn = rows.getInductionVar();
            auto vector_type = mlir::VectorType::get({lanes}, element);
            llvm::SmallVector<mlir::Value> block;
            for (int64_t k = 0; k < lanes; ++k) {
              mlir::Value tnk = mlir::arith::AddIOp::create(
                  nb, loc, tn, mlir::arith::ConstantIndexOp::create(nb, loc, k));
              mlir::IRMapping map;
              indices_at(map, ta, tnk);
              llvm::SmallVector<mlir::Value> at;
              for (mlir::Value v : l.getIndices()) at.push_back(map.lookupOrDefault(v));
              block.push_back(
                  mlir::vector::LoadOp::create(nb, loc, vector_type, l.getMemRef(), at));
            }
            block = transpose_in_registers(nb, loc, std::move(block));
            for (int64_t j = 0; j < lanes; ++j) {
              mlir::Value taj = mlir::arith::AddIOp::create(
                  nb, loc, ta, mlir::arith::ConstantIndexOp::create(nb, loc, j));
              mlir::vector::StoreOp::create(nb, loc, block[j], buffer, mlir::ValueRange{taj, tn});
            }
          }
          scalar_copy(na_whole, na, zero, nn);        // the columns past the whole blocks
          scalar_copy(zero, na_whole, nn_whole, nn);  // the rows below them
        }
        tile_loops(true, zero, na, zero, nn,
                   [&](mlir::IRMapping& map, mlir::Value ta, mlir::Value tn) {
                     for (mlir::Operation& op : body->without_terminator()) {
                       auto it = buffers.find(&op);
                       if (it == buffers.end()) {
                         nb.clone(op, map);
                         continue;
                       }
                       mlir::Value v = mlir::memref::LoadOp::create(nb, loc, it->second,
                                                                    mlir::ValueRange{ta, tn});
                       map.map(op.getResult(0), v);
                     }
                   });
      });
  tiles->setAttr(kTileLoopsAttr, b.getUnitAttr());
  p.erase();
}

}  // namespace

int tile_transposed_reads(mlir::func::FuncOp fn) {
  llvm::SmallVector<mlir::scf::ParallelOp> nests;
  fn.walk([&](mlir::scf::ParallelOp p) {
    if (straight_line(p)) nests.push_back(p);
  });
  int rewritten = 0;
  for (mlir::scf::ParallelOp p : nests) {
    llvm::SmallPtrSet<mlir::Value, 4> written;
    p.getBody()->walk([&](mlir::memref::StoreOp s) { written.insert(root_of(s.getMemRef())); });
    int across = -1;
    llvm::SmallVector<mlir::memref::LoadOp> loads;
    p.getBody()->walk([&](mlir::memref::LoadOp l) {
      const int a = across_loop(p, l);
      if (a < 0 || (across >= 0 && a != across) || loads.size() == kMaxBuffers ||
          written.contains(root_of(l.getMemRef())))
        return;
      across = a;
      loads.push_back(l);
    });
    if (loads.empty()) continue;
    tile_nest(p, static_cast<unsigned>(across), loads);
    ++rewritten;
  }
  return rewritten;
}

void hoist_tile_buffers(mlir::ModuleOp m) {
  llvm::SmallVector<mlir::memref::AllocaOp> buffers;
  m.walk([&](mlir::memref::AllocaOp a) {
    if (a->hasAttr(kTileBuffer)) buffers.push_back(a);
  });
  // The nests of one scope run one after the other, so they share its buffers: the n-th buffer
  // of a nest of each type is one alloca per scope. One per nest, a function of 700 small
  // (serial) transposed nests held 11 MiB of stack and overflowed it (a review).
  std::map<std::tuple<mlir::Operation*, const void*, unsigned>, mlir::memref::AllocaOp> shared;
  llvm::DenseMap<mlir::Block*, unsigned> in_nest;  // buffers seen so far in each nest's block
  for (mlir::memref::AllocaOp a : buffers) {
    mlir::Operation* scope = a->getParentOp();
    while (!llvm::isa<mlir::omp::ParallelOp, mlir::func::FuncOp>(scope))
      scope = scope->getParentOp();
    auto key = std::make_tuple(scope, a.getType().getAsOpaquePointer(), in_nest[a->getBlock()]++);
    if (auto it = shared.find(key); it != shared.end()) {
      a.getResult().replaceAllUsesWith(it->second.getResult());
      a->erase();
      continue;
    }
    mlir::Block& entry = scope->getRegion(0).front();
    a->moveBefore(&entry, entry.begin());
    a->removeAttr(kTileBuffer);
    shared.emplace(key, a);
  }
}

}  // namespace kiln::codegen
