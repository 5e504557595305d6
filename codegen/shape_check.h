#pragma once
/// Run-time check that the sizes of a graph's `?` input dims agree with each other as its ops
/// need (a matmul's inner sizes, an elementwise op's operands), and that no `?` dim of size 1
/// is broadcast: the compiled code reads them without checking (codegen::Executable::run).
/// MLIR-free.
#include <vector>

#include "core/meta.h"
#include "core/tensor.h"
#include "ir/graph.h"

namespace kiln::codegen {

/// The graph's ops as a list of infer_meta calls (core/meta.h, the shape rules eager mode
/// runs), over numbered values: the graph's inputs first, then each op's result.
class ShapeCheck {
 public:
  /// Reads the ops of `g`. One it cannot read (several results, a non-static constant) turns
  /// the check off: it then passes every input.
  explicit ShapeCheck(const ir::Graph& g);
  /// Whether the graph has a `?` input dim, the only case that needs a check.
  bool needed() const { return needed_; }
  /// Runs the ops' shape rules on the inputs' sizes; throws kiln::Error naming the first op
  /// whose operands do not fit ("matmul: ... [2, 3000] and [1, 4]") or that would broadcast a
  /// `?` dim of size 1, prefixed by `where`.
  void check(const std::vector<Tensor>& inputs, const char* where) const;

 private:
  struct Step {
    OpKind op;
    OpAttrs attrs;
    std::vector<int> in;  // value numbers
    int out;
  };
  // Per value, its dims in the graph (ir::kDynamic for `?`): the code reads a `?` dim as one
  // that is not broadcast (codegen/lower.cpp), so one of size 1 must not be.
  std::vector<std::vector<int64_t>> graph_dims_;
  bool needed_ = false;
  bool complete_ = true;  // every op was read
  int values_ = 0;
  std::vector<std::pair<int, TensorMeta>> constants_;  // (value, meta)
  std::vector<Step> steps_;
};

}  // namespace kiln::codegen
