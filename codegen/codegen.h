#pragma once
/// codegen's public entry points (MLIR-free). So far: lowering to linalg on tensors.
#include <string>

#include "ir/graph.h"

namespace kiln::codegen {

/// Lowers a copy of `g` with convert-kiln-to-linalg (then, if `fuse`, canonicalize and
/// linalg-fuse-elementwise-ops) and returns the MLIR text; `g` is unchanged. Ops without a
/// lowering yet stay kiln ops. Throws kiln::Error with the MLIR diagnostics if a pass fails.
std::string lower_to_linalg(const ir::Graph& g, bool fuse = true);

}  // namespace kiln::codegen
