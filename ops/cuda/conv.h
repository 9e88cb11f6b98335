// cuda/conv.h: the GPU kernels of 2-D convolution, with the contract of ops/cpu/conv.h (same arguments,
// same results). Layouts and sizes: ops/conv_params.h (x [N,H,W,Cin], w [Cout,KH,KW,Cin/g], y [N,Ho,Wo,Cout],
// all contiguous). Which kernel runs is a function of the geometry and dtype alone (conv2d_path below):
//   1x1, stride 1, pad 0, groups 1      cuBLASLt GEMMs over the NHWC matrices (ops::cuda::matmul)
//   depthwise (groups == Cin == Cout)   direct kernels (conv_depthwise.cu)
//   bf16/f16, Cin/g and Cout/g % 8 == 0 implicit GEMM on tensor cores (conv_igemm_*.cu), no im2col buffer
//   bf16/f16, Cout/g % 8 == 0 only       the same with x (forward, weight) or w (data gradient, per stride
//                                        phase: <= 64 taps) gathered element by element
//   f32 with engine::allow_tf32(),  the same implicit GEMMs on TF32 tensor cores ("igemm_tf32"; with
//     Cin/g and Cout/g % 4 == 0            Cout/g % 4 == 0 only: "igemm_gather_tf32")
//   f32, Cin/g and Cout/g % 4 == 0       implicit GEMM on CUDA cores, true fp32 (conv_simt.cu; TF32 off)
//   anything else (f64, odd channels)    the generic CUDA-core kernels (conv_generic.cu)
// Channel counts that are not multiples of the channel vector (one group; conv_params.h's conv2d_padded says when)
// are padded in the op's workspace `pad` (undefined when none): Cout with zero filters, Cin with zero channels of x
// (and of the filters); the padded convolution takes the paths above and its real channels are copied out
// ("..._cin_padded", "..._cout_padded", "..._cin_cout_padded" below). With pad undefined the unpadded geometry
// takes its own path (tests use that to reach the gathering kernels).
// True-fp32 3x3 stride-1 layers of >= 64 channels (conv_params.h's conv2d_winograd; not with ENGINE_CONV_WINOGRAD=0)
// run Winograd's F(2x2, 3x3) (conv_winograd.cu: transforms around cuBLASLt GEMMs) in the op's workspace `winograd`
// (f32; of the padded geometry when there is padding), "winograd" below; with it undefined they take the paths above.
#pragma once
#include "engine/tensor.h"
#include "ops/conv_params.h"

namespace ops::cuda {

// y = conv(x, w) + bias (bias [Cout] may be undefined). x [N,H,W,Cin], w [Cout,KH,KW,Cin/g], y [N,Ho,Wo,Cout].
void conv2d_forward(const engine::Tensor& x, const engine::Tensor& w, const engine::Tensor& bias,
                    const engine::Tensor& y, const ConvGeometry& g, const engine::Tensor& pad = engine::Tensor(),
                    const engine::Tensor& winograd = engine::Tensor());
// dx overwritten [N,H,W,Cin].
void conv2d_backward_data(const engine::Tensor& dy, const engine::Tensor& w, const engine::Tensor& dx,
                          const ConvGeometry& g, const engine::Tensor& pad = engine::Tensor(),
                          const engine::Tensor& winograd = engine::Tensor());
// dw overwritten [Cout,KH,KW,Cin/g]; workspace f32 [splits, Cout, KH, KW, Cin/g] when
// conv2d_weight_grad_splits(g) > 1 (undefined otherwise): the split-K partial sums, added in a fixed order (with
// `pad`: of the padded geometry).
void conv2d_backward_weight(const engine::Tensor& x, const engine::Tensor& dy, const engine::Tensor& dw,
                            const engine::Tensor& workspace, const ConvGeometry& g,
                            const engine::Tensor& pad = engine::Tensor(),
                            const engine::Tensor& winograd = engine::Tensor());

// The kernel each pass takes for this geometry and dtype when the op allocated its workspaces (ops/conv.cpp): "gemm",
// "depthwise", "igemm", "igemm_gather", "igemm_tf32", "igemm_gather_tf32", "winograd", "simt", "generic", with
// "_cin_padded", "_cout_padded" or "_cin_cout_padded" appended when channels are padded (e.g.
// "igemm_gather_cout_padded"); for tests and benchmarks. f32 also depends on engine::allow_tf32() (the 1x1 "gemm"
// then runs cuBLASLt's FAST_TF32). The 1x1 GEMM path (and Winograd's GEMMs) use the device's GEMM workspace
// (Device::workspace), which the op must request on every device like ops/matmul.cpp does, so that meta predicts it.
const char* conv2d_path(ConvPass pass, const ConvGeometry& g, engine::DType dtype);

}  // namespace ops::cuda
