// codegen::Executable: kiln graph -> linalg (fused) -> destination-passing function -> one-shot
// bufferization -> loops -> LLVM dialect -> object code (codegen/jit.cpp), through the compile
// cache (codegen/cache.cpp).
// Pipeline and required registrations: /work/shared/notes/mlir22-toolchain.md, section 2.
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <optional>

#include "codegen/cache.h"
#include "codegen/gpu_lowering.h"
#include "codegen/in_place.h"
#include "codegen/kernel_profile.h"
#include "codegen/shape_check.h"
#include "codegen/codegen.h"
#include "codegen/runtime.h"
#include "codegen/jit.h"
#include "codegen/lower.h"
#include "codegen/row_fusion.h"
#include "codegen/row_split.h"
#include "codegen/cpu_parallel.h"
#include "codegen/transposed_tiles.h"
#include "backends/cpu/parallel.h"
#include "backends/cuda/driver.h"
#include "backends/cuda/profile.h"
#include "core/env.h"
#include "core/error.h"
#include "eager/dispatch.h"
#include "ir/dialect.h"
#include "mlir/Conversion/ArithToLLVM/ArithToLLVM.h"
#include "mlir/Conversion/ControlFlowToLLVM/ControlFlowToLLVM.h"
#include "mlir/Conversion/FuncToLLVM/ConvertFuncToLLVM.h"
#include "mlir/Conversion/IndexToLLVM/IndexToLLVM.h"
#include "mlir/Conversion/MathToLLVM/MathToLLVM.h"
#include "mlir/Conversion/MemRefToLLVM/MemRefToLLVM.h"
#include "mlir/Conversion/OpenMPToLLVM/ConvertOpenMPToLLVM.h"
#include "mlir/Conversion/Passes.h"
#include "mlir/Conversion/UBToLLVM/UBToLLVM.h"
#include "mlir/Conversion/VectorToLLVM/ConvertVectorToLLVM.h"
#include "mlir/Dialect/Affine/IR/AffineOps.h"
#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Arith/Transforms/BufferizableOpInterfaceImpl.h"
#include "mlir/Dialect/Bufferization/IR/Bufferization.h"
#include "mlir/Dialect/Bufferization/Pipelines/Passes.h"
#include "mlir/Dialect/Bufferization/Transforms/FuncBufferizableOpInterfaceImpl.h"
#include "mlir/Dialect/Bufferization/Transforms/Passes.h"
#include "mlir/Dialect/ControlFlow/IR/ControlFlow.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Index/IR/IndexDialect.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/Linalg/IR/Linalg.h"
#include "mlir/Dialect/Linalg/Passes.h"
#include "mlir/Dialect/Linalg/Transforms/BufferizableOpInterfaceImpl.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/Dialect/Math/Transforms/Passes.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/MemRef/Utils/MemRefUtils.h"
#include "mlir/Dialect/MemRef/Transforms/Passes.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/SCF/Transforms/BufferizableOpInterfaceImpl.h"
#include "mlir/Dialect/SCF/Transforms/Passes.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "mlir/Dialect/Tensor/Transforms/BufferizableOpInterfaceImpl.h"
#include "mlir/Dialect/UB/IR/UBOps.h"
#include "mlir/Dialect/Vector/IR/VectorOps.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/Verifier.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Interfaces/DestinationStyleOpInterface.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Pass/PassRegistry.h"
#include "mlir/Target/LLVMIR/Dialect/Builtin/BuiltinToLLVMIRTranslation.h"
#include "mlir/Target/LLVMIR/Dialect/LLVMIR/LLVMToLLVMIRTranslation.h"
#include "mlir/Target/LLVMIR/Dialect/OpenMP/OpenMPToLLVMIRTranslation.h"
#include "mlir/Transforms/GreedyPatternRewriteDriver.h"
#include "mlir/Transforms/Passes.h"

extern "C" void mgpuSetDefaultDevice(int32_t device);  // backends/cuda/mlir_runtime.cpp

namespace kiln::codegen {
namespace {

/// Whether CUDA code can be linked and run here (a driver and a device).
bool cuda_available() { return cuda::is_available(); }

/// Before CUDA host code runs: the device its runtime calls (allocations, cuBLAS) use.
void cuda_start_run(Device device) {
  cuda::set_current_device(device.index);
  mgpuSetDefaultDevice(device.index);
  set_cuda_runtime_device(device.index);
}

/// After the host code of a CUDA graph returned: raises the first error the runtime functions
/// recorded (they cannot throw through JIT-compiled frames). Kernels run on the kiln stream,
/// ordered with copies; reading results on the host waits for them.
void cuda_finish_run(const char* where) {
  if (std::optional<Error> e = take_cuda_runtime_error())
    throw Error(where, e->what());
}

void init_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    init_llvm();
    mlir::registerTransformsPasses();
    mlir::registerConversionPasses();
    mlir::registerLinalgPasses();
    mlir::bufferization::registerBufferizationPasses();
    mlir::bufferization::registerBufferizationPipelines();
    mlir::memref::registerMemRefPasses();
    mlir::registerSCFPasses();  // scf-parallel-for-to-nested-fors (after the CPU's row fusion)
    register_extern_calls_pass();
  });
}

void fill_registry(mlir::DialectRegistry& r) {
  r.insert<kiln::dialect::KilnDialect, mlir::affine::AffineDialect, mlir::arith::ArithDialect,
           mlir::bufferization::BufferizationDialect, mlir::cf::ControlFlowDialect,
           mlir::func::FuncDialect, mlir::index::IndexDialect, mlir::LLVM::LLVMDialect,
           mlir::linalg::LinalgDialect, mlir::math::MathDialect, mlir::memref::MemRefDialect,
           mlir::scf::SCFDialect, mlir::tensor::TensorDialect, mlir::ub::UBDialect,
           mlir::vector::VectorDialect>();  // vector: the tiles' copies (transposed_tiles.h)
  mlir::arith::registerBufferizableOpInterfaceExternalModels(r);
  mlir::linalg::registerBufferizableOpInterfaceExternalModels(r);
  mlir::scf::registerBufferizableOpInterfaceExternalModels(r);
  mlir::tensor::registerBufferizableOpInterfaceExternalModels(r);
  mlir::bufferization::func_ext::registerBufferizableOpInterfaceExternalModels(r);
  mlir::arith::registerConvertArithToLLVMInterface(r);
  mlir::cf::registerConvertControlFlowToLLVMInterface(r);
  mlir::registerConvertFuncToLLVMInterface(r);
  mlir::index::registerConvertIndexToLLVMInterface(r);
  mlir::registerConvertMathToLLVMInterface(r);
  mlir::registerConvertMemRefToLLVMInterface(r);
  mlir::ub::registerConvertUBToLLVMInterface(r);
  mlir::vector::registerConvertVectorToLLVMInterface(r);
  mlir::registerBuiltinDialectTranslation(r);
  mlir::registerLLVMDialectTranslation(r);
  mlir::registerConvertOpenMPToLLVMInterface(r);  // cpu_parallel.h
  mlir::registerOpenMPDialectTranslation(r);
  fill_gpu_registry(r);
}

DType to_dtype(mlir::Type t) {
  if (t.isF32()) return DType::Float32;
  if (t.isF64()) return DType::Float64;
  if (t.isInteger(1) || t.isInteger(8)) return DType::Bool;  // i8: bools_as_bytes (lower.h)
  if (t.isInteger(32)) return DType::Int32;
  if (t.isInteger(64)) return DType::Int64;
  throw Error("codegen::Executable", "unsupported element type");
}

std::optional<DimFormula> dim_formula(mlir::Value v, int64_t d, int& budget);

