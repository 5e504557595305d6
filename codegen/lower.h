#pragma once
/// Lowering of the kiln dialect to upstream MLIR on tensors. Internal to codegen/ (MLIR inside).
#include <memory>

#include "ir/decompose.h"  // kiln-decompose, run before convert-kiln-to-linalg
#include "mlir/IR/PatternMatch.h"
#include "mlir/Pass/Pass.h"

namespace mlir {
class DialectRegistry;
}

namespace kiln::codegen {

/// kiln.elementwise -> linalg.generic (+ tensor.empty / tensor.dim), with the body built from
/// core/formulas.h for floating types. Ops whose kind is not covered yet are left in place.
void populate_kiln_to_linalg_patterns(mlir::RewritePatternSet& patterns);

/// Pass `convert-kiln-to-linalg` (on builtin.module).
std::unique_ptr<mlir::Pass> create_kiln_to_linalg_pass();

/// Pass `kiln-fuse-elementwise` (codegen/fusion.cpp): upstream elementwise fusion, except that a
/// small elementwise producer with several consumers is fused (recomputed) into each of them.
std::unique_ptr<mlir::Pass> create_fuse_elementwise_pass();
void register_fusion_pass();

/// Registers codegen's passes and the dialects its output uses (for kiln-opt).
void register_codegen(mlir::DialectRegistry& registry);

}  // namespace kiln::codegen
