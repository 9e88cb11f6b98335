// fconv.h: fairseq's convolutional sequence-to-sequence network (Gehring et al. 2017, fairseq/models/fconv.py:
// FConvEncoder, AttentionLayer, FConvDecoder), batch first.
//
// A layer spec (C, K) is a weight-normalized convolution to 2C channels followed by GLU (back to C), with a
// residual connection from the layer's input (through a weight-normalized Linear projection when the width
// changes) and the sum scaled by sqrt(0.5). Encoder convolutions pad (K-1)/2 on both sides; decoder ones pad
// K-1 on the left only (causal: fairseq's LinearizedConvolution pads K-1 on both sides and drops the last
// K-1 outputs, the same function).
//   encoder: x = embed_tokens + embed_positions, dropout, fc1 (E -> C0); per layer: zero the padding rows,
//            dropout, conv, GLU, residual; fc2 (C -> E), zero the padding rows, GradMultiply by
//            1 / (2 * attention layers) (identity forward, scales the gradient), then
//            encoder_out = (x, y = (x + input embedding) * sqrt(0.5)), both [B, S, E].
//   decoder: same embedding (target_embedding), fc1; per layer: dropout, causal conv, GLU, attention, residual;
//            fc2 (C -> out_embed), dropout, fc3 (out_embed -> V).
//   attention (every decoder layer): z = (in_projection(h) + target_embedding) * sqrt(0.5);
//            p = softmax(z @ x^T) over source positions (padding masked to -inf); c = (p @ y) * sqrt(s_b),
//            s_b the real source length of sentence b (fairseq's "s * s.rsqrt()"); out = (out_projection(c)
//            + h) * sqrt(0.5).
// Positions are fairseq's: padding_idx + 1 + t for a real token at index t (right padding), padding_idx (a
// zero row) for padding; the caller gives them (host-computed, like the ids). Parameter names are fairseq's:
// encoder.embed_tokens.weight, encoder.fc1.weight_g, encoder.projections.9.weight_v,
// encoder.convolutions.0.bias, decoder.attention.3.in_projection.weight_g, decoder.fc3.weight_v, ...
// (ModuleList indices kept: a layer without projection leaves its index unused). The decoder's `version`
// buffer is not kept.
#pragma once
#include <memory>
#include <utility>
#include <vector>

#include "graph/module.h"
#include "models/nn/layers.h"
#include "models/nn/weight_norm.h"

