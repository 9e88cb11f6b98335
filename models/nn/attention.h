// attention.h: multi-head attention as a layer, over ops::attention (naive or flash).
//
//   x [B, L, C] --q/k/v projections--> [B, L, H*D] --split_heads (a view)--> [B, H, L, D]
//   --ops::attention--> [B, H, Lq, D] --merge_heads (one copy)--> [B, Lq, C] --out projection--> [B, Lq, C]
// Flash self-attention (key_value is query) projects q, k and v with one GEMM (stacked_linear: [B, L, 3C]) and
// attends with ops::attention_packed, whose single gradient feeds that GEMM's backward: one product and no
// gradient copies where there were three products and two sums. The parameters are the same three.
//
// Parameter names follow fairseq (q_proj, k_proj, v_proj, out_proj); models that load Hugging Face
// checkpoints (BERT) name their own projections and use split_heads / merge_heads / ops::attention directly.
#pragma once
#include <memory>

#include "models/nn/layers.h"
#include "ops/attention.h"

namespace models::nn {

// [B, L, H*D] -> [B, H, L, D] (a strided view, no copy).
Tensor split_heads(const Tensor& x, int64_t heads);
// [B, H, L, D] -> [B, L, H*D] (contiguous).
Tensor merge_heads(const Tensor& x);

struct AttentionConfig {
  int64_t dim = 0;
  int64_t heads = 1;
  double dropout = 0.0;  // on the attention probabilities
  ops::AttentionAlgo algo = ops::AttentionAlgo::naive;
  Init init = {};
};

// A self-attention key/value cache for generation: k, v [B, H, max_len, D], allocated once at the longest length
// the generation can reach (no growth, no reallocation: one block per tensor), in category kv_cache under the
// owner "<attention>.kv_cache". Positions are written in place as they are computed.
struct KVCache {
  Tensor k, v;
  int64_t max_len() const { return k.defined() ? k.size(2) : 0; }
  size_t bytes() const { return (k.defined() ? k.nbytes() : 0) + (v.defined() ? v.nbytes() : 0); }
};

class MultiheadAttention : public graph::Module {
 public:
  explicit MultiheadAttention(const AttentionConfig& config);
  // query [B, Lq, C]; key_value [B, Lk, C] (self-attention: the same tensor); key_padding_mask bool [B, Lk]
  // or undefined. Returns [B, Lq, C].
  Tensor forward(const Tensor& query, const Tensor& key_value, const Tensor& key_padding_mask, bool causal) const;
  // The attention on projected heads, q [B, H, Lq, D], k, v [B, H, Lk, D], then merge_heads and out_proj:
  // what forward computes after its projections. Returns [B, Lq, C].
  Tensor attend_heads(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& key_padding_mask,
                      bool causal) const;
  // An empty (zeroed) cache for `batch` sequences of up to `max_len` positions.
  KVCache start_cache(int64_t batch, int64_t max_len, engine::DType dtype,
                      const std::shared_ptr<engine::Device>& device) const;
  // Causal self-attention of x [B, n, C] at positions t0 .. t0 + n - 1 through `cache`: their keys and values go
  // into the cache in place, and the queries attend to positions 0 .. t0 + n - 1 (the causal mask bottom-right
  // aligned, ops/attention.h). n > 1 is a prefill, n = 1 one decoding step. Returns [B, n, C]. Under NoGrad.
  Tensor cached_self_attention(const Tensor& x, int64_t t0, KVCache& cache) const;
  // ops::attention's options for this layer (dropout only while training).
  ops::AttentionOptions options(bool causal) const;
  AttentionConfig config;
  std::shared_ptr<Linear> q_proj, k_proj, v_proj, out_proj;
};

}  // namespace models::nn
