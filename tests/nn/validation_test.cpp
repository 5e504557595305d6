// Bad settings and options of nn modules and optimizers are kiln::Errors naming the class and
// the user's line, also when a public field is changed after construction (each case from a
// fresh-user review: a crash, a silent fallback or parameters turned to inf / NaN).
#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <string>

#include "kiln/nn.h"

using namespace kiln;
using namespace kiln::nn;

namespace {
// The message of the kiln::Error `f` throws; it must name this file.
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    CHECK(std::string(e.where().file_name()) == __FILE__);
    return e.what();
  }
  FAIL("no kiln::Error");
  return "";
}
}  // namespace

TEST_CASE("MultiheadAttention: heads checked at construction and in forward") {
  CHECK_THAT(error_of([] { MultiheadAttention(-4, 2); }),
             Catch::Contains("embed_dim (-4) and num_heads (2) must be positive"));
  CHECK_THAT(error_of([] { MultiheadAttention(8, 3); }),
             Catch::Contains("embed_dim (8) must be divisible by num_heads (3)"));
  CHECK_THAT(error_of([] { MultiheadAttention(8, 2, 1.5); }),
             Catch::Contains("dropout must be in [0, 1], got 1.5"));
  MultiheadAttention mha(8, 2);
  Tensor x = randn({5, 1, 8});
  mha.num_heads = 0;  // was a division by zero (SIGFPE)
  CHECK_THAT(error_of([&] { mha.forward(x, x, x); }),
             Catch::Contains("kiln::MultiheadAttention: embed_dim (8) and num_heads (0)"));
  mha.num_heads = 3;
  CHECK_THAT(error_of([&] { mha.forward(x, x, x); }),
             Catch::Contains("kiln::MultiheadAttention: embed_dim (8) must be divisible by "
                             "num_heads (3)"));
  mha.num_heads = 4;  // valid: 4 heads of 2
  CHECK(mha.forward(x, x, x).output.shape() == Shape{5, 1, 8});
}

TEST_CASE("TransformerEncoderLayer: an unknown activation set later is an error, not relu") {
  TransformerEncoderLayer layer({.d_model = 8, .nhead = 2, .dim_feedforward = 16});
  layer.options.activation = "tanh";
  CHECK_THAT(error_of([&] { layer(randn({2, 3, 8})); }),
             Catch::Contains("activation must be \"relu\" or \"gelu\", got \"tanh\""));
}

TEST_CASE("TransformerEncoderLayer: d_model not divisible by nhead is named in its terms") {
  // It named MultiheadAttention's embed_dim and num_heads (review).
  CHECK_THAT(error_of([] { TransformerEncoderLayer({.d_model = 8, .nhead = 3}); }),
             Catch::Contains("kiln::TransformerEncoderLayer: d_model (8) must be positive and "
                             "divisible by nhead (3)"));
}

TEST_CASE("LayerNorm: bad sizes and eps at construction") {
  CHECK_THAT(error_of([] { LayerNorm(Shape{-2}); }),
             Catch::Contains("kiln::LayerNorm: normalized_shape [-2] has a size below 1"));
  CHECK_THAT(error_of([] { LayerNorm(Shape{4}, -1.0); }),
             Catch::Contains("kiln::LayerNorm: eps must be >= 0, got -1"));
}

TEST_CASE("optimizers: options are checked at every step, parameters once each") {
  Tensor p = tensor({1.f, -2.f}).requires_grad_();
  AdamW adamw({p}, {.lr = 0.1});
  const std::vector<float> before = p.to_vector<float>();
  auto step = [&] {
    adamw.zero_grad();
    (p * p).sum().backward();
    adamw.step();
  };
  for (auto set : std::vector<std::function<void()>>{
           [&] { adamw.options.beta1 = 1.0; }, [&] { adamw.options.beta2 = 1.5; },
           [&] { adamw.options.eps = NAN; }, [&] { adamw.options.lr = -5; },
           [&] { adamw.options.lr = INFINITY; }}) {
    AdamWOptions good = adamw.options;
    set();
    CHECK_THAT(error_of(step), Catch::Contains("kiln::AdamW.step: invalid options"));
    CHECK(p.to_vector<float>() == before);  // nothing was updated
    adamw.options = good;
  }
  step();
  CHECK(p.to_vector<float>() != before);
  CHECK_THAT(error_of([] { AdamW({ones({1}).requires_grad_()}, {.lr = INFINITY}); }),
             Catch::Contains("kiln::AdamW: invalid options: lr inf"));

  Tensor q = ones({2}).requires_grad_();
  SGD sgd({q}, {.lr = 0.1});
  sgd.options.weight_decay = -1;
  q.sum().backward();
  CHECK_THAT(error_of([&] { sgd.step(); }), Catch::Contains("kiln::SGD.step: invalid options"));
  CHECK_THAT(error_of([&] { SGD({q, q}, {.lr = 0.1}); }),
             Catch::Contains("kiln::Optimizer: parameter 1 is parameter 0 again (float32 [2])"));
  CHECK_THAT(error_of([] { SGD({}, {.lr = 0.1}); }),
             Catch::Contains("kiln::Optimizer: got an empty parameter list"));
}

