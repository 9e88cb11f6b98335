// translation_data_test.cpp: the translation data pipeline: synthetic lengths, batching by tokens (the budget
// holds, every sentence is used once, the worst batch comes first), the padded batch layout, XLM's noise,
// and file errors that name the file and the line.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <set>

#include "engine/error.h"
#include "models/data/translation.h"
#include "tests/util/error_util.h"

using namespace models::data;

namespace {

std::string write_temp(const std::string& name, const std::string& content) {
  std::string path = testing::TempDir() + "translation_data_test_" + name;
  std::ofstream(path) << content;
  return path;
}

using testutil::error_of;

const char* kVocab = "<s>\n<pad>\n</s>\n<unk>\n<mask>\nhello\nworld\nbonjour\nmonde\n";  // 9 ids

}  // namespace

TEST(TranslationData, SyntheticLengthsFollowTheFixedSeededDistribution) {
  LengthDistribution d{24, 0.6, 1, 255};
  auto a = synthetic_sentences(2000, 100, d, 7), b = synthetic_sentences(2000, 100, d, 7);
  EXPECT_EQ(a, b) << "same seed, same sentences";
  EXPECT_NE(a, synthetic_sentences(2000, 100, d, 8));
  std::vector<int64_t> lengths;
  for (const auto& s : a) {
    lengths.push_back(int64_t(s.size()));
    for (int64_t w : s) EXPECT_TRUE(w >= TranslationIds::first_word && w < TranslationIds::first_word + 100);
  }
  std::sort(lengths.begin(), lengths.end());
  EXPECT_GE(lengths.front(), 1);
  EXPECT_LE(lengths.back(), 255);
  EXPECT_NEAR(double(lengths[1000]), 24.0, 2.0) << "the median";
  // log-normal spread 0.6: the 84th percentile near 24 e^0.6 = 43.7
  EXPECT_NEAR(double(lengths[1682]), 43.7, 4.0);
  auto pairs = synthetic_reversal_pairs(10, 100, d, 3);
  for (const auto& p : pairs) EXPECT_EQ(p.tgt, Sentence(p.src.rbegin(), p.src.rend()));
}

