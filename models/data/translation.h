// translation.h: sentence pairs for the translation models (transformer_big, unsupmt), their batching by
// tokens, and the host-side batch the models turn into tensors.
//
// Vocabulary (fairseq's dictionary order, plus a mask id for XLM-style blanking):
//   <s> 0, <pad> 1, </s> 2 (EOS), <unk> 3, <mask> 4, words from 5.
// A sentence is stored without EOS. In a batch (fairseq's language_pair_dataset, right-padded):
//   source       w1 .. wn </s>                S = n + 1 (longest in the batch), <pad> after
//   prev_output  </s> v1 .. vm                T = m + 1, the decoder input (EOS starts a sentence)
//   target       v1 .. vm </s>                the labels; <pad> (ignored by the loss) after
//
// Sources:
//   synthetic    seeded pairs whose target is the source reversed (a task a small model learns quickly and a
//                greedy decoder can be checked on), lengths drawn from a fixed log-normal distribution
//                (median and spread per model; WMT en-de with 32k BPE has a median near 24 tokens), clamped
//                to [min_len, max_len]. Drawn with the engine's own arithmetic on std::mt19937_64 (Box-Muller on
//                53-bit uniforms), so every standard library gives the same sentences.
//   --data P     a parallel corpus of token ids: P.src and P.tgt, one sentence per line, ids separated by
//                spaces, line i of one the translation of line i of the other; P.vocab, one token per line,
//                line k naming id k - 1, its first five lines the specials above. A malformed line (a
//                non-integer, an id outside the vocabulary, an empty sentence) is an Error naming file and line.
//
// Batching by tokens (fairseq's --max-tokens with batch_by_size): sentences sorted by length, longest first,
// packed greedily so that sentences x longest length (max of source and target, EOS included) <= tokens.
// The first batch therefore holds the longest sentences: the worst case for memory that grows with length
// squared (attention scores). Memory that grows with padded tokens (the vocabulary projection's logits,
// [B x T, V]) peaks instead at the batch with the most padded tokens (count x longest), often a later one that
// packs closer to the budget. Batch order: steps 1 and 2 run the first batch (once without, once beside the
// optimizer state that step 1's update creates), step 3 the most padded batch, later steps a seeded shuffle;
// so a max-batch probe of steps 1-3 (Model::probe_schedule) sees both extremes with the optimizer state.
#pragma once
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

namespace models::data {

struct TranslationIds {
  static constexpr int64_t bos = 0, pad = 1, eos = 2, unk = 3, mask = 4, first_word = 5;
};

using Sentence = std::vector<int64_t>;  // word ids, no EOS

struct SentencePair {
  Sentence src, tgt;
};

// Lengths (in words, EOS not counted) ~ round(median * exp(spread * N(0, 1))), clamped to [min_len, max_len].
struct LengthDistribution {
  double median = 24, spread = 0.6;
  int64_t min_len = 1, max_len = 255;
  int64_t draw(std::mt19937_64& rng) const;
};

// `count` sentences of words in [first_word, first_word + words), lengths from `lengths`.
std::vector<Sentence> synthetic_sentences(int64_t count, int64_t words, const LengthDistribution& lengths,
                                          uint64_t seed);
// Pairs (s, reverse(s)) of synthetic sentences.
std::vector<SentencePair> synthetic_reversal_pairs(int64_t count, int64_t words, const LengthDistribution& lengths,
                                                   uint64_t seed);

// Reads a file of token ids, one sentence per line; every id must be < vocab_size. Errors name file and line.
std::vector<Sentence> read_token_file(const std::string& path, int64_t vocab_size);
// Reads a vocabulary file (one token per line) and returns its size; its first lines must be the specials.
int64_t read_vocabulary(const std::string& path);

struct ParallelCorpus {
  std::vector<SentencePair> pairs;
  int64_t vocab_size = 0;
  std::string describe;
};
// prefix.src, prefix.tgt and prefix.vocab (see above).
ParallelCorpus read_parallel_corpus(const std::string& prefix);

// Index lists of sentences, longest first, with count x longest length <= tokens; sentences longer than
// `tokens` are left out (fairseq's --skip-invalid-size-inputs). lengths include EOS.
std::vector<std::vector<int64_t>> batch_by_tokens(const std::vector<int64_t>& lengths, int64_t tokens);
// Index lists of `count` sentences of similar length (sorted longest first), the last one smaller.
std::vector<std::vector<int64_t>> batch_by_count(const std::vector<int64_t>& lengths, int64_t count);

// The batch with the most padded tokens: count x longest length (lengths include EOS); the first on ties.
int64_t most_padded_batch(const std::vector<std::vector<int64_t>>& batches, const std::vector<int64_t>& lengths);

// Which batch a step runs: steps 1 and 2 the first (longest) batch, step 3 `most_padded`, step k >= 4 entry
// (k - 3) mod n of a seeded shuffle of all n batches (the shuffle's entry 0 waits for the second cycle).
// With P parts per optimizer step (data parallel ranks x accumulated micro-batches: Model::parts), data step d is
// part c = (d - 1) mod P of optimizer step s = (d - 1) / P + 1: steps 1-3 give every part the longest and the most
// padded batches (so that every rank meets both, beside the optimizer state: what the max-batch probe relies on),
// and from step 4 part c walks its own stretch of the shuffle, entry (s - 3 + c ceil(n / P)) mod n: the parts of a
// step read distinct batches (when n >= P), and each part alone meets all n batches in n steps (the finder's epoch).
class BatchOrder {
 public:
  BatchOrder(int64_t num_batches, uint64_t seed, int64_t most_padded = 0);
  int64_t batch_for_step(int64_t step) const { return batch_for(step, 1); }
  int64_t batch_for(int64_t data_step, int64_t parts) const;
  // Steps 4 .. 3 + n: every batch once, in the shuffle's order (Model::epoch_steps).
  std::vector<int64_t> epoch_steps() const;

