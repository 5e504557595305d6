// The GPU half of the pipeline: bufferized loops -> gpu.launch_func kernels -> NVVM -> PTX
// (LLVM's NVPTX target, in process), host code in the LLVM dialect.
// Pipeline, registrations and gotchas: /work/shared/notes/mlir22-toolchain.md, section 3.
#include "codegen/gpu_lowering.h"
#include "codegen/kernel_profile.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <string.h>  // strverscmp
#include <functional>
#include <mutex>

#include <fmt/format.h>

#include "codegen/cpu_parallel.h"
#include "codegen/jit.h"
#include "codegen/lower.h"
#include "codegen/row_fusion.h"
#include "core/env.h"
#include "core/error.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/Support/TargetSelect.h"
#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/GPU/Pipelines/Passes.h"
#include "mlir/Dialect/GPU/Transforms/Passes.h"
#include "mlir/Dialect/LLVMIR/NVVMDialect.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/Linalg/IR/Linalg.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/Dialect/Math/Transforms/Passes.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/NVGPU/IR/NVGPUDialect.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/SCF/Transforms/Passes.h"
#include "mlir/Dialect/SCF/Utils/Utils.h"
#include "mlir/IR/PatternMatch.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"
#include "mlir/Interfaces/ViewLikeInterface.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Pass/PassRegistry.h"
#include "mlir/Target/LLVM/NVVM/Target.h"
#include "mlir/Target/LLVMIR/Dialect/GPU/GPUToLLVMIRTranslation.h"
#include "mlir/Target/LLVMIR/Dialect/NVVM/NVVMToLLVMIRTranslation.h"
#include "mlir/Transforms/GreedyPatternRewriteDriver.h"
#include "mlir/Transforms/Passes.h"

namespace kiln::codegen {
namespace {

void init_gpu_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    LLVMInitializeNVPTXTargetInfo();
    LLVMInitializeNVPTXTarget();
    LLVMInitializeNVPTXTargetMC();
    LLVMInitializeNVPTXAsmPrinter();
    mlir::registerGPUPasses();
    mlir::registerSCFPasses();
    mlir::gpu::registerGPUToNVVMPipeline();
  });
}

void run(mlir::ModuleOp m, const std::string& pipeline, const char* stage,
         const std::string& messages) {
  run_pass_pipeline(m, pipeline, std::string("GPU ") + stage, messages);
}

/// The runtime GEMM calls (kiln-extern-calls) go to cuBLAS: same arguments, device pointers.
void call_cuda_gemm(mlir::ModuleOp m) {
  for (const char* name : {"kiln_rt_gemm_f32", "kiln_rt_gemm_f64"}) {
    auto fn = m.lookupSymbol<mlir::func::FuncOp>(name);
    if (!fn) continue;
    std::string cuda_name = std::string("kiln_rt_cuda_") + (name + 8);  // kiln_rt_cuda_gemm_f32
    if (mlir::failed(mlir::SymbolTable::replaceAllSymbolUses(
            fn, mlir::StringAttr::get(m.getContext(), cuda_name), m)))
      throw Error("codegen (gpu)", "cannot rename the GEMM call " + std::string(name));
    fn.setName(cuda_name);
  }
}

/// memref.copy would be a host memcpy of device memory: a copy loop (a kernel) instead.
void copies_to_loops(mlir::ModuleOp m) {
  llvm::SmallVector<mlir::memref::CopyOp> copies;
  m.walk([&](mlir::memref::CopyOp c) { copies.push_back(c); });
  for (mlir::memref::CopyOp c : copies) {
    mlir::OpBuilder b(c);
    mlir::linalg::CopyOp::create(b, c.getLoc(), c.getSource(), c.getTarget());
    c.erase();
  }
}

/// A loop nest without a parallel dim (a full reduction into a 0-d value, a 0-d fill or
/// elementwise op) would run on the host and read device memory: it goes inside a parallel
/// loop of one iteration, so it becomes a kernel of one thread.
void wrap_serial_nests(mlir::func::FuncOp fn) {
  llvm::SmallVector<mlir::linalg::LinalgOp> serial;
  for (mlir::Operation& op : fn.getBody().front())
    if (auto l = llvm::dyn_cast<mlir::linalg::LinalgOp>(op);
        l && l.hasPureBufferSemantics() && l.getNumParallelLoops() == 0)
      serial.push_back(l);
  for (mlir::linalg::LinalgOp l : serial) {
    mlir::OpBuilder b(l);
    mlir::Location loc = l.getLoc();
    mlir::Value zero = mlir::arith::ConstantIndexOp::create(b, loc, 0);
    mlir::Value one = mlir::arith::ConstantIndexOp::create(b, loc, 1);
    auto par = mlir::scf::ParallelOp::create(b, loc, mlir::ValueRange{zero},
                                             mlir::ValueRange{one}, mlir::ValueRange{one});
    l->moveBefore(par.getBody()->getTerminator());
  }
}

/// index_add / scatter_add (lower_index.cpp) are a nest of scf.for loops tagged kScatterLoopAttr
/// (a loop of one iteration may have been folded away) whose innermost body adds into the
/// result: a load, an add and a store at the same indices. Run as they are, they would be one
/// thread's loop. The nest becomes one parallel loop and the load-add-store an atomic add
/// (memref.atomic_rmw: PTX atom.global.add), so repeated indices add in no fixed order, as in
/// PyTorch's CUDA index_add_ and scatter_add_. A nest of another form stays serial
/// (wrap_host_accesses makes it a one-thread kernel).
void scatter_loops_to_atomics(mlir::func::FuncOp fn) {
  llvm::SmallVector<mlir::scf::ForOp> tagged;  // the outermost loop of each nest
  fn.walk([&](mlir::scf::ForOp f) {
    auto parent = f->getParentOfType<mlir::scf::ForOp>();
    if (f->hasAttr(kScatterLoopAttr) && !(parent && parent->hasAttr(kScatterLoopAttr)))
      tagged.push_back(f);
  });
  for (mlir::scf::ForOp outer : tagged) {
    llvm::SmallVector<mlir::scf::ForOp> fors;
    if (!match_scatter_nest(outer, fors)) continue;
    // The innermost body's store of load + v into the same element.
    mlir::memref::StoreOp store;
    mlir::Operation* add = nullptr;
    mlir::memref::LoadOp load;
    mlir::Value addend;
    fors.back().getBody()->walk([&](mlir::memref::StoreOp st) {
      mlir::Operation* sum = st.getValueToStore().getDefiningOp();
      if (!sum || !llvm::isa<mlir::arith::AddFOp, mlir::arith::AddIOp>(sum) || !sum->hasOneUse())
        return;
      for (unsigned k = 0; k < 2; ++k) {
        auto ld = sum->getOperand(k).getDefiningOp<mlir::memref::LoadOp>();
        if (ld && ld->hasOneUse() && ld.getMemRef() == st.getMemRef() &&
            llvm::equal(ld.getIndices(), st.getIndices())) {
          store = st, add = sum, load = ld, addend = sum->getOperand(1 - k);
          return;
        }
      }
    });
    if (!store) continue;
    llvm::SmallVector<mlir::Value> lbs, ubs, steps;
    for (mlir::scf::ForOp f : fors) {
      lbs.push_back(f.getLowerBound());
      ubs.push_back(f.getUpperBound());
      steps.push_back(f.getStep());
    }
    mlir::OpBuilder b(outer);
    auto par = mlir::scf::ParallelOp::create(b, outer.getLoc(), lbs, ubs, steps);
    b.setInsertionPoint(par.getBody()->getTerminator());
    mlir::IRMapping map;
    for (auto [f, iv] : llvm::zip(fors, par.getInductionVars()))
      map.map(f.getInductionVar(), iv);
    for (mlir::Operation& op : fors.back().getBody()->without_terminator()) {
      if (&op == load.getOperation() || &op == add) continue;
      if (&op != store.getOperation()) {
        b.clone(op, map);
        continue;
      }
      llvm::SmallVector<mlir::Value> indices;
      for (mlir::Value i : store.getIndices()) indices.push_back(map.lookupOrDefault(i));
      mlir::memref::AtomicRMWOp::create(
          b, store.getLoc(),
          llvm::isa<mlir::arith::AddFOp>(add) ? mlir::arith::AtomicRMWKind::addf
                                              : mlir::arith::AtomicRMWKind::addi,
          map.lookupOrDefault(addend), map.lookupOrDefault(store.getMemRef()), indices);
    }
    outer.erase();
  }
}

