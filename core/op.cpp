#include "core/op.h"

namespace kiln {
namespace {
const OpInfo kOpInfo[] = {
#define KILN_OP(Kind, name, Category, Rule, arity) \
  {name, OpCategory::Category, DTypeRule::Rule, arity},
#include "core/ops.def"
};
}  // namespace
const OpInfo& op_info(OpKind op) { return kOpInfo[static_cast<int>(op)]; }
}  // namespace kiln
