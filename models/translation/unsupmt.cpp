// unsupmt.cpp: the XLM recipe, monolingual data, and the AE + BT training step.
#include "models/translation/unsupmt.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "engine/rng.h"
#include "models/translation/generate.h"
#include "ops/loss.h"
#include "ops/view.h"

namespace models::translation {

using data::TranslationIds;

namespace {


std::vector<int64_t> sentence_lengths(const std::vector<data::Sentence>& s) {
  std::vector<int64_t> lengths;
  for (const auto& x : s) lengths.push_back(int64_t(x.size()) + 1);  // + EOS
  return lengths;
}

}  // namespace

UnsupMTRecipe UnsupMTRecipe::from(const ModelConfig& c) {
  UnsupMTRecipe r;
  std::string size = c.size.empty() ? "big" : c.size;
  Seq2SeqConfig& n = r.net;
  n.activation = "gelu";
  n.layer_norm_eps = 1e-12;
  n.learned_positions = true;
  n.scale_embeddings = false;
  n.layernorm_embedding = true;
  n.languages = 2;
  n.share_all_embeddings = false;
  n.output_bias = true;
  n.xavier_init = false;  // XLM keeps PyTorch's default Linear init
  if (size == "big") {
    n.vocab = 64000;
    n.dim = 1024;
    n.heads = 8;
    n.encoder_layers = n.decoder_layers = 6;
    n.ffn = 4096;
    n.max_positions = 512;
    n.dropout = n.attention_dropout = 0.1;
  } else if (size == "tiny") {
    r.synthetic_words = 16;
    n.use_tiny_shape(r.synthetic_words);
    r.ae_tokens = 128;
    r.bt_sentences = 8;
    r.lengths = {4.5, 0.3, 3, 6};
    r.synthetic_sentences = 512;
    r.lr = 2e-3;
    r.warmup = 20;
    r.warmup_init_lr = -1;
  } else {
    throw engine::Error(engine::str("unsupmt: unknown --size '", size, "': expected big or tiny"));
  }
  ENGINE_CHECK(c.batch == 0,
               "unsupmt batches by tokens: give --tokens N for the auto-encoding batches "
               "(back-translation batches are ",
               r.bt_sentences, " sentences), not --batch");
  if (c.tokens) r.ae_tokens = c.tokens;
  n.apply_flags(c, "unsupmt");
  r.data = c.data;
  r.seed = c.seed;
  r.lengths.max_len = std::max<int64_t>(0, std::min(r.lengths.max_len, r.ae_tokens - 1));
  r.lengths.min_len = std::min(r.lengths.min_len, r.lengths.max_len);
  return r;
}

const std::array<UnsupMT::Task, 4>& UnsupMT::tasks() {
  static const std::array<Task, 4> t = {{{"ae_en", false, 0, 0},
                                         {"ae_fr", false, 1, 1},
                                         {"bt_en_fr_en", true, 0, 1},
                                         {"bt_fr_en_fr", true, 1, 0}}};
  return t;
}

// ---------------------------------------------------------------------------------------------------
UnsupMT::UnsupMT(const ModelConfig& c) : UnsupMT(UnsupMTRecipe::from(c)) {}

UnsupMT::UnsupMT(const UnsupMTRecipe& r) : recipe_(r) {
  if (recipe_.data.empty()) {
    int64_t words =
        recipe_.synthetic_words > 0 ? recipe_.synthetic_words : recipe_.net.vocab - TranslationIds::first_word;
    for (int64_t l = 0; l < 2; l++)
      mono_[size_t(l)] = data::synthetic_sentences(recipe_.synthetic_sentences, words, recipe_.lengths,
                                                   recipe_.seed * 2 + uint64_t(l));
    data_description_ = engine::str("synthetic monolingual en and fr: ", recipe_.synthetic_sentences,
                                    " sentences each of ", words, " words, lengths ~ ", recipe_.lengths.median,
                                    " x exp(", recipe_.lengths.spread, " N(0,1)) in [", recipe_.lengths.min_len, ", ",
                                    recipe_.lengths.max_len, "]");
  } else {
    data::ParallelCorpus corpus = data::read_parallel_corpus(recipe_.data);
    ENGINE_CHECK(corpus.vocab_size <= recipe_.net.vocab, "unsupmt: the vocabulary of ", recipe_.data, " has ",
                 corpus.vocab_size, " tokens; the model has ", recipe_.net.vocab);
    for (auto& p : corpus.pairs) {
      mono_[0].push_back(std::move(p.src));
      mono_[1].push_back(std::move(p.tgt));
    }
    data_description_ = corpus.describe + " (read as monolingual en = .src, fr = .tgt)";
  }
  for (size_t l = 0; l < 2; l++) {
    std::vector<int64_t> lengths = sentence_lengths(mono_[l]);
    ae_batches_[l] = data::batch_by_tokens(lengths, recipe_.ae_tokens);
    bt_batches_[l] = data::batch_by_count(lengths, recipe_.bt_sentences);
    ae_order_[l] = std::make_unique<data::BatchOrder>(int64_t(ae_batches_[l].size()), recipe_.seed + l);
    bt_order_[l] = std::make_unique<data::BatchOrder>(int64_t(bt_batches_[l].size()), recipe_.seed + 2 + l);
  }
  engine::manual_seed(recipe_.seed);
  net_ = std::make_shared<Seq2Seq>(recipe_.net);
  net_->tag_memory();
  ops::AdamOptions o;
  o.lr = recipe_.lr;
  o.beta1 = recipe_.beta1;
  o.beta2 = recipe_.beta2;
  o.eps = recipe_.adam_eps;
  optimizer_ = std::make_unique<ops::Adam>(net_->named_parameters(), o);
  schedule_ = std::make_unique<ops::InverseSqrt>(recipe_.lr, recipe_.warmup, recipe_.warmup_init_lr);
}

std::string UnsupMT::summary() const {
  const Seq2SeqConfig& n = recipe_.net;
  return engine::str("unsupmt (XLM unsupervised MT en-fr): ", n.encoder_layers, "+", n.decoder_layers, " layers, emb ",
                     n.dim, ", ", n.heads, " heads, ffn ", n.ffn, ", GELU, vocab ", n.vocab, ", ", n.max_positions,
                     " learned positions, 2 languages | a step: AE en, AE fr (--tokens ", recipe_.ae_tokens,
                     "), BT en-fr-en, BT fr-en-fr (", recipe_.bt_sentences,
                     " sentences, greedy with a KV cache) | attention ", ops::attention_algo_name(n.algo),
                     n.recompute_layers ? ", recompute layer" : "", " | data: ", data_description_);
}

data::TranslationBatch UnsupMT::bt_host_batch(int64_t lang, int64_t step) const {
  const auto& batch = bt_batches_[size_t(lang)][size_t(bt_order_[size_t(lang)]->batch_for(step, parts()))];
  std::vector<const data::Sentence*> x;
  for (int64_t i : batch) x.push_back(&mono_[size_t(lang)][size_t(i)]);
  return data::make_translation_batch(x, x);
}

Batch UnsupMT::make_batch(int64_t step) {
  const Task& t = *task_;
  const size_t l = size_t(t.lang);
  if (t.back_translation) {
    // The clean sentences x; loss() translates them and trains on the reverse pair.
    const auto& batch = bt_batches_[l][size_t(bt_order_[l]->batch_for(step, parts()))];
    bt_x_.clear();
    for (int64_t i : batch) bt_x_.push_back(mono_[l][size_t(i)]);
    Batch b = translation_tensors(bt_host_batch(t.lang, step));
    return {{"src", b.at("src")}, {"src_padding_mask", b.at("src_padding_mask")}};
  }
  // Auto-encoding: noised -> clean, the noise drawn from (seed, step, language).
  const auto& batch = ae_batches_[l][size_t(ae_order_[l]->batch_for(step, parts()))];
  std::mt19937_64 rng(recipe_.seed * 1000003ull + uint64_t(step) * 2 + l);
  std::vector<data::Sentence> noised;
  std::vector<const data::Sentence*> src, tgt;
  for (int64_t i : batch) noised.push_back(data::add_noise(mono_[l][size_t(i)], recipe_.noise, rng));
  for (size_t k = 0; k < batch.size(); k++) {
    src.push_back(&noised[k]);
    tgt.push_back(&mono_[l][size_t(batch[k])]);
  }
  data::TranslationBatch hb = data::make_translation_batch(src, tgt);
  target_tokens_ = hb.target_tokens;
  return translation_tensors(hb);
}

Tensor UnsupMT::loss(const Batch& batch) {
  const Task& t = *task_;
  Batch train = batch;
  int64_t src_lang = t.lang, tgt_lang = t.lang;
  if (t.back_translation) {
    // x (lang) -> y (other) greedily, no grad, eval mode, phase `generate`; then train y (other) -> x (lang).
    GreedyOptions o;
    o.max_len = generation_max_len(batch.at("src").size(1), recipe_.net.max_positions);
    o.src_lang = t.lang;
    o.tgt_lang = t.other;
    o.stop_when_done = false;  // fixed shapes: the allocations do not depend on the generated tokens
    GreedyOutput y = greedy_decode(*net_, batch.at("src"), batch.at("src_padding_mask"), o);
    std::vector<const data::Sentence*> src, tgt;
    for (size_t k = 0; k < bt_x_.size(); k++) {
      src.push_back(&y.sentences[k]);
      tgt.push_back(&bt_x_[k]);
    }
    // Sources padded to max_len + 1 (a sentence without EOS, plus EOS): the same shapes whatever was generated.
    data::TranslationBatch hb = data::make_translation_batch(src, tgt, o.max_len + 1);
    target_tokens_ = hb.target_tokens;
    engine::CategoryScope input(engine::Category::input);
    train = translation_tensors(hb);
    src_lang = t.other;
  }
  Tensor logits = net_->forward(train.at("src"), train.at("src_padding_mask"), train.at("prev_output"), src_lang,
                                tgt_lang);  // [B, T, V]
  engine::MemoryScope s("loss");
  return ops::cross_entropy(ops::reshape(logits, {-1, recipe_.net.vocab}), train.at("target"), TranslationIds::pad);
}

StepResult UnsupMT::train_step(int64_t step) {
  StepResult r;
  double sum = 0;
  for (const Task& t : tasks()) {
    task_ = &t;
    StepResult sub = Model::train_step(step);
    r.losses[t.name] = sub.loss;
    r.items += sub.items;
    sum += sub.loss;
    for (auto& d : sub.details) r.details.push_back(t.name + ": " + d);
  }
  task_ = nullptr;
  bt_x_.clear();
  r.loss = sum / double(tasks().size());
  return r;
}

StepResult UnsupMT::eval_step(int64_t step) { return decode_batch_step(*net_, bt_host_batch(0, step), 0, 1); }

std::vector<int64_t> UnsupMT::epoch_steps() const {
  size_t n = 0;
  for (size_t l = 0; l < 2; l++) n = std::max({n, ae_batches_[l].size(), bt_batches_[l].size()});
  std::vector<int64_t> steps;
  for (int64_t k = 4; k < 4 + int64_t(n); k++) steps.push_back(k);
  return steps;
}

std::string UnsupMT::describe_batch(int64_t step) const {
  const int64_t d = data_step(step);  // this rank's first micro-batch of optimizer step `step`
  std::string s;
  const char* lang[] = {"en", "fr"};
  for (size_t l = 0; l < 2; l++) {
    const auto& ae = ae_batches_[l][size_t(ae_order_[l]->batch_for(d, parts()))];
    const auto& bt = bt_batches_[l][size_t(bt_order_[l]->batch_for(d, parts()))];
    int64_t ae_longest = 0, bt_longest = 0;
    for (int64_t i : ae) ae_longest = std::max<int64_t>(ae_longest, int64_t(mono_[l][size_t(i)].size()) + 1);
    for (int64_t i : bt) bt_longest = std::max<int64_t>(bt_longest, int64_t(mono_[l][size_t(i)].size()) + 1);
    s += engine::str(l ? "; " : "", lang[l], ": auto-encoding batch ", ae_order_[l]->batch_for(d, parts()), " of ",
                     ae_batches_[l].size(), " (", ae.size(), " sentences of up to ", ae_longest,
                     " tokens), back-translation batch ", bt_order_[l]->batch_for(d, parts()), " of ",
                     bt_batches_[l].size(), " (", bt.size(), " of up to ", bt_longest, ")");
  }
  return s;
}

}  // namespace models::translation
