#pragma once
/// Access to the MLIR module behind a kiln::ir::Graph, for ir/ and codegen/ only (MLIR inside).
#include "ir/graph.h"
#include "mlir/IR/BuiltinOps.h"

namespace kiln::ir {

struct GraphAccess {
  /// The graph's module: one `func.func @main` of kiln ops. Owned by the graph.
  static mlir::ModuleOp module(const Graph& g);
};

}  // namespace kiln::ir
