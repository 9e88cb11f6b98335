// cpu/resample.h: CPU reference kernels of upsampling and 2-D padding over contiguous NHWC tensors
// (index arithmetic: ops/resample_params.h).
#pragma once
#include "engine/tensor.h"
#include "ops/resample_params.h"

namespace ops::cpu {

// y [N, out_h, out_w, C] from x [N, H, W, C]: y = sum over taps (h, w) of wh * ww * x.
void upsample2d_forward(const engine::Tensor& x, const UpsampleParams& p, const engine::Tensor& y);
// dx [N, H, W, C]: per input pixel, the weighted sum of the g that read it, in increasing output position.
void upsample2d_backward(const engine::Tensor& g, const UpsampleParams& p, const engine::Tensor& dx);
// y [N, top + H + bottom, left + W + right, C].
void pad2d_forward(const engine::Tensor& x, const Pad2dParams& p, const engine::Tensor& y);
// dx [N, H, W, C]: per input pixel, the sum of the g that read it.
void pad2d_backward(const engine::Tensor& g, const Pad2dParams& p, const engine::Tensor& dx);

}  // namespace ops::cpu
