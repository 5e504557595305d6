// ShapeCheck (shape_check.h): the graph's kiln ops read once, their shape rules run per call.
#include "codegen/shape_check.h"

#include <string>

#include <fmt/format.h>

#include "core/error.h"
#include "ir/dialect.h"
#include "ir/graph_internal.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"

namespace kiln::codegen {

ShapeCheck::ShapeCheck(const ir::Graph& g) {
  auto main = ir::GraphAccess::module(g).lookupSymbol<mlir::func::FuncOp>("main");
  if (!main) return;
  for (mlir::Type t : main.getArgumentTypes()) {
    auto rt = llvm::dyn_cast<mlir::RankedTensorType>(t);
    needed_ = needed_ || (rt && !rt.hasStaticShape());
  }
  if (!needed_) return;
  llvm::DenseMap<mlir::Value, int> number;
  auto add_value = [&](mlir::Value v) {
    number[v] = values_++;
    std::vector<int64_t> dims;
    if (auto t = llvm::dyn_cast<mlir::RankedTensorType>(v.getType()))
      for (int64_t d : t.getShape())
        dims.push_back(mlir::ShapedType::isDynamic(d) ? ir::kDynamic : d);
    graph_dims_.push_back(std::move(dims));
    return number[v];
  };
  for (mlir::BlockArgument a : main.getArguments()) add_value(a);
  auto meta_of_type = [](mlir::Type type) -> std::optional<TensorMeta> {
    auto t = llvm::dyn_cast<mlir::RankedTensorType>(type);
    if (!t || !t.hasStaticShape()) return std::nullopt;
    auto dt = kiln::dialect::dtype_of(t.getElementType());
    if (!dt) return std::nullopt;
    TensorMeta m;
    m.dtype = *dt;
    m.shape = Shape(std::vector<int64_t>(t.getShape().begin(), t.getShape().end()));
    return m;
  };
  for (mlir::Operation& op : main.getBody().front()) {
    if (op.hasTrait<mlir::OpTrait::IsTerminator>()) continue;
    if (op.getNumResults() != 1) {
      complete_ = false;
      return;
    }
    auto kind_name = op.getAttrOfType<mlir::StringAttr>("kind");
    std::optional<OpKind> kind =
        kind_name ? kiln::dialect::op_kind_from_name(kind_name.getValue()) : std::nullopt;
    const int out = add_value(op.getResult(0));
    if (!kind) {  // a constant: its type
      std::optional<TensorMeta> m = meta_of_type(op.getResult(0).getType());
      if (!m) {
        complete_ = false;
        return;
      }
      constants_.push_back({out, *m});
      continue;
    }
    Step s{*kind, kiln::dialect::attrs_from_op(*kind, &op), {}, out};
    for (mlir::Value v : op.getOperands()) s.in.push_back(number.lookup(v));
    steps_.push_back(std::move(s));
  }
}

void ShapeCheck::check(const std::vector<Tensor>& inputs, const char* where) const {
  if (!needed_ || !complete_) return;
  std::vector<TensorMeta> metas(static_cast<size_t>(values_));
  for (size_t i = 0; i < inputs.size() && i < metas.size(); ++i)
    metas[i] = TensorMeta::of(inputs[i]);
  for (const auto& [v, m] : constants_) metas[static_cast<size_t>(v)] = m;
  std::vector<TensorMeta> in;
  for (const Step& s : steps_) {
    in.clear();
    // A random op's operand is its Philox key; its shape comes from its attributes.
    if (op_info(s.op).category != OpCategory::Random)
      for (int v : s.in) in.push_back(metas[static_cast<size_t>(v)]);
    try {
      InferredMeta r = infer_meta(s.op, in, s.attrs, Loc::current());
      if (r.outputs.empty()) return;
      const Shape& out = r.outputs[0].shape;
      metas[static_cast<size_t>(s.out)] = {r.outputs[0].dtype, out};
      const OpCategory c = op_info(s.op).category;
      const bool broadcasts = c == OpCategory::Unary || c == OpCategory::Binary ||
                              c == OpCategory::Ternary || s.op == OpKind::Expand;
      for (size_t k = 0; broadcasts && k < s.in.size(); ++k) {
        const std::vector<int64_t>& dims = graph_dims_[static_cast<size_t>(s.in[k])];
        const Shape& have = in[k].shape;
        for (int d = 0; d < have.size() && d < int(dims.size()); ++d) {
          const int od = out.size() - have.size() + d;
          if (dims[d] == ir::kDynamic && have[d] == 1 && od >= 0 && out[od] != 1)
            throw Error(op_info(s.op).name.data(),
                        fmt::format("operand {} of shape {} would broadcast its `?` dim {} of "
                                    "size 1 to {} (the code reads `?` dims as not broadcast)",
                                    k, to_string(have), d, out[od]));
        }
      }
    } catch (const Error& e) {
      throw Error(where, std::string("the sizes of the inputs' `?` dims do not agree with the "
                                     "graph: ") + e.what());
    }
  }
}

}  // namespace kiln::codegen
