// transformer_lm.h: a decoder-only Transformer language model with GPT-2's shapes (pre-LN, learned
// positions, GELU (tanh form), tied input/output embeddings, final LayerNorm).
//
// It is the engine's smallest complete model: the foundation's tests train its tiny size on the cpu and
// check that the meta device reproduces the cpu's every allocation; its small size is GPT-2 small (124 M
// parameters) for memory studies on meta.
//
// Inference (--inference): eval steps; with --generate N, each step decodes greedily: the batch's sequences are
// the prompts (--seq tokens), one prefill pass writes their keys and values into a cache per layer (allocated
// once at seq + N positions, category kv_cache), then N - 1 steps of one token each (the prefill gives the first
// token), batched over --batch sequences: the serving question's memory (weights, KV cache, one pass's
// activations). Only the last position's logits are computed ([B, V], not [B, T, V]). The prefill runs in
// passes of whole sequences, --prefill-tokens prompt tokens each (8192 by default, as vLLM's default batched-token
// budget; 0: every prompt in one pass), so its activations do not grow with the batch beside the full cache.
//
// Data: synthetic arithmetic sequences x_i = (s + i * k) mod V (s, k drawn per sequence from a seeded host
// generator): a model that has learned to read k from the context predicts every later token, so the loss
// falls far below ln V.
#pragma once
#include <memory>
#include <vector>

#include "models/model.h"
#include "models/nn/layers.h"
#include "models/nn/transformer.h"

namespace models {

struct TransformerLMConfig {
  int64_t vocab = 64, dim = 64, heads = 4, layers = 2, ffn = 256, max_positions = 64;
  int64_t seq = 32, batch = 8;
  double dropout = 0.0, attention_dropout = 0.0, lr = 3e-3, weight_decay = 0.0;
  int64_t warmup = 0;
  ops::AttentionAlgo algo = ops::AttentionAlgo::naive;
  bool recompute_layers = false;
  int64_t generate = 0;  // tokens decoded per eval step (0: an eval step computes the loss)
  bool positions_grow = false;    // tiny's table, made as long as the --seq asked for
  int64_t prefill_tokens = 8192;  // prompt tokens per prefill pass (whole sequences; 0: the whole batch in one)
  uint64_t seed = 1;
  // tiny | small | medium | large | xl (GPT-2's four shapes), then overridden by the ModelConfig fields.
  static TransformerLMConfig from(const ModelConfig& c);
};

class TransformerLMNet : public graph::Module {
 public:
  explicit TransformerLMNet(const TransformerLMConfig& c);
  // ids [B, T] (i64) -> logits [B, T, V]
  Tensor forward(const Tensor& ids) const;
  // One KVCache per layer for `batch` sequences of up to `max_len` positions.
  std::vector<nn::KVCache> start_cache(int64_t batch, int64_t max_len,
                                       const std::shared_ptr<engine::Device>& device) const;
  // Generation form: ids [B, n] at positions t0 .. t0 + n - 1 through the caches -> the logits of the last
  // position only, [B, V]. Under NoGrad, in eval mode.
  Tensor forward_cached(const Tensor& ids, int64_t t0, std::vector<nn::KVCache>& caches) const;
  TransformerLMConfig config;
  std::shared_ptr<nn::Embedding> wte, wpe;
  std::vector<std::shared_ptr<nn::TransformerLayer>> h;
  std::shared_ptr<nn::LayerNorm> ln_f;
};

// Greedy decoding of `tokens` new tokens after prompt [B, P] (i64): with the cache (a prefill, then one token per
// step) or without (the reference: the whole sequence so far runs again at every step and the last position's
// logits are read). Runs in phase generate under NoGrad, in eval mode (restored after).
struct LMGeneration {
  std::vector<std::vector<int64_t>> tokens;  // per sequence, the generated tokens (meta: zeros)
  size_t cache_bytes = 0;                    // every layer's K and V at prompt + tokens positions
};
// The sequences of one prefill pass: prefill_tokens / prompt, at least 1, at most batch (0 tokens: the whole batch).
int64_t prefill_chunk(int64_t prefill_tokens, int64_t prompt, int64_t batch);
// prefill_tokens: the prompt tokens of one prefill pass (whole sequences, at least one; 0: all in one pass).
LMGeneration greedy_generate(TransformerLMNet& net, const Tensor& prompt, int64_t tokens, bool use_cache,
                             int64_t prefill_tokens = 0);
// The KV cache of `batch` sequences at `length` positions: 2 (K, V) x layers x batch x length x dim x bytes.
size_t lm_cache_bytes(const TransformerLMConfig& c, int64_t batch, int64_t length, size_t element_bytes);

class TransformerLM : public Model {
 public:
  explicit TransformerLM(const ModelConfig& c);
  explicit TransformerLM(const TransformerLMConfig& c);
  graph::Module& module() override { return *net_; }
  std::string summary() const override;
  const char* item_unit() const override { return "seq"; }
  int64_t batch_size() const override { return config_.batch; }
  int64_t max_seq() const override { return config_.positions_grow ? 0 : config_.max_positions - config_.generate; }
  TransformerLMNet& net() { return *net_; }
  // With config.generate > 0: one batch of prompts decoded greedily (greedy_generate, cached); no loss; items =
  // the sequences decoded; details = the KV cache's bytes and what the first sequence generated.
  StepResult eval_step(int64_t step) override;

 protected:
  Batch make_batch(int64_t step) override;
  Tensor loss(const Batch& batch) override;
  int64_t items(const Batch& batch) const override { return batch.at("ids").size(0); }

 private:
  void build();
  TransformerLMConfig config_;
  std::shared_ptr<TransformerLMNet> net_;
};

}  // namespace models
