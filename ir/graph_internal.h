#pragma once
/// Access to the MLIR module behind a kiln::ir::Graph, for ir/ and codegen/ only (MLIR inside).
#include "ir/graph.h"
#include "mlir/IR/BuiltinOps.h"

namespace kiln::ir {

/// Installs (once per process) LLVM's fatal-error handler that throws kiln::Error instead of
/// aborting, so a report_fatal_error inside MLIR or LLVM reaches the caller of the ir/ or codegen/
/// entry point that hit it. Called by every Graph's constructor and by codegen::init_llvm().
/// NB: Debian's LLVM is built without exceptions, so the LLVM frames between the error and
/// kiln's code are unwound without running their destructors (they leak what they held; the
/// process stays usable).
void install_llvm_error_handler();

struct GraphAccess {
  /// The graph's module: one `func.func @main` of kiln ops. Owned by the graph.
  static mlir::ModuleOp module(const Graph& g);
};

}  // namespace kiln::ir
