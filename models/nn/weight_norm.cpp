// weight_norm.cpp: the weight-normalized Linear and Conv1d (the reparametrization is ops::weight_norm).
#include "models/nn/weight_norm.h"

#include <cmath>

#include "graph/autograd.h"
#include "models/nn/layers.h"
#include "ops/conv1d.h"
#include "ops/factory.h"
#include "ops/matmul.h"
#include "ops/norm.h"

namespace models::nn {

// ---------------------------------------------------------------------------------------------------
WeightNormLinear::WeightNormLinear(int64_t in, int64_t out, double dropout) : in_features(in), out_features(out) {
  Tensor v = init_tensor({out, in}, Init::normal(std::sqrt((1.0 - dropout) / double(in))), in);
  bias = register_parameter("bias", ops::zeros({out}));
  Tensor g;
  {
    graph::NoGrad ng;
    g = ops::weight_norm_magnitude(v, 0);  // [out, 1]
  }
  weight_g = register_parameter("weight_g", g);
  weight_v = register_parameter("weight_v", v);
}

Tensor WeightNormLinear::weight() const { return ops::weight_norm(weight_v, weight_g, 0); }

Tensor WeightNormLinear::forward(const Tensor& x) const {
  auto s = scope();
  return ops::linear(x, weight(), bias);
}

WeightNormConv1d::WeightNormConv1d(int64_t in, int64_t out, int64_t k, int64_t pl, int64_t pr, double dropout)
    : in_channels(in), out_channels(out), kernel_size(k), pad_left(pl), pad_right(pr) {
  const double std = std::sqrt(4.0 * (1.0 - dropout) / double(k * in));
  Tensor v = init_tensor({k, in, out}, Init::normal(std), k * in);
  bias = register_parameter("bias", ops::zeros({out}));
  Tensor g;
  {
    graph::NoGrad ng;
    g = ops::weight_norm_magnitude(v, 2);  // [1, 1, out]
  }
  weight_g = register_parameter("weight_g", g);
  weight_v = register_parameter("weight_v", v);
}

Tensor WeightNormConv1d::weight() const { return ops::weight_norm(weight_v, weight_g, 2); }

Tensor WeightNormConv1d::forward(const Tensor& x) const {
  auto s = scope();
  return ops::conv1d(x, weight(), bias, pad_left, pad_right);
}

}  // namespace models::nn