TEST(TranslationData, BatchingByTokensRespectsTheBudgetAndUsesEverySentenceOnce) {
  LengthDistribution d{24, 0.6, 1, 200};
  auto sentences = synthetic_sentences(3000, 50, d, 11);
  std::vector<int64_t> lengths;
  for (const auto& s : sentences) lengths.push_back(int64_t(s.size()) + 1);
  for (int64_t tokens : {150, 1000, 3584}) {
    SCOPED_TRACE(tokens);
    auto batches = batch_by_tokens(lengths, tokens);
    std::set<int64_t> seen;
    int64_t previous_longest = 1 << 30;
    for (const auto& b : batches) {
      ASSERT_FALSE(b.empty());
      int64_t longest = 0;
      for (int64_t i : b) {
        longest = std::max(longest, lengths[size_t(i)]);
        EXPECT_TRUE(seen.insert(i).second) << "sentence " << i << " twice";
      }
      EXPECT_LE(int64_t(b.size()) * longest, tokens) << "sentences x longest length <= tokens";
      EXPECT_LE(longest, previous_longest) << "longest first";
      previous_longest = longest;
    }
    size_t too_long = size_t(std::count_if(lengths.begin(), lengths.end(), [&](int64_t l) { return l > tokens; }));
    EXPECT_EQ(seen.size() + too_long, sentences.size()) << "only sentences longer than the budget are left out";
    // The first batch is full: one more of its longest sentences would not fit.
    int64_t first_longest = lengths[size_t(batches[0][0])];
    EXPECT_GT(int64_t(batches[0].size() + 1) * first_longest, tokens);
  }
  EXPECT_EQ(batch_by_count({3, 9, 5, 7, 1}, 2), (std::vector<std::vector<int64_t>>{{1, 3}, {2, 0}, {4}}));
  BatchOrder order(5, 1, 3);
  EXPECT_EQ(order.batch_for_step(1), 0);
  EXPECT_EQ(order.batch_for_step(2), 0) << "the longest batch twice: once without, once beside the optimizer state";
  EXPECT_EQ(order.batch_for_step(3), 3) << "then the most padded batch";
  std::set<int64_t> cycle;
  for (int64_t s = 4; s < 9; s++) cycle.insert(order.batch_for_step(s));
  EXPECT_EQ(cycle.size(), 5u);
  // P parts per optimizer step (ranks x micro-batches; data step d is part (d - 1) mod P of step (d - 1) / P + 1):
  // every part meets the longest batch at steps 1-2 and the most padded at step 3, the parts of a later step read
  // distinct batches, and each part alone meets all of them in 5 steps (what the max-batch finder's epoch replays).
  for (int64_t P : {2, 3, 4}) {
    for (int64_t c = 0; c < P; c++) {
      EXPECT_EQ(order.batch_for(c + 1, P), 0) << P;
      EXPECT_EQ(order.batch_for(P + c + 1, P), 0) << P;
      EXPECT_EQ(order.batch_for(2 * P + c + 1, P), 3) << P;
      std::set<int64_t> own;
      for (int64_t s = 4; s < 9; s++) own.insert(order.batch_for((s - 1) * P + c + 1, P));
      EXPECT_EQ(own.size(), 5u) << "part " << c << " of " << P;
    }
    for (int64_t s = 4; s < 9; s++) {
      std::set<int64_t> step;
      for (int64_t c = 0; c < P; c++) step.insert(order.batch_for((s - 1) * P + c + 1, P));
      EXPECT_EQ(step.size(), size_t(P)) << "step " << s << " of " << P << " parts";
    }
  }
  for (int64_t d = 1; d < 12; d++) EXPECT_EQ(order.batch_for(d, 1), order.batch_for_step(d));
  EXPECT_THROW(BatchOrder(5, 1, 5), engine::Error);
  // Lengths 10 (x1), 6 (x3), 5 (x2) with 18 tokens: {10}, {6, 6, 6}, {5, 5}: padded 10, 18, 10.
  const std::vector<int64_t> lens = {6, 10, 5, 6, 5, 6};
  const auto packed = batch_by_tokens(lens, 18);
  ASSERT_EQ(packed.size(), 3u);
  EXPECT_EQ(packed[0], (std::vector<int64_t>{1}));
  EXPECT_EQ(most_padded_batch(packed, lens), 1);
  EXPECT_EQ(most_padded_batch({{1}, {4, 2}}, lens), 0) << "ties (10 and 10) keep the first";
  // The models' pipeline: pair lengths (max of source and target, EOS included) -> batches -> order and note.
  const std::vector<SentencePair> pairs = {{{5, 6}, {6, 5}}, {{5, 6, 7, 8, 9, 10, 11}, {11, 10}}, {{7}, {7}}};
  TokenBatches t = batch_pairs_by_tokens(pairs, 6, 1, "model_x");  // lengths 3, 8, 2: the 8 is left out
  EXPECT_EQ(t.batches, (std::vector<std::vector<int64_t>>{{0, 2}}));
  EXPECT_EQ(t.note, " (1 longer than --tokens 6 left out)");
  EXPECT_EQ(t.order->batch_for_step(3), 0);
  EXPECT_NE(
      error_of([&] { batch_pairs_by_tokens(pairs, 1, 1, "model_x"); }).find("model_x: no sentence fits --tokens 1"),
      std::string::npos);
}

TEST(TranslationData, TokenBatchedCorpusServesTheStepsOrder) {
  // Synthetic pairs cut by batch_pairs_by_tokens: every step's batch is the one BatchOrder names, within budget.
  CorpusOptions o;
  o.model = "model_x";
  o.vocab = TranslationIds::first_word + 16;
  o.pairs = 200;
  o.lengths = LengthDistribution{6, 0.3, 3, 9};
  o.tokens = 40;
  TokenBatchedCorpus c(o);
  ASSERT_EQ(c.pairs().size(), 200u);
  EXPECT_NE(c.description().find("synthetic reversal pairs: 200 sentences of 16 words"), std::string::npos);
  const TokenBatches t = batch_pairs_by_tokens(c.pairs(), o.tokens, o.seed, o.model);
  EXPECT_EQ(c.num_batches(), int64_t(t.batches.size()));
  EXPECT_EQ(c.epoch_steps(), t.order->epoch_steps());
  for (int64_t step = 1; step <= 3 + c.num_batches(); step++) {
    const TranslationBatch b = c.batch(step, 1);
    const TranslationBatch want = make_translation_batch(c.pairs(), t.batches[size_t(t.order->batch_for(step, 1))]);
    EXPECT_EQ(b.src, want.src) << "step " << step;
    EXPECT_LE(b.batch * std::max(b.src_len, b.tgt_len), o.tokens) << "step " << step;
  }
  EXPECT_NE(c.describe_batch(1, 1).find(engine::str("of ", c.num_batches(), ": ")), std::string::npos);
  o.vocab = TranslationIds::first_word + 3;
  o.words = 5;
  EXPECT_NE(error_of([&] { TokenBatchedCorpus bad(o); }).find("model_x: 5 synthetic words need a vocabulary of"),
            std::string::npos);
}

