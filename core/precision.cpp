#include "core/precision.h"

#include <atomic>

namespace kiln {
namespace {
std::atomic<MatmulPrecision> g_matmul_precision{MatmulPrecision::Highest};
constexpr MatmulPrecision kAll[] = {MatmulPrecision::Highest, MatmulPrecision::High,
                                    MatmulPrecision::Medium};
thread_local MatmulPrecisionChanges t_changes;
thread_local int t_pin_depth = 0;  // MatmulPrecisionScopes alive on this thread
thread_local MatmulPrecision t_pinned = MatmulPrecision::Highest;
}  // namespace

std::string_view name(MatmulPrecision p) {
  switch (p) {
    case MatmulPrecision::Highest: return "highest";
    case MatmulPrecision::High: return "high";
    case MatmulPrecision::Medium: return "medium";
  }
  return "invalid";
}

void set_float32_matmul_precision(MatmulPrecision p, Loc loc) {
  KILN_CHECK(static_cast<unsigned>(p) <= static_cast<unsigned>(MatmulPrecision::Medium),
             "set_float32_matmul_precision", loc, "invalid MatmulPrecision value {}",
             static_cast<int>(p));
  if (t_pin_depth) t_pinned = p;  // this thread's own change takes effect at once
  if (g_matmul_precision.exchange(p, std::memory_order_relaxed) != p)
    t_changes = {t_changes.count + 1, loc};
}

MatmulPrecisionChanges matmul_precision_changes() { return t_changes; }

void set_float32_matmul_precision(std::string_view p, Loc loc) {
  for (MatmulPrecision known : kAll)
    if (p == name(known)) return set_float32_matmul_precision(known, loc);
  throw Error("set_float32_matmul_precision",
              fmt::format("unknown precision \"{}\" (expected \"highest\", \"high\" or "
                          "\"medium\")", p),
              loc);
}

MatmulPrecision float32_matmul_precision() {
  return t_pin_depth ? t_pinned : g_matmul_precision.load(std::memory_order_relaxed);
}

MatmulPrecisionScope::MatmulPrecisionScope() {
  if (t_pin_depth++ == 0) t_pinned = g_matmul_precision.load(std::memory_order_relaxed);
}
MatmulPrecisionScope::~MatmulPrecisionScope() { --t_pin_depth; }

}  // namespace kiln
