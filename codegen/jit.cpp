// Object emission and JIT loading for codegen::Executable (ORC LLJIT), plus KILN_LOGS.
// The cold path emits an object file itself, rather than letting a JIT compile IR, so that the
// same bytes can be cached on disk and a warm start only links them (codegen/cache.cpp).
#include "codegen/jit.h"

#include <cctype>
#include <algorithm>
#include <tuple>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>

#include <unistd.h>

#include "backends/cuda/driver.h"
#include "codegen/runtime.h"
#include "core/env.h"
#include "core/error.h"
#include "ir/graph_internal.h"
#include "llvm/IR/Verifier.h"
#include "llvm/Object/ELFObjectFile.h"
#include "llvm/ExecutionEngine/Orc/AbsoluteSymbols.h"
#include "llvm/ExecutionEngine/Orc/JITTargetMachineBuilder.h"
#include "llvm/ExecutionEngine/Orc/LLJIT.h"
#include "llvm/IR/Constants.h"
#include "llvm/IR/IRBuilder.h"
#include "llvm/IR/DiagnosticInfo.h"
#include "llvm/IR/DiagnosticPrinter.h"
#include "llvm/IR/LegacyPassManager.h"
#include "llvm/IR/Module.h"
#include "llvm/Support/ErrorHandling.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/TargetSelect.h"
#include "llvm/Support/raw_ostream.h"
#include "llvm/Target/TargetMachine.h"
#include "mlir/ExecutionEngine/OptUtils.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Pass/PassRegistry.h"
#include "mlir/Target/LLVMIR/Export.h"

extern "C" void mgpuSetDefaultDevice(int32_t device);  // backends/cuda/mlir_runtime.cpp

