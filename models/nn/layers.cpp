// layers.cpp: Linear, LayerNorm, Embedding.
#include "models/nn/layers.h"

#include <cmath>

#include "graph/autograd.h"
#include "ops/embedding.h"
#include "ops/factory.h"
#include "ops/matmul.h"
#include "ops/norm.h"
#include "ops/view.h"
#include "ops/elementwise.h"

namespace models::nn {

Tensor init_tensor(const engine::Shape& shape, const Init& init, int64_t fan_in) {
  switch (init.kind) {
    case Init::Kind::pytorch_default: {
      double bound = fan_in > 0 ? 1.0 / std::sqrt(double(fan_in)) : 0.0;
      return ops::rand(shape, -bound, bound);
    }
    case Init::Kind::normal: return ops::randn(shape, 0.0, init.std);
    case Init::Kind::zeros: return ops::zeros(shape);
    case Init::Kind::kaiming_uniform: {
      double bound = fan_in > 0 ? init.std * std::sqrt(3.0 / double(fan_in)) : 0.0;
      return ops::rand(shape, -bound, bound);
    }
  }
  return Tensor();
}

Linear::Linear(int64_t in, int64_t out, bool bias_on, Init init) : in_features(in), out_features(out) {
  weight = register_parameter("weight", init_tensor({out, in}, init, in));
  if (bias_on) {
    Init bias_init = init.kind == Init::Kind::pytorch_default ? init : Init{Init::Kind::zeros};
    bias = register_parameter("bias", init_tensor({out}, bias_init, in));
  }
}

Tensor Linear::forward(const Tensor& x) const { return forward(x, ops::Activation::none); }

Tensor Linear::forward(const Tensor& x, ops::Activation act) const {
  auto s = scope();
  return ops::linear(x, weight, bias, act);
}

Tensor stacked_linear(const Tensor& x, const std::vector<const Linear*>& layers) {
  std::vector<Tensor> weights, biases;
  for (const Linear* l : layers) {
    weights.push_back(l->weight);
    if (l->bias.defined()) biases.push_back(l->bias);
  }
  ENGINE_CHECK(biases.empty() || biases.size() == weights.size(),
               "stacked_linear: some layers have a bias and some do not; stack layers that all have one, or none");
  return ops::linear(x, weights, biases);
}

LayerNorm::LayerNorm(int64_t dim, double eps_) : eps(eps_) {
  weight = register_parameter("weight", ops::ones({dim}));
  bias = register_parameter("bias", ops::zeros({dim}));
}

Tensor LayerNorm::forward(const Tensor& x) const {
  auto s = scope();
  return ops::layer_norm(x, weight, bias, eps);
}

Tensor LayerNorm::forward_residual(const Tensor& y, const Tensor& residual, double p, bool training) const {
  auto s = scope();
  return ops::dropout_add_layer_norm(y, residual, weight, bias, p, training, eps);
}

Embedding::Embedding(int64_t num_, int64_t dim_, int64_t padding_idx_, Init init)
    : num(num_), dim(dim_), padding_idx(padding_idx_) {
  Tensor w = init_tensor({num, dim}, init, dim);
  if (padding_idx >= 0) {  // the padding row starts (and stays) zero, as in PyTorch
    graph::NoGrad ng;
    ops::fill_(ops::select(w, 0, padding_idx), 0.0);
  }
  weight = register_parameter("weight", w);
}

Tensor Embedding::forward(const Tensor& ids) const {
  auto s = scope();
  return ops::embedding(weight, ids, padding_idx);
}

}  // namespace models::nn
