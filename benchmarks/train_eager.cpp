// Suite train-eager: eager training steps (forward, backward, optimiser).
//  * mlp_64_128_10: MLP 64→128→10 (ReLU), batch 64, SGD — steps/s.
//  * transformer_step: the reference Transformer training benchmark (PyTorch vs TensorFlow,
//    d_model 768, 12 heads, 12 layers, batch 32, seq 512) scaled to this CPU: d_model 256,
//    4 heads, FFN 1024, gelu, dropout 0.1, batch_first, 2 layers, batch 8, seq 128, AdamW
//    lr 1e-4, loss = output.sum(); 5 warm-up steps, 50 timed — samples/s, plus the
//    benchmark's total_time and avg_step_time.
#include <memory>

#include "benchmarks/harness.h"
#include "kiln/nn.h"

namespace kiln::bench {
namespace {

constexpr int64_t kBatch = 8, kSeq = 128, kModel = 256;

Benchmark mlp_step(const RunConfig&) {
  manual_seed(0);
  auto model = std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(64, 128), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(128, 10)});
  auto opt = std::make_shared<nn::SGD>(model->parameters(), nn::SGDOptions{.lr = 0.01});
  Tensor x = randn({64, 64});
  Tensor y = randint(0, 10, {64});
  return {[=] {
            opt->zero_grad();
            Tensor loss = cross_entropy(model->forward(x), y);
            loss.backward();
            opt->step();
          },
          per_second(1)};
}

Benchmark transformer_step(const RunConfig&) {
  manual_seed(0);
  nn::TransformerEncoderLayerOptions o;
  o.d_model = kModel;
  o.nhead = 4;
  o.dim_feedforward = 1024;
  o.dropout = 0.1;
  o.activation = "gelu";
  o.batch_first = true;
  auto model = std::make_shared<nn::TransformerEncoder>(o, 2);
  auto opt = std::make_shared<nn::AdamW>(model->parameters(), nn::AdamWOptions{.lr = 1e-4});
  Tensor x = randn({kBatch, kSeq, kModel});
  return {[=] {
            opt->zero_grad();
            Tensor loss = model->forward(x).sum();
            loss.backward();
            opt->step();
          },
          per_second(kBatch)};
}

std::vector<Case> train_cases() {
  Case mlp{"mlp_64_128_10", Mode::Eager, "steps/s", mlp_step};
  Case tf{"transformer_step", Mode::Eager, "samples/s", transformer_step};
  tf.fixed_warmup = 5;
  tf.fixed_reps = 50;
  return {mlp, tf};
}

void summary(std::span<const Record> records) {
  const Record* r = find_record(records, "train-eager", "transformer_step", Mode::Eager);
  if (!r) return;
  fmt::print("\nTransformer training benchmark (d_model {}, 4 heads, 2 layers, batch {}, seq {}):\n",
             kModel, kBatch, kSeq);
  fmt::print("  framework/mode: kiln/eager\n  total_time: {:.3f} s\n  avg_step_time: {:.1f} ms\n"
             "  throughput: {:.1f} samples/s\n",
             r->extra[0].second, r->extra[1].second, r->value);
}

[[maybe_unused]] const bool registered =
    register_suite({"train-eager", "eager training steps: MLP (SGD) and Transformer encoder (AdamW)",
                    train_cases, summary});

}  // namespace
}  // namespace kiln::bench
