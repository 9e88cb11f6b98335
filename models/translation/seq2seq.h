// seq2seq.h: the Transformer encoder-decoder both translation models are made of (fairseq's
// TransformerModel for transformer_big, XLM's encoder + decoder TransformerModels for unsupmt).
//
//   encoder.embed_tokens [V, C]   (shared with the decoder and its output projection when
//                                  share_all_embeddings: fairseq --share-all-embeddings)
//   <side>.embed_positions        learned [max_positions, C] (XLM), or none for sinusoidal positions
//                                  (fairseq's SinusoidalPositionalEmbedding: a function, computed on the host
//                                  for the positions in use and uploaded as an `input` block)
//   <side>.embed_languages        [languages, C], added to every token of a sentence (XLM's lang_embeddings)
//   <side>.layernorm_embedding    LayerNorm after the sum (XLM's layer_norm_emb)
//   encoder.layers.N              nn::TransformerLayer (self_attn, self_attn_layer_norm, fc1, fc2,
//                                  final_layer_norm)
//   decoder.layers.N              nn::TransformerDecoderLayer (+ encoder_attn, encoder_attn_layer_norm)
//   decoder.output_bias [V]       XLM's pred_layer bias; fairseq's tied projection has none
// Embedding: x = scale * embed_tokens(ids) + positions (+ language), scale = sqrt(C) in fairseq, 1 in XLM;
// then the optional LayerNorm and dropout. Sinusoidal positions count from padding_idx + 1 = 2 as fairseq's
// do (sentences are right-padded here, so a sentence's first token is always position 2).
//
// Shapes: src [B, S], prev_output [B, T] (i64); src_padding_mask bool [B, S]; logits [B, T, V].
// Generation (models/translation/generate.h) runs the encoder once and the decoder one position at a time
// with a key/value cache per layer (start_generation / step).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "models/data/translation.h"
#include "models/model.h"
#include "models/nn/decoder.h"
#include "models/nn/transformer.h"

namespace models::translation {

using engine::Tensor;

struct Seq2SeqConfig {
  int64_t vocab = 64, dim = 64, heads = 4, encoder_layers = 2, decoder_layers = 2, ffn = 256;
  int64_t max_positions = 1024;
  std::string activation = "relu";
  double dropout = 0.0, attention_dropout = 0.0, activation_dropout = 0.0;
  bool normalize_before = false;
  double layer_norm_eps = 1e-5;
  bool learned_positions = false;      // false: sinusoidal
  bool scale_embeddings = true;        // multiply token embeddings by sqrt(C)
  bool layernorm_embedding = false;
  int64_t languages = 0;               // 0: no language embeddings
  bool share_all_embeddings = true;    // one [V, C] table for encoder, decoder and output
  bool output_bias = false;
  int64_t padding_idx = 1;
  ops::AttentionAlgo algo = ops::AttentionAlgo::naive;
  bool recompute_layers = false;       // activation checkpointing per layer
  bool xavier_init = true;             // fairseq's init of the linear layers (see xavier_init below)

