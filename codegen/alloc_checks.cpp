// Early returns on failed allocations in the CPU code's LLVM IR (see codegen/jit.h).
//
// Intermediate buffers (memref.alloc) lower to calls of malloc, which the runtime serves
// (codegen/runtime.cpp) and which returns null when memory runs out: exceptions cannot pass
// through JIT-compiled frames. Unchecked, the code wrote through the null pointer (SIGSEGV).
// After each such call the code now tests the pointer; on null it calls
// kiln_rt_allocation_failed(bytes) and returns. A function that calls one that may fail (or
// forks a parallel region, whose members run on other threads) asks kiln_rt_failed() after
// the call and returns too, up to the entry; Executable::run then raises kiln::Error, and the
// AllocationFailureScope around each call frees the blocks the early returns left.
#include "codegen/jit.h"
#include "llvm/IR/Constants.h"
#include "llvm/IR/IRBuilder.h"
#include "llvm/IR/Instructions.h"
#include "llvm/IR/Module.h"

#include <set>
#include <string_view>
#include <vector>

namespace kiln::codegen {
namespace {

bool is_allocation(const llvm::Function* callee) {
  if (!callee) return false;
  const llvm::StringRef name = callee->getName();
  return name == "malloc" || name == "aligned_alloc";
}

// Functions that run code which may fail: defined ones (decided below) and the parallel
// region's fork, whose members report through the forking thread (omp_runtime.cpp).
bool is_fork(const llvm::Function* callee) {
  return callee && callee->getName() == "__kmpc_fork_call";
}

// The allocation's size: malloc(size) or aligned_alloc(alignment, size).
llvm::Value* allocation_size(llvm::CallInst* call) {
  return call->getArgOperand(call->arg_size() - 1);
}

}  // namespace

int return_on_failed_allocations(llvm::Module& mod) {
  // Which defined functions may fail: those that allocate or fork, then their callers.
  std::set<const llvm::Function*> may_fail;
  auto calls_failing = [&](const llvm::Function& f) {
    for (const llvm::BasicBlock& bb : f)
      for (const llvm::Instruction& inst : bb)
        if (auto* call = llvm::dyn_cast<llvm::CallInst>(&inst)) {
          const llvm::Function* callee = call->getCalledFunction();
          if (is_allocation(callee) || is_fork(callee) || may_fail.count(callee)) return true;
        }
    return false;
  };
  for (bool grew = true; grew;) {
    grew = false;
    for (const llvm::Function& f : mod)
      if (!f.isDeclaration() && !may_fail.count(&f) && calls_failing(f)) {
        may_fail.insert(&f);
        grew = true;
      }
  }
  if (may_fail.empty()) return 0;

  llvm::LLVMContext& ctx = mod.getContext();
  llvm::Type* i64 = llvm::Type::getInt64Ty(ctx);
  llvm::FunctionCallee failed_fn = mod.getOrInsertFunction(
      "kiln_rt_allocation_failed", llvm::Type::getVoidTy(ctx), i64);
  llvm::FunctionCallee test_fn = mod.getOrInsertFunction("kiln_rt_failed",
                                                         llvm::Type::getInt1Ty(ctx));
  int checks = 0;
  for (llvm::Function& f : mod) {
    if (!may_fail.count(&f)) continue;
    std::vector<llvm::CallInst*> sites;
    for (llvm::BasicBlock& bb : f)
      for (llvm::Instruction& inst : bb)
        if (auto* call = llvm::dyn_cast<llvm::CallInst>(&inst)) {
          const llvm::Function* callee = call->getCalledFunction();
          if (is_allocation(callee) || is_fork(callee) || may_fail.count(callee))
            sites.push_back(call);
        }
    // One block returns for every failing site: the return value is never read (the caller
    // returns as well).
    llvm::BasicBlock* leave = llvm::BasicBlock::Create(ctx, "kiln.alloc.failed", &f);
    llvm::IRBuilder<> lb(leave);
    if (f.getReturnType()->isVoidTy())
      lb.CreateRetVoid();
    else
      lb.CreateRet(llvm::Constant::getNullValue(f.getReturnType()));
    for (llvm::CallInst* call : sites) {
      llvm::BasicBlock* before = call->getParent();
      llvm::BasicBlock* after = before->splitBasicBlock(call->getNextNode(), "kiln.alloc.ok");
      before->getTerminator()->eraseFromParent();
      llvm::IRBuilder<> b(before);
      if (is_allocation(call->getCalledFunction())) {
        llvm::BasicBlock* report = llvm::BasicBlock::Create(ctx, "kiln.alloc.null", &f, leave);
        llvm::Value* null = b.CreateIsNull(call);
        b.CreateCondBr(null, report, after);
        llvm::IRBuilder<> rb(report);
        rb.CreateCall(failed_fn, {rb.CreateZExtOrTrunc(allocation_size(call), i64)});
        rb.CreateBr(leave);
      } else {
        b.CreateCondBr(b.CreateCall(test_fn), leave, after);
      }
      ++checks;
    }
  }
  return checks;
}

}  // namespace kiln::codegen