/// `size` (an index value) as a DimFormula: tensor.dim of a tensor whose size has a formula,
/// constants, and sums of those (a cat's `T + 1`).
std::optional<DimFormula> size_formula(mlir::Value size, int& budget) {
  if (!size || --budget < 0) return std::nullopt;
  if (auto c = size.getDefiningOp<mlir::arith::ConstantIndexOp>()) return DimFormula{{}, c.value()};
  if (auto add = size.getDefiningOp<mlir::arith::AddIOp>()) {
    std::optional<DimFormula> a = size_formula(add.getLhs(), budget);
    std::optional<DimFormula> b = a ? size_formula(add.getRhs(), budget) : std::nullopt;
    if (!b) return std::nullopt;
    a->terms.insert(a->terms.end(), b->terms.begin(), b->terms.end());
    a->constant += b->constant;
    return a;
  }
  auto dim = size.getDefiningOp<mlir::tensor::DimOp>();
  std::optional<int64_t> index = dim ? dim.getConstantIndex() : std::nullopt;
  if (!index) return std::nullopt;
  return dim_formula(dim.getSource(), *index, budget);
}

/// Dim `d` of tensor `v` from the function's arguments' sizes: follows destination-style inits
/// down to a tensor.empty (or tensor.extract_slice) whose size is a size_formula, or a
/// function argument; a static dim is its size. `budget` bounds the walk.
std::optional<DimFormula> dim_formula(mlir::Value v, int64_t d, int& budget) {
  while (--budget >= 0) {
    if (auto t = llvm::dyn_cast<mlir::RankedTensorType>(v.getType()); t && !t.isDynamicDim(d))
      return DimFormula{{}, t.getDimSize(d)};
    if (auto arg = llvm::dyn_cast<mlir::BlockArgument>(v))
      return DimFormula{{{static_cast<int>(arg.getArgNumber()), static_cast<int>(d)}}, 0};
    mlir::Operation* op = v.getDefiningOp();
    if (auto concat = llvm::dyn_cast<mlir::tensor::ConcatOp>(op)) {
      // (more than 32 inputs, lower.cpp): the sum along its dim, the first input's size else
      if (static_cast<uint64_t>(d) != concat.getDim()) {
        v = concat.getInputs()[0];
        continue;
      }
      DimFormula sum;
      for (mlir::Value in : concat.getInputs()) {
        std::optional<DimFormula> f = dim_formula(in, d, budget);
        if (!f) return std::nullopt;
        sum.terms.insert(sum.terms.end(), f->terms.begin(), f->terms.end());
        sum.constant += f->constant;
      }
      return sum;
    }
    if (auto dps = llvm::dyn_cast<mlir::DestinationStyleOpInterface>(op)) {
      v = dps.getTiedOpOperand(llvm::cast<mlir::OpResult>(v))->get();
      continue;
    }
    if (auto loop = llvm::dyn_cast<mlir::scf::ForOp>(op)) {  // index_add's loops: their init
      v = loop.getInitArgs()[llvm::cast<mlir::OpResult>(v).getResultNumber()];
      continue;
    }
    if (auto cast = llvm::dyn_cast<mlir::tensor::CastOp>(op)) {
      v = cast.getSource();
      continue;
    }
    if (auto collapse = llvm::dyn_cast<mlir::tensor::CollapseShapeOp>(op)) {
      // A view that keeps dim d as one source dim (attention's heads merged back: [?, T, H, D]
      // -> [?, T, H * D]): that dim of the source.
      auto groups = collapse.getReassociationIndices();
      if (static_cast<size_t>(d) >= groups.size() || groups[d].size() != 1) return std::nullopt;
      v = collapse.getSrc();
      d = groups[d][0];
      continue;
    }
    mlir::Value size;
    if (auto empty = llvm::dyn_cast<mlir::tensor::EmptyOp>(op)) {
      size = empty.getDynamicSize(static_cast<unsigned>(d));  // (dynamic: checked above)
    } else if (auto slice = llvm::dyn_cast<mlir::tensor::ExtractSliceOp>(op)) {
      // A prefix slice lowered from kiln.view "slice" (lower.cpp; not rank-reducing): its
      // dynamic sizes are tensor.dim of the source.
      if (slice.getSourceType().getRank() != slice.getResultType().getRank()) return std::nullopt;
      size = llvm::dyn_cast_if_present<mlir::Value>(slice.getMixedSizes()[d]);
    } else if (auto expand = llvm::dyn_cast<mlir::tensor::ExpandShapeOp>(op)) {
      // lower.cpp's expand of a GEMM over collapsed rows: output_shape names the size.
      size = llvm::dyn_cast_if_present<mlir::Value>(expand.getMixedOutputShape()[d]);
    } else {
      return std::nullopt;
    }
    return size_formula(size, budget);
  }
  return std::nullopt;
}

/// Below this many bytes of row-carrying operands a graph runs on the calling thread.
constexpr int64_t kParallelMinBytes = 256 << 10;
/// Bytes of row-carrying operands per call of a row-split graph: small when the graph keeps an
/// intermediate of the block's rows, so the block's data stays in L2 between its loop nests;
/// large for one loop nest or per-row intermediates (RowSplitPlan::per_row), where blocks only
/// spread the work and each call costs about a microsecond.
constexpr int64_t kBlockBytesMultiLoop = 128 << 10;
constexpr int64_t kBlockBytesOneLoop = 4 << 20;

/// Gives every destination-style op, and every index_add / scatter_add loop nest (whose init
/// its loops update in place), its own init when CSE merged identical ones (e.g. the zero
/// fills of two sums, or of two embeddings' gradients): eliminate-empty-tensors would otherwise
/// turn the shared init into the first output's buffer, and the second result would be
/// computed in that same buffer. A loop nest's init that is not a fill (a value used
/// elsewhere too) is copied first.
void unshare_inits(mlir::func::FuncOp fn) {
  auto empty_collapsed = [](mlir::Operation* def) {
    auto c = llvm::dyn_cast_or_null<mlir::tensor::CollapseShapeOp>(def);
    return c && c.getSrc().getDefiningOp<mlir::tensor::EmptyOp>();
  };
  // A fill: linalg.fill, or a generic that reads nothing (a constant expanded to a shape).
  auto fill_like = [](mlir::Operation* def) {
    if (llvm::isa_and_present<mlir::linalg::FillOp>(def)) return true;
    auto g = llvm::dyn_cast_or_null<mlir::linalg::GenericOp>(def);
    return g && g.getNumDpsInputs() == 0 && g->getNumResults() == 1;
  };
  llvm::SmallVector<mlir::OpOperand*> shared;
  fn.walk([&](mlir::DestinationStyleOpInterface dps) {
    for (mlir::OpOperand& init : dps.getDpsInitsMutable()) {
      if (init.get().hasOneUse()) continue;
      mlir::Operation* def = init.get().getDefiningOp();
      if (llvm::isa_and_present<mlir::linalg::FillOp, mlir::tensor::EmptyOp>(def) ||
          empty_collapsed(def))
        shared.push_back(&init);
    }
  });
  fn.walk([&](mlir::scf::ForOp loop) {
    auto parent = loop->getParentOfType<mlir::scf::ForOp>();
    if (!loop->hasAttr(kScatterLoopAttr) || (parent && parent->hasAttr(kScatterLoopAttr)))
      return;
    // One use that reads or writes elements (a tensor.dim reads only the size).
    auto one_use = [](mlir::Value v) {
      return llvm::count_if(v.getUsers(), [](mlir::Operation* u) {
               return !llvm::isa<mlir::tensor::DimOp>(u);
             }) == 1;
    };
    for (mlir::OpOperand& init : loop.getInitArgsMutable()) {
      // Shared also when a cast of a value with other uses (a relaxed `?` type).
      bool alone = one_use(init.get());
      for (auto c = init.get().getDefiningOp<mlir::tensor::CastOp>(); c && alone;
           c = c.getSource().getDefiningOp<mlir::tensor::CastOp>())
        alone = one_use(c.getSource());
      if (alone) continue;
      mlir::Operation* def = init.get().getDefiningOp();
      if (llvm::isa_and_present<mlir::tensor::EmptyOp>(def) || fill_like(def)) {
        shared.push_back(&init);
        continue;
      }
      if (!def) continue;  // an input: bufferization copies it (inputs are not writable)
      mlir::OpBuilder b(loop);
      auto type = llvm::cast<mlir::RankedTensorType>(init.get().getType());
      llvm::SmallVector<mlir::Value> sizes;
      for (int64_t d = 0; d < type.getRank(); ++d)
        if (type.isDynamicDim(d))
          sizes.push_back(mlir::tensor::DimOp::create(b, loop.getLoc(), init.get(), d));
      mlir::Value empty = mlir::tensor::EmptyOp::create(b, loop.getLoc(), type.getShape(),
                                                        type.getElementType(), sizes);
      init.set(mlir::linalg::CopyOp::create(b, loop.getLoc(), init.get(), empty).getResult(0));
    }
  });
  llvm::SetVector<mlir::Operation*> originals;
  for (mlir::OpOperand* init : shared) {
    mlir::Operation* def = init->get().getDefiningOp();
    originals.insert(def);
    mlir::OpBuilder b(init->getOwner());
    mlir::Operation* copy = b.clone(*def);
    if (empty_collapsed(def)) {  // a GEMM's C (lower.cpp): its own empty too
      b.setInsertionPoint(copy);
      copy->setOperand(0, b.clone(*def->getOperand(0).getDefiningOp())->getResult(0));
    }
    if (fill_like(copy)) {
      // The fill's own destination must not be shared either.
      auto fill = llvm::cast<mlir::DestinationStyleOpInterface>(copy);
      mlir::Value dest = fill.getDpsInits()[0];
      if (auto empty = dest.getDefiningOp<mlir::tensor::EmptyOp>()) {
        b.setInsertionPoint(copy);
        fill.getDpsInitsMutable()[0].set(b.clone(*empty.getOperation())->getResult(0));
      }
    }
    init->set(copy->getResult(0));
  }
  // Every user got its own copy, so the originals are unused now; a fill left alone would
  // still be bufferized and run on every call (in the digits MLP's step a 32 KiB memset and
  // two 512-byte ones of buffers nothing read). Their own empty operands go with them.
  while (!originals.empty()) {
    mlir::Operation* op = originals.pop_back_val();
    if (!mlir::isOpTriviallyDead(op)) continue;
    for (mlir::Value operand : op->getOperands())
      if (mlir::Operation* def = operand.getDefiningOp()) originals.insert(def);
    op->erase();
  }
}

