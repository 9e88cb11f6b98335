// san.cpp: the GRU cell and the stochastic answer network, written with engine ops (so both differentiate,
// twice if needed, and allocate identically on every device).
#include "models/mtdnn/san.h"

#include <cmath>
#include <limits>

#include "ops/dropout.h"
#include "ops/elementwise.h"
#include "ops/factory.h"
#include "ops/matmul.h"
#include "ops/shape.h"
#include "ops/softmax.h"
#include "ops/view.h"

namespace models::mtdnn {

using engine::Shape;

Tensor gru_cell(const Tensor& x, const Tensor& h, const Tensor& weight_ih, const Tensor& weight_hh,
                const Tensor& bias_ih, const Tensor& bias_hh) {
  using engine::shape_str;
  ENGINE_CHECK(x.dim() == 2 && h.dim() == 2 && x.size(0) == h.size(0), "gru_cell: x ", shape_str(x.shape()),
               " and h ", shape_str(h.shape()), " must be [B, input] and [B, hidden]");
  const int64_t I = x.size(1), H = h.size(1);
  ENGINE_CHECK(weight_ih.shape() == (Shape{3 * H, I}) && weight_hh.shape() == (Shape{3 * H, H}),
               "gru_cell: weight_ih ", shape_str(weight_ih.shape()), " and weight_hh ", shape_str(weight_hh.shape()),
               " must be [", 3 * H, ", ", I, "] and [", 3 * H, ", ", H, "] for x ", shape_str(x.shape()), " and h ",
               shape_str(h.shape()));
  std::vector<Tensor> gi = ops::chunk(ops::linear(x, weight_ih, bias_ih), 3, 1);  // r, z, n parts: [B, H] each
  std::vector<Tensor> gh = ops::chunk(ops::linear(h, weight_hh, bias_hh), 3, 1);
  Tensor r = ops::sigmoid(ops::add(gi[0], gh[0]));
  Tensor z = ops::sigmoid(ops::add(gi[1], gh[1]));
  Tensor n = ops::tanh(ops::add(gi[2], ops::mul(r, gh[2])));
  return ops::add(n, ops::mul(z, ops::sub(h, n)));  // (1 - z) n + z h
}

GruCell::GruCell(int64_t input, int64_t hidden) : input_size(input), hidden_size(hidden) {
  nn::Init init;  // PyTorch default: uniform(+-1/sqrt(fan_in)) with fan_in = hidden, as RNNCellBase does
  weight_ih = register_parameter("weight_ih", nn::init_tensor({3 * hidden, input}, init, hidden));
  weight_hh = register_parameter("weight_hh", nn::init_tensor({3 * hidden, hidden}, init, hidden));
  bias_ih = register_parameter("bias_ih", nn::init_tensor({3 * hidden}, init, hidden));
  bias_hh = register_parameter("bias_hh", nn::init_tensor({3 * hidden}, init, hidden));
}

Tensor GruCell::forward(const Tensor& x, const Tensor& h) const {
  auto s = scope();
  return gru_cell(x, h, weight_ih, weight_hh, bias_ih, bias_hh);
}

// ---------------------------------------------------------------------------------------------------
namespace {

// sum_j a_j values_j with a = softmax over j of scores, excluded positions at -inf.
// scores [B, T], excluded bool [B, T], values [B, T, C] -> [B, C]
Tensor masked_attention_sum(const Tensor& scores, const Tensor& excluded, const Tensor& values) {
  Tensor a = ops::softmax(ops::masked_fill(scores, excluded, -std::numeric_limits<double>::infinity()), 1);
  return ops::squeeze(ops::matmul(ops::unsqueeze(a, 1), values), 1);  // [B, 1, T] x [B, T, C] -> [B, C]
}

// |x|: leaky ReLU with slope -1 is exactly the absolute value, and its derivative (1 or -1) is sign(x).
Tensor absolute(const Tensor& x) { return ops::leaky_relu(x, -1.0); }

}  // namespace

Tensor san_probabilities(const SanWeights& w, const Tensor& premise, const Tensor& not_premise,
                         const Tensor& hypothesis, const Tensor& not_hypothesis, const Tensor& turn_weights,
                         int64_t turns, double dropout, bool training) {
  using engine::shape_str;
  ENGINE_CHECK(premise.dim() == 3 && hypothesis.dim() == 3 && premise.size(0) == hypothesis.size(0) &&
                   premise.size(2) == hypothesis.size(2),
               "san: premise ", shape_str(premise.shape()), " and hypothesis ", shape_str(hypothesis.shape()),
               " must be [B, T, C] with one B and one C");
  const int64_t B = premise.size(0);
  ENGINE_CHECK(not_premise.shape() == (Shape{B, premise.size(1)}) &&
                   not_hypothesis.shape() == (Shape{B, hypothesis.size(1)}),
               "san: masks not_premise ", shape_str(not_premise.shape()), " and not_hypothesis ",
               shape_str(not_hypothesis.shape()), " must be [B, T] for premise ", shape_str(premise.shape()),
               " and hypothesis ", shape_str(hypothesis.shape()));
  ENGINE_CHECK(turns >= 1, "san: ", turns, " turns; need at least one");
  ENGINE_CHECK(!turn_weights.defined() || turn_weights.shape() == (Shape{B, turns}), "san: turn_weights ",
               shape_str(turn_weights.shape()), " must be [", B, ", ", turns, "]");
  auto drop = [&](const Tensor& t) { return ops::dropout(t, dropout, training); };

  Tensor s;  // the state: [B, C]
  {
    engine::MemoryScope m("query_wsum");
    Tensor h = drop(hypothesis);
    Tensor scores = ops::squeeze(ops::linear(h, w.self_attn_weight, w.self_attn_bias), 2);  // [B, T]
    s = masked_attention_sum(scores, not_hypothesis, h);
  }
  Tensor probs;  // the weighted sum of the turns' predictions: [B, n]
  for (int64_t t = 0; t < turns; t++) {
    Tensor x;  // the premise summary this turn reads: [B, C]
    {
      engine::MemoryScope m("attn");
      Tensor wy = ops::linear(drop(s), w.bilinear_weight, w.bilinear_bias);            // [B, C]
      Tensor scores = ops::squeeze(ops::matmul(drop(premise), ops::unsqueeze(wy, 2)), 2);  // [B, T]
      x = masked_attention_sum(scores, not_premise, premise);
    }
    Tensor p;
    {
      engine::MemoryScope m("classifier");
      Tensor features = ops::concat({x, s, absolute(ops::sub(x, s)), ops::mul(x, s)}, 1);  // [B, 4C]
      p = ops::softmax(ops::linear(drop(features), w.proj_weight, w.proj_bias), 1);       // [B, n]
    }
    p = turn_weights.defined() ? ops::mul(p, ops::unsqueeze(ops::select(turn_weights, 1, t), 1))
                               : ops::mul(p, 1.0 / double(turns));
    probs = t == 0 ? p : ops::add(probs, p);
    if (t + 1 < turns) {
      engine::MemoryScope m("rnn");
      s = gru_cell(x, drop(s), w.weight_ih, w.weight_hh, w.bias_ih, w.bias_hh);
    }
  }
  return probs;
}

std::vector<double> san_turn_weights(int64_t batch, int64_t turns, double drop, std::mt19937_64& rng) {
  std::vector<double> w(size_t(batch * turns));
  std::vector<int> keep(static_cast<size_t>(turns));
  for (int64_t b = 0; b < batch; b++) {
    int kept = 0;
    for (int64_t t = 0; t < turns; t++) {
      double u = double(rng() >> 11) * 0x1.0p-53;  // uniform in [0, 1)
      keep[size_t(t)] = u >= drop;
    }
    keep[size_t(rng() % uint64_t(turns))] = 1;  // at least one turn survives
    for (int k : keep) kept += k;
    for (int64_t t = 0; t < turns; t++) w[size_t(b * turns + t)] = double(keep[size_t(t)]) / double(kept);
  }
  return w;
}

// ---------------------------------------------------------------------------------------------------
SanClassifier::SanClassifier(int64_t hidden, int64_t classes, const SanOptions& o) : options(o) {
  // mt-dnn initializes every nn.Linear of the network as BERT does: normal(0, 0.02), zero bias.
  nn::Init init = nn::Init::normal(0.02);
  register_buffer("alpha", ops::zeros({1, 1}));
  auto query_wsum = register_module("query_wsum", std::make_shared<graph::Module>());
  auto att = query_wsum->register_module("att", std::make_shared<graph::Module>());
  self_attn = att->register_module("linear", std::make_shared<nn::Linear>(hidden, 1, true, init));
  auto attn = register_module("attn", std::make_shared<graph::Module>());
  auto score_func = attn->register_module("score_func", std::make_shared<graph::Module>());
  bilinear = score_func->register_module("linear", std::make_shared<nn::Linear>(hidden, hidden, true, init));
  rnn = register_module("rnn", std::make_shared<GruCell>(hidden, hidden));
  auto classifier = register_module("classifier", std::make_shared<graph::Module>());
  proj = classifier->register_module("proj", std::make_shared<nn::Linear>(4 * hidden, classes, true, init));
}

SanWeights SanClassifier::weights() const {
  return {self_attn->weight, self_attn->bias, bilinear->weight, bilinear->bias, rnn->weight_ih,
          rnn->weight_hh,   rnn->bias_ih,    rnn->bias_hh,     proj->weight,   proj->bias};
}

Tensor SanClassifier::forward(const Tensor& hidden, const Tensor& not_premise, const Tensor& not_hypothesis,
                              const Tensor& turn_weights) const {
  auto s = scope();
  return san_probabilities(weights(), hidden, not_premise, hidden, not_hypothesis, turn_weights, options.turns,
                           options.dropout, training());
}

}  // namespace models::mtdnn