TEST_CASE("clip_grad_norm_ and init: bad bounds and tensors") {
  Tensor w = ones({3}).requires_grad_();
  w.sum().backward();
  CHECK_THAT(error_of([&] { clip_grad_norm_({w}, -1.0); }),
             Catch::Contains("kiln::clip_grad_norm_: max_norm must be >= 0, got -1"));
  CHECK_THAT(error_of([&] { clip_grad_norm_({w}, NAN); }),
             Catch::Contains("max_norm must be >= 0, got nan"));
  CHECK_THAT(error_of([&] { clip_grad_norm_({w, Tensor()}, 1.0); }),
             Catch::Contains("tensor 1 is undefined"));
  CHECK(w.grad().to_vector<float>() == std::vector<float>{1, 1, 1});  // untouched by the errors
  CHECK(clip_grad_norm_({w}, INFINITY).item<float>() == Approx(std::sqrt(3.0)));
  Tensor t = zeros({4});
  CHECK_THAT(error_of([&] { init::uniform_(t, -INFINITY, INFINITY); }),
             Catch::Contains("needs finite low <= high, got low -inf and high inf"));
  Tensor ids = zeros({4}, {DType::Int64});
  CHECK_THAT(error_of([&] { init::uniform_(ids, 0, 10); }),
             Catch::Contains("kiln::init.uniform_: needs a floating-point tensor, got int64 [4]"));
  CHECK_THAT(error_of([&] { init::normal_(t, NAN, 1); }),
             Catch::Contains("finite mean and a finite std"));
}

// exp_avg(5) crashed (SIGSEGV) and exp_avg_sq / momentum_buffer read past their vectors;
// register_parameter / register_buffer and step_count(i) named kiln's own line (review).
TEST_CASE("optimizer state accessors and register_* check and name the caller's line") {
  Linear lin(4, 3);  // 2 parameters
  AdamW adam(lin.parameters());
  SGD sgd(lin.parameters(), {.lr = 0.1, .momentum = 0.9});
  CHECK_THAT(error_of([&] { (void)adam.exp_avg(5); }),
             Catch::Contains("AdamW.exp_avg") &&
                 Catch::Contains("parameter index 5 out of range for 2 parameters"));
  CHECK_THAT(error_of([&] { (void)adam.exp_avg_sq(2); }), Catch::Contains("AdamW.exp_avg_sq"));
  CHECK_THAT(error_of([&] { (void)adam.step_count(7); }), Catch::Contains("AdamW.step_count"));
  CHECK_THAT(error_of([&] { (void)adam.step_tensor(7); }), Catch::Contains("AdamW.step_tensor"));
  CHECK_THAT(error_of([&] { (void)sgd.momentum_buffer(2); }),
             Catch::Contains("SGD.momentum_buffer"));
  CHECK(adam.exp_avg(1).shape() == Shape{3});
  CHECK(sgd.momentum_buffer(0).shape() == Shape{3, 4});
  CHECK(adam.step_count(1) == 0);

  struct Bare : Module {
    std::string name() const override { return "Bare"; }
    void add(const std::string& n, std::shared_ptr<Module> c, Loc loc = Loc::current()) {
      register_module(n, std::move(c), loc);
    }
  } m;
  m.register_buffer("a", ones({1}));
  m.register_parameter("p", ones({1}));
  CHECK_THAT(error_of([&] { m.register_parameter("a", ones({1})); }),
             Catch::Contains("'a' is already registered as a buffer"));
  CHECK_THAT(error_of([&] { m.register_buffer("p", ones({1})); }),
             Catch::Contains("'p' is already registered as a parameter"));
  // Review: an integer parameter raised under requires_grad_'s name.
  CHECK_THAT(error_of([&] { m.register_parameter("n", tensor({1, 2})); }),
             Catch::Contains("register_parameter") &&
                 Catch::Contains("parameter 'n' must be floating point") &&
                 Catch::Contains("int32 [2]") && Catch::Contains("validation_test.cpp"));
  CHECK(m.named_parameters().size() == 1);
  // Names: the break-it pass found "a.weight" beside a child "a" gave one key twice.
  for (const char* bad : {"", "a.weight"})
    CHECK_THAT(error_of([&] { m.register_parameter(bad, ones({1})); }),
               Catch::Contains("must be non-empty and must not contain '.'"));
  CHECK_THAT(error_of([&] { m.add("", std::make_shared<Linear>(1, 1)); }),
             Catch::Contains("register_module") && Catch::Contains("must be non-empty"));
  CHECK_THAT(error_of([&] { m.add("p", std::make_shared<Linear>(1, 1)); }),
             Catch::Contains("'p' is already registered as a parameter"));
  m.add("fc", std::make_shared<Linear>(1, 1));
  CHECK_THAT(error_of([&] { m.register_buffer("fc", ones({1})); }),
             Catch::Contains("'fc' is already registered as a submodule"));
}

