// generate.h: greedy decoding for the encoder-decoder models, with a key/value cache (the inference path
// and unsupmt's back-translation) or, for checking it, without one.
//
//   cached    the encoder runs once; each decoder layer gets its cache, allocated once at max_len positions
//             ([B, H, max_len, D] for K and V) plus the encoder-decoder K/V projected once; then one position
//             per step: the decoder sees only the newest token [B, 1], writes its K/V into the cache in place
//             and attends to the cached prefix. Work per step O(t), memory fixed from the start.
//   uncached  the reference: at step t the whole decoder runs again on the t + 1 tokens so far (the training
//             forward) and the last position's logits are used. Same function, O(t^2) work per step.
// Both run under graph::NoGrad and engine::PhaseScope(Phase::generate) with the model in eval mode (its
// training flag is restored afterwards), so every block they allocate is tagged phase `generate`.
// Every sentence starts from </s> (fairseq's and XLM's decoders do), takes the argmax token each step and
// stops at </s>; the batch stops when every sentence has stopped (unless stop_when_done is false) or after
// max_len tokens. On the meta
// device the argmax reads as 0, never </s>: generation runs the full max_len steps (the memory worst case).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "models/data/translation.h"
#include "models/model.h"
#include "models/translation/seq2seq.h"

namespace models::translation {

struct GreedyOptions {
  int64_t max_len = 64;     // generated tokens at most (EOS included)
  bool use_cache = true;
  int64_t src_lang = 0, tgt_lang = 0;
  // false: run all max_len steps even when every sentence has stopped (finished rows are fed <pad>), so the
  // allocations do not depend on the tokens and meta predicts cuda exactly (unsupmt's back-translation).
  bool stop_when_done = true;
};

struct GreedyOutput {
  std::vector<data::Sentence> sentences;  // per batch row, without EOS
  int64_t steps = 0;                      // decoder steps run
  int64_t generated_tokens = 0;           // tokens produced before each sentence stopped (EOS counted)
  size_t cache_bytes = 0;                 // all layers' caches (self K/V at max_len + encoder-decoder K/V)
  size_t self_cache_bytes = 0;            // the self-attention part alone
};

// src [B, S] i64, src_padding_mask bool [B, S].
GreedyOutput greedy_decode(Seq2Seq& net, const Tensor& src, const Tensor& src_padding_mask, const GreedyOptions& o);

// Self-attention cache bytes of `batch` sentences at `length` positions: 2 (K, V) x layers x batch x length x C
// x element size. What the cache costs per generated position, the figure --inference reports by length.
size_t self_cache_bytes(const Seq2SeqConfig& c, int64_t batch, int64_t length, size_t element_bytes = 4);

// The generation length rule of the translation models (XLM's back-translation rule): 1.3 * src_len + 5,
// at most max_positions.
int64_t generation_max_len(int64_t src_len, int64_t max_positions);

// Tensors of a host batch on the default device: src [B, S], src_padding_mask bool [B, S], prev_output
// [B, T], target [B * T].
Batch translation_tensors(const data::TranslationBatch& b);

// An --inference step: decodes the batch's sources greedily with the cache (max_len by the rule above);
// items = generated tokens; details = what was generated and the cache's bytes, in all and by length.
StepResult decode_batch_step(Seq2Seq& net, const data::TranslationBatch& batch, int64_t src_lang, int64_t tgt_lang);

}  // namespace models::translation
