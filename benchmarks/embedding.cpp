// Suite embedding: a training step whose backward adds rows at indices (an embedding's
// gradient: index_add), eagerly and compiled. A bag-of-words classifier: Embedding(8000, 256)
// -> Linear(256, 256) -> ReLU -> mean over the 32 tokens -> Linear(256, 1000) ->
// cross_entropy, AdamW lr 1e-3, batch 64; 5 warm-up steps, 50 timed, the modes alternating.
// Case bow_step, steps/s. With index_add compiled (codegen/lower_index.cpp) the whole step is
// one compiled region; before, the embedding's gradient was an eager op between two.
// KILN_BENCH_DEVICE=cuda runs it on the GPU (the gradient is then atomic adds).
#include <cstdlib>
#include <memory>
#include <string_view>

#include <fmt/format.h>

#include "backends/cuda/driver.h"
#include "benchmarks/harness.h"
#include "kiln/nn.h"

namespace kiln::bench {
namespace {

constexpr char kSuite[] = "embedding";
constexpr int64_t kVocab = 8000, kDim = 256, kClasses = 1000, kBatch = 64, kTokens = 32;

/// The model, its optimizer and one batch; seed 0, so both modes start from the same weights.
struct Classifier {
  std::shared_ptr<nn::Embedding> embed;
  std::shared_ptr<nn::Linear> hidden, head;
  std::shared_ptr<nn::AdamW> opt;
  Tensor tokens, labels;
  Classifier() {
    manual_seed(0);
    Device d = bench_device();
    embed = std::make_shared<nn::Embedding>(kVocab, kDim);
    hidden = std::make_shared<nn::Linear>(kDim, kDim);
    head = std::make_shared<nn::Linear>(kDim, kClasses);
    for (auto m : std::initializer_list<nn::Module*>{embed.get(), hidden.get(), head.get()})
      m->to(d);
    opt = std::make_shared<nn::AdamW>(
        std::vector<Tensor>{embed->weight, hidden->weight, hidden->bias, head->weight,
                            head->bias},
        nn::AdamWOptions{.lr = 1e-3});
    tokens = randint(0, kVocab, {kBatch, kTokens}, d);
    labels = randint(0, kClasses, {kBatch}, d);
  }
  Tensor step() {
    opt->zero_grad();
    Tensor h = relu(hidden->forward(embed->forward(tokens))).mean(1);
    Tensor loss = cross_entropy(head->forward(h), labels);
    loss.backward();
    opt->step();
    return loss.detach();
  }
};

void finish() {
  if (bench_device().is_cuda()) cuda::synchronize(0);
}

Benchmark eager_step(const RunConfig&) {
  auto m = std::make_shared<Classifier>();
  return {[m] {
            do_not_optimize(m->step());
            finish();
          },
          per_second(1)};
}

Benchmark compiled_step(const RunConfig&) {
  auto m = std::make_shared<Classifier>();
  auto step = kiln::compile([m] { return m->step(); },
                            CompileOptions{.donate_buffers = true}, "bow_step");
  return {[m, step] {
            do_not_optimize(step());
            finish();
          },
          per_second(1)};
}

std::vector<Case> cases() {
  return training_step_cases("bow_step", "steps/s", eager_step, compiled_step, true);
}

void summary(std::span<const Record> records) {
  const Record* e = find_record(records, kSuite, "bow_step", Mode::Eager);
  const Record* c = find_record(records, kSuite, "bow_step", Mode::Compiled);
  if (e && c && e->status == Status::Ok && c->status == Status::Ok)
    fmt::print("\nEmbedding classifier step ({}): compiled / eager {:.2f}x\n",
               bench_device().str(), c->value / e->value);
}

[[maybe_unused]] const bool registered = register_suite(
    {kSuite,
     "a training step with an embedding (its gradient an index_add), eager vs compiled",
     cases, summary});

}  // namespace
}  // namespace kiln::bench
