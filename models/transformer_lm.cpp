// transformer_lm.cpp: the GPT-2-shaped language model and its synthetic data.
#include "models/transformer_lm.h"

#include <random>

#include "graph/autograd.h"
#include "ops/dropout.h"
#include "ops/elementwise.h"
#include "ops/factory.h"
#include "ops/loss.h"
#include "ops/matmul.h"
#include "ops/view.h"

namespace models {

TransformerLMConfig TransformerLMConfig::from(const ModelConfig& c) {
  TransformerLMConfig t;
  std::string size = c.size.empty() ? "tiny" : c.size;
  if (size == "tiny") {
    // defaults above
  } else if (size == "small" || size == "medium" || size == "large" || size == "xl") {
    // GPT-2's four published shapes (Radford et al. 2019, table 2; the gpt2, gpt2-medium, gpt2-large and gpt2-xl
    // config.json files): layers x width, 64 channels per head.
    const int64_t layers[] = {12, 24, 36, 48}, dims[] = {768, 1024, 1280, 1600};
    const int k = size == "small" ? 0 : size == "medium" ? 1 : size == "large" ? 2 : 3;
    t.vocab = 50257;
    t.dim = dims[k];
    t.heads = t.dim / 64;
    t.layers = layers[k];
    t.ffn = 4 * t.dim;
    t.max_positions = 1024;
    t.seq = 1024;
    t.batch = 8;
    t.dropout = t.attention_dropout = 0.1;
    t.lr = 6e-4;
    t.weight_decay = 0.1;
    t.warmup = 2000;
  } else {
    throw engine::Error(
        engine::str("transformer_lm: unknown --size '", size, "': expected tiny, small, medium, large or xl"));
  }
  c.dims.apply("transformer_lm", &t.layers, &t.dim, &t.heads, &t.ffn, &t.vocab, &t.max_positions, &t.dropout,
               &t.attention_dropout);
  if (c.dims.positions && c.seq == 0) t.seq = std::min(t.seq, t.max_positions);  // the default: the whole context
  if (c.seq) t.seq = c.seq;
  if (c.batch) t.batch = c.batch;
  const bool grows = size == "tiny" && !c.dims.positions;  // tiny's table grows with the request
  ENGINE_CHECK(t.seq <= t.max_positions || grows, "transformer_lm: --seq ", t.seq, " exceeds the ", t.max_positions,
               " learned positions", c.dims.positions ? " (--positions)" : "");
  if (t.seq > t.max_positions) t.max_positions = t.seq;
  t.algo = ops::attention_algo_from_name(c.attention);
  ENGINE_CHECK(c.recompute == "none" || c.recompute == "layer", "transformer_lm: --recompute ", c.recompute,
               " is not supported; use none or layer");
  t.recompute_layers = c.recompute == "layer";
  t.seed = c.seed;
  return t;
}

// ---------------------------------------------------------------------------------------------------
TransformerLMNet::TransformerLMNet(const TransformerLMConfig& c) : config(c) {
  nn::Init init = nn::Init::normal(0.02);
  wte = register_module("wte", std::make_shared<nn::Embedding>(c.vocab, c.dim, -1, init));
  wpe = register_module("wpe", std::make_shared<nn::Embedding>(c.max_positions, c.dim, -1, nn::Init::normal(0.01)));
  nn::TransformerLayerConfig lc;
  lc.dim = c.dim;
  lc.heads = c.heads;
  lc.ffn = c.ffn;
  lc.dropout = c.dropout;
  lc.attention_dropout = c.attention_dropout;
  lc.activation = "gelu_tanh";
  lc.normalize_before = true;
  lc.algo = c.algo;
  lc.init = init;
  for (int64_t i = 0; i < c.layers; i++)
    h.push_back(register_module("h." + std::to_string(i), std::make_shared<nn::TransformerLayer>(lc)));
  ln_f = register_module("ln_f", std::make_shared<nn::LayerNorm>(c.dim));
}

Tensor TransformerLMNet::forward(const Tensor& ids) const {
  int64_t T = ids.size(1);
  ENGINE_CHECK(T <= config.max_positions, "transformer_lm: sequence of ", T, " tokens exceeds ",
               config.max_positions, " positions");
  Tensor positions;
  {
    engine::CategoryScope input(engine::Category::input);
    positions = ops::arange(T, engine::DType::i64, ids.device_ptr());
  }
  Tensor x = ops::add(wte->forward(ids), wpe->forward(positions));  // [B, T, C]
  x = ops::dropout(x, config.dropout, training());
  for (const auto& layer : h) {
    if (config.recompute_layers && graph::grad_enabled()) {
      auto l = layer;
      x = graph::recompute([l](const std::vector<Tensor>& in) { return l->forward(in[0], Tensor(), true); }, {x});
    } else {
      x = layer->forward(x, Tensor(), true);
    }
  }
  x = ln_f->forward(x);
  engine::MemoryScope s("lm_head");
  return ops::linear(x, wte->weight);  // tied output embedding: [B, T, V]
}

// ---------------------------------------------------------------------------------------------------
TransformerLM::TransformerLM(const ModelConfig& c) : config_(TransformerLMConfig::from(c)) { build(); }
TransformerLM::TransformerLM(const TransformerLMConfig& c) : config_(c) { build(); }

void TransformerLM::build() {
  engine::manual_seed(config_.seed);
  net_ = std::make_shared<TransformerLMNet>(config_);
  net_->tag_memory();
  ops::AdamOptions o;
  o.lr = config_.lr;
  o.beta2 = 0.95;
  o.weight_decay = config_.weight_decay;
  optimizer_ = std::make_unique<ops::AdamW>(net_->named_parameters(), o);
  if (config_.warmup > 0) schedule_ = std::make_unique<ops::LinearWarmupDecay>(config_.lr, config_.warmup, 100000);
  clip_norm_ = 1.0;
}

std::string TransformerLM::summary() const {
  const auto& c = config_;
  return engine::str("transformer_lm: ", c.layers, " layers, dim ", c.dim, ", ", c.heads, " heads, ffn ", c.ffn,
                     ", vocab ", c.vocab, ", seq ", c.seq, ", batch ", c.batch, ", attention ",
                     ops::attention_algo_name(c.algo), c.recompute_layers ? ", recompute layer" : "");
}

Batch TransformerLM::make_batch(int64_t step) {
  const auto& c = config_;
  std::mt19937_64 rng(c.seed * 1000003ull + uint64_t(step));
  std::vector<int64_t> ids(size_t(c.batch * c.seq)), targets(size_t(c.batch * c.seq));
  for (int64_t b = 0; b < c.batch; b++) {
    int64_t s = int64_t(rng() % uint64_t(c.vocab)), k = 1 + int64_t(rng() % 4);
    for (int64_t t = 0; t < c.seq; t++) {
      ids[size_t(b * c.seq + t)] = (s + t * k) % c.vocab;
      targets[size_t(b * c.seq + t)] = (s + (t + 1) * k) % c.vocab;
    }
  }
  auto dev = engine::default_device();
  return {{"ids", ops::from_vector(ids, {c.batch, c.seq}, engine::DType::i64, dev)},
          {"targets", ops::from_vector(targets, {c.batch * c.seq}, engine::DType::i64, dev)}};
}

Tensor TransformerLM::loss(const Batch& batch) {
  Tensor logits = net_->forward(batch.at("ids"));  // [B, T, V]
  engine::MemoryScope s("loss");
  return ops::cross_entropy(ops::reshape(logits, {-1, config_.vocab}), batch.at("targets"));
}

}  // namespace models
