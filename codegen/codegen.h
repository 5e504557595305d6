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

#include <memory>
#include <vector>

#include "core/tensor.h"

namespace kiln::codegen {

/// A graph compiled to native code for the host CPU (MLIR JIT, LLVM -O3, host CPU features).
///
///   codegen::Executable exe(g);                 // lower -> fuse -> bufferize -> LLVM -> JIT
///   std::vector<Tensor> out = exe.run({x});      // outputs allocated with dispatch::empty
///
/// Pipeline: convert-kiln-to-linalg, canonicalize, linalg-fuse-elementwise-ops, then the function
/// is made destination-passing (each result goes to a caller-provided memref), one-shot
/// bufferization across the function boundary, linalg -> loops, math polynomial approximation
/// (tanh/exp/erf... as arith + fma), LLVM dialect, ExecutionEngine. Owns its MLIR context, so
/// `g` may be destroyed afterwards. Errors (an op without a lowering, a failing pass, LLVM
/// errors) throw kiln::Error. run() only reads the compiled code.
///
/// Threads: when every kernel runs its outer loop over the rows of its operands (elementwise
/// graphs, reductions and softmax-like graphs over inner dims, x @ W + b), dim 0 is compiled as
/// `?` and run() calls the code on blocks of about 128 KiB of rows, spread over
/// kiln::cpu::parallel_for's threads; each block keeps a multi-kernel graph's intermediates in
/// cache. Results do not depend on the thread count (blocks do not depend on it).
///
/// Dynamic (`?`) output dims are read at run time from the input dim they were built from
/// (followed through destination-style inits to tensor.empty / tensor.dim at compile time); graphs
/// where that cannot be traced are rejected at compile time.
class Executable {
 public:
  explicit Executable(const ir::Graph& g);
  ~Executable();
  Executable(Executable&&) noexcept;
  Executable& operator=(Executable&&) noexcept;

  /// Runs the compiled graph. Inputs must match the graph's dtypes and static dims (checked);
  /// non-contiguous inputs are made contiguous first. Returns one new tensor per graph output.
  std::vector<Tensor> run(const std::vector<Tensor>& inputs) const;

  /// Number of kernels after fusion, counted like TorchInductor counts them: a row-parallel
  /// graph (see row_parallel()) is one kernel — one parallel loop over row blocks whose body
  /// runs the graph's loop nests on the block, the way Inductor's CPU softmax is one kernel
  /// with three inner loops; otherwise each loop nest is a kernel of its own.
  int num_kernels() const;
  /// Number of loop nests (linalg ops) after fusion, e.g. 3 for softmax (max, sum of exp, divide).
  int num_loop_nests() const;
  /// Whether run() splits the leading dim over the thread pool (codegen/row_split.h): every
  /// kernel then runs inside one parallel loop over row blocks. Graphs under 256 KiB of
  /// row-carrying data still run on the calling thread.
  bool row_parallel() const;
  /// The fused linalg-on-tensors IR the native code was generated from (for tests/debugging).
  const std::string& linalg_ir() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln::codegen