namespace kiln::codegen {
namespace {

constexpr const char* kEntry = "_mlir_ciface_main";
constexpr const char* kPackedEntry = "_mlir__mlir_ciface_main";  // ExecutionEngine's naming

/// The host's JIT target (machine code at CodeGenOptLevel::Aggressive); PIC + small code model as JITLink expects on ELF/x86-64.
const llvm::orc::JITTargetMachineBuilder& host_jtmb() {
  static const llvm::orc::JITTargetMachineBuilder jtmb = [] {
    init_llvm();
    auto b = llvm::orc::JITTargetMachineBuilder::detectHost();
    if (!b) throw Error("codegen::Executable", llvm::toString(b.takeError()));
    b->setCodeGenOptLevel(llvm::CodeGenOptLevel::Aggressive);
    b->setRelocationModel(llvm::Reloc::PIC_);
    b->setCodeModel(llvm::CodeModel::Small);
    return std::move(*b);
  }();
  return jtmb;
}

/// void _mlir__mlir_ciface_main(ptr args): loads each argument through args[i] and calls the
/// C interface, so run() can call any arity through one function pointer.
void add_packed_entry(llvm::Module& mod) {
  llvm::Function* f = mod.getFunction(kEntry);
  if (!f || !f->getReturnType()->isVoidTy())
    throw Error("codegen::Executable: JIT", "no destination-passing @main in the LLVM module");
  llvm::LLVMContext& ctx = mod.getContext();
  llvm::Type* ptr = llvm::PointerType::get(ctx, 0);
  auto* type = llvm::FunctionType::get(llvm::Type::getVoidTy(ctx), {ptr}, false);
  auto* wrapper =
      llvm::Function::Create(type, llvm::GlobalValue::ExternalLinkage, kPackedEntry, mod);
  llvm::IRBuilder<> b(llvm::BasicBlock::Create(ctx, "entry", wrapper));
  llvm::SmallVector<llvm::Value*> args;
  for (llvm::Argument& param : f->args()) {
    llvm::Value* slot = b.CreateConstGEP1_64(ptr, wrapper->getArg(0), param.getArgNo());
    args.push_back(b.CreateLoad(param.getType(), b.CreateLoad(ptr, slot)));
  }
  b.CreateCall(f, args);
  b.CreateRetVoid();
}

// Bits of LogStage: from KILN_LOGS (parsed once, on first use), then set_log_stages().
std::atomic<int> g_log_stages{0};
std::once_flag g_log_env_once;

int parse_log_stages(std::string_view s) {
  int bits = 0;
  while (!s.empty()) {
    size_t comma = s.find(',');
    std::string_view item = s.substr(0, comma);
    // White space around a name is ignored, as the tracer's parser does (tabs, newlines too).
    while (!item.empty() && std::isspace(static_cast<unsigned char>(item.front())))
      item.remove_prefix(1);
    while (!item.empty() && std::isspace(static_cast<unsigned char>(item.back())))
      item.remove_suffix(1);
    if (item == "ir") bits |= kLogIr;
    if (item == "codegen") bits |= kLogCodegen;
    if (comma == std::string_view::npos) break;
    s.remove_prefix(comma + 1);
  }
  return bits;
}

void read_log_env() {
  std::call_once(g_log_env_once, [] {
    const char* env = std::getenv("KILN_LOGS");
    g_log_stages.store(env ? parse_log_stages(env) : 0);
  });
}

}  // namespace

namespace {
std::atomic<int64_t> g_live_code{0};

/// Makes CUDA device `index` current for the calling thread, for the driver and for the mgpu*
/// runtime functions (backends/cuda/mlir_runtime.cpp), when CUDA is available.
void select_cuda_device(int index) {
  if (!cuda::is_available()) return;
  cuda::set_current_device(index);
  mgpuSetDefaultDevice(index);
}
std::atomic<int> g_fault{0};
}  // namespace

CompiledCode::CompiledCode() { g_live_code.fetch_add(1, std::memory_order_relaxed); }
CompiledCode::~CompiledCode() {
  if (fini) {  // before the JIT (and the code) goes
    select_cuda_device(meta.cuda_device);
    // Launches are asynchronous: the module's kernels may still be queued when it is unloaded.
    if (meta.cuda_device >= 0 && cuda::is_available()) {
      try {
        cuda::synchronize(meta.cuda_device);
      } catch (const Error&) {  // a fault of an earlier kernel: reported by the next sync
      }
    }
    fini();
    (void)take_cuda_runtime_error();  // an unload failure must not surface in an unrelated run
  }
  g_live_code.fetch_sub(1, std::memory_order_relaxed);
}

int64_t live_compiled_code_count() { return g_live_code.load(std::memory_order_relaxed); }

void inject_fault_for_testing(InjectedFault f) { g_fault.store(static_cast<int>(f)); }
InjectedFault injected_fault() { return static_cast<InjectedFault>(g_fault.load()); }

void init_llvm() {
  static std::once_flag once;
  std::call_once(once, [] {
    llvm::InitializeNativeTarget();
    llvm::InitializeNativeTargetAsmPrinter();
    ir::install_llvm_error_handler();  // report_fatal_error -> kiln::Error
  });
}

const std::string& host_target_id() {
  static const std::string id = [] {
    const llvm::orc::JITTargetMachineBuilder& b = host_jtmb();
    return b.getTargetTriple().str() + " " + b.getCPU() + " " + b.getFeatures().getString();
  }();
  return id;
}

namespace {

/// CUDA host code loads its PTX module in a static constructor and unloads it in a destructor
/// (llvm.global_ctors / global_dtors, from MLIR's gpu.binary translation). The JIT runs no
/// platform (and an object's .init_array would need one), so they become two exported
/// functions that load_object() and ~CompiledCode() call: kKilnInit and kKilnFini.
constexpr const char* kKilnInit = "kiln_static_init";
constexpr const char* kKilnFini = "kiln_static_fini";

void expose_static_initializers(llvm::Module& mod) {
  for (auto [array_name, fn_name] : {std::pair{"llvm.global_ctors", kKilnInit},
                                     std::pair{"llvm.global_dtors", kKilnFini}}) {
    llvm::GlobalVariable* array = mod.getGlobalVariable(array_name);
    if (!array) continue;
    std::vector<std::tuple<uint64_t, size_t, llvm::Function*>> fns;  // priority, position
    if (auto* init = llvm::dyn_cast_or_null<llvm::ConstantArray>(
            array->hasInitializer() ? array->getInitializer() : nullptr))
      for (llvm::Value* op : init->operands()) {
        auto* entry = llvm::cast<llvm::ConstantStruct>(op);
        auto* prio = llvm::cast<llvm::ConstantInt>(entry->getOperand(0));
        if (auto* f = llvm::dyn_cast<llvm::Function>(entry->getOperand(1)))
          fns.emplace_back(prio->getZExtValue(), fns.size(), f);
      }
    // Constructors by ascending priority, destructors by descending; equal ones in their order
    // (std::sort with the position: libstdc++'s stable_sort warns under clang 22).
    std::sort(fns.begin(), fns.end(), [&](auto& a, auto& b) {
      auto [pa, ia, fa] = a;
      auto [pb, ib, fb] = b;
      if (pa != pb) return array_name[11] == 'c' ? pa < pb : pa > pb;
      return ia < ib;
    });
    array->eraseFromParent();
    llvm::LLVMContext& ctx = mod.getContext();
    auto* type = llvm::FunctionType::get(llvm::Type::getVoidTy(ctx), false);
    auto* f = llvm::Function::Create(type, llvm::GlobalValue::ExternalLinkage, fn_name, mod);
    llvm::IRBuilder<> b(llvm::BasicBlock::Create(ctx, "entry", f));
    for (auto& [prio, position, callee] : fns) b.CreateCall(callee);
    b.CreateRetVoid();
  }
}

// -O2 and machine code for one module, with a target machine of its own (one per thread).
std::string optimize_and_emit(llvm::Module& mod, PartStats& stats) {
  Lap lap;
  llvm::orc::JITTargetMachineBuilder jtmb = host_jtmb();  // createTargetMachine() is non-const
  auto tm = jtmb.createTargetMachine();
  if (!tm) throw Error("codegen::Executable: JIT", llvm::toString(tm.takeError()));
  // -O2, not -O3: measured on the Transformer layer's forward + backward, -O3 made the first
  // compile 1.5x slower (more unrolling of every loop nest) for no measurable kernel speed-up
  // on the fusion benchmarks (streaming loops are memory bound).
  if (llvm::Error e = mlir::makeOptimizingTransformer(2, 0, tm->get())(&mod))
    throw Error("codegen::Executable: LLVM -O2", llvm::toString(std::move(e)));
  stats.opt_ms = lap();
  if (log_enabled(kLogCodegen)) {
    llvm::raw_string_ostream os(stats.ir_after_opt);
    mod.print(os, nullptr);
  }
  llvm::SmallVector<char, 0> object;
  llvm::raw_svector_ostream os(object);
  llvm::legacy::PassManager pm;
  if ((*tm)->addPassesToEmitFile(pm, os, nullptr, llvm::CodeGenFileType::ObjectFile))
    throw Error("codegen::Executable: JIT", "the host target cannot emit object files");
  pm.run(mod);
  stats.codegen_ms = lap();
  return std::string(object.begin(), object.end());
}

}  // namespace

void route_llvm_diagnostics(llvm::LLVMContext& ctx, std::string* errors) {
  ctx.setDiagnosticHandlerCallBack(
      [](const llvm::DiagnosticInfo* info, void* sink) {
        const llvm::DiagnosticSeverity severity = info->getSeverity();
        if (severity != llvm::DS_Error && severity != llvm::DS_Warning) return;
        std::string text;
        llvm::raw_string_ostream os(text);
        llvm::DiagnosticPrinterRawOStream printer(os);
        info->print(printer);
        if (severity == llvm::DS_Error)
          *static_cast<std::string*>(sink) += text + "\n";
        else if (log_enabled(kLogCodegen))
          log_text("LLVM diagnostic", text + "\n");
      },
      errors);
}

void throw_llvm_errors(const std::string& errors, std::string_view stage) {
  if (!errors.empty())
    throw Error("codegen::Executable: " + std::string(stage), "LLVM reported: " + errors);
}

std::string emit_object(mlir::ModuleOp m, const std::string& diagnostics, CompileStats& stats) {
  Lap lap;
  llvm::orc::JITTargetMachineBuilder jtmb = host_jtmb();  // createTargetMachine() is non-const
  auto tm = jtmb.createTargetMachine();
  if (!tm) throw Error("codegen::Executable: JIT", llvm::toString(tm.takeError()));
  std::string llvm_errors;
  llvm::LLVMContext ctx;
  route_llvm_diagnostics(ctx, &llvm_errors);
  std::unique_ptr<llvm::Module> mod = mlir::translateModuleToLLVMIR(m, ctx);
  throw_llvm_errors(llvm_errors, "translation to LLVM IR");
  if (!mod) throw Error("codegen::Executable: translation to LLVM IR", diagnostics);
  mod->setDataLayout((*tm)->createDataLayout());
  mod->setTargetTriple((*tm)->getTargetTriple());
  add_packed_entry(*mod);
  expose_static_initializers(*mod);
  return_on_failed_allocations(*mod);
  if (injected_fault() == InjectedFault::LlvmFatalError)
    llvm::report_fatal_error("injected (kiln test)");
  if (injected_fault() == InjectedFault::InvalidLlvmIr) {  // a block without a terminator
    auto* type = llvm::FunctionType::get(llvm::Type::getVoidTy(ctx), false);
    auto* bad = llvm::Function::Create(type, llvm::GlobalValue::ExternalLinkage, "kiln_bad", *mod);
    llvm::BasicBlock::Create(ctx, "entry", bad);
  }
  // Broken IR would crash (not throw in) the optimiser or the backend: check it first.
  {
    std::string problems;
    llvm::raw_string_ostream vos(problems);
    if (llvm::verifyModule(*mod, &vos))
      throw Error("codegen::Executable: invalid LLVM IR", vos.str() + diagnostics);
  }
  // The loop vectorizer prefers 256-bit vectors on these CPUs; kernels here are long
  // streaming loops, where full AVX-512 width does not cost frequency that matters. Short
  // rows (a classifier's 10 logits) get masked vectors (loop_hints.cpp).
  if ((*tm)->getTargetFeatureString().contains("+avx512f")) {
    for (llvm::Function& f : *mod) f.addFnAttr("prefer-vector-width", "512");
    hint_short_loops(*mod, 16);
  }
  stats.llvm_opt_ms = lap();  // translation; -O2 is added below
  std::vector<std::string> objects;
  std::vector<PartStats> parts;
  if (unsigned n = object_parts_for(*mod); n > 1) {
    objects = emit_in_parts(*mod, n, optimize_and_emit, parts);
  } else {
    objects.push_back(optimize_and_emit(*mod, parts.emplace_back()));
    throw_llvm_errors(llvm_errors, "LLVM -O2 and code generation");
  }
  // Parts run side by side: the slowest one is the wall time.
  double opt = 0;
  std::string ir;
  for (size_t i = 0; i < parts.size(); ++i) {
    opt = std::max(opt, parts[i].opt_ms);
    if (parts.size() > 1) ir += "; ----- part " + std::to_string(i + 1) + " -----\n";
    ir += parts[i].ir_after_opt;
  }
  if (log_enabled(kLogCodegen)) log_text("LLVM IR after -O2", ir);
  const double wall = lap();
  stats.llvm_opt_ms += opt;
  stats.codegen_ms = wall - opt;  // code generation, the split and the threads included
  return bundle_objects(objects);
}

namespace {

/// KILN_PERF_MAP=1: appends the loaded code's functions (outlined parallel loops included) to
/// /tmp/perf-<pid>.map, which `perf report` reads to name JIT-compiled code. Each object's
/// functions are in its one .text section: its base address comes from one of its global
/// functions, looked up in the JIT.
void write_perf_map(const std::vector<std::string_view>& objects, llvm::orc::LLJIT& jit) {
  static const bool enabled = env_flag("KILN_PERF_MAP");
  if (!enabled) return;
  struct Fn { std::string name; uint64_t address, size; };
  std::vector<Fn> fns;
  for (std::string_view bytes : objects) {
    auto obj = llvm::object::ObjectFile::createObjectFile(
        llvm::MemoryBufferRef(llvm::StringRef(bytes.data(), bytes.size()), "kiln"));
    if (!obj) {
      llvm::consumeError(obj.takeError());
      continue;
    }
    std::vector<Fn> own;
    int64_t base = 0;
    bool found = false;
    for (const llvm::object::SymbolRef& sym : (*obj)->symbols()) {
      auto type = sym.getType();
      auto name = sym.getName();
      auto value = sym.getValue();
      auto flags = sym.getFlags();
      if (!type || !name || !value || !flags) {
        if (!type) llvm::consumeError(type.takeError());
        if (!name) llvm::consumeError(name.takeError());
        if (!value) llvm::consumeError(value.takeError());
        if (!flags) llvm::consumeError(flags.takeError());
        continue;
      }
      if (*type != llvm::object::SymbolRef::ST_Function) continue;
      own.push_back({name->str(), *value, llvm::object::ELFSymbolRef(sym).getSize()});
      if (!found && (*flags & llvm::object::SymbolRef::SF_Global)) {
        auto address = jit.lookup(*name);
        if (!address) {
          llvm::consumeError(address.takeError());
          continue;
        }
        base = static_cast<int64_t>(address->getValue()) - static_cast<int64_t>(*value);
        found = true;
      }
    }
    if (!found) continue;
    for (Fn& fn : own) fn.address += static_cast<uint64_t>(base);
    fns.insert(fns.end(), own.begin(), own.end());
  }
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  std::string path = "/tmp/perf-" + std::to_string(getpid()) + ".map";
  if (FILE* f = std::fopen(path.c_str(), "a")) {
    for (const Fn& fn : fns)
      std::fprintf(f, "%llx %llx kiln:%s\n", static_cast<unsigned long long>(fn.address),
                   static_cast<unsigned long long>(fn.size), fn.name.c_str());
    std::fclose(f);
  }
}

}  // namespace

std::shared_ptr<const CompiledCode> load_object(const std::string& object, CompiledMeta meta,
                                                CompileStats& stats) {
  Lap lap;
  const char* where = "codegen::Executable: JIT";
  // No platform: the object has no static initialisers, and setting one up costs time.
  auto jit = llvm::orc::LLJITBuilder()
                 .setJITTargetMachineBuilder(host_jtmb())
                 .setPlatformSetUp(llvm::orc::setUpInactivePlatform)
                 .create();
  if (!jit) throw Error(where, llvm::toString(jit.takeError()));
  llvm::orc::SymbolMap runtime;
  for (const RuntimeSymbol& s : runtime_symbols())
    runtime[(*jit)->mangleAndIntern(s.name)] = {llvm::orc::ExecutorAddr::fromPtr(s.address),
                                                llvm::JITSymbolFlags::Exported};
  if (!runtime.empty())
    if (llvm::Error e = (*jit)->getMainJITDylib().define(llvm::orc::absoluteSymbols(runtime)))
      throw Error(where, llvm::toString(std::move(e)));
  const std::vector<std::string_view> parts = unbundle_objects(object);
  for (std::string_view part : parts)
    if (llvm::Error e = (*jit)->addObjectFile(llvm::MemoryBuffer::getMemBufferCopy(
            llvm::StringRef(part.data(), part.size()), "kiln")))
      throw Error(where, llvm::toString(std::move(e)));
  auto entry = (*jit)->lookup(kPackedEntry);  // links now, so run() does not pay for it
  if (!entry) throw Error(where, llvm::toString(entry.takeError()));
  auto code = std::make_shared<CompiledCode>();
  code->meta = std::move(meta);
  code->fn = entry->toPtr<PackedFn>();
  write_perf_map(parts, **jit);
  // Static initialisers (CUDA code: loading its PTX module), see expose_static_initializers.
  // Without a CUDA device, CUDA code is linked but not initialised (it cannot run).
  const bool can_init = code->meta.ptx.empty() || cuda::is_available();
  if (auto init = (*jit)->lookup(kKilnInit); init && can_init) {
    select_cuda_device(code->meta.cuda_device);  // the module loads into this device's context
    init->toPtr<void (*)()>()();
    if (std::optional<Error> e = take_cuda_runtime_error())  // e.g. PTX the driver rejects
      throw Error(where, std::string("loading the CUDA kernels: ") + e->what());
    if (auto fini = (*jit)->lookup(kKilnFini)) code->fini = fini->toPtr<void (*)()>();
    else llvm::consumeError(fini.takeError());
  } else if (!init) {
    llvm::consumeError(init.takeError());
  }
  code->object_bytes = object.size();
  code->object_parts = static_cast<int>(parts.size());
  code->jit = std::move(*jit);
  stats.link_ms = lap();
  stats.object_bytes = object.size();
  stats.object_parts = code->object_parts;
  return code;
}

bool log_enabled(LogStage stage) {
  read_log_env();
  return (g_log_stages.load(std::memory_order_relaxed) & stage) != 0;
}

void log_text(std::string_view stage, std::string_view text) {
  std::string out = "// ----- kiln codegen: " + std::string(stage) + " -----\n";
  out += text;
  if (!out.empty() && out.back() != '\n') out += '\n';
  std::fwrite(out.data(), 1, out.size(), stderr);
}

void log_module(std::string_view stage, mlir::ModuleOp m) {
  if (!log_enabled(kLogIr)) return;
  std::string text;
  llvm::raw_string_ostream os(text);
  m.print(os);
  log_text(stage, text);
}

void run_pass_pipeline(mlir::ModuleOp m, const std::string& pipeline, std::string_view stage,
                       const std::string& diagnostics) {
  mlir::PassManager pm = mlir::PassManager::on<mlir::ModuleOp>(m.getContext());
  std::string err;
  llvm::raw_string_ostream es(err);
  const std::string where = "codegen::Executable: " + std::string(stage);
  if (mlir::failed(mlir::parsePassPipeline(pipeline, pm, es)))
    throw Error(where, "bad pipeline: " + err);
  if (mlir::failed(pm.run(m))) throw Error(where, diagnostics);
}

void set_log_stages(std::string_view stages) {
  read_log_env();
  g_log_stages.store(parse_log_stages(stages));
}

}  // namespace kiln::codegen
