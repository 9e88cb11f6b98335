// bert_data_test.cpp: the BERT data pipelines against hand-worked examples: the WordPiece tokenizer
// (google-research/bert tokenization_test.py's cases), vocabularies, BERT masking, byte passages, and SQuAD
// examples and features (run_squad.py's rules), read from the team-made files in tests/data/bert/; broken
// copies of those files must be refused with an Error naming the file and where.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <set>

#include "engine/error.h"
#include "models/data/masked_lm.h"
#include "models/data/squad.h"
#include "models/data/wordpiece.h"
#include "tests/util/error_util.h"
#include "tests/util/temp_dir.h"

using namespace models::data;
using Strings = std::vector<std::string>;

namespace {

std::string data_file(const std::string& name) {
  std::string here = __FILE__;
  return here.substr(0, here.find_last_of('/')) + "/../data/bert/" + name;
}

using testutil::TempDir;

using testutil::error_of;

#define EXPECT_ERROR_MENTIONS(message, ...)                                               \
  do {                                                                                    \
    std::string m_ = (message);                                                           \
    EXPECT_FALSE(m_.empty()) << "expected an error";                                      \
    for (const char* part : {__VA_ARGS__}) EXPECT_NE(m_.find(part), std::string::npos) << m_; \
  } while (0)

std::string replace_once(std::string s, const std::string& from, const std::string& to) {
  size_t p = s.find(from);
  EXPECT_NE(p, std::string::npos) << from;
  return p == std::string::npos ? s : s.replace(p, from.size(), to);
}

}  // namespace

// ---------------------------------------------------------------------------------------------------
// WordPiece

TEST(WordPiece, BasicTokenizerLowerCasesStripsAccentsAndSplitsPunctuation) {
  EXPECT_EQ(basic_tokenize(" \tHeLLo!how  \n Are yoU?  ", true), (Strings{"hello", "!", "how", "are", "you", "?"}));
  EXPECT_EQ(basic_tokenize(" \tHeLLo!how  \n Are yoU?  ", false),
            (Strings{"HeLLo", "!", "how", "Are", "yoU", "?"}));
  EXPECT_EQ(basic_tokenize("H\u00E9llo", true), (Strings{"hello"}));
  EXPECT_EQ(basic_tokenize("H\u00E9llo", false), (Strings{"H\u00E9llo"}));
  // CJK ideographs become words of their own; control characters vanish; U+2028 separates words
  EXPECT_EQ(basic_tokenize("ah\u535A\u63A8zz", true), (Strings{"ah", "\u535A", "\u63A8", "zz"}));
  EXPECT_EQ(basic_tokenize("a\u0007b\u200Bc\u2028d", true), (Strings{"abc", "d"}));
  // every non-alphanumeric ASCII character is punctuation, as are Unicode P* characters
  EXPECT_EQ(basic_tokenize("$5^2 \u00BFqu\u00E9?\u2014no", true),
            (Strings{"$", "5", "^", "2", "\u00BF", "que", "?", "\u2014", "no"}));
  // accents of Greek and Cyrillic letters, Hangul decomposed into jamo, Turkish dotted I
  EXPECT_EQ(basic_tokenize("\u0386\u03B8\u03AE\u03BD\u03B1 \u0419\u043E\u0434 \uD55C \u0130", true),
            (Strings{"\u03B1\u03B8\u03B7\u03BD\u03B1", "\u0438\u043E\u0434", "\u1112\u1161\u11AB", "i"}));
}

