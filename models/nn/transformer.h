// transformer.h: the Transformer layer (self-attention + feed-forward, residuals, layer norms).
//
//   post-LN (BERT, fairseq's transformer_vaswani_wmt_en_de_big):
//     x = LN1(x + Dropout(SelfAttn(x)));  x = LN2(x + Dropout(FFN(x)))
//   pre-LN (normalize_before):
//     x = x + Dropout(SelfAttn(LN1(x)));  x = x + Dropout(FFN(LN2(x)))
//   FFN(x) = fc2(Dropout_act(act(fc1(x))))
// Names follow fairseq: self_attn, self_attn_layer_norm, fc1, fc2, final_layer_norm.
#pragma once
#include <memory>
#include <string>

#include "models/nn/attention.h"

namespace models::nn {

struct TransformerLayerConfig {
  int64_t dim = 0, heads = 1, ffn = 0;
  double dropout = 0.1;            // on residual branches
  double attention_dropout = 0.0;  // on attention probabilities
  double activation_dropout = 0.0; // after the FFN activation
  std::string activation = "relu"; // relu | gelu | gelu_tanh
  bool normalize_before = false;   // pre-LN
  double layer_norm_eps = 1e-5;
  ops::AttentionAlgo algo = ops::AttentionAlgo::naive;
  Init init = {};
};

// Applies the named activation ("relu", "gelu", "gelu_tanh"), or an Error naming the valid ones.
Tensor activation(const std::string& name, const Tensor& x);
// The feed-forward block's inner part: fc2(dropout(activation(fc1(x)))), relu in fc1's GEMM epilogue (ops::linear),
// the other activations as ops of their own. The encoder's and the decoder's layers share it.
Tensor feed_forward(const Tensor& x, const Linear& fc1, const Linear& fc2, const std::string& activation_name,
                    double activation_dropout, bool training);

class TransformerLayer : public graph::Module {
 public:
  explicit TransformerLayer(const TransformerLayerConfig& config);
  // x [B, L, C]; key_padding_mask bool [B, L] or undefined.
  Tensor forward(const Tensor& x, const Tensor& key_padding_mask, bool causal) const;
  // Generation form of a causal layer: x [B, n, C] at positions t0 .. t0 + n - 1, its self-attention through
  // `cache` (MultiheadAttention::cached_self_attention). Under NoGrad, in eval mode.
  Tensor step(const Tensor& x, int64_t t0, KVCache& cache) const;
  TransformerLayerConfig config;
  std::shared_ptr<MultiheadAttention> self_attn;
  std::shared_ptr<LayerNorm> self_attn_layer_norm, final_layer_norm;
  std::shared_ptr<Linear> fc1, fc2;

 private:
  // The two residual blocks around `self_attention` (h -> [B, L, C]), shared by forward and step.
  template <typename F>
  Tensor blocks(const Tensor& x, F self_attention) const;
};

}  // namespace models::nn
