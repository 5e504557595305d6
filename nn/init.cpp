#include "nn/init.h"

#include <cmath>

#include "eager/autograd.h"
#include "eager/factories.h"
#include "eager/ops.h"

namespace kiln::nn::init {

namespace {
void check_defined(const Tensor& t, const char* op, Loc loc) {
  KILN_CHECK(t.defined(), op, loc, "the tensor to initialise is undefined");
}
// Random draws are of floats, as PyTorch's uniform_ / normal_ ("not implemented for 'Long'").
void check_floating(const Tensor& t, const char* op, Loc loc) {
  check_defined(t, op, loc);
  KILN_CHECK(is_floating(t.dtype()), op, loc, "needs a floating-point tensor, got {} {}",
             kiln::name(t.dtype()), to_string(t.shape()));
}
}  // namespace

std::pair<int64_t, int64_t> fans(const Tensor& w, Loc loc) {
  check_defined(w, "init.fans", loc);
  KILN_CHECK(w.dim() >= 2, "init.fans", loc,
             "fan in/out need a tensor with at least 2 dims, got shape {}", to_string(w.shape()));
  int64_t field = 1;
  for (int i = 2; i < w.dim(); ++i) field *= w.size(i);
  return {w.size(1) * field, w.size(0) * field};
}

void uniform_(Tensor& t, double low, double high, Loc loc) {
  check_floating(t, "init.uniform_", loc);
  KILN_CHECK(low <= high && std::isfinite(high - low), "init.uniform_", loc,
             "needs finite low <= high, got low {} and high {}", low, high);
  as_op("init.uniform_", [&] {  // copy_'s errors (an expanded t) name this function
    at_user_line(loc, [&] {
      NoGradGuard ng;
      t.copy_(rand_like(t) * (high - low) + low);
    });
  });
}
void normal_(Tensor& t, double mean, double std, Loc loc) {
  check_floating(t, "init.normal_", loc);
  KILN_CHECK(std >= 0 && std::isfinite(std) && std::isfinite(mean), "init.normal_", loc,
             "needs a finite mean and a finite std >= 0, got mean {} and std {}", mean, std);
  as_op("init.normal_", [&] {  // copy_'s errors (an expanded t) name this function
    at_user_line(loc, [&] {
      NoGradGuard ng;
      t.copy_(randn_like(t) * std + mean);
    });
  });
}
void zeros_(Tensor& t, Loc loc) {
  check_defined(t, "init.zeros_", loc);
  NoGradGuard ng;
  t.fill_(0);
}
void ones_(Tensor& t, Loc loc) {
  check_defined(t, "init.ones_", loc);
  NoGradGuard ng;
  t.fill_(1);
}
// Errors of fans() inside name the function the user called (as_op).
void xavier_uniform_(Tensor& t, double gain, Loc loc) {
  as_op("init.xavier_uniform_", [&] {
    auto [in, out] = fans(t, loc);
    if (t.numel() == 0) return;
    double b = gain * std::sqrt(6.0 / static_cast<double>(in + out));
    uniform_(t, -b, b, loc);
  });
}
void kaiming_uniform_(Tensor& t, double a, Loc loc) {
  as_op("init.kaiming_uniform_", [&] {
    auto [in, out] = fans(t, loc);
    if (t.numel() == 0) return;  // nothing to draw (and no fan to scale by), as PyTorch
    double gain = std::sqrt(2.0 / (1 + a * a));
    double b = gain * std::sqrt(3.0 / static_cast<double>(in));
    uniform_(t, -b, b, loc);
  });
}

}  // namespace kiln::nn::init
