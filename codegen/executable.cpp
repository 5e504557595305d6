// codegen::Executable: kiln graph -> linalg (fused) -> destination-passing function -> one-shot
// bufferization -> loops -> LLVM dialect -> ExecutionEngine (LLVM -O3, host CPU).
// Pipeline and required registrations: /work/shared/notes/mlir22-toolchain.md, section 2.
#include <mutex>
#include <optional>

#include "codegen/codegen.h"
#include "codegen/lower.h"
#include "codegen/runtime.h"
#include "core/error.h"
#include "eager/dispatch.h"
#include "ir/dialect.h"
#include "llvm/ExecutionEngine/Orc/JITTargetMachineBuilder.h"
#include "llvm/Support/ErrorHandling.h"
#include "llvm/Support/TargetSelect.h"
#include "mlir/Conversion/ArithToLLVM/ArithToLLVM.h"
#include "mlir/Conversion/ControlFlowToLLVM/ControlFlowToLLVM.h"
#include "mlir/Conversion/FuncToLLVM/ConvertFuncToLLVM.h"
#include "mlir/Conversion/IndexToLLVM/IndexToLLVM.h"
#include "mlir/Conversion/MathToLLVM/MathToLLVM.h"
#include "mlir/Conversion/MemRefToLLVM/MemRefToLLVM.h"
#include "mlir/Conversion/Passes.h"
#include "mlir/Conversion/UBToLLVM/UBToLLVM.h"
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
#include "mlir/Dialect/MemRef/Transforms/Passes.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/SCF/Transforms/BufferizableOpInterfaceImpl.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "mlir/Dialect/Tensor/Transforms/BufferizableOpInterfaceImpl.h"
#include "mlir/Dialect/UB/IR/UBOps.h"
#include "mlir/ExecutionEngine/ExecutionEngine.h"
#include "mlir/ExecutionEngine/OptUtils.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Interfaces/DestinationStyleOpInterface.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Pass/PassRegistry.h"
#include "mlir/Target/LLVMIR/Dialect/Builtin/BuiltinToLLVMIRTranslation.h"
#include "mlir/Target/LLVMIR/Dialect/LLVMIR/LLVMToLLVMIRTranslation.h"
#include "mlir/Transforms/GreedyPatternRewriteDriver.h"
#include "mlir/Transforms/Passes.h"

namespace kiln::codegen {
namespace {

[[noreturn]] void fatal_handler(void*, const char* reason, bool) {
  throw Error("codegen (LLVM fatal error)", reason);
}

void init_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    llvm::InitializeNativeTarget();
    llvm::InitializeNativeTargetAsmPrinter();
    llvm::install_fatal_error_handler(fatal_handler, nullptr);
    mlir::registerTransformsPasses();
    mlir::registerConversionPasses();
    mlir::registerLinalgPasses();
    mlir::bufferization::registerBufferizationPasses();
    mlir::bufferization::registerBufferizationPipelines();
    mlir::memref::registerMemRefPasses();
    register_extern_calls_pass();
  });
}

void fill_registry(mlir::DialectRegistry& r) {
  r.insert<kiln::dialect::KilnDialect, mlir::affine::AffineDialect, mlir::arith::ArithDialect,
           mlir::bufferization::BufferizationDialect, mlir::cf::ControlFlowDialect,
           mlir::func::FuncDialect, mlir::index::IndexDialect, mlir::LLVM::LLVMDialect,
           mlir::linalg::LinalgDialect, mlir::math::MathDialect, mlir::memref::MemRefDialect,
           mlir::scf::SCFDialect, mlir::tensor::TensorDialect, mlir::ub::UBDialect>();
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
  mlir::registerBuiltinDialectTranslation(r);
  mlir::registerLLVMDialectTranslation(r);
}

DType to_dtype(mlir::Type t) {
  if (t.isF32()) return DType::Float32;
  if (t.isF64()) return DType::Float64;
  if (t.isInteger(1)) return DType::Bool;
  if (t.isInteger(32)) return DType::Int32;
  if (t.isInteger(64)) return DType::Int64;
  throw Error("codegen::Executable", "unsupported element type");
}

