#pragma once
/// DType: the element types of kiln tensors, and PyTorch's type-promotion rules.
#include <cstddef>
#include <cstdint>
#include <source_location>
#include <string_view>

namespace kiln {

/// Element type. New types (Int8, Float16, BFloat16) are appended; the promotion table in
/// dtype.cpp is the single place that needs a new row and column.
enum class DType : uint8_t { Bool, Int32, Int64, Float32, Float64 };
inline constexpr int kNumDTypes = 5;

/// Promotion categories, ordered: bool < integer < floating.
enum class DTypeCategory : uint8_t { Bool, Integer, Floating };

/// Throws kiln::Error naming `op` and `loc` for a DType made from an integer out of range
/// (static_cast<DType>(42)), which would index the dtype tables out of bounds.
void check_dtype(DType t, const char* op, std::source_location loc);

/// Size of one element in bytes.
size_t itemsize(DType t);
/// "float32", "int64", ...
std::string_view name(DType t);
DTypeCategory category(DType t);
inline bool is_floating(DType t) { return category(t) == DTypeCategory::Floating; }
inline bool is_integral(DType t) { return category(t) == DTypeCategory::Integer; }

/// The smallest dtype both `a` and `b` convert to without losing category (PyTorch's
/// `torch.promote_types`), read from one table.
DType promote_types(DType a, DType b);

/// Default floating dtype (float32 unless changed), used for int tensor ⊕ float scalar,
/// `arange` with float bounds, `rand`, and for ops that return floats on integer input.
DType default_dtype();
/// Sets the default floating dtype. Throws kiln::Error unless `t` is a floating DType (an
/// integer cast to DType out of range included).
void set_default_dtype(DType t, std::source_location loc = std::source_location::current());
/// How many times set_default_dtype was called in this process: compile() does not cache a
/// trace during which it moved (its ops may have seen either dtype).
uint64_t default_dtype_changes();

/// C++ type of a dtype: CType<DType::Float32> is float.
template <DType D> struct CTypeOf;
template <> struct CTypeOf<DType::Bool> { using type = bool; };
template <> struct CTypeOf<DType::Int32> { using type = int32_t; };
template <> struct CTypeOf<DType::Int64> { using type = int64_t; };
template <> struct CTypeOf<DType::Float32> { using type = float; };
template <> struct CTypeOf<DType::Float64> { using type = double; };
template <DType D> using CType = typename CTypeOf<D>::type;

/// DType of a C++ type: dtype_of<float> == DType::Float32.
template <class T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<bool>() { return DType::Bool; }
template <> constexpr DType dtype_of<int32_t>() { return DType::Int32; }
template <> constexpr DType dtype_of<int64_t>() { return DType::Int64; }
template <> constexpr DType dtype_of<float>() { return DType::Float32; }
template <> constexpr DType dtype_of<double>() { return DType::Float64; }

}  // namespace kiln

/// Runs the statements with `T` bound to the C++ type of `dtype`, e.g.
///   KILN_DISPATCH_ALL(t.dtype(), T, { fill<T>(t); });
#define KILN_DISPATCH_CASE(D, T, ...) \
  case D: {                           \
    using T = ::kiln::CType<D>;       \
    __VA_ARGS__;                      \
    break;                            \
  }
#define KILN_DISPATCH_ALL(dtype, T, ...)                                \
  switch (dtype) {                                                      \
    KILN_DISPATCH_CASE(::kiln::DType::Bool, T, __VA_ARGS__)             \
    KILN_DISPATCH_CASE(::kiln::DType::Int32, T, __VA_ARGS__)            \
    KILN_DISPATCH_CASE(::kiln::DType::Int64, T, __VA_ARGS__)            \
    KILN_DISPATCH_CASE(::kiln::DType::Float32, T, __VA_ARGS__)          \
    KILN_DISPATCH_CASE(::kiln::DType::Float64, T, __VA_ARGS__)          \
  }
#define KILN_DISPATCH_NUMERIC(dtype, T, ...)                            \
  switch (dtype) {                                                      \
    KILN_DISPATCH_CASE(::kiln::DType::Int32, T, __VA_ARGS__)            \
    KILN_DISPATCH_CASE(::kiln::DType::Int64, T, __VA_ARGS__)            \
    KILN_DISPATCH_CASE(::kiln::DType::Float32, T, __VA_ARGS__)          \
    KILN_DISPATCH_CASE(::kiln::DType::Float64, T, __VA_ARGS__)          \
    default: break;                                                     \
  }
#define KILN_DISPATCH_FLOAT(dtype, T, ...)                              \
  switch (dtype) {                                                      \
    KILN_DISPATCH_CASE(::kiln::DType::Float32, T, __VA_ARGS__)          \
    KILN_DISPATCH_CASE(::kiln::DType::Float64, T, __VA_ARGS__)          \
    default: break;                                                     \
  }
