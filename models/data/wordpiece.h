// wordpiece.h: text -> token ids for the BERT-family data pipelines.
//
// Two tokenizers behind one interface (Tokenizer), because the BERT models read either kind of data:
//   WordPieceTokenizer  google-research/bert tokenization.py (FullTokenizer = BasicTokenizer + WordpieceTokenizer)
//                       reading a vocab.txt (one token per line; id = line number - 1), as the released
//                       checkpoints were trained with it.
//   ByteTokenizer       a byte-level vocabulary for raw byte files (enwik8) and for SQuAD without a vocab.txt:
//                         [PAD] = 0, [UNK] = 1, [CLS] = 2, [SEP] = 3, [MASK] = 4, byte b = 5 + b  (261 ids).
//                       [PAD] is 0 as in BERT's vocabularies (the word embedding's padding row is 0).
//
// BasicTokenizer, in BERT's order: drop NUL, U+FFFD and control characters, map whitespace to ' '; put spaces
// around CJK ideographs; split on whitespace; for uncased vocabularies lower-case and strip accents (NFD, drop
// combining marks); split off every punctuation character; then WordPiece splits each word greedily,
// longest match first, continuation pieces prefixed "##"; a word of more than 100 characters, or one that
// cannot be covered by pieces, becomes [UNK].
// Unicode without a Unicode library: the character classes (punctuation, control, combining marks), the
// lower-case mapping and the accent decompositions are tables generated from Python's unicodedata
// (unicode_classes.h). Checked against a Python BasicTokenizer on every code point below U+30000: the
// outputs agree except (uncased only) for the decomposable characters outside Latin, Greek, Cyrillic and
// Hangul (e.g. kana with dakuten, CJK compatibility ideographs, some Indic vowels), which keep their
// precomposed form, and unassigned code points, which are kept (Python drops them as category Cn).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace models::data {

// What the BERT data pipelines need of a tokenizer: ids for a text, and the special tokens' ids.
class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::vector<int64_t> encode(const std::string& text) const = 0;
  virtual int64_t vocab_size() const = 0;
  virtual std::string describe() const = 0;
  int64_t pad_id = 0, unk_id = 1, cls_id = 2, sep_id = 3, mask_id = 4;
};

class ByteTokenizer : public Tokenizer {
 public:
  static constexpr int64_t kFirstByte = 5;   // byte b has id kFirstByte + b
  static constexpr int64_t kVocabSize = 261;
  ByteTokenizer();  // the special ids above
  static int64_t id_of_byte(uint8_t b) { return kFirstByte + int64_t(b); }
  std::vector<int64_t> encode(const std::string& text) const override;
  int64_t vocab_size() const override { return kVocabSize; }
  std::string describe() const override { return "byte-level vocabulary (261 ids)"; }
};

// vocab.txt: one token per line, its id the line's index. A line that is empty or holds whitespace, a
// duplicate token, invalid UTF-8 or a missing special token ([PAD] [UNK] [CLS] [SEP] [MASK]) is an Error
// naming the file and the line.
class Vocab {
 public:
  static Vocab load(const std::string& path);
  // The tokens of `text` (a vocab file's content); `source` names it in errors.
  static Vocab parse(const std::string& text, const std::string& source);
  int64_t size() const { return int64_t(tokens_.size()); }
  int64_t find(const std::string& token) const;  // -1 when absent
  const std::string& token(int64_t id) const { return tokens_.at(size_t(id)); }
  const std::string& source() const { return source_; }
  // True when no token outside [...] has an upper-case letter: an uncased vocabulary (lower-case the text).
  bool looks_uncased() const;

 private:
  std::vector<std::string> tokens_;
  std::unordered_map<std::string, int64_t> ids_;
  std::string source_;
};

class WordPieceTokenizer : public Tokenizer {
 public:
  static constexpr int kMaxCharsPerWord = 100;
  // lower_case: BERT's do_lower_case (uncased models).
  WordPieceTokenizer(Vocab vocab, bool lower_case);
  // vocab.txt, lower-casing when the vocabulary looks uncased (Vocab::looks_uncased).
  static std::unique_ptr<WordPieceTokenizer> from_file(const std::string& path);
  // Word pieces, e.g. "unaffable" -> {"un", "##aff", "##able"}.
  std::vector<std::string> tokenize(const std::string& text) const;
  std::vector<int64_t> encode(const std::string& text) const override;
  int64_t vocab_size() const override { return vocab_.size(); }
  std::string describe() const override;
  const Vocab& vocab() const { return vocab_; }
  bool lower_case() const { return lower_case_; }

 private:
  Vocab vocab_;
  bool lower_case_;
};

// The two stages, for tests and for SQuAD (which splits words itself):
std::vector<std::string> basic_tokenize(const std::string& text, bool lower_case);
std::vector<std::string> wordpiece_split(const std::string& word, const Vocab& vocab);

// UTF-8 <-> code points. Decoding skips invalid bytes (Python's decode("utf-8", "ignore"), as BERT's
// convert_to_unicode); `valid` (if given) says whether there were none.
std::u32string utf8_decode(const std::string& s, bool* valid = nullptr);
std::string utf8_encode(const std::u32string& s);

}  // namespace models::data