struct Param {
  DType dtype;
  std::vector<int64_t> shape;  // kDynamic for `?`
  std::vector<std::pair<int, int>> dyn_src;  // outputs: per dim, the (input, dim) giving a `?`
};

/// Which (function argument, dim) gives dynamic dim `d` of tensor `v`: follows destination-style
/// inits down to a tensor.empty whose size is a tensor.dim of an argument.
std::optional<std::pair<int, int>> dim_source(mlir::Value v, int64_t d) {
  for (int guard = 0; guard < 256; ++guard) {
    if (auto arg = llvm::dyn_cast<mlir::BlockArgument>(v))
      return std::make_pair(static_cast<int>(arg.getArgNumber()), static_cast<int>(d));
    mlir::Operation* op = v.getDefiningOp();
    if (auto dps = llvm::dyn_cast<mlir::DestinationStyleOpInterface>(op)) {
      v = dps.getTiedOpOperand(llvm::cast<mlir::OpResult>(v))->get();
      continue;
    }
    auto empty = llvm::dyn_cast<mlir::tensor::EmptyOp>(op);
    if (!empty) return std::nullopt;
    auto dim = empty.getDynamicSize(static_cast<unsigned>(d)).getDefiningOp<mlir::tensor::DimOp>();
    if (!dim) return std::nullopt;
    std::optional<int64_t> index = dim.getConstantIndex();
    if (!index) return std::nullopt;
    v = dim.getSource();
    d = *index;
  }
  return std::nullopt;
}

/// Memref descriptor of rank r as words: allocated, aligned, offset, sizes[r], strides[r].
std::vector<int64_t> descriptor(void* data, const Shape& shape) {
  size_t r = static_cast<size_t>(shape.size());
  std::vector<int64_t> d(3 + 2 * r);
  d[0] = d[1] = reinterpret_cast<int64_t>(data);
  d[2] = 0;
  int64_t stride = 1;
  for (size_t i = r; i-- > 0;) {
    d[3 + i] = shape[static_cast<int>(i)];
    d[3 + r + i] = stride;
    stride *= shape[static_cast<int>(i)];
  }
  return d;
}

}  // namespace

struct Executable::Impl {
  mlir::MLIRContext ctx;
  std::unique_ptr<mlir::ExecutionEngine> engine;
  std::vector<Param> inputs, outputs;
  int kernels = 0;
  std::string linalg;
  std::string messages;

  Impl() : ctx(mlir::MLIRContext::Threading::DISABLED) {}

  void run_pipeline(mlir::ModuleOp m, const std::string& pipeline, const char* stage) {
    mlir::PassManager pm = mlir::PassManager::on<mlir::ModuleOp>(&ctx);
    std::string err;
    llvm::raw_string_ostream es(err);
    if (mlir::failed(mlir::parsePassPipeline(pipeline, pm, es)))
      throw Error(std::string("codegen::Executable: ") + stage, "bad pipeline: " + err);
    if (mlir::failed(pm.run(m)))
      throw Error(std::string("codegen::Executable: ") + stage, messages);
  }
};

