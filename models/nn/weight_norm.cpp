// weight_norm.cpp: the reparametrization as engine ops, and the weight-normalized Linear and Conv1d.
#include "models/nn/weight_norm.h"

#include <cmath>

#include "graph/autograd.h"
#include "models/nn/layers.h"
#include "ops/conv1d.h"
#include "ops/elementwise.h"
#include "ops/factory.h"
#include "ops/matmul.h"
#include "ops/norm.h"
#include "ops/op.h"
#include "ops/reduce.h"

namespace models::nn {

namespace {

std::vector<int64_t> all_dims_but(int64_t dim, int64_t ndim) {
  std::vector<int64_t> dims;
  for (int64_t d = 0; d < ndim; d++)
    if (d != dim) dims.push_back(d);
  return dims;
}

}  // namespace

Tensor weight_norm_magnitude(const Tensor& v, int64_t dim) {
  const int64_t d = ops::normalize_dim("weight_norm", dim, v.dim());
  return ops::sqrt(ops::sum(ops::mul(v, v), all_dims_but(d, v.dim()), true));
}

Tensor weight_norm(const Tensor& v, const Tensor& g, int64_t dim) { return ops::weight_norm(v, g, dim); }

// ---------------------------------------------------------------------------------------------------
WeightNormLinear::WeightNormLinear(int64_t in, int64_t out, double dropout) : in_features(in), out_features(out) {
  Tensor v = init_tensor({out, in}, Init::normal(std::sqrt((1.0 - dropout) / double(in))), in);
  bias = register_parameter("bias", ops::zeros({out}));
  Tensor g;
  {
    graph::NoGrad ng;
    g = weight_norm_magnitude(v, 0);  // [out, 1]
  }
  weight_g = register_parameter("weight_g", g);
  weight_v = register_parameter("weight_v", v);
}

Tensor WeightNormLinear::weight() const { return weight_norm(weight_v, weight_g, 0); }

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
    g = weight_norm_magnitude(v, 2);  // [1, 1, out]
  }
  weight_g = register_parameter("weight_g", g);
  weight_v = register_parameter("weight_v", v);
}

Tensor WeightNormConv1d::weight() const { return weight_norm(weight_v, weight_g, 2); }

Tensor WeightNormConv1d::forward(const Tensor& x) const {
  auto s = scope();
  return ops::conv1d(x, weight(), bias, pad_left, pad_right);
}

}  // namespace models::nn