/// `dst` reshaped back through each of `chain` (expand_shape / collapse_shape ops, outermost
/// first, leading from a buffer to `dst`'s shape): the buffer whose reshapes they give. Null,
/// with nothing built, when its type is not `want` or a reshape cannot be undone.
mlir::Value reshape_back(mlir::Value dst, llvm::ArrayRef<mlir::Operation*> chain, mlir::Type want,
                         mlir::OpBuilder& b) {
  mlir::Type type = dst.getType();
  for (mlir::Operation* op : chain) {
    auto memref = llvm::cast<mlir::MemRefType>(type);
    if (auto e = llvm::dyn_cast<mlir::memref::ExpandShapeOp>(op)) {
      if (!mlir::memref::CollapseShapeOp::isGuaranteedCollapsible(memref,
                                                                   e.getReassociationIndices()))
        return {};
      type = mlir::memref::CollapseShapeOp::computeCollapsedType(memref,
                                                                 e.getReassociationIndices());
      continue;
    }
    auto c = llvm::cast<mlir::memref::CollapseShapeOp>(op);  // undone by expanding back
    mlir::MemRefType src = c.getSrcType();
    if (memref != c.getResultType() || !src.hasStaticShape() || !src.getLayout().isIdentity())
      return {};
    type = src;
  }
  if (type != want) return {};
  mlir::Value v = dst;
  for (mlir::Operation* op : chain) {
    if (auto e = llvm::dyn_cast<mlir::memref::ExpandShapeOp>(op)) {
      v = mlir::memref::CollapseShapeOp::create(b, e.getLoc(), v, e.getReassociationIndices());
    } else {
      auto c = llvm::cast<mlir::memref::CollapseShapeOp>(op);
      v = mlir::memref::ExpandShapeOp::create(b, c.getLoc(), c.getSrcType(), v,
                                              c.getReassociationIndices());
    }
  }
  return v;
}

/// A result computed in a temporary and then copied into its output argument, because
/// eliminate-empty-tensors does not look through reshapes (lower.cpp's GEMM over collapsed rows
/// expands its result back; a batched GEMM's [b·h, m, n] result is copied out as [b, h, m, n];
/// a bias gradient's [1, 1, n] column sum is copied out as [n]): the temporary is replaced by
/// the output buffer, reshaped back as the copy's source reshapes the temporary (a copy kernel
/// per result on a GPU).
/// Only when the temporary is a plain alloc whose last use before its dealloc is that copy, and
/// the output argument is used by nothing else (outputs are fresh tensors, never inputs: see
/// run()).
void forward_output_copies(mlir::func::FuncOp fn) {
  llvm::SmallVector<mlir::memref::CopyOp> copies;
  fn.walk([&](mlir::memref::CopyOp copy) { copies.push_back(copy); });
  for (mlir::memref::CopyOp copy : copies) {
    auto dst = llvm::dyn_cast<mlir::BlockArgument>(copy.getTarget());
    llvm::SmallVector<mlir::Operation*> reshapes;  // from the copy back to the alloc
    mlir::Value source = copy.getSource();
    for (mlir::Operation* def = source.getDefiningOp();
         llvm::isa_and_nonnull<mlir::memref::ExpandShapeOp, mlir::memref::CollapseShapeOp>(def);
         def = source.getDefiningOp()) {
      reshapes.push_back(def);
      source = def->getOperand(0);
    }
    auto alloc = source.getDefiningOp<mlir::memref::AllocOp>();
    if (!dst || !alloc || !dst.hasOneUse() || dst.getOwner() != &fn.getBody().front() ||
        copy.getSource().getType() != dst.getType() || alloc->getBlock() != copy->getBlock())
      continue;
    bool ok = true;
    mlir::Operation* dealloc = nullptr;
    // Every other use, directly or through what is derived from it (views, pointers), is
    // before the copy.
    llvm::SmallVector<mlir::Value> work = {alloc.getResult()};
    llvm::DenseSet<mlir::Operation*> seen;
    while (ok && !work.empty()) {
      mlir::Value v = work.pop_back_val();
      for (mlir::Operation* user : v.getUsers()) {
        if (user == copy.getOperation() || !seen.insert(user).second) continue;
        if (v == alloc.getResult() && llvm::isa<mlir::memref::DeallocOp>(user) && !dealloc) {
          dealloc = user;
          continue;
        }
        mlir::Operation* at = copy->getBlock()->findAncestorOpInBlock(*user);
        ok &= at && at->isBeforeInBlock(copy);
        for (mlir::Value r : user->getResults()) work.push_back(r);
      }
    }
    if (!ok) continue;
    mlir::OpBuilder b(alloc);
    mlir::Value replacement = reshape_back(dst, reshapes, alloc.getType(), b);
    if (!replacement) continue;
    copy->erase();
    if (dealloc) dealloc->erase();
    alloc.getResult().replaceAllUsesWith(replacement);
    alloc->erase();
    for (mlir::Operation* r : reshapes)  // outermost first: each frees the next
      if (r->use_empty()) r->erase();
  }
}

/// Memref descriptor of rank r as words: allocated, aligned, offset, sizes[r], strides[r];
/// appended to `words`.
void append_descriptor(std::vector<int64_t>& words, void* data, const Shape& shape) {
  const size_t r = static_cast<size_t>(shape.size()), at = words.size();
  words.resize(at + 3 + 2 * r);
  int64_t* d = words.data() + at;
  d[0] = d[1] = reinterpret_cast<int64_t>(data);
  d[2] = 0;
  int64_t stride = 1;
  for (size_t i = r; i-- > 0;) {
    d[3 + i] = shape[static_cast<int>(i)];
    d[3 + r + i] = stride;
    stride *= shape[static_cast<int>(i)];
  }
}


