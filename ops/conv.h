// conv.h: 2-D convolution and transposed convolution over channels-last images.
//
// Layouts (ops/conv_params.h): x [N, H, W, Cin], conv2d weight [Cout, KH, KW, Cin/groups] (KRSC; a model
// loading PyTorch's [Cout, Cin/g, KH, KW] permutes it), bias [Cout], y [N, Ho, Wo, Cout], with
//   Ho = (H + 2 pad_h - dilation_h (KH - 1) - 1) / stride_h + 1   (the same for W).
// Groups split Cin and Cout into `groups` independent convolutions (groups == Cin: depthwise). A 1x1
// convolution is the general op too (the GPU maps it to a GEMM).
//
// Three kernels (conv2d_forward, conv2d_backward_data, conv2d_backward_weight, each an op of its own) make
// the whole family, forward and backward at every order:
//   conv2d:                 dx = conv2d_backward_data(dy, w), dw = conv2d_backward_weight(x, dy),
//                           dbias = sum of dy over N, H, W.          Saves x (if w needs grad) and w (if x does).
//   conv2d_backward_data:   linear in (dy, w): d dy = conv2d_forward(ddx, w), d w = conv2d_backward_weight(ddx, dy)
//   conv2d_backward_weight: linear in (x, dy): d x = conv2d_backward_data(dy, ddw), d dy = conv2d_forward(x, ddw)
// so double backward (and higher) is the same three kernels again.
//
// conv_transpose2d is PyTorch's ConvTranspose2d: the data gradient of the convolution whose weight it takes.
// Its weight is [Cin, KH, KW, Cout/groups] (PyTorch's [Cin, Cout/g, KH, KW] permuted), its output
//   Ho = (H - 1) stride_h - 2 pad_h + dilation_h (KH - 1) + output_padding_h + 1,
// and it is computed as conv2d_backward_data with the roles of x and y exchanged (+ bias).
//
// FLOPs: 2 * N*Ho*Wo * Cout * KH*KW*Cin/g for each kernel (Ho, Wo, Cout, Cin of the convolution).
// conv2d_backward_weight allocates the GPU's split-reduction workspace, f32 [splits, Cout, KH, KW, Cin/g]
// when conv2d_weight_grad_splits(g) > 1, on every device (meta predicts the GPU; the cpu leaves it unused).
#pragma once
#include "engine/tensor.h"
#include "ops/conv_params.h"

namespace ops {

using engine::Shape;
using engine::Tensor;

// The geometry of conv2d(x, weight) with params, or an Error naming `op` for a non-4-D operand, a channel
// mismatch, groups not dividing Cin or Cout, non-positive stride / dilation / groups, negative padding, or an
// output size <= 0 (naming the input size, kernel, padding, dilation and stride).
ConvGeometry conv2d_geometry(const char* op, const Shape& x, const Shape& weight, const Conv2dParams& p);

// y [N, Ho, Wo, Cout] = conv(x [N, H, W, Cin], weight [Cout, KH, KW, Cin/g]) + bias [Cout] (or undefined).
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor(), const Conv2dParams& p = {});

// y [N, Ho, Wo, Cout] for x [N, H, W, Cin], weight [Cin, KH, KW, Cout/g], bias [Cout] (or undefined);
// output_padding < stride or < dilation (PyTorch's rule) adds rows / columns at the bottom / right.
Tensor conv_transpose2d(const Tensor& x, const Tensor& weight, const Tensor& bias, const Conv2dParams& p = {},
                        int64_t output_padding_h = 0, int64_t output_padding_w = 0);

// The three kernels as ops, for an explicit geometry g (the convolution's, whatever op uses them). Operands
// must have the geometry's shapes: x [n, h, w, cin], weight [cout, kh, kw, cin/g], y and dy [n, ho, wo, cout].
Tensor conv2d_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, const ConvGeometry& g);
Tensor conv2d_backward_data(const Tensor& dy, const Tensor& weight, const ConvGeometry& g);    // dx
Tensor conv2d_backward_weight(const Tensor& x, const Tensor& dy, const ConvGeometry& g);       // dw

}  // namespace ops
