#pragma once
/// The `kiln` MLIR dialect (generated from KilnOps.td) and the glue between it and core's op
/// table. Internal to ir/ and codegen/: this header pulls in MLIR.
#include <optional>
#include <utility>
#include <vector>

#include "core/meta.h"
#include "core/op.h"
#include "mlir/Bytecode/BytecodeOpInterface.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/Dialect.h"
#include "mlir/IR/OpDefinition.h"
#include "mlir/Interfaces/InferTypeOpInterface.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

#include "ir/KilnDialect.h.inc"
#define GET_OP_CLASSES
#include "ir/KilnOps.h.inc"

namespace kiln::dialect {

/// The op-table row named `name` ("add", "sum", ...), if any.
std::optional<OpKind> op_kind_from_name(llvm::StringRef name);

/// The kiln op mnemonic ("elementwise", "reduce", "matmul", "view", "composite", "index") that
/// carries `op`, or nullptr when the IR does not cover the op yet.
const char* dialect_op_for(OpKind op);

/// MLIR element type of a kiln dtype and back (nullopt for types kiln has no dtype for).
mlir::Type element_type(mlir::MLIRContext* ctx, DType dtype);
std::optional<DType> dtype_of(mlir::Type element_type);

/// Result types of `op` on operands of the given types: core's infer_meta, with dynamic (`?`)
/// dims handled by substitution (see dialect.cpp). Throws kiln::Error like eager mode does.
std::vector<mlir::RankedTensorType> infer_result_types(
    mlir::MLIRContext* ctx, OpKind op, llvm::ArrayRef<mlir::RankedTensorType> operands,
    const OpAttrs& attrs, Loc loc = Loc::current());

/// OpAttrs <-> the optional attributes of a kiln op (named like OpAttrs' fields).
OpAttrs attrs_from_op(OpKind kind, mlir::Operation* op);
void attrs_to_named(OpKind kind, const OpAttrs& attrs, mlir::Builder& b,
                    llvm::SmallVectorImpl<mlir::NamedAttribute>& out);

/// Builds the kiln op for `kind` on `operands` at b's insertion point and returns its result
/// (type from infer_result_types). Throws kiln::Error, with eager mode's message, for invalid
/// inputs and for ops the IR does not cover.
mlir::Value create_op(mlir::OpBuilder& b, mlir::Location loc, OpKind kind,
                      mlir::ValueRange operands, const OpAttrs& attrs,
                      Loc where = Loc::current());

/// Unit attribute on a kiln.reduce "sum" (set by kiln-decompose) whose terms are never negative
/// (softmax's, log_softmax's and logsumexp's Σ exp(x - m)): float32 partial sums of it cannot
/// cancel, and overflow only where the float32 total does. The reduce's lowering carries it to
/// its float64 accumulation (`arith.addf`), where the CPU's row loops may sum in float32
/// blocks (codegen/blocked_sums.cpp).
inline constexpr char kNonnegativeTermsAttr[] = "kiln_nonnegative_terms";

/// Unit attribute on the float64 `arith.addf` that the lowering of a float32 sum or mean
/// accumulates in (its own widening, not a float64 sum the user asked for): the CPU's row loops
/// may sum its terms in float32 blocks as eager does, redoing a block in float64 where its
/// float32 partial is not finite (codegen/blocked_sums.cpp).
inline constexpr char kWidenedFloat32SumAttr[] = "kiln_widened_float32_sum";

/// A kiln.constant of `type` with every element `value`.
mlir::Value splat_constant(mlir::OpBuilder& b, mlir::Location loc, mlir::RankedTensorType type,
                           double value);
/// A kiln.constant of integer `type` with every element `value`, exactly (a double holds
/// integers up to 2^53 only).
mlir::Value splat_integer(mlir::OpBuilder& b, mlir::Location loc, mlir::RankedTensorType type,
                          int64_t value);

/// The two dims a kiln.view "transpose" swaps, wrapped into [0, rank) (negative dims count
/// from the end) and ordered: (min, max).
std::pair<int64_t, int64_t> swapped_dims(ViewOp transpose);

}  // namespace kiln::dialect
