#pragma once
/// kiln::ir::Graph — builds a kiln-dialect MLIR module from ops of the op table, for the tracer.
/// This header is MLIR-free: MLIR stays an implementation detail of ir/ and codegen/.
///
///   kiln::ir::Graph g;
///   auto x = g.input(DType::Float32, {kiln::ir::kDynamic, 4});
///   auto y = g.op(OpKind::Mul, {x, x});
///   g.output(g.op(OpKind::Add, {y, x}));
///   std::string text = g.to_mlir();
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/op.h"
#include "core/scalar.h"

namespace kiln::ir {

/// A dim whose size is only known at run time (printed as `?`).
inline constexpr int64_t kDynamic = -1;

/// A value (graph input or op result) of one Graph.
struct Value {
  int32_t id = -1;
  bool valid() const { return id >= 0; }
};

struct ValueType {
  DType dtype = DType::Float32;
  std::vector<int64_t> shape;  // kDynamic for `?` dims
};

/// Whether Graph::op accepts `op` (the kiln dialect covers its category). The tracer runs the
/// other ops on eager kernels between compiled regions.
bool supports(OpKind op);

class Graph {
 public:
  Graph();
  ~Graph();
  Graph(Graph&&) noexcept;
  Graph& operator=(Graph&&) noexcept;

  /// Adds a graph input (an argument of the function @main).
  Value input(DType dtype, const std::vector<int64_t>& shape);
  /// Adds `op` applied to `inputs`. The result type comes from core's infer_meta, so invalid
  /// inputs throw the same kiln::Error as eager mode. Throws kiln::Error for ops whose category
  /// the IR does not cover yet.
  Value op(OpKind op, const std::vector<Value>& inputs, const OpAttrs& attrs = {},
           Loc loc = Loc::current());
  /// Adds a 0-d constant `value` of `dtype` (a `kiln.constant`), e.g. the 0.5 of `x * 0.5`.
  /// Throws kiln::Error if the value does not fit the dtype (an integer out of range).
  Value constant(const Scalar& value, DType dtype);
  /// Marks `v` as an output (a result of @main), in call order.
  void output(Value v);

  const ValueType& type(Value v) const;
  int num_inputs() const;
  int num_outputs() const;

  /// The module as MLIR text (kiln dialect inside `func.func @main`); with_locations adds each
  /// op's source location (the `loc` given to op()) as MLIR debug info.
  std::string to_mlir(bool with_locations = false) const;
  /// Runs the MLIR verifier; throws kiln::Error carrying its diagnostics on failure.
  void verify() const;
  /// Runs canonicalize + CSE (which also removes dead ops). Throws kiln::Error on failure.
  void simplify();

 private:
  friend struct GraphAccess;  // ir/graph_internal.h: the MLIR module, for codegen/
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln::ir
