// squad.cpp: BertForQuestionAnswering and the bert_squad model.
#include "models/bert/squad.h"

#include <random>

#include "ops/elementwise.h"
#include "ops/factory.h"
#include "ops/loss.h"
#include "ops/view.h"

namespace models::bert {

BertForQuestionAnswering::BertForQuestionAnswering(const BertConfig& c) : config(c) {
  bert = register_module("bert", std::make_shared<BertModel>(c, /*with_pooler=*/false));
  qa_outputs =
      register_module("qa_outputs", std::make_shared<nn::Linear>(c.hidden, 2, true, nn::Init::normal(c.init_std)));
}

std::pair<Tensor, Tensor> BertForQuestionAnswering::logits(const Tensor& ids, const Tensor& token_types,
                                                           const Tensor& key_padding_mask) const {
  Tensor hidden = bert->forward(ids, token_types, key_padding_mask);  // [B, T, C]
  Tensor both = qa_outputs->forward(hidden);                          // [B, T, 2]
  engine::MemoryScope s("qa_outputs");
  return {ops::contiguous(ops::select(both, 2, 0)), ops::contiguous(ops::select(both, 2, 1))};  // [B, T] each
}

Tensor BertForQuestionAnswering::loss(const Tensor& ids, const Tensor& token_types, const Tensor& key_padding_mask,
                                      const Tensor& start_positions, const Tensor& end_positions) const {
  auto [start_logits, end_logits] = logits(ids, token_types, key_padding_mask);
  engine::MemoryScope s("loss");
  int64_t ignored = ids.size(1);
  Tensor start = ops::cross_entropy(start_logits, start_positions, ignored);
  Tensor end = ops::cross_entropy(end_logits, end_positions, ignored);
  return ops::scale(ops::add(start, end), 0.5);
}

std::vector<std::string> BertForQuestionAnswering::load_hf(const std::map<std::string, Tensor>& tensors) {
  return load(tensors, true, {"bert.embeddings.position_ids"});
}

// ---------------------------------------------------------------------------------------------------
// The model

namespace {
constexpr int64_t kSquadTrainQuestions = 87599;  // SQuAD v1.1 train-v1.1.json
constexpr double kSquadEpochs = 2.0;             // the run_squad README
}  // namespace

BertRecipe BertSquad::recipe_for(const ModelConfig& c) {
  BertRecipe r;
  bool tiny = c.size == "tiny";
  r.seq = tiny ? 64 : 384;
  r.batch = tiny ? 8 : 12;
  if (c.seq) r.seq = c.seq;
  if (c.batch) r.batch = c.batch;
  r.bert = bert_config_from(c, "base", r.seq);
  r.lr = tiny ? 1e-3 : 3e-5;
  r.total_steps = int64_t(double(kSquadTrainQuestions) / double(r.batch) * kSquadEpochs);
  r.warmup = tiny ? 0 : int64_t(0.1 * double(r.total_steps));
  if (tiny) r.bert.hidden_dropout = r.bert.attention_dropout = 0.0;
  r.data = c.data;
  r.seed = c.seed;
  return r;
}

BertSquad::BertSquad(const ModelConfig& c) : BertSquad(recipe_for(c)) {}

BertSquad::BertSquad(const BertRecipe& r) : recipe_(r) {
  if (!recipe_.data.empty()) {
    tokenizer_ = data::squad_tokenizer(recipe_.data);
    if (dynamic_cast<data::WordPieceTokenizer*>(tokenizer_.get())) recipe_.bert.vocab = tokenizer_->vocab_size();
    ENGINE_CHECK(recipe_.bert.vocab >= tokenizer_->vocab_size(), "bert_squad: ", tokenizer_->describe(),
                 " needs ", tokenizer_->vocab_size(), " token ids; the model has ", recipe_.bert.vocab);
    auto examples = data::read_squad(recipe_.data, &skipped_);
    examples_ = int64_t(examples.size());
    features_ = data::squad_features(examples, *tokenizer_, data::SquadOptions::for_seq(recipe_.seq));
    ENGINE_CHECK(!features_.empty(), "bert_squad: '", recipe_.data, "' gives no training features (",
                 examples_, " usable questions, ", skipped_, " skipped)");
  }
  engine::manual_seed(recipe_.seed);
  net_ = std::make_shared<BertForQuestionAnswering>(recipe_.bert);
  net_->tag_memory();
  optimizer_ = bert_optimizer(*net_, recipe_);
  schedule_ = bert_schedule(recipe_);
  clip_norm_ = recipe_.clip_norm;
}

std::string BertSquad::summary() const {
  const BertConfig& b = recipe_.bert;
  std::string data = tokenizer_ ? engine::str("'", recipe_.data, "': ", examples_, " questions (", skipped_,
                                              " skipped), ", features_.size(), " features, ", tokenizer_->describe())
                                : std::string("synthetic spans");
  return engine::str("bert_squad (BertForQuestionAnswering): ", b.layers, " layers, hidden ", b.hidden, ", ",
                     b.heads, " heads, ffn ", b.intermediate, ", vocab ", b.vocab, ", seq ", recipe_.seq,
                     ", batch ", recipe_.batch, ", attention ", ops::attention_algo_name(b.algo),
                     b.recompute == "none" ? "" : ", recompute " + b.recompute, " | data: ", data);
}

Model::HostBatch BertSquad::make_host_batch(int64_t step) {
  std::mt19937_64 rng(recipe_.seed * 1000003ull + uint64_t(step));
  const int64_t B = recipe_.batch, T = recipe_.seq;
  auto h = std::make_shared<data::SpanBatch>();
  if (features_.empty()) {
    *h = data::synthetic_span_batch(B, T, recipe_.bert.vocab, rng);
  } else {
    for (int64_t b = 0; b < B; b++)
      data::append_feature(features_[size_t(data::draw_index(rng, int64_t(features_.size())))], T, tokenizer_->pad_id,
                           *h);
  }
  return [h, B, T]() -> Batch {
    auto dev = engine::default_device();
    return {{"ids", ops::from_vector(h->ids, {B, T}, engine::DType::i64, dev)},
            {"token_types", ops::from_vector(h->token_types, {B, T}, engine::DType::i64, dev)},
            {"key_padding_mask", ops::from_vector(h->padding, {B, T}, engine::DType::boolean, dev)},
            {"start_positions", ops::from_vector(h->start_positions, {B}, engine::DType::i64, dev)},
            {"end_positions", ops::from_vector(h->end_positions, {B}, engine::DType::i64, dev)}};
  };
}

Tensor BertSquad::loss(const Batch& batch) {
  return net_->loss(batch.at("ids"), batch.at("token_types"), batch.at("key_padding_mask"),
                    batch.at("start_positions"), batch.at("end_positions"));
}

}  // namespace models::bert
