// generate.cpp: greedy decoding, cached and uncached.
#include "models/translation/generate.h"

#include <algorithm>
#include <cmath>

#include "engine/context.h"
#include "engine/format.h"
#include "graph/autograd.h"
#include "ops/factory.h"
#include "ops/reduce.h"
#include "ops/view.h"

namespace models::translation {

using Ids = data::TranslationIds;

namespace {

// Restores a module's training flag on scope exit.
class EvalMode {
 public:
  explicit EvalMode(graph::Module& m) : m_(m), was_training_(m.training()) { m_.eval(); }
  ~EvalMode() { m_.train(was_training_); }
  EvalMode(const EvalMode&) = delete;
  EvalMode& operator=(const EvalMode&) = delete;

 private:
  graph::Module& m_;
  bool was_training_;
};

Tensor ids_tensor(const std::vector<int64_t>& ids, const engine::Shape& shape, const Tensor& like) {
  engine::CategoryScope input(engine::Category::input);
  return ops::from_vector(ids, shape, engine::DType::i64, like.device_ptr());
}

}  // namespace

size_t self_cache_bytes(const Seq2SeqConfig& c, int64_t batch, int64_t length, size_t element_bytes) {
  return 2 * size_t(c.decoder_layers) * size_t(batch) * size_t(length) * size_t(c.dim) * element_bytes;
}

GreedyOutput greedy_decode(Seq2Seq& net, const Tensor& src, const Tensor& src_padding_mask, const GreedyOptions& o) {
  graph::NoGrad no_grad;
  engine::PhaseScope phase(engine::Phase::generate);
  EvalMode eval(net);
  const int64_t B = src.size(0);
  ENGINE_CHECK(o.max_len >= 1, "greedy_decode: max_len must be at least 1, got ", o.max_len);

  Tensor encoder_out = net.encoder->forward(src, src_padding_mask, o.src_lang);  // [B, S, C]
  std::vector<nn::DecoderLayerCache> caches;
  GreedyOutput out;
  if (o.use_cache) {
    caches = net.decoder->start_generation(encoder_out, o.max_len);
    for (const auto& c : caches) {
      out.cache_bytes += c.bytes();
      out.self_cache_bytes += c.self.bytes();
    }
  }
  out.sentences.resize(size_t(B));
  std::vector<bool> done(size_t(B), false);
  std::vector<int64_t> last(size_t(B), Ids::eos);      // the newest token of each row: [B]
  std::vector<int64_t> prefix(last);                   // uncached: all tokens so far, [B, t + 1] row-major
  int64_t remaining = B;
  for (int64_t t = 0; t < o.max_len && (remaining > 0 || !o.stop_when_done); t++) {
    Tensor logits;  // [B, V]
    if (o.use_cache) {
      logits = net.decoder->step(ids_tensor(last, {B, 1}, src), t, caches, src_padding_mask, o.tgt_lang);
    } else {
      Tensor all = net.decoder->forward(ids_tensor(prefix, {B, t + 1}, src), encoder_out, src_padding_mask,
                                        o.tgt_lang);  // [B, t + 1, V]
      logits = ops::select(all, 1, t);
    }
    std::vector<double> next = ops::argmax(logits, 1).to_double();  // [B]
    std::vector<int64_t> grown;
    for (int64_t b = 0; b < B; b++) {
      int64_t token = done[size_t(b)] ? Ids::pad : int64_t(next[size_t(b)]);
      if (!done[size_t(b)]) {
        out.generated_tokens++;
        if (token == Ids::eos) {
          done[size_t(b)] = true;
          remaining--;
        } else {
          out.sentences[size_t(b)].push_back(token);
        }
      }
      last[size_t(b)] = token;
      if (!o.use_cache) {
        grown.insert(grown.end(), prefix.begin() + b * (t + 1), prefix.begin() + (b + 1) * (t + 1));
        grown.push_back(token);
      }
    }
    prefix.swap(grown);
    out.steps = t + 1;
  }
  return out;
}

// ---------------------------------------------------------------------------------------------------
int64_t generation_max_len(int64_t src_len, int64_t max_positions) {
  return std::min<int64_t>(int64_t(std::ceil(1.3 * double(src_len))) + 5, max_positions);
}

Batch translation_tensors(const data::TranslationBatch& b) {
  auto dev = engine::default_device();
  using engine::DType;
  return {{"src", ops::from_vector(b.src, {b.batch, b.src_len}, DType::i64, dev)},
          {"src_padding_mask", ops::from_vector(b.src_padding, {b.batch, b.src_len}, DType::boolean, dev)},
          {"prev_output", ops::from_vector(b.prev_output, {b.batch, b.tgt_len}, DType::i64, dev)},
          {"target", ops::from_vector(b.target, {b.batch * b.tgt_len}, DType::i64, dev)}};
}

StepResult decode_batch_step(Seq2Seq& net, const data::TranslationBatch& hb, int64_t src_lang, int64_t tgt_lang) {
  Batch batch;
  {
    engine::PhaseScope phase(engine::Phase::generate);
    engine::CategoryScope input(engine::Category::input);
    batch = translation_tensors(hb);
  }
  GreedyOptions o;
  o.max_len = generation_max_len(hb.src_len, net.config.max_positions);
  o.src_lang = src_lang;
  o.tgt_lang = tgt_lang;
  GreedyOutput g = greedy_decode(net, batch.at("src"), batch.at("src_padding_mask"), o);
  StepResult r;
  r.has_loss = false;
  r.items = g.generated_tokens;
  const Seq2SeqConfig& n = net.config;
  const size_t e = engine::dtype_size(net.encoder->embed.tokens->weight.dtype());  // bytes per element
  using engine::format_bytes;
  r.details.push_back(engine::str("generated ", g.generated_tokens, " tokens for ", hb.batch, " sentences of up to ",
                                  hb.src_len, " source tokens in ", g.steps, " steps (max_len ", o.max_len, ")"));
  r.details.push_back(engine::str("kv cache: ", format_bytes(g.cache_bytes), " allocated once = self-attention ",
                                  format_bytes(g.self_cache_bytes), " at ", o.max_len,
                                  " positions + encoder-decoder K/V ", format_bytes(g.cache_bytes - g.self_cache_bytes),
                                  "; per position ", format_bytes(self_cache_bytes(n, hb.batch, 1, e)), " (2 x ",
                                  n.decoder_layers, " layers x ", hb.batch, " sentences x ", n.dim, " x ", e, " B)"));
  std::string by_length = "kv cache (self-attention) by length:";
  for (int64_t len : {32, 64, 128, 256, 512, 1024})
    if (len <= n.max_positions)
      by_length += engine::str(" ", len, ": ", format_bytes(self_cache_bytes(n, hb.batch, len, e)));
  r.details.push_back(by_length);
  return r;
}

}  // namespace models::translation
