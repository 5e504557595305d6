#pragma once
/// Scalar: a host number (bool, integer or floating) passed to ops, e.g. `add(x, 2.5)`.
#include <cstdint>
#include <source_location>
#include <string>
#include <type_traits>

#include "core/dtype.h"

namespace kiln {

class Scalar {
 public:
  enum class Kind : uint8_t { Bool, Int, Float };
  Scalar() : kind_(Kind::Int), i_(0) {}
  Scalar(bool v) : kind_(Kind::Bool), i_(v) {}
  /// Unsigned values above INT64_MAX throw kiln::Error (kiln's integers are at most int64).
  template <class T, std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, bool>, int> = 0>
  Scalar(T v, std::source_location loc = std::source_location::current())
      : kind_(Kind::Int), i_(static_cast<int64_t>(v)) {
    if constexpr (std::is_unsigned_v<T>)
      if (static_cast<uint64_t>(v) > static_cast<uint64_t>(INT64_MAX)) throw_too_large(v, loc);
  }
  template <class T, std::enable_if_t<std::is_floating_point_v<T>, int> = 0>
  Scalar(T v) : kind_(Kind::Float), d_(static_cast<double>(v)) {}

  Kind kind() const { return kind_; }
  bool is_floating() const { return kind_ == Kind::Float; }
  bool is_integral() const { return kind_ == Kind::Int; }
  bool is_bool() const { return kind_ == Kind::Bool; }
  /// The value converted to T (C++ conversion rules).
  template <class T> T to() const {
    return kind_ == Kind::Float ? static_cast<T>(d_) : static_cast<T>(i_);
  }
  /// The dtype a tensor made from this scalar alone would have (bool, int64, default float).
  DType dtype() const;
  std::string str() const;

 private:
  [[noreturn]] static void throw_too_large(uint64_t v, std::source_location loc);
  Kind kind_;
  union {
    int64_t i_;
    double d_;
  };
};

}  // namespace kiln
