// glue.h: the GLUE tasks MT-DNN trains on, as data: the task table, readers for GLUE's own train.tsv
// files, BERT's sentence-pair encoding, and seeded synthetic examples.
//
// Kept apart from the model (models/mtdnn/) so that the file formats, the encoding and the synthetic
// rules can be read and tested on their own; the model only asks for "B encoded examples of task t".
// Tokens come from wordpiece.h: WordPiece when the GLUE directory holds a vocab.txt, else the byte-level
// vocabulary ([PAD] 0, [UNK] 1, [CLS] 2, [SEP] 3, [MASK] 4, byte b -> 5 + b).
//
// Pair encoding (BERT): [CLS] a [SEP] b [SEP], token type 0 up to and including the first [SEP], 1 after;
// the longer of a and b loses its last token until the pair fits (BERT's _truncate_seq_pair); then
// [PAD] (type 0) to the fixed length, so every batch has the shape [B, seq] whatever the sentences.
// Single sentences: [CLS] a [SEP] [PAD]...
#pragma once
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "models/data/wordpiece.h"

namespace models::data {

// How a task is scored, which decides its head in MT-DNN.
enum class GlueKind { pair_classification, single_classification, regression };

struct GlueTask {
  std::string name;                 // MT-DNN's name: "mnli"
  std::string folder;               // GLUE's folder: "MNLI" (read as DIR/MNLI/train.tsv)
  GlueKind kind;
  std::vector<std::string> labels;  // label names in class-id order; empty for regression
  int64_t train_size;               // rows in GLUE's train.tsv: proportional task sampling, nominal epochs
  int64_t num_outputs() const { return kind == GlueKind::regression ? 1 : int64_t(labels.size()); }
};

// The eight tasks of MT-DNN's scripts/run_mt_dnn.sh, in its order: mnli, rte, qqp, qnli, mrpc, sst, cola, stsb.
const std::vector<GlueTask>& glue_tasks();
// The task of that name, or an Error listing the valid names.
const GlueTask& glue_task(const std::string& name);
std::string glue_task_names();  // "mnli, rte, ..."

struct GlueExample {
  std::string a, b;   // b is empty for single-sentence tasks
  int64_t label = 0;  // class id (index into GlueTask::labels)
  double score = 0;   // the regression target (stsb: 0 to 5)
};

// Reads a GLUE train.tsv (or dev.tsv) of `task` with GLUE's column layout. Tasks with a header row find
// their columns by name in it (MNLI sentence1/sentence2/gold_label, RTE sentence1/sentence2/label, QNLI
// question/sentence/label, QQP question1/question2/is_duplicate, MRPC #1 String/#2 String/Quality, SST-2
// sentence/label, STS-B sentence1/sentence2/score); CoLA has no header (source, label, original label,
// sentence). Every row must have the header's number of columns (CoLA: 4). Blank lines are skipped.
// Anything else is an Error "PATH:LINE: what is wrong", e.g. "expected 10 columns, found 3" or an unknown label.
std::vector<GlueExample> read_glue_tsv(const GlueTask& task, const std::string& path);

// ---------------------------------------------------------------------------------------------------
// Tokenization and encoding.

// WordPiece from DIR/vocab.txt when that file exists (BERT-Large uncased's vocabulary, for real GLUE
// text), else the byte-level vocabulary (synthetic data, or a directory without a vocabulary).
std::unique_ptr<Tokenizer> glue_tokenizer(const std::string& dir);

// A batch of encoded examples as host arrays, each [B * seq] in row-major order.
struct EncodedBatch {
  int64_t batch = 0, seq = 0;
  std::vector<int64_t> ids, token_types;
  std::vector<int64_t> padding;         // 1 where the position is [PAD]
  std::vector<int64_t> not_premise;     // 1 where the position is not a sentence-A token ([CLS] a [SEP])
  std::vector<int64_t> not_hypothesis;  // 1 where the position is not a sentence-B token (b [SEP])
  std::vector<int64_t> labels;          // [B]
  std::vector<double> scores;           // [B]
};

// Encodes already-tokenized sentences (pair false: a alone) into row `row` of `out`, with the
// tokenizer's special ids.
void encode_tokens(std::vector<int64_t> a, std::vector<int64_t> b, bool pair, const Tokenizer& tokenizer,
                   int64_t row, EncodedBatch& out);
// Tokenizes and encodes examples into a [examples.size(), seq] batch.
EncodedBatch encode_examples(const std::vector<GlueExample>& examples, bool pair, int64_t seq,
                             const Tokenizer& tokenizer);

// ---------------------------------------------------------------------------------------------------
// Synthetic examples with a rule a small model can learn, written in letters so that they pass through
// the same tokenizer and encoder as real text. Words are letters a-h; sentence lengths are uniform in
// [1, max_len]. Labels are uniform over the task's classes.
//   mnli:      entailment: b = a; contradiction: b = a with every letter moved to i-p; neutral: b random
//   rte, qnli: entailment: b = a; not_entailment: b random           qqp, mrpc: duplicate: b = a, else random
//   sst:       positive iff more of a's letters are in a-d than in e-h
//   cola:      acceptable iff a's letters are in alphabetical order
//   stsb:      b = a with k of its n letters replaced; score = 5 (n - k) / n
GlueExample synthetic_glue_example(const GlueTask& task, int64_t max_len, std::mt19937_64& rng);

}  // namespace models::data
