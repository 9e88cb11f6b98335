// convs2s.h: fairseq's fconv_wmt_en_de on WMT14 en-de (Gehring et al. 2017), the recipe and the model.
//
//   network   models/convs2s/fconv.h: 15 + 15 gated convolution layers [(512, 3)] x 9 + [(1024, 3)] x 4 +
//             [(2048, 1)] x 2, embed 768, learned positions (1024), attention in every decoder layer, decoder
//             out-embed 512, weight normalization on every convolution and linear layer, dropout 0.2,
//             separate source and target vocabularies (40000 each by default: fairseq's dictionaries for a
//             40k-merge BPE are of that size).
//   training  label-smoothed cross-entropy 0.1 (mean over target tokens, padding ignored), fairseq's NAG =
//             ops::Sgd with Nesterov momentum 0.99 (the same update at a constant lr), lr 0.5, clip-norm 0.1,
//             batches of --tokens 4000 (sentences x longest length <= tokens, bucketed by length:
//             models/data/translation.h, shared with transformer_big). fp32.
//   data      synthetic reversal pairs by default, or --data PREFIX (PREFIX.src/.tgt/.vocab, one vocabulary
//             for both sides here); sizes: wmt (default) and tiny (the tests': a 16-word reversal task).
//   decoding  greedy, incremental by default: each decoder layer keeps the last K-1 inputs of its causal
//             convolution (fairseq's LinearizedConvolution buffer), so a step runs the decoder on the newest
//             token only; or, for checking it, the decoder recomputed over the whole prefix at every step.
//             --inference decodes the step's batch (max_len 1.3 S + 5) and counts generated tokens.
// Throughput counts target tokens ("tok", fairseq's wps).
#pragma once
#include <memory>
#include <string>

#include "models/convs2s/fconv.h"
#include "models/data/translation.h"
#include "models/model.h"

namespace models::convs2s {

struct Convs2sRecipe {
  FConvConfig net;
  int64_t tokens = 4000;
  data::LengthDistribution lengths;  // synthetic sentence lengths (words)
  int64_t synthetic_pairs = 4096;
  int64_t synthetic_words = 0;       // 0: every word both vocabularies have
  double lr = 0.5, momentum = 0.99, clip_norm = 0.1, label_smoothing = 0.1;
  std::string data;
  uint64_t seed = 1;
  static Convs2sRecipe from(const ModelConfig& c);  // --size wmt | tiny, then the flags
};

// Greedy decoding of src [B, S] (its positions and padding mask as in a batch) from </s>, at most max_len
// tokens per sentence (EOS included). NoGrad, eval mode (the training flag restored), phase `generate`. On
// meta the argmax reads 0, never </s>: all max_len steps run (the memory worst case).
struct GreedyResult {
  std::vector<data::Sentence> sentences;  // per row, without EOS
  int64_t steps = 0;                      // decoder steps run
  int64_t generated_tokens = 0;           // tokens produced before each sentence stopped (EOS counted)
};
GreedyResult greedy_decode(FConvModel& net, const Tensor& src, const Tensor& src_positions,
                           const Tensor& src_padding_mask, int64_t max_len, bool incremental = true);

class Convs2s : public Model {
 public:
  explicit Convs2s(const ModelConfig& c);
  explicit Convs2s(const Convs2sRecipe& r);
  graph::Module& module() override { return *net_; }
  std::string summary() const override;
  const char* item_unit() const override { return "tok"; }
  int64_t batch_size() const override { return recipe_.tokens; }
  // Steps 1-2 the longest batch, step 3 the most padded one (models/data/translation.h): both extremes.
  std::vector<int64_t> probe_schedule() const override { return {1, 2, 3}; }
  std::vector<int64_t> epoch_steps() const override { return corpus_->epoch_steps(); }
  // Step `step`'s batch on this rank (its first micro-batch).
  std::string describe_batch(int64_t step) const override { return corpus_->describe_batch(data_step(step), parts()); }
  // Greedy decoding of the step's batch (incremental); items = generated tokens.
  StepResult eval_step(int64_t step) override;
  FConvModel& net() { return *net_; }
  const Convs2sRecipe& recipe() const { return recipe_; }
  data::TranslationBatch host_batch(int64_t step) const;
  // The tensors of a host batch on the default device: src, src_positions, src_padding_mask, prev_output,
  // tgt_positions, target.
  static Batch batch_tensors(const data::TranslationBatch& b, int64_t padding_idx);

 protected:
  Batch make_batch(int64_t step) override;
  Tensor loss(const Batch& batch) override;
  int64_t items(const Batch& batch) const override { return last_target_tokens_; }

 private:
  Convs2sRecipe recipe_;
  std::shared_ptr<FConvModel> net_;
  std::unique_ptr<data::TokenBatchedCorpus> corpus_;
  int64_t last_target_tokens_ = 0;
};

}  // namespace models::convs2s
