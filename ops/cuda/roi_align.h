// cuda/roi_align.h: RoIAlign's GPU kernels, with ops/cpu/roi_align.h's contract and its geometry (the same
// ENGINE_HD functions), so forward and backward agree with the cpu's bit for bit.
#pragma once
#include <vector>

#include "engine/tensor.h"
#include "ops/roi_align.h"

namespace ops::cuda {

void roi_align_forward(const std::vector<engine::Tensor>& levels, const engine::Tensor& rois,
                       const engine::Tensor& roi_levels, const RoiAlignParams& p, const engine::Tensor& y);
void roi_align_backward(const engine::Tensor& g, const engine::Tensor& rois, const engine::Tensor& roi_levels,
                        const RoiAlignParams& p, const std::vector<engine::Tensor>& dx);

}  // namespace ops::cuda
