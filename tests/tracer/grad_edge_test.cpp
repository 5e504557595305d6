// Gradients at the edges where PyTorch defines 0 instead of 0/0 (pow with exponent 0, std of
// equal elements, a loss whose every target is ignored), and in-place ops whose backward needs
// the original self (h *= y), eagerly and under compile(). Expected values from PyTorch 1.13.
#include <catch2/catch.hpp>
#include <cmath>
#include <functional>
#include <limits>
#include <vector>

#include "kiln/kiln.h"

using namespace kiln;

namespace {
std::vector<float> v(const Tensor& t) { return t.to_vector<float>(); }
using V = std::vector<float>;
using GradFn = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;

// fn(inputs) → gradients, run eagerly and compiled (trace + two replays); each checked with
// `expect`.
void both(const GradFn& fn, const std::function<std::vector<Tensor>()>& inputs,
          const std::function<void(const std::vector<Tensor>&)>& expect) {
  {
    INFO("eager");
    expect(fn(inputs()));
  }
  auto f = compile([fn](const Tensor& a, const Tensor& b) { return fn({a, b}); });
  for (int i = 0; i < 3; ++i) {
    INFO("compiled, call " << i);
    auto in = inputs();
    expect(f(in[0], in[1]));
  }
}
}  // namespace

TEST_CASE("d/dx pow(x, 0) is 0 at x = 0, scalar or tensor exponent", "[autograd][compile]") {
  auto in = [] {
    return std::vector<Tensor>{tensor({0.f, 2.f}).requires_grad_(),
                               tensor({0.f, 0.f}).requires_grad_()};
  };
  both([](const std::vector<Tensor>& t) { return kiln::grad({pow(t[0], 0).sum()}, {t[0]}); }, in,
       [](const std::vector<Tensor>& g) { CHECK(v(g[0]) == V{0.f, 0.f}); });
  both([](const std::vector<Tensor>& t) { return kiln::grad({pow(t[0], 0.0).sum()}, {t[0]}); },
       in, [](const std::vector<Tensor>& g) { CHECK(v(g[0]) == V{0.f, 0.f}); });
  both([](const std::vector<Tensor>& t) { return kiln::grad({pow(t[0], t[1]).sum()}, t); }, in,
       [](const std::vector<Tensor>& g) {
         CHECK(v(g[0]) == V{0.f, 0.f});
         CHECK(v(g[1])[0] == 0.f);
         CHECK(v(g[1])[1] == Approx(0.693147f));
       });
  // exponent 2 is unchanged: 2x
  Tensor x = tensor({0.f, 2.f}).requires_grad_();
  CHECK(v(kiln::grad({pow(x, 2).sum()}, {x})[0]) == V{0.f, 4.f});
  // d/db of d/da a^b at b = 0 is 0, as PyTorch's masked formula (not a^-1).
  {
    Tensor a = tensor({2.f, 4.f}).requires_grad_(), b = tensor({0.f, 0.f}).requires_grad_();
    Tensor ga = kiln::grad({pow(a, b).sum()}, {a}, {}, /*create_graph=*/true)[0];
    Tensor gab = kiln::grad({ga.sum()}, {b}, {}, false, std::nullopt, /*allow_unused=*/true)[0];
    CHECK((!gab.defined() || v(gab) == V{0.f, 0.f}));
  }
  // Second derivatives: 0 for exponent 0 (they were NaN at 0), 2 for exponent 2.
  for (double e : {0.0, 2.0}) {
    Tensor g1 = kiln::grad({pow(x, e).sum()}, {x}, {}, /*create_graph=*/true)[0];
    Tensor g2 = kiln::grad({g1.sum()}, {x}, {}, false, std::nullopt, /*allow_unused=*/true)[0];
    if (e == 0) CHECK((!g2.defined() || v(g2) == V{0.f, 0.f}));
    else CHECK(v(g2) == V{2.f, 2.f});
  }
}

