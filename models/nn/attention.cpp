// attention.cpp: the multi-head attention layer.
#include "models/nn/attention.h"

#include "ops/elementwise.h"
#include "ops/factory.h"
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
  if (config.algo == ops::AttentionAlgo::flash && query.impl() == key_value.impl()) {
    // Flash self-attention: q, k and v from one GEMM, attended as one packed op (ops/attention.h).
    Tensor qkv = stacked_linear(query, {q_proj.get(), k_proj.get(), v_proj.get()});  // [B, L, 3C]
    Tensor o;
    {
      engine::MemoryScope inner("attention");
      o = ops::attention_packed(qkv, config.heads, key_padding_mask, options(causal));  // [B, H, L, D]
    }
    return out_proj->forward(merge_heads(o));  // [B, L, C]
  }
  Tensor q = split_heads(q_proj->forward(query), config.heads);      // [B, H, Lq, D]
  Tensor k = split_heads(k_proj->forward(key_value), config.heads);  // [B, H, Lk, D]
  Tensor v = split_heads(v_proj->forward(key_value), config.heads);  // [B, H, Lk, D]
  return attend_heads(q, k, v, key_padding_mask, causal);
}

ops::AttentionOptions MultiheadAttention::options(bool causal) const {
  ops::AttentionOptions opt;
  opt.algo = config.algo;
  opt.causal = causal;
  opt.dropout_p = config.dropout;
  opt.training = training();
  return opt;
}

Tensor MultiheadAttention::attend_heads(const Tensor& q, const Tensor& k, const Tensor& v,
                                        const Tensor& key_padding_mask, bool causal) const {
  Tensor o;
  {
    engine::MemoryScope inner("attention");
    o = ops::attention(q, k, v, key_padding_mask, options(causal));  // [B, H, Lq, D]
  }
  return out_proj->forward(merge_heads(o));  // [B, Lq, C]
}

KVCache MultiheadAttention::start_cache(int64_t batch, int64_t max_len, engine::DType dtype,
                                        const std::shared_ptr<engine::Device>& device) const {
  ENGINE_CHECK(batch >= 1 && max_len >= 1, "MultiheadAttention::start_cache: batch ", batch, " and length ", max_len,
               " must be at least 1");
  auto s = scope();
  engine::MemoryScope kv("kv_cache");
  engine::CategoryScope category(engine::Category::kv_cache);
  const int64_t H = config.heads, D = config.dim / config.heads;
  return KVCache{ops::zeros({batch, H, max_len, D}, dtype, device), ops::zeros({batch, H, max_len, D}, dtype, device)};
}

Tensor MultiheadAttention::cached_self_attention(const Tensor& x, int64_t t0, KVCache& cache) const {
  auto s = scope();
  ENGINE_CHECK(x.dim() == 3 && x.size(2) == config.dim, "cached_self_attention: expected x [B, n, ", config.dim,
               "], got ", engine::shape_str(x.shape()));
  const int64_t n = x.size(1), end = t0 + n;
  ENGINE_CHECK(cache.k.defined() && cache.k.size(0) == x.size(0), "cached_self_attention: the cache holds ",
               cache.k.defined() ? cache.k.size(0) : 0, " sequences, x ", x.size(0));
  ENGINE_CHECK(t0 >= 0 && end <= cache.max_len(), "cached_self_attention: positions ", t0, "..", end - 1,
               " are outside the cache of ", cache.max_len(), " positions");
  const int64_t H = config.heads;
  Tensor q = split_heads(q_proj->forward(x), H);  // [B, H, n, D]
  ops::copy_(ops::slice(cache.k, 2, t0, end), split_heads(k_proj->forward(x), H));
  ops::copy_(ops::slice(cache.v, 2, t0, end), split_heads(v_proj->forward(x), H));
  // The prefix so far, a view of the cache: [B, H, end, D].
  return attend_heads(q, ops::slice(cache.k, 2, 0, end), ops::slice(cache.v, 2, 0, end), Tensor(), /*causal=*/true);
}

}  // namespace models::nn
