#pragma once
/// The op table turned into C++: OpKind, op names, categories and dtype rules (from ops.def),
/// OpAttrs (the non-tensor arguments of an op) and OpCall (one invocation), which the
/// dispatcher, backends, autograd and tracer all share.
#include <cstdint>
#include <string_view>
#include <vector>

#include "core/tensor.h"

namespace kiln {

enum class OpKind : uint16_t {
#define KILN_OP(Kind, name, Category, DTypeRule, arity) Kind,
#include "core/ops.def"
};
inline constexpr int kNumOps = 0
#define KILN_OP(Kind, name, Category, DTypeRule, arity) +1
#include "core/ops.def"
    ;

enum class OpCategory : uint8_t {
  Unary, Binary, Ternary, Reduction, IndexReduction, Normalization, Matmul, View, Shape, Index,
  Random, Loss, Copy, Scan, Window
};
enum class DTypeRule : uint8_t { Promote, ToFloat, ToBool, ToInt64, Same, Custom };

struct OpInfo {
  std::string_view name;
  OpCategory category;
  DTypeRule dtype_rule;
  int arity;  // number of tensor inputs; -1 for a list
};

/// Row of the op table for `op`.
const OpInfo& op_info(OpKind op);
inline std::string_view op_name(OpKind op) { return op_info(op).name; }

/// Non-tensor arguments. Each op documents which fields it reads (see eager/ops.h); fields an
/// op does not use keep their defaults, so OpAttrs compare equal for equal calls.
struct OpAttrs {
  Dims dims;                    // reduction dims, permute order, view/expand shape;
                                // unfold / fold: the window geometry (ops.def)
  bool all_dims = false;        // reduction over every dim (dims ignored)
  bool keepdim = false;
  bool descending = false;      // argsort: largest first; cumsum: sums from the dim's end
  int64_t dim = 0;              // softmax/cat/select/gather/index_select dim; transpose dim0
  int64_t dim1 = 0;             // transpose dim1
  int64_t start = 0, end = 0, step = 1;  // slice; select uses start as the index
  Scalar alpha = 1;             // add/sub/addmm alpha; masked_fill/fill value; clamp low;
                                // unfold: the value read in the padding
  Scalar beta = 1;              // addmm beta; clamp high
  bool has_low = false, has_high = false;  // clamp bounds present
  double eps = 1e-5;            // layer_norm
  double p = 0.5;               // dropout probability
  int64_t mode = 0;             // gelu: 0 erf, 1 tanh; loss reduction: 0 none, 1 mean, 2 sum;
                                // var/std correction; one_hot num_classes; tril/triu diagonal;
                                // argsort: the number of leading indices kept (-1: all)
  int64_t ignore_index = -100;  // nll_loss
  // one_hot, index_add, scatter_add: the indices were validated by the op whose gradient this
  // is (nll_loss's backward one-hot encodes the targets its forward checked; embedding's and
  // gather's add at theirs): compiled code and eager GPU ops need not check them again.
  bool indices_checked = false;
  DType dtype = DType::Float32; // cast/random target dtype
  Scalar low = 0, high = 1;     // rand/randint range; randn mean/std
  uint64_t seed = 0, offset = 0;  // Philox key and counter offset (random ops)
  Device device = Device::cpu();  // where ops without tensor inputs (random ops) create it
};

/// One op invocation: what the dispatcher hands to hooks and kernels.
struct OpCall {
  OpKind op;
  std::vector<Tensor> inputs;  // undefined Tensor() for an absent optional input
  OpAttrs attrs;
  Loc loc;
  const char* name() const { return op_info(op).name.data(); }
};

}  // namespace kiln
