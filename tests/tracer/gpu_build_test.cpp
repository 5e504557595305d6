// The CUDA build of whole traced training steps, on machines without a GPU: a step is traced on
// the CPU, then its plan is built again with every region compiled for CUDA
// (PlanOptions::build_for). Each region must compile (a region whose GPU lowering fails runs on
// eager kernels: one launch per op and no fusion), and the kernel counts must stay near what
// fusion gives now. The device-only tests in cuda_test.cpp run these steps on a GPU.
#include <catch2/catch.hpp>
#include <functional>
#include <memory>

#include <fmt/format.h>

#include "kiln/kiln.h"
#include "kiln/nn.h"
#include "tracer/function.h"
#include "tracer/plan.h"
#include "tracer/util.h"

using namespace kiln;

namespace {

size_t count_of(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

/// The plan of the last replayed call's whole trace (a compiled function with
/// CompileOptions::check), its regions built for `device`.
std::unique_ptr<tracer::Plan> plan_of_last_call(Device device) {
  std::shared_ptr<const tracer::Program> p = tracer::last_replayed_program();
  REQUIRE(p);
  REQUIRE(p->backward_begin >= p->nodes.size());  // the step's backward is in its trace
  tracer::PlanOptions o;
  o.live_after.assign(p->values.size(), false);
  for (int v : p->outputs)
    if (v >= 0) o.live_after[v] = true;
  for (auto [src, v] : p->write_backs) o.live_after[v] = true;
  for (auto [leaf, g] : p->grad_assignments) {
    o.live_after[leaf] = true;
    if (g >= 0) o.live_after[g] = true;
  }
  o.build_for = device;
  return std::make_unique<tracer::Plan>(p, 0, p->nodes.size(), o);
}

/// Traces a training step (zero_grad, `loss`, backward, `opt`'s step) with two checked calls
/// (the second replays), then builds its plan for CUDA. Tolerances: sums in another order, on
/// values near 0; `atol` above AdamW's lr where a gradient that is 0 in exact arithmetic (a key
/// projection's bias) becomes steps of +-lr whose signs differ between eager and compiled
/// (CompileOptions::check).
std::unique_ptr<tracer::Plan> cuda_plan_of(nn::Optimizer& opt,
                                           const std::function<Tensor()>& loss,
                                           double atol = 1e-4) {
  auto step = [&] {
    opt.zero_grad();
    Tensor l = loss();
    l.backward();
    opt.step();
    return l.detach();
  };
  auto cf = compile(step, CompileOptions{.check = true, .rtol = 1e-3, .atol = atol});
  cf();
  cf();
  return plan_of_last_call(Device::cuda());
}

/// `max_kernels`: a little above the count at the last change of fusion, so a regression in
/// the GPU lowering's fusion fails here.
void check_all_regions_compiled_for_cuda(const tracer::Plan& plan, int max_kernels) {
  const std::string text = plan.describe();
  INFO(text);
  CHECK(plan.num_regions() >= 1);
  CHECK(text.find("not compiled") == std::string::npos);
  CHECK(text.find("compiled region") != std::string::npos);
  CHECK(text.find(" on cuda:0") != std::string::npos);
  // The only steps on eager kernels: dropout masks, drawn before the regions (one generated
  // kernel each on a GPU).
  CHECK(plan.num_eager_ops() == static_cast<int>(count_of(text, "eager op: dropout_mask")));
  CHECK(plan.num_kernels() <= max_kernels);
  WARN(fmt::format("CUDA build of the step: {} region(s), {} kernel(s) (GEMMs included), {} "
                   "eager op(s)",
                   plan.num_regions(), plan.num_kernels(), plan.num_eager_ops()));
}

/// A small Transformer layer as the benchmarks configure it (gelu, dropout 0.1, batch first).
nn::TransformerEncoderLayerOptions layer_options(int64_t d_model) {
  nn::TransformerEncoderLayerOptions o;
  o.d_model = d_model;
  o.nhead = 4;
  o.dim_feedforward = 2 * d_model;
  o.dropout = 0.1;
  o.activation = "gelu";
  o.batch_first = true;
  return o;
}

}  // namespace

TEST_CASE("gpu build: a Transformer training step traced on the CPU compiles for CUDA",
          "[compile][gpu_build]") {
  // The transformer benchmark's step (benchmarks/transformer.cpp) at a small size.
  manual_seed(0);
  auto model = std::make_shared<nn::TransformerEncoder>(layer_options(32), 2);
  nn::AdamW opt(model->parameters(), nn::AdamWOptions{.lr = 1e-4});
  Tensor x = randn({2, 16, 32});
  auto plan = cuda_plan_of(opt, [&] { return model->forward(x).sum(); });
  check_all_regions_compiled_for_cuda(*plan, 134);  // 128 kernels
}

TEST_CASE("gpu build: a language model's training step (embedding, a Transformer layer, "
          "cross_entropy of shifted logits) compiles for CUDA", "[compile][gpu_build]") {
  manual_seed(1);
  const int64_t vocab = 100, dim = 32, batch = 2, seq = 16;
  nn::Embedding embed(vocab, dim);
  nn::TransformerEncoderLayer layer(layer_options(dim));
  nn::Linear head(dim, vocab);
  std::vector<Tensor> params = layer.parameters();
  for (const Tensor& p : {embed.weight, head.weight, head.bias}) params.push_back(p);
  nn::AdamW opt(params, nn::AdamWOptions{.lr = 1e-3});
  Tensor tokens = randint(0, vocab, {batch, seq + 1});
  auto plan = cuda_plan_of(opt, [&] {
    Tensor in = tokens.slice(1, 0, seq), target = tokens.slice(1, 1, seq + 1);
    Tensor logits = head.forward(layer.forward(embed.forward(in)));
    return cross_entropy(logits.reshape({batch * seq, vocab}), target.reshape({-1}));
  });
  check_all_regions_compiled_for_cuda(*plan, 90);  // 85 kernels
}

TEST_CASE("gpu build: an MLP classifier's training step (the digits benchmark) compiles for CUDA",
          "[compile][gpu_build]") {
  // benchmarks/digits.cpp: 64 -> 128 -> 128 -> 10, ReLU, dropout 0.1, cross_entropy, AdamW.
  manual_seed(2);
  nn::Linear l1(64, 128), l2(128, 128), l3(128, 10);
  nn::Dropout drop(0.1);
  std::vector<Tensor> params;
  for (nn::Linear* l : {&l1, &l2, &l3})
    for (const Tensor& p : l->parameters()) params.push_back(p);
  nn::AdamW opt(params, nn::AdamWOptions{.lr = 3e-3});
  Tensor x = randn({64, 64}), y = randint(0, 10, {64});
  auto plan = cuda_plan_of(opt, [&] {
    Tensor h = drop.forward(relu(l1.forward(x)));
    h = drop.forward(relu(l2.forward(h)));
    return cross_entropy(l3.forward(h), y);
  });
  check_all_regions_compiled_for_cuda(*plan, 31);  // 29 kernels
}

TEST_CASE("gpu build: an embedding classifier's training step (the embedding benchmark) "
          "compiles for CUDA", "[compile][gpu_build]") {
  // benchmarks/embedding.cpp at a small size: embedding, Linear, ReLU, mean over tokens,
  // Linear, cross_entropy, AdamW; the embedding's gradient is an index_add.
  manual_seed(3);
  nn::Embedding embed(500, 32);
  nn::Linear hidden(32, 32), head(32, 20);
  std::vector<Tensor> params = {embed.weight};
  for (nn::Linear* l : {&hidden, &head})
    for (const Tensor& p : l->parameters()) params.push_back(p);
  nn::AdamW opt(params, nn::AdamWOptions{.lr = 1e-3});
  Tensor tokens = randint(0, 500, {8, 12}), labels = randint(0, 20, {8});
  auto plan = cuda_plan_of(opt, [&] {
    Tensor h = relu(hidden.forward(embed.forward(tokens))).mean(1);
    return cross_entropy(head.forward(h), labels);
  });
  check_all_regions_compiled_for_cuda(*plan, 30);  // 28 kernels
}

namespace {

/// One layer of the original-size step (benchmarks/transformer.cpp, KILN_BENCH_FULL: 768 wide,
/// 12 heads, FFN 3072) on [batch, seq, 768], its training step built for CUDA.
std::unique_ptr<tracer::Plan> original_width_layer_plan(int64_t batch, int64_t seq,
                                                        double atol) {
  manual_seed(4);
  nn::TransformerEncoderLayerOptions o = layer_options(768);
  o.nhead = 12;
  o.dim_feedforward = 3072;
  auto model = std::make_shared<nn::TransformerEncoder>(o, 1);
  nn::AdamW opt(model->parameters(), nn::AdamWOptions{.lr = 1e-4});
  Tensor x = randn({batch, seq, 768});
  return cuda_plan_of(opt, [&] { return model->forward(x).sum(); }, atol);
}

}  // namespace

TEST_CASE("gpu build: a Transformer layer at the original widths (768, 12 heads, FFN 3072) "
          "compiles for CUDA", "[compile][gpu_build]") {
  // Batch 2, seq 64: the row widths and head size of the step the device check times.
  check_all_regions_compiled_for_cuda(*original_width_layer_plan(2, 64, 3e-4), 90);  // 85
}

TEST_CASE("gpu build: one Transformer layer at the original size (batch 32, seq 512), for the "
          "traffic estimate", "[.gpu_build_full]") {
  // Hidden (about 8 GB and 30 s on the CPU): with KILN_LOGS=ir its "GPU parallel loops" dump is
  // what benchmarks/gpu/traffic_estimate.py reads (bytes each kernel moves, GEMM flops).
  check_all_regions_compiled_for_cuda(*original_width_layer_plan(32, 512, 1e-2), 90);
}
