// cpu/loss.h: CPU reference kernels of the loss family, and the scalar math of the pointwise losses
// (ENGINE_HD, so that a CUDA kernel computes the same function from the same lines).
//
// Every loss is computed in acc_t (float, or double for f64) and written in that type: the loss tensors
// are f32 (f64 for f64 inputs) whatever the input precision. A mean or sum is accumulated in the kernel in
// a fixed order, so no [N] temporary is allocated and results are deterministic.
#pragma once
#include <cmath>
#include <cstdint>

#include "engine/rng.h"  // ENGINE_HD
#include "engine/tensor.h"
#include "ops/loss.h"

namespace ops::cpu {

enum class PointwiseLoss : uint8_t { mse, l1, bce_with_logits, smooth_l1 };

// The loss of one element. mse and l1: a, b are the two inputs. bce_with_logits: a is the logit x, b the
// target t, w the positive weight p (1 without pos_weight), in the stable form
//   (1 - t) x + (1 + (p - 1) t) softplus(-x),  softplus(-x) = max(-x, 0) + log(1 + exp(-|x|)),
// which for p = 1 is max(x, 0) - x t + log(1 + exp(-|x|)). smooth_l1: beta the kind's parameter,
//   0.5 d^2 / beta where |d| < beta, else |d| - 0.5 beta (d = a - b; beta 0: |d|).
template <typename A>
ENGINE_HD A pointwise_loss_term(PointwiseLoss kind, A a, A b, A w, A beta) {
  switch (kind) {
    case PointwiseLoss::mse: return (a - b) * (a - b);
    case PointwiseLoss::l1: return std::fabs(a - b);
    case PointwiseLoss::bce_with_logits: {
      A softplus_neg = (a < A(0) ? -a : A(0)) + std::log1p(std::exp(-std::fabs(a)));
      return (A(1) - b) * a + (A(1) + (w - A(1)) * b) * softplus_neg;
    }
    case PointwiseLoss::smooth_l1: {
      const A d = std::fabs(a - b);
      return d < beta ? A(0.5) * d * d / beta : d - A(0.5) * beta;
    }
  }
  return A(0);
}

// out = the reduction of pointwise_loss_term over a's elements: a, b same shape (any strides), w undefined
// or broadcast to a's shape, param the kind's scalar (smooth_l1's beta). out: [] for mean/sum, a's shape
// (contiguous) for none; dtype acc of a's.
void pointwise_loss(PointwiseLoss kind, const engine::Tensor& a, const engine::Tensor& b, const engine::Tensor& w,
                    double param, Reduction reduction, const engine::Tensor& out);

// logits [N, V] (any float dtype, any strides), target [N] i32/i64. Writes lse [N] (the row log-sum-exp),
// out ([] for mean/sum, [N] for none; 0 on ignored rows) and, for mean, divisor [] = max(#non-ignored, 1).
// Row loss: (1 - eps) (lse - x[t]) + eps (lse - mean_c x[c]).
void cross_entropy_forward(const engine::Tensor& logits, const engine::Tensor& target, int64_t ignore_index,
                           double label_smoothing, Reduction reduction, const engine::Tensor& out,
                           const engine::Tensor& lse, const engine::Tensor& divisor);
// dlogits [N, V] (contiguous, logits' dtype) = a_i (exp(x - lse_i) - q), q = (1 - eps) onehot(t) + eps / V,
// a_i = 0 on ignored rows, else g_i (none), g (sum) or g / divisor (mean).
void cross_entropy_backward(const engine::Tensor& g, const engine::Tensor& logits, const engine::Tensor& target,
                            const engine::Tensor& lse, const engine::Tensor& divisor, int64_t ignore_index,
                            double label_smoothing, Reduction reduction, const engine::Tensor& dlogits);

}  // namespace ops::cpu
