// masked_lm.cpp: passage sources and BERT's masking.
#include "models/data/masked_lm.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "engine/checked.h"
#include "engine/error.h"
#include "engine/io.h"
#include "models/data/wordpiece.h"

namespace models::data {

int64_t draw_index(std::mt19937_64& rng, int64_t n) { return int64_t(rng() % uint64_t(n)); }
double draw_uniform(std::mt19937_64& rng) { return double(rng() >> 11) * 0x1.0p-53; }

int64_t masked_count(int64_t seq) { return std::max<int64_t>(1, std::llround(0.15 * double(seq))); }

// ---------------------------------------------------------------------------------------------------
// Sources

ByteFileSource::ByteFileSource(const std::string& path, int64_t min_bytes)
    : path_(path), bytes_(engine::read_file(path, "byte data file", 8 * engine::kGiB)) {
  ENGINE_CHECK(int64_t(bytes_.size()) >= min_bytes, "byte data file '", path, "': ", bytes_.size(),
               " bytes; a sequence pair needs at least ", min_bytes, " (use a larger file or a smaller --seq)");
}

void ByteFileSource::sample_pair(std::mt19937_64& rng, int64_t len_a, int64_t len_b, bool is_next,
                                 std::vector<int64_t>& a, std::vector<int64_t>& b) const {
  int64_t size = int64_t(bytes_.size());
  int64_t start_a = draw_index(rng, size - (len_a + len_b) + 1);
  int64_t start_b = is_next ? start_a + len_a : draw_index(rng, size - len_b + 1);
  a.resize(size_t(len_a));
  b.resize(size_t(len_b));
  for (int64_t i = 0; i < len_a; i++)
    a[size_t(i)] = ByteTokenizer::id_of_byte(static_cast<uint8_t>(bytes_[size_t(start_a + i)]));
  for (int64_t i = 0; i < len_b; i++)
    b[size_t(i)] = ByteTokenizer::id_of_byte(static_cast<uint8_t>(bytes_[size_t(start_b + i)]));
}

std::string ByteFileSource::describe() const {
  return engine::str("bytes of '", path_, "' (", bytes_.size(), " bytes, byte-level vocabulary)");
}

ProgressionSource::ProgressionSource(int64_t first_word, int64_t num_words, int64_t offsets, int64_t max_step)
    : first_word_(first_word), num_words_(num_words), offsets_(offsets), max_step_(max_step) {
  ENGINE_CHECK(offsets >= 1 && offsets <= num_words && max_step >= 1 && max_step < num_words, "ProgressionSource: ",
               num_words, " words cannot hold ", offsets, " offsets and steps up to ", max_step);
}

void ProgressionSource::sample_pair(std::mt19937_64& rng, int64_t len_a, int64_t len_b, bool is_next,
                                    std::vector<int64_t>& a, std::vector<int64_t>& b) const {
  // word i of a passage that starts at index `from` of the pair: first + (o + (from + i) k) mod R
  auto fill = [this, &rng](std::vector<int64_t>& out, int64_t n, int64_t from, int64_t o, int64_t k) {
    out.resize(size_t(n));
    for (int64_t i = 0; i < n; i++) out[size_t(i)] = first_word_ + (o + (from + i) * k) % num_words_;
  };
  int64_t o = draw_index(rng, offsets_), k = 1 + draw_index(rng, max_step_);
  fill(a, len_a, 0, o, k);
  if (!is_next) {
    int64_t o2 = draw_index(rng, offsets_), k2 = 1 + draw_index(rng, max_step_);
    if (o2 == o && k2 == k) k2 = 1 + k % max_step_;  // a different progression
    o = o2, k = k2;
  }
  fill(b, len_b, len_a, o, k);
}

std::string ProgressionSource::describe() const {
  return engine::str("synthetic progressions over ", num_words_, " word ids (", offsets_, " offsets, steps 1..",
                     max_step_, ")");
}

// ---------------------------------------------------------------------------------------------------
// Masking

void mask_row(int64_t* row, std::vector<int64_t> candidates, int64_t count, const MaskingIds& ids,
              std::mt19937_64& rng, int64_t row_offset, std::vector<int64_t>& positions,
              std::vector<int64_t>& labels) {
  ENGINE_CHECK(count <= int64_t(candidates.size()), "mask_row: ", count, " positions to mask among ",
               candidates.size(), " candidates");
  for (int64_t i = int64_t(candidates.size()) - 1; i > 0; i--)  // Fisher-Yates, as rng.shuffle
    std::swap(candidates[size_t(i)], candidates[size_t(draw_index(rng, i + 1))]);
  std::vector<std::pair<int64_t, int64_t>> chosen;  // (position, original token)
  for (int64_t i = 0; i < count; i++) {
    int64_t p = candidates[size_t(i)];
    chosen.emplace_back(p, row[p]);
    if (draw_uniform(rng) < 0.8) {
      row[p] = ids.mask;
    } else if (draw_uniform(rng) >= 0.5) {  // else (10%) the token stays
      row[p] = ids.first_word + draw_index(rng, ids.end_word - ids.first_word);
    }
  }
  std::sort(chosen.begin(), chosen.end());
  for (const auto& [p, token] : chosen) {
    positions.push_back(row_offset + p);
    labels.push_back(token);
  }
}

MaskedLmBatch make_masked_lm_batch(const PassageSource& source, const MaskingIds& ids, int64_t batch, int64_t seq,
                                   std::mt19937_64& rng) {
  ENGINE_CHECK(seq >= kMinMaskedLmSeq, "masked LM: --seq ", seq, " is too short for [CLS] A [SEP] B [SEP] (at least ",
               kMinMaskedLmSeq, ")");
  MaskedLmBatch out;
  out.batch = batch;
  out.seq = seq;
  out.masked_per_seq = masked_count(seq);
  ENGINE_CHECK(batch >= 1, "masked LM: the batch must hold at least one sequence, got ", batch);
  const int64_t tokens = engine::checked_mul(batch, seq, "masked LM: batch x seq");
  out.ids.assign(size_t(tokens), ids.pad);
  out.token_types.assign(size_t(tokens), 0);
  int64_t content = seq - 3;  // tokens of A and B together
  std::vector<int64_t> a, b;
  for (int64_t r = 0; r < batch; r++) {
    int64_t len_a = 1 + draw_index(rng, content - 1), len_b = content - len_a;
    bool is_next = draw_index(rng, 2) == 0;
    source.sample_pair(rng, len_a, len_b, is_next, a, b);
    int64_t* row = out.ids.data() + r * seq;
    int64_t* types = out.token_types.data() + r * seq;
    std::vector<int64_t> candidates;  // every position but [CLS] and the two [SEP]
    int64_t t = 0;
    row[t++] = ids.cls;
    for (int64_t x : a) candidates.push_back(t), row[t++] = x;
    row[t++] = ids.sep;
    for (int64_t x : b) candidates.push_back(t), types[t] = 1, row[t++] = x;
    types[t] = 1;
    row[t++] = ids.sep;
    mask_row(row, candidates, out.masked_per_seq, ids, rng, r * seq, out.masked_positions, out.masked_labels);
    out.next_sentence_labels.push_back(is_next ? 0 : 1);
  }
  return out;
}

}  // namespace models::data
