// translation.cpp: synthetic and file sentence pairs, batching by tokens, padded batches.
#include "models/data/translation.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <numeric>
#include <sstream>

#include "engine/error.h"
#include "engine/io.h"

namespace models::data {

namespace {

// A uniform in (0, 1) from the top 53 bits (never 0, so log() is finite).
double uniform_open(std::mt19937_64& rng) { return (double(rng() >> 11) + 0.5) * (1.0 / 9007199254740992.0); }

double standard_normal(std::mt19937_64& rng) {  // Box-Muller, one of the pair
  double u1 = uniform_open(rng), u2 = uniform_open(rng);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

// Indices sorted by length, longest first; ties keep index order.
std::vector<int64_t> longest_first(const std::vector<int64_t>& lengths) {
  std::vector<int64_t> order(lengths.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return lengths[size_t(a)] > lengths[size_t(b)]; });
  return order;
}

std::vector<std::string> read_lines(const std::string& path) {
  engine::check_input_file(path, "translation data file", 16 * engine::kGiB);
  std::ifstream in(path);
  ENGINE_CHECK(in.good(), "translation data: cannot read '", path, "'");
  std::vector<std::string> lines;
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    lines.push_back(line);
  }
  return lines;
}

}  // namespace

int64_t LengthDistribution::draw(std::mt19937_64& rng) const {
  double len = std::round(median * std::exp(spread * standard_normal(rng)));
  return std::clamp(int64_t(len), min_len, max_len);
}

std::vector<Sentence> synthetic_sentences(int64_t count, int64_t words, const LengthDistribution& lengths,
                                          uint64_t seed) {
  ENGINE_CHECK(words >= 1 && count >= 1, "synthetic sentences: need words >= 1 and count >= 1, got ", words, " and ",
               count);
  std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull + 17);
  std::vector<Sentence> out(static_cast<size_t>(count));
  for (auto& s : out) {
    s.resize(size_t(lengths.draw(rng)));
    for (auto& w : s) w = TranslationIds::first_word + int64_t(rng() % uint64_t(words));
  }
  return out;
}

std::vector<SentencePair> synthetic_reversal_pairs(int64_t count, int64_t words, const LengthDistribution& lengths,
                                                   uint64_t seed) {
  std::vector<SentencePair> pairs;
  for (Sentence& s : synthetic_sentences(count, words, lengths, seed)) {
    Sentence r(s.rbegin(), s.rend());
    pairs.push_back({std::move(s), std::move(r)});
  }
  return pairs;
}

// ---------------------------------------------------------------------------------------------------
// Files