 private:
  std::vector<int64_t> shuffled_;
  int64_t most_padded_ = 0;
};

// The token-batched pipeline of transformer_big and convs2s: the pairs' lengths -> batch_by_tokens -> their
// BatchOrder (the longest batch at steps 1-2, the most padded at step 3). Pairs longer than `tokens` are left
// out and counted in `note`; no batch at all is an Error naming `model`.
struct TokenBatches {
  std::vector<std::vector<int64_t>> batches;
  std::unique_ptr<BatchOrder> order;
  std::string note;  // "" or " (N longer than --tokens T left out)"
};
TokenBatches batch_pairs_by_tokens(const std::vector<SentencePair>& pairs, int64_t tokens, uint64_t seed,
                                   const std::string& model);

// XLM's denoising noise (src/trainer.py add_noise), applied in this order to a sentence's words:
//   shuffle  each word moves by less than k: words sorted by i + uniform(0, k)      (k = 0: off)
//   drop     each word dropped with probability p_drop (one word always stays)
//   blank    each word replaced by <mask> with probability p_blank
struct NoiseOptions {
  double shuffle_k = 3, p_drop = 0.1, p_blank = 0.1;
};
Sentence add_noise(const Sentence& s, const NoiseOptions& o, std::mt19937_64& rng);

// A padded batch, host side (see the layout above). Row-major.
struct TranslationBatch {
  int64_t batch = 0, src_len = 0, tgt_len = 0;  // B, S, T
  std::vector<int64_t> src;                     // [B, S]
  std::vector<int64_t> src_padding;             // [B, S]: 1 where padding
  std::vector<int64_t> prev_output;             // [B, T]
  std::vector<int64_t> target;                  // [B, T]
  int64_t target_tokens = 0;                    // non-pad targets (EOS included): fairseq's ntokens
};
// min_src_len: pad the sources to at least this length (fixed shapes for generated sources).
TranslationBatch make_translation_batch(const std::vector<const Sentence*>& src,
                                        const std::vector<const Sentence*>& tgt, int64_t min_src_len = 0);
TranslationBatch make_translation_batch(const std::vector<SentencePair>& pairs, const std::vector<int64_t>& indices);

// "batch 17 of 230: 112 sentences, source 31 and target 32 tokens" (lengths with EOS): Model::describe_batch.
std::string describe_translation_batch(const TranslationBatch& b, int64_t index, int64_t count);

// The length a pair occupies in a batch: max(|src|, |tgt|) + 1 (EOS).
int64_t pair_length(const SentencePair& p);

// A token-batched model's parallel data (transformer_big's and convs2s's): synthetic reversal pairs (`pairs`
// sentences of `words` words, 0: every word of the vocabulary, lengths from `lengths`) or --data PREFIX (its
// vocabulary no larger than the model's), cut by batch_pairs_by_tokens. Errors name `model`.
struct CorpusOptions {
  std::string model, data;
  int64_t vocab = 0;  // the model's (the smaller of its source and target vocabularies)
  int64_t pairs = 0, words = 0;
  LengthDistribution lengths;
  int64_t tokens = 0;
  uint64_t seed = 1;
};
class TokenBatchedCorpus {
 public:
  explicit TokenBatchedCorpus(const CorpusOptions& o);
  const std::vector<SentencePair>& pairs() const { return pairs_; }
  int64_t num_batches() const { return int64_t(batches_.size()); }
  // The batch of data step `data_step` when an optimizer step has `parts` parts (BatchOrder::batch_for).
  TranslationBatch batch(int64_t data_step, int64_t parts) const;
  std::string describe_batch(int64_t data_step, int64_t parts) const;  // describe_translation_batch
  std::vector<int64_t> epoch_steps() const { return order_->epoch_steps(); }
  // "synthetic reversal pairs: ..." or the file's description, with batch_pairs_by_tokens' note.
  const std::string& description() const { return description_; }

 private:
  std::vector<SentencePair> pairs_;
  std::vector<std::vector<int64_t>> batches_;
  std::unique_ptr<BatchOrder> order_;
  std::string description_;
};

}  // namespace models::data