TEST(WordPiece, GreedyLongestMatchFirstWithContinuationPieces) {
  auto tok = WordPieceTokenizer::from_file(data_file("vocab.txt"));
  EXPECT_TRUE(tok->lower_case()) << "the sample vocabulary has no upper-case tokens";
  EXPECT_EQ(wordpiece_split("unaffable", tok->vocab()), (Strings{"un", "##aff", "##able"}));
  EXPECT_EQ(wordpiece_split("unwanted", tok->vocab()), (Strings{"un", "##want", "##ed"}));
  EXPECT_EQ(wordpiece_split("unwantedX", tok->vocab()), (Strings{"[UNK]"})) << "one uncovered piece: the whole word";
  EXPECT_EQ(wordpiece_split(std::string(101, 'a'), tok->vocab()), (Strings{"[UNK]"})) << "over 100 characters";
  EXPECT_EQ(tok->tokenize("UNwant\u00E9d,running"), (Strings{"un", "##want", "##ed", ",", "runn", "##ing"}));
  EXPECT_EQ(tok->tokenize(""), Strings{});
  // ids are line numbers - 1
  EXPECT_EQ(tok->encode("the unaffable runner"), (std::vector<int64_t>{5, 7, 8, 9, 10}));
  EXPECT_EQ(tok->pad_id, 0);
  EXPECT_EQ(tok->unk_id, 1);
  EXPECT_EQ(tok->cls_id, 2);
  EXPECT_EQ(tok->sep_id, 3);
  EXPECT_EQ(tok->mask_id, 4);
  EXPECT_EQ(tok->encode("the xyz."), (std::vector<int64_t>{5, 1, 42}));
}

TEST(WordPiece, ByteTokenizerIdsAreBytesPlusFive) {
  ByteTokenizer t;
  EXPECT_EQ(t.encode("A\xC3\xA9"), (std::vector<int64_t>{5 + 65, 5 + 0xC3, 5 + 0xA9}));
  EXPECT_EQ(t.vocab_size(), 261);
  EXPECT_EQ(ByteTokenizer::id_of_byte(255), 260);
}

TEST(WordPiece, Utf8RoundTripsAndSkipsInvalidBytes) {
  std::u32string s = U"a\u00E9\u4E2D\U0001F600";
  EXPECT_EQ(utf8_decode(utf8_encode(s)), s);
  bool valid = true;
  EXPECT_EQ(utf8_decode("a\xFF" "b\xC3", &valid), U"ab");
  EXPECT_FALSE(valid);
  EXPECT_EQ(utf8_decode("\xC0\xAF", &valid), U"") << "overlong encoding";
}

TEST(WordPiece, BrokenVocabulariesAreRefusedWithFileAndLine) {
  std::string good = engine::str(std::ifstream(data_file("vocab.txt")).rdbuf());
  TempDir dir;
  EXPECT_ERROR_MENTIONS(error_of([&] { Vocab::load(dir.write("dup.txt", good + "runner\n")); }), "dup.txt",
                        "line 50", "already appears on line 11");
  EXPECT_ERROR_MENTIONS(error_of([&] { Vocab::load(dir.write("empty.txt", replace_once(good, "the\n", "the\n\n"))); }),
                        "empty.txt", "line 7", "empty line");
  EXPECT_ERROR_MENTIONS(error_of([&] { Vocab::load(dir.write("space.txt", replace_once(good, "was\n", "w as\n"))); }),
                        "space.txt", "line 14", "whitespace");
  EXPECT_ERROR_MENTIONS(error_of([&] { Vocab::load(dir.write("nomask.txt", replace_once(good, "[MASK]\n", ""))); }),
                        "nomask.txt", "[MASK]");
  EXPECT_ERROR_MENTIONS(error_of([&] { Vocab::load(dir.write("utf8.txt", good + "caf\xC3\n")); }), "utf8.txt",
                        "line 50", "UTF-8");
  EXPECT_ERROR_MENTIONS(error_of([&] { Vocab::load("/nonexistent/vocab.txt"); }), "/nonexistent/vocab.txt");
  // Windows line ends are accepted
  EXPECT_EQ(Vocab::parse("[PAD]\r\n[UNK]\r\n[CLS]\r\n[SEP]\r\n[MASK]\r\n", "crlf").find("[MASK]"), 4);
}

