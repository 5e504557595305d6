// The value checks of eager's kernels that generated code leaves to its caller (value_checks.h).
#include "eager/value_checks.h"

#include <algorithm>

namespace kiln {

std::vector<int> value_checked_inputs(OpKind op, const OpAttrs& a, DType compute) {
  const bool integer = !is_floating(compute);
  switch (op) {
    case OpKind::OneHot:
      if (a.indices_checked) return {};  // nll_loss's backward: its forward checked them
      return {0};
    case OpKind::IndexAdd:
    case OpKind::IndexCopy:
    case OpKind::ScatterAdd:
      if (a.indices_checked) return {};  // a backward's: the forward checked them
      return {1};
    case OpKind::NllLoss:
    case OpKind::IndexSelect:
    case OpKind::Gather:
    case OpKind::Embedding: return {1};
    case OpKind::FloorDivide:
    case OpKind::Remainder:
      if (integer) return {1};
      return {};
    case OpKind::Pow:
      if (integer) return {0, 1};
      return {};
    default: return {};
  }
}

bool eager_rejects_values(OpKind op, const OpAttrs& a, const std::vector<Shape>& shapes,
                          const std::vector<std::vector<int64_t>>& values) {
  auto any = [](const std::vector<int64_t>& xs, auto pred) {
    return std::any_of(xs.begin(), xs.end(), pred);
  };
  auto out_of = [&](int64_t size) {
    return any(values[0], [&](int64_t i) { return i < 0 || i >= size; });
  };
  // The size of input 0 along `a.dim` (1 for a 0-d input, as eager's kernels take it).
  auto size_along_dim = [&] {
    const Shape& x = shapes[0];
    if (x.size() == 0) return int64_t{1};
    return x[wrap_dim(a.dim, x.size(), op_name(op).data())];
  };
  switch (op) {
    case OpKind::OneHot: return out_of(a.mode);
    case OpKind::NllLoss: {
      const Shape& x = shapes[0];
      const int64_t classes = x[x.size() == 2 ? 1 : 0];
      return any(values[0], [&](int64_t t) {
        return t != a.ignore_index && (t < 0 || t >= classes);
      });
    }
    case OpKind::IndexSelect:
    case OpKind::Gather:
    case OpKind::IndexAdd:
    case OpKind::IndexCopy:
    case OpKind::ScatterAdd: return out_of(size_along_dim());
    case OpKind::Embedding: return shapes[0].size() != 2 || out_of(shapes[0][0]);
    case OpKind::FloorDivide:
    case OpKind::Remainder: return any(values[0], [](int64_t d) { return d == 0; });
    case OpKind::Pow:
      return any(values[0], [](int64_t b) { return b == 0; }) &&
             any(values[1], [](int64_t e) { return e < 0; });
    default: return false;
  }
}

}  // namespace kiln
