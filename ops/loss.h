// loss.h: training objectives: cross-entropy (fused with log-softmax, label smoothing, ignore_index),
// mean squared error, L1, and binary cross-entropy on logits.
//
// Every loss returns f32 (f64 for f64 inputs) whatever the input dtype: the mixed-precision recipes keep the
// loss in float. Reduction: mean (default) gives a 0-d tensor averaged over the non-ignored elements, sum a
// 0-d sum, none one loss per element (per row for cross-entropy; ignored rows are 0).
//
// cross_entropy(logits [N, V], target [N] i64/i32, ignore_index, eps = label_smoothing):
//   row loss = (1 - eps) * (lse - x[t]) + eps * mean_c(lse - x[c]),  lse = log sum_c exp(x[c])
//   (PyTorch / fairseq label smoothing), rows with target == ignore_index count for nothing. A mean over an
//   all-ignored batch is 0, not NaN as in PyTorch (0 / 0): the divisor is max(#non-ignored, 1), so a batch
//   without targets contributes no loss and no gradient instead of poisoning the step.
//   Saved for backward: logits, target and the row log-sum-exp [N] (no [N, V] probabilities).
//   Backward: cross_entropy_backward = a_i (softmax(x) - q) in one kernel, q the smoothed one-hot and a_i
//   the row's share of g (0 on ignored rows). Its own rule is written with ops (softmax_backward for d/dx,
//   the kernel at g = 1 for d/dg), so double backward works.
//   FLOPs: 4 per logit forward (max, subtract, exp, sum), 4 backward. A target outside [0, V) that is not
//   ignore_index is an Error naming it (raised by the kernel: meta has no data).
// mse_loss(a, b) = (a - b)^2, l1_loss(a, b) = |a - b|: a and b of one shape and dtype.
// smooth_l1_loss(a, b, beta) = 0.5 (a - b)^2 / beta where |a - b| < beta, else |a - b| - 0.5 beta (PyTorch's
//   F.smooth_l1_loss; beta 0 is l1_loss). Mask R-CNN's box regression (beta 1/9 in the RPN, 1 in the box head).
// bce_with_logits(x, t, pos_weight) = (1 - t) x + (1 + (p - 1) t) softplus(-x) in the stable form
//   max(x, 0) - x t + log(1 + exp(-|x|)) (p = 1 without pos_weight); pos_weight broadcasts to x's shape
//   (one weight per class in the last dimension). As in PyTorch.
// The pointwise losses compute value and reduction in one kernel and save their inputs; their backward
// rules are plain engine ops (2 (a - b) g, sign(a - b) g, sigmoid(x) - t ...), so double backward works.
#pragma once
#include <cstdint>

#include "engine/tensor.h"

namespace ops {

using engine::Tensor;

enum class Reduction : uint8_t { mean, sum, none };

// The dtype every loss computes and returns in: f64 for f64 inputs, else f32 (the half types widened).
engine::DType loss_dtype(engine::DType input);

Tensor cross_entropy(const Tensor& logits, const Tensor& target, int64_t ignore_index = -100,
                     double label_smoothing = 0.0, Reduction reduction = Reduction::mean);
// The gradient of cross_entropy with respect to the logits, given the loss gradient g ([] for mean/sum,
// [N] for none), the forward's row log-sum-exp lse [N] and, for mean, its divisor [] (max(#non-ignored, 1);
// undefined otherwise). lse and divisor are caches of functions of logits and target, not inputs.
Tensor cross_entropy_backward(const Tensor& g, const Tensor& logits, const Tensor& target, const Tensor& lse,
                              const Tensor& divisor, int64_t ignore_index, double label_smoothing,
                              Reduction reduction);

Tensor mse_loss(const Tensor& a, const Tensor& b, Reduction reduction = Reduction::mean);
Tensor l1_loss(const Tensor& a, const Tensor& b, Reduction reduction = Reduction::mean);
Tensor smooth_l1_loss(const Tensor& a, const Tensor& b, double beta, Reduction reduction = Reduction::mean);
Tensor bce_with_logits(const Tensor& logits, const Tensor& target, const Tensor& pos_weight = Tensor(),
                       Reduction reduction = Reduction::mean);

}  // namespace ops
