#include "nn/transformer.h"

#include <cmath>

#include "eager/factories.h"
#include "nn/init.h"

namespace kiln::nn {
namespace {
void check_heads(int64_t embed_dim, int64_t num_heads, Loc loc) {
  KILN_CHECK(embed_dim > 0 && num_heads > 0, "MultiheadAttention", loc,
             "embed_dim ({}) and num_heads ({}) must be positive", embed_dim, num_heads);
  KILN_CHECK(embed_dim % num_heads == 0, "MultiheadAttention", loc,
             "embed_dim ({}) must be divisible by num_heads ({})", embed_dim, num_heads);
}
}  // namespace

MultiheadAttention::MultiheadAttention(int64_t e, int64_t h, double dropout, bool bias, bool bf,
                                       Loc loc)
    : embed_dim(e), num_heads(h), dropout_p(dropout), batch_first(bf) {
  check_heads(e, h, loc);
  KILN_CHECK(dropout >= 0 && dropout <= 1, "MultiheadAttention", loc,
             "dropout must be in [0, 1], got {}", dropout);
  in_proj_weight = register_parameter("in_proj_weight", empty({3 * e, e}));
  init::xavier_uniform_(in_proj_weight);
  if (bias) in_proj_bias = register_parameter("in_proj_bias", zeros({3 * e}));
  out_proj = register_module("out_proj", std::make_shared<Linear>(e, e, bias, loc));
  if (bias) init::zeros_(out_proj->bias);
}

Tensor causal_mask(int64_t length, Loc loc) {
  KILN_CHECK(length >= 0, "causal_mask", loc, "length must be >= 0, got {}", length);
  return triu(ones({length, length}, {DType::Bool}, loc), 1, loc);
}

AttentionOutput MultiheadAttention::forward(const Tensor& query, const Tensor& key,
                                            const Tensor& value, const Tensor& key_padding_mask,
                                            const Tensor& attn_mask, bool need_weights,
                                            bool is_causal, Loc loc) {
  return at_user_line(loc, [&] {
  const bool bf = setting(batch_first, "batch_first");
  if (query.dim() == 2 && key.dim() == 2 && value.dim() == 2) {
    // Unbatched [L, E] / [S, E] (PyTorch): a batch of one; key_padding_mask [S].
    const int64_t bd = bf ? 0 : 1;
    Tensor kpm = key_padding_mask.defined() ? key_padding_mask.unsqueeze(0) : Tensor();
    AttentionOutput r = forward(query.unsqueeze(bd), key.unsqueeze(bd), value.unsqueeze(bd), kpm,
                                attn_mask, need_weights, is_causal, loc);
    r.output = r.output.squeeze(bd);
    if (r.weights.defined()) r.weights = r.weights.squeeze(0);
    return r;
  }
  KILN_CHECK(query.dim() == 3 && key.dim() == 3 && value.dim() == 3, "MultiheadAttention",
             Loc::current(), "expects 3-D (or unbatched 2-D) query/key/value, got {}, {}, {}",
             to_string(query.shape()), to_string(key.shape()), to_string(value.shape()));
  Tensor q = bf ? query : query.transpose(0, 1);
  Tensor k = bf ? key : key.transpose(0, 1);
  Tensor v = bf ? value : value.transpose(0, 1);
  // Settings read by forward: guarded in compiled functions, checked again (public fields).
  const int64_t E = setting(embed_dim, "embed_dim"), H = setting(num_heads, "num_heads");
  check_heads(E, H, Loc::current());
  const int64_t B = q.size(0), L = q.size(1), S = k.size(1), D = E / H;
  auto shapes = [&] {
    return fmt::format("query {}, key {}, value {}", to_string(query.shape()),
                       to_string(key.shape()), to_string(value.shape()));
  };
  KILN_CHECK(q.size(2) == E && k.size(2) == E && v.size(2) == E, "MultiheadAttention",
             Loc::current(), "{} do not match embed_dim {}", shapes(), E);
  KILN_CHECK(k.size(0) == B && v.size(0) == B, "MultiheadAttention", Loc::current(),
             "{} have different batch sizes", shapes());
  KILN_CHECK(v.size(1) == S, "MultiheadAttention", Loc::current(),
             "{}: key and value have different sequence lengths ({} and {})", shapes(), S,
             v.size(1));
  // Input projections: the rows of in_proj_weight are [W_q; W_k; W_v].
  auto project = [&](const Tensor& x, int i) {
    Tensor w = in_proj_weight.slice(0, i * E, (i + 1) * E);
    Tensor b = in_proj_bias.defined() ? in_proj_bias.slice(0, i * E, (i + 1) * E) : Tensor();
    return linear(x, w, b);  // [B, T, E]
  };
  auto heads = [&](const Tensor& x, int64_t T) {
    return x.reshape({B, T, H, D}).transpose(1, 2);  // [B, H, T, D]
  };
  Tensor qh = heads(project(q, 0), L) * (1.0 / std::sqrt(static_cast<double>(D)));
  Tensor kh = heads(project(k, 1), S);
  Tensor vh = heads(project(v, 2), S);
  Tensor scores = matmul(qh, kh.transpose(-1, -2));  // [B, H, L, S]
  Tensor mask = attn_mask;
  if (mask.defined()) {
    KILN_CHECK(mask.dtype() == DType::Bool || is_floating(mask.dtype()), "MultiheadAttention",
               Loc::current(), "attn_mask must be bool or floating point, got {}",
               kiln::name(mask.dtype()));
    KILN_CHECK(mask.shape() == Shape({L, S}) || mask.shape() == Shape({B * H, L, S}),
               "MultiheadAttention", Loc::current(),
               "attn_mask must be [{}, {}] or [{}, {}, {}] (batch x heads, L, S), got {}", L, S,
               B * H, L, S, to_string(mask.shape()));
    if (mask.dim() == 3) mask = mask.reshape({B, H, L, S});
  }
  if (is_causal) {
    KILN_CHECK(L == S, "MultiheadAttention", Loc::current(),
               "is_causal needs equal query and key lengths, got {} and {}", L, S);
    Tensor cm = causal_mask(L);
    mask = mask.defined() ? (mask.dtype() == DType::Bool ? logical_or(mask, cm)
                                                         : masked_fill(mask, cm, -INFINITY))
                          : cm;
  }
  // A bool mask is added as 0 / -inf, as PyTorch 1.13 converts it: a row whose keys are all
  // masked then gets NaN gradients, as with a float mask (masked_fill gave them 0).
  // A floating mask of another dtype is taken in the scores' dtype: a float64 mask made a
  // float32 module's output float64 (break-it pass).
  auto additive = [&](const Tensor& m) {
    if (m.dtype() != DType::Bool) return m.to(scores.dtype());
    return masked_fill(zeros(m.shape(), {scores.dtype(), scores.device()}), m, -INFINITY);
  };
  if (mask.defined()) scores = add(scores, additive(mask));
  if (key_padding_mask.defined()) {
    KILN_CHECK(key_padding_mask.shape() == Shape({B, S}) &&
                   (key_padding_mask.dtype() == DType::Bool || is_floating(key_padding_mask.dtype())),
               "MultiheadAttention", Loc::current(),
               "key_padding_mask must be bool or floating point [{}, {}], got {} {}", B, S,
               kiln::name(key_padding_mask.dtype()), to_string(key_padding_mask.shape()));
    Tensor kpm = key_padding_mask.view({B, 1, 1, S});
    scores = add(scores, additive(kpm));
  }
  Tensor attn = softmax(scores, -1);
  Tensor attn_d = dropout(attn, setting(dropout_p, "dropout_p"), is_training());
  Tensor out = matmul(attn_d, vh).transpose(1, 2).reshape({B, L, E});
  out = out_proj->forward(out);
  if (!bf) out = out.transpose(0, 1);
  AttentionOutput r{out, Tensor()};
  // The weights the output was computed with (after dropout, in training), summed over heads
  // and divided by H, as PyTorch 1.13's multi_head_attention_forward.
  if (need_weights) r.weights = sum(attn_d, {1}) / static_cast<double>(H);
  return r;
  });
}

Tensor MultiheadAttention::forward(const Tensor& x) { return forward(x, x, x, {}, {}, false).output; }

TransformerEncoderLayer::TransformerEncoderLayer(const TransformerEncoderLayerOptions& o, Loc loc)
    : options(o) {
  KILN_CHECK(o.activation == "relu" || o.activation == "gelu", "TransformerEncoderLayer", loc,
             "activation must be \"relu\" or \"gelu\", got \"{}\"", o.activation);
  // In the layer's own terms (MultiheadAttention would say embed_dim and num_heads).
  KILN_CHECK(o.nhead > 0 && o.d_model > 0 && o.d_model % o.nhead == 0,
             "TransformerEncoderLayer", loc,
             "d_model ({}) must be positive and divisible by nhead ({})", o.d_model, o.nhead);
  self_attn = register_module(
      "self_attn",
      std::make_shared<MultiheadAttention>(o.d_model, o.nhead, o.dropout, true, o.batch_first, loc));
  linear1 = register_module("linear1",
                            std::make_shared<Linear>(o.d_model, o.dim_feedforward, true, loc));
  dropout = register_module("dropout", std::make_shared<Dropout>(o.dropout, loc));
  linear2 = register_module("linear2",
                            std::make_shared<Linear>(o.dim_feedforward, o.d_model, true, loc));
  auto norm = [&] { return std::make_shared<LayerNorm>(Shape{o.d_model}, o.layer_norm_eps, true, loc); };
  norm1 = register_module("norm1", norm());
  norm2 = register_module("norm2", norm());
  dropout1 = register_module("dropout1", std::make_shared<Dropout>(o.dropout, loc));
  dropout2 = register_module("dropout2", std::make_shared<Dropout>(o.dropout, loc));
}

Tensor TransformerEncoderLayer::activation(const Tensor& x) const {
  const std::string& act = setting(options.activation, "activation");
  KILN_CHECK(act == "relu" || act == "gelu", "TransformerEncoderLayer", Loc::current(),
             "activation must be \"relu\" or \"gelu\", got \"{}\"", act);
  return act == "gelu" ? gelu(x) : relu(x);
}

Tensor TransformerEncoderLayer::forward(const Tensor& src, const Tensor& src_mask,
                                        const Tensor& src_key_padding_mask, bool is_causal,
                                        Loc loc) {
  return at_user_line(loc, [&] {
  KILN_CHECK(src.dim() == 3, "TransformerEncoderLayer", Loc::current(),
             "expects a 3-D src ([B, L, E] with batch_first, else [L, B, E]), got {} (unbatched "
             "[L, E] input is not supported: unsqueeze a batch dim)", to_string(src.shape()));
  auto sa = [&](const Tensor& x) {
    return dropout1->forward(
        self_attn->forward(x, x, x, src_key_padding_mask, src_mask, false, is_causal).output);
  };
  auto ff = [&](const Tensor& x) {
    return dropout2->forward(linear2->forward(dropout->forward(activation(linear1->forward(x)))));
  };
  Tensor x = src;
  if (setting(options.norm_first, "norm_first")) {
    x = x + sa(norm1->forward(x));
    x = x + ff(norm2->forward(x));
  } else {
    x = norm1->forward(x + sa(x));
    x = norm2->forward(x + ff(x));
  }
  return x;
  });
}

TransformerEncoder::TransformerEncoder(const TransformerEncoderLayerOptions& o, int64_t n,
                                       bool final_norm, Loc loc) {
  KILN_CHECK(n >= 0, "TransformerEncoder", loc, "num_layers must be >= 0, got {}", n);
  for (int64_t i = 0; i < n; ++i)
    layers.push_back(register_module("layers." + std::to_string(i),
                                     std::make_shared<TransformerEncoderLayer>(o, loc)));
  if (final_norm)
    norm = register_module(
        "norm", std::make_shared<LayerNorm>(Shape{o.d_model}, o.layer_norm_eps, true, loc));
}

Tensor TransformerEncoder::forward(const Tensor& src, const Tensor& mask,
                                   const Tensor& src_key_padding_mask, bool is_causal,
                                   Loc loc) {
  return at_user_line(loc, [&] {
    Tensor x = src;
    for (auto& l : layers) x = l->forward(x, mask, src_key_padding_mask, is_causal);
    return norm ? norm->forward(x) : x;
  });
}

}  // namespace kiln::nn
