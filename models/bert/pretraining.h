// pretraining.h: bert_base, BERT pretraining (google-research/bert run_pretraining.py; Hugging Face
// `BertForPreTraining` names, so a transformers checkpoint loads).
//
//   bert.*                                   BertModel with pooler (models/bert/encoder.h)
//   cls.predictions.transform.dense          [C, C]  -> GELU (erf) -> cls.predictions.transform.LayerNorm
//   decoder                                  the word embedding matrix [V, C] itself (tied: no parameter of its
//                                            own) + cls.predictions.bias [V]
//   cls.seq_relationship                     [2, C] on the pooled [CLS] state: next-sentence prediction
//
// Loss = masked-LM cross-entropy + next-sentence cross-entropy (transformers' total_loss). The masked-LM
// head scores only the M masked positions of each sequence: the hidden states [B*T, C] are gathered at the
// flat positions (index_select) into [B*M, C] before the transform and the [C, V] decoder, which is what
// run_pretraining.py's gather_indexes does, so the [B, T, V] logits are never materialized. This is the same
// function as transformers' loss over all positions with labels -100 elsewhere.
//
// Recipe (bert_base defaults; BertRecipe): BERT-Base, --seq 128 (phase 1), batch 32 (the google-research
// README's GPU example: train_batch_size 32, max_seq_length 128), AdamW β (0.9, 0.999), eps 1e-6, weight
// decay 0.01 except biases and LayerNorm, lr 1e-4 with linear warmup over 10,000 steps then linear decay to
// 0 at 1,000,000 (google-research's schedule: the decay line starts at step 0), gradient clipping at norm 1.
// The tiny size (tests) learns within 40 steps: lr 5e-3, no warmup, no dropout, and synthetic progressions
// over 32 words that all start at offset 0 with steps 1 or 2 (a word is then known from its position up to
// the step, which the position embeddings learn quickly; the context tells the step).
//
// Data (models/data/masked_lm.h): synthetic progressions by default; --data FILE reads raw bytes with the
// byte-level vocabulary ([PAD] 0, [UNK] 1, [CLS] 2, [SEP] 3, [MASK] 4, byte b = 5 + b). The model keeps its
// configured vocabulary (30,522 for base) so its size is BERT-Base's; byte ids use its first 261 rows.
#pragma once
#include <memory>
#include <string>

#include "models/bert/encoder.h"
#include "models/data/masked_lm.h"
#include "models/data/wordpiece.h"
#include "models/model.h"

namespace models::bert {

// A BERT training run: the encoder's shape and the optimization recipe.
struct BertRecipe {
  BertConfig bert;
  int64_t seq = 128, batch = 32;
  double lr = 1e-4, weight_decay = 0.01, adam_eps = 1e-6, clip_norm = 1.0;
  int64_t warmup = 10000, total_steps = 1000000;  // 0 warmup: constant lr
  // synthetic data (data::ProgressionSource): its word ids (0: the whole vocabulary), its offsets (0: as
  // many as words) and its largest step
  int64_t synthetic_words = 0, synthetic_offsets = 0, synthetic_max_step = 4;
  std::string data;
  uint64_t seed = 1;
};

// The encoder for --size (default_size when empty), the dimension overrides (ModelConfig::dims), --attention and
// --recompute. tiny grows its position table to the sequence when needed (unless tiny_grows is false or
// --positions is given); other shapes refuse a sequence longer than their positions.
BertConfig bert_config_from(const ModelConfig& c, const std::string& default_size, int64_t seq, bool tiny_grows = true);
// AdamW with BERT's exclusions (names containing "bias" or "LayerNorm" get no weight decay).
std::unique_ptr<ops::Optimizer> bert_optimizer(const graph::Module& m, const BertRecipe& r);
// Linear warmup then linear decay (google-research's form), or null (constant) without warmup.
std::unique_ptr<ops::LrSchedule> bert_schedule(const BertRecipe& r);

class BertPredictionHeadTransform : public graph::Module {
 public:
  explicit BertPredictionHeadTransform(const BertConfig& c);
  Tensor forward(const Tensor& x) const;  // LayerNorm(gelu(dense(x)))
  std::shared_ptr<nn::Linear> dense;
  std::shared_ptr<nn::LayerNorm> LayerNorm;
};

class BertLMPredictionHead : public graph::Module {
 public:
  explicit BertLMPredictionHead(const BertConfig& c);
  // x [N, C], the tied decoder weight [V, C] -> logits [N, V]
  Tensor forward(const Tensor& x, const Tensor& decoder_weight) const;
  std::shared_ptr<BertPredictionHeadTransform> transform;
  Tensor bias;  // [V]
};

class BertPreTrainingHeads : public graph::Module {
 public:
  explicit BertPreTrainingHeads(const BertConfig& c);
  std::shared_ptr<BertLMPredictionHead> predictions;
  std::shared_ptr<nn::Linear> seq_relationship;
};

class BertForPreTraining : public graph::Module {
 public:
  explicit BertForPreTraining(const BertConfig& c);
  struct Losses {
    Tensor mlm, nsp, total;  // 0-d
  };
  // ids, token_types i64 [B, T]; key_padding_mask bool [B, T] or undefined; masked_positions i64 [B*M]
  // (flat b*T + t), masked_labels i64 [B*M]; next_sentence_labels i64 [B] (0: B follows A).
  Losses forward(const Tensor& ids, const Tensor& token_types, const Tensor& key_padding_mask,
                 const Tensor& masked_positions, const Tensor& masked_labels,
                 const Tensor& next_sentence_labels) const;
  // Loads a transformers BertForPreTraining state dict: the tied decoder weight is skipped, the decoder
  // bias may be stored as cls.predictions.bias or cls.predictions.decoder.bias, position_ids is ignored.
  std::vector<std::string> load_hf(std::map<std::string, Tensor> tensors);
  BertConfig config;
  std::shared_ptr<BertModel> bert;
  std::shared_ptr<BertPreTrainingHeads> cls;
};

class BertPretraining : public Model {
 public:
  explicit BertPretraining(const ModelConfig& c);
  explicit BertPretraining(const BertRecipe& r);
  static BertRecipe recipe_for(const ModelConfig& c);
  graph::Module& module() override { return *net_; }
  std::string summary() const override;
  const char* item_unit() const override { return "seq"; }
  int64_t batch_size() const override { return recipe_.batch; }
  int64_t max_seq() const override { return recipe_.bert.positions_grow ? 0 : recipe_.bert.max_positions; }
  int64_t min_seq() const override { return data::kMinMaskedLmSeq; }
  // Hugging Face names, with their tied and aliased entries (load_hf).
  std::vector<std::string> load_weights(const std::map<std::string, Tensor>& tensors) override {
    return net_->load_hf(tensors);
  }
  std::string hf_config_json() const override { return bert::hf_config_json(recipe_.bert, "BertForPreTraining"); }
  // The default step, with the two losses reported as "mlm" and "nsp".
  StepResult train_step(int64_t step) override;
  BertForPreTraining& net() { return *net_; }

 protected:
  HostBatch make_host_batch(int64_t step) override;
  Tensor loss(const Batch& batch) override;
  int64_t items(const Batch& batch) const override { return batch.at("ids").size(0); }

 private:
  BertRecipe recipe_;
  std::shared_ptr<BertForPreTraining> net_;
  std::unique_ptr<data::PassageSource> source_;
  data::MaskingIds mask_ids_;
  Tensor last_mlm_, last_nsp_;  // detached, read after the step
};

}  // namespace models::bert
