// cpu/norm.h: CPU reference kernels of layer normalization (rows along the last dimension, any strides) and of
// weight normalization (channels along one dimension, contiguous tensors).
#pragma once
#include "engine/tensor.h"

namespace ops::cpu {

// y [..., C] = (x - mean) * rstd * weight + bias; writes mean and rstd [rows] (dtype acc_t of x's).
// weight, bias: [C] or undefined.
void layer_norm_forward(const engine::Tensor& x, const engine::Tensor& weight, const engine::Tensor& bias,
                        double eps, const engine::Tensor& y, const engine::Tensor& mean, const engine::Tensor& rstd);
// dx [..., C], dweight [C], dbias [C] (each may be undefined: not computed) from g, x, weight (or
// undefined) and the saved mean, rstd.
void layer_norm_backward(const engine::Tensor& g, const engine::Tensor& x, const engine::Tensor& weight,
                         const engine::Tensor& mean, const engine::Tensor& rstd, const engine::Tensor& dx,
                         const engine::Tensor& dweight, const engine::Tensor& dbias);

// Weight normalization with v viewed as [outer, n, inner] (contiguous; n = v.size(dim), the channels): norm_sq [n]
// (acc_t of v's) = the sum over (o, i) of v^2, each channel's squared norm; w = v * (g / sqrt(norm_sq)) per
// channel, rounded once. g: n values, contiguous, v's dtype.
void weight_norm_forward(const engine::Tensor& v, const engine::Tensor& g, int64_t dim, const engine::Tensor& w,
                         const engine::Tensor& norm_sq);
// From the upstream gradient dw (v's shape, contiguous) and the saved norm_sq, per channel with r = sqrt(norm_sq)
// and s = the sum over (o, i) of dw * v:  dv = (g / r) * (dw - v * s / r^2),  dg = s / r.  dv or dg may be
// undefined (not computed).
void weight_norm_backward(const engine::Tensor& dw, const engine::Tensor& v, const engine::Tensor& g,
                          const engine::Tensor& norm_sq, int64_t dim, const engine::Tensor& dv,
                          const engine::Tensor& dg);

}  // namespace ops::cpu
