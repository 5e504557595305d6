#pragma once
// Helpers shared by the compile() tests.
#include <string>
#include <vector>

#include "core/tensor.h"

namespace kiln::testing {
inline std::vector<float> vec(const Tensor& t) { return t.to_vector<float>(); }
inline bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}
}  // namespace kiln::testing
