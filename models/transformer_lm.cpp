// transformer_lm.cpp: the GPT-2-shaped language model and its synthetic data.
#include "models/transformer_lm.h"

#include <algorithm>
#include <random>

#include "engine/format.h"
#include "graph/autograd.h"
#include "ops/dropout.h"
#include "ops/elementwise.h"
#include "ops/factory.h"
#include "ops/loss.h"
#include "ops/matmul.h"
#include "ops/reduce.h"
#include "ops/shape.h"
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
  if (c.seq == 0 && c.generate > 0 && c.generate < t.max_positions)  // the default prompt leaves room for the tokens
    t.seq = std::min(t.seq, t.max_positions - c.generate);
  if (c.seq) t.seq = c.seq;
  if (c.batch) t.batch = c.batch;
  const bool grows = size == "tiny" && !c.dims.positions;  // tiny's table grows with the request
  t.positions_grow = grows && c.generate == 0;             // (with --generate its length is the prompt's: bounded)
  ENGINE_CHECK(t.seq <= t.max_positions || grows, "transformer_lm: --seq ", t.seq, " exceeds the ", t.max_positions,
               " learned positions", c.dims.positions ? " (--positions)" : "");
  if (t.seq > t.max_positions) t.max_positions = t.seq;
  t.generate = c.generate;
  t.prefill_tokens = c.prefill_tokens;
  ENGINE_CHECK(t.prefill_tokens >= 0, "transformer_lm: --prefill-tokens must be 0 (one pass) or positive");
  ENGINE_CHECK(t.generate >= 0 && t.seq + t.generate <= t.max_positions, "transformer_lm: --seq ", t.seq,
               " + --generate ", t.generate, " = ", t.seq + t.generate, " positions; the model has ", t.max_positions,
               " (give a shorter prompt or fewer tokens, or --positions)");
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

std::vector<nn::KVCache> TransformerLMNet::start_cache(int64_t batch, int64_t max_len,
                                                       const std::shared_ptr<engine::Device>& device) const {
  std::vector<nn::KVCache> caches;
  const engine::DType dtype = wte->weight.dtype();
  for (const auto& layer : h) {
    auto s = layer->scope();
    caches.push_back(layer->self_attn->start_cache(batch, max_len, dtype, device));
  }
  return caches;
}

Tensor TransformerLMNet::forward_cached(const Tensor& ids, int64_t t0, std::vector<nn::KVCache>& caches) const {
  const int64_t B = ids.size(0), n = ids.size(1);
  ENGINE_CHECK(caches.size() == h.size(), "transformer_lm: ", caches.size(), " caches for ", h.size(), " layers");
  Tensor positions;
  {
    engine::CategoryScope input(engine::Category::input);
    std::vector<int64_t> p(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; i++) p[size_t(i)] = t0 + i;
    positions = ops::from_vector(p, {n}, engine::DType::i64, ids.device_ptr());
  }
  Tensor x = ops::add(wte->forward(ids), wpe->forward(positions));  // [B, n, C]
  for (size_t i = 0; i < h.size(); i++) x = h[i]->step(x, t0, caches[i]);
  x = ln_f->forward(ops::slice(x, 1, n - 1, n));  // the last position only: [B, 1, C]
  engine::MemoryScope s("lm_head");
  return ops::reshape(ops::linear(x, wte->weight), {B, config.vocab});  // [B, V]
}

size_t lm_cache_bytes(const TransformerLMConfig& c, int64_t batch, int64_t length, size_t element_bytes) {
  return size_t(2 * c.layers * batch * length * c.dim) * element_bytes;
}

namespace {
// Appends ids [B, 1] (i64) to each sequence's tokens on the host (meta: zeros).
void record_tokens(const Tensor& ids, std::vector<std::vector<int64_t>>& out) {
  const std::vector<double> host = ids.is_meta() ? std::vector<double>(size_t(ids.numel()), 0.0) : ids.to_double();
  for (size_t b = 0; b < out.size(); b++) out[b].push_back(int64_t(host[b]));
}

// The argmax token of each row of logits [B, V], as i64 ids [B, 1] on the device, and on the host.
Tensor next_tokens(const Tensor& logits, std::vector<std::vector<int64_t>>& out) {
  Tensor ids = ops::argmax(logits, 1, /*keepdim=*/true);  // [B, 1] i64
  record_tokens(ids, out);
  return ids;
}
}  // namespace

int64_t prefill_chunk(int64_t prefill_tokens, int64_t prompt, int64_t batch) {
  return prefill_tokens > 0 ? std::clamp<int64_t>(prefill_tokens / prompt, 1, batch) : batch;
}

