#pragma once
/// Per-kernel timing of compiled CPU code (CompileOptions::profile_kernels, KILN_PROFILE=1).
/// Internal to codegen/ (MLIR inside).
#include <string>
#include <utility>
#include <vector>

#include "mlir/Dialect/Func/IR/FuncOps.h"

namespace kiln::codegen {

/// Before lowering: gives each kiln op of `m` a location named after its kind ("exp",
/// "softmax") around its source location, so that the ops lowered from it, fused into some
/// kernel, still say which graph op they compute.
void name_op_locations(mlir::ModuleOp m);

/// Wraps each kernel of @main — every top-level loop nest (scf.parallel, scf.for), extern call
/// (the GEMM) and memref.copy, as convert-linalg-to-parallel-loops leaves them — in calls
/// `kiln_rt_kernel_begin(id)` / `kiln_rt_kernel_end(id)` (runtime.h), ids 0, 1, ... in program
/// order. Returns one description per id: what the kernel is ("loop nest [8, 128, 1024]",
/// "GEMM [1024, 256] x [256, 1024]"), the graph ops fused into it and their source lines (from
/// name_op_locations' names), e.g. "loop nest [1024, 1024]: gelu, mul (model.cpp:42,
/// model.cpp:57)".
std::vector<std::string> instrument_kernels(mlir::func::FuncOp main);

/// After gpu-kernel-outlining: (kernel name, "softmax, mul (model.cpp:12)") for each kernel of
/// `m`'s gpu.modules, the graph ops fused into it and their lines as instrument_kernels names
/// them; empty when the ops carry no names (name_op_locations did not run).
std::vector<std::pair<std::string, std::string>> describe_gpu_kernels(mlir::ModuleOp m);

}  // namespace kiln::codegen
