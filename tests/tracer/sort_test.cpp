// compile() and the Scan rows (argsort, cumsum), which have no IR op: a compiled replay runs
// them on eager kernels between its compiled regions. Traced once, replayed with eager's
// values (bit for bit), gradients included, dynamic sizes, and a top-k sampling step.
#include <catch2/catch.hpp>
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "error_of.h"
#include "kiln/kiln.h"
#include "tracer/util.h"

using namespace kiln;
using kiln::testing::contains;
using kiln::testing::error_of;

namespace {
// Same dtype, shape and values (NaN equal to NaN; exact in float64 for these tensors).
void check_same(const Tensor& compiled, const Tensor& eager) {
  REQUIRE(compiled.dtype() == eager.dtype());
  REQUIRE(compiled.shape() == eager.shape());
  const std::vector<double> c = compiled.to(DType::Float64).to_vector<double>();
  const std::vector<double> e = eager.to(DType::Float64).to_vector<double>();
  for (size_t i = 0; i < e.size(); ++i) {
    INFO("element " << i << ": compiled " << c[i] << ", eager " << e[i]);
    CHECK((c[i] == e[i] || (std::isnan(c[i]) && std::isnan(e[i]))));
  }
}
}  // namespace

TEST_CASE("compile: sort, argsort, topk and cumsum trace once and replay with eager's values",
          "[compile][sort]") {
  int traces = 0;
  auto fn = [&](const Tensor& x) {
    ++traces;  // host code: runs while tracing only
    Tensor y = x * 2 + 1;  // a compiled region before the eager ops
    auto [sv, si] = sort(y, 1, true);
    auto [tv, ti] = topk(y, 3, 0, false);
    Tensor c = cumsum(y, -1);
    Tensor ci = cumsum(ti, 1);  // int64 running sums of the indices
    return std::vector<Tensor>{sv + 1, si, tv * 3, ti, c - sv, ci, argsort(x.t(), -1)};
  };
  auto cf = compile(fn);
  manual_seed(3);
  for (int call = 0; call < 6; ++call) {
    INFO("call " << call);
    Tensor x = randint(-4, 5, {6, 7}, {DType::Int64}).to(DType::Float32);  // many ties
    std::vector<Tensor> c = cf(x), e = fn(x);
    REQUIRE(c.size() == e.size());
    for (size_t i = 0; i < e.size(); ++i) check_same(c[i], e[i]);
  }
  CHECK(traces == 1 + 6);  // one trace, then the 6 eager references
  CHECK(cf.compile_count() == 1);
  const std::string ex = cf.explain();
  INFO(ex);
  CHECK(contains(ex, "1 trace(s)"));
  CHECK(contains(ex, "argsort"));
  CHECK(contains(ex, "cumsum"));
}

TEST_CASE("compile: a top-k sampling decode loop traces once and picks eager's tokens",
          "[compile][sort]") {
  // logits -> topk -> softmax over the k values -> the token whose probability exceeds a
  // fixed uniform draw the most (a deterministic stand-in for sampling) -> next input.
  NoGradGuard no_grad;
  const int64_t B = 4, E = 8, V = 50, K = 5;
  manual_seed(12);
  const Tensor emb = randn({V, E}) * 0.5;
  const Tensor head = randn({E, V}) * 0.5;
  const Tensor draws = rand({B, K});
  int traces = 0;
  auto step = [&](const Tensor& tok, const Tensor& h) {
    ++traces;
    Tensor hidden = tanh(h + emb.index_select(0, tok));
    Tensor logits = matmul(hidden, head);
    auto [top, at] = topk(logits, K, -1);
    Tensor probs = softmax(top, -1);
    // top-p style cut on the running sum: keep tokens until 0.9 of the mass.
    Tensor keep = (cumsum(probs, -1) - probs) < 0.9;
    Tensor score = where(keep, probs - draws * probs.amax(-1, true), -1.0);
    Tensor pick = score.argmax(-1, true);
    return std::vector<Tensor>{gather(at, 1, pick).view({B}), hidden};
  };
  auto decode = [&](auto&& f) {
    Tensor tok = from_vector<int64_t>({1, 7, 3, 9}, {B});
    Tensor h = zeros({B, E});
    std::vector<int64_t> tokens;
    for (int s = 0; s < 12; ++s) {
      std::vector<Tensor> out = f(tok, h);
      tok = out[0];
      h = out[1];
      for (int64_t t : tok.to_vector<int64_t>()) tokens.push_back(t);
    }
    return tokens;
  };
  const std::vector<int64_t> eager_tokens = decode(step);
  traces = 0;
  auto cstep = compile(step);
  const std::vector<int64_t> compiled_tokens = decode(cstep);
  CHECK(traces == 1);
  CHECK(cstep.compile_count() == 1);
  CHECK(compiled_tokens == eager_tokens);
  // The loop does not settle on one token per row (the draws pick among the top k).
  CHECK(std::set<int64_t>(eager_tokens.begin(), eager_tokens.end()).size() > 4);
  INFO(cstep.explain());
  CHECK(contains(cstep.explain(), "1 trace(s)"));
}

TEST_CASE("compile: gradients through sort, topk and cumsum equal eager's", "[compile][sort]") {
  auto fn = [](const Tensor& x, const Tensor& w) {
    Tensor s = sort(x * w, 1).values;
    Tensor t = topk(x, 2, 0).values;
    Tensor c = cumsum(x * x, 1);
    return (s * w).sum() + t.sum() * 3 + (c * c).sum() * 0.01;
  };
  auto cf = compile(fn);
  manual_seed(6);
  for (int call = 0; call < 4; ++call) {
    INFO("call " << call);
    Tensor x = randn({4, 6}, {DType::Float64}).requires_grad_();
    Tensor w = randn({4, 6}, {DType::Float64}).requires_grad_();
    Tensor xe = x.detach().requires_grad_(), we = w.detach().requires_grad_();
    cf(x, w).backward();
    fn(xe, we).backward();
    CHECK(amax(abs(x.grad() - xe.grad())).item<double>() < 1e-12);
    CHECK(amax(abs(w.grad() - we.grad())).item<double>() < 1e-12);
  }
  CHECK(cf.compile_count() == 1);
}

TEST_CASE("compile: sort / topk / cumsum at dynamic sizes, and topk's k out of range at a "
          "new size raises eager's error at the user's line", "[compile][sort][dynamic]") {
  auto fn = [](const Tensor& x) {
    auto [v, i] = topk(x, 3, 1);
    return std::vector<Tensor>{v, i, cumsum(x, 1), sort(x, 0).values};
  };
  auto cf = compile(fn);
  manual_seed(7);
  for (int64_t n : {5, 8, 11, 4, 9}) {
    INFO("n " << n);
    Tensor x = randn({3, n});
    std::vector<Tensor> c = cf(x), e = fn(x);
    for (size_t i = 0; i < e.size(); ++i) check_same(c[i], e[i]);
  }
  INFO(cf.explain());
  CHECK(cf.compile_count() <= 2);  // the static trace, then one dynamic one
  Tensor small = randn({3, 2});
  const Error eager = error_of([&] { fn(small); });
  const Error compiled = error_of([&] { cf(small); });
  CHECK(eager.op() == "topk");
  CHECK(contains(eager.message(), "k (3) is out of range for dim 1 of size 2"));
  CHECK(std::string(compiled.what()) == eager.what());
}