Executable::Executable(const ir::Graph& g) : impl_(std::make_unique<Impl>()) {
  init_once();
  Impl& I = *impl_;
  mlir::DialectRegistry registry;
  fill_registry(registry);
  I.ctx.appendDialectRegistry(registry);
  I.ctx.loadAllAvailableDialects();
  mlir::ScopedDiagnosticHandler handler(&I.ctx, [&](mlir::Diagnostic& d) {
    llvm::raw_string_ostream os(I.messages);
    os << d.getLocation() << ": " << d << "\n";
    return mlir::success();
  });
  mlir::OwningOpRef<mlir::ModuleOp> module =
      mlir::parseSourceString<mlir::ModuleOp>(g.to_mlir(), &I.ctx);
  if (!module) throw Error("codegen::Executable", "cannot parse the graph: " + I.messages);
  mlir::ModuleOp m = *module;

  // 1. kiln -> linalg on tensors, fused.
  {
    mlir::PassManager pm = mlir::PassManager::on<mlir::ModuleOp>(&I.ctx);
    pm.addPass(create_kiln_to_linalg_pass());
    pm.addPass(mlir::createCanonicalizerPass());
    pm.addPass(mlir::createLinalgElementwiseOpFusionPass());
    pm.addPass(mlir::createCSEPass());
    if (mlir::failed(pm.run(m))) throw Error("codegen::Executable: lowering", I.messages);
  }
  std::string unlowered;
  m.walk([&](mlir::Operation* op) {
    if (llvm::isa<kiln::dialect::KilnDialect>(op->getDialect()))
      unlowered += op->getName().getStringRef().str() + " ";
    if (llvm::isa<mlir::linalg::LinalgOp>(op)) ++I.kernels;
  });
  if (!unlowered.empty())
    throw Error("codegen::Executable", "no lowering yet for: " + unlowered);
  {
    llvm::raw_string_ostream os(I.linalg);
    m.print(os);
  }

  // 2. Destination-passing: @main(inputs..., out memrefs...) writes each result with
  // bufferization.materialize_in_destination and returns nothing.
  auto fn = m.lookupSymbol<mlir::func::FuncOp>("main");
  if (!fn) throw Error("codegen::Executable", "graph has no @main");
  for (mlir::Type t : fn.getArgumentTypes()) {
    auto rt = llvm::cast<mlir::RankedTensorType>(t);
    Param p{to_dtype(rt.getElementType()),
            std::vector<int64_t>(rt.getShape().begin(), rt.getShape().end()), {}};
    for (int64_t& d : p.shape)
      if (d == mlir::ShapedType::kDynamic) d = ir::kDynamic;
    I.inputs.push_back(p);
  }
  auto ret = llvm::cast<mlir::func::ReturnOp>(fn.getBody().front().getTerminator());
  llvm::SmallVector<mlir::Type> arg_types(fn.getArgumentTypes());
  for (mlir::Value r : ret.getOperands()) {
    auto rt = llvm::cast<mlir::RankedTensorType>(r.getType());
    Param p{to_dtype(rt.getElementType()),
            std::vector<int64_t>(rt.getShape().begin(), rt.getShape().end()), {}};
    p.dyn_src.assign(p.shape.size(), {-1, -1});
    for (size_t j = 0; j < p.shape.size(); ++j) {
      if (p.shape[j] != mlir::ShapedType::kDynamic) continue;
      p.shape[j] = ir::kDynamic;
      auto src = dim_source(r, static_cast<int64_t>(j));
      if (!src)
        throw Error("codegen::Executable",
                    "cannot tell a dynamic output dim from the inputs (not yet):\n" + I.linalg);
      p.dyn_src[j] = *src;
    }
    I.outputs.push_back(p);
    arg_types.push_back(mlir::MemRefType::get(rt.getShape(), rt.getElementType()));
  }
  {
    mlir::OpBuilder b(ret);
    mlir::Block& body = fn.getBody().front();
    for (auto [i, r] : llvm::enumerate(ret.getOperands())) {
      mlir::Value out = body.addArgument(arg_types[I.inputs.size() + i], ret.getLoc());
      auto mat = mlir::bufferization::MaterializeInDestinationOp::create(b, ret.getLoc(), r, out);
      mat.setRestrict(true);
      mat.setWritable(true);
    }
    mlir::func::ReturnOp::create(b, ret.getLoc());
    ret.erase();
    fn.setType(mlir::FunctionType::get(&I.ctx, arg_types, {}));
    fn->setAttr("llvm.emit_c_interface", mlir::UnitAttr::get(&I.ctx));
  }

  // 3. Bufferize (kernels write the caller's buffers), loops.
  I.run_pipeline(m,
                 "eliminate-empty-tensors,one-shot-bufferize{bufferize-function-boundaries "
                 "function-boundary-type-conversion=identity-layout-map},"
                 "buffer-deallocation-pipeline,kiln-extern-calls,func.func(convert-linalg-to-loops)",
                 "bufferization");
  // 4. tanh/exp/erf/... as polynomials (arith + fma) instead of scalar libm calls.
  {
    mlir::RewritePatternSet patterns(&I.ctx);
    mlir::populateMathPolynomialApproximationPatterns(patterns);
    if (mlir::failed(mlir::applyPatternsGreedily(m, std::move(patterns))))
      throw Error("codegen::Executable: math approximation", I.messages);
  }
  // 5. LLVM dialect.
  I.run_pipeline(m,
                 "convert-scf-to-cf,expand-strided-metadata,lower-affine,convert-to-llvm,"
                 "reconcile-unrealized-casts",
                 "conversion to LLVM");

  // 6. JIT at -O3 for the host CPU.
  auto tmb = llvm::orc::JITTargetMachineBuilder::detectHost();
  if (!tmb) throw Error("codegen::Executable", llvm::toString(tmb.takeError()));
  tmb->setCodeGenOptLevel(llvm::CodeGenOptLevel::Aggressive);
  auto tm = tmb->createTargetMachine();
  if (!tm) throw Error("codegen::Executable", llvm::toString(tm.takeError()));
  mlir::ExecutionEngineOptions opts;
  // opts.transformer is a function_ref: the std::function must outlive create().
  std::function<llvm::Error(llvm::Module*)> transformer =
      mlir::makeOptimizingTransformer(3, 0, tm->get());
  opts.transformer = transformer;
  opts.jitCodeGenOptLevel = llvm::CodeGenOptLevel::Aggressive;
  auto engine = mlir::ExecutionEngine::create(m, opts, std::move(*tm));
  if (!engine)
    throw Error("codegen::Executable: JIT", llvm::toString(engine.takeError()) + "\n" + I.messages);
  I.engine = std::move(*engine);
  I.engine->registerSymbols([](llvm::orc::MangleAndInterner interner) {
    llvm::orc::SymbolMap map;
    for (const RuntimeSymbol& s : runtime_symbols())
      map[interner(s.name)] = {llvm::orc::ExecutorAddr::fromPtr(s.address),
                               llvm::JITSymbolFlags::Exported};
    return map;
  });
  // Generate machine code now (lazily done at the first lookup), so run() does not pay for it.
  auto fnptr = I.engine->lookupPacked("_mlir_ciface_main");
  if (!fnptr) throw Error("codegen::Executable: JIT", llvm::toString(fnptr.takeError()));
}