/// A reduction over leading dims (a column sum, cpu_parallel.h's match_reduction_nest: row loops
/// around a parallel loop over columns) would launch one kernel per row, each synchronised: the
/// parallel loop goes outside, so one kernel runs a thread per column that adds its rows in order
/// (neighbouring threads read neighbouring columns).
void parallel_outside_reductions(mlir::func::FuncOp fn) {
  llvm::SmallVector<mlir::scf::ForOp> top;
  for (mlir::Operation& op : fn.getBody().front())
    if (auto f = llvm::dyn_cast<mlir::scf::ForOp>(op)) top.push_back(f);
  for (mlir::scf::ForOp outer : top) {
    llvm::SmallVector<mlir::scf::ForOp> fors;
    mlir::scf::ParallelOp par;
    if (!match_reduction_nest(outer, fors, par)) continue;
    mlir::OpBuilder b(outer);
    mlir::Location loc = outer.getLoc();
    mlir::scf::ParallelOp::create(
        b, loc, par.getLowerBound(), par.getUpperBound(), par.getStep(),
        [&](mlir::OpBuilder& nb, mlir::Location, mlir::ValueRange ivs) {
          mlir::IRMapping map;
          for (auto [old_iv, new_iv] : llvm::zip(par.getInductionVars(), ivs))
            map.map(old_iv, new_iv);
          for (mlir::scf::ForOp f : fors) {
            auto nf = mlir::scf::ForOp::create(nb, loc, f.getLowerBound(), f.getUpperBound(),
                                               f.getStep());
            map.map(f.getInductionVar(), nf.getInductionVar());
            nb.setInsertionPoint(nf.getBody()->getTerminator());
          }
          for (mlir::Operation& op : par.getBody()->without_terminator()) nb.clone(op, map);
        });
    outer.erase();
  }
}

/// Threads a split reduction aims at (about 64 per SM of an H100/H200: enough to cover memory
/// latency), and the fewest output elements times reduced elements ratio that is split.
constexpr int64_t kSplitThreads = 1 << 17;

/// The sum inside a perfect nest of scf.for loops (from 0, step 1) in the body of `par`:
/// `acc[idx] = acc[idx] + v` with idx not depending on the loops. Fills the loops (outermost
/// first) and the load, add and store.
struct NestedSum {
  llvm::SmallVector<mlir::scf::ForOp> fors;
  mlir::memref::LoadOp load;
  mlir::arith::AddFOp add;
  mlir::memref::StoreOp store;
};
std::optional<NestedSum> match_nested_sum(mlir::scf::ParallelOp par) {
  NestedSum s;
  for (mlir::Operation& op : par.getBody()->without_terminator())
    if (auto f = llvm::dyn_cast<mlir::scf::ForOp>(op)) {
      if (!s.fors.empty()) return std::nullopt;  // one nest
      s.fors.push_back(f);
    } else if (op.getNumRegions() != 0) {
      return std::nullopt;
    }
  if (s.fors.empty()) return std::nullopt;
  while (true) {
    mlir::Block* body = s.fors.back().getBody();
    if (body->getOperations().size() != 2) break;
    auto inner = llvm::dyn_cast<mlir::scf::ForOp>(body->front());
    if (!inner) break;
    s.fors.push_back(inner);
  }
  // Bounds from outside `par` (split_sums multiplies them before it).
  auto inside = [&](mlir::Value v) { return par->isAncestor(v.getParentBlock()->getParentOp()); };
  for (mlir::scf::ForOp f : s.fors)
    if (!mlir::isConstantIntValue(f.getLowerBound(), 0) ||
        !mlir::isConstantIntValue(f.getStep(), 1) || f.getNumRegionIterArgs() != 0 ||
        inside(f.getUpperBound()))
      return std::nullopt;
  mlir::Block* body = s.fors.back().getBody();
  for (mlir::Operation& op : body->without_terminator()) {
    if (op.getNumRegions() != 0) return std::nullopt;
    if (auto st = llvm::dyn_cast<mlir::memref::StoreOp>(op)) {
      if (s.store) return std::nullopt;
      s.store = st;
    }
  }
  if (!s.store) return std::nullopt;
  s.add = s.store.getValueToStore().getDefiningOp<mlir::arith::AddFOp>();
  if (!s.add || s.add->getBlock() != body) return std::nullopt;
  for (mlir::Value operand : {s.add.getLhs(), s.add.getRhs()})
    if (auto l = operand.getDefiningOp<mlir::memref::LoadOp>();
        l && l.getMemRef() == s.store.getMemRef() && l.getIndices() == s.store.getIndices())
      s.load = l;
  if (!s.load || !s.load->hasOneUse()) return std::nullopt;
  // The accumulator's element: the same in every iteration of the loops.
  for (mlir::Value i : s.store.getIndices())
    for (mlir::scf::ForOp f : s.fors)
      if (f->isAncestor(i.getParentBlock()->getParentOp())) return std::nullopt;
  // No other access of the accumulator in the loops.
  bool other = false;
  body->walk([&](mlir::Operation* op) {
    if (op != s.load && op != s.store)
      for (mlir::Value v : op->getOperands()) other |= v == s.store.getMemRef();
  });
  if (other) return std::nullopt;
  // The partials run before `par`: the summed values may only read values from outside `par`
  // or the nest's own, and nothing before the nest in `par` may write memory other than the
  // accumulator (a 0-d value the nest reads, computed and stored just before it, would be read
  // before it is written).
  auto own = [&](mlir::Value v) {  // par's indices, or defined in the nest
    return llvm::is_contained(par.getInductionVars(), v) ||
           s.fors.front()->isAncestor(v.getParentBlock()->getParentOp());
  };
  for (mlir::Operation& op : body->without_terminator())
    for (mlir::Value v : op.getOperands())
      if (inside(v) && !own(v)) return std::nullopt;
  for (mlir::Operation& op : par.getBody()->without_terminator()) {
    if (&op == s.fors.front().getOperation()) break;
    auto st = llvm::dyn_cast<mlir::memref::StoreOp>(op);
    if (st ? st.getMemRef() != s.store.getMemRef() : !mlir::isMemoryEffectFree(&op) &&
                                                        !llvm::isa<mlir::memref::LoadOp>(op))
      return std::nullopt;
  }
  // Partial sums reorder the additions: only where the sum allows it (kiln's do).
  if (!mlir::arith::bitEnumContainsAll(s.add.getFastmath(), mlir::arith::FastMathFlags::reassoc))
    return std::nullopt;
  return s;
}

