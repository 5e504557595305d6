// Loop hints for LLVM's vectorizer on the CPU code (see codegen/jit.h).
//
// An inner loop of a small constant trip count that is no multiple of the vector width (the
// 10 classes of a classifier's [64, 10] logits) is fully unrolled by -O2 and then runs scalar,
// or its outer loop is vectorized with gathers. Marked with llvm.loop.vectorize.predicate.enable
// (and unroll.disable, so that the full unroll does not come first) it becomes masked vector
// code: AVX-512 masks cost nothing extra. The digits MLP's compiled training step went from
// about 141 to 137 us. Only these loops are marked: a predicated loop is not interleaved, and
// predicating every loop made the long compute-bound gelu chain 18 % slower. Vectorisation is
// not forced (llvm.loop.vectorize.enable): a forced loop that cannot be vectorised (argmax's
// index selects) makes -O2 print "loop not vectorized" warnings, and forcing lets LLVM
// reassociate float reductions that lower.cpp keeps in order (a product).
#include "codegen/jit.h"
#include "llvm/Analysis/AssumptionCache.h"
#include "llvm/Analysis/LoopInfo.h"
#include "llvm/Analysis/ScalarEvolution.h"
#include "llvm/Analysis/TargetLibraryInfo.h"
#include "llvm/IR/Constants.h"
#include "llvm/IR/Dominators.h"
#include "llvm/IR/Metadata.h"
#include "llvm/IR/Module.h"

namespace kiln::codegen {

int hint_short_loops(llvm::Module& mod, unsigned lanes) {
  llvm::LLVMContext& ctx = mod.getContext();
  llvm::TargetLibraryInfoImpl tlii(mod.getTargetTriple());
  llvm::TargetLibraryInfo tli(tlii);
  auto flag = [&](const char* name) -> llvm::Metadata* {
    return llvm::MDNode::get(ctx, {llvm::MDString::get(ctx, name),
                                   llvm::ConstantAsMetadata::get(llvm::ConstantInt::getTrue(ctx))});
  };
  int marked = 0;
  for (llvm::Function& f : mod) {
    if (f.isDeclaration()) continue;
    llvm::DominatorTree dt(f);
    llvm::LoopInfo li(dt);
    if (li.empty()) continue;
    llvm::AssumptionCache ac(f);
    llvm::ScalarEvolution se(f, tli, ac, dt, li);
    for (llvm::Loop* loop : li.getLoopsInPreorder()) {
      if (!loop->isInnermost() || loop->getLoopID()) continue;
      const unsigned trips = se.getSmallConstantTripCount(loop);
      if (trips < 2 || trips >= 4 * lanes || trips % lanes == 0) continue;
      llvm::MDNode* id = llvm::MDNode::getDistinct(
          ctx, {nullptr, flag("llvm.loop.vectorize.predicate.enable"),
                flag("llvm.loop.unroll.disable")});
      id->replaceOperandWith(0, id);
      loop->setLoopID(id);
      ++marked;
    }
  }
  return marked;
}

}  // namespace kiln::codegen
