// pool.h: 2-D max, average and global average pooling over NHWC images, and their backward ops.
//
//   max_pool2d(x, p)            x [N, H, W, C] -> [N, Ho, Wo, C]; padding never wins (windows skip it)
//   avg_pool2d(x, p)            x [N, H, W, C] -> [N, Ho, Wo, C]; divisor per Pool2dParams::count_include_pad
//   global_avg_pool2d(x)        x [N, H, W, C] -> [N, 1, 1, C] (adaptive average pooling to 1 x 1: a mean)
// Geometry (kernel, stride, asymmetric padding incl. TensorFlow 'SAME', dilation for max, ceil_mode) and the
// output-size rule: ops/pool_params.h. Padding must be at most half the kernel (PyTorch's rule), so every
// window holds at least one input pixel. x is made contiguous on every device alike. FLOPs: one per window
// tap (the comparisons or adds). NaN propagates through max pooling as in PyTorch.
//
// Memory: max_pool2d saves the argmax of each output as i32 indices [N, Ho, Wo, C] (the flat position
// h * W + w in its image plane): 4 bytes per output element, which is less than x (4 to 16 times smaller for
// 2x2 and 3x3 strided windows) and spares the backward a second pass over the windows. avg_pool2d saves
// nothing (only x's shape).
//
// Backward ops are gathers (deterministic, no atomics): each input pixel sums the gradients of the windows
// that contain it, in increasing output position.
//   max_pool2d -> max_pool2d_backward(g, indices) (sums g where the window's argmax is this pixel),
//                 whose own rule is gather(h, indices) (ops/shape.h): linear in g, zero in x
//   avg_pool2d -> avg_pool2d_backward(g) (sums g / divisor), whose own rule is avg_pool2d(h) (its adjoint)
#pragma once
#include "engine/tensor.h"
#include "ops/pool_params.h"

namespace ops {

using engine::Shape;
using engine::Tensor;

Tensor max_pool2d(const Tensor& x, const Pool2dParams& p);
// dx [N, H, W, C] (x_shape) from g [N, Ho, Wo, C] and the saved i32 indices [N, Ho, Wo, C].
Tensor max_pool2d_backward(const Tensor& g, const Tensor& indices, const Shape& x_shape, const Pool2dParams& p);

Tensor avg_pool2d(const Tensor& x, const Pool2dParams& p);
Tensor avg_pool2d_backward(const Tensor& g, const Shape& x_shape, const Pool2dParams& p);

Tensor global_avg_pool2d(const Tensor& x);

}  // namespace ops