// ---------------------------------------------------------------------------------------------------
// Masked LM

TEST(MaskedLm, MaskedCountIsFifteenPercentRounded) {
  EXPECT_EQ(masked_count(128), 19);  // 19.2
  EXPECT_EQ(masked_count(384), 58);  // 57.6
  EXPECT_EQ(masked_count(512), 77);  // 76.8
  EXPECT_EQ(masked_count(5), 1);     // 0.75, and at least one
}

TEST(MaskedLm, MaskRowReplaces80PercentByMask10ByRandomWordsAndKeeps10) {
  MaskingIds ids;  // [MASK] 4, words [5, 261)
  std::mt19937_64 rng(3);
  int64_t masks = 0, kept = 0, random = 0, total = 0;
  for (int r = 0; r < 2000; r++) {
    std::vector<int64_t> row(20), original(20);
    for (int t = 0; t < 20; t++) row[t] = original[t] = 100 + t;
    std::vector<int64_t> candidates;
    for (int t = 1; t < 19; t++) candidates.push_back(t);  // not the first and last (specials)
    std::vector<int64_t> positions, labels;
    mask_row(row.data(), candidates, 3, ids, rng, 1000 * r, positions, labels);
    ASSERT_EQ(positions.size(), 3u);
    std::set<int64_t> chosen;
    for (size_t i = 0; i < positions.size(); i++) {
      int64_t t = positions[i] - 1000 * r;
      ASSERT_TRUE(t >= 1 && t <= 18) << t;
      if (i > 0) {
        EXPECT_LT(positions[i - 1], positions[i]);
      }
      EXPECT_EQ(labels[i], original[size_t(t)]);
      chosen.insert(t);
      total++;
      if (row[size_t(t)] == ids.mask) {
        masks++;
      } else if (row[size_t(t)] == original[size_t(t)]) {
        kept++;
      } else {
        random++;
        EXPECT_TRUE(row[size_t(t)] >= ids.first_word && row[size_t(t)] < ids.end_word);
      }
    }
    for (int t = 0; t < 20; t++) {
      if (!chosen.count(t)) {
        EXPECT_EQ(row[size_t(t)], original[size_t(t)]);
      }
    }
  }
  EXPECT_NEAR(double(masks) / double(total), 0.8, 0.02);
  EXPECT_NEAR(double(kept) / double(total), 0.1, 0.015);  // (+ 1/256 of the random draws)
  EXPECT_NEAR(double(random) / double(total), 0.1, 0.015);
}

TEST(MaskedLm, BatchesAreClsASepBSepWithTokenTypesAndFixedMaskCounts) {
  ProgressionSource source(5, 256);
  MaskingIds ids;
  std::mt19937_64 rng(1);
  const int64_t B = 16, T = 24, M = masked_count(T);
  MaskedLmBatch b = make_masked_lm_batch(source, ids, B, T, rng);
  ASSERT_EQ(b.ids.size(), size_t(B * T));
  ASSERT_EQ(b.masked_positions.size(), size_t(B * M));
  ASSERT_EQ(b.next_sentence_labels.size(), size_t(B));
  std::set<int64_t> nsp;
  for (int64_t r = 0; r < B; r++) {
    const int64_t* row = b.ids.data() + r * T;
    const int64_t* types = b.token_types.data() + r * T;
    EXPECT_EQ(row[0], ids.cls);
    EXPECT_EQ(row[T - 1], ids.sep);
    int64_t sep = std::find(row + 1, row + T, ids.sep) - row;  // the first [SEP]; words are never specials
    ASSERT_LT(sep, T - 1);
    for (int64_t t = 0; t < T; t++) EXPECT_EQ(types[t], t <= sep ? 0 : 1) << "row " << r << " t " << t;
    for (int64_t i = 0; i < M; i++) {
      int64_t p = b.masked_positions[size_t(r * M + i)] - r * T;
      EXPECT_TRUE(p > 0 && p < T - 1 && p != sep) << p;
    }
    nsp.insert(b.next_sentence_labels[size_t(r)]);
  }
  EXPECT_EQ(nsp, (std::set<int64_t>{0, 1}));
  EXPECT_ERROR_MENTIONS(error_of([&] { make_masked_lm_batch(source, ids, 1, 4, rng); }), "--seq 4");
}

