// squad.cpp: reading SQuAD JSON and turning examples into fixed-length span features (run_squad.py's
// read_squad_examples, convert_examples_to_features and _improve_answer_span), plus synthetic span data.
#include "models/data/squad.h"

#include <algorithm>
#include <cmath>
#include <fstream>

#include "engine/error.h"
#include "engine/io.h"
#include "engine/json.h"
#include "models/data/masked_lm.h"

namespace models::data {

using engine::json::Value;

SquadOptions SquadOptions::for_seq(int64_t seq) {
  SquadOptions o;
  o.max_seq_length = seq;
  o.max_query_length = std::min<int64_t>(64, seq / 4);
  o.doc_stride = std::min<int64_t>(128, seq / 3);
  return o;
}

// ---------------------------------------------------------------------------------------------------
// Reading

namespace {

// v[key], which must exist and have `type`; errors name the file and the JSON path.
const Value& member(const Value& v, const char* key, Value::Type type, const std::string& source,
                    const std::string& path) {
  return engine::json::member(v, key, type, engine::str("SQuAD file '", source, "': ", path));
}

// run_squad's is_whitespace (the context's word separator).
bool squad_whitespace(char32_t c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == 0x202F; }

// Python's str.isspace(), for tokenization.whitespace_tokenize (str.split()).
bool python_space(char32_t c) {
  return (c >= 0x9 && c <= 0xD) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

// " ".join(text.split())
std::string normalize_spaces(const std::string& text) {
  std::u32string out;
  bool pending = false;
  for (char32_t c : utf8_decode(text)) {
    if (python_space(c)) {
      pending = !out.empty();
    } else {
      if (pending) out += U' ';
      pending = false;
      out += c;
    }
  }
  return utf8_encode(out);
}

}  // namespace

std::vector<SquadExample> parse_squad(const std::string& text, const std::string& source, int64_t* skipped) {
  Value root = engine::json::parse_json(text, "SQuAD file '" + source + "'");
  ENGINE_CHECK(root.is_object(), "SQuAD file '", source, "': the top level is ", engine::json::type_name(root.type),
               ", expected an object with a 'data' array");
  const Value& data = member(root, "data", Value::Type::array, source, "(top level)");
  std::vector<SquadExample> examples;
  int64_t left_out = 0;
  for (size_t a = 0; a < data.items.size(); a++) {
    std::string article_path = engine::str("data[", a, "]");
    const Value& paragraphs = member(data.items[a], "paragraphs", Value::Type::array, source, article_path);
    for (size_t p = 0; p < paragraphs.items.size(); p++) {
      std::string par_path = engine::str(article_path, ".paragraphs[", p, "]");
      const Value& par = paragraphs.items[p];
      std::u32string context = utf8_decode(member(par, "context", Value::Type::string, source, par_path).text);
      // words, and for each character the word it belongs to (run_squad's char_to_word_offset)
      std::vector<std::string> words;
      std::vector<int64_t> word_of_char;
      std::u32string word;
      bool after_space = true;
      for (char32_t c : context) {
        if (squad_whitespace(c)) {
          after_space = true;
        } else {
          if (after_space && !word.empty()) words.push_back(utf8_encode(word)), word.clear();
          word += c;
          after_space = false;
        }
        word_of_char.push_back(int64_t(words.size()) - (word.empty() ? 1 : 0));
      }
      if (!word.empty()) words.push_back(utf8_encode(word));
      const Value& qas = member(par, "qas", Value::Type::array, source, par_path);
      for (size_t q = 0; q < qas.items.size(); q++) {
        const Value& qa = qas.items[q];
        std::string qa_path = engine::str(par_path, ".qas[", q, "]");
        SquadExample ex;
        ex.id = member(qa, "id", Value::Type::string, source, qa_path).text;
        ex.question = member(qa, "question", Value::Type::string, source, qa_path).text;
        const Value& answers = member(qa, "answers", Value::Type::array, source, qa_path);
        if (answers.items.empty()) {  // unanswerable (SQuAD 2.0): nothing to train a span on
          left_out++;
          continue;
        }
        std::string ans_path = qa_path + ".answers[0]";
        ex.answer = member(answers.items[0], "text", Value::Type::string, source, ans_path).text;
        const Value& start = member(answers.items[0], "answer_start", Value::Type::number, source, ans_path);
        const int64_t length = int64_t(utf8_decode(ex.answer).size());
        // A character offset inside the context (checked before any sum: a huge answer_start must not wrap).
        ENGINE_CHECK(std::isfinite(start.number) && start.number == std::floor(start.number) && start.number >= 0,
                     "SQuAD file '", source, "': ", ans_path, ".answer_start is ", start.text,
                     ", expected a character offset (an integer >= 0)");
        ENGINE_CHECK(start.number < double(context.size()), "SQuAD file '", source, "': ", ans_path, ": answer_start ",
                     start.text, " is past the end of its ", context.size(), "-character context (question id '", ex.id,
                     "')");
        const int64_t offset = int64_t(start.number);
        ENGINE_CHECK(length > 0, "SQuAD file '", source, "': ", ans_path, ".text is empty (question id '", ex.id, "')");
        ENGINE_CHECK(length <= int64_t(context.size()) - offset, "SQuAD file '", source, "': ", ans_path,
                     ": the answer (characters ", offset, " to ", offset + length, ") runs past the end of its ",
                     context.size(), "-character context (question id '", ex.id, "')");
        ex.start_word = word_of_char[size_t(offset)];
        ex.end_word = word_of_char[size_t(offset + length - 1)];
        // run_squad skips an answer whose text is not where answer_start points (a few in the training set)
        std::string actual;
        for (int64_t w = std::max<int64_t>(ex.start_word, 0); w <= ex.end_word; w++)
          actual += (actual.empty() ? "" : " ") + words[size_t(w)];
        if (ex.start_word < 0 || actual.find(normalize_spaces(ex.answer)) == std::string::npos) {
          left_out++;
          continue;
        }
        ex.doc_words = words;
        examples.push_back(std::move(ex));
      }
    }
  }
  if (skipped) *skipped = left_out;
  return examples;
}

std::vector<SquadExample> read_squad(const std::string& path, int64_t* skipped) {
  return parse_squad(engine::read_file(path, "SQuAD file", 2 * engine::kGiB), path, skipped);
}

std::unique_ptr<Tokenizer> squad_tokenizer(const std::string& data_path) {
  size_t slash = data_path.find_last_of('/');
  std::string vocab = (slash == std::string::npos ? std::string(".") : data_path.substr(0, slash)) + "/vocab.txt";
  if (std::ifstream(vocab).good()) return WordPieceTokenizer::from_file(vocab);
  return std::make_unique<ByteTokenizer>();
}

// ---------------------------------------------------------------------------------------------------
// Features

std::vector<SquadFeature> squad_features(const std::vector<SquadExample>& examples, const Tokenizer& tokenizer,
                                         const SquadOptions& o) {
  std::vector<SquadFeature> features;
  for (size_t e = 0; e < examples.size(); e++) {
    const SquadExample& ex = examples[e];
    std::vector<int64_t> query = tokenizer.encode(ex.question);
    if (int64_t(query.size()) > o.max_query_length) query.resize(size_t(o.max_query_length));
    // the document's word pieces, and where each word's pieces begin
    std::vector<int64_t> doc, first_piece_of_word;
    for (const auto& w : ex.doc_words) {
      first_piece_of_word.push_back(int64_t(doc.size()));
      for (int64_t id : tokenizer.encode(w)) doc.push_back(id);
    }
    int64_t n_words = int64_t(ex.doc_words.size());
    int64_t tok_start = first_piece_of_word[size_t(ex.start_word)];
    int64_t tok_end =
        ex.end_word < n_words - 1 ? first_piece_of_word[size_t(ex.end_word + 1)] - 1 : int64_t(doc.size()) - 1;
    // _improve_answer_span: the smallest piece span inside [tok_start, tok_end] that spells the answer
    std::vector<int64_t> answer = tokenizer.encode(ex.answer);
    bool improved = false;
    for (int64_t s = tok_start; s <= tok_end && !improved; s++)
      for (int64_t t = tok_end; t >= s && !improved; t--)
        if (t - s + 1 == int64_t(answer.size()) && std::equal(answer.begin(), answer.end(), doc.begin() + s))
          tok_start = s, tok_end = t, improved = true;
    int64_t max_doc = o.max_seq_length - int64_t(query.size()) - 3;
    ENGINE_CHECK(max_doc > 0, "SQuAD: a ", query.size(), "-token question leaves no room for the document in ",
                 o.max_seq_length, " tokens");
    for (int64_t begin = 0; begin < int64_t(doc.size());) {  // windows doc_stride apart
      int64_t length = std::min(int64_t(doc.size()) - begin, max_doc);
      SquadFeature f;
      f.example = int64_t(e);
      f.ids.push_back(tokenizer.cls_id);
      f.ids.insert(f.ids.end(), query.begin(), query.end());
      f.ids.push_back(tokenizer.sep_id);
      f.first_segment = int64_t(f.ids.size());
      f.ids.insert(f.ids.end(), doc.begin() + begin, doc.begin() + begin + length);
      f.ids.push_back(tokenizer.sep_id);
      if (tok_start >= begin && tok_end <= begin + length - 1) {
        f.start = tok_start - begin + f.first_segment;
        f.end = tok_end - begin + f.first_segment;
      }
      features.push_back(std::move(f));
      if (begin + length == int64_t(doc.size())) break;
      begin += std::min(length, o.doc_stride);
    }
  }
  return features;
}

int64_t clamp_position(int64_t position, int64_t seq) { return std::clamp<int64_t>(position, 0, seq); }

void append_feature(const SquadFeature& f, int64_t seq, int64_t pad_id, SpanBatch& batch) {
  int64_t n = int64_t(f.ids.size());
  ENGINE_CHECK(n <= seq, "SQuAD: a feature of ", n, " tokens does not fit in ", seq);
  for (int64_t t = 0; t < seq; t++) {
    batch.ids.push_back(t < n ? f.ids[size_t(t)] : pad_id);
    batch.token_types.push_back(t >= f.first_segment && t < n ? 1 : 0);
    batch.padding.push_back(t < n ? 0 : 1);
  }
  batch.start_positions.push_back(clamp_position(f.start, seq));
  batch.end_positions.push_back(clamp_position(f.end, seq));
  batch.batch++;
  batch.seq = seq;
}

SpanBatch synthetic_span_batch(int64_t batch, int64_t seq, int64_t vocab, std::mt19937_64& rng) {
  const int64_t kStartMarker = 5, kEndMarker = 6, kFirstWord = 7;
  ENGINE_CHECK(seq >= kMinSyntheticSpanSeq && vocab > kFirstWord,
               "synthetic SQuAD: needs --seq >= ", kMinSyntheticSpanSeq, " (got ", seq,
               ") and a vocabulary of more than ", kFirstWord, " ids (got ", vocab, ")");
  ByteTokenizer specials;
  SpanBatch out;
  auto word = [&] { return kFirstWord + draw_index(rng, vocab - kFirstWord); };
  for (int64_t b = 0; b < batch; b++) {
    int64_t q_len = 1 + draw_index(rng, std::min<int64_t>(16, seq / 8));
    int64_t max_ctx = seq - q_len - 3;
    int64_t ctx_len = max_ctx / 2 + draw_index(rng, max_ctx - max_ctx / 2 + 1);
    int64_t ans_len = 2 + draw_index(rng, std::min<int64_t>(7, ctx_len - 2));
    int64_t begin = draw_index(rng, ctx_len - ans_len + 1);  // context index of the answer
    SquadFeature f;
    f.ids.push_back(specials.cls_id);
    for (int64_t i = 0; i < q_len; i++) f.ids.push_back(word());
    f.ids.push_back(specials.sep_id);
    f.first_segment = int64_t(f.ids.size());
    for (int64_t i = 0; i < ctx_len; i++)
      f.ids.push_back(i == begin ? kStartMarker : i == begin + ans_len - 1 ? kEndMarker : word());
    f.ids.push_back(specials.sep_id);
    f.start = f.first_segment + begin;
    f.end = f.start + ans_len - 1;
    append_feature(f, seq, specials.pad_id, out);
  }
  return out;
}

}  // namespace models::data
