// encoder.cpp: the BERT encoder.
#include "models/bert/encoder.h"

#include "engine/json.h"
#include "graph/autograd.h"
#include "models/nn/attention.h"
#include "ops/dropout.h"
#include "ops/elementwise.h"
#include "ops/factory.h"
#include "ops/view.h"

namespace models::bert {

BertConfig BertConfig::base() { return BertConfig(); }

BertConfig BertConfig::large() {
  BertConfig c;
  c.hidden = 1024;
  c.layers = 24;
  c.heads = 16;
  c.intermediate = 4096;
  return c;
}

BertConfig BertConfig::of_size(const std::string& size) {
  if (size == "base") return base();
  if (size == "large") return large();
  if (size == "tiny") {
    BertConfig c;
    c.vocab = 512;  // tests use small vocabularies (byte-level data needs 256 + specials)
    c.hidden = 64;
    c.layers = 2;
    c.heads = 4;
    c.intermediate = 256;
    c.max_positions = 128;
    return c;
  }
  throw engine::Error(engine::str("unknown BERT size '", size, "': expected base, large or tiny"));
}

namespace {
nn::Init weight_init(const BertConfig& c) { return nn::Init::normal(c.init_std); }
}  // namespace

// ---------------------------------------------------------------------------------------------------
BertEmbeddings::BertEmbeddings(const BertConfig& c) : config(c) {
  word_embeddings =
      register_module("word_embeddings", std::make_shared<nn::Embedding>(c.vocab, c.hidden, 0, weight_init(c)));
  position_embeddings = register_module("position_embeddings",
                                        std::make_shared<nn::Embedding>(c.max_positions, c.hidden, -1, weight_init(c)));
  token_type_embeddings = register_module("token_type_embeddings",
                                          std::make_shared<nn::Embedding>(c.type_vocab, c.hidden, -1, weight_init(c)));
  LayerNorm = register_module("LayerNorm", std::make_shared<nn::LayerNorm>(c.hidden, c.layer_norm_eps));
}

Tensor BertEmbeddings::forward(const Tensor& ids, const Tensor& token_types) const {
  auto s = scope();
  int64_t T = ids.size(1);
  ENGINE_CHECK(T <= config.max_positions, "bert: a sequence of ", T, " tokens is longer than the ",
               config.max_positions, " learned positions; use --seq ", config.max_positions, " or less");
  Tensor positions;
  {
    engine::CategoryScope input(engine::Category::input);
    positions = ops::arange(T, engine::DType::i64, ids.device_ptr());
  }
  Tensor x = ops::add(ops::add(word_embeddings->forward(ids), position_embeddings->forward(positions)),
                      token_type_embeddings->forward(token_types));  // [B, T, C]
  return ops::dropout(LayerNorm->forward(x), config.hidden_dropout, training());
}

// ---------------------------------------------------------------------------------------------------
BertSelfAttention::BertSelfAttention(const BertConfig& c) : config(c) {
  query = register_module("query", std::make_shared<nn::Linear>(c.hidden, c.hidden, true, weight_init(c)));
  key = register_module("key", std::make_shared<nn::Linear>(c.hidden, c.hidden, true, weight_init(c)));
  value = register_module("value", std::make_shared<nn::Linear>(c.hidden, c.hidden, true, weight_init(c)));
}

Tensor BertSelfAttention::forward(const Tensor& x, const Tensor& key_padding_mask) const {
  auto s = scope();
  ops::AttentionOptions opt;
  opt.algo = config.algo;
  opt.dropout_p = config.attention_dropout;
  opt.training = training();
  const bool recompute = config.recompute == "attention" && graph::grad_enabled();
  if (config.algo == ops::AttentionAlgo::flash) {
    // q, k and v from one GEMM, attended as one packed op (models/nn/attention.h says why).
    Tensor qkv = nn::stacked_linear(x, {query.get(), key.get(), value.get()});  // [B, T, 3C]
    const int64_t heads = config.heads;
    engine::MemoryScope core("core");
    Tensor o = recompute ? graph::recompute(
                               [opt, heads](const std::vector<Tensor>& in) {
                                 return ops::attention_packed(in[0], heads, in[1], opt);
                               },
                               {qkv, key_padding_mask})
                         : ops::attention_packed(qkv, heads, key_padding_mask, opt);  // [B, H, T, D]
    return nn::merge_heads(o);                                                        // [B, T, C]
  }
  Tensor q = nn::split_heads(query->forward(x), config.heads);  // [B, H, T, D]
  Tensor k = nn::split_heads(key->forward(x), config.heads);
  Tensor v = nn::split_heads(value->forward(x), config.heads);
  engine::MemoryScope core("core");
  Tensor o = recompute
                 ? graph::recompute(
                       [opt](const std::vector<Tensor>& in) { return ops::attention(in[0], in[1], in[2], in[3], opt); },
                       {q, k, v, key_padding_mask})
                 : ops::attention(q, k, v, key_padding_mask, opt);  // [B, H, T, D]
  return nn::merge_heads(o);                                        // [B, T, C]
}

BertResidualOutput::BertResidualOutput(int64_t in, const BertConfig& c) : config(c) {
  dense = register_module("dense", std::make_shared<nn::Linear>(in, c.hidden, true, weight_init(c)));
  LayerNorm = register_module("LayerNorm", std::make_shared<nn::LayerNorm>(c.hidden, c.layer_norm_eps));
}

Tensor BertResidualOutput::forward(const Tensor& h, const Tensor& residual) const {
  auto s = scope();
  return LayerNorm->forward_residual(dense->forward(h), residual, config.hidden_dropout, training());
}

BertAttention::BertAttention(const BertConfig& c) {
  self = register_module("self", std::make_shared<BertSelfAttention>(c));
  output = register_module("output", std::make_shared<BertResidualOutput>(c.hidden, c));
}

Tensor BertAttention::forward(const Tensor& x, const Tensor& key_padding_mask) const {
  auto s = scope();
  return output->forward(self->forward(x, key_padding_mask), x);
}

BertIntermediate::BertIntermediate(const BertConfig& c) {
  dense = register_module("dense", std::make_shared<nn::Linear>(c.hidden, c.intermediate, true, weight_init(c)));
}

Tensor BertIntermediate::forward(const Tensor& x) const {
  auto s = scope();
  return ops::gelu(dense->forward(x));
}

BertLayer::BertLayer(const BertConfig& c) {
  attention = register_module("attention", std::make_shared<BertAttention>(c));
  intermediate = register_module("intermediate", std::make_shared<BertIntermediate>(c));
  output = register_module("output", std::make_shared<BertResidualOutput>(c.intermediate, c));
}

Tensor BertLayer::forward(const Tensor& x, const Tensor& key_padding_mask) const {
  auto s = scope();
  Tensor a = attention->forward(x, key_padding_mask);
  return output->forward(intermediate->forward(a), a);
}

BertPooler::BertPooler(const BertConfig& c) {
  dense = register_module("dense", std::make_shared<nn::Linear>(c.hidden, c.hidden, true, weight_init(c)));
}

Tensor BertPooler::forward(const Tensor& hidden) const {
  auto s = scope();
  return ops::tanh(dense->forward(ops::select(hidden, 1, 0)));
}

// ---------------------------------------------------------------------------------------------------
BertModel::BertModel(const BertConfig& c, bool with_pooler) : config(c) {
  ENGINE_CHECK(c.hidden % c.heads == 0, "bert: hidden ", c.hidden, " is not divisible by ", c.heads, " heads");
  ENGINE_CHECK(c.recompute == "none" || c.recompute == "attention" || c.recompute == "layer",
               "bert: unknown recompute '", c.recompute, "': expected none, attention or layer");
  embeddings = register_module("embeddings", std::make_shared<BertEmbeddings>(c));
  encoder_ = register_module("encoder", std::make_shared<graph::Module>());
  auto layer_list = encoder_->register_module("layer", std::make_shared<graph::Module>());
  for (int64_t i = 0; i < c.layers; i++)
    layers.push_back(layer_list->register_module(std::to_string(i), std::make_shared<BertLayer>(c)));
  if (with_pooler) pooler = register_module("pooler", std::make_shared<BertPooler>(c));
}

Tensor BertModel::forward(const Tensor& ids, const Tensor& token_types, const Tensor& key_padding_mask) const {
  auto s = scope();
  Tensor x = embeddings->forward(ids, token_types);
  engine::MemoryScope enc("encoder");
  engine::MemoryScope lay("layer");
  for (const auto& layer : layers) {
    if (config.recompute == "layer" && graph::grad_enabled()) {
      auto l = layer;
      x = graph::recompute([l](const std::vector<Tensor>& in) { return l->forward(in[0], in[1]); },
                           {x, key_padding_mask});
    } else {
      x = layer->forward(x, key_padding_mask);
    }
  }
  return x;
}

std::string hf_config_json(const BertConfig& c, const std::string& architecture) {
  using engine::json::quote;
  auto num = [](double v) { return engine::str(v); };  // 0.1, 1e-12, 0.02: as the reference configs write them
  // hidden_act "gelu" is the exact (erf) GELU, which nn::gelu computes; pad id 0 is BERT's [PAD].
  return engine::str(
      "{\n  \"architectures\": [", quote(architecture), "],\n  \"model_type\": \"bert\",\n",
      "  \"vocab_size\": ", c.vocab, ",\n  \"hidden_size\": ", c.hidden, ",\n  \"num_hidden_layers\": ", c.layers,
      ",\n  \"num_attention_heads\": ", c.heads, ",\n  \"intermediate_size\": ", c.intermediate,
      ",\n  \"hidden_act\": \"gelu\",\n  \"hidden_dropout_prob\": ", num(c.hidden_dropout),
      ",\n  \"attention_probs_dropout_prob\": ", num(c.attention_dropout),
      ",\n  \"max_position_embeddings\": ", c.max_positions, ",\n  \"type_vocab_size\": ", c.type_vocab,
      ",\n  \"initializer_range\": ", num(c.init_std), ",\n  \"layer_norm_eps\": ", num(c.layer_norm_eps),
      ",\n  \"pad_token_id\": 0,\n  \"position_embedding_type\": \"absolute\",\n",
      "  \"torch_dtype\": \"float32\"\n}\n");
}

}  // namespace models::bert
