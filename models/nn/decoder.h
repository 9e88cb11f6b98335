// decoder.h: the Transformer decoder layer (causal self-attention, encoder-decoder attention, feed-forward)
// and its key/value cache for generation one token at a time.
//
//   post-LN (fairseq transformer_vaswani_wmt_en_de_big, XLM):
//     x = LN1(x + Dropout(SelfAttn(x, causal)))
//     x = LN2(x + Dropout(EncAttn(x, encoder_out)))
//     x = LN3(x + Dropout(FFN(x)))
//   pre-LN (normalize_before): each block is x + Dropout(Block(LN(x))).
// Names follow fairseq's TransformerDecoderLayer: self_attn, self_attn_layer_norm, encoder_attn,
// encoder_attn_layer_norm, fc1, fc2, final_layer_norm (so a fairseq state dict loads by name).
//
// Generation (step): the layer sees one new position t per call. Its self-attention keys and values of
// positions 0..t-1 are kept in a cache allocated ONCE at its maximum length ([B, H, max_len, D] for K and
// V: no growth, no reallocation, so the ledger shows one block per tensor under the owner
// "<layer>.self_attn.kv_cache"); the new position's K and V are copied into slice t of it in place and the
// attention reads the first t + 1 positions as a view. The encoder-decoder keys and values depend only on
// the encoder output: computed once per sentence batch (owner "<layer>.encoder_attn.kv_cache").
// With Lq = 1 < Lk the causal mask is bottom-right aligned (ops/attention.h): the query sees every cached key.
#pragma once
#include <memory>

#include "models/nn/attention.h"
#include "models/nn/transformer.h"

namespace models::nn {

// One layer's cache: the self-attention's KVCache ([B, H, max_len, D], written position by position); enc_k,
// enc_v [B, H, S, D] (the projected encoder output, also in category kv_cache).
struct DecoderLayerCache {
  KVCache self;
  Tensor enc_k, enc_v;
  size_t bytes() const;  // the arena bytes of the four tensors
};

class TransformerDecoderLayer : public graph::Module {
 public:
  // config.heads, dim, ffn, dropouts, activation and normalize_before apply to both attentions.
  explicit TransformerDecoderLayer(const TransformerLayerConfig& config);
  // Training / full-sequence form. x [B, T, C], encoder_out [B, S, C], encoder_padding_mask bool [B, S]
  // (true: padding) or undefined. Causal self-attention. Returns [B, T, C].
  Tensor forward(const Tensor& x, const Tensor& encoder_out, const Tensor& encoder_padding_mask) const;
  // Allocates the self-attention cache for B sentences and max_len positions and projects the encoder
  // output once. Call under NoGrad.
  DecoderLayerCache start_cache(const Tensor& encoder_out, int64_t max_len) const;
  // Generation form: x [B, 1, C] is position t; the cache holds positions < t of this layer and receives
  // position t. Returns [B, 1, C]. Call under NoGrad, in eval mode.
  Tensor step(const Tensor& x, int64_t t, DecoderLayerCache& cache, const Tensor& encoder_padding_mask) const;

  TransformerLayerConfig config;
  std::shared_ptr<MultiheadAttention> self_attn, encoder_attn;
  std::shared_ptr<LayerNorm> self_attn_layer_norm, encoder_attn_layer_norm, final_layer_norm;
  std::shared_ptr<Linear> fc1, fc2;

 private:
  // The feed-forward block with its residual and norm (shared by forward and step).
  Tensor feed_forward_block(const Tensor& x) const;
  // A residual block around `attend` (normalize_before decides where the norm goes).
  template <typename F>
  Tensor residual(const Tensor& x, const LayerNorm& norm, F attend) const;
};

}  // namespace models::nn
