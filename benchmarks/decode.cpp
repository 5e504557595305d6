// Suite decode: one token of autoregressive decoding with a preallocated KV cache (the gpt-fast
// pattern), eagerly and compiled. Embedding 512x256, 2 pre-norm layers (q/k/v/o projections,
// GELU MLP 256 -> 1024 -> 256), caches [1, 64, 256] written at a position tensor, attention over
// the whole cache masked by arange(64) <= pos, logits through the tied embedding. Case
// decode_index_copy writes the slot with `cache.index_copy_(1, pos, k)`; decode_where with
// `cache.copy_(where(arange(64) == pos, k, cache))` (a whole-cache rewrite, the way before
// index_copy). Tokens/s; the position advances every step and wraps at 64; the modes
// alternate. decode_index_copy_2048: index_copy_ into caches [1, 2048, 256] (wrapping at
// 2048). Each compiled case traces once and replays (tests/tracer/index_ops_test.cpp).
// Case decode_growing_cat grows the caches by cat instead (no mask: the cache is the prefix),
// passed in and returned, so every step has a new length (1, 2, ... 55): the compiled step
// traces lengths 1-4, then checks each new length shape-only and replays
// (CompileOptions::shape_only_checks; tests/tracer/shape_only_test.cpp).
#include <cmath>
#include <memory>

#include <fmt/format.h>

#include "benchmarks/harness.h"
#include "kiln/kiln.h"

namespace kiln::bench {
namespace {

constexpr char kSuite[] = "decode";
constexpr int64_t kDim = 256, kVocab = 512, kLayers = 2, kMaxLen = 64, kLongLen = 2048;

/// The weights, the caches and the position tensors; seed 0, so both modes compute the same.
struct Decoder {
  Tensor emb, ramp, tok;
  std::vector<Tensor> wq, wk, wv, wo, w1, w2, k_cache, v_cache, positions;
  bool by_index_copy;
  int64_t max_len;  // the caches' length
  int64_t step_no = 0;
  explicit Decoder(bool index_copy, int64_t length = kMaxLen)
      : by_index_copy(index_copy), max_len(length) {
    manual_seed(0);
    emb = randn({kVocab, kDim}) * 0.1;
    for (int64_t l = 0; l < kLayers; ++l) {
      for (auto* w : {&wq, &wk, &wv, &wo}) w->push_back(randn({kDim, kDim}) * 0.06);
      w1.push_back(randn({kDim, 4 * kDim}) * 0.06);
      w2.push_back(randn({4 * kDim, kDim}) * 0.03);
      k_cache.push_back(zeros({1, max_len, kDim}));
      v_cache.push_back(zeros({1, max_len, kDim}));
    }
    ramp = arange(max_len, {DType::Int64});
    tok = scalar_tensor(int64_t{1}, {DType::Int64}).view({1});
    for (int64_t p = 0; p < max_len; ++p)
      positions.push_back(scalar_tensor(p, {DType::Int64}).view({1}));
  }
  /// One token's logits [1, vocab] at position `pos` ([1] int64), writing the caches.
  Tensor step(const Tensor& pos) {
    NoGradGuard no_grad;
    Tensor h = emb.index_select(0, tok).view({1, 1, kDim});
    Tensor hidden = (ramp > pos).view({1, 1, max_len});
    for (int64_t l = 0; l < kLayers; ++l) {
      Tensor x = layer_norm(h, {kDim});
      Tensor q = matmul(x, wq[l]), k = matmul(x, wk[l]), v = matmul(x, wv[l]);
      if (by_index_copy) {
        k_cache[l].index_copy_(1, pos, k);
        v_cache[l].index_copy_(1, pos, v);
      } else {
        Tensor at = (ramp == pos).view({1, max_len, 1});
        k_cache[l].copy_(where(at, k, k_cache[l]));
        v_cache[l].copy_(where(at, v, v_cache[l]));
      }
      Tensor s = masked_fill(matmul(q, k_cache[l].transpose(1, 2)) * (1.0 / 16), hidden,
                             -INFINITY);
      h = h + matmul(matmul(softmax(s, -1), v_cache[l]), wo[l]);
      h = h + matmul(gelu(matmul(layer_norm(h, {kDim}), w1[l])), w2[l]);
    }
    return matmul(h.view({1, kDim}), emb.t());
  }
  const Tensor& next_position() { return positions[static_cast<size_t>(step_no++ % max_len)]; }

