#pragma once
// Internal (MLIR): outputs of @main computed in the buffer of one of its inputs, the buffer
// donation of CompileOptions::in_place_outputs.
#include <utility>
#include <vector>

#include "mlir/Dialect/Func/IR/FuncOps.h"

namespace kiln::codegen {

/// Of the requested (output, input) pairs of `fn` (fused linalg on tensors, returning its
/// outputs), those whose output may be computed in the input's buffer: the returned value is a
/// result of an all-parallel linalg.generic in fn's body with the input's type, written with an
/// identity indexing map into a tensor.empty init the body does not read; the generic reads the
/// input only as an input operand with an identity
/// map (element i read, then written, by the same iteration); every other use of the input's
/// buffer, through any op whose results may share it (views, reshapes, destination operands),
/// comes before the generic in the body (so also no return of it). At most one pair per output
/// and per input.
std::vector<std::pair<int, int>> in_place_pairs(mlir::func::FuncOp fn,
                                                const std::vector<std::pair<int, int>>& requested);

/// Makes input `input` of `fn` a memref argument (identity layout), read through a restrict
/// to_tensor, and returns it: the destination the output then materializes into.
mlir::Value donated_buffer(mlir::func::FuncOp fn, int input);

}  // namespace kiln::codegen
