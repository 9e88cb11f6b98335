// resample.h: nearest and bilinear upsampling and 2-D padding (constant, reflection) of NHWC images, and
// their backward ops.
//
//   upsample_nearest2d(x, out_h, out_w)                x [N, H, W, C] -> [N, out_h, out_w, C]
//   upsample_nearest2d_scale(x, scale_h, scale_w)      out = floor(in * scale); indices map through 1 / scale
//   upsample_bilinear2d(x, out_h, out_w, align_corners), upsample_bilinear2d_scale(x, sh, sw, align_corners)
//   pad2d(x, p)                                         x [N, H, W, C] -> [N, top + H + bottom, left + W + right, C]
// Source indices and weights are PyTorch's exact formulas (ops/resample_params.h; the _scale forms are
// F.interpolate(scale_factor=...) without recompute_scale_factor; with align_corners the scale is unused, as
// in PyTorch). Reflection padding is ReflectionPad2d's (the edge is not repeated; each pad < the size).
// x is made contiguous on every device alike. Nothing is saved for backward (only shapes): the ops are
// linear. FLOPs: 0 for nearest and padding (data movement), 3 per output element for bilinear.
//
// Backward ops are gathers (deterministic, no atomics): each input pixel sums, in increasing output
// position, the output gradients that read it, times their weights. Each backward op is the adjoint of its
// forward, so their rules are each other:
//   upsample -> upsample2d_backward(g), whose rule is the upsample again;  pad2d -> pad2d_backward(g), whose
//   rule is pad2d with zero padding (the constant does not depend on x).
#pragma once
#include "engine/tensor.h"
#include "ops/resample_params.h"

namespace ops {

using engine::Shape;
using engine::Tensor;

Tensor upsample_nearest2d(const Tensor& x, int64_t out_h, int64_t out_w);
Tensor upsample_nearest2d_scale(const Tensor& x, double scale_h, double scale_w);
Tensor upsample_bilinear2d(const Tensor& x, int64_t out_h, int64_t out_w, bool align_corners);
Tensor upsample_bilinear2d_scale(const Tensor& x, double scale_h, double scale_w, bool align_corners);
// The general form (p.out_h, p.out_w are the output size) and its backward: dx of x_shape from g.
Tensor upsample2d(const Tensor& x, const UpsampleParams& p);
Tensor upsample2d_backward(const Tensor& g, const Shape& x_shape, const UpsampleParams& p);

Tensor pad2d(const Tensor& x, const Pad2dParams& p);
Tensor pad2d_backward(const Tensor& g, const Shape& x_shape, const Pad2dParams& p);

}  // namespace ops
