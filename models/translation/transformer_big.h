// transformer_big.h: fairseq's transformer_vaswani_wmt_en_de_big (examples/scaling_nmt) on WMT16 en-de.
//
//   6 encoder + 6 decoder layers, d 1024, FFN 4096, 16 heads, post-LN, ReLU, sinusoidal positions, dropout
//   0.3 (attention and ReLU dropout 0), --share-all-embeddings with a joined 32768 vocabulary (one [V, C]
//   table: encoder input, decoder input and output projection), label-smoothed cross-entropy 0.1, Adam
//   β (0.9, 0.98), eps 1e-8, lr 5e-4 with inverse-sqrt warmup over 4000 updates (fairseq's default
//   warmup_init_lr: 0), no clipping, no weight decay, batches of --tokens 3584 (sentences x longest length <=
//   tokens, bucketed by length).
// Parameter names are fairseq's (encoder.embed_tokens.weight, encoder.layers.N.self_attn.q_proj.weight,
// decoder.layers.N.encoder_attn.k_proj.bias, ...), so a fairseq state dict loads by name (its tied copies
// decoder.embed_tokens.weight / decoder.output_projection.weight and the sinusoidal buffers are skipped).
// Initialization as fairseq's (seq2seq.h: xavier_init; embeddings normal(0, C^-1/2), padding row 0).
//
// Sizes: big (default) and tiny (the tests': 2+2 layers, d 64, a 16-word reversal task).
// Throughput counts target tokens ("tok", fairseq's wps). --inference decodes greedily with the key/value
// cache (models/translation/generate.h), max_len = 1.3 S + 5 (XLM's rule, capped at the positions), counts
// generated tokens, and reports the cache's bytes by length in StepResult::details.
#pragma once
#include <memory>
#include <string>

#include "models/data/translation.h"
#include "models/model.h"
#include "models/translation/seq2seq.h"

namespace models::translation {

struct TransformerBigRecipe {
  Seq2SeqConfig net;
  int64_t tokens = 3584;
  data::LengthDistribution lengths;   // synthetic sentence lengths (words)
  int64_t synthetic_pairs = 4096;     // the pool batches are made from
  int64_t synthetic_words = 0;        // 0: every word of the vocabulary
  double lr = 5e-4, beta1 = 0.9, beta2 = 0.98, adam_eps = 1e-8, warmup_init_lr = -1;
  int64_t warmup = 4000;
  double label_smoothing = 0.1;
  std::string data;
  uint64_t seed = 1;
  static TransformerBigRecipe from(const ModelConfig& c);  // --size big | tiny, then the flags
};

class TransformerBig : public Model {
 public:
  explicit TransformerBig(const ModelConfig& c);
  explicit TransformerBig(const TransformerBigRecipe& r);
  graph::Module& module() override { return *net_; }
  std::string summary() const override;
  const char* item_unit() const override { return "tok"; }
  int64_t batch_size() const override { return recipe_.tokens; }
  // Steps 1-2 the longest batch, step 3 the most padded one (models/data/translation.h): both extremes.
  std::vector<int64_t> probe_schedule() const override { return {1, 2, 3}; }
  std::vector<int64_t> epoch_steps() const override { return corpus_->epoch_steps(); }
  // Step `step`'s batch on this rank (its first micro-batch).
  std::string describe_batch(int64_t step) const override { return corpus_->describe_batch(data_step(step), parts()); }
  std::vector<std::string> load_weights(const std::map<std::string, Tensor>& tensors) override;
  // Greedy decoding of the step's batch with the key/value cache; items = generated tokens.
  StepResult eval_step(int64_t step) override;
  Seq2Seq& net() { return *net_; }
  const TransformerBigRecipe& recipe() const { return recipe_; }
  // The host batch a step runs (the bucketed pool, in BatchOrder).
  data::TranslationBatch host_batch(int64_t step) const;

 protected:
  HostBatch make_host_batch(int64_t step) override;
  Tensor loss(const Batch& batch) override;
  int64_t items(const Batch& batch) const override { return last_target_tokens_; }

 private:
  TransformerBigRecipe recipe_;
  std::shared_ptr<Seq2Seq> net_;
  std::unique_ptr<data::TokenBatchedCorpus> corpus_;
  int64_t last_target_tokens_ = 0;
};

}  // namespace models::translation
