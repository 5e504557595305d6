#include "core/scalar.h"

#include <fmt/format.h>

#include "core/error.h"

namespace kiln {
void Scalar::throw_too_large(uint64_t v, std::source_location loc) {
  throw Error("scalar", fmt::format("{} does not fit int64, kiln's widest integer", v), loc);
}
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