TEST(MaskedLm, ProgressionPassagesContinueWhenNextAndDifferOtherwise) {
  ProgressionSource source(5, 50, /*offsets=*/50, /*max_step=*/4);
  std::mt19937_64 rng(7);
  std::vector<int64_t> a, b;
  for (int trial = 0; trial < 50; trial++) {
    bool next = trial % 2 == 0;
    source.sample_pair(rng, 6, 5, next, a, b);
    int64_t k = ((a[1] - a[0]) % 50 + 50) % 50;
    for (size_t i = 1; i < a.size(); i++) EXPECT_EQ(((a[i] - a[i - 1]) % 50 + 50) % 50, k);
    std::vector<int64_t> continued;
    for (int64_t i = 0; i < 5; i++) continued.push_back(5 + ((a[5] - 5) + (i + 1) * k) % 50);
    if (next) {
      EXPECT_EQ(b, continued);
    } else {
      EXPECT_NE(b, continued);  // another progression: not one of its words can all agree
    }
    for (int64_t x : b) EXPECT_TRUE(x >= 5 && x < 55);
  }
}

TEST(MaskedLm, BytePassagesAreWindowsOfTheFile) {
  std::string path = data_file("bytes_sample.txt");
  std::string text = engine::str(std::ifstream(path, std::ios::binary).rdbuf());
  ByteFileSource source(path, 64);
  std::mt19937_64 rng(5);
  std::vector<int64_t> a, b;
  auto bytes_of = [](const std::vector<int64_t>& ids) {
    std::string s;
    for (int64_t id : ids) s += char(id - ByteTokenizer::kFirstByte);
    return s;
  };
  for (int trial = 0; trial < 40; trial++) {
    bool next = trial % 2 == 0;
    source.sample_pair(rng, 20, 30, next, a, b);
    ASSERT_EQ(a.size(), 20u);
    ASSERT_EQ(b.size(), 30u);
    EXPECT_NE(text.find(bytes_of(a)), std::string::npos);
    EXPECT_NE(text.find(bytes_of(b)), std::string::npos);
    if (next) {
      EXPECT_NE(text.find(bytes_of(a) + bytes_of(b)), std::string::npos);
    }
  }
  EXPECT_ERROR_MENTIONS(error_of([&] { ByteFileSource(path, 100000); }), "bytes_sample.txt", "100000");
  EXPECT_ERROR_MENTIONS(error_of([&] { ByteFileSource("/nonexistent/enwik8", 10); }), "/nonexistent/enwik8");
}

// ---------------------------------------------------------------------------------------------------
// SQuAD

TEST(Squad, ReadsExamplesAndSkipsWhatRunSquadSkips) {
  int64_t skipped = -1;
  auto ex = read_squad(data_file("squad_sample.json"), &skipped);
  EXPECT_EQ(skipped, 2) << "q3 (answer text not at answer_start) and q4 (no answer)";
  ASSERT_EQ(ex.size(), 4u);
  EXPECT_EQ(ex[0].id, "q1");
  EXPECT_EQ(ex[0].doc_words, (Strings{"The", "unaffable", "runner", "was", "running", "in", "Paris."}));
  EXPECT_EQ(ex[0].start_word, 1);
  EXPECT_EQ(ex[0].end_word, 2);
  EXPECT_EQ(ex[1].id, "q2");
  EXPECT_EQ(ex[1].answer, "Paris") << "the first of several answers";
  EXPECT_EQ(ex[1].start_word, 6);
  EXPECT_EQ(ex[1].end_word, 6);
  EXPECT_EQ(ex[2].start_word, 4);  // "(1895-1943)."
  // answer_start counts characters: "r\u00E9sum\u00E9" starts at character 11 (byte 13)
  EXPECT_EQ(ex[3].id, "q6");
  EXPECT_EQ(ex[3].start_word, 2);
  EXPECT_EQ(ex[3].end_word, 2);
}

