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
