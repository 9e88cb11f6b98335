// weight_norm.h: weight normalization (Salimans & Kingma 2016; torch.nn.utils.weight_norm) as a
// differentiable reparametrization, and the two weight-normalized layers convs2s is made of.
//
//   w = g * v / ||v||, the norm taken over every dimension of v except `dim` (one norm per output unit).
// w is the engine op ops::weight_norm (ops/norm.h: one pass for the norms, one for w; one backward op for dv
// and dg; double backward through engine ops), so gradients reach g and v through autograd; the layers
// recompute w from (g, v) at every forward, as PyTorch's forward pre-hook does. Parameter names and
// shapes are PyTorch's after weight_norm: weight_g (v's shape with every dimension but `dim` set to 1) and
// weight_v, registered after bias, as in a fairseq state dict. At creation g = ||v||, so w starts equal to
// the initial v.
//
// Memory: w is a temporary of v's size each forward; the layer that uses it saves it for backward (w is
// what its dx needs), so a weight-normalized layer keeps one extra weight-sized activation until backward
// (and the op its [n] squared norms).
#pragma once
#include <memory>

#include "graph/module.h"

namespace models::nn {

using engine::Tensor;

// fairseq's fconv Linear(): nn.Linear with weight ~ N(0, sqrt((1 - dropout) / in)), bias 0, weight_norm(dim=0).
class WeightNormLinear : public graph::Module {
 public:
  WeightNormLinear(int64_t in, int64_t out, double dropout = 0.0);
  Tensor weight() const;                  // [out, in] = g * v / ||v||
  Tensor forward(const Tensor& x) const;  // [..., in] -> [..., out]
  int64_t in_features, out_features;
  Tensor bias;      // [out]
  Tensor weight_g;  // [out, 1]
  Tensor weight_v;  // [out, in]
};

// fairseq's ConvTBC() / LinearizedConv1d(): weight [K, Cin, Cout] ~ N(0, sqrt(4 (1 - dropout) / (K Cin))),
// bias 0, weight_norm(dim=2), applied to [B, T, Cin] with the given paddings (ops::conv1d).
class WeightNormConv1d : public graph::Module {
 public:
  WeightNormConv1d(int64_t in, int64_t out, int64_t kernel_size, int64_t pad_left, int64_t pad_right,
                   double dropout = 0.0);
  Tensor weight() const;                  // [K, Cin, Cout]
  Tensor forward(const Tensor& x) const;  // [B, T, Cin] -> [B, T + pl + pr - K + 1, Cout]
  int64_t in_channels, out_channels, kernel_size, pad_left, pad_right;
  Tensor bias;      // [Cout]
  Tensor weight_g;  // [1, 1, Cout]
  Tensor weight_v;  // [K, Cin, Cout]
};

}  // namespace models::nn