TEST(TranslationData, BatchLayoutIsFairseqsRightPadded) {
  std::vector<SentencePair> pairs = {{{5, 6, 7}, {8}}, {{9}, {10, 11}}};
  TranslationBatch b = make_translation_batch(pairs, {0, 1});
  const int64_t P = TranslationIds::pad, E = TranslationIds::eos;
  EXPECT_EQ(b.batch, 2);
  EXPECT_EQ(b.src_len, 4);
  EXPECT_EQ(b.tgt_len, 3);
  EXPECT_EQ(b.src, (std::vector<int64_t>{5, 6, 7, E, 9, E, P, P}));
  EXPECT_EQ(b.src_padding, (std::vector<int64_t>{0, 0, 0, 0, 0, 0, 1, 1}));
  EXPECT_EQ(b.prev_output, (std::vector<int64_t>{E, 8, P, E, 10, 11}));
  EXPECT_EQ(b.target, (std::vector<int64_t>{8, E, P, 10, 11, E}));
  EXPECT_EQ(b.target_tokens, 5);
  EXPECT_EQ(pair_length(pairs[0]), 4);
  std::vector<const Sentence*> src = {&pairs[0].src}, tgt = {&pairs[0].tgt};
  TranslationBatch fixed = make_translation_batch(src, tgt, 6);  // generated sources: fixed width
  EXPECT_EQ(fixed.src, (std::vector<int64_t>{5, 6, 7, E, P, P}));
  EXPECT_EQ(fixed.src_padding, (std::vector<int64_t>{0, 0, 0, 0, 1, 1}));
}

TEST(TranslationData, NoiseShufflesLocallyDropsAndBlanks) {
  std::mt19937_64 rng(5);
  Sentence s;
  for (int64_t i = 0; i < 40; i++) s.push_back(TranslationIds::first_word + i);
  NoiseOptions shuffle_only{3, 0, 0};
  for (int trial = 0; trial < 50; trial++) {
    Sentence n = add_noise(s, shuffle_only, rng);
    ASSERT_EQ(n.size(), s.size());
    for (size_t j = 0; j < n.size(); j++)
      EXPECT_LT(std::abs(int64_t(n[j] - TranslationIds::first_word) - int64_t(j)), 3) << "a word moves by less than k";
  }
  size_t kept = 0, blanks = 0, total = 0;
  for (int trial = 0; trial < 200; trial++) {
    Sentence n = add_noise(s, NoiseOptions{}, rng);
    kept += n.size();
    total += s.size();
    blanks += size_t(std::count(n.begin(), n.end(), TranslationIds::mask));
  }
  EXPECT_NEAR(double(kept) / double(total), 0.9, 0.02);
  EXPECT_NEAR(double(blanks) / double(kept), 0.1, 0.02);
  EXPECT_EQ(add_noise({7}, NoiseOptions{3, 0.999, 0}, rng).size(), 1u) << "one word always stays";
}

TEST(TranslationData, ReadsACorpusAndItsErrorsNameFileAndLine) {
  std::string vocab = write_temp("ok.vocab", kVocab);
  write_temp("ok.src", "5 6\n7\n");
  write_temp("ok.tgt", "8 7\n6 5 8\n");
  ParallelCorpus c = read_parallel_corpus(testing::TempDir() + "translation_data_test_ok");
  EXPECT_EQ(c.vocab_size, 9);
  ASSERT_EQ(c.pairs.size(), 2u);
  EXPECT_EQ(c.pairs[1].tgt, (Sentence{6, 5, 8}));

  std::string bad = write_temp("bad.src", "5 6\n7 8\n5 x7\n");
  std::string e = error_of([&] { read_token_file(bad, 9); });
  EXPECT_NE(e.find(bad + ":3"), std::string::npos) << e;
  EXPECT_NE(e.find("'x7'"), std::string::npos) << e;
  std::string range = write_temp("range.src", "5\n5 9\n");
  e = error_of([&] { read_token_file(range, 9); });
  EXPECT_NE(e.find(range + ":2"), std::string::npos) << e;
  EXPECT_NE(e.find("token id 9"), std::string::npos) << e;
  std::string empty = write_temp("empty.src", "5\n\n6\n");
  e = error_of([&] { read_token_file(empty, 9); });
  EXPECT_NE(e.find(empty + ":2: empty sentence"), std::string::npos) << e;
  std::string v = write_temp("bad.vocab", "<s>\n<pad>\n<eos>\n");
  e = error_of([&] { read_vocabulary(v); });
  EXPECT_NE(e.find(v + ":3"), std::string::npos) << e;
  write_temp("short.vocab", kVocab);
  write_temp("short.src", "5\n6\n");
  write_temp("short.tgt", "5\n");
  e = error_of([&] { read_parallel_corpus(testing::TempDir() + "translation_data_test_short"); });
  EXPECT_NE(e.find("has 2 sentences but"), std::string::npos) << e;
  e = error_of([&] { read_token_file(testing::TempDir() + "no_such_file.src", 9); });
  EXPECT_NE(e.find("no_such_file.src"), std::string::npos) << e;
}
