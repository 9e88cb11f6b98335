// cpu/conv.h: the CPU reference kernels of 2-D convolution (NHWC activations, KRSC weights; see
// ops/conv_params.h for the layouts and sizes). They are the reference the CUDA kernels (ops/cuda/conv*) are
// checked against and share this exact contract; the algorithm here (im2col + Eigen GEMM per image and group,
// host scratch) is a reference only, not the GPU's implicit GEMM.
#pragma once
#include "engine/tensor.h"
#include "ops/conv_params.h"

namespace ops::cpu {

using engine::Tensor;

// y = conv(x, w) + bias (bias may be undefined). x [N,H,W,Cin], w [Cout,KH,KW,Cin/g], y [N,Ho,Wo,Cout]; all contiguous.
void conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& y, const ConvGeometry& g);
// dx = the gradient of conv2d_forward wrt x, overwriting dx [N,H,W,Cin].
void conv2d_backward_data(const Tensor& dy, const Tensor& w, const Tensor& dx, const ConvGeometry& g);
// dw = the gradient wrt w, overwriting dw [Cout,KH,KW,Cin/g]. workspace: f32 [splits, Cout, KH, KW, Cin/g] when
// conv2d_weight_grad_splits(g) > 1, else undefined; the cpu kernel ignores it (the GPU's partial sums).
void conv2d_backward_weight(const Tensor& x, const Tensor& dy, const Tensor& dw, const Tensor& workspace,
                            const ConvGeometry& g);

}  // namespace ops::cpu
