#pragma once
/// Pass `kiln-decompose`: composite ops (kiln.composite softmax / log_softmax / layer_norm /
/// nll_loss / mse_loss, kiln.reduce var / std / logsumexp) rewritten into primitive kiln ops
/// (elementwise, reduce, view, constant), so the lowering and the fuser see through them. Then a
/// matmul whose result is transposed over its last two dims (and used only there) becomes the
/// matmul of the transposed operands, (a @ b)ᵀ = bᵀ @ aᵀ, with kiln's folders (x * 1 -> x,
/// transpose(transpose(x)) -> x) applied: lowering folds operand transposes into the GEMM's
/// flags, so a weight gradient is written in place instead of through a transposing copy.
/// Internal to ir/ and codegen/ (MLIR inside).
#include <memory>

#include "mlir/Pass/Pass.h"

namespace kiln::dialect {

std::unique_ptr<mlir::Pass> create_decompose_pass();
/// Makes `--kiln-decompose` available to kiln-opt.
void register_decompose_pass();

}  // namespace kiln::dialect