TEST(Squad, FeaturesMapAnswersToWordPieces) {
  auto tok = squad_tokenizer(data_file("squad_sample.json"));
  ASSERT_NE(dynamic_cast<WordPieceTokenizer*>(tok.get()), nullptr) << "vocab.txt lies beside the sample";
  auto ex = read_squad(data_file("squad_sample.json"));
  auto f = squad_features(ex, *tok, SquadOptions::for_seq(64));
  ASSERT_EQ(f.size(), 4u);
  // q1: [CLS] who was runn ##ing ? [SEP] | the un ##aff ##able runner was runn ##ing in paris . [SEP]
  EXPECT_EQ(f[0].first_segment, 7);
  EXPECT_EQ(f[0].ids.size(), 19u);
  EXPECT_EQ(f[0].start, 8);  // un
  EXPECT_EQ(f[0].end, 11);   // runner
  // q2: 7 question pieces; "Paris." is paris + . and the answer "Paris" narrows to paris
  EXPECT_EQ(f[1].first_segment, 9);
  EXPECT_EQ(f[1].start, 9 + 9);
  EXPECT_EQ(f[1].end, 9 + 9);
  // q5: "(1895-1943)." is ( 1895 - 1943 ) . ; the answer 1895 is the second piece of word 4
  EXPECT_EQ(f[2].first_segment, 8);
  EXPECT_EQ(f[2].start, 8 + 5);
  EXPECT_EQ(f[2].end, 8 + 5);
  // q6: [CLS] what is naive ? [SEP] | cafe naive resume uber alles . [SEP]: resume, lower-cased, accents stripped
  EXPECT_EQ(f[3].first_segment, 6);
  EXPECT_EQ(f[3].start, 8);
  EXPECT_EQ(f[3].ids[8], tok->encode("resume")[0]);
  // no vocab.txt beside a file: bytes
  TempDir dir;
  auto bytes = squad_tokenizer(dir.write("squad.json", "{}"));
  EXPECT_NE(dynamic_cast<ByteTokenizer*>(bytes.get()), nullptr);
}

TEST(Squad, LongDocumentsGiveWindowsDocStrideApart) {
  // bytes: 14 document tokens "aaaa" "bb" "cccccc" "dd"; answer "cccccc" = tokens 6..11; question "q?"
  SquadExample ex;
  ex.question = "q?";
  ex.answer = "cccccc";
  ex.doc_words = {"aaaa", "bb", "cccccc", "dd"};
  ex.start_word = ex.end_word = 2;
  SquadOptions o;
  o.max_seq_length = 12;  // 7 document tokens per window
  o.doc_stride = 3;
  ByteTokenizer bytes;
  auto f = squad_features({ex}, bytes, o);
  ASSERT_EQ(f.size(), 4u);  // windows at 0, 3, 6, 9 (the last one ends the document)
  const int64_t first = 4;  // [CLS] q ? [SEP]
  for (size_t w = 0; w < f.size(); w++) {
    int64_t begin = 3 * int64_t(w), length = std::min<int64_t>(7, 14 - begin);
    ASSERT_EQ(int64_t(f[w].ids.size()), first + length + 1);
    EXPECT_EQ(f[w].first_segment, first);
    EXPECT_EQ(f[w].ids[size_t(first)], bytes.encode(std::string("aaaabbccccccdd").substr(size_t(begin), 1))[0]);
    bool contains = begin <= 6 && 11 <= begin + length - 1;  // only the window at 6 holds the whole answer
    EXPECT_EQ(f[w].start, contains ? first + 6 - begin : 0) << "window " << w;
    EXPECT_EQ(f[w].end, contains ? first + 11 - begin : 0) << "window " << w;
  }
  // padded into a batch: token types 0 / 1 / 0 (padding), padding flags, positions clamped
  SpanBatch batch;
  append_feature(f[2], 16, bytes.pad_id, batch);
  std::vector<int64_t> types(16, 0), padding(16, 0);
  for (int t = first; t < 12; t++) types[size_t(t)] = 1;
  for (int t = 12; t < 16; t++) padding[size_t(t)] = 1;
  EXPECT_EQ(batch.token_types, types);
  EXPECT_EQ(batch.padding, padding);
  EXPECT_EQ(batch.ids[15], bytes.pad_id);
  EXPECT_EQ(batch.start_positions, (std::vector<int64_t>{4}));
  EXPECT_EQ(clamp_position(40, 16), 16);
  EXPECT_EQ(clamp_position(-3, 16), 0);
}

