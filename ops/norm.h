// norm.h: layer normalization over the last dimension, and its fused backward op; weight normalization.
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
#include <vector>

#include "engine/tensor.h"

namespace ops {

using engine::Tensor;

Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps = 1e-5);

// layer_norm(add(dropout(y, p, training), residual), weight, bias, eps): the post-norm residual step of BERT and
// the Transformer in one op, with the numbers of the three (the same dropout draw reserved at the same point, the
// dropped y and the sum rounded to y's dtype where dropout and add round them). y and residual have one shape.
// Recorded as the three ops' graph (two nodes: the sum, whose rule sends its gradient to the residual and,
// through dropout_mask_apply, to y; and layer_norm's on the sum), so backward, the saved tensors (the sum,
// mean, rstd, weight; no mask) and double backward are the three ops'. On the GPU the forward is one pass:
// y and the residual read, the sum and the output written (the three ops: 7 passes over [..., C]).
Tensor dropout_add_layer_norm(const Tensor& y, const Tensor& residual, const Tensor& weight, const Tensor& bias,
                              double p, bool training, double eps = 1e-5);

struct LayerNormGrads {
  Tensor dx, dweight, dbias;  // undefined where not requested
};
// g, x [..., C]; weight [C] or undefined; mean, rstd [rows] as saved by layer_norm.
// output_mask = {dx, dweight, dbias}: which gradients to compute (dweight needs a weight).
LayerNormGrads layer_norm_backward(const Tensor& g, const Tensor& x, const Tensor& weight, const Tensor& mean,
                                   const Tensor& rstd, double eps, std::array<bool, 3> output_mask);

// Weight normalization (Salimans & Kingma 2016; torch.nn.utils.weight_norm's reparametrization) as one op:
//   weight_norm(v, g, dim)   v [..., n, ...] (n = v.size(dim), the channels), g with v's shape but 1 in every
//       dimension except dim  ->  w = v * g / ||v||, ||v|| per channel: the norm over every dimension but dim.
// The squared norms are summed in float (double for f64) and w rounded once; FLOPs 3 per element.
// Saved: v, g and the squared norms [n] (f32; f64 for f64). The composition it replaces (square, sum, sqrt, div,
// mul: five ops and a full-size temporary forward, about ten backward) is its definition and its test's reference.
//
// Backward: weight_norm_backward, one op for both gradients from one read of dw and v for the sums and one pass:
//   with r = ||v|| and s = sum over a channel of dw * v:   dv = (g / r) (dw - v s / r^2),   dg = s / r.
// Under create_graph (the gradient differentiated again) it computes them with engine ops, from v.
Tensor weight_norm(const Tensor& v, const Tensor& g, int64_t dim);
// ||v|| per channel, shaped as weight_norm's g (the g that makes w = v: a layer's initial g), with engine ops.
Tensor weight_norm_magnitude(const Tensor& v, int64_t dim);

// Whether weight_norm's kernels take one pass each way (no partial-sums workspace): v's channels are its rows
// (nothing before dim but sizes of 1: a Linear's [out, in] by output) or its columns (nothing after dim: a
// convolution's [K, Cin, Cout] by output channel). Other layouts sum through reduce's split workspace first. A
// shape rule, so every device allocates alike.
bool weight_norm_one_pass(const engine::Shape& v_shape, int64_t dim);

struct WeightNormGrads {
  Tensor dv, dg;  // undefined where not requested
};
// dw: the gradient of w (v's shape); norm_sq: the squared norms [n] saved by weight_norm; output_mask = {dv, dg}.
WeightNormGrads weight_norm_backward(const Tensor& dw, const Tensor& v, const Tensor& g, const Tensor& norm_sq,
                                     int64_t dim, std::array<bool, 2> output_mask);

// The double backward of a normalization's backward op, shared by layer norm (statistics over the last
// dimension of each row) and batch norm (over the rows of each channel, or running statistics that do not
// depend on x), written with ops so that it is itself differentiable (ops/norm.cpp derives it). g, w: the
// saved upstream gradient and weight (w may be undefined); r, xhat: 1/sigma and the normalized x; `dims`: the
// dimensions one statistic reduces over, `count` values each; hx, hw, hb: the upstream gradients of dx,
// dweight, dbias; `needs`: which of (g, x, weight) need a gradient. Returns {dg, dx, dweight}.
std::vector<Tensor> normalization_double_backward(const Tensor& g, const Tensor& w, const Tensor& r,
                                                  const Tensor& xhat, const std::vector<int64_t>& dims, double count,
                                                  bool stats_of_x, const Tensor& hx, const Tensor& hw,
                                                  const Tensor& hb, std::array<bool, 3> needs);

}  // namespace ops
