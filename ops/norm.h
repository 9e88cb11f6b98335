// norm.h: layer normalization over the last dimension, and its fused backward op.
//
//   layer_norm(x, weight, bias, eps)   x [..., C], weight [C] or undefined, bias [C] or undefined -> [..., C]
//       y = (x - mean) * rstd * weight + bias,   mean and var (biased, / C) per row,  rstd = 1 / sqrt(var + eps)
// weight and bias have x's dtype (cast master weights before the call). Statistics and arithmetic are in
// float (double for f64 inputs) whatever the storage dtype. FLOPs: 8 per element forward, 10 backward.
//
// Saved for backward: x, weight, and the per-row mean and rstd [rows] (f32; f64 for f64 inputs), i.e. what
// PyTorch saves; rows = numel / C. Not y.
//
// Backward: layer_norm_backward is one op with up to three outputs (dx, dweight, dbias) from one pass over
// the rows, recorded as ONE multi-output node (the three share all their intermediates). Per row, with
// xhat = (x - mean) * rstd and a = g * weight:
//   dx = rstd * (a - mean(a) - xhat * mean(a * xhat)),   dweight = sum_rows g * xhat,   dbias = sum_rows g.
// Its own rule (double backward) is written with engine ops; it recomputes mean and rstd from x with ops
// (not from the saved f32 statistics), so it is differentiable in x again, to any order.
#pragma once
#include <array>

#include "engine/tensor.h"

namespace ops {

using engine::Tensor;

Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps = 1e-5);

struct LayerNormGrads {
  Tensor dx, dweight, dbias;  // undefined where not requested
};
// g, x [..., C]; weight [C] or undefined; mean, rstd [rows] as saved by layer_norm.
// output_mask = {dx, dweight, dbias}: which gradients to compute (dweight needs a weight).
LayerNormGrads layer_norm_backward(const Tensor& g, const Tensor& x, const Tensor& weight, const Tensor& mean,
                                   const Tensor& rstd, double eps, std::array<bool, 3> output_mask);

}  // namespace ops
