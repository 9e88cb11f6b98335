// encoder.h: the BERT encoder (google-research/bert; Hugging Face `BertModel` parameter names), shared by
// bert_base (pretraining), bert_squad (span prediction) and mtdnn (multi-task heads).
//
//   embeddings: word [V, C] + position [P, C] + token type [2, C] -> LayerNorm -> dropout
//   encoder.layer.i (post-LN):
//     attention.self.{query,key,value} -> scaled dot-product attention (naive or flash, padding mask)
//     attention.output.dense -> dropout -> + x -> attention.output.LayerNorm
//     intermediate.dense -> GELU (erf) -> output.dense -> dropout -> + h -> output.LayerNorm
//   pooler: dense(tanh) of the first token's hidden state
//
// Names match transformers' BertModel under the prefix the head model gives ("bert."), so its safetensors
// checkpoints load. Recompute: "layer" recomputes each encoder layer in backward; "attention" only the
// attention core (scores, probabilities: the quadratic part).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "models/model.h"
#include "models/nn/layers.h"
#include "ops/attention.h"

namespace models::bert {

struct BertConfig {
  int64_t vocab = 30522, hidden = 768, layers = 12, heads = 12, intermediate = 3072;
  int64_t max_positions = 512, type_vocab = 2;
  bool positions_grow = false;  // a tiny size's table, made as long as the --seq asked for (bert_config_from)
  double hidden_dropout = 0.1, attention_dropout = 0.1, layer_norm_eps = 1e-12;
  double init_std = 0.02;
  ops::AttentionAlgo algo = ops::AttentionAlgo::naive;
  std::string recompute = "none";  // none | attention | layer
  static BertConfig base();
  static BertConfig large();
  // "base" | "large" | "tiny" (a 2-layer, 64-wide config for tests); else an Error.
  static BertConfig of_size(const std::string& size);
};

// A Hugging Face transformers config.json for `c` and the architecture whose state-dict names the model's
// parameters carry (e.g. "BertForPreTraining"): what engine_train --export-hf writes beside the weights.
std::string hf_config_json(const BertConfig& c, const std::string& architecture);

class BertEmbeddings : public graph::Module {
 public:
  explicit BertEmbeddings(const BertConfig& c);
  // ids, token_types: i64 [B, T] -> [B, T, C]
  Tensor forward(const Tensor& ids, const Tensor& token_types) const;
  BertConfig config;
  std::shared_ptr<nn::Embedding> word_embeddings, position_embeddings, token_type_embeddings;
  std::shared_ptr<nn::LayerNorm> LayerNorm;
};

// attention.self: the three projections and the attention core.
class BertSelfAttention : public graph::Module {
 public:
  explicit BertSelfAttention(const BertConfig& c);
  Tensor forward(const Tensor& x, const Tensor& key_padding_mask) const;  // [B, T, C] -> [B, T, C]
  BertConfig config;
  std::shared_ptr<nn::Linear> query, key, value;
};

// dense -> dropout -> residual -> LayerNorm (attention.output and output share this shape).
class BertResidualOutput : public graph::Module {
 public:
  BertResidualOutput(int64_t in, const BertConfig& c);
  Tensor forward(const Tensor& h, const Tensor& residual) const;
  BertConfig config;
  std::shared_ptr<nn::Linear> dense;
  std::shared_ptr<nn::LayerNorm> LayerNorm;
};

class BertAttention : public graph::Module {
 public:
  explicit BertAttention(const BertConfig& c);
  Tensor forward(const Tensor& x, const Tensor& key_padding_mask) const;
  std::shared_ptr<BertSelfAttention> self;
  std::shared_ptr<BertResidualOutput> output;
};

class BertIntermediate : public graph::Module {
 public:
  explicit BertIntermediate(const BertConfig& c);
  Tensor forward(const Tensor& x) const;  // dense + GELU
  std::shared_ptr<nn::Linear> dense;
};

class BertLayer : public graph::Module {
 public:
  explicit BertLayer(const BertConfig& c);
  Tensor forward(const Tensor& x, const Tensor& key_padding_mask) const;
  std::shared_ptr<BertAttention> attention;
  std::shared_ptr<BertIntermediate> intermediate;
  std::shared_ptr<BertResidualOutput> output;
};

class BertPooler : public graph::Module {
 public:
  explicit BertPooler(const BertConfig& c);
  Tensor forward(const Tensor& hidden) const;  // [B, T, C] -> tanh(dense(hidden[:, 0])) [B, C]
  std::shared_ptr<nn::Linear> dense;
};

// BertModel: embeddings, encoder.layer.i, and (optionally) the pooler.
class BertModel : public graph::Module {
 public:
  BertModel(const BertConfig& c, bool with_pooler);
  // ids, token_types i64 [B, T]; key_padding_mask bool [B, T] (true = padding) or undefined -> [B, T, C]
  Tensor forward(const Tensor& ids, const Tensor& token_types, const Tensor& key_padding_mask) const;
  BertConfig config;
  std::shared_ptr<BertEmbeddings> embeddings;
  std::vector<std::shared_ptr<BertLayer>> layers;  // registered as encoder.layer.i
  std::shared_ptr<BertPooler> pooler;              // null without pooler
 private:
  std::shared_ptr<graph::Module> encoder_;
};

}  // namespace models::bert