/// A sum with few output elements and many summed ones (the loss's full sum: one thread over
/// 12.6M elements of the original Transformer's output; a bias gradient: a thread per column
/// over 16,384 rows) is split: a first loop over (chunk c, outputs) sums elements c, c + C,
/// c + 2C, ... of the reduced range into float partials (neighbouring threads read
/// neighbouring elements), and the original nest then adds the C partials of each output in
/// order. C is chosen for about kSplitThreads threads. Only nests whose output count is static.
/// Returns whether it split one; a split's second loop may qualify again (a full sum's 49,152
/// partials are summed by 192 threads, then one), so split_sums repeats until none does.
bool split_one_sum(mlir::func::FuncOp fn) {
  for (mlir::scf::ParallelOp par : fn.getBody().front().getOps<mlir::scf::ParallelOp>()) {
    int64_t outputs = 1;
    bool static_outputs = true;
    for (auto [lb, ub, step] :
         llvm::zip(par.getLowerBound(), par.getUpperBound(), par.getStep())) {
      auto u = mlir::getConstantIntValue(ub);
      static_outputs &= u && mlir::isConstantIntValue(lb, 0) && mlir::isConstantIntValue(step, 1);
      if (u) outputs *= *u;
    }
    if (!static_outputs || outputs == 0 || outputs >= kSplitThreads / 8) continue;
    std::optional<NestedSum> sum = match_nested_sum(par);
    if (!sum) continue;
    std::optional<int64_t> static_k = 1;
    for (mlir::scf::ForOp f : sum->fors) {
      auto n = mlir::getConstantIntValue(f.getUpperBound());
      if (n && static_k) *static_k *= *n;
      else static_k.reset();
    }
    // Each chunk sums at least 256 elements.
    int64_t chunks = std::max<int64_t>(1, kSplitThreads / outputs);
    if (static_k) chunks = std::min(chunks, *static_k / 256);
    if (chunks < 2) continue;
    mlir::OpBuilder b(par);
    mlir::Location loc = par.getLoc();
    auto idx = [&](int64_t v) -> mlir::Value {
      return mlir::arith::ConstantIndexOp::create(b, loc, v);
    };
    mlir::Type elem = sum->add.getType();
    llvm::SmallVector<int64_t> part_shape = {chunks};
    for (mlir::Value ub : par.getUpperBound()) part_shape.push_back(*mlir::getConstantIntValue(ub));
    auto part_type = mlir::MemRefType::get(part_shape, elem);
    mlir::Value part = mlir::memref::AllocOp::create(b, loc, part_type);
    // The reduced range's size, as a value (loop bounds defined outside `par`).
    mlir::Value total = idx(1);
    for (mlir::scf::ForOp f : sum->fors)
      total = mlir::arith::MulIOp::create(b, loc, total, f.getUpperBound());
    // 1. Partials.
    llvm::SmallVector<mlir::Value> lbs = {idx(0)}, ubs = {idx(chunks)}, steps = {idx(1)};
    for (mlir::Value ub : par.getUpperBound()) {
      lbs.push_back(idx(0));
      ubs.push_back(ub);
      steps.push_back(idx(1));
    }
    mlir::Value chunk_count = idx(chunks);
    mlir::scf::ParallelOp::create(
        b, loc, lbs, ubs, steps, [&](mlir::OpBuilder& pb, mlir::Location l, mlir::ValueRange ivs) {
          mlir::Value zero = mlir::arith::ConstantOp::create(pb, l, pb.getFloatAttr(elem, 0.0));
          auto loop = mlir::scf::ForOp::create(
              pb, l, ivs[0], total, chunk_count, mlir::ValueRange{zero},
              [&](mlir::OpBuilder& fb, mlir::Location fl, mlir::Value k, mlir::ValueRange acc) {
                mlir::IRMapping map;
                for (unsigned d = 0; d < par.getNumLoops(); ++d)
                  map.map(par.getInductionVars()[d], ivs[d + 1]);
                // k in row-major order over the loops' bounds.
                mlir::Value rest = k;
                for (size_t j = sum->fors.size(); j-- > 0;) {
                  mlir::scf::ForOp f = sum->fors[j];
                  mlir::Value n = f.getUpperBound();
                  mlir::Value i =
                      j == 0 ? rest : mlir::arith::RemUIOp::create(fb, fl, rest, n).getResult();
                  map.map(f.getInductionVar(), i);
                  if (j > 0) rest = mlir::arith::DivUIOp::create(fb, fl, rest, n);
                }
                for (mlir::Operation& op : sum->fors.back().getBody()->without_terminator()) {
                  if (&op == sum->load.getOperation() || &op == sum->add.getOperation() ||
                      &op == sum->store.getOperation())
                    continue;
                  fb.clone(op, map);
                }
                mlir::Value v = sum->add.getLhs() == sum->load.getResult() ? sum->add.getRhs()
                                                                           : sum->add.getLhs();
                mlir::Value added = mlir::arith::AddFOp::create(
                    fb, fl, acc[0], map.lookupOrDefault(v), sum->add.getFastmathAttr());
                mlir::scf::YieldOp::create(fb, fl, added);
              });
          llvm::SmallVector<mlir::Value> at(ivs.begin(), ivs.end());
          mlir::memref::StoreOp::create(pb, l, loop.getResult(0), part, at);
        });
    // 2. The original nest adds the partials instead.
    mlir::OpBuilder rb(sum->fors.front());
    auto combine = mlir::scf::ForOp::create(rb, loc, idx(0), chunk_count, idx(1));
    rb.setInsertionPoint(combine.getBody()->getTerminator());
    mlir::Value acc = mlir::memref::LoadOp::create(rb, loc, sum->store.getMemRef(),
                                                   sum->store.getIndices());
    llvm::SmallVector<mlir::Value> at = {combine.getInductionVar()};
    for (mlir::Value iv : par.getInductionVars()) at.push_back(iv);
    mlir::Value p = mlir::memref::LoadOp::create(rb, loc, part, at);
    mlir::Value added = mlir::arith::AddFOp::create(rb, loc, acc, p, sum->add.getFastmathAttr());
    mlir::memref::StoreOp::create(rb, loc, added, sum->store.getMemRef(), sum->store.getIndices());
    sum->fors.front().erase();
    mlir::OpBuilder after(par);
    after.setInsertionPointAfter(par);
    mlir::memref::DeallocOp::create(after, loc, part);
    return true;
  }
  return false;
}

