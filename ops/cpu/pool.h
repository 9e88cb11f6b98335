// cpu/pool.h: CPU reference kernels of 2-D pooling over contiguous NHWC tensors (geometry: ops/pool_params.h).
#pragma once
#include "engine/tensor.h"
#include "ops/pool_params.h"

namespace ops::cpu {

// y [N, Ho, Wo, C] = window maxima of x [N, H, W, C]; indices [N, Ho, Wo, C] i32 = h * W + w of each.
void max_pool2d_forward(const engine::Tensor& x, const Pool2dParams& p, const engine::Tensor& y,
                        const engine::Tensor& indices);
// dx [N, H, W, C]: per input pixel, the sum of g over the windows whose index is that pixel.
void max_pool2d_backward(const engine::Tensor& g, const engine::Tensor& indices, const Pool2dParams& p,
                         const engine::Tensor& dx);
void avg_pool2d_forward(const engine::Tensor& x, const Pool2dParams& p, const engine::Tensor& y);
// dx [N, H, W, C]: per input pixel, the sum of g / divisor over the windows that contain it.
void avg_pool2d_backward(const engine::Tensor& g, const Pool2dParams& p, const engine::Tensor& dx);

}  // namespace ops::cpu
