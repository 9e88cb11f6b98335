// cuda/batch_norm.h: the GPU kernels of batch normalization, with the contract of ops/cpu/batch_norm.h; the
// row chunks are the workspace's first dimension P (ops::batch_norm_chunks), whose [P, 2, C] partials the
// kernels fill and then combine in chunk order (deterministic, no atomics).
#pragma once
#include "engine/tensor.h"

namespace ops::cuda {

// As cpu::batch_norm_stats; workspace [P, 2, C] (stats dtype, contiguous): chunk means and M2s.
void batch_norm_stats(const engine::Tensor& x, double eps, double momentum, const engine::Tensor& mean,
                      const engine::Tensor& invstd, const engine::Tensor& running_mean,
                      const engine::Tensor& running_var, const engine::Tensor& workspace);
void batch_norm_running_stats(const engine::Tensor& running_mean, const engine::Tensor& running_var, double eps,
                              const engine::Tensor& mean, const engine::Tensor& invstd);
void batch_norm_normalize(const engine::Tensor& x, const engine::Tensor& mean, const engine::Tensor& invstd,
                          const engine::Tensor& weight, const engine::Tensor& bias, const engine::Tensor& y,
                          double slope = 1.0, const engine::Tensor& residual = engine::Tensor());
// As cpu::batch_norm_backward (slope: the fused activation's, 1 for none); workspace [P, 2, C] (stats dtype) is
// given whenever the column sums are needed (dweight, dbias, or dx with batch statistics).
void batch_norm_backward(const engine::Tensor& g, const engine::Tensor& x, const engine::Tensor& weight,
                         const engine::Tensor& mean, const engine::Tensor& invstd, bool batch_stats,
                         const engine::Tensor& dx, const engine::Tensor& dweight, const engine::Tensor& dbias,
                         const engine::Tensor& workspace, const engine::Tensor& bias = engine::Tensor(),
                         double slope = 1.0, const engine::Tensor& y = engine::Tensor(),
                         const engine::Tensor& dresidual = engine::Tensor());

}  // namespace ops::cuda