void split_sums(mlir::func::FuncOp fn) {
  while (split_one_sum(fn)) {
  }
}

/// Elements up to which a constant that is not one repeated value (nll_loss's class indices) is
/// read in kernels through a chain of selects; larger ones raise.
constexpr int64_t kMaxSelectConstant = 64;

/// A constant the bufferization put in a host global (memref.global: the 1.0 of x + 1.0) would
/// be read by kernels through a host pointer (CUDA_ERROR_ILLEGAL_ADDRESS on the H200). Each load
/// becomes the value itself: the splat value, or for a small constant a chain of selects on the
/// loaded element's linear index. A global used otherwise, or a larger one, raises; compile()
/// then runs the region's ops eagerly.
void inline_constant_globals(mlir::ModuleOp m, mlir::func::FuncOp fn) {
  llvm::SmallVector<mlir::memref::GetGlobalOp> gets;
  fn.walk([&](mlir::memref::GetGlobalOp g) { gets.push_back(g); });
  for (mlir::memref::GetGlobalOp get : gets) {
    auto global = m.lookupSymbol<mlir::memref::GlobalOp>(get.getNameAttr());
    std::optional<mlir::Attribute> init = global ? global.getInitialValue() : std::nullopt;
    auto dense = init ? llvm::dyn_cast<mlir::DenseElementsAttr>(*init) : nullptr;
    bool only_loads = llvm::all_of(get->getUsers(), [](mlir::Operation* user) {
      return llvm::isa<mlir::memref::LoadOp>(user);
    });
    if (!global || !global.getConstant() || !dense || !only_loads ||
        (!dense.isSplat() && dense.getNumElements() > kMaxSelectConstant))
      throw Error("codegen (gpu)", "the constant " + get.getName().str() +
                                       " would stay in host memory (only loads of at most " +
                                       std::to_string(kMaxSelectConstant) +
                                       " elements are made values)");
    llvm::SmallVector<mlir::TypedAttr> values;
    if (dense.isSplat()) values.push_back(dense.getSplatValue<mlir::TypedAttr>());
    else
      for (mlir::Attribute a : dense.getValues<mlir::Attribute>())
        values.push_back(llvm::cast<mlir::TypedAttr>(a));
    llvm::ArrayRef<int64_t> shape = get.getType().getShape();
    for (mlir::Operation* user : llvm::to_vector(get->getUsers())) {
      auto load = llvm::cast<mlir::memref::LoadOp>(user);
      mlir::OpBuilder b(load);
      mlir::Location loc = load.getLoc();
      mlir::Value v = mlir::arith::ConstantOp::create(b, loc, values.back());
      if (values.size() > 1) {
        // Row-major linear index of the loaded element (the global has a static shape).
        mlir::Value linear = mlir::arith::ConstantIndexOp::create(b, loc, 0);
        for (auto [d, index] : llvm::enumerate(load.getIndices())) {
          mlir::Value size = mlir::arith::ConstantIndexOp::create(b, loc, shape[d]);
          linear = mlir::arith::AddIOp::create(
              b, loc, mlir::arith::MulIOp::create(b, loc, linear, size), index);
        }
        for (int64_t k = static_cast<int64_t>(values.size()) - 2; k >= 0; --k) {
          mlir::Value is_k = mlir::arith::CmpIOp::create(
              b, loc, mlir::arith::CmpIPredicate::eq, linear,
              mlir::arith::ConstantIndexOp::create(b, loc, k));
          v = mlir::arith::SelectOp::create(
              b, loc, is_k, mlir::arith::ConstantOp::create(b, loc, values[k]), v);
        }
      }
      load.getResult().replaceAllUsesWith(v);
      load.erase();
    }
    get.erase();
  }
}

/// Loads and stores left at the top level (a 0-d value computed from 0-d values, e.g. a full
/// sum's rounding to float32) go inside a one-iteration parallel loop too. A run of such ops
/// whose values are used after it stays (the check after kernel outlining reports it).
void wrap_host_accesses(mlir::func::FuncOp fn) {
  mlir::Block& block = fn.getBody().front();
  auto touches_memory = [](mlir::Operation* op) {
    bool found = false;
    op->walk([&](mlir::Operation* x) {
      found |= llvm::isa<mlir::memref::LoadOp, mlir::memref::StoreOp>(x);
    });
    return found;
  };
  auto wrappable = [](mlir::Operation* op) {
    return !llvm::isa<mlir::scf::ParallelOp, mlir::memref::AllocOp, mlir::memref::DeallocOp,
                      mlir::func::CallOp, mlir::func::ReturnOp>(op) &&
           (op->getNumRegions() == 0 || llvm::isa<mlir::scf::ForOp>(op));
  };
  llvm::SmallVector<mlir::Operation*> run, sizes;
  auto flush = [&] {
    // Sizes read among the run stay outside the loop, ahead of it: split_sums needs a
    // dynamic sum's bounds from outside (a memref.dim reads only the descriptor).
    // (`sizes`: every memory-free op whose operands come from before the run, see below.)
    if (!run.empty())
      for (mlir::Operation* d : sizes) d->moveBefore(run.front());
    sizes.clear();
    bool memory = llvm::any_of(run, touches_memory);
    bool escapes = false;
    for (mlir::Operation* op : run)
      for (mlir::Value r : op->getResults())
        for (mlir::Operation* user : r.getUsers())
          escapes |= !llvm::is_contained(run, block.findAncestorOpInBlock(*user));
    if (memory && !escapes) {
      mlir::OpBuilder b(run.front());
      mlir::Location loc = run.front()->getLoc();
      mlir::Value zero = mlir::arith::ConstantIndexOp::create(b, loc, 0);
      mlir::Value one = mlir::arith::ConstantIndexOp::create(b, loc, 1);
      auto par = mlir::scf::ParallelOp::create(b, loc, mlir::ValueRange{zero},
                                               mlir::ValueRange{one}, mlir::ValueRange{one});
      for (mlir::Operation* op : run) op->moveBefore(par.getBody()->getTerminator());
    }
    run.clear();
  };
  for (mlir::Operation& op : llvm::make_early_inc_range(block)) {
    // Sizes, constants (other nests use them too) and other values computed without memory
    // from values before the run are hoisted ahead of it: a GEMM call's pointers
    // (extract_aligned_pointer_as_index) taken into the run kept it on the host, and a constant
    // after the run's first op did not dominate its use in the loop (kiln-fuzz --ptx).
    if (op.getNumRegions() == 0 && !op.hasTrait<mlir::OpTrait::IsTerminator>() &&
        mlir::isMemoryEffectFree(&op)) {
      bool operands_before = true;  // arguments or earlier ops
      for (mlir::Value v : op.getOperands())
        if (mlir::Operation* def = v.getDefiningOp(); def && llvm::is_contained(run, def))
          operands_before = false;
      if (operands_before) {
        sizes.push_back(&op);
        continue;
      }
    }
    if (wrappable(&op)) run.push_back(&op);
    else flush();
  }
  flush();
}

