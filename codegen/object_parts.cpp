// A large module's -O2 and machine-code emission split across threads (codegen/jit.h), and the
// bundle that keeps the parts' objects in one string for the compile cache.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <exception>
#include <system_error>
#include <thread>

#include "codegen/jit.h"
#include "core/error.h"
#include "llvm/Bitcode/BitcodeReader.h"
#include "llvm/Bitcode/BitcodeWriter.h"
#include "llvm/IR/LLVMContext.h"
#include "llvm/IR/Module.h"
#include "llvm/Object/ELFObjectFile.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/raw_ostream.h"
#include "llvm/Transforms/Utils/SplitModule.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/SCF/Utils/Utils.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/PatternMatch.h"

namespace kiln::codegen {
namespace {

// A bundle: the magic, the part count (uint32), each part's size (uint64), then the parts.
// A single object is stored as itself (an ELF file starts with "\x7f" "ELF").
constexpr char kBundleMagic[8] = {'K', 'I', 'L', 'N', 'O', 'B', 'J', 'S'};

template <class T> void put(std::string& out, T v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof v);
}

/// SplitModule gives the locals that parts share hidden visibility, and a hidden declaration is
/// reached with a 32-bit PC-relative address. The JIT loads each part at an address of its own,
/// which may lie more than 2 GiB from the others (it did under ASan: "out of range of Delta32
/// fixup"), so every declaration is made preemptible: the part reaches it through its own GOT
/// entry or call stub, which the JIT linker places next to the part.
void reach_other_parts_indirectly(llvm::Module& part) {
  for (llvm::GlobalValue& gv : part.global_values()) {
    if (!gv.isDeclaration() || gv.hasLocalLinkage()) continue;
    gv.setVisibility(llvm::GlobalValue::DefaultVisibility);
    gv.setDSOLocal(false);
  }
}

}  // namespace

int outline_serial_loop_nests(mlir::ModuleOp m) {
  auto main = m.lookupSymbol<mlir::func::FuncOp>("main");
  if (!main || !main.getBody().hasOneBlock() || std::thread::hardware_concurrency() < 2) return 0;
  llvm::SmallVector<mlir::scf::ForOp> loops;
  for (mlir::Operation& op : main.getBody().front())
    if (auto loop = llvm::dyn_cast<mlir::scf::ForOp>(op); loop && loop->getNumResults() == 0)
      loops.push_back(loop);
  if (loops.size() < kOutlineMinLoopNests) return 0;
  mlir::IRRewriter rewriter(m.getContext());
  int outlined = 0;
  for (mlir::scf::ForOp loop : loops) {
    // The nest goes into a region of its own, which becomes the function's body.
    rewriter.setInsertionPoint(loop);
    auto region = mlir::scf::ExecuteRegionOp::create(rewriter, loop.getLoc(), mlir::TypeRange{});
    mlir::Block* body = rewriter.createBlock(&region.getRegion());
    rewriter.setInsertionPointToEnd(body);
    auto yield = mlir::scf::YieldOp::create(rewriter, loop.getLoc());
    loop->moveBefore(yield);
    mlir::FailureOr<mlir::func::FuncOp> fn = mlir::outlineSingleBlockRegion(
        rewriter, loop.getLoc(), region.getRegion(), "kiln_loop_nest_" + std::to_string(outlined));
    if (mlir::failed(fn)) return outlined;  // this nest stays inline, in its region
    fn->setPrivate();
    ++outlined;
  }
  return outlined;
}

unsigned object_parts_for(const llvm::Module& mod) {
  if (std::thread::hardware_concurrency() < 2) return 1;
  const uint64_t by_size = mod.getInstructionCount() / kInstructionsPerPart;
  return static_cast<unsigned>(std::clamp<uint64_t>(by_size, 1, kMaxObjectParts));
}