/// Per input of @main: whether its dim 0 is `?` only through the row relaxation (the graph's
/// own shape has a static dim 0), so run() holds it to that size (gpu_parallel_loops'
/// `same_rows`).
std::vector<bool> relaxed_inputs(mlir::ModuleOp m,
                                 const std::vector<std::vector<int64_t>>& graph_shapes) {
  auto fn = m.lookupSymbol<mlir::func::FuncOp>("main");
  std::vector<bool> relaxed(graph_shapes.size(), false);
  for (size_t i = 0; i < graph_shapes.size() && i < fn.getNumArguments(); ++i) {
    auto t = llvm::dyn_cast<mlir::ShapedType>(fn.getArgument(i).getType());
    relaxed[i] = t && t.getRank() > 0 && t.isDynamicDim(0) && !graph_shapes[i].empty() &&
                 graph_shapes[i][0] != ir::kDynamic;
  }
  return relaxed;
}

}  // namespace

int64_t DimFormula::evaluate(const std::vector<Tensor>& inputs) const {
  int64_t size = constant;
  for (auto [input, dim] : terms) {
    // (a corrupt disk-cache entry: never an index past the inputs)
    if (input < 0 || static_cast<size_t>(input) >= inputs.size() || dim < 0 ||
        dim >= inputs[static_cast<size_t>(input)].dim())
      throw Error("codegen::Executable::run", fmt::format("an output size refers to dim {} of "
                                                          "input {} of {}", dim, input,
                                                          inputs.size()));
    size += inputs[static_cast<size_t>(input)].shape()[dim];
  }
  return size;
}

// CompiledMeta: inputs, outputs, kernels, linalg, row_split (filled by compile(), or copied from
// the cache).
struct Executable::Impl : CompiledMeta {
  std::shared_ptr<const CompiledCode> code;  // shared with the compile cache
  PackedFn entry = nullptr;                  // packed `_mlir_ciface_main`, from `code`
  CompileStats stats;
  std::string messages;

  void run_pipeline(mlir::ModuleOp m, const std::string& pipeline, const char* stage) {
    run_pass_pipeline(m, pipeline, stage, messages);
  }

  std::string compile(const std::string& graph_mlir, bool relax);
  bool relaxed = false;  // compile() relaxed dim 0 to `?` (row_split.h)
  Device device = Device::cpu();
  GpuTarget gpu;
  GpuLoopEmulation emulate_gpu_loops = GpuLoopEmulation::Off;
  std::vector<std::pair<int, int>> in_place_requests;  // CompileOptions::in_place_outputs
  bool any_alias = false;  // an output is computed in an input's buffer (Param::alias_input)
  bool profile_kernels = false;  // CompileOptions::profile_kernels (or KILN_PROFILE=1)
  std::unique_ptr<KernelCounter[]> kernel_counters;  // one per profiled_kernels entry
  std::optional<ShapeCheck> shape_check;  // CompileOptions::check_dynamic_sizes
};

bool kernel_profiling(const CompileOptions& options) {
  static const bool env = env_flag("KILN_PROFILE");
  return options.profile_kernels || env || (options.device.is_cuda() && cuda::profiling());
}

GpuLoopEmulation gpu_loop_emulation(const CompileOptions& options) {
  using E = GpuLoopEmulation;
  static const E env = [] {
    const char* e = std::getenv("KILN_EMULATE_GPU_LOOPS");
    if (e && llvm::StringRef(e).equals_insensitive("reverse")) return E::Reversed;
    return env_flag("KILN_EMULATE_GPU_LOOPS") ? E::InOrder : E::Off;
  }();
  if (!options.device.is_cpu()) return E::Off;
  if (options.emulate_gpu_loops) return options.emulate_in_reverse ? E::Reversed : E::InOrder;
  return env;
}

