// nn modules, optimisers and serialisation against hand-computed values.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <functional>

#include "backends/cuda/driver.h"
#include "error_of.h"
#include "kiln/nn.h"

using namespace kiln;
using namespace kiln::nn;
using V = std::vector<float>;

static void set(Tensor& t, const Tensor& v) {
  NoGradGuard ng;
  t.copy_(v);
}

TEST_CASE("Linear computes x Wᵀ + b and registers its parameters") {
  Linear lin(3, 2);
  set(lin.weight, tensor({{1.f, 2.f, 3.f}, {-1.f, 0.f, 1.f}}));
  set(lin.bias, tensor({0.5f, -0.5f}));
  Tensor y = lin(tensor({{1.f, 1.f, 1.f}, {2.f, 0.f, -1.f}}));
  CHECK(y.to_vector<float>() == V{6.5, -0.5, -0.5, -3.5});
  auto named = lin.named_parameters();
  REQUIRE(named.size() == 2);
  CHECK(named[0].first == "weight");
  CHECK(named[1].first == "bias");
  CHECK(lin.weight.requires_grad());
  // 3-D input goes through matmul + bias.
  CHECK(lin(ones({2, 2, 3})).shape() == Shape{2, 2, 2});
}

TEST_CASE("Linear initialisation is U(-1/sqrt(in), 1/sqrt(in))") {
  manual_seed(0);
  Linear lin(100, 50);
  double bound = 1 / std::sqrt(100.0);
  CHECK(amax(abs(lin.weight)).item<float>() <= bound);
  CHECK(amax(abs(lin.weight)).item<float>() > 0.9 * bound);
  // Variance of U(-b, b) is b²/3.
  CHECK(var(lin.weight).item<float>() == Approx(bound * bound / 3).epsilon(0.1));
}

TEST_CASE("LayerNorm normalises the last dim, then scales and shifts") {
  LayerNorm ln(Shape{3});
  set(ln.weight, tensor({1.f, 2.f, 0.5f}));
  set(ln.bias, tensor({0.f, 1.f, -1.f}));
  Tensor y = ln(tensor({{1.f, 2.f, 3.f}}));
  // mean 2, biased var 2/3 → x̂ = [-1.2247, 0, 1.2247]
  double s = 1 / std::sqrt(2.0 / 3 + 1e-5);
  auto v = y.to_vector<float>();
  CHECK(v[0] == Approx(-s));
  CHECK(v[1] == Approx(1.0));
  CHECK(v[2] == Approx(0.5 * s - 1));
}

TEST_CASE("attention on a 2x3 example matches a hand computation") {
  // One head, E = 3, identity projections: out = softmax(Q Kᵀ/√3) V.
  MultiheadAttention mha(3, 1, 0.0, /*bias=*/false, /*batch_first=*/true);
  set(mha.in_proj_weight, cat({eye(3), eye(3), eye(3)}, 0));
  set(mha.out_proj->weight, eye(3));
  Tensor x = tensor({{1.f, 0.f, 1.f}, {0.f, 2.f, 0.f}}).unsqueeze(0);  // [1, 2, 3]
  auto r = mha.forward(x, x, x);
  // scores/√3: [[2, 0], [0, 4]]/√3
  double s = 1 / std::sqrt(3.0);
  double a00 = std::exp(2 * s) / (std::exp(2 * s) + 1), a11 = std::exp(4 * s) / (std::exp(4 * s) + 1);
  auto w = r.weights.to_vector<float>();
  CHECK(w[0] == Approx(a00));
  CHECK(w[1] == Approx(1 - a00));
  CHECK(w[3] == Approx(a11));
  auto o = r.output.to_vector<float>();
  CHECK(o[0] == Approx(a00 * 1));
  CHECK(o[1] == Approx((1 - a00) * 2));
  CHECK(o[4] == Approx(a11 * 2));
  // Causal: row 0 sees only key 0.
  auto rc = mha.forward(x, x, x, Tensor(), Tensor(), true, /*is_causal=*/true);
  CHECK(rc.weights.to_vector<float>()[1] == 0);
  CHECK(rc.output.to_vector<float>()[0] == Approx(1));
  // Key padding: mask key 1 everywhere.
  auto rp = mha.forward(x, x, x, tensor({{false, true}}));
  CHECK(rp.weights.to_vector<float>()[2] == Approx(1));
  CHECK_THROWS_AS(MultiheadAttention(10, 3), Error);
}

TEST_CASE("MultiheadAttention takes unbatched [L, E] input and a float key_padding_mask as "
          "PyTorch 1.13") {
  // torch.nn.MultiheadAttention(4, 2) with these weights, query [3, 4], key = value [5, 4],
  // key_padding_mask float [5] (added to the scores): output [3, 4], weights [3, 5].
  MultiheadAttention mha(4, 2);
  {
    NoGradGuard ng;
    mha.in_proj_weight.copy_(sin(arange(48, DType::Float32) * 0.1).view({12, 4}) * 0.5);
    mha.in_proj_bias.copy_(arange(12, DType::Float32) * 0.01);
    mha.out_proj->weight.copy_(cos(arange(16, DType::Float32) * 0.2).view({4, 4}) * 0.5);
    mha.out_proj->bias.copy_(arange(4, DType::Float32) * -0.02);
  }
  Tensor q = sin(arange(12, DType::Float32) * 0.3).view({3, 4});
  Tensor k = cos(arange(20, DType::Float32) * 0.17).view({5, 4});
  Tensor kpm = tensor({0.f, -1.f, 0.5f, 0.f, -2.f});
  AttentionOutput r = mha.forward(q, k, k, kpm);
  REQUIRE(r.output.shape() == Shape{3, 4});
  REQUIRE(r.weights.shape() == Shape{3, 5});
  V out{-0.6644538640975952f, -0.26832765340805054f, 0.27843084931373596f, 0.6320334076881409f,
        -1.2472569942474365f, -0.49025097489356995f, 0.5520029664039612f, 1.2351558208465576f,
        -0.3283657133579254f, -0.12257187068462372f, 0.1454406976699829f, 0.30096742510795593f};
  V w{0.42952996492385864f, 0.11882799118757248f, 0.32135164737701416f, 0.11813239753246307f,
      0.012158000841736794f, 0.6111781001091003f, 0.12785018980503082f, 0.21005938947200775f,
      0.04719329625368118f, 0.0037190569564700127f, 0.32539308071136475f, 0.1047685444355011f,
      0.3705403208732605f, 0.1780671626329422f, 0.021230854094028473f};
  V got = r.output.to_vector<float>(), gw = r.weights.to_vector<float>();
  for (size_t i = 0; i < out.size(); ++i) CHECK(got[i] == Approx(out[i]).margin(2e-6));
  for (size_t i = 0; i < w.size(); ++i) CHECK(gw[i] == Approx(w[i]).margin(2e-6));
  // A bool mask and the float mask of -inf at the same keys agree.
  Tensor bool_kpm = tensor({false, true, false, false, true});
  Tensor inf_kpm = tensor({0.f, -INFINITY, 0.f, 0.f, -INFINITY});
  CHECK(mha.forward(q, k, k, bool_kpm).output.to_vector<float>() ==
        mha.forward(q, k, k, inf_kpm).output.to_vector<float>());
}

