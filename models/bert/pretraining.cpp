// pretraining.cpp: the BERT pretraining heads, the BertForPreTraining module and the bert_base model.
#include "models/bert/pretraining.h"

#include <random>

#include "ops/elementwise.h"
#include "ops/factory.h"
#include "ops/loss.h"
#include "ops/matmul.h"
#include "ops/shape.h"
#include "ops/view.h"

namespace models::bert {

BertConfig bert_config_from(const ModelConfig& c, const std::string& default_size, int64_t seq, bool tiny_grows) {
  std::string size = c.size.empty() ? default_size : c.size;
  BertConfig b = BertConfig::of_size(size);
  c.dims.apply(c.name, &b.layers, &b.hidden, &b.heads, &b.intermediate, &b.vocab, &b.max_positions, &b.hidden_dropout,
               &b.attention_dropout);
  b.positions_grow = size == "tiny" && tiny_grows && !c.dims.positions;
  if (b.positions_grow && seq > b.max_positions) b.max_positions = seq;
  ENGINE_CHECK(seq <= b.max_positions, c.name, ": --seq ", seq, " exceeds the ", b.max_positions, " learned positions",
               c.dims.positions ? " (--positions or the config's max_position_embeddings)" : " of BERT-" + size);
  b.algo = ops::attention_algo_from_name(c.attention);
  b.recompute = c.recompute;
  return b;
}

std::unique_ptr<ops::Optimizer> bert_optimizer(const graph::Module& m, const BertRecipe& r) {
  ops::AdamOptions o;
  o.lr = r.lr;
  o.beta1 = 0.9;
  o.beta2 = 0.999;
  o.eps = r.adam_eps;
  o.weight_decay = r.weight_decay;
  auto opt = std::make_unique<ops::AdamW>(m.named_parameters(), o);
  opt->exclude_from_weight_decay([](const std::string& name) {
    return name.find("bias") != std::string::npos || name.find("LayerNorm") != std::string::npos;
  });
  return opt;
}

std::unique_ptr<ops::LrSchedule> bert_schedule(const BertRecipe& r) {
  if (r.warmup <= 0) return nullptr;
  return std::make_unique<ops::LinearWarmupDecay>(r.lr, r.warmup, r.total_steps, /*tf_bert=*/true);
}

// ---------------------------------------------------------------------------------------------------
// Heads

BertPredictionHeadTransform::BertPredictionHeadTransform(const BertConfig& c) {
  dense =
      register_module("dense", std::make_shared<nn::Linear>(c.hidden, c.hidden, true, nn::Init::normal(c.init_std)));
  LayerNorm = register_module("LayerNorm", std::make_shared<nn::LayerNorm>(c.hidden, c.layer_norm_eps));
}

Tensor BertPredictionHeadTransform::forward(const Tensor& x) const {
  auto s = scope();
  return LayerNorm->forward(ops::gelu(dense->forward(x)));
}

BertLMPredictionHead::BertLMPredictionHead(const BertConfig& c) {
  transform = register_module("transform", std::make_shared<BertPredictionHeadTransform>(c));
  bias = register_parameter("bias", ops::zeros({c.vocab}));
}

Tensor BertLMPredictionHead::forward(const Tensor& x, const Tensor& decoder_weight) const {
  auto s = scope();
  Tensor h = transform->forward(x);  // [N, C]
  engine::MemoryScope d("decoder");
  return ops::linear(h, decoder_weight, bias);  // [N, V]
}

BertPreTrainingHeads::BertPreTrainingHeads(const BertConfig& c) {
  predictions = register_module("predictions", std::make_shared<BertLMPredictionHead>(c));
  seq_relationship = register_module("seq_relationship",
                                     std::make_shared<nn::Linear>(c.hidden, 2, true, nn::Init::normal(c.init_std)));
}

BertForPreTraining::BertForPreTraining(const BertConfig& c) : config(c) {
  bert = register_module("bert", std::make_shared<BertModel>(c, /*with_pooler=*/true));
  cls = register_module("cls", std::make_shared<BertPreTrainingHeads>(c));
}

BertForPreTraining::Losses BertForPreTraining::forward(const Tensor& ids, const Tensor& token_types,
                                                       const Tensor& key_padding_mask, const Tensor& masked_positions,
                                                       const Tensor& masked_labels,
                                                       const Tensor& next_sentence_labels) const {
  Tensor hidden = bert->forward(ids, token_types, key_padding_mask);  // [B, T, C]
  Losses l;
  {
    engine::MemoryScope s("cls");
    // masked LM on the gathered positions only: [B*T, C] -> [B*M, C] -> logits [B*M, V]
    Tensor flat = ops::reshape(hidden, {-1, config.hidden});
    Tensor logits = cls->predictions->forward(ops::index_select(flat, 0, masked_positions),
                                              bert->embeddings->word_embeddings->weight);
    l.mlm = ops::cross_entropy(logits, masked_labels);
    // next sentence: pooled [CLS] state [B, C] -> [B, 2]
    Tensor pooled = bert->pooler->forward(hidden);
    l.nsp = ops::cross_entropy(cls->seq_relationship->forward(pooled), next_sentence_labels);
  }
  l.total = ops::add(l.mlm, l.nsp);
  return l;
}

std::vector<std::string> BertForPreTraining::load_hf(std::map<std::string, Tensor> tensors) {
  auto alias = tensors.find("cls.predictions.decoder.bias");
  if (!tensors.count("cls.predictions.bias") && alias != tensors.end())
    tensors["cls.predictions.bias"] = alias->second;
  return load(tensors, true,
              {"cls.predictions.decoder.weight", "cls.predictions.decoder.bias", "bert.embeddings.position_ids"});
}

// ---------------------------------------------------------------------------------------------------
// The model

BertRecipe BertPretraining::recipe_for(const ModelConfig& c) {
  BertRecipe r;
  bool tiny = c.size == "tiny";
  if (tiny) {
    r.seq = 64;
    r.batch = 8;
    r.lr = 5e-3;
    r.warmup = 0;
    r.synthetic_words = 32;
    r.synthetic_offsets = 1;
    r.synthetic_max_step = 2;
  }
  if (c.seq) r.seq = c.seq;
  if (c.batch) r.batch = c.batch;
  r.bert = bert_config_from(c, "base", r.seq);
  if (tiny) r.bert.hidden_dropout = r.bert.attention_dropout = 0.0;
  r.data = c.data;
  r.seed = c.seed;
  return r;
}

BertPretraining::BertPretraining(const ModelConfig& c) : BertPretraining(recipe_for(c)) {}

BertPretraining::BertPretraining(const BertRecipe& r) : recipe_(r) {
  const BertConfig& b = recipe_.bert;
  data::ByteTokenizer bytes;  // the special ids of both data sources
  mask_ids_ = {bytes.pad_id, bytes.cls_id, bytes.sep_id, bytes.mask_id, data::ByteTokenizer::kFirstByte, 0};
  if (recipe_.data.empty()) {
    int64_t words = recipe_.synthetic_words > 0 ? recipe_.synthetic_words : b.vocab - mask_ids_.first_word;
    ENGINE_CHECK(mask_ids_.first_word + words <= b.vocab, "bert_base: ", words,
                 " synthetic words need a vocabulary of ", mask_ids_.first_word + words, " ids; it has ", b.vocab);
    int64_t offsets = recipe_.synthetic_offsets > 0 ? recipe_.synthetic_offsets : words;
    source_ =
        std::make_unique<data::ProgressionSource>(mask_ids_.first_word, words, offsets, recipe_.synthetic_max_step);
    mask_ids_.end_word = mask_ids_.first_word + words;
  } else {
    ENGINE_CHECK(b.vocab >= data::ByteTokenizer::kVocabSize, "bert_base: byte data needs ",
                 data::ByteTokenizer::kVocabSize, " token ids; the vocabulary has ", b.vocab);
    source_ = std::make_unique<data::ByteFileSource>(recipe_.data, recipe_.seq);
    mask_ids_.end_word = data::ByteTokenizer::kVocabSize;
  }
  engine::manual_seed(recipe_.seed);
  net_ = std::make_shared<BertForPreTraining>(b);
  net_->tag_memory();
  optimizer_ = bert_optimizer(*net_, recipe_);
  schedule_ = bert_schedule(recipe_);
  clip_norm_ = recipe_.clip_norm;
}

std::string BertPretraining::summary() const {
  const BertConfig& b = recipe_.bert;
  return engine::str("bert_base (BertForPreTraining): ", b.layers, " layers, hidden ", b.hidden, ", ", b.heads,
                     " heads, ffn ", b.intermediate, ", vocab ", b.vocab, ", seq ", recipe_.seq, ", batch ",
                     recipe_.batch, ", ", data::masked_count(recipe_.seq), " masked per sequence, attention ",
                     ops::attention_algo_name(b.algo), b.recompute == "none" ? "" : ", recompute " + b.recompute,
                     " | data: ", source_->describe());
}

Model::HostBatch BertPretraining::make_host_batch(int64_t step) {
  std::mt19937_64 rng(recipe_.seed * 1000003ull + uint64_t(step));
  auto h = std::make_shared<data::MaskedLmBatch>(
      data::make_masked_lm_batch(*source_, mask_ids_, recipe_.batch, recipe_.seq, rng));
  return [h]() -> Batch {
    auto dev = engine::default_device();
    const int64_t B = h->batch, T = h->seq, M = B * h->masked_per_seq;
    return {{"ids", ops::from_vector(h->ids, {B, T}, engine::DType::i64, dev)},
            {"token_types", ops::from_vector(h->token_types, {B, T}, engine::DType::i64, dev)},
            {"masked_positions", ops::from_vector(h->masked_positions, {M}, engine::DType::i64, dev)},
            {"masked_labels", ops::from_vector(h->masked_labels, {M}, engine::DType::i64, dev)},
            {"next_sentence_labels", ops::from_vector(h->next_sentence_labels, {B}, engine::DType::i64, dev)}};
  };
}

Tensor BertPretraining::loss(const Batch& batch) {
  // Every sequence fills all T positions: no padding mask.
  BertForPreTraining::Losses l =
      net_->forward(batch.at("ids"), batch.at("token_types"), Tensor(), batch.at("masked_positions"),
                    batch.at("masked_labels"), batch.at("next_sentence_labels"));
  last_mlm_ = l.mlm.detach();
  last_nsp_ = l.nsp.detach();
  return l.total;
}

StepResult BertPretraining::train_step(int64_t step) {
  StepResult r = Model::train_step(step);
  r.losses["mlm"] = last_mlm_.item();
  r.losses["nsp"] = last_nsp_.item();
  last_mlm_ = last_nsp_ = Tensor();
  return r;
}

}  // namespace models::bert
