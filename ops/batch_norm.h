// batch_norm.h: batch normalization over every dimension but the last (channels-last: x [..., C], NHWC for
// images), and its fused backward op.
//
//   batch_norm(x, weight, bias, running_mean, running_var, training, momentum, eps)     x [..., C] -> [..., C]
//       y = (x - mean) * invstd * weight + bias,   invstd = 1 / sqrt(var + eps),  per channel c
//   (optionally followed by a residual add and an activation in the same pass: NormActivation and residual below)
// Batch statistics (training, or no running statistics): mean and biased var of column c over the M = numel / C
// rows; with running statistics they are then updated in place, as PyTorch does:
//       running_mean = (1 - momentum) running_mean + momentum mean
//       running_var  = (1 - momentum) running_var  + momentum var * M / (M - 1)      (unbiased)
// Evaluation (training false, running statistics given): mean = running_mean, var = running_var, nothing
// updated. "Frozen" batch norm (detection backbones) is evaluation with weight and bias: a model's choice.
// weight and bias ([C], x's dtype) may each be undefined (affine off); running_mean and running_var ([C],
// contiguous, the statistics dtype: f32, f64 for f64 x) both given or both undefined.
// Statistics and arithmetic are in f32 (f64 for f64 inputs) whatever the storage dtype. FLOPs: 7 per element
// forward (training), 11 backward. x (and g in backward) are made contiguous on every device alike.
//
// Deterministic statistics: the M rows are cut into P = batch_norm_chunks(M) fixed chunks; each chunk's mean
// and sum of squared deviations are combined in chunk order (Chan et al.'s pairwise update), on every
// device. The GPU keeps the chunk partials in an op-level workspace [P, 2, C] (stats dtype) allocated on
// every device alike (cpu and meta leave it unused), so meta predicts the GPU's memory exactly.
//
// Under graph::recompute a training-mode call runs twice and would update the running statistics twice (as
// PyTorch's checkpointing does): callers pass no running statistics when graph::recomputing() (the models'
// BatchNorm2d does), so the second run only recomputes the batch statistics.
//
// Saved for backward: x, and the per-channel mean and invstd [C] (stats dtype) that normalized it (batch
// statistics, or the running ones copied at the time of the call), as cuDNN saves. Not y. A fused activation
// (NormActivation below) saves the bias too.
//
// Backward: batch_norm_backward is one op with up to four outputs (dx, dweight, dbias, dresidual) recorded as ONE
// multi-output node. With xhat = (x - mean) invstd, sums over the M rows per channel:
//   dbias = sum g,  dweight = sum g xhat,
//   dx    = invstd weight (g - dbias / M - xhat dweight / M)     (batch statistics)
//   dx    = invstd weight g                                      (running statistics: constants)
// Its own rule (double backward) is written with engine ops; with batch statistics it recomputes mean and
// invstd from x with ops, so it is differentiable in x again, to any order.
#pragma once
#include <algorithm>
#include <array>
#include <cstdint>

#include "engine/tensor.h"

namespace ops {

using engine::Tensor;

// An activation applied to the normalization's output in the same kernel: act(p) = p > 0 ? p : slope p, so slope 1
// is none, 0 ReLU, 0.1 darknet's leaky ReLU. The same values and gradients as relu / leaky_relu applied to
// batch_norm's output, without that op's pass over the tensor (and its own output): the backward multiplies g by
// p > 0 ? 1 : slope with p recomputed from x, weight and bias (the bias is saved besides x, mean and invstd).
struct NormActivation {
  double slope = 1.0;
  static NormActivation relu() { return {0.0}; }
  static NormActivation leaky_relu(double negative_slope) { return {negative_slope}; }
  bool on() const { return slope != 1.0; }
};

// With a residual (x's shape, dtype and device): y = act(batch_norm(x) + residual), the end of a residual block
// (ResNet's relu(bn3(conv3(h)) + shortcut)) in the normalization's pass: it reads x and the residual and writes y,
// where batch_norm, add and relu would write and read two more tensors of x's size. Its gradient to the residual is
// g act'(y), act'(y) = y > 0 ? 1 : slope (the same as at the pre-activation for slope >= 0, which a residual with
// an activation requires); the activation's output y is saved for it instead of the bias.
Tensor batch_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                  const Tensor& running_var, bool training, double momentum = 0.1, double eps = 1e-5,
                  NormActivation act = {}, const Tensor& residual = Tensor());

struct BatchNormGrads {
  Tensor dx, dweight, dbias, dresidual;  // undefined where not requested
};
// g, x [..., C]; weight [C] or undefined; mean, invstd [C] (stats dtype) as batch_norm saved them;
// batch_stats: whether mean and invstd were the batch's own statistics (training) or constants (running).
// output_mask = {dx, dweight, dbias, dresidual} (dweight needs a weight, dresidual a y). With act: the gradients of
// act(batch_norm(x)), g being the activation's output gradient (bias [C] or undefined, as batch_norm had it); with
// act and y (the forward's output with a residual): those of act(batch_norm(x) + residual), the activation's
// derivative read from y, and dresidual = g act'(y).
BatchNormGrads batch_norm_backward(const Tensor& g, const Tensor& x, const Tensor& weight, const Tensor& mean,
                                   const Tensor& invstd, bool batch_stats, double eps, std::array<bool, 4> output_mask,
                                   const Tensor& bias = Tensor(), NormActivation act = {}, const Tensor& y = Tensor());

// Instance normalization (PyTorch's InstanceNorm2d with affine=False and track_running_stats=False, as pix2pixHD
// uses it): x [N, ..., C] channels last (NHWC images), statistics per sample and channel over the middle dimensions,
//       y[n] = (x[n] - mean[n]) * invstd[n],   mean, var (biased) of x[n]'s column c,   invstd = 1 / sqrt(var + eps)
// It is batch normalization of each sample on its own, and runs as exactly that: sample n of a contiguous x is the
// contiguous [S, C] block at n S C (S = numel / (N C)), given to the batch-norm kernels as it is, one sample after
// another, with the same fixed chunks (batch_norm_chunks(S)) and one [P, 2, C] workspace, so it is deterministic
// and as fast per sample as batch norm. Saved for backward: x and mean, invstd [N, C] (stats dtype). Backward
// (instance_norm_backward, one op): per sample, batch norm's dx with batch statistics and no weight; its rule
// (double backward) is normalization_double_backward over the middle dimensions of x seen as [N, S, C].
Tensor instance_norm(const Tensor& x, double eps = 1e-5);
// g, x [N, ..., C]; mean, invstd [N, C] as instance_norm saved them. Returns dx.
Tensor instance_norm_backward(const Tensor& g, const Tensor& x, const Tensor& mean, const Tensor& invstd, double eps);

// The fixed row chunks of the statistics and of the backward's column sums: about 256 or more rows each, at
// most 256 chunks (a [256, 2, C] f32 workspace is 4 MiB at C = 2048). A function of M alone, never of the GPU.
inline int64_t batch_norm_chunks(int64_t rows) {
  return std::min<int64_t>(256, std::max<int64_t>(1, (rows + 255) / 256));
}

}  // namespace ops