  /// One token with caches grown by cat: logits [1, vocab], then each layer's keys and values
  /// [1, T + 1, dim] (the next call's caches).
  std::vector<Tensor> step_cat(const Tensor& token, const std::vector<Tensor>& keys,
                               const std::vector<Tensor>& values) const {
    NoGradGuard no_grad;
    Tensor h = emb.index_select(0, token).view({1, 1, kDim});
    std::vector<Tensor> out{Tensor()};
    for (int64_t l = 0; l < kLayers; ++l) {
      Tensor x = layer_norm(h, {kDim});
      Tensor q = matmul(x, wq[l]);
      Tensor k = cat({keys[l], matmul(x, wk[l])}, 1), v = cat({values[l], matmul(x, wv[l])}, 1);
      h = h + matmul(matmul(softmax(matmul(q, k.transpose(1, 2)) * (1.0 / 16), -1), v), wo[l]);
      h = h + matmul(gelu(matmul(layer_norm(h, {kDim}), w1[l])), w2[l]);
      out.push_back(k);
      out.push_back(v);
    }
    out[0] = matmul(h.view({1, kDim}), emb.t());
    return out;
  }
};

using CatStep = std::function<std::vector<Tensor>(const Tensor&, const std::vector<Tensor>&,
                                                  const std::vector<Tensor>&)>;

/// One token per call of a sequence whose caches (each [1, T, dim], T = 1 at first) grow by cat.
Benchmark growing_sequence(std::shared_ptr<Decoder> m, CatStep step) {
  struct Sequence {
    Tensor token;
    std::vector<Tensor> keys, values;
  };
  auto seq = std::make_shared<Sequence>();
  seq->token = m->tok;
  for (int64_t l = 0; l < kLayers; ++l) {
    seq->keys.push_back(zeros({1, 1, kDim}));
    seq->values.push_back(zeros({1, 1, kDim}));
  }
  return {[seq, step] {
            std::vector<Tensor> out = step(seq->token, seq->keys, seq->values);
            for (int64_t l = 0; l < kLayers; ++l) {
              seq->keys[l] = out[1 + 2 * l];
              seq->values[l] = out[2 + 2 * l];
            }
            seq->token = out[0].argmax(1);
            do_not_optimize(seq->token.data<int64_t>());
          },
          per_second(1)};
}

Benchmark growing_eager(const RunConfig&) {
  auto m = std::make_shared<Decoder>(false);
  return growing_sequence(m, [m](const Tensor& t, const std::vector<Tensor>& k,
                                 const std::vector<Tensor>& v) { return m->step_cat(t, k, v); });
}

Benchmark growing_compiled(const RunConfig&) {
  auto m = std::make_shared<Decoder>(false);
  auto step = kiln::compile(
      [m](const Tensor& t, const std::vector<Tensor>& k, const std::vector<Tensor>& v) {
        return m->step_cat(t, k, v);
      },
      {}, "decode_growing_cat");
  return growing_sequence(m, [step](const Tensor& t, const std::vector<Tensor>& k,
                                    const std::vector<Tensor>& v) { return step(t, k, v); });
}

std::function<Benchmark(const RunConfig&)> eager_case(bool index_copy, int64_t length) {
  return [index_copy, length](const RunConfig&) -> Benchmark {
    auto m = std::make_shared<Decoder>(index_copy, length);
    return {[m] { do_not_optimize(m->step(m->next_position())); }, per_second(1)};
  };
}

std::function<Benchmark(const RunConfig&)> compiled_case(bool index_copy, int64_t length) {
  return [index_copy, length](const RunConfig&) -> Benchmark {
    auto m = std::make_shared<Decoder>(index_copy, length);
    auto step = kiln::compile([m](const Tensor& pos) { return m->step(pos); }, {},
                              index_copy ? "decode_index_copy" : "decode_where");
    return {[m, step] { do_not_optimize(step(m->next_position())); }, per_second(1)};
  };
}

std::vector<Case> cases() {
  std::vector<Case> all;
  for (bool index_copy : {true, false}) {
    std::vector<Case> two =
        training_step_cases(index_copy ? "decode_index_copy" : "decode_where", "tokens/s",
                            eager_case(index_copy, kMaxLen), compiled_case(index_copy, kMaxLen),
                            true);
    all.insert(all.end(), two.begin(), two.end());
  }
  // A long cache: a copy of it per step (compiled code before the slots were written in the
  // cache's own buffer) costs more than the step's attention reads.
  std::vector<Case> long_cache = training_step_cases(
      "decode_index_copy_2048", "tokens/s", eager_case(true, kLongLen),
      compiled_case(true, kLongLen), true);
  all.insert(all.end(), long_cache.begin(), long_cache.end());
  std::vector<Case> growing =
      training_step_cases("decode_growing_cat", "tokens/s", growing_eager, growing_compiled, true);
  all.insert(all.end(), growing.begin(), growing.end());
  return all;
}

void summary(std::span<const Record> records) {
  fmt::print("\n");
  for (const char* name : {"decode_index_copy", "decode_where", "decode_index_copy_2048",
                           "decode_growing_cat"}) {
    const Record* e = find_record(records, kSuite, name, Mode::Eager);
    const Record* c = find_record(records, kSuite, name, Mode::Compiled);
    if (e && c)
      fmt::print("{}: eager {:.3f} ms/token, compiled {:.3f} ms/token ({:.2f}x)\n", name,
                 1e3 / e->value, 1e3 / c->value, c->value / e->value);
  }
}

[[maybe_unused]] const bool registered = register_suite(
    {kSuite,
     "one decoding step with a preallocated KV cache written by index_copy_ (or a whole-cache "
     "where), eager vs compiled",
     cases, summary});

}  // namespace
}  // namespace kiln::bench
