// transformer_big.cpp: the recipe, the data pipeline (pool -> buckets -> order) and the steps.
#include "models/translation/transformer_big.h"

#include <algorithm>
#include <cmath>

#include "engine/format.h"
#include "engine/rng.h"
#include "models/translation/generate.h"
#include "ops/factory.h"
#include "ops/loss.h"
#include "ops/view.h"

namespace models::translation {

using data::TranslationIds;

TransformerBigRecipe TransformerBigRecipe::from(const ModelConfig& c) {
  TransformerBigRecipe r;
  std::string size = c.size.empty() ? "big" : c.size;
  Seq2SeqConfig& n = r.net;
  if (size == "big") {
    n.vocab = 32768;
    n.dim = 1024;
    n.heads = 16;
    n.encoder_layers = n.decoder_layers = 6;
    n.ffn = 4096;
    n.max_positions = 1024;
    n.dropout = 0.3;
  } else if (size == "tiny") {
    // A 16-word reversal task (3 to 6 words) that 2+2 layers of width 64 learn in about 200 steps on a cpu.
    r.synthetic_words = 16;
    n.use_tiny_shape(r.synthetic_words);
    n.dropout = 0.0;
    r.tokens = 256;
    r.lengths = {4.5, 0.3, 3, 6};
    r.synthetic_pairs = 2048;
    r.lr = 3e-3;
    r.warmup = 30;
  } else {
    throw engine::Error(engine::str("transformer_big: unknown --size '", size, "': expected big or tiny"));
  }
  ENGINE_CHECK(c.batch == 0,
               "transformer_big batches by tokens: give --tokens N (sentences x longest length <= N), "
               "not --batch");
  if (c.tokens) r.tokens = c.tokens;
  n.apply_flags(c, "transformer_big");
  r.data = c.data;
  r.seed = c.seed;
  // Every budget makes a batch: no synthetic sentence (EOS included) is longer than the budget.
  r.lengths.max_len = std::max<int64_t>(0, std::min(r.lengths.max_len, r.tokens - 1));
  r.lengths.min_len = std::min(r.lengths.min_len, r.lengths.max_len);
  return r;
}

// ---------------------------------------------------------------------------------------------------
TransformerBig::TransformerBig(const ModelConfig& c) : TransformerBig(TransformerBigRecipe::from(c)) {}

TransformerBig::TransformerBig(const TransformerBigRecipe& r) : recipe_(r) {
  corpus_ = std::make_unique<data::TokenBatchedCorpus>(
      data::CorpusOptions{"transformer_big", recipe_.data, recipe_.net.vocab, recipe_.synthetic_pairs,
                          recipe_.synthetic_words, recipe_.lengths, recipe_.tokens, recipe_.seed});

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

std::string TransformerBig::summary() const {
  const Seq2SeqConfig& n = recipe_.net;
  return engine::str("transformer_big (fairseq transformer_vaswani_wmt_en_de_big): ", n.encoder_layers, "+",
                     n.decoder_layers, " layers, d ", n.dim, ", ", n.heads, " heads, ffn ", n.ffn, ", vocab ", n.vocab,
                     " (shared), --tokens ", recipe_.tokens, " (", corpus_->num_batches(), " batches), attention ",
                     ops::attention_algo_name(n.algo), n.recompute_layers ? ", recompute layer" : "",
                     " | data: ", corpus_->description());
}

std::vector<std::string> TransformerBig::load_weights(const std::map<std::string, Tensor>& tensors) {
  return net_->load(
      tensors, true,
      {"decoder.embed_tokens.weight", "decoder.output_projection.weight", "encoder.embed_positions._float_tensor",
       "decoder.embed_positions._float_tensor", "encoder.version", "decoder.version"});
}

data::TranslationBatch TransformerBig::host_batch(int64_t step) const { return corpus_->batch(step, parts()); }

Model::HostBatch TransformerBig::make_host_batch(int64_t step) {
  auto b = std::make_shared<data::TranslationBatch>(host_batch(step));
  return [this, b] {
    last_target_tokens_ = b->target_tokens;
    return translation_tensors(*b);
  };
}

Tensor TransformerBig::loss(const Batch& batch) {
  Tensor logits = net_->forward(batch.at("src"), batch.at("src_padding_mask"), batch.at("prev_output"));  // [B, T, V]
  engine::MemoryScope s("loss");
  return ops::cross_entropy(ops::reshape(logits, {-1, recipe_.net.vocab}), batch.at("target"), TranslationIds::pad,
                            recipe_.label_smoothing);
}

StepResult TransformerBig::eval_step(int64_t step) { return decode_batch_step(*net_, host_batch(step), 0, 0); }

}  // namespace models::translation
