#pragma once
/// Parameter initialisation, in place under no_grad, as torch.nn.init documents it.
/// Random draws come from the global Philox generator (kiln::manual_seed). Errors (an
/// undefined tensor, fewer than 2 dims for the fan-based ones, low > high, std < 0) are
/// kiln::Error naming the function and `loc`, the caller's line.
#include "core/tensor.h"

namespace kiln::nn::init {

/// fan_in, fan_out of a weight [out, in, ...] (receptive field = product of dims past 2).
/// Throws kiln::Error for fewer than 2 dims.
std::pair<int64_t, int64_t> fans(const Tensor& w, Loc loc = Loc::current());
/// U(low, high); low <= high.
void uniform_(Tensor& t, double low, double high, Loc loc = Loc::current());
/// N(mean, std²); std >= 0.
void normal_(Tensor& t, double mean = 0, double std = 1, Loc loc = Loc::current());
void zeros_(Tensor& t, Loc loc = Loc::current());
void ones_(Tensor& t, Loc loc = Loc::current());
/// U(−b, b) with b = gain·√(6/(fan_in+fan_out)) (Glorot & Bengio 2010).
void xavier_uniform_(Tensor& t, double gain = 1, Loc loc = Loc::current());
/// U(−b, b) with b = gain·√(3/fan_in), gain = √(2/(1+a²)) (He et al. 2015, leaky_relu gain).
void kaiming_uniform_(Tensor& t, double a = 0, Loc loc = Loc::current());

}  // namespace kiln::nn::init