/// gpu_parallel_loops' `same_rows`: every `memref.dim %arg_i, 0` of such an input becomes one
/// value, the first such input's, made at the function's start.
void unify_row_counts(mlir::func::FuncOp fn, const std::vector<bool>& same_rows) {
  mlir::Value rows;
  mlir::OpBuilder b = mlir::OpBuilder::atBlockBegin(&fn.getBody().front());
  for (auto [i, arg] : llvm::enumerate(fn.getArguments())) {
    auto t = llvm::dyn_cast<mlir::MemRefType>(arg.getType());
    if (i >= same_rows.size() || !same_rows[i] || !t || t.getRank() == 0 || !t.isDynamicDim(0))
      continue;
    for (mlir::Operation* user : llvm::to_vector(arg.getUsers())) {
      auto dim = llvm::dyn_cast<mlir::memref::DimOp>(user);
      if (!dim || !mlir::isConstantIntValue(dim.getIndex(), 0)) continue;
      if (!rows) {
        mlir::Value zero = mlir::arith::ConstantIndexOp::create(b, fn.getLoc(), 0);
        rows = mlir::memref::DimOp::create(b, fn.getLoc(), arg, zero);
      }
      dim.getResult().replaceAllUsesWith(rows);
      dim.erase();
    }
  }
}

/// An elementwise nest over (d0, ..., dk) becomes one loop over all its elements, so that
/// neighbouring threads touch neighbouring elements (coalesced), and small inner dims do not
/// waste threads.
void linearize(mlir::func::FuncOp fn) {
  mlir::IRRewriter rewriter(fn.getContext());
  for (mlir::scf::ParallelOp p : top_level_loops(fn)) {
    if (p.getNumLoops() < 2) continue;
    std::vector<unsigned> all(p.getNumLoops());
    for (unsigned i = 0; i < all.size(); ++i) all[i] = i;
    mlir::collapseParallelLoops(rewriter, p, {all});
  }
}

/// A one-dim elementwise loop over [0, n) (a body of loads, pure ops and stores, as linearize
/// leaves it) becomes a loop over ceil(n / (threads * per_thread)) blocks of `threads`
/// iterations, iteration t of block b computing elements b * threads * per_thread + t + j *
/// threads for j < per_thread: each load of a warp stays coalesced, and every element's loads
/// are cloned before any store, so a thread has per_thread loads in flight (kernel arguments are
/// not noalias: the device compiler cannot move a load above an earlier store). A thread whose
/// elements are all in bounds uses them as they are; in the last block loads read a clamped
/// index and stores are guarded.
void unroll_elementwise(mlir::func::FuncOp fn, int threads, int per_thread) {
  if (per_thread <= 1) return;
  for (mlir::scf::ParallelOp p : top_level_loops(fn)) {
    if (p.getNumLoops() != 1 || !mlir::isConstantIntValue(p.getLowerBound()[0], 0) ||
        !mlir::isConstantIntValue(p.getStep()[0], 1))
      continue;
    if (auto n = mlir::getConstantIntValue(p.getUpperBound()[0]); n && *n <= threads) continue;
    mlir::Block* body = p.getBody();
    bool elementwise = true, stores = false;
    for (mlir::Operation& op : body->without_terminator()) {
      // A load after a store (a body reading back what it wrote, as fuse_rows' merged bodies
      // do) must stay after it: not hoisted above the stores.
      elementwise &= !(stores && llvm::isa<mlir::memref::LoadOp>(op));
      stores |= llvm::isa<mlir::memref::StoreOp>(op);
      elementwise &= op.getNumRegions() == 0 &&
                     (llvm::isa<mlir::memref::LoadOp, mlir::memref::StoreOp>(op) ||
                      mlir::isMemoryEffectFree(&op));
    }
    if (!elementwise || !stores) continue;
    mlir::OpBuilder b(p);
    mlir::Location loc = p.getLoc();
    auto index = [&](int64_t v) { return mlir::arith::ConstantIndexOp::create(b, loc, v); };
    mlir::Value n = p.getUpperBound()[0];
    mlir::Value block_threads = index(threads), chunk = index(int64_t{threads} * per_thread);
    mlir::Value blocks = mlir::arith::CeilDivUIOp::create(b, loc, n, chunk);
    mlir::Value total = mlir::arith::MulIOp::create(b, loc, blocks, block_threads);
    mlir::Value last = mlir::arith::SubIOp::create(b, loc, n, index(1));
    auto q = mlir::scf::ParallelOp::create(b, loc, mlir::ValueRange{index(0)},
                                           mlir::ValueRange{total}, mlir::ValueRange{index(1)});
    b.setInsertionPoint(q.getBody()->getTerminator());
    mlir::Value g = q.getInductionVars()[0];
    mlir::Value first = mlir::arith::AddIOp::create(
        b, loc,
        mlir::arith::MulIOp::create(b, loc,
                                    mlir::arith::DivUIOp::create(b, loc, g, block_threads), chunk),
        mlir::arith::RemUIOp::create(b, loc, g, block_threads));
    // Every block but the last has all its elements in bounds: one test of the thread's last
    // element picks plain indices (addresses a constant apart, no per-element test: about a
    // third fewer instructions per element) over the clamped, guarded copy.
    std::vector<mlir::Value> offsets(per_thread);  // j * threads
    for (int j = 0; j < per_thread; ++j) offsets[j] = index(int64_t{j} * threads);
    mlir::Value thread_last = mlir::arith::AddIOp::create(b, loc, first, offsets.back());
    auto whole = mlir::scf::IfOp::create(
        b, loc, mlir::arith::CmpIOp::create(b, loc, mlir::arith::CmpIPredicate::ult, thread_last, n),
        /*withElseRegion=*/true);
    auto clone_elements = [&](mlir::OpBuilder at, bool guarded) {
      std::vector<mlir::IRMapping> maps(per_thread);
      std::vector<mlir::Value> in_bounds(per_thread);
      for (int j = 0; j < per_thread; ++j) {
        mlir::Value i = mlir::arith::AddIOp::create(at, loc, first, offsets[j]);
        mlir::Value read_at = i;
        if (guarded) {
          in_bounds[j] =
              mlir::arith::CmpIOp::create(at, loc, mlir::arith::CmpIPredicate::ult, i, n);
          read_at = mlir::arith::MinUIOp::create(at, loc, i, last);
        }
        maps[j].map(p.getInductionVars()[0], read_at);
        for (mlir::Operation& op : body->without_terminator())
          if (!llvm::isa<mlir::memref::StoreOp>(op)) at.clone(op, maps[j]);
      }
      for (int j = 0; j < per_thread; ++j) {
        mlir::OpBuilder store_at = at;
        if (guarded)
          store_at = mlir::scf::IfOp::create(at, loc, in_bounds[j], /*withElseRegion=*/false)
                         .getThenBodyBuilder();
        for (mlir::Operation& op : body->without_terminator())
          if (llvm::isa<mlir::memref::StoreOp>(op)) store_at.clone(op, maps[j]);
      }
    };
    clone_elements(whole.getThenBodyBuilder(), /*guarded=*/false);
    clone_elements(whole.getElseBodyBuilder(), /*guarded=*/true);
    p.erase();
  }
}