TEST(Squad, SyntheticSpansAreMarkedAndInRange) {
  std::mt19937_64 rng(2);
  SpanBatch b = synthetic_span_batch(64, 48, 100, rng);
  ASSERT_EQ(b.ids.size(), size_t(64 * 48));
  for (int64_t r = 0; r < 64; r++) {
    int64_t s = b.start_positions[size_t(r)], e = b.end_positions[size_t(r)];
    ASSERT_TRUE(s > 0 && s < e && e < 48);
    EXPECT_EQ(b.ids[size_t(r * 48 + s)], 5);
    EXPECT_EQ(b.ids[size_t(r * 48 + e)], 6);
    EXPECT_EQ(b.token_types[size_t(r * 48 + s)], 1);
    EXPECT_EQ(b.padding[size_t(r * 48 + e)], 0);
  }
}

TEST(Squad, BrokenFilesAreRefusedWithFileAndPlace) {
  std::string good = engine::str(std::ifstream(data_file("squad_sample.json")).rdbuf());
  TempDir dir;
  EXPECT_ERROR_MENTIONS(error_of([&] { read_squad(dir.write("cut.json", good.substr(0, 300))); }), "cut.json",
                        "byte", "line");
  EXPECT_ERROR_MENTIONS(
      error_of([&] { read_squad(dir.write("noctx.json", replace_once(good, "\"context\"", "\"kontext\""))); }),
      "noctx.json", "data[0].paragraphs[0]", "'context'");
  EXPECT_ERROR_MENTIONS(
      error_of([&] {
        read_squad(dir.write("past.json", replace_once(good, "\"answer_start\": 36", "\"answer_start\": 360")));
      }),
      "past.json", "data[0].paragraphs[0].qas[1].answers[0]", "past the end", "q2");
  EXPECT_ERROR_MENTIONS(
      error_of([&] {
        read_squad(dir.write("frac.json", replace_once(good, "\"answer_start\": 23", "\"answer_start\": 2.5")));
      }),
      "frac.json", "data[1].paragraphs[0].qas[0].answers[0].answer_start", "2.5");
  EXPECT_ERROR_MENTIONS(
      error_of([&] {
        read_squad(dir.write("type.json", replace_once(good, "\"question\": \"Who was running?\"", "\"question\": 7")));
      }),
      "type.json", "data[0].paragraphs[0].qas[0].question is a number, expected a string");
  EXPECT_ERROR_MENTIONS(error_of([&] { read_squad(dir.write("nodata.json", "{\"version\": \"1.1\"}")); }),
                        "nodata.json", "'data'");
  EXPECT_ERROR_MENTIONS(error_of([&] { read_squad("/nonexistent/train-v1.1.json"); }), "/nonexistent/train-v1.1.json");
}
