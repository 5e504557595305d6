// Placeholder until the kernels land.
#include "backends/cpu/kernels.h"
namespace kiln::cpu {
void random_kernel(const OpCall& c, const InferredMeta&, std::span<Tensor>) { throw Error(c.name(), "no cpu kernel yet", c.loc); }
}  // namespace kiln::cpu