LMGeneration greedy_generate(TransformerLMNet& net, const Tensor& prompt, int64_t tokens, bool use_cache,
                             int64_t prefill_tokens) {
  ENGINE_CHECK(prompt.dim() == 2 && prompt.size(1) >= 1 && tokens >= 1,
               "greedy_generate: expected a prompt [B, P] "
               "with P >= 1 and at least one token to generate, got ",
               engine::shape_str(prompt.shape()), " and ", tokens);
  const int64_t B = prompt.size(0), P = prompt.size(1);
  ENGINE_CHECK(P + tokens <= net.config.max_positions, "greedy_generate: ", P, " + ", tokens, " positions exceed the ",
               net.config.max_positions, " the model has");
  graph::NoGrad no_grad;
  engine::PhaseScope phase(engine::Phase::generate);
  const bool was_training = net.training();
  net.eval();
  LMGeneration out;
  out.tokens.resize(size_t(B));
  if (use_cache) {
    std::vector<nn::KVCache> caches = net.start_cache(B, P + tokens, prompt.device_ptr());
    for (const auto& c : caches) out.cache_bytes += c.bytes();
    // The prefill, in passes of `chunk` whole sequences: each writes its rows of every cache (views of the rows).
    const int64_t chunk = prefill_chunk(prefill_tokens, P, B);
    std::vector<Tensor> firsts;
    for (int64_t b0 = 0; b0 < B; b0 += chunk) {
      const int64_t b1 = std::min(B, b0 + chunk);
      std::vector<nn::KVCache> rows;
      for (const nn::KVCache& c : caches) rows.push_back({ops::slice(c.k, 0, b0, b1), ops::slice(c.v, 0, b0, b1)});
      firsts.push_back(ops::argmax(net.forward_cached(ops::slice(prompt, 0, b0, b1), 0, rows), 1, true));
    }
    Tensor next = firsts.size() == 1 ? firsts[0] : ops::concat(firsts, 0);  // [B, 1]
    firsts.clear();
    record_tokens(next, out.tokens);
    for (int64_t t = 1; t < tokens; t++) next = next_tokens(net.forward_cached(next, P + t - 1, caches), out.tokens);
  } else {
    Tensor seq = prompt;
    for (int64_t t = 0; t < tokens; t++) {
      Tensor logits = net.forward(seq);  // [B, T, V]
      const int64_t T = logits.size(1);
      Tensor next = next_tokens(ops::reshape(ops::slice(logits, 1, T - 1, T), {B, net.config.vocab}), out.tokens);
      seq = ops::concat({seq, next}, 1);
    }
  }
  if (was_training) net.train();
  return out;
}

StepResult TransformerLM::eval_step(int64_t step) {
  if (config_.generate == 0) return Model::eval_step(step);
  module().eval();
  Batch batch;
  {
    engine::CategoryScope input(engine::Category::input);
    engine::MemoryScope owner("batch");
    batch = next_batch(step);
  }
  const Tensor& prompt = batch.at("ids");
  const int64_t B = prompt.size(0), P = prompt.size(1), N = config_.generate;
  const LMGeneration g = greedy_generate(*net_, prompt, N, /*use_cache=*/true, config_.prefill_tokens);
  StepResult r;
  r.has_loss = false;
  r.items = B;  // sequences decoded (the unit stays "seq": the max-batch finder's knob is the batch)
  const size_t element = engine::dtype_size(net_->wte->weight.dtype());
  std::string by_length;
  for (int64_t len : {P, P + N / 2, P + N})
    by_length += engine::str(by_length.empty() ? "" : ", ", len, ": ",
                             engine::format_bytes(lm_cache_bytes(config_, B, len, element)));
  const int64_t chunk = prefill_chunk(config_.prefill_tokens, P, B);
  r.details.push_back(engine::str(
      "generated ", N, " tokens for each of ", B, " prompts of ", P, " tokens (prefill in ", (B + chunk - 1) / chunk,
      " pass", B > chunk ? "es" : "", " of up to ", chunk, " sequences, then one token per step); KV cache ",
      engine::format_bytes(g.cache_bytes), " allocated at ", P + N, " positions (2 x ", config_.layers, " layers x ", B,
      " x ", P + N, " x ", config_.dim, " x ", element, " bytes); in use by length: ", by_length));
  std::string first;
  for (size_t i = 0; i < g.tokens[0].size() && i < 16; i++) first += engine::str(i ? " " : "", g.tokens[0][i]);
  if (!prompt.is_meta()) r.details.push_back("sequence 0 generated: " + first + (N > 16 ? " ..." : ""));
  return r;
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
    const int64_t s = int64_t(rng() % uint64_t(c.vocab)), k = 1 + int64_t(rng() % 4);
    // ids (s + t k) mod vocab, targets the next id: stepped without a division per token (the meta device's probes
    // of long sequences made this loop a few percent of engine_bench lambda)
    int64_t id = s;
    for (int64_t t = 0; t < c.seq; t++) {
      ids[size_t(b * c.seq + t)] = id;
      id += k;
      while (id >= c.vocab) id -= c.vocab;
      targets[size_t(b * c.seq + t)] = id;
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