namespace {
/// Address space a compile must have left under RLIMIT_AS (`ulimit -v`) to start. MLIR does
/// not check every allocation (OperandStorage::resize writes through a failed malloc), so a
/// compile that ran out crashed the process (SIGSEGV; found by a break-it pass), where LLVM's
/// own failures now raise (ir::install_llvm_error_handler). A compile takes a few MiB (an
/// elementwise chain) to a few hundred (a whole Transformer training step).
constexpr uint64_t kCompileHeadroom = uint64_t{256} << 20;

void check_compile_headroom() {
  rlimit limit{};
  if (::getrlimit(RLIMIT_AS, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return;
  unsigned long pages = 0;
  if (std::FILE* f = std::fopen("/proc/self/statm", "r")) {
    if (std::fscanf(f, "%lu", &pages) != 1) pages = 0;
    std::fclose(f);
  }
  const uint64_t used =
      static_cast<uint64_t>(pages) * static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const uint64_t left = limit.rlim_cur > used ? limit.rlim_cur - used : 0;
  KILN_CHECK(left >= kCompileHeadroom, "compile", Loc::current(),
             "{} MiB of address space left under RLIMIT_AS (ulimit -v), under the {} MiB a "
             "compile may need: MLIR cannot run out of memory safely, so no code is built",
             left >> 20, kCompileHeadroom >> 20);
}
}  // namespace

namespace {
std::atomic<CompileObserver> g_compile_observer{nullptr};
}  // namespace

CompileObserver set_compile_observer_for_testing(CompileObserver observer) {
  return g_compile_observer.exchange(observer);
}

Executable::Executable(const ir::Graph& g, const CompileOptions& options) {
  // With kernel timers the text carries the ops' source locations, which name the kernels.
  const bool profile = kernel_profiling(options);
  const std::string text = g.to_mlir(/*with_locations=*/profile);
  auto build_once = [&](bool relax) {
    impl_ = std::make_unique<Impl>();
    Impl& I = *impl_;
    I.device = options.device;
    I.gpu = options.gpu;
    I.emulate_gpu_loops = gpu_loop_emulation(options);
    I.in_place_requests = options.in_place_outputs;
    I.profile_kernels = profile;
    I.code = get_or_compile(text, options, I.stats, [&](CompiledMeta& meta) {
      check_compile_headroom();
      std::string object = I.compile(text, relax);
      meta = I;
      return object;
    });
    static_cast<CompiledMeta&>(I) = I.code->meta;
    I.entry = I.code->fn;
    for (const Param& p : I.outputs) I.any_alias = I.any_alias || p.alias_input >= 0;
    if (!I.profiled_kernels.empty())
      I.kernel_counters = std::make_unique<KernelCounter[]>(I.profiled_kernels.size());
    // KILN_CUDA_PROFILE's table names kernels of modules loaded from this PTX by their ops.
    if (!I.gpu_kernel_ops.empty()) cuda::profile_describe_kernels(I.ptx, I.gpu_kernel_ops);
  };
  auto build = [&](bool relax) {
    try {
      build_once(relax);
    } catch (const std::bad_alloc&) {  // operator new inside MLIR/LLVM
      throw Error("compile", "out of memory in MLIR/LLVM while building compiled code");
    }
  };
  // CUDA: dim 0 is relaxed to `?` as on cpu, and the row-split analysis tells which loop nests
  // may run as one kernel over rows (gpu_lowering.h). Without a device the host code is still
  // linked (every runtime symbol resolves) but its PTX module is not loaded, and run() says
  // there is no CUDA device.
  try {
    build(true);
  } catch (const Error&) {
    // The row-split relaxation of dim 0 can leave a `?` that later stages cannot trace back to
    // an input; the graph with its own static shapes still compiles (on one thread).
    if (!impl_ || !impl_->relaxed) throw;
    build(false);
  }
  if (options.check_dynamic_sizes) {
    ShapeCheck check(g);
    if (check.needed()) impl_->shape_check = std::move(check);
  }
  if (CompileObserver observe = g_compile_observer.load(); observe && options.device.is_cpu())
    observe(g, options);
}

/// Runs the pipeline on the graph's text; fills the metadata and returns the object code.
std::string Executable::Impl::compile(const std::string& graph_mlir, bool relax) {
  init_once();
  Impl& I = *this;
  Lap lap;
  if (log_enabled(kLogIr)) log_text("kiln MLIR", graph_mlir);
  // The compile's own context: nothing of it outlives the object code, and kept with the
  // Executable it held 1.2 MB per compiled region (every dialect loaded), the code ~10 KB.
  mlir::MLIRContext ctx(mlir::MLIRContext::Threading::DISABLED);
  mlir::DialectRegistry registry;
  fill_registry(registry);
  ctx.appendDialectRegistry(registry);
  ctx.loadAllAvailableDialects();
  mlir::ScopedDiagnosticHandler handler(&ctx, [&](mlir::Diagnostic& d) {
    llvm::raw_string_ostream os(I.messages);
    os << d.getLocation() << ": " << d << "\n";
    return mlir::success();
  });
  mlir::OwningOpRef<mlir::ModuleOp> module =
      mlir::parseSourceString<mlir::ModuleOp>(graph_mlir, &ctx);
  if (!module) throw Error("codegen::Executable", "cannot parse the graph: " + I.messages);
  if (I.profile_kernels) name_op_locations(*module);
  // The graph's own argument shapes: run() checks inputs against these even when dim 0 is
  // relaxed to `?` below.
  std::vector<std::vector<int64_t>> graph_shapes;
  for (mlir::Type t : module->lookupSymbol<mlir::func::FuncOp>("main").getArgumentTypes()) {
    auto rt = llvm::cast<mlir::RankedTensorType>(t);
    graph_shapes.emplace_back(rt.getShape().begin(), rt.getShape().end());
    for (int64_t& d : graph_shapes.back())
      if (d == mlir::ShapedType::kDynamic) d = ir::kDynamic;
  }
  // 0. A dynamic leading dim lets run() split the rows over threads (row_split.h).
  if (relax) {
    mlir::OwningOpRef<mlir::ModuleOp> relaxed_module(module->clone());
    if (relax_leading_dim(*relaxed_module)) {
      module = std::move(relaxed_module);
      I.relaxed = true;
    }
  }
  mlir::ModuleOp m = *module;
  if (injected_fault() == InjectedFault::InvalidMlir)
    m.lookupSymbol<mlir::func::FuncOp>("main").getBody().front().getTerminator()->erase();
  // The parser verified the graph; the relaxation above rewrote it. Lowering an invalid module
  // can crash inside MLIR's patterns instead of failing, so check it once more.
  if (mlir::failed(mlir::verify(m)))
    throw Error("codegen::Executable: invalid module", I.messages);

  // 1. kiln -> linalg on tensors, fused.
  {
    mlir::PassManager pm = mlir::PassManager::on<mlir::ModuleOp>(&ctx);
    pm.addPass(kiln::dialect::create_decompose_pass());
    pm.addPass(create_kiln_to_linalg_pass(
        /*cpu_math=*/!I.device.is_cuda() && I.emulate_gpu_loops == GpuLoopEmulation::Off));
    if (mlir::failed(pm.run(m))) throw Error("codegen::Executable: lowering", I.messages);
  }
  if (auto main = m.lookupSymbol<mlir::func::FuncOp>("main")) bools_as_bytes(main);
  {
    mlir::PassManager pm = mlir::PassManager::on<mlir::ModuleOp>(&ctx);
    pm.addPass(mlir::createCanonicalizerPass());  // also folds the dims bools_as_bytes reads
    // GPU fusion decisions, also where GPU loops are emulated on the CPU (so that tests check
    // the values of what GPU code computes).
    pm.addPass(create_fuse_elementwise_pass(I.device.is_cuda() ||
                                            I.emulate_gpu_loops != GpuLoopEmulation::Off));
    pm.addPass(mlir::createCSEPass());
    if (mlir::failed(pm.run(m))) throw Error("codegen::Executable: fusion", I.messages);
  }
  std::string unlowered;
  m.walk([&](mlir::Operation* op) {
    if (llvm::isa<kiln::dialect::KilnDialect>(op->getDialect())) {
      // Named as the user wrote it: the op-table row, its operand types, its source line.
      std::string what;
      llvm::raw_string_ostream os(what);
      auto kind = op->getAttrOfType<mlir::StringAttr>("kind");
      os << (unlowered.empty() ? "" : "; ")
         << (kind ? kind.getValue() : op->getName().getStringRef()) << " on ";
      llvm::interleaveComma(op->getOperandTypes(), os);
      auto at = llvm::dyn_cast<mlir::FileLineColLoc>(op->getLoc());
      if (at && at.getFilename() != "-")
        os << " (" << at.getFilename() << ":" << at.getLine() << ")";
      unlowered += what;
    }
    // A linalg.fill initialising a reduction's accumulator is not counted: it touches only
    // the (smaller) output, right before the reduction that owns it.
    if (llvm::isa<mlir::linalg::LinalgOp>(op) && !llvm::isa<mlir::linalg::FillOp>(op)) ++I.kernels;
  });
  if (!unlowered.empty())
    throw Error("codegen::Executable",
                "no lowering for " + unlowered +
                    " (not covered: softmax / log_softmax over 0 elements, nll_loss with a `?` "
                    "class dim, a slice of a `?` dim; compile() runs such ops on eager kernels)");
  {
    llvm::raw_string_ostream os(I.linalg);
    m.print(os);
  }
  if (log_enabled(kLogIr)) log_text("linalg fused", I.linalg);
  auto fn = m.lookupSymbol<mlir::func::FuncOp>("main");
  if (!fn) throw Error("codegen::Executable", "graph has no @main");
  I.row_split = plan_row_split(fn, relaxed_inputs(m, graph_shapes));
  unshare_inits(fn);

  // 2. Destination-passing: @main(inputs..., out memrefs...) writes each result with
  // bufferization.materialize_in_destination and returns nothing. An output computed in place
  // (in_place.h) has no out memref: it materializes into its input's buffer.
  // In a row-parallel graph each row block runs @main on its rows: an input sliced by rows is
  // read and written by its own block only; one passed whole is read by every block.
  std::vector<std::pair<int, int>> in_place;
  if (!I.in_place_requests.empty() && I.device.is_cpu() &&
      I.emulate_gpu_loops == GpuLoopEmulation::Off)
    in_place = in_place_pairs(fn, I.in_place_requests);
  if (I.row_split.splittable)
    std::erase_if(in_place, [&](std::pair<int, int> pair) {
      return static_cast<size_t>(pair.second) >= I.row_split.sliced_input.size() ||
             !I.row_split.sliced_input[static_cast<size_t>(pair.second)];
    });
  for (auto [t, shape] : llvm::zip(fn.getArgumentTypes(), graph_shapes)) {
    auto rt = llvm::cast<mlir::RankedTensorType>(t);
    I.inputs.push_back(Param{to_dtype(rt.getElementType()), shape, {}});
  }
  auto ret = llvm::cast<mlir::func::ReturnOp>(fn.getBody().front().getTerminator());
  llvm::SmallVector<mlir::Type> arg_types(fn.getArgumentTypes());
  for (mlir::Value r : ret.getOperands()) {
    auto rt = llvm::cast<mlir::RankedTensorType>(r.getType());
    Param p{to_dtype(rt.getElementType()),
            std::vector<int64_t>(rt.getShape().begin(), rt.getShape().end()), {}};
    p.dyn_src.assign(p.shape.size(), {});
    for (size_t j = 0; j < p.shape.size(); ++j) {
      if (p.shape[j] != mlir::ShapedType::kDynamic) continue;
      p.shape[j] = ir::kDynamic;
      int budget = 256;
      auto src = dim_formula(r, static_cast<int64_t>(j), budget);
      if (!src)
        throw Error("codegen::Executable",
                    "cannot tell a dynamic output dim from the inputs (not yet):\n" + I.linalg);
      p.dyn_src[j] = *src;
    }
    for (auto [output, input] : in_place)
      if (output == static_cast<int>(I.outputs.size())) p.alias_input = input;
    I.outputs.push_back(p);
  }
  {
    mlir::OpBuilder b(ret);
    mlir::Block& body = fn.getBody().front();
    for (auto [i, r] : llvm::enumerate(ret.getOperands())) {
      const int input = I.outputs[i].alias_input;
      mlir::Value out;
      if (input >= 0) {
        out = donated_buffer(fn, input);
        arg_types[static_cast<size_t>(input)] = out.getType();
      } else {
        auto rt = llvm::cast<mlir::RankedTensorType>(r.getType());
        arg_types.push_back(mlir::MemRefType::get(rt.getShape(), rt.getElementType()));
        out = body.addArgument(arg_types.back(), ret.getLoc());
      }
      auto mat = mlir::bufferization::MaterializeInDestinationOp::create(b, ret.getLoc(), r, out);
      mat.setRestrict(true);
      mat.setWritable(true);
    }
    mlir::func::ReturnOp::create(b, ret.getLoc());
    ret.erase();
    fn.setType(mlir::FunctionType::get(&ctx, arg_types, {}));
    fn->setAttr("llvm.emit_c_interface", mlir::UnitAttr::get(&ctx));
  }
  I.stats.lower_ms = lap();

  // 3. Bufferize (kernels write the caller's buffers), loops. The inputs are the caller's
  // tensors: an op that updates its operand in place (index_add's loops) gets a copy of one.
  for (auto [i, arg] : llvm::enumerate(fn.getArguments()))
    if (llvm::isa<mlir::TensorType>(arg.getType()))
      fn.setArgAttr(static_cast<unsigned>(i), "bufferization.writable",
                    mlir::BoolAttr::get(&ctx, false));
  I.run_pipeline(m,
                 "eliminate-empty-tensors,one-shot-bufferize{bufferize-function-boundaries "
                 "function-boundary-type-conversion=identity-layout-map},"
                 "buffer-deallocation-pipeline,kiln-extern-calls",
                 "bufferization");
  forward_output_copies(fn);
  if (I.device.is_cuda()) {
    const bool row_separable = I.row_split.splittable && !I.row_split.gemm;
    I.row_split = RowSplitPlan{};  // run() launches kernels; their threads are the parallelism
    GpuLowered gpu;
    lower_for_gpu(m, I.gpu, row_separable, relaxed_inputs(m, graph_shapes), I.messages, gpu);
    I.ptx = std::move(gpu.ptx);
    I.gpu_kernels = gpu.kernels;
    I.gpu_kernel_ops = std::move(gpu.kernel_ops);
    I.cuda_device = I.device.index;
    I.stats.bufferize_ms = lap();
    log_module("GPU kernels (PTX) and host code in the LLVM dialect", m);
    return emit_object(m, I.messages, I.stats);
  }
  // A memref.copy from/to a non-contiguous view (a graph output that is a prefix slice of an
  // input: tensor.extract_slice -> memref.subview) would lower to a call of MLIR's runtime
  // `memrefCopy`, which the JIT does not provide: copy with loops instead. (Contiguous ones
  // become memcpy, the test MemRefToLLVM makes.)
  m.walk([&](mlir::memref::CopyOp copy) {
    auto contiguous = [](mlir::Value v) {
      auto t = llvm::dyn_cast<mlir::MemRefType>(v.getType());
      return t && (t.getLayout().isIdentity() || mlir::memref::isStaticShapeAndContiguousRowMajor(t));
    };
    if (contiguous(copy.getSource()) && contiguous(copy.getTarget())) return;
    mlir::OpBuilder b(copy);
    mlir::linalg::CopyOp::create(b, copy.getLoc(), copy.getSource(), copy.getTarget());
    copy.erase();
  });
  // Output buffers are fresh tensors (run) or ones checked apart from the inputs and each other
  // (run_into): nothing else reaches their memory, which tells LLVM and the row fusion
  // (row_fusion.h) that stores to them leave every other buffer as it was.
  for (unsigned i = static_cast<unsigned>(I.inputs.size()); i < fn.getNumArguments(); ++i)
    fn.setArgAttr(i, "llvm.noalias", mlir::UnitAttr::get(&ctx));
  if (I.emulate_gpu_loops != GpuLoopEmulation::Off) {
    const bool row_separable = I.row_split.splittable && !I.row_split.gemm;
    I.row_split = RowSplitPlan{};  // one call over all rows, as one launch
    gpu_parallel_loops(m, I.gpu, row_separable, relaxed_inputs(m, graph_shapes),
                       /*for_device=*/false, I.messages);
    if (I.emulate_gpu_loops == GpuLoopEmulation::Reversed) reverse_parallel_loops(m);
  } else if (I.row_split.splittable) {
    // run() splits the rows into blocks; within a block the nests run row by row.
    I.run_pipeline(m, "func.func(convert-linalg-to-parallel-loops),canonicalize,cse", "loops");
    I.row_split.per_row =
        cpu_row_loops(m.lookupSymbol<mlir::func::FuncOp>("main"), /*verify=*/I.row_split.gemm);
    I.run_pipeline(m, "func.func(scf-parallel-for-to-nested-fors)", "row loops");
  } else {
    // Each loop nest shared out over the thread pool (cpu_parallel.h).
    I.run_pipeline(m, "func.func(convert-linalg-to-parallel-loops)", "loops");
    tile_transposed_reads(m.lookupSymbol<mlir::func::FuncOp>("main"));
    if (I.profile_kernels)  // first: it names each nest by its loops' extents
      I.profiled_kernels = instrument_kernels(m.lookupSymbol<mlir::func::FuncOp>("main"));
    block_float64_sums(m.lookupSymbol<mlir::func::FuncOp>("main"));
    prepare_parallel_loops(m);
    I.run_pipeline(m, "convert-scf-to-openmp", "parallel loops");
    hoist_tile_buffers(m);
    finish_parallel_loops(m);
  }
  // 4. tanh/exp/erf/... as polynomials (arith + fma) instead of scalar libm calls.
  {
    mlir::RewritePatternSet patterns(&ctx);
    mlir::populateMathPolynomialApproximationPatterns(patterns);
    if (mlir::failed(mlir::applyPatternsGreedily(m, std::move(patterns))))
      throw Error("codegen::Executable: math approximation", I.messages);
  }
  outline_serial_loop_nests(m);  // for code generation in parts (codegen/jit.h)
  I.stats.bufferize_ms = lap();
  log_module("bufferized", m);
  // MLIR 22's expand-strided-metadata segfaults on a memref.expand_shape that splits one dim
  // into two or more dynamic dims (e.g. memref<?x4xf32> into memref<?x?x4xf32>; found by the
  // fuzzer: a GEMM over collapsed [?, ?, ...] batch dims). Refuse such graphs: the tracer then
  // compiles the region for its traced shapes or runs it on eager kernels.
  bool splits_dynamic = false;  // (not thrown inside walk: MLIR is built without exceptions)
  m.walk([&](mlir::memref::ExpandShapeOp e) {
    auto type = e.getResultType();
    for (const auto& group : e.getReassociationIndices()) {
      int dynamic = 0;
      for (int64_t d : group) dynamic += type.isDynamicDim(d);
      splits_dynamic |= dynamic > 1;
    }
  });
  if (splits_dynamic)
    throw Error("codegen::Executable",
                "an expand_shape into several dynamic dims is not supported (MLIR 22's "
                "expand-strided-metadata crashes on it)");
  // 5. LLVM dialect.
  I.run_pipeline(m,
                 "convert-scf-to-cf,expand-strided-metadata,lower-affine,"
                 "finalize-memref-to-llvm{use-aligned-alloc=true},convert-to-llvm,"
                 "reconcile-unrealized-casts",
                 "conversion to LLVM");
  // An scf.for's `llvm.loop_annotation` (column_fusion.cpp) reaches its back edge's branch as a
  // discardable attribute, which translation to LLVM IR ignores: make it the branch's own.
  m.walk([](mlir::LLVM::BrOp br) {
    if (auto a = br->getAttrOfType<mlir::LLVM::LoopAnnotationAttr>("llvm.loop_annotation")) {
      br.setLoopAnnotationAttr(a);
      br->removeAttr("llvm.loop_annotation");
    }
  });

  I.stats.llvm_dialect_ms = lap();
  log_module("LLVM dialect", m);

  // 6. LLVM -O2 for the host CPU, to an object file; get_or_compile() JIT-links it.
  return emit_object(m, I.messages, I.stats);
}

Executable::~Executable() = default;
Executable::Executable(Executable&&) noexcept = default;
Executable& Executable::operator=(Executable&&) noexcept = default;

int Executable::num_kernels() const {
  if (impl_->device.is_cuda()) return impl_->gpu_kernels;
  return impl_->row_split.splittable ? std::min(impl_->kernels, 1) : impl_->kernels;
}
const std::string& Executable::ptx() const { return impl_->ptx; }
Device Executable::device() const { return impl_->device; }
std::vector<std::string> Executable::kernel_descriptions() const {
  const Impl& I = *impl_;
  if (!I.device.is_cuda()) return I.profiled_kernels;
  std::vector<std::string> out;
  for (const auto& [kernel, ops] : I.gpu_kernel_ops) out.push_back(kernel + ": " + ops);
  return out;
}
std::vector<KernelTime> Executable::kernel_times() const {
  const Impl& I = *impl_;
  std::vector<KernelTime> times;
  for (size_t k = 0; k < I.profiled_kernels.size(); ++k)
    times.push_back({I.profiled_kernels[k],
                     I.kernel_counters[k].calls.load(std::memory_order_relaxed),
                     I.kernel_counters[k].ns.load(std::memory_order_relaxed) / 1e6});
  return times;
}
int Executable::num_loop_nests() const { return impl_->kernels; }
bool Executable::row_parallel() const { return impl_->row_split.splittable; }
const std::string& Executable::linalg_ir() const { return impl_->linalg; }
const CompileStats& Executable::stats() const { return impl_->stats; }

int Executable::output_alias(int k) const {
  return k >= 0 && k < static_cast<int>(impl_->outputs.size()) ? impl_->outputs[k].alias_input : -1;
}

std::vector<Tensor> Executable::run(const std::vector<Tensor>& inputs) const {
  KILN_CHECK(injected_fault() != InjectedFault::RunError, "codegen::Executable::run",
             Loc::current(), "injected fault (inject_fault_for_testing)");
  std::vector<Tensor> copies;
  const std::vector<Tensor>* checked = &checked_inputs(inputs, copies);
  // The code writes a donated input while reading the others: one whose memory another input
  // shares is replaced by a copy (the in-place analysis took the inputs to be distinct buffers).
  if (impl_->any_alias) {
    std::vector<std::pair<const StorageImpl*, size_t>> storages;
    storages.reserve(checked->size());
    for (size_t i = 0; i < checked->size(); ++i)
      storages.push_back({(*checked)[i].storage().get(), i});
    std::sort(storages.begin(), storages.end());
    std::vector<bool> shared(checked->size(), false);
    for (size_t a = 0; a + 1 < storages.size(); ++a)
      if (storages[a].first == storages[a + 1].first)
        shared[storages[a].second] = shared[storages[a + 1].second] = true;
    for (const Param& p : impl_->outputs) {
      const size_t j = static_cast<size_t>(p.alias_input);
      if (p.alias_input < 0 || !shared[j]) continue;
      if (checked != &copies) copies = *checked;
      copies[j] = copies[j].clone();
      checked = &copies;
    }
  }
  const std::vector<Tensor>& ins = *checked;
  std::vector<Tensor> outs, written;
  outs.reserve(impl_->outputs.size());
  for (const Param& p : impl_->outputs) {
    Shape shape = Shape::filled(static_cast<int>(p.shape.size()), 0);
    for (size_t j = 0; j < p.shape.size(); ++j) {
      const int k = static_cast<int>(j);
      if (p.shape[j] != ir::kDynamic) {
        shape[k] = p.shape[j];
        continue;
      }
      shape[k] = p.dyn_src[j].evaluate(ins);
    }
    if (p.alias_input < 0) {
      outs.push_back(dispatch::empty(shape, p.dtype, impl_->device));
      written.push_back(outs.back());
      continue;
    }
    const Tensor& in = ins[static_cast<size_t>(p.alias_input)];
    if (in.shape() != shape)  // equal types in the graph; an internal error if it happens
      throw Error("codegen::Executable::run",
                  fmt::format("output {} is computed in input {}, of shape {}, but has shape {}",
                              outs.size(), p.alias_input, to_string(in.shape()),
                              to_string(shape)));
    outs.push_back(in);
  }
  launch(ins, written);
  for (const Param& p : impl_->outputs)
    if (p.alias_input >= 0) ins[static_cast<size_t>(p.alias_input)].bump_version();
  return outs;
}

void Executable::run_into(const std::vector<Tensor>& inputs,
                          const std::vector<Tensor>& outputs) const {
  const Impl& I = *impl_;
  const char* where = "codegen::Executable::run_into";
  std::vector<Tensor> copies;
  const std::vector<Tensor>& ins = checked_inputs(inputs, copies);
  if (outputs.size() != I.outputs.size())
    throw Error(where, fmt::format("expected {} outputs, got {}", I.outputs.size(), outputs.size()));
  for (size_t i = 0; i < outputs.size(); ++i) {
    const Tensor& t = outputs[i];
    const Param& p = I.outputs[i];
    bool ok = t.dtype() == p.dtype && t.device() == I.device && t.is_contiguous() &&
              static_cast<size_t>(t.dim()) == p.shape.size();
    for (size_t j = 0; ok && j < p.shape.size(); ++j) {
      int64_t want = p.shape[j] != ir::kDynamic ? p.shape[j] : p.dyn_src[j].evaluate(ins);
      ok = t.shape()[static_cast<int>(j)] == want;
    }
    if (!ok)
      throw Error(where, fmt::format("output {}: expected a contiguous {} tensor on {} of the "
                                     "graph's shape, got {} {} on {}",
                                     i, name(p.dtype), I.device.str(), name(t.dtype()),
                                     to_string(t.shape()), t.device().str()));
    // Outputs are written while inputs are read: they must not share memory (the code is
    // compiled for buffers that nothing else reaches).
    for (const Tensor& in : ins)
      if (in.storage() == t.storage())
        throw Error(where, fmt::format("output {} shares memory with an input", i));
    for (size_t j = 0; j < i; ++j) {  // contiguous: elements [offset, offset + numel)
      const Tensor& u = outputs[j];
      if (u.storage() == t.storage() && u.offset() < t.offset() + t.numel() &&
          t.offset() < u.offset() + u.numel())
        throw Error(where, fmt::format("outputs {} and {} share memory", j, i));
    }
  }
  for (const Param& p : I.outputs)
    if (p.alias_input >= 0) {  // computed in its input's buffer, then copied to the caller's
      std::vector<Tensor> results = run(inputs);
      for (size_t i = 0; i < outputs.size(); ++i) Tensor(outputs[i]).copy_(results[i]);
      return;
    }
  launch(ins, outputs);
}

const std::vector<Tensor>& Executable::checked_inputs(const std::vector<Tensor>& inputs,
                                                      std::vector<Tensor>& copies) const {
  const Impl& I = *impl_;
  const char* where = "codegen::Executable::run";
  if (I.device.is_cuda() && !cuda_available())
    throw Error(where, "no CUDA device: " + cuda::unavailable_reason() + " (the code for " +
                           I.device.str() + " was generated but cannot run here)");
  if (inputs.size() != I.inputs.size())
    throw Error(where, "expected " + std::to_string(I.inputs.size()) + " inputs, got " +
                           std::to_string(inputs.size()));
  bool strided = false;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& t = inputs[i];
    const Param& p = I.inputs[i];
    if (t.dtype() != p.dtype)
      throw Error(where, "input " + std::to_string(i) + ": expected dtype " +
                             std::string(name(p.dtype)) + ", got " + std::string(name(t.dtype())));
    bool ok = static_cast<size_t>(t.shape().size()) == p.shape.size();
    for (size_t j = 0; ok && j < p.shape.size(); ++j)
      ok = p.shape[j] == ir::kDynamic || p.shape[j] == t.shape()[static_cast<int>(j)];
    if (!ok) throw Error(where, "input " + std::to_string(i) + ": shape does not match the graph");
    if (t.device() != I.device)
      throw Error(where, fmt::format("input {} is on {}, the code was compiled for {}", i,
                                     t.device().str(), I.device.str()));
    strided = strided || !t.is_contiguous();
  }
  if (I.shape_check) I.shape_check->check(inputs, where);
  if (!strided) return inputs;
  copies.clear();
  copies.reserve(inputs.size());
  for (const Tensor& t : inputs) copies.push_back(t.is_contiguous() ? t : t.contiguous());
  return copies;
}

void Executable::launch(const std::vector<Tensor>& ins, const std::vector<Tensor>& outs) const {
  const Impl& I = *impl_;
  std::optional<KernelProfileScope> timers;  // kernels of graphs that run on this thread only
  if (I.kernel_counters) timers.emplace(I.kernel_counters.get());
  std::vector<const Tensor*> operands;
  operands.reserve(ins.size() + outs.size());
  for (const Tensor& t : ins) operands.push_back(&t);
  for (const Tensor& t : outs) operands.push_back(&t);
  // The descriptors of all operands go in one buffer, not one allocation per operand (the
  // digits MLP step's region has dozens of operands and runs in ~100 us).
  size_t words = 0;
  for (const Tensor* t : operands) words += 3 + 2 * static_cast<size_t>(t->dim());
  // An intermediate buffer the code could not allocate (it returned early; outputs unfinished).
  std::atomic<size_t> failed_bytes{0};
  // Rows [lo, hi) of the sliced operands; the others whole.
  auto call = [&](int64_t lo, int64_t hi, const std::vector<bool>& sliced) {
    // Kept per thread: a few KiB, past glibc's per-thread cache, allocated on every call
    // otherwise. The entry never launches another Executable on this thread.
    thread_local std::vector<int64_t> descs;
    thread_local std::vector<void*> ptrs;
    descs.clear();
    descs.reserve(words);  // never reallocated below: the pointers into it stay valid
    // ptrs[i] points at operand i's descriptor, ptrs[n + i] at ptrs[i] (the entry's arguments).
    const size_t n = operands.size();
    ptrs.assign(2 * n, nullptr);
    for (size_t i = 0; i < n; ++i) {
      const Tensor& t = *operands[i];
      ptrs[i] = descs.data() + descs.size();
      ptrs[n + i] = &ptrs[i];
      if (!sliced[i]) {
        append_descriptor(descs, t.raw_data(), t.shape());
        continue;
      }
      Shape block = t.shape();
      int64_t row_bytes = t.shape()[0] ? t.numel() / t.shape()[0] * static_cast<int64_t>(itemsize(t.dtype())) : 0;
      block[0] = hi - lo;
      append_descriptor(descs, static_cast<char*>(t.raw_data()) + lo * row_bytes, block);
    }
    AllocationFailureScope allocations;
    I.entry(ptrs.data() + n);
    if (size_t bytes = allocations.failed_bytes())
      failed_bytes.store(bytes, std::memory_order_relaxed);
  };
  if (I.device.is_cuda()) cuda_start_run(I.device);
  std::vector<bool> sliced(operands.size(), false);
  int64_t rows = 0, row_bytes = 0;
  if (I.row_split.splittable) {
    for (size_t i = 0; i < operands.size(); ++i)
      sliced[i] = i >= ins.size() || I.row_split.sliced_input[i];
    // The first sliced operand's rows (outputs are sliced; all of them may be computed in
    // their inputs' buffers, leaving none).
    rows = -1;
    for (size_t i = 0; i < operands.size() && rows < 0; ++i)
      if (sliced[i]) rows = operands[i]->shape()[0];
    rows = std::max<int64_t>(rows, 0);
    for (size_t i = 0; i < operands.size(); ++i) {
      if (!sliced[i]) continue;
      const Tensor& t = *operands[i];
      if (t.shape()[0] != rows) rows = 0;  // unequal leading dims: run whole
      else if (rows) row_bytes += t.numel() / rows * static_cast<int64_t>(itemsize(t.dtype()));
    }
  }
  // Read once: every GEMM of this run rounds its inputs alike (runtime.h, GemmRunScope).
  const MatmulPrecision precision = float32_matmul_precision();
  if (rows < 2 || rows * row_bytes < kParallelMinBytes) {
    GemmRunScope gemm_run(precision, 1.0);
    call(0, rows, std::vector<bool>(operands.size(), false));
  } else {
    int64_t block_bytes =
        I.kernels > 1 && !I.row_split.per_row ? kBlockBytesMultiLoop : kBlockBytesOneLoop;
    int64_t block_rows = std::clamp<int64_t>(block_bytes / std::max<int64_t>(row_bytes, 1), 1, rows);
    // Large blocks still give every thread two, where that leaves them kParallelMinBytes / 4
    // (a 2 MiB softmax was one block, on one thread).
    const int64_t two_per_thread = (rows + 2 * cpu::num_threads() - 1) / (2 * cpu::num_threads());
    const int64_t min_rows = kParallelMinBytes / 4 / std::max<int64_t>(row_bytes, 1);
    block_rows = std::min(block_rows, std::max({two_per_thread, min_rows, int64_t{1}}));
    // A GEMM packs its right-hand side (the weight) on every call: small blocks repeat that
    // work (x [8, 128, 1024] @ W.t() + b in 8 blocks: 0.95x eager's time; one block per thread
    // 0.83x, two 0.86x). Two blocks per thread, so that a thread slowed by other jobs on the
    // machine does not hold the others up as long; the rows of a block still share the loop
    // nests around the GEMM.
    if (I.row_split.gemm) {
      int64_t blocks = 2 * std::max(1, cpu::num_threads());
      block_rows = std::max(block_rows, (rows + blocks - 1) / blocks);
    }
    int64_t blocks = (rows + block_rows - 1) / block_rows;
    cpu::parallel_for(0, blocks, 1, [&](int64_t b, int64_t e) {
      SerialGemmScope serial_gemm;  // the blocks are the parallelism (runtime.h)
      for (int64_t k = b; k < e; ++k) {
        const int64_t lo = k * block_rows, hi = std::min(rows, (k + 1) * block_rows);
        GemmRunScope gemm_run(precision, double(rows) / double(hi - lo));  // the whole product
        call(lo, hi, sliced);
      }
    });
  }
  if (I.device.is_cuda()) cuda_finish_run("codegen::Executable::run");
  if (size_t bytes = failed_bytes.load())
    throw Error("codegen::Executable::run",
                fmt::format("out of memory allocating {} bytes for an intermediate buffer of "
                            "the compiled code{}",
                            bytes, bytes > (size_t{1} << 20) ? fmt::format(" ({:.1f} MiB)",
                                                                           bytes / 1048576.0)
                                                             : ""));
  for (const Tensor& t : outs) t.bump_version();
}

}  // namespace kiln::codegen
