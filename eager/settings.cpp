#include "eager/settings.h"

#include "backends/cpu/parallel.h"
#include "core/error.h"

namespace kiln {

void set_num_threads(int n, Loc loc) {
  KILN_CHECK(n >= 1, "set_num_threads", loc, "expects a positive integer, got {}", n);
  cpu::set_num_threads(n);
}
int get_num_threads() { return cpu::num_threads(); }
bool set_flush_denormal(bool on) { return cpu::set_flush_denormal(on); }

}  // namespace kiln