TEST_CASE("d/dx std(x) is 0 where all elements are equal", "[autograd][compile]") {
  auto in = [] {
    return std::vector<Tensor>{tensor({1.5f, 1.5f, 1.5f}).requires_grad_(),
                               tensor({{1.5f, 1.5f}, {1.f, 3.f}}).requires_grad_()};
  };
  both(
      [](const std::vector<Tensor>& t) {
        return std::vector<Tensor>{kiln::grad({kiln::std(t[0])}, {t[0]})[0],
                                   kiln::grad({kiln::std(t[0], {}, 0)}, {t[0]})[0],
                                   kiln::grad({kiln::var(t[0])}, {t[0]})[0],
                                   kiln::grad({kiln::std(t[1], {1}).sum()}, {t[1]})[0]};
      },
      in,
      [](const std::vector<Tensor>& g) {
        CHECK(v(g[0]) == V{0.f, 0.f, 0.f});
        CHECK(v(g[1]) == V{0.f, 0.f, 0.f});
        CHECK(v(g[2]) == V{0.f, 0.f, 0.f});
        V r = v(g[3]);  // row 0 equal: 0; row 1 unaffected: (x - mean) / (std · (n-1))
        CHECK(r[0] == 0.f);
        CHECK(r[1] == 0.f);
        CHECK(r[2] == Approx(-0.707107f));
        CHECK(r[3] == Approx(0.707107f));
      });
}

TEST_CASE("cross_entropy / nll_loss with every target ignored: NaN loss, zero gradient",
          "[autograd][compile]") {
  auto in = [] {
    return std::vector<Tensor>{tensor({{0.5f, 1.f}, {2.f, -1.f}}).requires_grad_(),
                               tensor({{0.5f, 1.f}, {2.f, -1.f}}).requires_grad_()};
  };
  both(
      [](const std::vector<Tensor>& t) {
        Tensor all_ignored = cross_entropy(t[0], full({2}, -100, Int64));
        Tensor one_ignored = cross_entropy(t[1], tensor({int64_t{1}, int64_t{-100}}));
        Tensor nll = nll_loss(log_softmax(t[1], 1), full({2}, -100, Int64));
        return std::vector<Tensor>{all_ignored.detach(), kiln::grad({all_ignored}, {t[0]})[0],
                                   kiln::grad({one_ignored}, {t[1]})[0],
                                   kiln::grad({nll}, {t[1]})[0]};
      },
      in,
      [](const std::vector<Tensor>& g) {
        CHECK(std::isnan(g[0].item<float>()));
        CHECK(v(g[1]) == V{0.f, 0.f, 0.f, 0.f});
        V r = v(g[2]);
        CHECK(r[0] == Approx(0.377541f));
        CHECK(r[1] == Approx(-0.377541f));
        CHECK(r[2] == 0.f);
        CHECK(r[3] == 0.f);
        CHECK(v(g[3]) == V{0.f, 0.f, 0.f, 0.f});
      });
}

// Break-it pass: with int32 targets, compiled code narrowed ignore_index 2^32 + 1 to 1 and
// ignored every target 1 (from the first replay on); eager's backward raised in kiln::ne.
TEST_CASE("cross_entropy: an ignore_index outside int32 targets' range ignores none of them",
          "[autograd][compile]") {
  auto in = [] {
    return std::vector<Tensor>{tensor({{0.f, 1.f, 2.f}, {2.f, 1.f, 0.f}}).requires_grad_(),
                               tensor({1, 2}, {Int32})};
  };
  both(
      [](const std::vector<Tensor>& t) {
        Tensor loss = cross_entropy(t[0], t[1], Reduction::None, int64_t{4294967297});
        return std::vector<Tensor>{loss.detach(), kiln::grad({loss.sum()}, {t[0]})[0]};
      },
      in,
      [](const std::vector<Tensor>& g) {
        // -log_softmax picks: log(1 + e + e^2) - {1, 0}; gradient softmax - one_hot.
        const double lse = std::log(1 + std::exp(1.0) + std::exp(2.0));
        V loss = v(g[0]), grad = v(g[1]);
        CHECK(loss[0] == Approx(lse - 1));
        CHECK(loss[1] == Approx(lse - 0));
        CHECK(grad[1] == Approx(std::exp(1.0 - lse) - 1));
        CHECK(grad[3] == Approx(std::exp(2.0 - lse)));
        CHECK(grad[5] == Approx(std::exp(0.0 - lse) - 1));
      });
}

