// attention.h: multi-head attention as a layer, over ops::attention (naive or flash).
//
//   x [B, L, C] --q/k/v projections--> [B, L, H*D] --split_heads (a view)--> [B, H, L, D]
//   --ops::attention--> [B, H, Lq, D] --merge_heads (one copy)--> [B, Lq, C] --out projection--> [B, Lq, C]
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

class MultiheadAttention : public graph::Module {
 public:
  explicit MultiheadAttention(const AttentionConfig& config);
  // query [B, Lq, C]; key_value [B, Lk, C] (self-attention: the same tensor); key_padding_mask bool [B, Lk]
  // or undefined. Returns [B, Lq, C].
  Tensor forward(const Tensor& query, const Tensor& key_value, const Tensor& key_padding_mask, bool causal) const;
  AttentionConfig config;
  std::shared_ptr<Linear> q_proj, k_proj, v_proj, out_proj;
};

}  // namespace models::nn