/// The graph's approximable float32 divisions (afn: formulas::divide_by_at_least_one, the
/// 1 + e^-x of sigmoid, silu and gelu) in kernels become PTX div.full.f32: within 2 ulp over
/// the whole range in a few instructions, where IEEE division (div.rn) takes ~10 and a slow
/// path. Not div.approx, which LLVM gives an afn division: it returns 0 for divisors above
/// 2^126, and 1 + e^-x gets there (silu of x in [-88.72, -87.34] would be 0, not ~1e-36).
void divide_full_range(mlir::ModuleOp m) {
  llvm::SmallVector<mlir::arith::DivFOp> divisions;
  m.walk([&](mlir::arith::DivFOp d) {
    if (d.getType().isF32() && d->getParentOfType<mlir::gpu::GPUFuncOp>() &&
        mlir::arith::bitEnumContainsAll(d.getFastmath(), mlir::arith::FastMathFlags::afn))
      divisions.push_back(d);
  });
  for (mlir::arith::DivFOp d : divisions) {
    mlir::OpBuilder b(d);
    auto full = mlir::LLVM::CallIntrinsicOp::create(
        b, d.getLoc(), d.getType(), b.getStringAttr("llvm.nvvm.div.full"),
        mlir::ValueRange{d.getLhs(), d.getRhs()});
    d.replaceAllUsesWith(full.getResult(0));
    d.erase();
  }
}

/// tanh, erf, log, ...: MLIR's polynomials (arith + fma), so no libdevice is needed. The
/// divisions inside tanh's (by a polynomial >= 4.9e-3 of the clamped x) and erfc's (by |x| + 2
/// and 2|x| + 1, >= 1; above |x| = 10.05 the result is selected apart) are marked approximable:
/// div.approx / rcp.approx (2 ulp, 2 instructions) instead of IEEE division (~10 and a slow
/// path). Divisions of other approximations (log1p's by u - 1, up to 3e38, beyond
/// div.approx's 2^126) and of the graph stay exact.
void approximate_math(mlir::ModuleOp m, const std::string& messages) {
  auto apply = [&](auto populate) {
    mlir::RewritePatternSet patterns(m.getContext());
    populate(patterns);
    if (mlir::failed(mlir::applyPatternsGreedily(m, std::move(patterns))))
      throw Error("codegen (gpu): math approximation", messages);
  };
  llvm::DenseSet<mlir::Operation*> exact;  // the divisions before tanh's and erfc's
  m.walk([&](mlir::arith::DivFOp d) { exact.insert(d); });
  apply([](mlir::RewritePatternSet& p) {
    mlir::populatePolynomialApproximateTanhPattern(p);
    mlir::populatePolynomialApproximateErfcPattern(p);
  });
  m.walk([&](mlir::arith::DivFOp d) {
    if (!exact.contains(d)) d.setFastmath(mlir::arith::FastMathFlags::afn);
  });
  apply([](mlir::RewritePatternSet& p) { mlir::populateMathPolynomialApproximationPatterns(p); });
}

/// The CPU lowering made float64 erf / erfc calls to libm's (convert-kiln-to-linalg): in
/// kernels they are math ops again, which the NVVM lowering maps to libdevice's __nv_erf /
/// __nv_erfc (a call to the host's libm left an unresolved extern in the PTX).
void libm_erf_to_math(mlir::ModuleOp m) {
  llvm::SmallVector<mlir::func::CallOp> calls;
  m.walk([&](mlir::func::CallOp c) {
    if ((c.getCallee() == "erf" || c.getCallee() == "erfc") && c.getNumOperands() == 1 &&
        c.getNumResults() == 1 && c.getResult(0).getType().isF64())
      calls.push_back(c);
  });
  for (mlir::func::CallOp c : calls) {
    mlir::OpBuilder b(c);
    mlir::Value r = c.getCallee() == "erf"
                        ? mlir::math::ErfOp::create(b, c.getLoc(), c.getOperand(0)).getResult()
                        : mlir::math::ErfcOp::create(b, c.getLoc(), c.getOperand(0)).getResult();
    c.getResult(0).replaceAllUsesWith(r);
    c.erase();
  }
  for (const char* name : {"erf", "erfc"})
    if (auto fn = m.lookupSymbol<mlir::func::FuncOp>(name); fn && fn.symbolKnownUseEmpty(m))
      fn.erase();
}

/// MLIR's gpu-lower-to-nvvm-pipeline, with the toolkit whose libdevice is linked for float64
/// math (GpuTarget::toolkit; the pipeline has no option for it, gpu-module-to-binary has).
void lower_to_ptx(mlir::ModuleOp m, const GpuTarget& target, const std::string& messages) {
  // The default cubin-features (+ptx60) aborts the process for sm_90: always set it.
  const std::string pipeline = "gpu-lower-to-nvvm-pipeline{cubin-chip=" + target.chip +
                               " cubin-features=" + target.features +
                               " cubin-format=isa opt-level=" +
                               std::to_string(target.opt_level) + "}";
  const std::string where = "codegen::Executable: GPU NVVM and PTX";
  mlir::PassManager pm = mlir::PassManager::on<mlir::ModuleOp>(m.getContext());
  std::string err;
  llvm::raw_string_ostream es(err);
  if (mlir::failed(mlir::parsePassPipeline(pipeline, pm, es)))
    throw Error(where, "bad pipeline: " + err);
  if (!target.toolkit.empty())
    for (mlir::Pass& pass : pm.getPasses())
      if (pass.getArgument() == "gpu-module-to-binary" &&
          mlir::failed(pass.initializeOptions("toolkit=\"" + target.toolkit + "\"",
                                              [&](const llvm::Twine& e) {
            err = e.str();
            return mlir::failure();
          })))
        throw Error(where, "cannot set the CUDA toolkit: " + err);
  if (mlir::failed(pm.run(m))) throw Error(where, messages);
}

/// Functions the PTX calls but does not define (libdevice's __nv_exp, ... for float64 math when
/// no CUDA toolkit was found): the module would fail to load on the device, so the build fails
/// here, naming them.
void check_no_externs(const std::string& ptx, const GpuTarget& target) {
  // `.extern .func (.param .b64 func_retval0) __nv_exp(...)`, or without the return group.
  std::vector<std::string> names;
  bool all_libdevice = true;
  const std::string decl = ".extern .func";
  for (size_t at = ptx.find(decl); at != std::string::npos; at = ptx.find(decl, at + 1)) {
    size_t p = ptx.find_first_not_of(" \t", at + decl.size());
    if (p != std::string::npos && ptx[p] == '(')
      p = ptx.find_first_not_of(" \t", ptx.find(')', p) + 1);
    if (p == std::string::npos) continue;
    size_t end = ptx.find_first_of(" \t\n(;", p);
    names.push_back(ptx.substr(p, end == std::string::npos ? std::string::npos : end - p));
    all_libdevice = all_libdevice && names.back().starts_with("__nv_");
  }
  if (names.empty()) return;
  if (!all_libdevice)
    throw Error("codegen (gpu)", fmt::format("the kernels call {}, which the PTX does not define",
                                             fmt::join(names, ", ")));
  throw Error("codegen (gpu)",
              fmt::format("the kernels call {} (CUDA's libdevice, for float64 math), which {}; "
                          "set CUDA_HOME to a CUDA toolkit with nvvm/libdevice/libdevice.10.bc",
                          fmt::join(names, ", "),
                          target.toolkit.empty() ? "no CUDA toolkit was found to provide"
                                                 : "the toolkit " + target.toolkit +
                                                       " did not provide"));
}

