#include "core/scalar.h"

#include <fmt/format.h>

namespace kiln {
DType Scalar::dtype() const {
  switch (kind_) {
    case Kind::Bool: return DType::Bool;
    case Kind::Int: return DType::Int64;
    case Kind::Float: return default_dtype();
  }
  return DType::Int64;
}
std::string Scalar::str() const {
  switch (kind_) {
    case Kind::Bool: return i_ ? "true" : "false";
    case Kind::Int: return fmt::format("{}", i_);
    case Kind::Float: return fmt::format("{}", d_);
  }
  return "";
}
}  // namespace kiln