std::vector<std::string> emit_in_parts(llvm::Module& mod, unsigned parts, const EmitPart& emit,
                                       std::vector<PartStats>& stats) {
  // Each part is optimised in an LLVMContext of its own (a context is single-threaded),
  // carried there as bitcode. Functions are dealt round-robin: the outlined loops are of
  // similar size. Locals referenced across parts are made external (renamed uniquely).
  std::vector<llvm::SmallVector<char, 0>> bitcode;
  std::vector<unsigned> sizes;  // instructions
  llvm::SplitModule(
      mod, parts,
      [&](std::unique_ptr<llvm::Module> part) {
        sizes.push_back(part->getInstructionCount());
        llvm::SmallVector<char, 0>& buf = bitcode.emplace_back();
        llvm::raw_svector_ostream os(buf);
        llvm::WriteBitcodeToFile(*part, os);
      },
      /*PreserveLocals=*/false, /*RoundRobin=*/true);
  std::vector<std::string> objects(bitcode.size());
  std::vector<std::exception_ptr> errors(bitcode.size());
  stats.assign(bitcode.size(), PartStats{});
  auto run = [&](size_t i) {
    try {
      std::string llvm_errors;
      llvm::LLVMContext ctx;
      route_llvm_diagnostics(ctx, &llvm_errors);
      llvm::MemoryBufferRef ref(llvm::StringRef(bitcode[i].data(), bitcode[i].size()), "part");
      llvm::Expected<std::unique_ptr<llvm::Module>> part = llvm::parseBitcodeFile(ref, ctx);
      if (!part)
        throw Error("codegen::Executable: splitting the module",
                    llvm::toString(part.takeError()));
      reach_other_parts_indirectly(**part);
      objects[i] = emit(**part, stats[i]);
      throw_llvm_errors(llvm_errors, "LLVM -O2 and code generation");
    } catch (...) {
      errors[i] = std::current_exception();
    }
  };
  // More parts than threads, taken in turn: `main` keeps the code between the loop nests and
  // makes its part the largest, which one thread works on while the others share the rest.
  // Largest first, so that the last part to start is a small one.
  std::vector<size_t> order(bitcode.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return sizes[a] != sizes[b] ? sizes[a] > sizes[b] : a < b;
  });
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t k; (k = next.fetch_add(1)) < order.size();) run(order[k]);
  };
  const size_t helpers = std::min<size_t>(std::thread::hardware_concurrency(), bitcode.size()) - 1;
  std::vector<std::thread> threads;
  for (size_t t = 0; t < helpers; ++t) {
    try {
      threads.emplace_back(work);
    } catch (const std::system_error&) {  // no thread to be had: fewer helpers
      break;
    }
  }
  work();
  for (std::thread& t : threads) t.join();
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
  return objects;
}

std::vector<std::string> direct_references_to_undefined(std::string_view object) {
  std::vector<std::string> names;
  // A copy: ELF parsing needs the buffer aligned, and a view into a bundle may not be.
  std::unique_ptr<llvm::MemoryBuffer> copy =
      llvm::MemoryBuffer::getMemBufferCopy(llvm::StringRef(object.data(), object.size()));
  llvm::Expected<std::unique_ptr<llvm::object::ObjectFile>> file =
      llvm::object::ObjectFile::createObjectFile(copy->getMemBufferRef());
  if (!file)
    throw Error("codegen::direct_references_to_undefined",
                "not an object file: " + llvm::toString(file.takeError()));
  auto* elf = llvm::dyn_cast<llvm::object::ELF64LEObjectFile>(file->get());
  if (!elf || elf->getArch() != llvm::Triple::x86_64) return names;
  for (const llvm::object::SectionRef& section : elf->sections())
    for (const llvm::object::RelocationRef& reloc : section.relocations()) {
      if (reloc.getType() != llvm::ELF::R_X86_64_PC32) continue;
      llvm::object::symbol_iterator sym = reloc.getSymbol();
      if (sym == elf->symbol_end()) continue;
      llvm::Expected<uint32_t> flags = sym->getFlags();
      if (!flags) {
        llvm::consumeError(flags.takeError());
        continue;
      }
      if (!(*flags & llvm::object::SymbolRef::SF_Undefined)) continue;
      llvm::Expected<llvm::StringRef> name = sym->getName();
      if (name) names.push_back(name->str());
      else llvm::consumeError(name.takeError());
    }
  return names;
}

std::string bundle_objects(const std::vector<std::string>& objects) {
  if (objects.size() == 1) return objects[0];
  std::string out(kBundleMagic, sizeof kBundleMagic);
  put(out, static_cast<uint32_t>(objects.size()));
  for (const std::string& o : objects) put(out, static_cast<uint64_t>(o.size()));
  for (const std::string& o : objects) out += o;
  return out;
}

std::vector<std::string_view> unbundle_objects(std::string_view bytes) {
  if (bytes.size() < sizeof kBundleMagic ||
      std::memcmp(bytes.data(), kBundleMagic, sizeof kBundleMagic) != 0)
    return {bytes};
  const char* where = "codegen::Executable: JIT";
  size_t at = sizeof kBundleMagic;
  auto take = [&](auto& v) {
    if (bytes.size() - at < sizeof v) throw Error(where, "truncated object bundle");
    std::memcpy(&v, bytes.data() + at, sizeof v);
    at += sizeof v;
  };
  uint32_t count = 0;
  take(count);
  if (count == 0 || count > kMaxObjectParts) throw Error(where, "corrupted object bundle");
  std::vector<uint64_t> sizes(count);
  for (uint64_t& s : sizes) take(s);
  std::vector<std::string_view> parts;
  for (uint64_t s : sizes) {
    if (bytes.size() - at < s) throw Error(where, "truncated object bundle");
    parts.push_back(bytes.substr(at, s));
    at += s;
  }
  return parts;
}

}  // namespace kiln::codegen
