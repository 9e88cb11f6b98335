// convs2s.cpp: the recipe, the data pipeline (pool -> buckets -> order, shared with transformer_big), the
// training loss and greedy decoding.
#include "models/convs2s/convs2s.h"

#include <algorithm>

#include "engine/format.h"
#include "engine/rng.h"
#include "graph/autograd.h"
#include "models/translation/generate.h"
#include "ops/factory.h"
#include "ops/loss.h"
#include "ops/reduce.h"
#include "ops/view.h"

namespace models::convs2s {

using data::TranslationIds;

Convs2sRecipe Convs2sRecipe::from(const ModelConfig& c) {
  Convs2sRecipe r;
  std::string size = c.size.empty() ? "wmt" : c.size;
  FConvConfig& n = r.net;
  if (size == "wmt") {
    n.src_vocab = n.tgt_vocab = 40000;
    n.embed_dim = 768;
    n.out_embed_dim = 512;
    n.layers = FConvConfig::wmt_en_de_layers();
    n.dropout = 0.2;
  } else if (size == "tiny") {
    // A 16-word reversal task: 3 + 3 layers of width 32/48 (a projection and a 1-wide kernel included).
    r.synthetic_words = 16;
    n.src_vocab = n.tgt_vocab = TranslationIds::first_word + r.synthetic_words;
    n.embed_dim = 32;
    n.out_embed_dim = 32;
    n.max_positions = 64;
    n.layers = {{32, 3}, {48, 3}, {48, 1}};
    n.dropout = 0.0;
    r.tokens = 256;
    r.lengths = {5, 0.3, 3, 8};
    r.synthetic_pairs = 2048;
  } else {
    throw engine::Error(engine::str("convs2s: unknown --size '", size, "': expected wmt or tiny"));
  }
  ENGINE_CHECK(c.batch == 0,
               "convs2s batches by tokens: give --tokens N (sentences x longest length <= N), not --batch");
  ENGINE_CHECK(c.recompute == "none", "convs2s: --recompute ", c.recompute, " is not supported");
  // The shortest pair is one word + EOS: a smaller budget (the max-batch finder starts at 1) runs that pair.
  if (c.tokens) r.tokens = std::max<int64_t>(c.tokens, 2);
  r.data = c.data;
  r.seed = c.seed;
  // Every budget makes a batch, and every sentence fits the learned positions (2 .. max_positions - 1).
  r.lengths.max_len = std::max<int64_t>(1, std::min({r.lengths.max_len, r.tokens - 1, n.max_positions - 3}));
  r.lengths.min_len = std::min(r.lengths.min_len, r.lengths.max_len);
  return r;
}

// ---------------------------------------------------------------------------------------------------
Convs2s::Convs2s(const ModelConfig& c) : Convs2s(Convs2sRecipe::from(c)) {}

Convs2s::Convs2s(const Convs2sRecipe& r) : recipe_(r) {
  const FConvConfig& n = recipe_.net;
  corpus_ = std::make_unique<data::TokenBatchedCorpus>(
      data::CorpusOptions{"convs2s", recipe_.data, std::min(n.src_vocab, n.tgt_vocab), recipe_.synthetic_pairs,
                          recipe_.synthetic_words, recipe_.lengths, recipe_.tokens, recipe_.seed});
  for (const auto& p : corpus_->pairs()) {
    const int64_t len = data::pair_length(p);
    ENGINE_CHECK(len + n.padding_idx < n.max_positions, "convs2s: a sentence of ", len, " tokens exceeds the ",
                 n.max_positions - n.padding_idx - 1, " learned positions");
  }

  engine::manual_seed(recipe_.seed);
  net_ = std::make_shared<FConvModel>(n);
  net_->tag_memory();
  ops::SgdOptions o;  // fairseq's NAG
  o.lr = recipe_.lr;
  o.momentum = recipe_.momentum;
  o.nesterov = true;
  optimizer_ = std::make_unique<ops::Sgd>(net_->named_parameters(), o);
  clip_norm_ = recipe_.clip_norm;
}

std::string Convs2s::summary() const {
  const FConvConfig& n = recipe_.net;
  std::string layers;
  for (size_t i = 0; i < n.layers.size();) {
    size_t j = i;
    while (j < n.layers.size() && n.layers[j] == n.layers[i]) j++;
    layers +=
        engine::str(layers.empty() ? "" : " + ", "[(", n.layers[i].first, ", ", n.layers[i].second, ")] x ", j - i);
    i = j;
  }
  return engine::str("convs2s (fairseq fconv_wmt_en_de): ", n.layers.size(), "+", n.layers.size(), " layers ", layers,
                     ", embed ", n.embed_dim, ", out-embed ", n.out_embed_dim, ", vocab ", n.src_vocab, "/",
                     n.tgt_vocab, ", dropout ", n.dropout, ", NAG lr ", recipe_.lr, " momentum ", recipe_.momentum,
                     ", clip ", recipe_.clip_norm, ", --tokens ", recipe_.tokens, " (", corpus_->num_batches(),
                     " batches) | data: ", corpus_->description());
}

data::TranslationBatch Convs2s::host_batch(int64_t step) const { return corpus_->batch(step, parts()); }

Batch Convs2s::batch_tensors(const data::TranslationBatch& b, int64_t padding_idx) {
  auto dev = engine::default_device();
  using engine::DType;
  return {{"src", ops::from_vector(b.src, {b.batch, b.src_len}, DType::i64, dev)},
          {"src_positions", ops::from_vector(fairseq_positions(b.src, b.batch, b.src_len, padding_idx),
                                             {b.batch, b.src_len}, DType::i64, dev)},
          {"src_padding_mask", ops::from_vector(b.src_padding, {b.batch, b.src_len}, DType::boolean, dev)},
          {"prev_output", ops::from_vector(b.prev_output, {b.batch, b.tgt_len}, DType::i64, dev)},
          {"tgt_positions", ops::from_vector(fairseq_positions(b.prev_output, b.batch, b.tgt_len, padding_idx),
                                             {b.batch, b.tgt_len}, DType::i64, dev)},
          {"target", ops::from_vector(b.target, {b.batch * b.tgt_len}, DType::i64, dev)}};
}

Batch Convs2s::make_batch(int64_t step) {
  data::TranslationBatch b = host_batch(step);
  last_target_tokens_ = b.target_tokens;
  return batch_tensors(b, recipe_.net.padding_idx);
}

Tensor Convs2s::loss(const Batch& batch) {
  Tensor logits = net_->forward(batch.at("src"), batch.at("src_positions"), batch.at("src_padding_mask"),
                                batch.at("prev_output"), batch.at("tgt_positions"));  // [B, T, V]
  engine::MemoryScope s("loss");
  return ops::cross_entropy(ops::reshape(logits, {-1, recipe_.net.tgt_vocab}), batch.at("target"), TranslationIds::pad,
                            recipe_.label_smoothing);
}

// ---------------------------------------------------------------------------------------------------
GreedyResult greedy_decode(FConvModel& net, const Tensor& src, const Tensor& src_positions,
                           const Tensor& src_padding_mask, int64_t max_len, bool incremental) {
  const bool was_training = net.training();
  net.eval();
  graph::NoGrad ng;
  engine::PhaseScope phase(engine::Phase::generate);
  const int64_t B = src.size(0), pad = net.config.padding_idx;
  FConvEncoder::Output enc = net.encoder->forward(src, src_positions, src_padding_mask);
  IncrementalState state;
  if (incremental) state = net.decoder->start_incremental(enc, src_padding_mask);
  std::vector<int64_t> prefix(static_cast<size_t>(B), TranslationIds::eos);  // [B, T] row-major, from </s>
  GreedyResult r;
  r.sentences.resize(size_t(B));
  std::vector<bool> done(static_cast<size_t>(B), false);
  for (int64_t T = 1; T <= max_len; T++) {
    Tensor logits;  // [B, V]: the newest position's
    if (incremental) {
      std::vector<int64_t> newest(static_cast<size_t>(B)),
          position(static_cast<size_t>(B), pad + T);  // fairseq_positions of column T - 1
      for (int64_t b = 0; b < B; b++) newest[size_t(b)] = prefix[size_t(b * T + T - 1)];
      Tensor tokens, positions;
      {
        engine::CategoryScope input(engine::Category::input);
        tokens = ops::from_vector(newest, {B, 1}, engine::DType::i64, src.device_ptr());
        positions = ops::from_vector(position, {B, 1}, engine::DType::i64, src.device_ptr());
      }
      logits = net.decoder->step(tokens, positions, enc, src_padding_mask, state);
    } else {
      Tensor prev, positions;
      {
        engine::CategoryScope input(engine::Category::input);
        prev = ops::from_vector(prefix, {B, T}, engine::DType::i64, src.device_ptr());
        std::vector<int64_t> pos(prefix.size());
        for (size_t i = 0; i < pos.size(); i++) pos[i] = pad + 1 + int64_t(i) % T;
        positions = ops::from_vector(pos, {B, T}, engine::DType::i64, src.device_ptr());
      }
      logits = ops::select(net.decoder->forward(prev, positions, enc, src_padding_mask), 1, T - 1);
    }
    std::vector<double> next = ops::argmax(logits, -1).to_double();
    std::vector<int64_t> grown;
    bool all_done = true;
    for (int64_t b = 0; b < B; b++) {
      const int64_t token = int64_t(next[size_t(b)]);
      if (!done[size_t(b)]) {
        r.generated_tokens++;
        if (token == TranslationIds::eos) done[size_t(b)] = true;
        else r.sentences[size_t(b)].push_back(token);
      }
      all_done = all_done && done[size_t(b)];
      grown.insert(grown.end(), prefix.begin() + b * T, prefix.begin() + (b + 1) * T);
      grown.push_back(token);  // finished rows keep growing: rows do not interact
    }
    prefix = std::move(grown);
    r.steps = T;
    if (all_done) break;
  }
  net.train(was_training);
  return r;
}

StepResult Convs2s::eval_step(int64_t step) {
  const data::TranslationBatch hb = host_batch(step);
  Batch batch;
  {
    engine::PhaseScope phase(engine::Phase::generate);
    engine::CategoryScope input(engine::Category::input);
    batch = batch_tensors(hb, recipe_.net.padding_idx);
  }
  const int64_t max_len =
      translation::generation_max_len(hb.src_len, recipe_.net.max_positions - recipe_.net.padding_idx - 1);
  GreedyResult g =
      greedy_decode(*net_, batch.at("src"), batch.at("src_positions"), batch.at("src_padding_mask"), max_len);
  StepResult r;
  r.has_loss = false;
  r.items = g.generated_tokens;
  int64_t state_elements = 0;  // per sentence: (K - 1) x Cin for every decoder convolution
  int64_t in = recipe_.net.layers.front().first;
  for (const auto& [channels, k] : recipe_.net.layers) {
    state_elements += (k - 1) * in;
    in = channels;
  }
  r.details.push_back(engine::str("generated ", g.generated_tokens, " tokens for ", hb.batch, " sentences of up to ",
                                  hb.src_len, " source tokens in ", g.steps, " steps (max_len ", max_len, ")"));
  r.details.push_back(
      engine::str("incremental state: the last K-1 inputs of every decoder convolution, ",
                  engine::format_bytes(size_t(hb.batch * state_elements) * engine::dtype_size(compute_dtype())),
                  " whatever the length (no per-position cache)"));
  return r;
}

}  // namespace models::convs2s