  // The tests' tiny shape, shared by the translation models' --size tiny: the specials plus `words` word
  // ids, width 64, 4 heads, 2 + 2 layers, FFN 128, 64 positions.
  void use_tiny_shape(int64_t words) {
    vocab = data::TranslationIds::first_word + words;
    dim = 64;
    heads = 4;
    encoder_layers = decoder_layers = 2;
    ffn = 128;
    max_positions = 64;
  }
  // The command line's network flags, as both token-batched translation models take them: the transformer shape
  // (--layers for both sides, --dim, --heads, ...), --attention and --recompute (none or layer). Errors name `model`.
  void apply_flags(const ModelConfig& c, const char* model);
};

// The embedding stack of one side. Its modules are registered by the owning encoder or decoder under the
// names above, so they appear at fairseq's level of the tree.
struct TokenEmbedding {
  std::shared_ptr<nn::Embedding> tokens, positions, languages;  // positions, languages may be null
  std::shared_ptr<nn::LayerNorm> norm;                          // may be null
  // ids [B, T] at positions first_position .. first_position + T - 1, language `lang` -> [B, T, C].
  Tensor forward(const Seq2SeqConfig& c, const Tensor& ids, int64_t first_position, int64_t lang,
                 bool training) const;
  // Without learned positions: fairseq's sinusoidal rows for every position [max_positions, dim], computed on
  // the host at the first forward and kept (as fairseq's SinusoidalPositionalEmbedding keeps its weights), so
  // a step uploads its T rows instead of evaluating T x dim sines and cosines (a fifth of a meta probe).
  mutable std::shared_ptr<const std::vector<float>> sinusoid_table;
};

// fairseq's sinusoidal table rows for positions [first, first + count): [count, dim], half sin, half cos.
std::vector<float> sinusoidal_positions(int64_t first, int64_t count, int64_t dim);
// The same table, computed once per (first, count, dim) in the process and shared: every model of a max-batch
// search builds the same one (its sines and cosines were 8% of `engine_bench lambda --device meta`).
std::shared_ptr<const std::vector<float>> shared_sinusoidal_positions(int64_t first, int64_t count, int64_t dim);

class Seq2SeqEncoder : public graph::Module {
 public:
  Seq2SeqEncoder(const Seq2SeqConfig& c, std::shared_ptr<nn::Embedding> shared_tokens);
  // src [B, S], src_padding_mask bool [B, S] (or undefined) -> [B, S, C]
  Tensor forward(const Tensor& src, const Tensor& src_padding_mask, int64_t lang = 0) const;
  Seq2SeqConfig config;
  TokenEmbedding embed;
  std::vector<std::shared_ptr<nn::TransformerLayer>> layers;
};

class Seq2SeqDecoder : public graph::Module {
 public:
  Seq2SeqDecoder(const Seq2SeqConfig& c, std::shared_ptr<nn::Embedding> shared_tokens);
  // prev_output [B, T] -> logits [B, T, V]
  Tensor forward(const Tensor& prev_output, const Tensor& encoder_out, const Tensor& src_padding_mask,
                 int64_t lang = 0) const;
  // Allocates each layer's cache for max_len positions and projects the encoder output once (NoGrad).
  std::vector<nn::DecoderLayerCache> start_generation(const Tensor& encoder_out, int64_t max_len) const;
  // tokens [B, 1] at position t -> logits [B, V] (NoGrad, eval mode).
  Tensor step(const Tensor& tokens, int64_t t, std::vector<nn::DecoderLayerCache>& caches,
              const Tensor& src_padding_mask, int64_t lang = 0) const;
  // x [..., C] -> logits [..., V] with the tied token embedding.
  Tensor output_projection(const Tensor& x) const;
  Seq2SeqConfig config;
  TokenEmbedding embed;
  std::vector<std::shared_ptr<nn::TransformerDecoderLayer>> layers;
  Tensor output_bias;  // [V] or undefined
};

// fairseq's initialization of the Transformer's linear layers, applied after construction: weights
// xavier_uniform (bound sqrt(6 / (in + out))), with gain 1/sqrt(2) on the q, k and v projections, biases 0.
// (PyTorch's default init, whose bound is sqrt(1 / in), starts the attention nearly uniform, and a post-LN
// model then takes far longer to learn to attend.) Embeddings keep normal(0, C^-1/2).
void xavier_init(graph::Module& m);

class Seq2Seq : public graph::Module {
 public:
  explicit Seq2Seq(const Seq2SeqConfig& c);
  // The training forward: logits [B, T, V].
  Tensor forward(const Tensor& src, const Tensor& src_padding_mask, const Tensor& prev_output, int64_t src_lang = 0,
                 int64_t tgt_lang = 0) const;
  Seq2SeqConfig config;
  std::shared_ptr<Seq2SeqEncoder> encoder;
  std::shared_ptr<Seq2SeqDecoder> decoder;
};

}  // namespace models::translation