namespace models::convs2s {

using engine::Tensor;

struct FConvConfig {
  int64_t src_vocab = 32, tgt_vocab = 32;
  int64_t embed_dim = 768, out_embed_dim = 512, max_positions = 1024;
  std::vector<std::pair<int64_t, int64_t>> layers;  // (channels, kernel size), for encoder and decoder alike
  double dropout = 0.2;
  int64_t padding_idx = 1;
  // fconv_wmt_en_de: [(512, 3)] x 9 + [(1024, 3)] x 4 + [(2048, 1)] x 2.
  static std::vector<std::pair<int64_t, int64_t>> wmt_en_de_layers();
};

// One side's residual stack: per layer a projection (or null), a convolution (and, in the decoder, an
// attention layer), stored as fairseq's ModuleLists.
class FConvEncoder : public graph::Module {
 public:
  explicit FConvEncoder(const FConvConfig& c);
  struct Output {
    Tensor x, y;  // [B, S, E]: attention keys and values
  };
  // src [B, S] i64, positions [B, S] i64, padding mask bool [B, S].
  Output forward(const Tensor& src, const Tensor& positions, const Tensor& padding_mask) const;
  FConvConfig config;
  int64_t num_attention_layers = 1;  // set by the model: the decoder's attention layers
  std::shared_ptr<nn::Embedding> embed_tokens, embed_positions;
  std::shared_ptr<nn::WeightNormLinear> fc1, fc2;
  std::vector<std::shared_ptr<nn::WeightNormLinear>> projections;  // null where the width does not change
  std::vector<std::shared_ptr<nn::WeightNormConv1d>> convolutions;
};

// What every attention layer reads of the encoder output, made once per forward (attention_inputs in fconv.cpp):
// keys_t [B, E, S'] (encoder x transposed), values [B, S', E] (encoder y), mask bool [B, S'] (true at padding),
// value_scale [B, 1, 1] = sqrt(real source length). In bf16 and f16, S' is the source length S rounded up to a
// multiple of 8 (16 bytes), the extra positions zero and masked like padding: the scores [B, T, S'] and
// probabilities then have rows cuBLASLt's tensor-core kernels can read 16 bytes at a time (rows of S = 25 bf16
// scores are 50 bytes apart: the two products ran at ~15 TFLOP/s on an H100, 51 padded). The function is
// unchanged: a masked position gets probability 0. In f32 (CUDA cores unless TF32 is on) S' = S: padding bought
// nothing there (97.0 against 97.5 ms a step on the H100) and would cost memory (the 2020 table's max tokens).
struct AttentionInputs {
  Tensor keys_t, values, mask, value_scale;
};
// From the encoder output and the source padding mask [B, S]; once for every layer (fairseq transposes the keys once).
AttentionInputs attention_inputs(const FConvEncoder::Output& encoder_out, const Tensor& src_padding_mask);

class AttentionLayer : public graph::Module {
 public:
  AttentionLayer(int64_t conv_channels, int64_t embed_dim);
  // h [B, T, C], target_embedding [B, T, E] -> [B, T, C]
  Tensor forward(const Tensor& h, const Tensor& target_embedding, const AttentionInputs& a) const;
  std::shared_ptr<nn::WeightNormLinear> in_projection, out_projection;
};

// What incremental decoding keeps between steps: per layer the last K-1 inputs of its causal convolution
// ([B, K-1, Cin], zeros at the start: the causal padding; nothing for K = 1), and the attention inputs
// computed once from the encoder output. The whole state is [B, sum of (K-1) Cin] elements: it does not grow
// with the length (fairseq's LinearizedConvolution input_buffer).
struct IncrementalState {
  std::vector<Tensor> conv_inputs;
  AttentionInputs attention;
};

class FConvDecoder : public graph::Module {
 public:
  explicit FConvDecoder(const FConvConfig& c);
  // prev_output [B, T] i64, positions [B, T] i64 -> logits [B, T, V]
  Tensor forward(const Tensor& prev_output, const Tensor& positions, const FConvEncoder::Output& encoder_out,
                 const Tensor& src_padding_mask) const;
  // Incremental decoding (eval mode, no dropout): start, then one position per step: tokens [B, 1] at
  // positions [B, 1] -> logits [B, V], the same function as the last row of forward() over the prefix.
  IncrementalState start_incremental(const FConvEncoder::Output& encoder_out, const Tensor& src_padding_mask) const;
  Tensor step(const Tensor& tokens, const Tensor& positions, const FConvEncoder::Output& encoder_out,
              const Tensor& src_padding_mask, IncrementalState& state) const;
  FConvConfig config;
  std::shared_ptr<nn::Embedding> embed_tokens, embed_positions;
  std::shared_ptr<nn::WeightNormLinear> fc1, fc2, fc3;
  std::vector<std::shared_ptr<nn::WeightNormLinear>> projections;
  std::vector<std::shared_ptr<nn::WeightNormConv1d>> convolutions;
  std::vector<std::shared_ptr<AttentionLayer>> attention;
};

class FConvModel : public graph::Module {
 public:
  explicit FConvModel(const FConvConfig& c);
  // The training forward: logits [B, T, V].
  Tensor forward(const Tensor& src, const Tensor& src_positions, const Tensor& src_padding_mask,
                 const Tensor& prev_output, const Tensor& tgt_positions) const;
  FConvConfig config;
  std::shared_ptr<FConvEncoder> encoder;
  std::shared_ptr<FConvDecoder> decoder;
};

// fairseq's make_positions for right-padded ids: padding_idx + 1 + t for real tokens, padding_idx for padding.
std::vector<int64_t> fairseq_positions(const std::vector<int64_t>& ids, int64_t rows, int64_t cols,
                                       int64_t padding_idx);

}  // namespace models::convs2s
