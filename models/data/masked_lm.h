// masked_lm.h: BERT pretraining examples (google-research/bert create_pretraining_data.py, reduced to what
// changes the work a step does): sequence pairs
//     [CLS] A [SEP] B [SEP]        token types 0 for [CLS] A [SEP], 1 for B [SEP]
// of exactly `seq` tokens (no padding), a next-sentence label (0: B follows A in the text, 1: B is a random
// passage; the Hugging Face convention), and a fixed number M = round(0.15 * seq) of positions chosen for
// the masked-LM loss among the non-special tokens: of these, 80% become [MASK], 10% a random word, 10%
// stay (BERT's rule, drawn as it draws it). A fixed M per sequence keeps every shape independent of the
// data: the model gathers the M hidden states of each sequence instead of scoring all T.
//
// Passages come from a PassageSource:
//   ByteFileSource       random windows of a raw byte file (enwik8 is 100 MB of bytes), one token per byte
//                        (ByteTokenizer ids: byte b -> 5 + b); B is the window right after A, or a random one.
//   ProgressionSource    synthetic "text": a passage is an arithmetic progression over R word ids,
//                        word_i = (o + i k) mod R, i counting from the first token of A, with the offset o
//                        drawn from [0, offsets) and the step k from [1, max_step]. A masked word follows from
//                        its neighbours; with few offsets and steps (the tests' tiny model) also, nearly, from
//                        its position, which a small model learns within tens of steps. B continues A's
//                        progression when it is the next passage, else it follows another (o', k') from the
//                        same index.
// All randomness comes from the std::mt19937_64 the caller passes (seeded by seed and step), drawn with
// plain modulo arithmetic so the examples are the same with every standard library.
#pragma once
#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace models::data {

// Ids the masking needs: the specials, and the word ids [first_word, end_word) random replacements come from.
struct MaskingIds {
  int64_t pad = 0, cls = 2, sep = 3, mask = 4;
  int64_t first_word = 5, end_word = 261;
};

class PassageSource {
 public:
  virtual ~PassageSource() = default;
  // Fills a (len_a tokens) and b (len_b tokens): b continues a when is_next, else it is drawn independently.
  virtual void sample_pair(std::mt19937_64& rng, int64_t len_a, int64_t len_b, bool is_next,
                           std::vector<int64_t>& a, std::vector<int64_t>& b) const = 0;
  virtual std::string describe() const = 0;
};

class ByteFileSource : public PassageSource {
 public:
  // Reads the whole file; an Error names it when it cannot be read or holds fewer than min_bytes bytes.
  ByteFileSource(const std::string& path, int64_t min_bytes);
  void sample_pair(std::mt19937_64& rng, int64_t len_a, int64_t len_b, bool is_next, std::vector<int64_t>& a,
                   std::vector<int64_t>& b) const override;
  std::string describe() const override;

 private:
  std::string path_, bytes_;
};

class ProgressionSource : public PassageSource {
 public:
  ProgressionSource(int64_t first_word, int64_t num_words, int64_t offsets = 2, int64_t max_step = 4);
  void sample_pair(std::mt19937_64& rng, int64_t len_a, int64_t len_b, bool is_next, std::vector<int64_t>& a,
                   std::vector<int64_t>& b) const override;
  std::string describe() const override;

 private:
  int64_t first_word_, num_words_, offsets_, max_step_;
};

// One batch on the host, flattened row-major.
struct MaskedLmBatch {
  int64_t batch = 0, seq = 0, masked_per_seq = 0;
  std::vector<int64_t> ids, token_types;      // [B * T] (ids with the masking applied)
  std::vector<int64_t> masked_positions;      // [B * M] flat positions b * T + t, increasing within a row
  std::vector<int64_t> masked_labels;         // [B * M] the original tokens at those positions
  std::vector<int64_t> next_sentence_labels;  // [B] 0: B follows A, 1: B is random
};

// round(0.15 * seq): the masked positions per sequence.
int64_t masked_count(int64_t seq);
// The shortest sequence of a pair: [CLS] A [SEP] B [SEP] with one token each.
constexpr int64_t kMinMaskedLmSeq = 5;

// Uniform integer in [0, n) and uniform double in [0, 1) from the generator (portable, unlike <random>'s
// distributions).
int64_t draw_index(std::mt19937_64& rng, int64_t n);
double draw_uniform(std::mt19937_64& rng);

// BERT's create_masked_lm_predictions on one row: shuffles the candidate positions, takes the first
// `count` (sorted), and replaces each token by [MASK] (80%), itself (10%) or a random word (10%). Appends
// the chosen positions (offset by `row_offset`) and their original tokens.
void mask_row(int64_t* row, std::vector<int64_t> candidates, int64_t count, const MaskingIds& ids,
              std::mt19937_64& rng, int64_t row_offset, std::vector<int64_t>& positions,
              std::vector<int64_t>& labels);

// `batch` sequence pairs of `seq` tokens (seq >= 5): A's length uniform in [1, seq - 4], NSP 50/50.
MaskedLmBatch make_masked_lm_batch(const PassageSource& source, const MaskingIds& ids, int64_t batch, int64_t seq,
                                   std::mt19937_64& rng);

}  // namespace models::data
