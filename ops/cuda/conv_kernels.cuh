// cuda/conv_kernels.cuh: what the convolution's kernel files share: the geometry as plain ints (passed to
// kernels by value), the launchers of each file (host), called by the dispatcher in conv.cu.
// Pointers are raw device pointers to contiguous tensors; dtype selects the storage type.
#pragma once
#include <cstdint>

#include "engine/dtype.h"
#include "engine/tensor.h"
#include "ops/conv_params.h"

namespace ops::cuda::conv {

struct Dims {
  int n, h, w, cin, cout, kh, kw, ho, wo;
  int sh, sw, ph, pw, dh, dw;
  int groups, cg, coutg;  // groups, Cin / groups, Cout / groups
};

inline Dims dims_of(const ConvGeometry& g) {
  Dims d;
  d.n = int(g.n), d.h = int(g.h), d.w = int(g.w), d.cin = int(g.cin), d.cout = int(g.cout);
  d.kh = int(g.kh), d.kw = int(g.kw), d.ho = int(g.ho), d.wo = int(g.wo);
  d.sh = int(g.p.stride_h), d.sw = int(g.p.stride_w), d.ph = int(g.p.pad_h), d.pw = int(g.p.pad_w);
  d.dh = int(g.p.dilation_h), d.dw = int(g.p.dilation_w);
  d.groups = int(g.p.groups), d.cg = int(g.cin_per_group()), d.coutg = int(g.cout_per_group());
  return d;
}

// conv_generic.cu: any geometry, any floating dtype, CUDA cores.
void generic_forward(const Dims& d, engine::DType t, const void* x, const void* w, const void* bias, void* y);
void generic_data(const Dims& d, engine::DType t, const void* dy, const void* w, void* dx);
void generic_weight(const Dims& d, engine::DType t, const void* x, const void* dy, void* dw);

// conv_depthwise.cu: groups == Cin == Cout. The weight gradient writes `splits` partial sums into ws
// (f32 [splits, C, KH, KW]) and adds them in order, or writes dw directly when splits == 1.
void depthwise_forward(const Dims& d, engine::DType t, const void* x, const void* w, const void* bias, void* y);
void depthwise_data(const Dims& d, engine::DType t, const void* dy, const void* w, void* dx);
void depthwise_weight(const Dims& d, engine::DType t, const void* x, const void* dy, void* dw, float* ws, int splits);

// The tensor-core kernels' 128 x 128 tile: 8 warps of 64 x 32 (variant 0) or 4 warps of 64 x 64 (variant 1).
// A process-wide choice (conv.cu), for benchmarks and tests; set_igemm_wide_variant(-1) restores the default,
// -1: each kernel's own (v1 for the TF32 forward and weight gradient, v0 otherwise).
int igemm_wide_variant();
void set_igemm_wide_variant(int variant);

// Whether the 16-bit implicit GEMMs run their Hopper kernels (wgmma, conv_igemm.cuh): available when the build
// targets sm_90a (the Makefile's CUDA_ARCHS holds 90a, defining ENGINE_WGMMA) and the device is compute
// capability 9.0; set_igemm_wgmma(false) selects the mma.sync kernels instead (tests, benchmarks), true restores
// the default.
bool igemm_wgmma_available();
bool igemm_wgmma();  // available and not switched off
void set_igemm_wgmma(bool on);
// The wgmma tiles (rows x columns of C): by the GEMM's shape (the default; conv_igemm.cuh's wgmma_shape), or one
// shape for every GEMM that runs on wgmma (tests, benchmarks).
enum class WgShape { by_shape, m128n128, m128n256, m256n128 };
WgShape igemm_wgmma_shape();
void set_igemm_wgmma_shape(WgShape s);
// Whether the wgmma forward and data gradient copy their weight tiles with the bulk tensor copy (TMA) rather than
// cp.async (the data gradient when Cout/g is a multiple of 64): on by default; off for tests and benchmarks.
bool igemm_tma();
void set_igemm_tma(bool on);
// Whether the wgmma convolutions of a single group copy their image operand by the im2col bulk tensor copy in the
// warp-specialized kernels (forward and weight gradient with Cin a multiple of 64: conv_igemm_fwd.cu's
// forward_im2col_kernel, conv_igemm_weight.cu's weight_im2col_kernel; the data gradient per stride phase with Cout a
// multiple of 64: conv_igemm_data_phases.cu's) rather than by cp.async: on by default (and only while igemm_tma is);
// off for tests and benchmarks, or for a whole process with ENGINE_CONV_IM2COL=0.
bool igemm_im2col();
void set_igemm_im2col(bool on);
int64_t igemm_im2col_launches();  // how many times that kernel was launched (tests)
void count_igemm_im2col_launch();

// conv_igemm_*.cu: implicit GEMMs on tensor cores; t is bf16 or f16 (requires coutg % 8 == 0, and cg % 8 == 0
// except the gathering variants), or f32, run on TF32 (requires coutg % 4 == 0, cg % 4 == 0
// likewise); 16-byte aligned pointers and every tensor under 2^31 elements (conv.cu's fits_int32).
void igemm_forward(const Dims& d, engine::DType t, const void* x, const void* w, const void* bias, void* y);
// The data gradient over every tap, the taps that miss the output grid (stride > 1) zero-filled: the
// fallback of igemm_data_phases (filters of more than 64 taps).
void igemm_data(const Dims& d, engine::DType t, const void* dy, const void* w, void* dx);
// conv_igemm_data_phases.cu: the data gradient as one GEMM per stride phase (no zero taps), with a gathering
// variant for Cin/g % 8 != 0 (Cin/g % 4 in f32: the weight rows loaded element by element); false (nothing
// launched) unless phases_fit: the filter's taps fit its table and the phases its grid.
constexpr int kMaxPhaseTaps = 64;
inline bool phases_fit(int64_t kh, int64_t kw, int64_t sh, int64_t sw) {
  return kh * kw <= kMaxPhaseTaps && sh * sw <= 65535;
}
bool igemm_data_phases(const Dims& d, engine::DType t, const void* dy, const void* w, void* dx);
void igemm_weight(const Dims& d, engine::DType t, const void* x, const void* dy, void* dw, float* ws, int splits);

// conv_simt.cu: f32 implicit GEMMs on CUDA cores; require cg, coutg % 4 == 0, 16-byte aligned pointers and
// every tensor under 2^31 elements.
void simt_forward(const Dims& d, const float* x, const float* w, const float* bias, float* y);
void simt_data(const Dims& d, const float* dy, const float* w, float* dx);
void simt_weight(const Dims& d, const float* x, const float* dy, float* dw, float* ws, int splits);

// conv_winograd.cu: f32 3x3 stride-1 convolutions by Winograd's F(2x2, 3x3) in the op's workspace ws (conv_params.h's
// conv2d_winograd says when and how large); contiguous f32 tensors, channel counts multiples of 4.
void winograd_forward(const engine::Tensor& x, const engine::Tensor& w, const engine::Tensor& bias,
                      const engine::Tensor& y, const ConvGeometry& g, const engine::Tensor& ws);
void winograd_data(const engine::Tensor& dy, const engine::Tensor& w, const engine::Tensor& dx, const ConvGeometry& g,
                   const engine::Tensor& ws);
void winograd_weight(const engine::Tensor& x, const engine::Tensor& dy, const engine::Tensor& dw,
                     const ConvGeometry& g, const engine::Tensor& ws);

// conv_generic.cu: dw[i] = sum over s < splits of ws[s * count + i], in order of s, rounded to dw's dtype.
void weight_grad_finalize(engine::DType t, const float* ws, int splits, int64_t count, void* dw);

}  // namespace ops::cuda::conv
