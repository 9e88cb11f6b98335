// squad.h: SQuAD v1.1 for span prediction, as google-research/bert run_squad.py prepares it.
//
//   read:     data[].paragraphs[].{context, qas[].{id, question, answers[].{text, answer_start}}}. The
//             context is split into words on whitespace (run_squad's is_whitespace: ' ' \t \r \n U+202F);
//             answer_start counts characters (code points), not bytes. The first answer is the target
//             (the training set has one; dev questions have several). As run_squad does, a question whose
//             answer text is not found where answer_start points is skipped (counted), and so is one
//             without answers (SQuAD 2.0's unanswerable).
//   features: [CLS] question [SEP] document window [SEP], token types 0 then 1, padded to max_seq_length;
//             the question is cut to max_query_length tokens; a long document gives several windows
//             doc_stride tokens apart. Word pieces are mapped back to words, the answer span is narrowed
//             to the pieces that spell the tokenized answer (_improve_answer_span), and a window that does
//             not contain the whole answer gets start = end = 0 (the [CLS] token), as in run_squad.
// A malformed file (bad JSON, a missing or mistyped key, an answer outside its context) is an Error naming
// the file and the JSON path of the offending entry (syntax errors: the byte offset and line).
//
// Tokens: squad_tokenizer() uses the WordPiece vocabulary "vocab.txt" found next to the data file, else the
// byte-level vocabulary (ByteTokenizer), so any SQuAD-format file trains without a vocabulary.
#pragma once
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "models/data/wordpiece.h"

namespace models::data {

struct SquadOptions {
  int64_t max_seq_length = 384, doc_stride = 128, max_query_length = 64;
  // run_squad's values at seq 384; shorter sequences scale them (query <= seq / 4, stride <= seq / 3).
  static SquadOptions for_seq(int64_t seq);
};

struct SquadExample {
  std::string id, question, answer;
  std::vector<std::string> doc_words;  // the context split on whitespace
  int64_t start_word = 0, end_word = 0;  // the answer's first and last word (inclusive)
};

// One window of one example, unpadded: [CLS] question [SEP] window [SEP].
struct SquadFeature {
  int64_t example = 0;
  std::vector<int64_t> ids;
  int64_t first_segment = 0;  // tokens of type 0: [CLS] question [SEP]
  int64_t start = 0, end = 0; // answer span in the sequence, or 0, 0 when the window misses it
};

// Examples of a SQuAD JSON text; `source` names it in errors. `skipped` (if given) counts questions left out.
std::vector<SquadExample> parse_squad(const std::string& text, const std::string& source, int64_t* skipped = nullptr);
std::vector<SquadExample> read_squad(const std::string& path, int64_t* skipped = nullptr);

std::vector<SquadFeature> squad_features(const std::vector<SquadExample>& examples, const Tokenizer& tokenizer,
                                         const SquadOptions& options);

// The tokenizer for a SQuAD file: WordPiece from "vocab.txt" in the file's directory, else bytes.
std::unique_ptr<Tokenizer> squad_tokenizer(const std::string& data_path);

// A batch of span examples on the host, flattened row-major.
struct SpanBatch {
  int64_t batch = 0, seq = 0;
  std::vector<int64_t> ids, token_types, padding;  // [B * T]; padding 1 where the key is padding
  std::vector<int64_t> start_positions, end_positions;  // [B], clamped to [0, seq] (seq: ignored)
};

// Appends one feature, padded to `seq` tokens with pad_id (token type 0 and padding 1 there).
void append_feature(const SquadFeature& feature, int64_t seq, int64_t pad_id, SpanBatch& batch);

// Hugging Face BertForQuestionAnswering clamps positions to [0, seq]; seq itself is the ignored index.
int64_t clamp_position(int64_t position, int64_t seq);

// Synthetic span examples with learnable structure: [CLS] q [SEP] context [SEP] [PAD]... (the context fills
// half to all of the rest), where the answer (2 to 8 words) begins with word 5 and ends with word 6; other
// words are drawn from [7, vocab). A span head learns to find them within tens of steps. (Markers next to
// the answer instead of on it need attention to a neighbour, which a small BERT takes hundreds of steps to
// learn.) Specials as ByteTokenizer: [PAD] 0, [CLS] 2, [SEP] 3.
SpanBatch synthetic_span_batch(int64_t batch, int64_t seq, int64_t vocab, std::mt19937_64& rng);
// The shortest sequence a synthetic span batch is made in (a question, an answer and its markers, specials).
constexpr int64_t kMinSyntheticSpanSeq = 16;

}  // namespace models::data