/// Intermediates live in device memory: the host code's malloc/free (memref.alloc lowered)
/// become the CUDA runtime's (codegen/runtime.cpp). gpu.alloc would need async tokens.
void allocate_on_device(mlir::ModuleOp m) {
  for (auto [from, to] : {std::pair{"malloc", "kiln_rt_cuda_malloc"},
                          std::pair{"aligned_alloc", "kiln_rt_cuda_aligned_alloc"},
                          std::pair{"free", "kiln_rt_cuda_free"}}) {
    mlir::Operation* fn = mlir::SymbolTable::lookupSymbolIn(m, from);
    if (!fn) continue;
    if (mlir::failed(mlir::SymbolTable::replaceAllSymbolUses(
            fn, mlir::StringAttr::get(m.getContext(), to), m)))
      throw Error("codegen (gpu)", std::string("cannot redirect ") + from);
    mlir::SymbolTable::setSymbolName(fn, to);
  }
}

/// gpu-kernel-outlining puts each kernel in a gpu.module of its own, i.e. a PTX module each:
/// one module holds them all, so the graph is one PTX text loaded once.
void merge_gpu_modules(mlir::ModuleOp m) {
  llvm::SmallVector<mlir::gpu::GPUModuleOp> modules(m.getOps<mlir::gpu::GPUModuleOp>());
  if (modules.size() < 2) return;
  // Kernels are named after their (unique) module: the outlined functions of different modules
  // may share a name.
  mlir::gpu::GPUModuleOp first = modules.front();
  mlir::Block& body = first.getBodyRegion().front();
  m.walk([&](mlir::gpu::LaunchFuncOp launch) {
    mlir::StringAttr module_name = launch.getKernelModuleName();
    launch.setKernelAttr(mlir::SymbolRefAttr::get(
        first.getNameAttr(), {mlir::FlatSymbolRefAttr::get(module_name)}));
  });
  for (mlir::gpu::GPUModuleOp mod : modules) {
    for (mlir::Operation& op : llvm::make_early_inc_range(mod.getBodyRegion().front())) {
      auto f = llvm::dyn_cast<mlir::gpu::GPUFuncOp>(op);
      if (!f) continue;
      f.setName(mod.getName());
      if (mod != first) op.moveBefore(&body, body.end());
    }
  }
  for (mlir::gpu::GPUModuleOp other : llvm::drop_begin(modules)) other.erase();
}

/// NVVM has no frem (it needs libdevice's fmod): a % b = fma(-trunc(a / b), b, a) in kernels.
/// Exact while the quotient's integer part is exact (|a / b| < 2^24 for float32, 2^53 for
/// float64); beyond that it is off by multiples of b (codegen/README.md, "GPU").
void expand_remf(mlir::ModuleOp m) {
  llvm::SmallVector<mlir::arith::RemFOp> rems;
  m.walk([&](mlir::gpu::GPUModuleOp g) { g.walk([&](mlir::arith::RemFOp r) { rems.push_back(r); }); });
  for (mlir::arith::RemFOp r : rems) {
    mlir::OpBuilder b(r);
    mlir::Location loc = r.getLoc();
    mlir::Value q = mlir::arith::DivFOp::create(b, loc, r.getLhs(), r.getRhs());
    mlir::Value t = mlir::math::TruncOp::create(b, loc, q);
    mlir::Value neg = mlir::arith::NegFOp::create(b, loc, t);
    mlir::Value res = mlir::math::FmaOp::create(b, loc, neg, r.getRhs(), r.getLhs());
    r.getResult().replaceAllUsesWith(res);
    r.erase();
  }
}

/// The CUDA toolkit folder with nvvm/libdevice/libdevice.10.bc (GpuTarget::toolkit), or "".
std::string find_cuda_toolkit() {
  namespace fs = std::filesystem;
  auto has_libdevice = [](const fs::path& root) {
    std::error_code ec;
    return fs::exists(root / "nvvm" / "libdevice" / "libdevice.10.bc", ec);
  };
  for (const char* var : {"CUDA_HOME", "CUDA_PATH", "CUDA_ROOT"})
    if (const char* v = std::getenv(var); v && *v && has_libdevice(v)) return v;
  std::vector<fs::path> candidates = {"/usr/local/cuda"};
  std::vector<fs::path> versioned;  // /usr/local/cuda-13.0, ...: the newest first
  std::error_code ec;  // an unreadable /usr/local ends the listing, not the process
  for (fs::directory_iterator it("/usr/local", ec), end; !ec && it != end; it.increment(ec))
    if (it->path().filename().string().starts_with("cuda-")) versioned.push_back(it->path());
  std::sort(versioned.begin(), versioned.end(), [](const fs::path& a, const fs::path& b) {
    return ::strverscmp(a.c_str(), b.c_str()) > 0;  // glibc: 13.0 after 12.9
  });
  candidates.insert(candidates.end(), versioned.begin(), versioned.end());
  candidates.insert(candidates.end(), {"/usr/lib/cuda", "/opt/cuda"});
  for (const fs::path& p : candidates)
    if (has_libdevice(p)) return p.string();
  return "";
}

}  // namespace

GpuTarget GpuTarget::from_env() {
  GpuTarget t;
  static const std::string toolkit = find_cuda_toolkit();  // looked up once per process
  t.toolkit = toolkit;
  auto env = [](const char* name) -> std::string {
    const char* v = std::getenv(name);
    return v && *v ? v : "";
  };
  if (std::string a = env("KILN_CUDA_ARCH"); !a.empty()) t.chip = a;
  if (std::string f = env("KILN_CUDA_PTX_FEATURES"); !f.empty()) t.features = f;
  // Parsed strictly, a bad value warned about once and the default kept: atoi read "64abc" as 64
  // and 4294967360 as 64, and a value it rejected threw from every compile.
  t.threads_per_block = static_cast<int>(
      env_int("KILN_CUDA_THREADS_PER_BLOCK", t.threads_per_block, 32, 1024,
              "a multiple of 32 in [32, 1024]", [](int64_t v) { return v % 32 == 0; }));
  t.elements_per_thread = static_cast<int>(
      env_int("KILN_CUDA_ELEMENTS_PER_THREAD", t.elements_per_thread, 1, 16, "1 to 16"));
  t.row_lanes = static_cast<int>(env_int("KILN_CUDA_ROW_LANES", t.row_lanes, 1, 32, "1 or 32",
                                         [](int64_t v) { return v == 1 || v == 32; }));
  return t;
}