std::vector<Sentence> read_token_file(const std::string& path, int64_t vocab_size) {
  std::vector<Sentence> out;
  std::vector<std::string> lines = read_lines(path);
  for (size_t i = 0; i < lines.size(); i++) {
    std::istringstream words(lines[i]);
    std::string w;
    Sentence s;
    while (words >> w) {
      size_t used = 0;
      long long id = -1;
      try {
        id = std::stoll(w, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      ENGINE_CHECK(used == w.size() && used > 0, path, ":", i + 1, ": '", w,
                   "' is not a token id (expected integers separated by spaces)");
      ENGINE_CHECK(id >= TranslationIds::first_word && id < vocab_size, path, ":", i + 1, ": token id ", id,
                   " is outside the words of the vocabulary [", TranslationIds::first_word, ", ", vocab_size, ")");
      s.push_back(id);
    }
    ENGINE_CHECK(!s.empty(), path, ":", i + 1, ": empty sentence (every line must hold at least one token id)");
    out.push_back(std::move(s));
  }
  ENGINE_CHECK(!out.empty(), "translation data: '", path, "' holds no sentences");
  return out;
}

int64_t read_vocabulary(const std::string& path) {
  std::vector<std::string> lines = read_lines(path);
  const char* specials[] = {"<s>", "<pad>", "</s>", "<unk>", "<mask>"};
  for (size_t i = 0; i < 5; i++)
    ENGINE_CHECK(i < lines.size() && lines[i] == specials[i], path, ":", i + 1, ": expected the special token '",
                 specials[i], "' (the first five lines are <s> <pad> </s> <unk> <mask>), got '",
                 i < lines.size() ? lines[i] : std::string("end of file"), "'");
  for (size_t i = 5; i < lines.size(); i++)
    ENGINE_CHECK(!lines[i].empty(), path, ":", i + 1, ": empty token");
  return int64_t(lines.size());
}

ParallelCorpus read_parallel_corpus(const std::string& prefix) {
  ParallelCorpus c;
  c.vocab_size = read_vocabulary(prefix + ".vocab");
  std::vector<Sentence> src = read_token_file(prefix + ".src", c.vocab_size);
  std::vector<Sentence> tgt = read_token_file(prefix + ".tgt", c.vocab_size);
  ENGINE_CHECK(src.size() == tgt.size(), "translation data: ", prefix, ".src has ", src.size(), " sentences but ",
               prefix, ".tgt has ", tgt.size(), " (line i of one must translate line i of the other)");
  for (size_t i = 0; i < src.size(); i++) c.pairs.push_back({std::move(src[i]), std::move(tgt[i])});
  c.describe = engine::str(prefix, ".{src,tgt}: ", c.pairs.size(), " sentence pairs, vocabulary ", c.vocab_size);
  return c;
}

// ---------------------------------------------------------------------------------------------------
// Batching

std::vector<std::vector<int64_t>> batch_by_tokens(const std::vector<int64_t>& lengths, int64_t tokens) {
  ENGINE_CHECK(tokens >= 1, "batch_by_tokens: --tokens must be at least 1, got ", tokens);
  std::vector<std::vector<int64_t>> batches;
  int64_t longest = 0;  // of the open batch: the first sentence put in it (longest first)
  for (int64_t i : longest_first(lengths)) {
    int64_t len = lengths[size_t(i)];
    if (len > tokens) continue;
    if (batches.empty() || int64_t(batches.back().size() + 1) * longest > tokens) {
      batches.emplace_back();
      longest = len;
    }
    batches.back().push_back(i);
  }
  return batches;
}

std::vector<std::vector<int64_t>> batch_by_count(const std::vector<int64_t>& lengths, int64_t count) {
  ENGINE_CHECK(count >= 1, "batch_by_count: need at least 1 sentence per batch, got ", count);
  std::vector<std::vector<int64_t>> batches;
  for (int64_t i : longest_first(lengths)) {
    if (batches.empty() || int64_t(batches.back().size()) == count) batches.emplace_back();
    batches.back().push_back(i);
  }
  return batches;
}

int64_t most_padded_batch(const std::vector<std::vector<int64_t>>& batches, const std::vector<int64_t>& lengths) {
  int64_t best = 0, best_tokens = -1;
  for (size_t b = 0; b < batches.size(); b++) {
    int64_t longest = 0;
    for (int64_t i : batches[b]) longest = std::max(longest, lengths[size_t(i)]);
    const int64_t padded = int64_t(batches[b].size()) * longest;
    if (padded > best_tokens) best = int64_t(b), best_tokens = padded;
  }
  return best;
}

BatchOrder::BatchOrder(int64_t num_batches, uint64_t seed, int64_t most_padded) : most_padded_(most_padded) {
  ENGINE_CHECK(num_batches >= 1, "translation data: no batch can be made (every sentence is longer than the token "
               "budget?)");
  ENGINE_CHECK(most_padded >= 0 && most_padded < num_batches, "translation data: most padded batch ", most_padded,
               " is not one of the ", num_batches, " batches");
  shuffled_.resize(size_t(num_batches));
  std::iota(shuffled_.begin(), shuffled_.end(), 0);
  std::mt19937_64 rng(seed * 1000003ull + 7);
  for (size_t i = shuffled_.size(); i > 1; i--) std::swap(shuffled_[i - 1], shuffled_[size_t(rng() % i)]);
}

int64_t BatchOrder::batch_for(int64_t data_step, int64_t parts) const {
  const int64_t P = std::max<int64_t>(parts, 1), step = (data_step - 1) / P + 1, part = (data_step - 1) % P;
  if (step <= 2) return 0;
  if (step == 3) return most_padded_;
  const int64_t n = int64_t(shuffled_.size()), stretch = (n + P - 1) / P;
  return shuffled_[size_t((step - 3 + part * stretch) % n)];
}

std::vector<int64_t> BatchOrder::epoch_steps() const {
  std::vector<int64_t> steps;
  for (int64_t k = 4; k < 4 + int64_t(shuffled_.size()); k++) steps.push_back(k);
  return steps;
}

std::string describe_translation_batch(const TranslationBatch& b, int64_t index, int64_t count) {
  return engine::str("batch ", index, " of ", count, ": ", b.batch, " sentences, source ", b.src_len, " and target ",
                     b.tgt_len, " tokens");
}

TokenBatches batch_pairs_by_tokens(const std::vector<SentencePair>& pairs, int64_t tokens, uint64_t seed,
                                   const std::string& model) {
  std::vector<int64_t> lengths;
  for (const auto& p : pairs) lengths.push_back(pair_length(p));
  TokenBatches t;
  t.batches = batch_by_tokens(lengths, tokens);
  size_t kept = 0;
  for (const auto& b : t.batches) kept += b.size();
  if (kept < pairs.size())
    t.note = engine::str(" (", pairs.size() - kept, " longer than --tokens ", tokens, " left out)");
  ENGINE_CHECK(!t.batches.empty(), model, ": no sentence fits --tokens ", tokens);
  t.order = std::make_unique<BatchOrder>(int64_t(t.batches.size()), seed, most_padded_batch(t.batches, lengths));
  return t;
}

TokenBatchedCorpus::TokenBatchedCorpus(const CorpusOptions& o) {
  if (o.data.empty()) {
    const int64_t words = o.words > 0 ? o.words : o.vocab - TranslationIds::first_word;
    ENGINE_CHECK(TranslationIds::first_word + words <= o.vocab, o.model, ": ", words,
                 " synthetic words need a vocabulary of ", TranslationIds::first_word + words);
    pairs_ = synthetic_reversal_pairs(o.pairs, words, o.lengths, o.seed);
    description_ = engine::str("synthetic reversal pairs: ", pairs_.size(), " sentences of ", words,
                               " words, lengths ~ ", o.lengths.median, " x exp(", o.lengths.spread, " N(0,1)) in [",
                               o.lengths.min_len, ", ", o.lengths.max_len, "]");
  } else {
    ParallelCorpus corpus = read_parallel_corpus(o.data);
    ENGINE_CHECK(corpus.vocab_size <= o.vocab, o.model, ": the vocabulary of ", o.data, " has ", corpus.vocab_size,
                 " tokens; the model's has ", o.vocab);
    pairs_ = std::move(corpus.pairs);
    description_ = corpus.describe;
  }
  TokenBatches batching = batch_pairs_by_tokens(pairs_, o.tokens, o.seed, o.model);
  batches_ = std::move(batching.batches);
  order_ = std::move(batching.order);
  description_ += batching.note;
}

TranslationBatch TokenBatchedCorpus::batch(int64_t data_step, int64_t parts) const {
  return make_translation_batch(pairs_, batches_[size_t(order_->batch_for(data_step, parts))]);
}

std::string TokenBatchedCorpus::describe_batch(int64_t data_step, int64_t parts) const {
  return describe_translation_batch(batch(data_step, parts), order_->batch_for(data_step, parts), num_batches());
}

// ---------------------------------------------------------------------------------------------------
// Noise

Sentence add_noise(const Sentence& s, const NoiseOptions& o, std::mt19937_64& rng) {
  const size_t n = s.size();
  // shuffle: stable sort of positions by i + U(0, k)
  std::vector<double> score(n);
  for (size_t i = 0; i < n; i++) score[i] = double(i) + (o.shuffle_k > 0 ? o.shuffle_k * uniform_open(rng) : 0.0);
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), size_t(0));
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return score[a] < score[b]; });
  Sentence shuffled;
  for (size_t i : order) shuffled.push_back(s[i]);
  // drop, keeping at least one word
  Sentence kept;
  for (int64_t w : shuffled)
    if (uniform_open(rng) >= o.p_drop) kept.push_back(w);
  if (kept.empty() && !shuffled.empty()) kept.push_back(shuffled[size_t(rng() % shuffled.size())]);
  // blank
  for (int64_t& w : kept)
    if (uniform_open(rng) < o.p_blank) w = TranslationIds::mask;
  return kept;
}

