#include "eager/settings.h"

#include "backends/cpu/parallel.h"

namespace kiln {

void set_num_threads(int n) { cpu::set_num_threads(n); }
int get_num_threads() { return cpu::num_threads(); }
bool set_flush_denormal(bool on) { return cpu::set_flush_denormal(on); }

}  // namespace kiln
