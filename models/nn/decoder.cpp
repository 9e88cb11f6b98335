// decoder.cpp: the Transformer decoder layer, full-sequence and one-position (cached) forms.
#include "models/nn/decoder.h"

#include "ops/dropout.h"
#include "ops/elementwise.h"
#include "ops/factory.h"
#include "ops/view.h"

namespace models::nn {

size_t DecoderLayerCache::bytes() const {
  size_t total = self.bytes();
  for (const Tensor* t : {&enc_k, &enc_v})
    if (t->defined()) total += t->nbytes();
  return total;
}

TransformerDecoderLayer::TransformerDecoderLayer(const TransformerLayerConfig& c) : config(c) {
  AttentionConfig ac;
  ac.dim = c.dim;
  ac.heads = c.heads;
  ac.dropout = c.attention_dropout;
  ac.algo = c.algo;
  ac.init = c.init;
  self_attn = register_module("self_attn", std::make_shared<MultiheadAttention>(ac));
  self_attn_layer_norm = register_module("self_attn_layer_norm", std::make_shared<LayerNorm>(c.dim, c.layer_norm_eps));
  encoder_attn = register_module("encoder_attn", std::make_shared<MultiheadAttention>(ac));
  encoder_attn_layer_norm =
      register_module("encoder_attn_layer_norm", std::make_shared<LayerNorm>(c.dim, c.layer_norm_eps));
  fc1 = register_module("fc1", std::make_shared<Linear>(c.dim, c.ffn, true, c.init));
  fc2 = register_module("fc2", std::make_shared<Linear>(c.ffn, c.dim, true, c.init));
  final_layer_norm = register_module("final_layer_norm", std::make_shared<LayerNorm>(c.dim, c.layer_norm_eps));
}

template <typename F>
Tensor TransformerDecoderLayer::residual(const Tensor& x, const LayerNorm& norm, F attend) const {
  if (!config.normalize_before) return norm.forward_residual(attend(x), x, config.dropout, training());
  return ops::add(x, ops::dropout(attend(norm.forward(x)), config.dropout, training()));
}

Tensor TransformerDecoderLayer::feed_forward_block(const Tensor& x) const {
  return residual(x, *final_layer_norm, [&](const Tensor& h) {
    return feed_forward(h, *fc1, *fc2, config.activation, config.activation_dropout, training());
  });
}

Tensor TransformerDecoderLayer::forward(const Tensor& x_in, const Tensor& encoder_out,
                                        const Tensor& encoder_padding_mask) const {
  auto s = scope();
  Tensor x = residual(x_in, *self_attn_layer_norm,
                      [&](const Tensor& h) { return self_attn->forward(h, h, Tensor(), /*causal=*/true); });
  x = residual(x, *encoder_attn_layer_norm, [&](const Tensor& h) {
    return encoder_attn->forward(h, encoder_out, encoder_padding_mask, /*causal=*/false);
  });
  return feed_forward_block(x);
}

DecoderLayerCache TransformerDecoderLayer::start_cache(const Tensor& encoder_out, int64_t max_len) const {
  auto s = scope();
  const int64_t H = config.heads;
  DecoderLayerCache cache;
  cache.self = self_attn->start_cache(encoder_out.size(0), max_len, encoder_out.dtype(), encoder_out.device_ptr());
  {
    auto a = encoder_attn->scope();
    engine::MemoryScope kv("kv_cache");
    engine::CategoryScope category(engine::Category::kv_cache);
    // split_heads is a view of the projection: the cache keeps the projected [B, S, C] blocks alive.
    cache.enc_k = split_heads(encoder_attn->k_proj->forward(encoder_out), H);  // [B, H, S, D]
    cache.enc_v = split_heads(encoder_attn->v_proj->forward(encoder_out), H);
  }
  return cache;
}

Tensor TransformerDecoderLayer::step(const Tensor& x_in, int64_t t, DecoderLayerCache& cache,
                                     const Tensor& encoder_padding_mask) const {
  auto s = scope();
  const int64_t H = config.heads;
  ENGINE_CHECK(x_in.dim() == 3 && x_in.size(1) == 1, "TransformerDecoderLayer::step: expected x [B, 1, C], got ",
               engine::shape_str(x_in.shape()));
  Tensor x = residual(x_in, *self_attn_layer_norm,
                      [&](const Tensor& h) { return self_attn->cached_self_attention(h, t, cache.self); });
  x = residual(x, *encoder_attn_layer_norm, [&](const Tensor& h) {
    auto a = encoder_attn->scope();
    Tensor q = split_heads(encoder_attn->q_proj->forward(h), H);  // [B, H, 1, D]
    return encoder_attn->attend_heads(q, cache.enc_k, cache.enc_v, encoder_padding_mask, /*causal=*/false);
  });
  return feed_forward_block(x);
}

}  // namespace models::nn
