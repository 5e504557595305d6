#pragma once
/// Parameter initialisation, in place under no_grad, as torch.nn.init documents it.
/// Random draws come from the global Philox generator (kiln::manual_seed).
#include "core/tensor.h"

namespace kiln::nn::init {

/// fan_in, fan_out of a weight [out, in, ...] (receptive field = product of dims past 2).
std::pair<int64_t, int64_t> fans(const Tensor& w);
void uniform_(Tensor& t, double low, double high);
void normal_(Tensor& t, double mean = 0, double std = 1);
void zeros_(Tensor& t);
void ones_(Tensor& t);
/// U(−b, b) with b = gain·√(6/(fan_in+fan_out)) (Glorot & Bengio 2010).
void xavier_uniform_(Tensor& t, double gain = 1);
/// U(−b, b) with b = gain·√(3/fan_in), gain = √(2/(1+a²)) (He et al. 2015, leaky_relu gain).
void kaiming_uniform_(Tensor& t, double a = 0);

}  // namespace kiln::nn::init
