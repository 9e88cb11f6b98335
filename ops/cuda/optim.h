// cuda/optim.h: the GPU kernels of the optimizer family, with the contracts of ops/cpu/optim.h.
#pragma once
#include <vector>

#include "engine/tensor.h"
#include "ops/optim.h"

namespace ops::cuda {

// One fused pass over each parameter, its gradient and its slots (all contiguous), up to 48 parameters per
// kernel launch; the math of ops/cpu/optim.cpp line for line, in acc_t (f32; f64 for f64).
void sgd_update(const ParamUpdates& ts, const SgdStep& h);
void adam_update(const ParamUpdates& ts, const AdamStep& h);
void adamax_update(const ParamUpdates& ts, const AdamaxStep& h);
void rmsprop_update(const ParamUpdates& ts, const RmsPropStep& h);

// out[i] = sum of xs[i]^2 in f64 (out: [n] f64; xs contiguous, any floating dtypes). Deterministic two
// stages: each chunk of 65536 elements of a tensor (the CPU's chunk) is one block, whose f64 sum goes to
// partials[c] (chunks numbered tensor after tensor); then each tensor's chunk sums are added in a fixed
// tree. partials: [sum_i ceil(numel_i / 65536)] f64, allocated by the op on every device (checked here).
void squared_norms(const std::vector<engine::Tensor>& xs, const engine::Tensor& out, const engine::Tensor& partials);
// sums[0] = cpu::clip_coefficient_of(sums) (one thread: the cpu's additions in the cpu's order).
void clip_coefficient(const engine::Tensor& sums, double max_norm);

}  // namespace ops::cuda
