// san.h: the stochastic answer network (SAN; Liu, Duh and Gao 2018, "Stochastic Answer Networks for
// Natural Language Inference") that MT-DNN puts on its pairwise classification tasks, and the GRU cell
// it reasons with.
//
// Both come in two layers: a function of explicit tensors (gru_cell, san_probabilities), which is what the
// tests check in f64 against finite differences, and a Module holding the parameters under the names of
// namisan/mt-dnn's module/san.py (SANClassifier), so that an mt-dnn state dict loads by name.
//
// SAN, as mt-dnn computes it (hidden C, memory length T, K turns, n classes):
//   H = the hypothesis tokens, M = the premise tokens (both [B, T, C]; masks say which positions belong)
//   s_0 = sum_j softmax_j(w . drop(H_j) + b) drop(H_j)                      query_wsum.att.linear [1, C]
//   for t = 0 .. K-1:
//     a_t = softmax_j(drop(M_j) . (W drop(s_t) + b))    (positions outside the premise: -inf)
//                                                                           attn.score_func.linear [C, C]
//     x_t = sum_j a_t,j M_j                                                 [B, C]
//     P_t = softmax(W_c drop([x_t; s_t; |x_t - s_t|; x_t * s_t]) + b_c)   classifier.proj [n, 4C]
//     s_{t+1} = GRUCell(x_t, drop(s_t))                                     rnn.weight_ih [3C, C] ...
//   P = sum_t w_t P_t, with w the turn weights [B, K] (below); the loss is the NLL of log P.
// The last turn's state update feeds nothing, so it is not computed (mt-dnn computes and discards it).
//
// Stochastic prediction dropout (mt-dnn answer_mem_type 1, answer_mem_drop_p 0.1): in training each
// example keeps each turn with probability 1 - p, one turn chosen at random is always kept, and
// w_t = kept_t / (number kept), so P stays a probability distribution. (mt-dnn scales kept turns by
// 1 / (1 - p) and divides by K instead: the same in expectation, but its P need not sum to 1.) In eval
// w_t = 1 / K. The weights are drawn on the host (san_turn_weights) from a generator the caller seeds.
#pragma once
#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "models/nn/layers.h"

namespace models::mtdnn {

using engine::Tensor;

// PyTorch's GRUCell (gate order r, z, n):
//   r = sigmoid(W_ir x + b_ir + W_hr h + b_hr)      z = sigmoid(W_iz x + b_iz + W_hz h + b_hz)
//   n = tanh(W_in x + b_in + r * (W_hn h + b_hn))   h' = (1 - z) * n + z * h
// x [B, I], h [B, H], weight_ih [3H, I], weight_hh [3H, H], bias_ih, bias_hh [3H] -> h' [B, H].
Tensor gru_cell(const Tensor& x, const Tensor& h, const Tensor& weight_ih, const Tensor& weight_hh,
                const Tensor& bias_ih, const Tensor& bias_hh);

class GruCell : public graph::Module {
 public:
  // PyTorch's initialization: every parameter uniform in +-1/sqrt(hidden).
  GruCell(int64_t input, int64_t hidden);
  Tensor forward(const Tensor& x, const Tensor& h) const;
  int64_t input_size, hidden_size;
  Tensor weight_ih, weight_hh, bias_ih, bias_hh;
};

// ---------------------------------------------------------------------------------------------------
// Every tensor the SAN computes with (weights as nn.Linear stores them: [out, in]).
struct SanWeights {
  Tensor self_attn_weight, self_attn_bias;  // [1, C], [1]
  Tensor bilinear_weight, bilinear_bias;    // [C, C], [C]
  Tensor weight_ih, weight_hh, bias_ih, bias_hh;  // the GRU cell
  Tensor proj_weight, proj_bias;            // [n, 4C], [n]
};

struct SanOptions {
  int64_t turns = 5;        // K (answer_num_turn)
  double dropout = 0.1;     // on the memories, the state and the classifier input (dropout_p)
  double turn_drop = 0.1;   // stochastic prediction dropout (answer_mem_drop_p)
};

// The averaged class probabilities [B, n].
//   premise, hypothesis: [B, T, C] (for BERT both are the encoder output; the masks pick the sentences)
//   not_premise, not_hypothesis: bool [B, T], true where a position does not belong (padding included);
//     every row must keep at least one position of each
//   turn_weights: [B, K] in the dtype of the memories, each row summing to 1; undefined means 1 / K
// dropout applies only when training.
Tensor san_probabilities(const SanWeights& w, const Tensor& premise, const Tensor& not_premise,
                         const Tensor& hypothesis, const Tensor& not_hypothesis, const Tensor& turn_weights,
                         int64_t turns, double dropout, bool training);

// Host-drawn turn weights for `batch` examples ([batch * turns], row-major), as described above.
std::vector<double> san_turn_weights(int64_t batch, int64_t turns, double drop, std::mt19937_64& rng);

// mt-dnn's SANClassifier(hidden, hidden, n) with answer_opt 1 defaults. Parameter names:
//   query_wsum.att.linear.{weight,bias}  attn.score_func.linear.{weight,bias}
//   rnn.{weight_ih,weight_hh,bias_ih,bias_hh}  classifier.proj.{weight,bias}  and the buffer alpha [1, 1]
// (mt-dnn keeps an unused, untrained alpha parameter: a buffer here, so that its state dict loads).
class SanClassifier : public graph::Module {
 public:
  SanClassifier(int64_t hidden, int64_t classes, const SanOptions& options);
  // hidden [B, T, C] -> probabilities [B, n]; see san_probabilities for the masks and turn weights.
  Tensor forward(const Tensor& hidden, const Tensor& not_premise, const Tensor& not_hypothesis,
                 const Tensor& turn_weights) const;
  SanWeights weights() const;
  SanOptions options;
  std::shared_ptr<nn::Linear> self_attn, bilinear, proj;
  std::shared_ptr<GruCell> rnn;
};

}  // namespace models::mtdnn