void fill_gpu_registry(mlir::DialectRegistry& r) {
  r.insert<mlir::gpu::GPUDialect, mlir::NVVM::NVVMDialect, mlir::nvgpu::NVGPUDialect>();
  mlir::NVVM::registerNVVMTargetInterfaceExternalModels(r);
  mlir::registerGPUDialectTranslation(r);
  // #gpu.select_object, the default offloading handler: without it translating gpu.binary
  // segfaults inside MLIR.
  mlir::gpu::registerOffloadingLLVMTranslationInterfaceExternalModels(r);
  mlir::registerNVVMDialectTranslation(r);
}

namespace {

/// Threads a merged row loop must keep, at least, where its loops had as many (kSplitThreads /
/// 2: enough to cover memory latency on an H100/H200).
constexpr int64_t kMinRowThreads = kSplitThreads / 2;

/// Whether the row loop `p` (rows over `lanes` lanes, each with elements_per_thread columns
/// in flight) has as many threads as the largest loop it merged had elementwise
/// (`iterations` / elements_per_thread), or kMinRowThreads: 64 rows of 4,096 columns are 2,048
/// threads where their elementwise loop had 65,536.
bool keeps_threads_busy(mlir::scf::ParallelOp p, int64_t iterations, int lanes,
                        const GpuTarget& target) {
  int64_t rows = 1;
  for (mlir::Value ub : p.getUpperBound()) {
    auto n = mlir::getConstantIntValue(ub);
    if (!n) return false;
    rows *= *n;
  }
  const int64_t per_thread = std::max(target.elements_per_thread, 1);
  return rows * lanes >= std::min(kMinRowThreads, (iterations + per_thread - 1) / per_thread);
}

}  // namespace

void gpu_parallel_loops(mlir::ModuleOp m, const GpuTarget& target, bool row_separable,
                        const std::vector<bool>& same_rows, bool for_device,
                        std::string& messages) {
  init_gpu_once();
  auto fn = m.lookupSymbol<mlir::func::FuncOp>("main");
  if (!fn) throw Error("codegen (gpu)", "graph has no @main");
  if (for_device) call_cuda_gemm(m);
  copies_to_loops(m);
  wrap_serial_nests(fn);
  run(m, "func.func(convert-linalg-to-parallel-loops),canonicalize,cse", "parallel loops",
      messages);
  fn = m.lookupSymbol<mlir::func::FuncOp>("main");
  scatter_loops_to_atomics(fn);
  unify_row_counts(fn, same_rows);
  inline_constant_globals(m, fn);
  parallel_outside_reductions(fn);
  wrap_host_accesses(fn);
  split_sums(fn);
  fuse_row_loops(fn, /*verify=*/!row_separable);
  // The emulation runs every loop on one CPU thread: lanes of one (no shuffles).
  const int lanes = for_device ? target.row_lanes : 1;
  // Static graphs (whole steps): rows merge where a warp's lanes will share each row; with a
  // thread per row on a device (KILN_CUDA_ROW_LANES=1) the merged rows would read uncoalesced.
  if (!row_separable && (lanes > 1 || !for_device))
    fuse_static_row_loops(fn, [&](mlir::scf::ParallelOp p, int64_t iterations) {
      return spreads_over_lanes(p, lanes) &&
             (!for_device || keeps_threads_busy(p, iterations, lanes, target));
    });
  recompute_row_intermediates(fn);
  fuse_same_domain_loops(fn);
  if (!for_device || lanes != 1)
    spread_rows_over_lanes(fn, lanes, target.threads_per_block, target.elements_per_thread);
  linearize(fn);  // nests left multi-dimensional (grid y/z are limited to 65535)
  unroll_elementwise(fn, target.threads_per_block, target.elements_per_thread);
  log_module("GPU parallel loops", m);
}

void reverse_parallel_loops(mlir::ModuleOp m) {
  m.walk([](mlir::scf::ParallelOp p) {
    mlir::OpBuilder b = mlir::OpBuilder::atBlockBegin(p.getBody());
    for (auto [iv, lb, ub, step] : llvm::zip(p.getInductionVars(), p.getLowerBound(),
                                            p.getUpperBound(), p.getStep())) {
      if (!mlir::isConstantIntValue(lb, 0) || !mlir::isConstantIntValue(step, 1)) continue;
      mlir::Location loc = p.getLoc();
      mlir::Value last = mlir::arith::SubIOp::create(
          b, loc, ub, mlir::arith::ConstantIndexOp::create(b, loc, 1));
      mlir::Value reversed = mlir::arith::SubIOp::create(b, loc, last, iv);
      iv.replaceAllUsesExcept(reversed, reversed.getDefiningOp());
    }
  });
}

void lower_for_gpu(mlir::ModuleOp m, const GpuTarget& target, bool row_separable,
                   const std::vector<bool>& same_rows, std::string& messages, GpuLowered& out) {
  init_gpu_once();
  libm_erf_to_math(m);
  gpu_parallel_loops(m, target, row_separable, same_rows, /*for_device=*/true, messages);
  // Blocks of threads_per_block threads (no-min-max-bounds: with an affine.min bound
  // convert-parallel-loops-to-gpu silently leaves the loop on the host).
  run(m,
      "func.func(scf-parallel-loop-tiling{parallel-loop-tile-sizes=" +
          std::to_string(target.threads_per_block) + " no-min-max-bounds=true},"
      "gpu-map-parallel-loops,convert-parallel-loops-to-gpu),"
      // Constants and index arithmetic move into the kernels: left outside, outlining passes
      // each as a kernel parameter (48 for a dropout mask, 40 for a gelu chain), so the device
      // compiler saw registers where immediates were (no mul.wide, divisions it could not fold).
      "gpu-launch-sink-index-computations,gpu-kernel-outlining,canonicalize,cse",
      "kernels", messages);
  merge_gpu_modules(m);
  out.kernel_ops = describe_gpu_kernels(m);
  // Anything that touches memory outside a kernel now would dereference device pointers on the
  // host.
  std::string host_access;
  auto fn = m.lookupSymbol<mlir::func::FuncOp>("main");
  fn.walk([&](mlir::Operation* op) {
    if (llvm::isa<mlir::memref::LoadOp, mlir::memref::StoreOp, mlir::scf::ParallelOp,
                  mlir::linalg::LinalgOp>(op))
      host_access = op->getName().getStringRef().str();
  });
  if (!host_access.empty())
    throw Error("codegen (gpu)", "a " + host_access + " stayed on the host (not a kernel)");
  divide_full_range(m);
  approximate_math(m, messages);
  expand_remf(m);
  out.kernels = 0;
  m.walk([&](mlir::gpu::GPUFuncOp f) { out.kernels += f.isKernel(); });
  lower_to_ptx(m, target, messages);
  allocate_on_device(m);
  out.ptx.clear();
  m.walk([&](mlir::gpu::BinaryOp bin) {
    for (mlir::Attribute a : bin.getObjects())
      if (auto obj = llvm::dyn_cast<mlir::gpu::ObjectAttr>(a)) out.ptx += obj.getObject().str();
  });
  check_no_externs(out.ptx, target);
}

}  // namespace kiln::codegen