// Break-it pass: compiled code made ignore_index a double, so INT64_MAX (a sentinel) and
// 2^53 + 1 were other numbers, and the targets equal to them were read as class indices.
TEST_CASE("cross_entropy: an int64 ignore_index beyond 2^53 is compared exactly, compiled",
          "[compile]") {
  for (int64_t ignore : {std::numeric_limits<int64_t>::max(), (int64_t{1} << 53) + 1,
                         -(int64_t{1} << 53) - 1}) {
    INFO("ignore_index " << ignore);
    auto loss = [ignore](const Tensor& x, const Tensor& t) {
      return cross_entropy(x, t, Reduction::None, ignore);
    };
    auto f = compile(loss, {.dynamic = Dynamic::Never});
    Tensor x = tensor({{0.f, 1.f, 2.f}, {2.f, 1.f, 0.f}, {1.f, 1.f, 1.f}});
    Tensor t = from_vector<int64_t>({0, ignore, 2}, {3});
    const V want = v(loss(x, t));
    CHECK(want[1] == 0.f);
    for (int call = 0; call < 3; ++call) CHECK(v(f(x, t)) == want);
  }
}

TEST_CASE("h = x*2; h *= y (and /=, *= scalar) back-propagates with the original h",
          "[autograd][compile]") {
  auto in = [] {
    return std::vector<Tensor>{tensor({1.f, 2.f}).requires_grad_(),
                               tensor({3.f, 5.f}).requires_grad_()};
  };
  both(
      [](const std::vector<Tensor>& t) {
        Tensor h = t[0] * 2.0;
        h *= t[1];
        Tensor d = t[0] * 2.0;
        d /= t[1];
        Tensor s = t[0] * 2.0;
        s *= 3.0;
        auto gm = kiln::grad({h.sum()}, t);
        auto gd = kiln::grad({d.sum()}, t);
        auto gs = kiln::grad({s.sum()}, {t[0]});
        return std::vector<Tensor>{h.detach(), gm[0], gm[1], gd[0], gd[1], gs[0]};
      },
      in,
      [](const std::vector<Tensor>& g) {
        CHECK(v(g[0]) == V{6.f, 20.f});
        CHECK(v(g[1]) == V{6.f, 10.f});
        CHECK(v(g[2]) == V{2.f, 4.f});
        CHECK(v(g[3])[0] == Approx(2.f / 3));
        CHECK(v(g[3])[1] == Approx(0.4f));
        CHECK(v(g[4])[0] == Approx(-2.f / 9));
        CHECK(v(g[4])[1] == Approx(-0.16f));
        CHECK(v(g[5]) == V{6.f, 6.f});
      });
  // backward() into .grad, as reported
  Tensor x = tensor({1.f, 2.f}).requires_grad_(), y = tensor({3.f, 5.f}).requires_grad_();
  Tensor h = x * 2.0;
  h *= y;
  h.sum().backward();
  CHECK(v(x.grad()) == V{6.f, 10.f});
  CHECK(v(y.grad()) == V{2.f, 4.f});
  // h without history, y with: y's gradient needs the original h (it raised the same error)
  both(
      [](const std::vector<Tensor>& t) {
        Tensor h = t[0].detach() * 1.0;
        h *= t[1];
        Tensor d = t[0].detach() * 1.0;
        d /= t[1];
        auto gm = kiln::grad({h.sum()}, {t[1]});
        auto gd = kiln::grad({d.sum()}, {t[1]});
        return std::vector<Tensor>{gm[0], gd[0]};
      },
      in,
      [](const std::vector<Tensor>& g) {
        CHECK(v(g[0]) == V{1.f, 2.f});
        CHECK(v(g[1])[0] == Approx(-1.f / 9));  // d(h/y)/dy = -h / y²
        CHECK(v(g[1])[1] == Approx(-2.f / 25));
      });
  // a leaf that requires grad still refuses in-place ops, and stays unchanged
  Tensor leaf = tensor({1.f, 2.f}).requires_grad_();
  CHECK_THROWS_AS(leaf *= y, Error);
  CHECK(v(leaf) == V{1.f, 2.f});
}
