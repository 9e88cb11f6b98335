// transformer.cpp: the Transformer layer.
#include "models/nn/transformer.h"

#include "ops/dropout.h"
#include "ops/elementwise.h"

namespace models::nn {

Tensor activation(const std::string& name, const Tensor& x) {
  if (name == "relu") return ops::relu(x);
  if (name == "gelu") return ops::gelu(x);
  if (name == "gelu_tanh") return ops::gelu_tanh(x);
  throw engine::Error(engine::str("unknown activation '", name, "': expected relu, gelu or gelu_tanh"));
}

Tensor feed_forward(const Tensor& x, const Linear& fc1, const Linear& fc2, const std::string& activation_name,
                    double activation_dropout, bool training) {
  Tensor h = activation_name == "relu" ? fc1.forward(x, ops::Activation::relu)
                                       : activation(activation_name, fc1.forward(x));  // [..., ffn]
  return fc2.forward(ops::dropout(h, activation_dropout, training));
}

TransformerLayer::TransformerLayer(const TransformerLayerConfig& c) : config(c) {
  AttentionConfig ac;
  ac.dim = c.dim;
  ac.heads = c.heads;
  ac.dropout = c.attention_dropout;
  ac.algo = c.algo;
  ac.init = c.init;
  self_attn = register_module("self_attn", std::make_shared<MultiheadAttention>(ac));
  self_attn_layer_norm = register_module("self_attn_layer_norm", std::make_shared<LayerNorm>(c.dim, c.layer_norm_eps));
  fc1 = register_module("fc1", std::make_shared<Linear>(c.dim, c.ffn, true, c.init));
  fc2 = register_module("fc2", std::make_shared<Linear>(c.ffn, c.dim, true, c.init));
  final_layer_norm = register_module("final_layer_norm", std::make_shared<LayerNorm>(c.dim, c.layer_norm_eps));
}

template <typename F>
Tensor TransformerLayer::blocks(const Tensor& x_in, F self_attention) const {
  bool train = training();
  Tensor x = x_in;
  // Self-attention block.
  Tensor h = config.normalize_before ? self_attn_layer_norm->forward(x) : x;
  h = self_attention(h);
  x = config.normalize_before ? ops::add(x, ops::dropout(h, config.dropout, train))
                              : self_attn_layer_norm->forward_residual(h, x, config.dropout, train);
  // Feed-forward block.
  h = config.normalize_before ? final_layer_norm->forward(x) : x;
  h = feed_forward(h, *fc1, *fc2, config.activation, config.activation_dropout, train);
  return config.normalize_before ? ops::add(x, ops::dropout(h, config.dropout, train))
                                 : final_layer_norm->forward_residual(h, x, config.dropout, train);
}

Tensor TransformerLayer::forward(const Tensor& x_in, const Tensor& key_padding_mask, bool causal) const {
  auto s = scope();
  return blocks(x_in, [&](const Tensor& h) { return self_attn->forward(h, h, key_padding_mask, causal); });
}

Tensor TransformerLayer::step(const Tensor& x_in, int64_t t0, KVCache& cache) const {
  auto s = scope();
  return blocks(x_in, [&](const Tensor& h) { return self_attn->cached_self_attention(h, t0, cache); });
}

}  // namespace models::nn
