// cpu/batch_norm.h: CPU reference kernels of batch normalization over the rows of a contiguous x [M, C]
// (any leading shape, C last). The statistics are taken in `chunks` fixed row chunks combined in order,
// the partition the GPU uses (ops/batch_norm.h).
#pragma once
#include "engine/tensor.h"

namespace ops::cpu {

// Batch statistics: mean and invstd [C] (acc_t of x's dtype) of x's columns; when running_mean and
// running_var are defined they are updated in place with momentum (unbiased variance).
void batch_norm_stats(const engine::Tensor& x, int64_t chunks, double eps, double momentum,
                      const engine::Tensor& mean, const engine::Tensor& invstd, const engine::Tensor& running_mean,
                      const engine::Tensor& running_var);
// Running statistics as the normalization's: mean = running_mean, invstd = 1 / sqrt(running_var + eps).
void batch_norm_running_stats(const engine::Tensor& running_mean, const engine::Tensor& running_var, double eps,
                              const engine::Tensor& mean, const engine::Tensor& invstd);
// y [M, C] = act((x - mean) * invstd * weight + bias + residual), act(p) = p > 0 ? p : slope p (slope 1: none;
// ops/batch_norm.h's NormActivation); weight, bias [C] and residual [M, C] (contiguous) or undefined.
void batch_norm_normalize(const engine::Tensor& x, const engine::Tensor& mean, const engine::Tensor& invstd,
                          const engine::Tensor& weight, const engine::Tensor& bias, const engine::Tensor& y,
                          double slope = 1.0, const engine::Tensor& residual = engine::Tensor());
// dx [M, C], dweight [C], dbias [C] (each may be undefined: not computed) from contiguous g and x;
// batch_stats: dx has the terms of the statistics' own gradients (training). With slope != 1, g is first multiplied
// by act'(p) = p > 0 ? 1 : slope, p the normalization's output recomputed from x, weight and bias; or, when y (the
// forward's output act(p + residual)) is defined, by y > 0 ? 1 : slope, and that product g' is written to dresidual
// when it is defined.
void batch_norm_backward(const engine::Tensor& g, const engine::Tensor& x, const engine::Tensor& weight,
                         const engine::Tensor& mean, const engine::Tensor& invstd, bool batch_stats, int64_t chunks,
                         const engine::Tensor& dx, const engine::Tensor& dweight, const engine::Tensor& dbias,
                         const engine::Tensor& bias = engine::Tensor(), double slope = 1.0,
                         const engine::Tensor& y = engine::Tensor(),
                         const engine::Tensor& dresidual = engine::Tensor());

}  // namespace ops::cpu
