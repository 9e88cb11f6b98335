// attention.cpp: the multi-head attention layer.
#include "models/nn/attention.h"

#include "ops/view.h"

namespace models::nn {

Tensor split_heads(const Tensor& x, int64_t heads) {
  int64_t B = x.size(0), L = x.size(1), C = x.size(2);
  ENGINE_CHECK(C % heads == 0, "split_heads: width ", C, " is not divisible by ", heads, " heads");
  return ops::permute(ops::reshape(x, {B, L, heads, C / heads}), {0, 2, 1, 3});
}

Tensor merge_heads(const Tensor& x) {
  int64_t B = x.size(0), H = x.size(1), L = x.size(2), D = x.size(3);
  return ops::reshape(ops::permute(x, {0, 2, 1, 3}), {B, L, H * D});
}

MultiheadAttention::MultiheadAttention(const AttentionConfig& c) : config(c) {
  ENGINE_CHECK(c.dim % c.heads == 0, "MultiheadAttention: dim ", c.dim, " is not divisible by ", c.heads, " heads");
  q_proj = register_module("q_proj", std::make_shared<Linear>(c.dim, c.dim, true, c.init));
  k_proj = register_module("k_proj", std::make_shared<Linear>(c.dim, c.dim, true, c.init));
  v_proj = register_module("v_proj", std::make_shared<Linear>(c.dim, c.dim, true, c.init));
  out_proj = register_module("out_proj", std::make_shared<Linear>(c.dim, c.dim, true, c.init));
}

Tensor MultiheadAttention::forward(const Tensor& query, const Tensor& key_value, const Tensor& key_padding_mask,
                                   bool causal) const {
  auto s = scope();
  Tensor q = split_heads(q_proj->forward(query), config.heads);      // [B, H, Lq, D]
  Tensor k = split_heads(k_proj->forward(key_value), config.heads);  // [B, H, Lk, D]
  Tensor v = split_heads(v_proj->forward(key_value), config.heads);  // [B, H, Lk, D]
  ops::AttentionOptions opt;
  opt.algo = config.algo;
  opt.causal = causal;
  opt.dropout_p = config.dropout;
  opt.training = training();
  Tensor o;
  {
    engine::MemoryScope inner("attention");
    o = ops::attention(q, k, v, key_padding_mask, opt);  // [B, H, Lq, D]
  }
  return out_proj->forward(merge_heads(o));               // [B, Lq, C]
}

}  // namespace models::nn
