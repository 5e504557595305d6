// nn modules, optimisers and serialisation against hand-computed values.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>

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
