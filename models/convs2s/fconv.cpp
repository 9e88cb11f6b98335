// fconv.cpp: the convs2s encoder, attention layer and decoder (see fconv.h for the equations).
#include "models/convs2s/fconv.h"

#include <cmath>
#include <limits>

#include "graph/autograd.h"
#include "ops/conv1d.h"
#include "ops/dropout.h"
#include "ops/factory.h"
#include "ops/elementwise.h"
#include "ops/matmul.h"
#include "ops/reduce.h"
#include "ops/shape.h"
#include "ops/softmax.h"
#include "ops/view.h"

namespace models::convs2s {

namespace {

const double kHalfSqrt = std::sqrt(0.5);  // fairseq's normalization_constant 0.5, as sqrt(0.5)

// fairseq's GradMultiply: the identity forward (a view of x: nothing allocated), gradient times `scale`.
Tensor grad_multiply(const Tensor& x, double scale) {
  Tensor y = Tensor::view_of(x, x.shape(), x.strides(), x.offset());
  if (graph::any_requires_grad({x}))
    graph::record("grad_multiply", {x}, {y}, {},
                  [scale](graph::Node&, const std::vector<Tensor>& g) -> std::vector<Tensor> {
                    return {ops::mul(g[0], scale)};
                  });
  return y;
}

// The modules both sides share, in fairseq's order: embed_tokens and embed_positions (N(0, 0.1), zero
// padding row), fc1, then per layer projections[i] (when layer i changes the width) and convolutions[i].
template <typename Side>
void build_side(Side& side, const FConvConfig& c, int64_t vocab, bool causal) {
  ENGINE_CHECK(!c.layers.empty(), "convs2s: the ", causal ? "decoder" : "encoder", " needs at least one layer");
  side.embed_tokens = side.register_module(
      "embed_tokens", std::make_shared<nn::Embedding>(vocab, c.embed_dim, c.padding_idx, nn::Init::normal(0.1)));
  side.embed_positions = side.register_module(
      "embed_positions",
      std::make_shared<nn::Embedding>(c.max_positions, c.embed_dim, c.padding_idx, nn::Init::normal(0.1)));
  side.fc1 = side.register_module(
      "fc1", std::make_shared<nn::WeightNormLinear>(c.embed_dim, c.layers.front().first, c.dropout));
  int64_t in = c.layers.front().first;
  for (size_t i = 0; i < c.layers.size(); i++) {
    const auto [out, k] = c.layers[i];
    const std::string n = std::to_string(i);
    side.projections.push_back(in != out ? side.register_module("projections." + n,
                                                                std::make_shared<nn::WeightNormLinear>(in, out))
                                         : nullptr);
    const int64_t pad_left = causal ? k - 1 : (k % 2 == 1 ? k / 2 : (k - 1) / 2);
    const int64_t pad_right = causal ? 0 : (k % 2 == 1 ? k / 2 : k / 2);
    side.convolutions.push_back(side.register_module(
        "convolutions." + n, std::make_shared<nn::WeightNormConv1d>(in, 2 * out, k, pad_left, pad_right, c.dropout)));
    in = out;
  }
}

}  // namespace

std::vector<std::pair<int64_t, int64_t>> FConvConfig::wmt_en_de_layers() {
  std::vector<std::pair<int64_t, int64_t>> l(9, {512, 3});
  l.insert(l.end(), 4, {1024, 3});
  l.insert(l.end(), 2, {2048, 1});
  return l;
}

std::vector<int64_t> fairseq_positions(const std::vector<int64_t>& ids, int64_t rows, int64_t cols,
                                       int64_t padding_idx) {
  std::vector<int64_t> pos(ids.size());
  for (int64_t r = 0; r < rows; r++)
    for (int64_t t = 0; t < cols; t++) {
      const size_t i = size_t(r * cols + t);
      pos[i] = ids[i] == padding_idx ? padding_idx : padding_idx + 1 + t;
    }
  return pos;
}

// ---------------------------------------------------------------------------------------------------
FConvEncoder::FConvEncoder(const FConvConfig& c) : config(c) {
  build_side(*this, c, c.src_vocab, false);
  fc2 = register_module("fc2", std::make_shared<nn::WeightNormLinear>(c.layers.back().first, c.embed_dim));
}

FConvEncoder::Output FConvEncoder::forward(const Tensor& src, const Tensor& positions,
                                           const Tensor& padding_mask) const {
  auto s = scope();
  Tensor x = ops::add(embed_tokens->forward(src), embed_positions->forward(positions));  // [B, S, E]
  x = ops::dropout(x, config.dropout, training());
  const Tensor input_embedding = x;
  x = fc1->forward(x);                                       // [B, S, C0]
  const Tensor pad_rows = ops::unsqueeze(padding_mask, -1);  // [B, S, 1]
  for (size_t i = 0; i < convolutions.size(); i++) {
    engine::MemoryScope layer("layers." + std::to_string(i));
    Tensor residual = projections[i] ? projections[i]->forward(x) : x;  // [B, S, C]
    x = ops::masked_fill(x, pad_rows, 0.0);
    x = ops::dropout(x, config.dropout, training());
    x = ops::glu(convolutions[i]->forward(x), -1);  // [B, S, 2C] -> [B, S, C]
    x = ops::mul(ops::add(x, residual), kHalfSqrt);
  }
  x = fc2->forward(x);  // [B, S, E]
  x = ops::masked_fill(x, pad_rows, 0.0);
  x = grad_multiply(x, 1.0 / (2.0 * double(num_attention_layers)));
  Tensor y = ops::mul(ops::add(x, input_embedding), kHalfSqrt);
  return {x, y};
}

// ---------------------------------------------------------------------------------------------------
AttentionLayer::AttentionLayer(int64_t conv_channels, int64_t embed_dim) {
  in_projection = register_module("in_projection", std::make_shared<nn::WeightNormLinear>(conv_channels, embed_dim));
  out_projection = register_module("out_projection", std::make_shared<nn::WeightNormLinear>(embed_dim, conv_channels));
}

Tensor AttentionLayer::forward(const Tensor& h, const Tensor& target_embedding, const AttentionInputs& a) const {
  auto s = scope();
  Tensor z = ops::mul(ops::add(in_projection->forward(h), target_embedding), kHalfSqrt);  // [B, T, E]
  Tensor scores = ops::bmm(z, a.keys_t);                                                  // [B, T, S']
  scores = ops::masked_fill(scores, ops::unsqueeze(a.mask, 1), -std::numeric_limits<double>::infinity());
  Tensor p = ops::softmax(scores, -1);
  Tensor c = ops::mul(ops::bmm(p, a.values), a.value_scale);  // [B, T, E] * sqrt(s_b)
  return ops::mul(ops::add(out_projection->forward(c), h), kHalfSqrt);
}

// ---------------------------------------------------------------------------------------------------
AttentionInputs attention_inputs(const FConvEncoder::Output& enc, const Tensor& src_padding_mask) {
  engine::MemoryScope scope("attention_inputs");
  const int64_t B = enc.x.size(0), S = enc.x.size(1), E = enc.x.size(2);
  const int64_t multiple = engine::dtype_size(enc.x.dtype()) == 2 ? 8 : 1;  // 16 bytes of bf16 / f16 (fconv.h)
  const int64_t Sp = (S + multiple - 1) / multiple * multiple;
  AttentionInputs a;
  Tensor pads = ops::sum(ops::to(src_padding_mask, enc.x.dtype()), {1}, true);  // [B, 1]
  a.value_scale = ops::unsqueeze(ops::sqrt(ops::add(ops::neg(pads), double(S))), -1);
  if (Sp == S) {
    a.keys_t = ops::contiguous(ops::transpose(enc.x, 1, 2));
    a.values = enc.y;
    a.mask = src_padding_mask;
    return a;
  }
  // Zero-padded to S' (slice_backward writes its input into zeros; its gradient is the slice back).
  a.keys_t = ops::slice_backward(ops::transpose(enc.x, 1, 2), {B, E, Sp}, 2, 0, S, 1);
  a.values = ops::slice_backward(enc.y, {B, Sp, E}, 1, 0, S, 1);
  a.mask = ops::concat({src_padding_mask, ops::full({B, Sp - S}, 1, engine::DType::boolean, enc.x.device_ptr())}, 1);
  return a;
}

FConvDecoder::FConvDecoder(const FConvConfig& c) : config(c) {
  build_side(*this, c, c.tgt_vocab, true);
  for (size_t i = 0; i < c.layers.size(); i++)
    attention.push_back(register_module("attention." + std::to_string(i),
                                        std::make_shared<AttentionLayer>(c.layers[i].first, c.embed_dim)));
  fc2 = register_module("fc2", std::make_shared<nn::WeightNormLinear>(c.layers.back().first, c.out_embed_dim));
  fc3 = register_module("fc3", std::make_shared<nn::WeightNormLinear>(c.out_embed_dim, c.tgt_vocab, c.dropout));
}

Tensor FConvDecoder::forward(const Tensor& prev_output, const Tensor& positions, const FConvEncoder::Output& enc,
                             const Tensor& src_padding_mask) const {
  auto s = scope();
  Tensor x = ops::add(embed_tokens->forward(prev_output), embed_positions->forward(positions));  // [B, T, E]
  x = ops::dropout(x, config.dropout, training());
  const Tensor target_embedding = x;
  x = fc1->forward(x);  // [B, T, C0]
  const AttentionInputs attention_in = attention_inputs(enc, src_padding_mask);
  for (size_t i = 0; i < convolutions.size(); i++) {
    engine::MemoryScope layer("layers." + std::to_string(i));
    Tensor residual = projections[i] ? projections[i]->forward(x) : x;
    x = ops::dropout(x, config.dropout, training());
    x = ops::glu(convolutions[i]->forward(x), -1);  // causal
    x = attention[i]->forward(x, target_embedding, attention_in);
    x = ops::mul(ops::add(x, residual), kHalfSqrt);
  }
  x = fc2->forward(x);  // [B, T, out_embed]
  x = ops::dropout(x, config.dropout, training());
  return fc3->forward(x);  // [B, T, V]
}

IncrementalState FConvDecoder::start_incremental(const FConvEncoder::Output& enc,
                                                 const Tensor& src_padding_mask) const {
  auto s = scope();
  IncrementalState state;
  state.attention = attention_inputs(enc, src_padding_mask);
  for (const auto& conv : convolutions)
    state.conv_inputs.push_back(
        conv->kernel_size > 1
            ? ops::zeros({enc.x.size(0), conv->kernel_size - 1, conv->in_channels}, enc.x.dtype(), enc.x.device_ptr())
            : Tensor());
  return state;
}

Tensor FConvDecoder::step(const Tensor& tokens, const Tensor& positions, const FConvEncoder::Output& enc,
                          const Tensor& src_padding_mask, IncrementalState& state) const {
  auto s = scope();
  const Tensor target_embedding =
      ops::add(embed_tokens->forward(tokens), embed_positions->forward(positions));  // [B, 1, E]
  Tensor x = fc1->forward(target_embedding);  // [B, 1, C0]
  for (size_t i = 0; i < convolutions.size(); i++) {
    engine::MemoryScope layer("layers." + std::to_string(i));
    const nn::WeightNormConv1d& conv = *convolutions[i];
    Tensor residual = projections[i] ? projections[i]->forward(x) : x;
    // The last K inputs, unpadded: the one output row a causal convolution gives for the newest position.
    Tensor window = conv.kernel_size > 1 ? ops::concat({state.conv_inputs[i], x}, 1) : x;  // [B, K, Cin]
    if (conv.kernel_size > 1) state.conv_inputs[i] = ops::contiguous(ops::slice(window, 1, 1, conv.kernel_size));
    x = ops::glu(ops::conv1d(window, conv.weight(), conv.bias, 0, 0), -1);  // [B, 1, C]
    x = attention[i]->forward(x, target_embedding, state.attention);
    x = ops::mul(ops::add(x, residual), kHalfSqrt);
  }
  Tensor logits = fc3->forward(fc2->forward(x));  // [B, 1, V]
  return ops::reshape(logits, {logits.size(0), logits.size(2)});
}

// ---------------------------------------------------------------------------------------------------
FConvModel::FConvModel(const FConvConfig& c) : config(c) {
  encoder = register_module("encoder", std::make_shared<FConvEncoder>(c));
  decoder = register_module("decoder", std::make_shared<FConvDecoder>(c));
  encoder->num_attention_layers = int64_t(decoder->attention.size());
}

Tensor FConvModel::forward(const Tensor& src, const Tensor& src_positions, const Tensor& src_padding_mask,
                           const Tensor& prev_output, const Tensor& tgt_positions) const {
  FConvEncoder::Output enc = encoder->forward(src, src_positions, src_padding_mask);
  return decoder->forward(prev_output, tgt_positions, enc, src_padding_mask);
}

}  // namespace models::convs2s
