#include "backends/cpu/kernels.h"

namespace kiln::cpu {

Kernel kernel_for(OpKind op) {
  if (op == OpKind::IndexAdd || op == OpKind::IndexCopy || op == OpKind::ScatterAdd)
    return scatter_kernel;
  switch (op_info(op).category) {
    case OpCategory::Unary: return unary_kernel;
    case OpCategory::Binary: return binary_kernel;
    case OpCategory::Ternary: return where_kernel;
    case OpCategory::Reduction:
    case OpCategory::IndexReduction: return reduction_kernel;
    case OpCategory::Normalization: return normalization_kernel;
    case OpCategory::Matmul: return matmul_kernel;
    case OpCategory::Copy: return copy_kernel;
    case OpCategory::Shape: return cat_kernel;
    case OpCategory::Index: return index_kernel;
    case OpCategory::Random: return random_kernel;
    case OpCategory::Loss: return loss_kernel;
    case OpCategory::Scan: return scan_kernel;
    case OpCategory::Window: return window_kernel;
    case OpCategory::View: return nullptr;  // views are metadata-only (eager/view.cpp)
  }
  return nullptr;
}

}  // namespace kiln::cpu
