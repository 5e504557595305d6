#include "core/dtype.h"

#include <atomic>

#include "core/error.h"

namespace kiln {
namespace {
using enum DType;
// promote_types as one table (PyTorch's rules restricted to kiln's dtypes).
constexpr DType kPromote[kNumDTypes][kNumDTypes] = {
    //            Bool     Int32    Int64    Float32  Float64
    /* Bool    */ {Bool, Int32, Int64, Float32, Float64},
    /* Int32   */ {Int32, Int32, Int64, Float32, Float64},
    /* Int64   */ {Int64, Int64, Int64, Float32, Float64},
    /* Float32 */ {Float32, Float32, Float32, Float32, Float64},
    /* Float64 */ {Float64, Float64, Float64, Float64, Float64},
};
constexpr size_t kSize[kNumDTypes] = {1, 4, 8, 4, 8};
constexpr std::string_view kName[kNumDTypes] = {"bool", "int32", "int64", "float32", "float64"};
constexpr DTypeCategory kCategory[kNumDTypes] = {DTypeCategory::Bool, DTypeCategory::Integer,
                                                 DTypeCategory::Integer, DTypeCategory::Floating,
                                                 DTypeCategory::Floating};
std::atomic<DType> g_default_dtype{Float32};
}  // namespace

void check_dtype(DType t, const char* op, std::source_location loc) {
  KILN_CHECK(static_cast<unsigned>(t) < kNumDTypes, op, loc, "invalid DType value {}",
             static_cast<int>(t));
}

size_t itemsize(DType t) { return kSize[static_cast<int>(t)]; }
std::string_view name(DType t) { return kName[static_cast<int>(t)]; }
DTypeCategory category(DType t) { return kCategory[static_cast<int>(t)]; }
DType promote_types(DType a, DType b) {
  return kPromote[static_cast<int>(a)][static_cast<int>(b)];
}
DType default_dtype() { return g_default_dtype.load(std::memory_order_relaxed); }
namespace {
std::atomic<uint64_t> g_default_dtype_changes{0};
}  // namespace
void set_default_dtype(DType t, Loc loc) {
  check_dtype(t, "set_default_dtype", loc);  // before the tables are indexed with it
  KILN_CHECK(is_floating(t), "set_default_dtype", loc,
             "default dtype must be floating, got {}", name(t));
  g_default_dtype.store(t);
  g_default_dtype_changes.fetch_add(1);
}
uint64_t default_dtype_changes() { return g_default_dtype_changes.load(); }

}  // namespace kiln
