#pragma once
/// Lowering of the kiln dialect to upstream MLIR on tensors. Internal to codegen/ (MLIR inside).
#include <memory>

#include "ir/decompose.h"  // kiln-decompose, run before convert-kiln-to-linalg
#include "mlir/IR/AffineMap.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/PatternMatch.h"
#include "mlir/Pass/Pass.h"

namespace mlir {
class DialectRegistry;
namespace func {
class FuncOp;
}
}

namespace kiln::codegen {

/// kiln.elementwise -> linalg.generic (+ tensor.empty / tensor.dim), with the body built from
/// core/formulas.h for floating types. Ops whose kind is not covered yet are left in place.
void populate_kiln_to_linalg_patterns(mlir::RewritePatternSet& patterns);

/// kiln.random (dropout_mask) -> linalg.generic with Philox per element (codegen/lower_random.cpp);
/// part of populate_kiln_to_linalg_patterns.
void populate_random_patterns(mlir::RewritePatternSet& patterns);

/// kiln.index (one_hot, tril, triu, masked_fill, index_select, gather, embedding) ->
/// linalg.generic; index_add, scatter_add -> scf.for nests (codegen/lower_index.cpp); part of
/// populate_kiln_to_linalg_patterns.
void populate_index_patterns(mlir::RewritePatternSet& patterns);

/// Unit attribute on the scf.for loops of an index_add / scatter_add (lower_index.cpp): the GPU
/// lowering turns such a nest into one parallel loop of atomic adds.
inline constexpr char kScatterLoopAttr[] = "kiln.scatter_add";
/// Unit attribute on the loop of such a nest over the indexed dim (the only loop whose
/// iterations may add into the same element).
inline constexpr char kScatterAxisAttr[] = "kiln.scatter_axis";

/// Indexing map reading `operand` for a loop nest over `result` (right-aligned broadcasting: a
/// static size-1 dim against a larger result dim reads index 0; `?` dims do not broadcast).
/// `loops` >= result rank; extra loops (reduction dims) are not read.
mlir::AffineMap broadcast_map(mlir::RankedTensorType operand, mlir::RankedTensorType result,
                              int64_t loops);

/// Pass `convert-kiln-to-linalg` (on builtin.module). `cpu_math` (option cpu-math): float32
/// exp, exp2 and expm1 round with math.roundeven and convert with fptosi, as a CPU does it
/// fastest; otherwise with float additions, as a GPU does (the same values either way).
std::unique_ptr<mlir::Pass> create_kiln_to_linalg_pass(bool cpu_math = false);

/// Pass `kiln-fuse-elementwise` (codegen/fusion.cpp): upstream elementwise fusion, except that a
/// small elementwise producer with several consumers is fused (recomputed) into each of them.
/// `for_gpu` (option recompute-math): producers calling math functions are recomputed too.
std::unique_ptr<mlir::Pass> create_fuse_elementwise_pass(bool for_gpu = false);
void register_fusion_pass();
/// Pass `kiln-extern-calls` (codegen/extern_calls.cpp, on builtin.module, after bufferization):
/// float linalg.matmul / batch_matmul on unit-stride memrefs -> func.call @kiln_rt_gemm_f32/f64
/// (codegen/runtime.h). Does nothing when the environment sets KILN_NO_EXTERN_GEMM=1.
std::unique_ptr<mlir::Pass> create_extern_calls_pass();
/// Registers `kiln-extern-calls` for pass pipelines (idempotent, thread-safe).
void register_extern_calls_pass();

/// Bool (i1) tensor arguments and results of `fn` become i8 (kiln's one byte per bool), with
/// the conversions next to their uses, to be fused into them (codegen/bool_bytes.cpp). Run after
/// convert-kiln-to-linalg, before fusion.
void bools_as_bytes(mlir::func::FuncOp fn);

/// Registers codegen's passes and the dialects its output uses (for kiln-opt).
void register_codegen(mlir::DialectRegistry& registry);

}  // namespace kiln::codegen
