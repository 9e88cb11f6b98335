// transformer_lm.h: a decoder-only Transformer language model with GPT-2's shapes (pre-LN, learned
// positions, GELU (tanh form), tied input/output embeddings, final LayerNorm).
//
// It is the engine's smallest complete model: the foundation's tests train its tiny size on the cpu and
// check that the meta device reproduces the cpu's every allocation; its small size is GPT-2 small (124 M
// parameters) for memory studies on meta.
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
  uint64_t seed = 1;
  // tiny | small | medium | large | xl (GPT-2's four shapes), then overridden by the ModelConfig fields.
  static TransformerLMConfig from(const ModelConfig& c);
};

class TransformerLMNet : public graph::Module {
 public:
  explicit TransformerLMNet(const TransformerLMConfig& c);
  // ids [B, T] (i64) -> logits [B, T, V]
  Tensor forward(const Tensor& ids) const;
  TransformerLMConfig config;
  std::shared_ptr<nn::Embedding> wte, wpe;
  std::vector<std::shared_ptr<nn::TransformerLayer>> h;
  std::shared_ptr<nn::LayerNorm> ln_f;
};

class TransformerLM : public Model {
 public:
  explicit TransformerLM(const ModelConfig& c);
  explicit TransformerLM(const TransformerLMConfig& c);
  graph::Module& module() override { return *net_; }
  std::string summary() const override;
  const char* item_unit() const override { return "seq"; }
  int64_t batch_size() const override { return config_.batch; }
  TransformerLMNet& net() { return *net_; }

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
