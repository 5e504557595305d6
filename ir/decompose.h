#pragma once
/// Pass `kiln-decompose`: composite ops (kiln.composite softmax / log_softmax / layer_norm /
/// nll_loss / mse_loss, kiln.reduce var / std / logsumexp) rewritten into primitive kiln ops
/// (elementwise, reduce, view, constant), so the lowering and the fuser see through them.
/// Internal to ir/ and codegen/ (MLIR inside).
#include <memory>

#include "mlir/Pass/Pass.h"

namespace kiln::dialect {

std::unique_ptr<mlir::Pass> create_decompose_pass();
/// Makes `--kiln-decompose` available to kiln-opt.
void register_decompose_pass();

}  // namespace kiln::dialect
