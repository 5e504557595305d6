#include "nn/init.h"

#include <cmath>

#include "eager/autograd.h"
#include "eager/factories.h"
#include "eager/ops.h"

namespace kiln::nn::init {

std::pair<int64_t, int64_t> fans(const Tensor& w) {
  KILN_CHECK(w.dim() >= 2, "init", Loc::current(),
             "fan in/out need a tensor with at least 2 dims, got shape {}", to_string(w.shape()));
  int64_t field = 1;
  for (int i = 2; i < w.dim(); ++i) field *= w.size(i);
  return {w.size(1) * field, w.size(0) * field};
}

void uniform_(Tensor& t, double low, double high) {
  NoGradGuard ng;
  t.copy_(rand_like(t) * (high - low) + low);
}
void normal_(Tensor& t, double mean, double std) {
  NoGradGuard ng;
  t.copy_(randn_like(t) * std + mean);
}
void zeros_(Tensor& t) {
  NoGradGuard ng;
  t.fill_(0);
}
void ones_(Tensor& t) {
  NoGradGuard ng;
  t.fill_(1);
}
void xavier_uniform_(Tensor& t, double gain) {
  auto [in, out] = fans(t);
  double b = gain * std::sqrt(6.0 / static_cast<double>(in + out));
  uniform_(t, -b, b);
}
void kaiming_uniform_(Tensor& t, double a) {
  auto [in, out] = fans(t);
  double gain = std::sqrt(2.0 / (1 + a * a));
  double b = gain * std::sqrt(3.0 / static_cast<double>(in));
  uniform_(t, -b, b);
}

}  // namespace kiln::nn::init