// ---------------------------------------------------------------------------------------------------
// Padded batches

int64_t pair_length(const SentencePair& p) { return int64_t(std::max(p.src.size(), p.tgt.size())) + 1; }

TranslationBatch make_translation_batch(const std::vector<const Sentence*>& src,
                                        const std::vector<const Sentence*>& tgt, int64_t min_src_len) {
  ENGINE_CHECK(!src.empty() && src.size() == tgt.size(), "make_translation_batch: ", src.size(), " sources and ",
               tgt.size(), " targets");
  using Ids = TranslationIds;
  TranslationBatch b;
  b.batch = int64_t(src.size());
  b.src_len = min_src_len;
  for (size_t i = 0; i < src.size(); i++) {
    b.src_len = std::max(b.src_len, int64_t(src[i]->size()) + 1);
    b.tgt_len = std::max(b.tgt_len, int64_t(tgt[i]->size()) + 1);
  }
  int64_t B = b.batch, S = b.src_len, T = b.tgt_len;
  b.src.assign(size_t(B * S), Ids::pad);
  b.src_padding.assign(size_t(B * S), 1);
  b.prev_output.assign(size_t(B * T), Ids::pad);
  b.target.assign(size_t(B * T), Ids::pad);
  for (int64_t r = 0; r < B; r++) {
    const Sentence& s = *src[size_t(r)];
    const Sentence& t = *tgt[size_t(r)];
    for (size_t j = 0; j <= s.size(); j++) {
      b.src[size_t(r * S) + j] = j < s.size() ? s[j] : Ids::eos;
      b.src_padding[size_t(r * S) + j] = 0;
    }
    b.prev_output[size_t(r * T)] = Ids::eos;
    for (size_t j = 0; j < t.size(); j++) {
      b.prev_output[size_t(r * T) + j + 1] = t[j];
      b.target[size_t(r * T) + j] = t[j];
    }
    b.target[size_t(r * T) + t.size()] = Ids::eos;
    b.target_tokens += int64_t(t.size()) + 1;
  }
  return b;
}

TranslationBatch make_translation_batch(const std::vector<SentencePair>& pairs, const std::vector<int64_t>& indices) {
  std::vector<const Sentence*> src, tgt;
  for (int64_t i : indices) {
    src.push_back(&pairs[size_t(i)].src);
    tgt.push_back(&pairs[size_t(i)].tgt);
  }
  return make_translation_batch(src, tgt);
}

}  // namespace models::data
