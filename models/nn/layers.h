// layers.h: the basic layers every model is built from: Linear, LayerNorm, Embedding, Dropout settings.
//
// Each is a graph::Module holding its parameters under PyTorch's names (weight, bias), so a checkpoint
// written by PyTorch loads by name. forward() opens the module's memory scope, so the ledger attributes
// what the layer allocates to its dotted path.
#pragma once
#include <memory>

#include "graph/module.h"
#include "ops/matmul.h"

namespace models::nn {

using engine::Tensor;

// How parameters start. PyTorch's default for Linear is uniform(+-1/sqrt(in)) for weight and bias; BERT
// and most transformers use normal(0, 0.02) weights and zero biases.
// How a layer's weight starts (its bias: zeros, but uniform(+-1/sqrt(fan_in)) with pytorch_default):
//   pytorch_default   uniform(+-1/sqrt(fan_in)) (nn.Linear's and nn.Conv2d's reset_parameters)
//   normal            normal(0, std)
//   kaiming_uniform   uniform(+-std sqrt(3 / fan_in)), std the gain (kaiming_uniform_(a): sqrt(2 / (1 + a^2)))
//   zeros
struct Init {
  enum class Kind { pytorch_default, normal, zeros, kaiming_uniform } kind = Kind::pytorch_default;
  double std = 0.02;
  static Init normal(double std) { return {Kind::normal, std}; }
  static Init kaiming_uniform(double gain) { return {Kind::kaiming_uniform, gain}; }
};

class Linear : public graph::Module {
 public:
  Linear(int64_t in, int64_t out, bool bias = true, Init init = {});
  Tensor forward(const Tensor& x) const;  // [..., in] -> [..., out]
  // The activation applied in the GEMM's epilogue (ops::linear): forward(x, relu) is relu(forward(x)).
  Tensor forward(const Tensor& x, ops::Activation act) const;
  int64_t in_features, out_features;
  Tensor weight;  // [out, in]
  Tensor bias;    // [out] or undefined
};

// The outputs of several Linear layers on the same x, side by side along the last dimension ([..., sum of out]),
// from one GEMM over their stacked weights (ops::linear with a list of weights): q, k and v projected at once.
// The layers need the same in_features, and all a bias or none.
Tensor stacked_linear(const Tensor& x, const std::vector<const Linear*>& layers);

class LayerNorm : public graph::Module {
 public:
  explicit LayerNorm(int64_t dim, double eps = 1e-5);
  Tensor forward(const Tensor& x) const;  // over the last dimension
  // forward(residual + dropout(y, p, training)): the post-norm residual step, as one op
  // (ops::dropout_add_layer_norm).
  Tensor forward_residual(const Tensor& y, const Tensor& residual, double p, bool training) const;
  double eps;
  Tensor weight, bias;  // [dim]
};

class Embedding : public graph::Module {
 public:
  Embedding(int64_t num, int64_t dim, int64_t padding_idx = -1, Init init = Init::normal(1.0));
  Tensor forward(const Tensor& ids) const;  // ids [...] -> [..., dim]
  int64_t num, dim, padding_idx;
  Tensor weight;  // [num, dim]
};

// Parameter initialization helper shared by the layers: a tensor of `shape` on the default device drawn from
// `init` (fan_in for the PyTorch default).
Tensor init_tensor(const engine::Shape& shape, const Init& init, int64_t fan_in);

}  // namespace models::nn
