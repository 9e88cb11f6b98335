// squad.h: bert_squad, BERT fine-tuning for SQuAD 1.1 span prediction (google-research/bert run_squad.py;
// Hugging Face `BertForQuestionAnswering` names, so a transformers checkpoint loads).
//
//   bert.*        BertModel without pooler (models/bert/encoder.h)
//   qa_outputs    [2, C]: per token a start logit and an end logit -> start_logits, end_logits [B, T]
//
// Loss = (CE(start_logits, start) + CE(end_logits, end)) / 2, as transformers computes it: positions are
// clamped to [0, T] and T is the ignored index (a position outside the sequence counts for nothing).
// Padding tokens are masked out of attention (as keys) but, as in both reference implementations, not
// out of the span logits.
//
// Recipe (BertRecipe): BERT-Base (--size large: 24 layers, 1024, 16 heads), --seq 384, batch 12 and lr 3e-5
// (the run_squad README), AdamW as google-research's optimizer (β 0.9/0.999, eps 1e-6, weight decay 0.01
// except biases and LayerNorm), linear warmup over 10% of a nominal run of 2 epochs (int(87,599 / batch * 2)
// steps: 14,599 at batch 12) then linear decay (google-research's form), gradient clipping at norm 1.
// The tiny size (tests): seq 64, batch 8, lr 1e-3, no warmup, no dropout.
//
// Data: synthetic span examples by default (models/data/squad.h: marker words at the answer's ends). --data
// FILE reads SQuAD-format JSON, tokenized with the WordPiece vocab.txt beside the file (the model's
// vocabulary then has the file's size) or, without one, byte-level; max_seq_length = seq, doc_stride and
// max_query_length as run_squad (128, 64) at seq >= 384 (SquadOptions::for_seq). Each step draws its batch
// of features at random (seeded by seed and step).
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "models/bert/pretraining.h"
#include "models/data/squad.h"

namespace models::bert {

class BertForQuestionAnswering : public graph::Module {
 public:
  explicit BertForQuestionAnswering(const BertConfig& c);
  // {start_logits, end_logits}, each [B, T]
  std::pair<Tensor, Tensor> logits(const Tensor& ids, const Tensor& token_types, const Tensor& key_padding_mask) const;
  // start_positions, end_positions i64 [B], already in [0, T] (data::clamp_position); T is ignored.
  Tensor loss(const Tensor& ids, const Tensor& token_types, const Tensor& key_padding_mask,
              const Tensor& start_positions, const Tensor& end_positions) const;
  // Loads a transformers BertForQuestionAnswering state dict (position_ids ignored).
  std::vector<std::string> load_hf(const std::map<std::string, Tensor>& tensors);
  BertConfig config;
  std::shared_ptr<BertModel> bert;
  std::shared_ptr<nn::Linear> qa_outputs;
};

class BertSquad : public Model {
 public:
  explicit BertSquad(const ModelConfig& c);
  explicit BertSquad(const BertRecipe& r);
  static BertRecipe recipe_for(const ModelConfig& c);
  graph::Module& module() override { return *net_; }
  std::string summary() const override;
  const char* item_unit() const override { return "seq"; }
  int64_t batch_size() const override { return recipe_.batch; }
  int64_t max_seq() const override { return recipe_.bert.positions_grow ? 0 : recipe_.bert.max_positions; }
  int64_t min_seq() const override { return data::kMinSyntheticSpanSeq; }
  // Hugging Face names, with their tied and aliased entries (load_hf).
  std::vector<std::string> load_weights(const std::map<std::string, Tensor>& tensors) override {
    return net_->load_hf(tensors);
  }
  std::string hf_config_json() const override { return bert::hf_config_json(recipe_.bert, "BertForQuestionAnswering"); }
  BertForQuestionAnswering& net() { return *net_; }

 protected:
  HostBatch make_host_batch(int64_t step) override;
  Tensor loss(const Batch& batch) override;
  int64_t items(const Batch& batch) const override { return batch.at("ids").size(0); }

 private:
  BertRecipe recipe_;
  std::shared_ptr<BertForQuestionAnswering> net_;
  std::unique_ptr<data::Tokenizer> tokenizer_;  // with --data
  std::vector<data::SquadFeature> features_;
  int64_t examples_ = 0, skipped_ = 0;
};

}  // namespace models::bert