TEST_CASE("attention masks: per batch and head [B*H, L, S] as PyTorch; integer masks and other "
          "shapes raise") {
  manual_seed(4);
  MultiheadAttention mha(4, 2, 0.0, true, /*batch_first=*/true);
  Tensor x = randn({2, 3, 4});
  // Masking key 2 for batch 1, head 0 only: that row of the weights (averaged over heads) is
  // half the mean of the unmasked heads' weight on key 2.
  std::vector<float> m(2 * 2 * 3 * 3, 0.f);
  for (int l = 0; l < 3; ++l) m[((1 * 2 + 0) * 3 + l) * 3 + 2] = -INFINITY;
  Tensor mask3 = from_vector<float>(m, {4, 3, 3});
  auto full = mha.forward(x, x, x, Tensor(), Tensor(), true);
  auto masked = mha.forward(x, x, x, Tensor(), mask3, true);
  std::vector<float> wf = full.weights.to_vector<float>(), wm = masked.weights.to_vector<float>();
  for (int l = 0; l < 3; ++l) {
    CHECK(wm[(0 * 3 + l) * 3 + 2] == Approx(wf[(0 * 3 + l) * 3 + 2]));  // batch 0 untouched
    CHECK(wm[(1 * 3 + l) * 3 + 2] < wf[(1 * 3 + l) * 3 + 2]);
  }
  // A [L, S] mask repeated over batch and heads equals the 2-D mask.
  Tensor mask2 = from_vector<float>({0, -INFINITY, 0, 0, 0, -INFINITY, 0, 0, 0}, {3, 3});
  auto r2 = mha.forward(x, x, x, Tensor(), mask2, true);
  auto r3 = mha.forward(x, x, x, Tensor(), mask2.unsqueeze(0).expand({4, 3, 3}), true);
  CHECK(r3.output.to_vector<float>() == r2.output.to_vector<float>());
  // A float64 mask (or key_padding_mask) is taken in the scores' dtype: the output of a
  // float32 module turned float64 (break-it pass).
  auto r64 = mha.forward(x, x, x, zeros({2, 3}, {DType::Float64}), mask2.to(DType::Float64), true);
  CHECK(r64.output.dtype() == DType::Float32);
  CHECK(r64.weights.dtype() == DType::Float32);
  CHECK(r64.output.to_vector<float>() == r2.output.to_vector<float>());
  auto error_of = [&](const Tensor& mask) {
    try {
      mha.forward(x, x, x, Tensor(), mask);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  CHECK_THAT(error_of(ones({3, 3}, {DType::Int64})),
             Catch::Contains("attn_mask must be bool or floating point, got int64"));
  CHECK_THAT(error_of(zeros({4, 4})),
             Catch::Contains("attn_mask must be [3, 3] or [4, 3, 3] (batch x heads, L, S), got [4, 4]"));
}

TEST_CASE("attention: a batch row whose keys are all masked has NaN gradients, bool or float") {
  // Review (a new user's trial): a bool key_padding_mask masking every key of a row gave q and
  // k zero gradients and the key projection finite ones; a float -inf mask (and PyTorch 1.13,
  // which adds a bool mask as 0 / -inf) gives NaN.
  manual_seed(5);
  MultiheadAttention mha(4, 2, 0.0, true, /*batch_first=*/true);
  Tensor kpm = zeros({2, 3}, {DType::Bool});
  kpm.select(0, 1).fill_(true);
  Tensor inf_kpm = masked_fill(zeros({2, 3}), kpm, -INFINITY);
  for (const Tensor& mask : {kpm, inf_kpm}) {
    INFO(kiln::name(mask.dtype()));
    Tensor q = randn({2, 2, 4}).requires_grad_(), kv = randn({2, 3, 4}).requires_grad_();
    mha.zero_grad();
    mha.forward(q, kv, kv, mask).output.sum().backward();
    auto has_nan = [](const Tensor& t) { return isnan(t).any().item<bool>(); };
    CHECK_FALSE(has_nan(q.grad().select(0, 0)));  // batch 0 is unmasked
    CHECK(has_nan(q.grad().select(0, 1)));
    CHECK(has_nan(mha.in_proj_weight.grad().slice(0, 4, 8)));  // the key projection
  }
}

TEST_CASE("TransformerEncoder runs forward and backward with the expected parameter names") {
  manual_seed(1);
  TransformerEncoderLayerOptions o;
  o.d_model = 8;
  o.nhead = 2;
  o.dim_feedforward = 16;
  o.activation = "gelu";
  o.batch_first = true;
  TransformerEncoder enc(o, 2);
  Tensor x = randn({2, 5, 8});
  Tensor y = enc(x);
  CHECK(y.shape() == Shape{2, 5, 8});
  // Post-norm output: each position normalised (weight 1, bias 0 at init).
  CHECK(amax(abs(mean(y, {-1}))).item<float>() < 1e-5);
  sum(y).backward();
  auto names = enc.named_parameters();
  CHECK(names.front().first == "layers.0.self_attn.in_proj_weight");
  CHECK(names.size() == 2 * 12);
  for (auto& [n, p] : names) {
    INFO(n);
    CHECK(p.grad().defined());
  }
  enc.eval();
  CHECK_FALSE(enc.layers[0]->dropout->is_training());
  o.norm_first = true;
  TransformerEncoderLayer pre(o);
  CHECK(pre(x).shape() == Shape{2, 5, 8});
}

TEST_CASE("SGD with momentum and nesterov matches hand-computed updates") {
  Tensor p = tensor({1.0f}).requires_grad_();
  SGD opt({p}, {.lr = 0.1, .momentum = 0.9});
  for (int i = 0; i < 2; ++i) {
    opt.zero_grad();
    (p * p).sum().backward();  // g = 2p
    opt.step();
  }
  // step 1: g=2, buf=2, p=0.8; step 2: g=1.6, buf=0.9*2+1.6=3.4, p=0.8-0.34=0.46
  CHECK(p.item<float>() == Approx(0.46));
  Tensor q = tensor({1.0f}).requires_grad_();
  SGD nes({q}, {.lr = 0.1, .momentum = 0.9, .weight_decay = 0.5, .nesterov = true});
  (q * q).sum().backward();
  nes.step();  // g = 2 + 0.5 = 2.5, buf = 2.5, g = 2.5 + 0.9*2.5 = 4.75 → 1 - 0.475
  CHECK(q.item<float>() == Approx(0.525));
}

TEST_CASE("AdamW first steps match the formula") {
  Tensor p = tensor({1.0f, -2.0f}).requires_grad_();
  AdamW opt({p}, {.lr = 0.1, .weight_decay = 0.1});
  (p * 3.0f).sum().backward();  // g = 3
  opt.step();
  // decay: p *= 0.99; m̂ = 3, v̂ = 9 → p -= 0.1 * 3/(3 + 1e-8)
  auto v = p.to_vector<float>();
  CHECK(v[0] == Approx(0.99 - 0.1));
  CHECK(v[1] == Approx(-1.98 - 0.1));
}

TEST_CASE("clip_grad_norm_ scales gradients to the max norm") {
  Tensor a = tensor({3.0f}).requires_grad_(), b = tensor({4.0f}).requires_grad_();
  (a * a * 0.5f + b * b * 0.5f).sum().backward();  // grads 3 and 4, norm 5
  Tensor n = clip_grad_norm_({a, b}, 1.0);
  CHECK(n.item<float>() == Approx(5));
  CHECK(a.grad().item<float>() == Approx(0.6).epsilon(1e-5));
  CHECK(b.grad().item<float>() == Approx(0.8).epsilon(1e-5));
}

TEST_CASE("AdamW over 3 steps matches a float64 reference of torch.optim.AdamW") {
  // Gradient of sum(c·p²) is 2c·p, so it changes with p from step to step.
  const std::vector<double> p0 = {1.0, -2.0, 0.5, 3.0}, c = {0.5, 1.5, -2.0, 0.25};
  AdamWOptions o{.lr = 0.05, .beta1 = 0.8, .beta2 = 0.95, .eps = 1e-6, .weight_decay = 0.1};
  Tensor p = from_vector(std::vector<float>(p0.begin(), p0.end()), {4}).requires_grad_();
  Tensor cf = from_vector(std::vector<float>(c.begin(), c.end()), {4});
  AdamW opt({p}, o);
  // Hand-computed float64 reference (torch.optim.AdamW, single-tensor path).
  std::vector<double> rp = p0, rm(4, 0), rv(4, 0);
  for (int t = 1; t <= 3; ++t) {
    opt.zero_grad();
    (cf * p * p).sum().backward();
    opt.step();
    double bc1 = 1 - std::pow(o.beta1, t), bc2 = 1 - std::pow(o.beta2, t);
    for (size_t i = 0; i < 4; ++i) {
      double g = 2 * c[i] * rp[i];
      rp[i] *= 1 - o.lr * o.weight_decay;
      rm[i] = o.beta1 * rm[i] + (1 - o.beta1) * g;
      rv[i] = o.beta2 * rv[i] + (1 - o.beta2) * g * g;
      double denom = std::sqrt(rv[i]) / std::sqrt(bc2) + o.eps;
      rp[i] -= o.lr / bc1 * rm[i] / denom;
    }
    auto got = p.to_vector<float>(), m = opt.exp_avg(0).to_vector<float>(),
         v = opt.exp_avg_sq(0).to_vector<float>();
    for (size_t i = 0; i < 4; ++i) {
      CHECK(got[i] == Approx(rp[i]).epsilon(1e-5));
      CHECK(m[i] == Approx(rm[i]).epsilon(1e-5));
      CHECK(v[i] == Approx(rv[i]).epsilon(1e-5));
    }
    CHECK(opt.step_count() == t);
  }
  CHECK(p.dtype() == DType::Float32);
  CHECK(opt.exp_avg(0).dtype() == DType::Float32);
  CHECK(opt.step_tensor().dtype() == DType::Float64);
  CHECK(opt.step_tensor().dim() == 0);
}

TEST_CASE("optimiser state exists up front and is updated in place") {
  Tensor a = tensor({1.0f, 2.0f}).requires_grad_(), b = tensor({-1.0f}).requires_grad_();
  AdamW adam({a, b});
  // Created in the constructor, before any step.
  REQUIRE(adam.exp_avg(0).defined());
  REQUIRE(adam.exp_avg_sq(1).defined());
  REQUIRE(adam.step_tensor().defined());
  CHECK(adam.step_count() == 0);
  auto step_impl = adam.step_tensor().impl_ptr();
  auto m0 = adam.exp_avg(0).impl_ptr(), v0 = adam.exp_avg_sq(0).impl_ptr();
  auto m1 = adam.exp_avg(1).impl_ptr(), v1 = adam.exp_avg_sq(1).impl_ptr();
  Tensor a_before = a, b_before = b;
  for (int s = 0; s < 3; ++s) {
    adam.zero_grad();
    (a * a).sum().backward();  // b gets no gradient: skipped
    adam.step();
    CHECK(adam.step_tensor().impl_ptr() == step_impl);
    CHECK(adam.exp_avg(0).impl_ptr() == m0);
    CHECK(adam.exp_avg_sq(0).impl_ptr() == v0);
    CHECK(adam.exp_avg(1).impl_ptr() == m1);
    CHECK(adam.exp_avg_sq(1).impl_ptr() == v1);
    CHECK(a.is_same(a_before));
  }
  CHECK(adam.step_count() == 3);
  CHECK(adam.exp_avg(0).to_vector<float>() != V{0, 0});
  CHECK(b.item<float>() == -1.0f);  // never had a gradient: untouched
  CHECK(adam.exp_avg(1).item<float>() == 0.0f);
  CHECK(b.is_same(b_before));

  Tensor q = tensor({1.0f}).requires_grad_();
  SGD sgd({q}, {.lr = 0.1, .momentum = 0.9});
  REQUIRE(sgd.momentum_buffer(0).defined());
  auto buf = sgd.momentum_buffer(0).impl_ptr();
  std::vector<float> seen;
  for (int s = 0; s < 2; ++s) {
    sgd.zero_grad();
    (q * q).sum().backward();
    sgd.step();
    CHECK(sgd.momentum_buffer(0).impl_ptr() == buf);
    seen.push_back(sgd.momentum_buffer(0).item<float>());
  }
  // buf = g = 2 on the first step, then 0.9·2 + 1.6 = 3.4.
  CHECK(seen[0] == Approx(2.0));
  CHECK(seen[1] == Approx(3.4));
}

TEST_CASE("clip_grad_norm_ returns the norm as a tensor and leaves small gradients alone") {
  Tensor a = tensor({{1.0f, -2.0f}, {2.0f, 0.0f}}).requires_grad_();
  Tensor b = tensor({4.0f}).requires_grad_(), none = tensor({7.0f}).requires_grad_();
  (a * tensor({{0.5f, 1.5f}, {-1.0f, 3.0f}})).sum().backward();  // grads 0.5 1.5 -1 3
  (b * 2.0f).sum().backward();                                    // grad 2
  // norm = sqrt(0.25 + 2.25 + 1 + 9 + 4) = sqrt(16.5)
  double norm = std::sqrt(16.5);
  Tensor n = clip_grad_norm_({a, b, none}, 2.0);
  CHECK(n.dim() == 0);
  CHECK(n.dtype() == DType::Float32);
  CHECK(n.item<float>() == Approx(norm));
  double scale = 2.0 / (norm + 1e-6);
  auto ga = a.grad().to_vector<float>();
  V want = {0.5f, 1.5f, -1.0f, 3.0f};
  for (size_t i = 0; i < 4; ++i) CHECK(ga[i] == Approx(want[i] * scale).epsilon(1e-6));
  CHECK(b.grad().item<float>() == Approx(2 * scale).epsilon(1e-6));
  CHECK_FALSE(none.grad().defined());
  // The clipped norm is max_norm (up to the 1e-6 guard).
  double clipped = std::sqrt(sum(a.grad() * a.grad()).item<float>() + 4 * scale * scale);
  CHECK(clipped == Approx(2.0).epsilon(1e-5));
  // Below max_norm the gradients are unchanged (scale clamps to exactly 1).
  auto before = a.grad().to_vector<float>();
  Tensor n2 = clip_grad_norm_({a, b}, 100.0);
  CHECK(n2.item<float>() == Approx(2.0).epsilon(1e-5));
  CHECK(a.grad().to_vector<float>() == before);
}

TEST_CASE("tensor-state optimisers equal the host-scalar eager formulas bitwise") {
  // The pre-compile implementation (host step counter, lazily created, rebound state) written
  // out with the same float32 ops; the tensor-state optimisers must give identical bits.
  manual_seed(3);
  Tensor w0 = randn({3, 5}), x = randn({4, 3});
  auto loss = [&](const Tensor& w) { return (tanh(matmul(x, w)) * matmul(x, w)).sum(); };
  {
    AdamWOptions o{.lr = 0.01, .beta1 = 0.85, .beta2 = 0.99, .eps = 1e-7, .weight_decay = 0.05};
    Tensor w = w0.clone().requires_grad_(), r = w0.clone().requires_grad_();
    AdamW opt({w}, o);
    Tensor m = zeros_like(r), v = zeros_like(r);
    for (int t = 1; t <= 6; ++t) {
      opt.zero_grad();
      loss(w).backward();
      opt.step();
      r.set_grad(Tensor());
      loss(r).backward();
      NoGradGuard ng;
      Tensor g = r.grad();
      double bc1 = 1 - std::pow(o.beta1, double(t)), bc2 = 1 - std::pow(o.beta2, double(t));
      r *= 1 - o.lr * o.weight_decay;
      m = m * o.beta1 + g * (1 - o.beta1);
      v = v * o.beta2 + g * g * (1 - o.beta2);
      r -= m / (sqrt(v) * (1 / std::sqrt(bc2)) + o.eps) * (o.lr / bc1);
      CHECK(w.to_vector<float>() == r.to_vector<float>());
    }
  }
  for (bool nesterov : {false, true}) {
    SGDOptions o{.lr = 0.05, .momentum = 0.9, .dampening = nesterov ? 0 : 0.3,
                 .weight_decay = 0.01, .nesterov = nesterov};
    Tensor w = w0.clone().requires_grad_(), r = w0.clone().requires_grad_();
    SGD opt({w}, o);
    Tensor buf;
    for (int t = 1; t <= 4; ++t) {
      opt.zero_grad();
      loss(w).backward();
      opt.step();
      r.set_grad(Tensor());
      loss(r).backward();
      NoGradGuard ng;
      Tensor g = r.grad() + r * o.weight_decay;
      buf = buf.defined() ? buf * o.momentum + g * (1 - o.dampening) : g.clone();
      g = nesterov ? g + buf * o.momentum : buf;
      r -= g * o.lr;
      CHECK(w.to_vector<float>() == r.to_vector<float>());
    }
  }
}

TEST_CASE("state_dict round-trips through a safetensors file") {
  manual_seed(5);
  auto make = [] {
    return std::make_shared<Sequential>(std::initializer_list<std::shared_ptr<Module>>{
        std::make_shared<Linear>(4, 3), std::make_shared<ReLU>(), std::make_shared<Linear>(3, 2)});
  };
  auto a = make(), b = make();
  std::string path = "kiln_test_state.safetensors";
  a->save(path);
  Tensor x = randn({5, 4});
  CHECK(a->forward(x).to_vector<float>() != b->forward(x).to_vector<float>());
  b->load(path);
  CHECK(a->forward(x).to_vector<float>() == b->forward(x).to_vector<float>());
  auto dict = load_safetensors(path);
  REQUIRE(dict.size() == 4);
  CHECK(dict[0].first == "0.weight");
  CHECK(dict[0].second.shape() == Shape{3, 4});
  // Errors name the key.
  Linear other(4, 4);
  CHECK_THROWS_WITH(other.load_state_dict(a->state_dict()), Catch::Contains("\"weight\""));
  CHECK_THROWS_WITH(load_safetensors("does_not_exist.safetensors"), Catch::Contains("cannot open"));
  std::remove(path.c_str());
}

TEST_CASE("training an MLP on a fixed problem reaches a low loss") {
  // XOR-like 2-D classification of 4 clusters, 2 classes.
  manual_seed(42);
  Tensor centers = tensor({{1.f, 1.f}, {-1.f, -1.f}, {1.f, -1.f}, {-1.f, 1.f}});
  Tensor labels = tensor({0, 0, 1, 1}).to(DType::Int64);
  Tensor idx = randint(0, 4, {256});
  Tensor x = index_select(centers, 0, idx) + randn({256, 2}) * 0.2;
  Tensor y = index_select(labels, 0, idx);
  Sequential model{std::make_shared<Linear>(2, 16), std::make_shared<ReLU>(),
                   std::make_shared<Linear>(16, 2)};
  AdamW opt(model.parameters(), {.lr = 0.05});
  CrossEntropyLoss loss_fn;
  float first = 0, last = 0;
  for (int step = 0; step < 200; ++step) {
    opt.zero_grad();
    Tensor loss = loss_fn(model(x), y);
    loss.backward();
    opt.step();
    if (step == 0) first = loss.item<float>();
    last = loss.item<float>();
  }
  CHECK(first > 0.5);
  CHECK(last < 0.05);
  Tensor acc = mean(eq(argmax(model(x), 1), y).to(DType::Float32));
  CHECK(acc.item<float>() > 0.98);
}

using kiln::testing::error_of;

TEST_CASE("AdamW keeps one step count per parameter, advanced only when it has a gradient "
          "(torch.optim.AdamW's state[p]['step'])") {
  // PyTorch 1.13 reference (a and b after each step, printed with %.9g):
  //   a = tensor([1., -2.], requires_grad=True); b = tensor([.5], requires_grad=True)
  //   opt = AdamW([a, b], lr=0.05, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1)
  //   per step: a.requires_grad_(ta); b.requires_grad_(tb); opt.zero_grad(set_to_none=True)
  //   loss = (tensor([.5, 1.5]) * a * a).sum() + (tensor([-2.]) * b * b).sum()
  //   if backward: loss.backward()
  //   opt.step()
  // b first trains at step 2 with t = 1 (the optimizer-wide count would give t = 2); step 3
  // freezes a; step 5 has no gradient at all and counts for nobody.
  struct Step {
    bool ta, tb, backward;
    V a, b;
    int64_t t_a, t_b;
  };
  const std::vector<Step> steps = {
      {true, false, true, {0.945000052f, -1.94000006f}, {0.5f}, 1, 0},
      {true, true, true, {0.890416026f, -1.88037097f}, {0.547499955f}, 2, 1},
      {false, true, true, {0.890416026f, -1.88037097f}, {0.594904602f}, 2, 2},
      {true, true, true, {0.836348891f, -1.82115984f}, {0.642294824f}, 3, 3},
      {true, true, false, {0.836348891f, -1.82115984f}, {0.642294824f}, 3, 3},
      {true, true, true, {0.782905459f, -1.7624141f}, {0.689739585f}, 4, 4},
  };
  Tensor a = tensor({1.0f, -2.0f}).requires_grad_(), b = tensor({0.5f}).requires_grad_();
  Tensor ca = tensor({0.5f, 1.5f}), cb = tensor({-2.0f});
  AdamW opt({a, b}, {.lr = 0.05, .beta1 = 0.8, .beta2 = 0.95, .eps = 1e-6, .weight_decay = 0.1});
  int64_t calls_that_updated = 0;
  for (size_t s = 0; s < steps.size(); ++s) {
    INFO("step " << s + 1);
    const Step& st = steps[s];
    a.requires_grad_(st.ta);
    b.requires_grad_(st.tb);
    opt.zero_grad();
    Tensor loss = (ca * a * a).sum() + (cb * b * b).sum();
    if (st.backward) loss.backward();
    opt.step();
    calls_that_updated += st.backward;
    auto ga = a.to_vector<float>(), gb = b.to_vector<float>();
    for (size_t i = 0; i < 2; ++i) CHECK(ga[i] == Approx(st.a[i]).epsilon(1e-6));
    CHECK(gb[0] == Approx(st.b[0]).epsilon(1e-6));
    CHECK(opt.step_count(0) == st.t_a);
    CHECK(opt.step_count(1) == st.t_b);
    CHECK(opt.step_count() == calls_that_updated);
  }
  CHECK(opt.step_tensor(1).dtype() == DType::Float64);
  CHECK(opt.step_tensor(1).dim() == 0);
}

TEST_CASE("AdamW.step with no gradient at all changes nothing and is not counted") {
  // torch: a = tensor(1., requires_grad=True); AdamW([a], lr=0.1, weight_decay=0); step 0 has
  // no backward, steps 1 and 2 backward a*3 → a = 0.8, state[a]['step'] = 2 (Adam's first two
  // steps move by lr each: m̂/√v̂ = 1 for a constant gradient, up to eps).
  Tensor a = scalar_tensor(1.0f).requires_grad_();
  AdamW opt({a}, {.lr = 0.1, .weight_decay = 0});
  opt.step();
  CHECK(opt.step_count() == 0);
  CHECK(opt.step_count(0) == 0);
  CHECK(a.item<float>() == 1.0f);
  for (int s = 0; s < 2; ++s) {
    opt.zero_grad();
    (a * 3.0f).backward();
    opt.step();
  }
  CHECK(a.item<float>() == Approx(0.8).epsilon(1e-6));
  CHECK(opt.step_count() == 2);
  CHECK(opt.step_count(0) == 2);
}

TEST_CASE("optimizers accept frozen parameters and train them once unfrozen; a non-leaf is "
          "rejected naming its index and shape") {
  Tensor w = tensor({1.0f, 2.0f}), b = tensor({3.0f}).requires_grad_();  // w frozen
  SGD sgd({w, b}, {.lr = 0.1, .momentum = 0.9});
  AdamW adam({w, b});
  (b * 2.0f).sum().backward();
  sgd.step();
  CHECK(w.to_vector<float>() == V{1.0f, 2.0f});
  CHECK(b.item<float>() == Approx(3 - 0.1 * 2));
  // Unfrozen: SGD's first step with its gradient (buf = g = 1 for sum(w)): w −= 0.1.
  w.requires_grad_();
  sgd.zero_grad();
  w.sum().backward();
  sgd.step();
  CHECK(w.to_vector<float>()[0] == Approx(0.9));
  CHECK(w.to_vector<float>()[1] == Approx(1.9));

  Tensor leaf = tensor({1.0f, 2.0f, 3.0f}).requires_grad_();
  Tensor computed = leaf * 2.0f;
  Error e = error_of([&] { SGD({leaf, computed}, {.lr = 0.1}); });
  CHECK_THAT(e.what(), Catch::Contains("parameter 1 (float32 [3]) is not a leaf tensor"));
  CHECK(std::string(e.where().file_name()) == __FILE__);
}

TEST_CASE("MultiheadAttention in training returns the dropped-out weights its output used, "
          "averaged over heads (PyTorch 1.13)") {
  // E = 4, H = 2 (head dims {0,1} and {2,3}), identity projections, no bias, dropout 0.5, so
  // head h's output is D_h V_h with D_h = dropout(softmax(Q_h K_hᵀ/√2)) and Q = K = V = x.
  // V_h is invertible, so D_h = out_h V_h⁻¹ is recovered from the output and checked against
  // the float64 softmax (each entry 0 or 2·softmax) and against the returned weights
  // (D_0 + D_1)/2, which is what multi_head_attention_forward returns (sum(dim=1) / H).
  MultiheadAttention mha(4, 2, 0.5, /*bias=*/false, /*batch_first=*/true);
  set(mha.in_proj_weight, cat({eye(4), eye(4), eye(4)}, 0));
  set(mha.out_proj->weight, eye(4));
  const double x[2][4] = {{1, 0, 0.5, 1}, {0, 2, 1, -1}};
  Tensor xt = tensor({{1.f, 0.f, 0.5f, 1.f}, {0.f, 2.f, 1.f, -1.f}}).unsqueeze(0);
  manual_seed(1);
  auto r = mha.forward(xt, xt, xt);
  auto out = r.output.to_vector<float>(), w = r.weights.to_vector<float>();
  REQUIRE(w.size() == 4);
  double avg[2][2] = {};
  int zeros = 0;
  for (int h = 0; h < 2; ++h) {
    double v[2][2] = {{x[0][2 * h], x[0][2 * h + 1]}, {x[1][2 * h], x[1][2 * h + 1]}};
    double det = v[0][0] * v[1][1] - v[0][1] * v[1][0];
    double inv[2][2] = {{v[1][1] / det, -v[0][1] / det}, {-v[1][0] / det, v[0][0] / det}};
    for (int l = 0; l < 2; ++l) {
      double sc[2], z = 0;
      for (int s = 0; s < 2; ++s) {
        sc[s] = (v[l][0] * v[s][0] + v[l][1] * v[s][1]) / std::sqrt(2.0);
        z += std::exp(sc[s]);
      }
      for (int s = 0; s < 2; ++s) {
        double d = out[l * 4 + 2 * h] * inv[0][s] + out[l * 4 + 2 * h + 1] * inv[1][s];
        double kept = 2 * std::exp(sc[s]) / z;
        INFO("head " << h << " row " << l << " col " << s << ": D = " << d);
        CHECK((std::abs(d) < 1e-5 || std::abs(d - kept) < 1e-5));
        zeros += std::abs(d) < 1e-5;
        avg[l][s] += d / 2;
      }
    }
  }
  REQUIRE(zeros > 0);  // dropout did drop something (seed 1), so the rows do not sum to 1
  REQUIRE(zeros < 8);
  for (int l = 0; l < 2; ++l)
    for (int s = 0; s < 2; ++s) CHECK(w[l * 2 + s] == Approx(avg[l][s]).margin(1e-5));
  // In eval mode the weights are the softmax again: rows sum to 1.
  mha.eval();
  auto we = mha.forward(xt, xt, xt).weights.sum({-1}).to_vector<float>();
  CHECK(we[0] == Approx(1.0));
  CHECK(we[1] == Approx(1.0));
}

namespace {
struct Holder : Module {
  Tensor weight;
  explicit Holder(Tensor w) { weight = register_parameter("weight", w); }
  std::string name() const override { return "Holder"; }
};
struct TiedPair : Module {
  std::shared_ptr<Holder> enc, dec;
  TiedPair() {
    Tensor w = ones({3, 2});
    enc = register_module("enc", std::make_shared<Holder>(w));
    dec = register_module("dec", std::make_shared<Holder>(w));
  }
  std::string name() const override { return "TiedPair"; }
};
std::vector<std::string> keys(const StateDict& d) {
  std::vector<std::string> k;
  for (auto& [n, t] : d) k.push_back(n);
  return k;
}
}  // namespace

TEST_CASE("state_dict orders entries as PyTorch: a module's parameters, its buffers, then its "
          "children's") {
  // torch 1.13, root with parameter w, buffer running and child ch (parameter q, buffer c):
  // state_dict keys w, running, ch.q, ch.c (found by a fresh-user trial: kiln listed
  // w ch.q running ch.c).
  struct Child : nn::Module {
    Child() {
      register_parameter("q", ones({2}));
      register_buffer("c", zeros({2}));
    }
    std::string name() const override { return "Child"; }
  };
  struct Root : nn::Module {
    Root() {
      register_parameter("w", ones({3}));
      register_buffer("running", zeros({3}));
      register_module("ch", std::make_shared<Child>());
    }
    std::string name() const override { return "Root"; }
  };
  Root r;
  using S = std::vector<std::string>;
  CHECK(keys(r.state_dict()) == S{"w", "running", "ch.q", "ch.c"});
  CHECK(keys(r.named_parameters()) == S{"w", "ch.q"});
  CHECK(keys(r.named_buffers()) == S{"running", "ch.c"});
}

TEST_CASE("state_dict lists a tied parameter under every name; named_parameters once; "
          "load_state_dict takes both keys") {
  // torch: Holder(w) twice for one Parameter w → state_dict keys enc.weight dec.weight,
  // named_parameters enc.weight; load_state_dict of both keys copies each.
  TiedPair m;
  using S = std::vector<std::string>;
  CHECK(keys(m.state_dict()) == S{"enc.weight", "dec.weight"});
  CHECK(keys(m.named_parameters()) == S{"enc.weight"});
  CHECK(m.state_dict()[1].second.raw_data() == m.enc->weight.raw_data());  // a detached alias
  m.load_state_dict({{"enc.weight", full({3, 2}, 2.0)}, {"dec.weight", full({3, 2}, 2.0)}});
  CHECK(m.enc->weight.to_vector<float>() == V(6, 2.0f));
  CHECK(m.dec->weight.is_same(m.enc->weight));
  // Only one key is a missing key under strict, as in PyTorch.
  CHECK_THROWS_WITH(m.load_state_dict({{"enc.weight", full({3, 2}, 3.0)}}),
                    Catch::Contains("missing keys in state dict: \"dec.weight\""));
  // save/load keep both names.
  std::string path = "kiln_test_tied.safetensors";
  m.save(path);
  CHECK(keys(load_safetensors(path)) == S{"enc.weight", "dec.weight"});
  TiedPair n;
  n.load(path);
  CHECK(n.enc->weight.to_vector<float>() == V(6, 2.0f));
  std::remove(path.c_str());
}

TEST_CASE("register_parameter under an existing name replaces it in place: tying a member "
          "by re-registering it") {
  // The way to write PyTorch's `self.head.weight = self.emb.weight` (whose __setattr__
  // re-registers): the registry then holds emb's tensor, once in parameters().
  struct Tied : Module {
    std::shared_ptr<Embedding> emb;
    std::shared_ptr<Linear> head;
    Tied() {
      emb = register_module("emb", std::make_shared<Embedding>(6, 4));
      head = register_module("head", std::make_shared<Linear>(4, 6, false));
      head->weight = head->register_parameter("weight", emb->weight);
    }
    std::string name() const override { return "Tied"; }
  } m;
  using S = std::vector<std::string>;
  REQUIRE(m.parameters().size() == 1);
  CHECK(m.parameters()[0].is_same(m.emb->weight));
  StateDict sd = m.state_dict();
  CHECK(keys(sd) == S{"emb.weight", "head.weight"});
  CHECK(sd[1].second.raw_data() == m.head->weight.raw_data());
  CHECK(sd[1].second.raw_data() == m.emb->weight.raw_data());
  // Replacing keeps the entry's place; a buffer is replaced the same way.
  Linear lin(2, 3);
  Tensor w = zeros({3, 2});
  lin.weight = lin.register_parameter("weight", w);
  CHECK(keys(lin.named_parameters()) == S{"weight", "bias"});
  CHECK(lin.named_parameters()[0].second.is_same(w));
  CHECK(w.requires_grad());
  lin.register_buffer("scale", ones({1}));
  lin.register_buffer("scale", full({1}, 2.0));
  REQUIRE(lin.named_buffers().size() == 1);
  CHECK(lin.named_buffers()[0].second.item<float>() == 2.0f);
  // A parameter and a buffer cannot share a name (PyTorch: KeyError "already exists"); was
  // listed twice in state_dict(), which then failed to load.
  CHECK_THROWS_WITH(lin.register_parameter("scale", zeros({1})),
                    Catch::Contains("'scale' is already registered as a buffer"));
  CHECK_THROWS_WITH(lin.register_buffer("bias", zeros({3})),
                    Catch::Contains("'bias' is already registered as a parameter"));
  CHECK(keys(lin.state_dict()) == S{"weight", "bias", "scale"});
}

TEST_CASE("cross_entropy and nll_loss take an unbatched [C] input with a 0-d target") {
  // float64 reference: −log_softmax([1, 2, 0.5])[1] = log(e + e² + e^0.5) − 2 (PyTorch 1.13's
  // F.cross_entropy(tensor([1., 2., .5]), tensor(1)) gives the same, 0-d for every reduction).
  Tensor logits = tensor({1.0f, 2.0f, 0.5f});
  Tensor t = scalar_tensor(1, {DType::Int64});
  double want = std::log(std::exp(1.0) + std::exp(2.0) + std::exp(0.5)) - 2;
  for (Reduction r : {Reduction::Mean, Reduction::Sum, Reduction::None}) {
    Tensor l = cross_entropy(logits, t, r);
    CHECK(l.dim() == 0);
    CHECK(l.item<float>() == Approx(want));
  }
  CHECK(nll_loss(tensor({-0.5f, -1.5f}), scalar_tensor(1, {DType::Int64})).item<float>() == 1.5f);
  // Batched and unbatched agree, gradient included.
  Tensor x = logits.clone().requires_grad_();
  cross_entropy(x, t).backward();
  Tensor xb = logits.unsqueeze(0).requires_grad_();
  cross_entropy(xb, t.unsqueeze(0)).backward();
  CHECK(x.grad().to_vector<float>() == xb.grad().to_vector<float>());
  // An ignored target: mean over no targets is nan, none gives 0 (as PyTorch).
  Tensor ign = scalar_tensor(-100, {DType::Int64});
  CHECK(std::isnan(cross_entropy(logits, ign).item<float>()));
  CHECK(cross_entropy(logits, ign, Reduction::None).item<float>() == 0.0f);
  int line = __LINE__ + 1;
  Error e = error_of([&] { cross_entropy(logits, tensor({1}).to(DType::Int64)); });
  CHECK_THAT(e.what(), Catch::Contains("kiln::cross_entropy: expects input [N, C] and target [N] "
                                       "(or [C] and a 0-d target), got [3] and [1]"));
  CHECK(e.where().line() == static_cast<unsigned>(line));
}

TEST_CASE("nn errors name the op, the values and the caller's line: Embedding sizes, SGD "
          "momentum set after construction, init functions") {
  CHECK_THAT(error_of([] { Embedding(-1, 3); }).what(),
             Catch::Contains("kiln::Embedding: num_embeddings and embedding_dim must be "
                             "non-negative, got -1 and 3"));
  Linear l(4, 3);
  SGD sgd(l.parameters(), {.lr = 0.1});
  sgd.options.momentum = 0.9;
  l(ones({2, 4})).sum().backward();
  int line = __LINE__ + 1;
  Error e = error_of([&] { sgd.step(); });
  CHECK_THAT(e.what(), Catch::Contains("kiln::SGD.step: momentum is 0.9 but was 0 at "
                                       "construction"));
  CHECK(std::string(e.where().file_name()) == __FILE__);
  CHECK(e.where().line() == static_cast<unsigned>(line));

  Tensor v = zeros({5});
  line = __LINE__ + 1;
  e = error_of([&] { init::xavier_uniform_(v); });
  CHECK_THAT(e.what(), Catch::Contains("kiln::init.xavier_uniform_: fan in/out need a tensor "
                                       "with at least 2 dims, got shape [5]"));
  CHECK(e.where().line() == static_cast<unsigned>(line));
  CHECK(std::string(e.where().file_name()) == __FILE__);
  e = error_of([&] { init::kaiming_uniform_(v); });
  CHECK_THAT(e.what(), Catch::Contains("kiln::init.kaiming_uniform_"));
  CHECK(std::string(e.where().file_name()) == __FILE__);
  e = error_of([&] { init::uniform_(v, 1, 0); });
  CHECK_THAT(e.what(), Catch::Contains("needs finite low <= high, got low 1 and high 0"));
  CHECK(std::string(e.where().file_name()) == __FILE__);
  e = error_of([&] { init::normal_(v, 0, -1); });
  CHECK_THAT(e.what(), Catch::Contains("a finite std >= 0, got mean 0 and std -1"));
  Tensor undefined;
  e = error_of([&] { init::zeros_(undefined); });
  CHECK_THAT(e.what(), Catch::Contains("kiln::init.zeros_: the tensor to initialise is undefined"));
  // An expanded tensor cannot be written: the error names the init function, not its copy_.
  Tensor expanded = zeros({3}).expand({2, 3});
  e = error_of([&] { init::uniform_(expanded, 0, 1); });
  CHECK_THAT(e.what(), Catch::Contains("kiln::init.uniform_") &&
                           Catch::Contains("refers to a single memory location"));
  CHECK(std::string(e.where().file_name()) == __FILE__);
  e = error_of([&] { init::normal_(expanded); });
  CHECK_THAT(e.what(), Catch::Contains("kiln::init.normal_"));
  e = error_of([&] { Sequential s{std::make_shared<ReLU>(), nullptr}; });
  CHECK_THAT(e.what(), Catch::Contains("kiln::Sequential: submodule \"1\" is null"));
  CHECK(std::string(e.where().file_name()) == __FILE__);
}

TEST_CASE("state_dict entries are detached and share the module's memory") {
  // PyTorch: state_dict() tensors have requires_grad False; writing through one updates the
  // module (sd["bias"].fill_(5) makes l.bias 5).
  nn::Linear l(2, 1);
  nn::StateDict sd = l.state_dict();
  REQUIRE(sd.size() == 2);
  CHECK(sd[1].first == "bias");
  CHECK_FALSE(sd[1].second.requires_grad());
  sd[1].second.fill_(5);
  CHECK(l.bias.to_vector<float>() == std::vector<float>{5});
  CHECK(l.bias.requires_grad());
  // load_state_dict still copies into the parameters.
  nn::Linear m(2, 1);
  m.load_state_dict(l.state_dict());
  CHECK(m.bias.to_vector<float>() == std::vector<float>{5});
  CHECK(m.weight.to_vector<float>() == l.weight.to_vector<float>());
  CHECK(m.weight.requires_grad());
}

TEST_CASE("load_state_dict names a key given twice") {
  nn::Linear l(2, 1);
  nn::StateDict sd = l.state_dict();
  sd.push_back(sd[1]);
  CHECK_THROWS_WITH(l.load_state_dict(sd), Catch::Contains("has the key \"bias\" twice"));
}

TEST_CASE("Linear with zero features is PyTorch's: the output is the bias") {
  nn::Linear l(0, 3);
  CHECK(l.weight.shape() == Shape{3, 0});
  CHECK(l.bias.to_vector<float>() == std::vector<float>{0, 0, 0});  // bound 0 for fan_in 0
  Tensor y = l(empty({2, 0}));
  CHECK(y.shape() == Shape{2, 3});
  CHECK(y.to_vector<float>() == std::vector<float>(6, 0.0f));
  nn::Linear e(4, 0);
  CHECK(e(ones({2, 4})).shape() == Shape{2, 0});
}

TEST_CASE("module constructors name the caller's line") {
  auto line_of = [](auto&& make) -> std::string {
    try {
      make();
    } catch (const Error& e) {
      return std::string(e.where().file_name());
    }
    return "no error";
  };
  auto here = [](const std::string& file) { return file.find("nn_test.cpp") != std::string::npos; };
  CHECK(here(line_of([] { nn::Linear l(-1, 3); })));
  CHECK(here(line_of([] { nn::Embedding e(-2, 3); })));
  CHECK(here(line_of([] { nn::Dropout d(-0.1); })));
  CHECK(here(line_of([] { nn::MultiheadAttention m(5, 2); })));
  nn::TransformerEncoderLayerOptions o;
  o.d_model = 4;
  o.nhead = 2;
  o.activation = "tanh";
  CHECK(here(line_of([&] { nn::TransformerEncoderLayer l(o); })));
  CHECK(here(line_of([&] { nn::TransformerEncoder enc(o, 2); })));
  o.activation = "relu";
  o.nhead = 3;  // 4 % 3 != 0: MultiheadAttention's check, at the user's line
  CHECK(here(line_of([&] { nn::TransformerEncoderLayer l(o); })));
  // The encoder's final norm named stl_construct.h (built through make_shared without the line).
  o.nhead = 2;
  o.layer_norm_eps = -1;
  CHECK(here(line_of([&] { nn::TransformerEncoder enc(o, 0, /*final_norm=*/true); })));
  // Through std::make_shared no user line is known: the message says so.
  try {
    (void)std::make_shared<nn::Linear>(2, -1);
    FAIL("no kiln::Error");
  } catch (const Error& e) {
    CHECK_THAT(e.what(), Catch::Contains("inside the C++ library: an object built through "
                                         "std::make_shared cannot name your line"));
  }
}

TEST_CASE("TransformerEncoderLayer names itself for an unbatched input") {
  nn::TransformerEncoderLayerOptions o;
  o.d_model = 4;
  o.nhead = 2;
  nn::TransformerEncoderLayer layer(o);
  try {
    layer(ones({5, 4}));
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(e.op() == "TransformerEncoderLayer");
    CHECK_THAT(e.message(), Catch::Contains("got [5, 4]"));
  }
}

TEST_CASE("Sequential's null module and Module::to without a device name the caller's line") {
  // Found by a fresh-user trial: these named nn/module.h and nn/module.cpp.
  const std::string here = __FILE__;
  Sequential s;
  try {
    s.push_back(nullptr);
    FAIL("no error");
  } catch (const Error& e) {
    CHECK_THAT(e.what(), Catch::Contains("is null") && Catch::Contains(here));
  }
  // Indexing names the line of seq[i] too; negative indices count from the end.
  s.push_back(std::make_shared<ReLU>());
  s.push_back(std::make_shared<Linear>(2, 3));
  CHECK(s[-1] == s[1]);
  CHECK(s[-2] == s[0]);
  CHECK(s[size_t{1}]->name() == "Linear");
  for (int64_t bad : {int64_t{2}, int64_t{-3}}) {
    try {
      (void)s[bad];
      FAIL("no error");
    } catch (const Error& e) {
      CHECK_THAT(e.what(), Catch::Contains(fmt::format("index {} out of range for 2 modules", bad)) &&
                               Catch::Contains(here));
    }
  }
  if (!cuda::is_available()) {
    Linear lin(2, 2);
    try {
      lin.to(Device::cuda());
      FAIL("no error");
    } catch (const Error& e) {
      CHECK_THAT(e.what(), Catch::Contains("no CUDA device") && Catch::Contains(here));
    }
    CHECK(lin.weight.device().is_cpu());  // nothing moved
  }
  // 2^46 elements: more than a 47-bit address space holds, whatever the overcommit policy.
  try {
    Linear huge(int64_t{1} << 23, int64_t{1} << 23);
    FAIL("no error");
  } catch (const Error& e) {
    CHECK_THAT(e.what(), Catch::StartsWith("kiln::Linear: out of memory") && Catch::Contains(here));
  }
}

TEST_CASE("MultiheadAttention names what differs: embed_dim, batch sizes, key/value lengths") {
  MultiheadAttention mha(8, 2, 0.0, true, true);
  auto what = [&](Shape q, Shape k, Shape v) {
    return std::string(error_of([&] { mha.forward(ones(q), ones(k), ones(v)); }).what());
  };
  CHECK_THAT(what({2, 5, 8}, {2, 6, 8}, {2, 7, 8}),
             Catch::Contains("key and value have different sequence lengths (6 and 7)"));
  CHECK_THAT(what({2, 5, 8}, {3, 6, 8}, {3, 6, 8}),
             Catch::Contains("query [2, 5, 8], key [3, 6, 8], value [3, 6, 8] have different "
                             "batch sizes"));
  CHECK_THAT(what({2, 5, 8}, {2, 6, 4}, {2, 6, 8}), Catch::Contains("do not match embed_dim 8"));
}

TEST_CASE("factories: eye's m and empty sizes, from_vector's negative shape") {
  CHECK(eye(0, int64_t{1} << 40).shape() == Shape{0, int64_t{1} << 40});
  CHECK(eye(3, 0).shape() == Shape{3, 0});
  CHECK(equal(eye(2, -1), eye(2, 2)));
  CHECK_THAT(error_of([] { eye(2, -5); }).what(),
             Catch::Contains("kiln::eye: m must be non-negative (or -1 for n), got -5"));
  int line = __LINE__ + 1;
  Error e = error_of([] { from_vector(std::vector<float>{}, {-1, 0}); });
  CHECK_THAT(e.what(), Catch::Contains("kiln::from_vector"));
  CHECK_THAT(e.what(), Catch::Contains("-1"));
  CHECK(e.where().line() == static_cast<unsigned>(line));
  CHECK(std::string(e.where().file_name()) == __FILE__);
}
