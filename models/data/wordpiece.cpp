// wordpiece.cpp: BERT's BasicTokenizer and WordpieceTokenizer (google-research/bert tokenization.py), the
// byte-level tokenizer, the vocabulary reader, and the small Unicode tables they need.
#include "models/data/wordpiece.h"

#include "engine/format.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "engine/error.h"
#include "engine/io.h"
#include "models/data/unicode_classes.h"

namespace models::data {

// ---------------------------------------------------------------------------------------------------
// UTF-8

std::u32string utf8_decode(const std::string& s, bool* valid) {
  std::u32string out;
  out.reserve(s.size());
  bool ok = true;
  size_t i = 0, n = s.size();
  while (i < n) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    int extra = c < 0x80 ? 0 : (c >> 5) == 0x6 ? 1 : (c >> 4) == 0xE ? 2 : (c >> 3) == 0x1E ? 3 : -1;
    if (extra < 0 || i + size_t(extra) >= n) {  // not a lead byte, or a truncated sequence
      ok = false;
      i++;
      continue;
    }
    char32_t cp = extra == 0 ? c : extra == 1 ? (c & 0x1F) : extra == 2 ? (c & 0x0F) : (c & 0x07);
    bool good = true;
    for (int k = 1; k <= extra; k++) {
      unsigned char d = static_cast<unsigned char>(s[i + size_t(k)]);
      if ((d >> 6) != 0x2) { good = false; break; }
      cp = (cp << 6) | (d & 0x3F);
    }
    // overlong forms, surrogates and values past U+10FFFF are invalid too
    static const char32_t kMin[4] = {0, 0x80, 0x800, 0x10000};
    if (!good || cp < kMin[extra] || (cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF) {
      ok = false;
      i++;
      continue;
    }
    out.push_back(cp);
    i += size_t(extra) + 1;
  }
  if (valid) *valid = ok;
  return out;
}

std::string utf8_encode(const std::u32string& s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t cp : s) engine::append_utf8(out, uint32_t(cp));
  return out;
}

// ---------------------------------------------------------------------------------------------------
// Character classes (tokenization.py's _is_whitespace, _is_control, _is_punctuation, _is_chinese_char)