Executable::~Executable() = default;
Executable::Executable(Executable&&) noexcept = default;
Executable& Executable::operator=(Executable&&) noexcept = default;

int Executable::num_kernels() const { return impl_->kernels; }
const std::string& Executable::linalg_ir() const { return impl_->linalg; }

std::vector<Tensor> Executable::run(const std::vector<Tensor>& inputs) const {
  const Impl& I = *impl_;
  const char* where = "codegen::Executable::run";
  if (inputs.size() != I.inputs.size())
    throw Error(where, "expected " + std::to_string(I.inputs.size()) + " inputs, got " +
                           std::to_string(inputs.size()));
  std::vector<Tensor> ins;
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
    if (t.device() != Device::cpu()) throw Error(where, "inputs must be CPU tensors");
    ins.push_back(t.is_contiguous() ? t : t.contiguous());
  }
  std::vector<Tensor> outs;
  for (const Param& p : I.outputs) {
    std::vector<int64_t> shape(p.shape.size());
    for (size_t j = 0; j < p.shape.size(); ++j) {
      if (p.shape[j] != ir::kDynamic) {
        shape[j] = p.shape[j];
        continue;
      }
      auto [input, dim] = p.dyn_src[j];
      int64_t size = ins[static_cast<size_t>(input)].shape()[dim];
      shape[j] = size;
    }
    outs.push_back(dispatch::empty(Shape(shape), p.dtype));
  }
  std::vector<std::vector<int64_t>> descs;
  descs.reserve(ins.size() + outs.size());
  for (const Tensor& t : ins) descs.push_back(descriptor(t.raw_data(), t.shape()));
  for (const Tensor& t : outs) descs.push_back(descriptor(t.raw_data(), t.shape()));
  std::vector<void*> ptrs(descs.size());
  std::vector<void*> args(descs.size());
  for (size_t i = 0; i < descs.size(); ++i) {
    ptrs[i] = descs[i].data();
    args[i] = &ptrs[i];
  }
  if (llvm::Error e = I.engine->invokePacked("_mlir_ciface_main", args))
    throw Error(where, llvm::toString(std::move(e)));
  for (const Tensor& t : outs) t.bump_version();
  return outs;
}

}  // namespace kiln::codegen
