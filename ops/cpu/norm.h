// cpu/norm.h: CPU reference kernels of layer normalization (rows along the last dimension, any strides).
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

}  // namespace ops::cpu