namespace {

bool in(char32_t c, char32_t lo, char32_t hi) { return c >= lo && c <= hi; }

// ' ', \t, \n, \r and the space separators (Zs); also the line and paragraph separators U+2028/U+2029,
// which BERT keeps but then splits on (Python's str.split() treats them as whitespace).
bool is_whitespace(char32_t c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == 0xA0 || c == 0x1680 || in(c, 0x2000, 0x200A) ||
         c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

// Categories C* (Cc, Cf, Co), except \t \n \r which count as whitespace.
bool is_control(char32_t c) {
  if (c == '\t' || c == '\n' || c == '\r') return false;
  return unicode::in_ranges(unicode::kControl, c);
}

// All non-alphanumeric ASCII is punctuation for BERT ('$', '^', '`' too), plus the categories P*.
bool is_punctuation(char32_t c) {
  if (in(c, 33, 47) || in(c, 58, 64) || in(c, 91, 96) || in(c, 123, 126)) return true;
  return unicode::in_ranges(unicode::kPunctuation, c);
}

// The CJK Unified Ideographs blocks (not Hangul, Hiragana or Katakana, which are written with spaces).
bool is_cjk(char32_t c) {
  return in(c, 0x4E00, 0x9FFF) || in(c, 0x3400, 0x4DBF) || in(c, 0x20000, 0x2A6DF) || in(c, 0x2A700, 0x2B73F) ||
         in(c, 0x2B740, 0x2B81F) || in(c, 0x2B820, 0x2CEAF) || in(c, 0xF900, 0xFAFF) || in(c, 0x2F800, 0x2FA1F);
}

// Python's str.lower(): the generated one-to-one table, and U+0130 (I with dot) -> "i" + U+0307.
void append_lower(char32_t c, std::u32string& out) {
  if (c == 0x130) {
    out += U"i\u0307";
  } else {
    out += unicode::to_lower(c);
  }
}

// _run_strip_accents: NFD, then drop the nonspacing marks. Precomposed Latin, Greek and Cyrillic letters
// become their base letter (table); a Hangul syllable decomposes into its 2 or 3 jamo (Unicode's arithmetic
// decomposition: none of them is a mark, so all stay).
std::u32string strip_accents(const std::u32string& word) {
  std::u32string out;
  for (char32_t c : word) {
    if (unicode::in_ranges(unicode::kNonspacingMark, c)) continue;
    if (in(c, 0xAC00, 0xD7A3)) {
      char32_t s = c - 0xAC00;
      out += char32_t(0x1100 + s / 588);         // leading consonant
      out += char32_t(0x1161 + (s % 588) / 28);  // vowel
      if (s % 28) out += char32_t(0x11A7 + s % 28);  // trailing consonant
      continue;
    }
    out += unicode::accent_base(c);
  }
  return out;
}

// Splits on whitespace (the text is already cleaned: ' ' is the only whitespace left).
std::vector<std::u32string> split_spaces(const std::u32string& text) {
  std::vector<std::u32string> words;
  std::u32string cur;
  for (char32_t c : text) {
    if (c == ' ') {
      if (!cur.empty()) words.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  if (!cur.empty()) words.push_back(cur);
  return words;
}

bool is_ascii_space(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f'; }

}  // namespace

std::vector<std::string> basic_tokenize(const std::string& text, bool lower_case) {
  // _clean_text and _tokenize_chinese_chars in one pass
  std::u32string clean;
  for (char32_t c : utf8_decode(text)) {
    if (c == 0 || c == 0xFFFD || is_control(c)) continue;
    if (is_whitespace(c)) {
      clean += U' ';
    } else if (is_cjk(c)) {
      clean += U' ';
      clean += c;
      clean += U' ';
    } else {
      clean += c;
    }
  }
  std::vector<std::string> out;
  for (std::u32string word : split_spaces(clean)) {
    if (lower_case) {
      std::u32string lower;
      for (char32_t c : word) append_lower(c, lower);
      word = strip_accents(lower);
    }
    // _run_split_on_punc: every punctuation character is a token of its own
    std::u32string cur;
    for (char32_t c : word) {
      if (is_punctuation(c)) {
        if (!cur.empty()) out.push_back(utf8_encode(cur));
        out.push_back(utf8_encode(std::u32string(1, c)));
        cur.clear();
      } else {
        cur += c;
      }
    }
    if (!cur.empty()) out.push_back(utf8_encode(cur));
  }
  return out;
}

std::vector<std::string> wordpiece_split(const std::string& word, const Vocab& vocab) {
  std::u32string chars = utf8_decode(word);
  if (chars.size() > size_t(WordPieceTokenizer::kMaxCharsPerWord)) return {"[UNK]"};
  std::vector<std::string> pieces;
  size_t start = 0;
  while (start < chars.size()) {
    // the longest piece chars[start, end) in the vocabulary ("##" marks a continuation)
    std::string found;
    size_t end = chars.size();
    for (; end > start; end--) {
      std::string piece = (start > 0 ? "##" : "") + utf8_encode(chars.substr(start, end - start));
      if (vocab.find(piece) >= 0) {
        found = piece;
        break;
      }
    }
    if (found.empty()) return {"[UNK]"};
    pieces.push_back(found);
    start = end;
  }
  return pieces;
}

// ---------------------------------------------------------------------------------------------------
// Vocabulary

Vocab Vocab::load(const std::string& path) {
  return parse(engine::read_file(path, "vocabulary", 256 * engine::kMiB), path);
}

Vocab Vocab::parse(const std::string& text, const std::string& source) {
  Vocab v;
  v.source_ = source;
  size_t pos = 0;
  int64_t line = 0;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    std::string token = text.substr(pos, nl == std::string::npos ? std::string::npos : nl - pos);
    pos = nl == std::string::npos ? text.size() : nl + 1;
    line++;
    if (!token.empty() && token.back() == '\r') token.pop_back();
    ENGINE_CHECK(!token.empty(), "vocabulary '", source, "' line ", line, ": empty line (expected one token)");
    for (char c : token)
      ENGINE_CHECK(!is_ascii_space(c), "vocabulary '", source, "' line ", line, ": token '", token,
                   "' contains whitespace (expected one token per line)");
    bool valid = true;
    utf8_decode(token, &valid);
    ENGINE_CHECK(valid, "vocabulary '", source, "' line ", line, ": invalid UTF-8");
    auto inserted = v.ids_.emplace(token, int64_t(v.tokens_.size()));
    ENGINE_CHECK(inserted.second, "vocabulary '", source, "' line ", line, ": token '", token,
                 "' already appears on line ", inserted.first->second + 1);
    v.tokens_.push_back(token);
  }
  for (const char* special : {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"})
    ENGINE_CHECK(v.find(special) >= 0, "vocabulary '", source, "': no ", special, " token (", line,
                 " lines read); BERT's special tokens [PAD] [UNK] [CLS] [SEP] [MASK] must all be present");
  return v;
}

int64_t Vocab::find(const std::string& token) const {
  auto it = ids_.find(token);
  return it == ids_.end() ? -1 : it->second;
}

bool Vocab::looks_uncased() const {
  for (const auto& t : tokens_) {
    if (!t.empty() && t.front() == '[') continue;
    for (char c : t)
      if (c >= 'A' && c <= 'Z') return false;
  }
  return true;
}

// ---------------------------------------------------------------------------------------------------
// Tokenizers

ByteTokenizer::ByteTokenizer() { pad_id = 0, unk_id = 1, cls_id = 2, sep_id = 3, mask_id = 4; }

std::vector<int64_t> ByteTokenizer::encode(const std::string& text) const {
  std::vector<int64_t> ids;
  ids.reserve(text.size());
  for (unsigned char c : text) ids.push_back(id_of_byte(c));
  return ids;
}

WordPieceTokenizer::WordPieceTokenizer(Vocab vocab, bool lower_case)
    : vocab_(std::move(vocab)), lower_case_(lower_case) {
  pad_id = vocab_.find("[PAD]");
  unk_id = vocab_.find("[UNK]");
  cls_id = vocab_.find("[CLS]");
  sep_id = vocab_.find("[SEP]");
  mask_id = vocab_.find("[MASK]");
}

std::unique_ptr<WordPieceTokenizer> WordPieceTokenizer::from_file(const std::string& path) {
  Vocab v = Vocab::load(path);
  bool lower = v.looks_uncased();
  return std::make_unique<WordPieceTokenizer>(std::move(v), lower);
}

std::vector<std::string> WordPieceTokenizer::tokenize(const std::string& text) const {
  std::vector<std::string> pieces;
  for (const auto& word : basic_tokenize(text, lower_case_))
    for (auto& p : wordpiece_split(word, vocab_)) pieces.push_back(std::move(p));
  return pieces;
}

std::vector<int64_t> WordPieceTokenizer::encode(const std::string& text) const {
  std::vector<int64_t> ids;
  for (const auto& p : tokenize(text)) ids.push_back(vocab_.find(p));  // pieces are in the vocabulary
  return ids;
}

std::string WordPieceTokenizer::describe() const {
  return engine::str("WordPiece vocabulary '", vocab_.source(), "' (", vocab_.size(), " tokens, ",
                     lower_case_ ? "uncased" : "cased", ")");
}

}  // namespace models::data
