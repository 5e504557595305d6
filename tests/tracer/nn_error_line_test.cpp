// Errors raised inside kiln's modules, losses, optimizers and serialisation name the caller's
// line (kiln::at_user_line), not the line of nn/*.cpp that checked; also inside kiln::compile,
// on the tracing call and on replays.
#include <catch2/catch.hpp>
#include <functional>
#include <string>

#include "kiln/kiln.h"
#include "kiln/nn.h"
#include "nn/optim.h"

using namespace kiln;
using namespace kiln::nn;

namespace {
// Runs `f`, which must throw kiln::Error; returns where it says it was raised.
Loc where_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    INFO(e.what());
    return e.where();
  }
  FAIL("no kiln::Error");
  return Loc::current();
}
bool here(const Loc& loc, int line) {
  INFO(loc.file_name() << ":" << loc.line() << ", expected line " << line);
  return std::string(loc.file_name()) == __FILE__ && static_cast<int>(loc.line()) == line;
}

struct TwoLayers : Module {
  std::shared_ptr<Linear> a = register_module("a", std::make_shared<Linear>(4, 3));
  std::shared_ptr<Linear> b = register_module("b", std::make_shared<Linear>(5, 2));
  static constexpr int kBLine = __LINE__ + 1;
  Tensor forward(const Tensor& x) override { return (*b)((*a)(x)); }  // b is 5 wide: error
  std::string name() const override { return "TwoLayers"; }
};
}  // namespace

TEST_CASE("errors inside nn modules name the caller's line") {
  manual_seed(0);
  Linear lin(4, 3);
  LayerNorm norm(Shape{4});
  Embedding emb(5, 2);
  Sequential seq{std::make_shared<Linear>(4, 3), std::make_shared<ReLU>()};
  Tensor x = ones({2, 5});
  CHECK(here(where_of([&] { lin(x); }), __LINE__));
  CHECK(here(where_of([&] { norm(x); }), __LINE__));
  CHECK(here(where_of([&] { emb(from_vector<int64_t>({0, 7}, {2})); }), __LINE__));
  CHECK(here(where_of([&] { seq(x); }), __LINE__));
  // Inside a user's module the innermost user line wins: its forward's call of b.
  TwoLayers two;
  CHECK(here(where_of([&] { two(ones({2, 4})); }), TwoLayers::kBLine));

  MultiheadAttention mha(4, 2, 0.0, true, true);
  Tensor q = ones({2, 3, 4});
  CHECK(here(where_of([&] { mha.forward(q, q, q, Tensor(), zeros({4, 4})); }), __LINE__));
  TransformerEncoderLayerOptions o;
  o.d_model = 4, o.nhead = 2, o.dim_feedforward = 8, o.batch_first = true;
  TransformerEncoder enc(o, 2);
  CHECK(here(where_of([&] { enc.forward(q, Tensor(), ones({2, 3}, {DType::Int64})); }), __LINE__));
  CHECK(here(where_of([&] { enc(ones({2, 3, 5})); }), __LINE__));

  CrossEntropyLoss ce;
  CHECK(here(where_of([&] { ce(ones({2, 3}), from_vector<int64_t>({0, 3}, {2})); }), __LINE__));
  CHECK(here(where_of([&] { AdamW(lin.parameters(), {.lr = -1}); }), __LINE__));
  Tensor non_leaf = ones({2}).requires_grad_() * 2.0;
  CHECK(here(where_of([&] { SGD({non_leaf}, {.lr = 0.1}); }), __LINE__));
  StateDict d = lin.state_dict();
  d.pop_back();
  CHECK(here(where_of([&] { lin.load_state_dict(d); }), __LINE__));
  CHECK(here(where_of([&] { lin.load("/nonexistent/kiln.safetensors"); }), __LINE__));
}

TEST_CASE("errors inside nn modules name the caller's line in compiled functions, traced and "
          "replayed") {
  manual_seed(1);
  Linear lin(4, 3);
  Embedding emb(5, 2);
  static const int kLinLine = __LINE__ + 1;
  auto f = compile([&](const Tensor& x) { return lin(x) * 2.0; });
  static const int kEmbLine = __LINE__ + 1;
  auto g = compile([&](const Tensor& i) { return emb(i) * 2.0; });
  for (int k = 0; k < 3; ++k) {
    f(ones({2, 4}));
    g(from_vector<int64_t>({0, 4}, {2}));
  }
  CHECK(here(where_of([&] { f(ones({2, 5})); }), kLinLine));  // a new shape: traced
  for (int k = 0; k < 10; ++k)  // replays of the traced entry, past its timing runs
    CHECK(here(where_of([&] { g(from_vector<int64_t>({0, 5}, {2})); }), kEmbLine));
  std::string ex = g.explain();
  INFO(ex);
  CHECK(ex.find("nn/layers.cpp") == std::string::npos);
}
