// cuda/loss.h: the GPU kernels of the loss family, with the contracts of ops/cpu/loss.h plus the small
// workspaces that make their mean/sum reductions deterministic without atomics (allocated by the ops in
// ops/loss.cpp on every device, so that meta predicts cuda exactly).
#pragma once
#include <cstdint>

#include "engine/tensor.h"
#include "ops/cpu/loss.h"  // PointwiseLoss, Reduction

namespace ops::cuda {

// As ops::cpu::pointwise_loss. partials [P] (acc dtype) is given for mean/sum: block b reduces a fixed
// slice of the elements into partials[b], then one block adds the P partials in a fixed order.
void pointwise_loss(cpu::PointwiseLoss kind, const engine::Tensor& a, const engine::Tensor& b, const engine::Tensor& w,
                    double param, Reduction reduction, const engine::Tensor& out, const engine::Tensor& partials);

// As ops::cpu::cross_entropy_forward. row_loss [N] (acc dtype) is given for mean/sum: the per-row losses,
// added by one block in a fixed order. A target outside [0, V) (and not ignore_index) throws the CPU's
// error at the stream's next synchronization (see IndexError in kernel_util.cuh).
void cross_entropy_forward(const engine::Tensor& logits, const engine::Tensor& target, int64_t ignore_index,
                           double label_smoothing, Reduction reduction, const engine::Tensor& out,
                           const engine::Tensor& lse, const engine::Tensor& divisor, const engine::Tensor& row_loss);

// As ops::cpu::cross_entropy_backward.
void cross_entropy_backward(const engine::Tensor& g, const engine::Tensor& logits, const engine::Tensor& target,
                            const engine::Tensor& lse, const engine::Tensor& divisor, int64_t ignore_index,
                            double label_smoothing, Reduction reduction, const engine::Tensor& dlogits);

}  // namespace ops::cuda