TEST_CASE("register_module under an existing name replaces the child, as add_module") {
  // A second child of one name kept the first: parameters() trained both and save() failed.
  struct Net : Module {
    std::shared_ptr<Linear> fc;
    Net() {
      fc = register_module("fc", std::make_shared<Linear>(2, 2));
      fc = register_module("fc", std::make_shared<Linear>(2, 3));
    }
    std::string name() const override { return "Net"; }
  } n;
  REQUIRE(n.parameters().size() == 2);
  StateDict sd = n.state_dict();
  REQUIRE(sd.size() == 2);
  CHECK(sd[0].first == "fc.weight");
  CHECK(sd[0].second.shape() == Shape{3, 2});
  CHECK(sd[0].second.storage() == n.fc->weight.storage());
  n.load_state_dict(sd);  // raised "the key twice" before
}

TEST_CASE("causal_mask of a negative length names causal_mask and the caller's line") {
  const unsigned line = __LINE__ + 2;
  try {
    causal_mask(-1);
    FAIL("no kiln::Error");
  } catch (const Error& e) {
    CHECK_THAT(e.what(), Catch::Contains("causal_mask: length must be >= 0, got -1"));
    CHECK(e.where().line() == line);
  }
  CHECK(causal_mask(2).to_vector<bool>() == std::vector<bool>{false, true, false, false});
}

TEST_CASE("a module cannot contain itself: register_module and push_back raise") {
  // A break-it pass: s.push_back(s) was accepted, and parameters(), state_dict(), train() and
  // forward then overflowed the stack.
  auto s = std::make_shared<Sequential>();
  s->push_back(std::make_shared<Linear>(2, 2));
  CHECK_THROWS_WITH(s->push_back(s), Catch::Contains("a module cannot contain itself"));
  auto a = std::make_shared<Sequential>(), b = std::make_shared<Sequential>();
  a->push_back(b);
  CHECK_THROWS_WITH(b->push_back(a), Catch::Contains("a module cannot contain itself"));
  CHECK(s->parameters().size() == 2);  // unchanged, and walkable
  CHECK(b->named_children().empty());
  CHECK(s->forward(ones({1, 2})).shape() == Shape{1, 2});
}

TEST_CASE("register_parameter of a tensor with history registers it detached, a leaf") {
  struct Bare : Module {
    std::string name() const override { return "Bare"; }
  } m;
  Tensor a = ones({2}).requires_grad_();
  Tensor w = m.register_parameter("w", a * 2.0);
  CHECK(w.is_leaf());
  CHECK(w.requires_grad());
  (w * 3.0).sum().backward();
  REQUIRE(w.grad().defined());  // the gradient went to `a` before
  CHECK(w.grad().to_vector<float>() == std::vector<float>{3, 3});
  CHECK_FALSE(a.grad().defined());
  CHECK(m.named_parameters()[0].second.is_same(w));
}
