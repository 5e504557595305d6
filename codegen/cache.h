#pragma once
/// Internal to codegen/: the compile cache (in memory, then on disk; layout in README.md).
/// MLIR-free.
#include <functional>
#include <memory>
#include <string>

#include "codegen/jit.h"

namespace kiln::codegen {

/// Runs the MLIR pipeline on the graph's text, fills the metadata, returns the object code.
using CompileFn = std::function<std::string(CompiledMeta& meta)>;

/// The code for `graph_mlir` (ir::Graph::to_mlir(); with locations only for kernel timers, whose
/// code then has keys of its own): from the memory cache, else from a valid disk entry, else
/// from `compile`; published to the caches that `options` allows. A bad disk entry is deleted and rebuilt; disk errors never throw.
std::shared_ptr<const CompiledCode> get_or_compile(const std::string& graph_mlir,
                                                   const CompileOptions& options,
                                                   CompileStats& stats, const CompileFn& compile);

/// The version string entries are written with (kiln codegen + LLVM); for tests of stale
/// entries, `version` replaces it ("" restores the real one).
void set_codegen_version_for_testing(const std::string& version);

}  // namespace kiln::codegen
