// seq2seq.cpp: the Transformer encoder-decoder of the translation models.
#include "models/translation/seq2seq.h"

#include <cmath>
#include <map>
#include <mutex>
#include <tuple>

#include "graph/autograd.h"
#include "ops/dropout.h"
#include "ops/elementwise.h"
#include "ops/factory.h"
#include "ops/matmul.h"
#include "ops/view.h"

namespace models::translation {

void Seq2SeqConfig::apply_flags(const ModelConfig& c, const char* model) {
  c.dims.apply(model, &encoder_layers, &dim, &heads, &ffn, &vocab, &max_positions, &dropout, &attention_dropout);
  decoder_layers = encoder_layers;
  algo = ops::attention_algo_from_name(c.attention);
  ENGINE_CHECK(c.recompute == "none" || c.recompute == "layer", model, ": --recompute ", c.recompute,
               " is not supported; use none or layer");
  recompute_layers = c.recompute == "layer";
}

namespace {

nn::TransformerLayerConfig layer_config(const Seq2SeqConfig& c) {
  nn::TransformerLayerConfig lc;
  lc.dim = c.dim;
  lc.heads = c.heads;
  lc.ffn = c.ffn;
  lc.dropout = c.dropout;
  lc.attention_dropout = c.attention_dropout;
  lc.activation_dropout = c.activation_dropout;
  lc.activation = c.activation;
  lc.normalize_before = c.normalize_before;
  lc.layer_norm_eps = c.layer_norm_eps;
  lc.algo = c.algo;
  return lc;
}

std::shared_ptr<nn::Embedding> token_table(const Seq2SeqConfig& c) {
  // fairseq's Embedding(): normal(0, C^-1/2), the padding row zero.
  return std::make_shared<nn::Embedding>(c.vocab, c.dim, c.padding_idx,
                                         nn::Init::normal(std::pow(double(c.dim), -0.5)));
}

// Registers the embedding stack's modules on `side` (tokens only when the side owns them).
template <typename Side>
TokenEmbedding make_embedding(Side& side, const Seq2SeqConfig& c, std::shared_ptr<nn::Embedding> shared_tokens) {
  TokenEmbedding e;
  e.tokens = shared_tokens ? shared_tokens : side.register_module("embed_tokens", token_table(c));
  if (c.learned_positions)
    e.positions = side.register_module(
        "embed_positions",
        std::make_shared<nn::Embedding>(c.max_positions, c.dim, -1, nn::Init::normal(std::pow(double(c.dim), -0.5))));
  if (c.languages > 0)
    e.languages = side.register_module(
        "embed_languages",
        std::make_shared<nn::Embedding>(c.languages, c.dim, -1, nn::Init::normal(std::pow(double(c.dim), -0.5))));
  if (c.layernorm_embedding)
    e.norm = side.register_module("layernorm_embedding", std::make_shared<nn::LayerNorm>(c.dim, c.layer_norm_eps));
  return e;
}

}  // namespace

std::vector<float> sinusoidal_positions(int64_t first, int64_t count, int64_t dim) {
  int64_t half = dim / 2;
  double step = std::log(10000.0) / double(std::max<int64_t>(half - 1, 1));
  std::vector<float> table(size_t(count * dim), 0.0f);  // [count, dim]; an odd dim's last column stays 0
  for (int64_t p = 0; p < count; p++)
    for (int64_t i = 0; i < half; i++) {
      double angle = double(first + p) * std::exp(-double(i) * step);
      table[size_t(p * dim + i)] = float(std::sin(angle));
      table[size_t(p * dim + half + i)] = float(std::cos(angle));
    }
  return table;
}

std::shared_ptr<const std::vector<float>> shared_sinusoidal_positions(int64_t first, int64_t count, int64_t dim) {
  static std::mutex lock;
  static std::map<std::tuple<int64_t, int64_t, int64_t>, std::shared_ptr<const std::vector<float>>> tables;
  std::lock_guard<std::mutex> guard(lock);
  auto& table = tables[{first, count, dim}];
  if (!table) table = std::make_shared<const std::vector<float>>(sinusoidal_positions(first, count, dim));
  return table;
}

Tensor TokenEmbedding::forward(const Seq2SeqConfig& c, const Tensor& ids, int64_t first_position, int64_t lang,
                               bool training) const {
  int64_t T = ids.size(1);
  ENGINE_CHECK(first_position + T <= c.max_positions, "seq2seq: positions up to ", first_position + T,
               " exceed the model's ", c.max_positions, " positions");
  Tensor x = tokens->forward(ids);  // [B, T, C]
  if (c.scale_embeddings) x = ops::mul(x, std::sqrt(double(c.dim)));
  Tensor pos;
  if (positions) {
    engine::CategoryScope input(engine::Category::input);
    std::vector<int64_t> index(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; t++) index[size_t(t)] = first_position + t;
    pos = positions->forward(ops::from_vector(index, {T}, engine::DType::i64, ids.device_ptr()));  // [T, C]
  } else {
    engine::CategoryScope input(engine::Category::input);
    engine::MemoryScope s("embed_positions");
    // fairseq counts positions from padding_idx + 1.
    if (!sinusoid_table) sinusoid_table = shared_sinusoidal_positions(c.padding_idx + 1, c.max_positions, c.dim);
    const auto rows = sinusoid_table->begin() + first_position * c.dim;
    pos = ops::from_vector(std::vector<float>(rows, rows + T * c.dim), {T, c.dim}, x.dtype(),
                           ids.device_ptr());  // [T, C]
  }
  x = ops::add(x, pos);
  if (languages) x = ops::add(x, ops::select(languages->weight, 0, lang));  // + [C]
  if (norm) x = norm->forward(x);
  return ops::dropout(x, c.dropout, training);
}

// ---------------------------------------------------------------------------------------------------
Seq2SeqEncoder::Seq2SeqEncoder(const Seq2SeqConfig& c, std::shared_ptr<nn::Embedding> shared_tokens) : config(c) {
  embed = make_embedding(*this, c, std::move(shared_tokens));
  for (int64_t i = 0; i < c.encoder_layers; i++)
    layers.push_back(
        register_module("layers." + std::to_string(i), std::make_shared<nn::TransformerLayer>(layer_config(c))));
}

Tensor Seq2SeqEncoder::forward(const Tensor& src, const Tensor& src_padding_mask, int64_t lang) const {
  auto s = scope();
  Tensor x = embed.forward(config, src, 0, lang, training());  // [B, S, C]
  for (const auto& layer : layers) {
    if (config.recompute_layers && graph::grad_enabled()) {
      auto l = layer;
      Tensor mask = src_padding_mask;
      x = graph::recompute([l, mask](const std::vector<Tensor>& in) { return l->forward(in[0], mask, false); }, {x});
    } else {
      x = layer->forward(x, src_padding_mask, false);
    }
  }
  return x;
}

// ---------------------------------------------------------------------------------------------------
Seq2SeqDecoder::Seq2SeqDecoder(const Seq2SeqConfig& c, std::shared_ptr<nn::Embedding> shared_tokens) : config(c) {
  embed = make_embedding(*this, c, std::move(shared_tokens));
  for (int64_t i = 0; i < c.decoder_layers; i++)
    layers.push_back(
        register_module("layers." + std::to_string(i), std::make_shared<nn::TransformerDecoderLayer>(layer_config(c))));
  if (c.output_bias) output_bias = register_parameter("output_bias", ops::zeros({c.vocab}));
}

Tensor Seq2SeqDecoder::output_projection(const Tensor& x) const {
  engine::MemoryScope s("output_projection");
  return ops::linear(x, embed.tokens->weight, output_bias);  // [..., V]
}

Tensor Seq2SeqDecoder::forward(const Tensor& prev_output, const Tensor& encoder_out, const Tensor& src_padding_mask,
                               int64_t lang) const {
  auto s = scope();
  Tensor x = embed.forward(config, prev_output, 0, lang, training());  // [B, T, C]
  for (const auto& layer : layers) {
    if (config.recompute_layers && graph::grad_enabled()) {
      auto l = layer;
      Tensor mask = src_padding_mask;
      x = graph::recompute([l, mask](const std::vector<Tensor>& in) { return l->forward(in[0], in[1], mask); },
                           {x, encoder_out});
    } else {
      x = layer->forward(x, encoder_out, src_padding_mask);
    }
  }
  return output_projection(x);  // [B, T, V]
}

std::vector<nn::DecoderLayerCache> Seq2SeqDecoder::start_generation(const Tensor& encoder_out, int64_t max_len) const {
  auto s = scope();
  ENGINE_CHECK(max_len >= 1 && max_len <= config.max_positions, "seq2seq generation: max_len ", max_len,
               " must be in [1, ", config.max_positions, "]");
  std::vector<nn::DecoderLayerCache> caches;
  for (const auto& layer : layers) caches.push_back(layer->start_cache(encoder_out, max_len));
  return caches;
}

Tensor Seq2SeqDecoder::step(const Tensor& tokens, int64_t t, std::vector<nn::DecoderLayerCache>& caches,
                            const Tensor& src_padding_mask, int64_t lang) const {
  auto s = scope();
  ENGINE_CHECK(caches.size() == layers.size(), "seq2seq step: ", caches.size(), " caches for ", layers.size(),
               " layers");
  Tensor x = embed.forward(config, tokens, t, lang, training());  // [B, 1, C]
  for (size_t i = 0; i < layers.size(); i++) x = layers[i]->step(x, t, caches[i], src_padding_mask);
  return ops::select(output_projection(x), 1, 0);  // [B, V]
}

// ---------------------------------------------------------------------------------------------------
void xavier_init(graph::Module& m) {
  auto ends_with = [](const std::string& s, const std::string& tail) {
    return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
  };
  graph::NoGrad ng;
  for (auto& [name, p] : m.named_parameters()) {
    bool linear = name.find("_proj.") != std::string::npos || name.find("fc1.") != std::string::npos ||
                  name.find("fc2.") != std::string::npos;
    if (!linear) continue;
    if (ends_with(name, ".bias")) {
      ops::fill_(p, 0.0);
    } else if (p.dim() == 2) {
      bool qkv =
          ends_with(name, "q_proj.weight") || ends_with(name, "k_proj.weight") || ends_with(name, "v_proj.weight");
      double bound = (qkv ? std::sqrt(0.5) : 1.0) * std::sqrt(6.0 / double(p.size(0) + p.size(1)));
      ops::copy_(p, ops::rand(p.shape(), -bound, bound, p.dtype(), p.device_ptr()));
    }
  }
}

Seq2Seq::Seq2Seq(const Seq2SeqConfig& c) : config(c) {
  encoder = register_module("encoder", std::make_shared<Seq2SeqEncoder>(c, nullptr));
  decoder = register_module(
      "decoder", std::make_shared<Seq2SeqDecoder>(c, c.share_all_embeddings ? encoder->embed.tokens : nullptr));
  if (c.xavier_init) xavier_init(*this);
}

Tensor Seq2Seq::forward(const Tensor& src, const Tensor& src_padding_mask, const Tensor& prev_output, int64_t src_lang,
                        int64_t tgt_lang) const {
  Tensor encoder_out = encoder->forward(src, src_padding_mask, src_lang);  // [B, S, C]
  return decoder->forward(prev_output, encoder_out, src_padding_mask, tgt_lang);
}

}  // namespace models::translation
