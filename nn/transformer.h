#pragma once
/// Multi-head attention and the Transformer encoder (Vaswani et al. 2017, "Attention Is All You
/// Need"), with torch.nn's parameter layout, masks and defaults. The forwards with masks take
/// the caller's line (`loc`): errors raised inside name it (kiln::at_user_line).
#include <memory>
#include <vector>

#include "nn/layers.h"

namespace kiln::nn {

struct AttentionOutput {
  Tensor output;   ///< [B, L, E] (batch_first) or [L, B, E]
  /// [B, L, S], averaged over heads; undefined unless need_weights. In training mode with
  /// dropout these are the dropped-out weights the output used (rows need not sum to 1), as
  /// PyTorch 1.13 returns.
  Tensor weights;
};

/// softmax(Q Kᵀ / √d + mask) V per head, heads concatenated and projected.
/// in_proj_weight [3E, E] (xavier_uniform), in_proj_bias [3E] (zeros), out_proj Linear(E, E)
/// with zero bias. Throws kiln::Error unless embed_dim % num_heads == 0.
class MultiheadAttention : public Module {
 public:
  MultiheadAttention(int64_t embed_dim, int64_t num_heads, double dropout = 0, bool bias = true,
                     bool batch_first = false, Loc loc = Loc::current());
  /// query [B, L, E], key/value [B, S, E] (or [L, B, E] / [S, B, E] unless batch_first), or
  /// unbatched [L, E] / [S, E] (the output [L, E], weights [L, S]).
  /// key_padding_mask: [B, S] ([S] unbatched), bool (true = ignore that key) or floating point
  /// (added to the scores). attn_mask: bool (true = not allowed) or floating point (added to
  /// the scores), [L, S] or per batch and head [B·H, L, S] (as torch.nn.MultiheadAttention).
  /// is_causal adds the causal mask. Throws kiln::Error for other mask dtypes (an integer mask)
  /// or shapes.
  AttentionOutput forward(const Tensor& query, const Tensor& key, const Tensor& value,
                          const Tensor& key_padding_mask = Tensor(),
                          const Tensor& attn_mask = Tensor(), bool need_weights = true,
                          bool is_causal = false, Loc loc = Loc::current());
  /// Self-attention: forward(x, x, x).output.
  Tensor forward(const Tensor& x) override;
  std::string name() const override { return "MultiheadAttention"; }

  int64_t embed_dim, num_heads;
  double dropout_p;
  bool batch_first;
  Tensor in_proj_weight, in_proj_bias;
  std::shared_ptr<Linear> out_proj;
};

/// A bool [L, L] mask that is true above the diagonal (future positions), for attn_mask.
/// Throws kiln::Error naming the caller's line for a negative length.
Tensor causal_mask(int64_t length, Loc loc = Loc::current());

struct TransformerEncoderLayerOptions {
  int64_t d_model = 512;
  int64_t nhead = 8;
  int64_t dim_feedforward = 2048;
  double dropout = 0.1;
  std::string activation = "relu";  ///< "relu" or "gelu"
  double layer_norm_eps = 1e-5;
  bool batch_first = false;
  bool norm_first = false;  ///< pre-norm (true) or post-norm (false, the 2017 paper's)
};

/// Self-attention and feed-forward blocks with residuals, as torch.nn.TransformerEncoderLayer.
class TransformerEncoderLayer : public Module {
 public:
  /// Throws kiln::Error for an activation other than "relu"/"gelu" or d_model % nhead != 0.
  explicit TransformerEncoderLayer(const TransformerEncoderLayerOptions& options,
                                   Loc loc = Loc::current());
  Tensor forward(const Tensor& src, const Tensor& src_mask, const Tensor& src_key_padding_mask,
                 bool is_causal = false, Loc loc = Loc::current());
  Tensor forward(const Tensor& src) override { return forward(src, Tensor(), Tensor()); }
  std::string name() const override { return "TransformerEncoderLayer"; }

  TransformerEncoderLayerOptions options;
  std::shared_ptr<MultiheadAttention> self_attn;
  std::shared_ptr<Linear> linear1, linear2;
  std::shared_ptr<LayerNorm> norm1, norm2;
  std::shared_ptr<Dropout> dropout, dropout1, dropout2;

 private:
  Tensor activation(const Tensor& x) const;
};

/// num_layers independent layers built from `options`, then an optional final LayerNorm.
class TransformerEncoder : public Module {
 public:
  TransformerEncoder(const TransformerEncoderLayerOptions& options, int64_t num_layers,
                     bool final_norm = false, Loc loc = Loc::current());
  Tensor forward(const Tensor& src, const Tensor& mask, const Tensor& src_key_padding_mask,
                 bool is_causal = false, Loc loc = Loc::current());
  Tensor forward(const Tensor& src) override { return forward(src, Tensor(), Tensor()); }
  std::string name() const override { return "TransformerEncoder"; }

  std::vector<std::shared_ptr<TransformerEncoderLayer>> layers;
  std::shared_ptr<LayerNorm> norm;  ///< null unless final_norm
};

}  // namespace kiln::nn
