// unsupmt.h: XLM's unsupervised machine translation (facebookresearch/XLM, README unsupMT_enfr) on
// NewsCrawl en/fr.
//
//   encoder + decoder Transformers, emb 1024, 6 + 6 layers, 8 heads, FFN 4096, GELU, dropout 0.1, attention
//   dropout 0.1, post-LN (eps 1e-12), learned positions (512), language embeddings (en 0, fr 1), a LayerNorm
//   on the embedding sum, separate encoder and decoder token tables (XLM builds two TransformerModels), the
//   decoder's output projection tied to its token table plus a bias (share_inout_emb), vocabulary 64000
//   (MODELS.md: ~64k BPE), Adam β (0.9, 0.98) lr 1e-4 with inverse-sqrt warmup 4000 (init 1e-7), fp32.
// Parameter names follow this engine's seq2seq (fairseq style, models/translation/seq2seq.h), not XLM's.
//
// One train_step = XLM's loop body for en-fr: four optimizer updates, each a full Model::train_step
// (forward, backward, update), in XLM's order:
//   ae_en, ae_fr        denoising auto-encoding: a --tokens batch (default 2000) of one language's sentences,
//                       noised (shuffle within 3, drop 0.1, blank 0.1; data::add_noise) -> the clean sentence
//   bt_en_fr_en,        back-translation: 32 sentences x of language l1 are translated greedily to l2 under
//   bt_fr_en_fr         no-grad with the key/value cache (generate.h; max_len 1.3 S + 5), in eval mode; then
//                       the model trains on (y in l2) -> x. The generation's memory is tagged phase `generate`.
//                       Generation runs all max_len steps and y is padded to max_len + 1 (padding is masked:
//                       the same loss), so no shape depends on the generated tokens and meta predicts the
//                       cuda run's allocations exactly (XLM stops when every sentence has ended).
// StepResult::losses has the four by those names; loss is their mean; items are the target tokens of all
// four (XLM's words/s). Cross-entropy without label smoothing (XLM's).
// Data: synthetic monolingual sentences per language (seeded, lengths from a fixed distribution, at most
// 100 tokens with EOS as XLM's --max_len), or --data P: P.src as en and P.tgt as fr (their alignment
// unused: the corpus is read as two monolingual ones) with P.vocab.
// --inference: greedy en -> fr translation of a back-translation batch (decode_batch_step).
#pragma once
#include <array>
#include <memory>
#include <string>

#include "models/data/translation.h"
#include "models/model.h"
#include "models/translation/seq2seq.h"

namespace models::translation {

struct UnsupMTRecipe {
  Seq2SeqConfig net;
  int64_t ae_tokens = 2000, bt_sentences = 32;
  data::LengthDistribution lengths{24, 0.6, 1, 99};
  int64_t synthetic_sentences = 4096;  // per language
  int64_t synthetic_words = 0;         // 0: every word of the vocabulary
  data::NoiseOptions noise;
  double lr = 1e-4, beta1 = 0.9, beta2 = 0.98, adam_eps = 1e-8, warmup_init_lr = 1e-7;
  int64_t warmup = 4000;
  std::string data;
  uint64_t seed = 1;
  static UnsupMTRecipe from(const ModelConfig& c);  // --size big (default) | tiny, then the flags
};

class UnsupMT : public Model {
 public:
  explicit UnsupMT(const ModelConfig& c);
  explicit UnsupMT(const UnsupMTRecipe& r);
  graph::Module& module() override { return *net_; }
  std::string summary() const override;
  const char* item_unit() const override { return "tok"; }
  int64_t batch_size() const override { return recipe_.ae_tokens; }
  StepResult train_step(int64_t step) override;
  // Its four sub-steps read four different batches (two languages, two modes): one fixed batch cannot stand in.
  bool supports_fixed_batch() const override { return false; }
  // An epoch: steps 4 .. 3 + n, n the longest of the four batch orders (auto-encoding and back-translation, per
  // language), so that every batch of each runs at least once (the shorter orders cycle).
  std::vector<int64_t> epoch_steps() const override;
  std::string describe_batch(int64_t step) const override;
  StepResult eval_step(int64_t step) override;
  Seq2Seq& net() { return *net_; }
  const UnsupMTRecipe& recipe() const { return recipe_; }

  // The sub-steps of one train_step, in order.
  struct Task {
    std::string name;   // ae_en, ae_fr, bt_en_fr_en, bt_fr_en_fr
    bool back_translation;
    int64_t lang, other;  // AE: lang -> lang; BT: lang -> other (generated) -> lang (trained)
  };
  static const std::array<Task, 4>& tasks();

 protected:
  Batch make_batch(int64_t step) override;
  Tensor loss(const Batch& batch) override;
  int64_t items(const Batch& batch) const override { return target_tokens_; }

 private:
  UnsupMTRecipe recipe_;
  std::shared_ptr<Seq2Seq> net_;
  std::array<std::vector<data::Sentence>, 2> mono_;                     // per language
  std::array<std::vector<std::vector<int64_t>>, 2> ae_batches_, bt_batches_;
  std::array<std::unique_ptr<data::BatchOrder>, 2> ae_order_, bt_order_;
  std::string data_description_;
  const Task* task_ = nullptr;          // the sub-step make_batch / loss serve
  std::vector<data::Sentence> bt_x_;    // BT: the clean sentences of the batch (the training targets)
  int64_t target_tokens_ = 0;
  data::TranslationBatch bt_host_batch(int64_t lang, int64_t step) const;
};

}  // namespace models::translation
