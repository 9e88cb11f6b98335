// cuda/conv.cu: the convolution's GPU entry points: checks, then the choice of kernel per pass (a function of
// the geometry and the dtype alone, see conv.h), and the 1x1 path, which is a plain GEMM over the NHWC
// matrices through ops::cuda::matmul (cuBLASLt):
//   forward  y[NHW, Cout]  = x[NHW, Cin] @ w[Cout, Cin]^T + bias   (bias in the GEMM's epilogue)
//   data     dx[NHW, Cin]  = dy[NHW, Cout] @ w[Cout, Cin]
//   weight   dw[Cout, Cin] = dy[NHW, Cout]^T @ x[NHW, Cin]
// The transposes are strided views: no copies.
#include <set>
#include <string>

#include "engine/cuda/runtime.h"
#include "engine/env.h"
#include "ops/cuda/conv.h"
#include "ops/cuda/conv_kernels.cuh"
#include "ops/cuda/kernel_util.cuh"
#include "ops/cuda/matmul.h"
#include "ops/cuda/wgmma.cuh"

namespace ops::cuda {

namespace conv {

namespace {
constexpr int kDefaultWideVariant = -1;  // each kernel's default (conv_igemm.cuh: wide_warps_64x64)
int wide_variant = kDefaultWideVariant;
bool wgmma_on = true;
WgShape wgmma_shape = WgShape::by_shape;
bool tma_on = true;
int im2col_state = -1;  // 1 on, 0 off, -1 not yet read from the environment (igemm_im2col)
int64_t im2col_launches = 0;
}  // namespace

int igemm_wide_variant() { return wide_variant; }
void set_igemm_wide_variant(int variant) { wide_variant = variant < 0 ? kDefaultWideVariant : variant; }

bool igemm_wgmma_available() { return wgmma::available(); }
bool igemm_wgmma() { return wgmma_on && igemm_wgmma_available(); }
void set_igemm_wgmma(bool on) { wgmma_on = on; }
WgShape igemm_wgmma_shape() { return wgmma_shape; }
void set_igemm_wgmma_shape(WgShape s) { wgmma_shape = s; }
bool igemm_tma() { return tma_on; }
void set_igemm_tma(bool on) { tma_on = on; }
// On unless ENGINE_CONV_IM2COL=0 (read at the first convolution: a whole model's step without the im2col bulk copies,
// for measuring) or a test switched it.
bool igemm_im2col() {
  if (im2col_state < 0)
    im2col_state =
        engine::env_switch("ENGINE_CONV_IM2COL", true, "the convolutions' cp.async kernels", "the im2col bulk copies");
  return im2col_state && tma_on;
}
void set_igemm_im2col(bool on) { im2col_state = on; }
int64_t igemm_im2col_launches() { return im2col_launches; }
void count_igemm_im2col_launch() { im2col_launches++; }

}  // namespace conv

using engine::DType;
using engine::Tensor;

namespace {

bool igemm_dtype(DType t) { return t == DType::bf16 || t == DType::f16; }

// The implicit GEMMs index with 32-bit offsets.
bool fits_int32(const ConvGeometry& g) {
  const int64_t limit = int64_t(1) << 31;
  return g.n * g.h * g.w * g.cin < limit && g.n * g.ho * g.wo * g.cout < limit && g.cout * g.gemm_k() < limit;
}

bool all_aligned(std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts)
    if (t->defined() && !aligned16(t->data_ptr())) return false;
  return true;
}

void check_operands(const char* op, const ConvGeometry& g, std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts) {
    if (!t->defined()) continue;
    ENGINE_CHECK(t->is_contiguous(), op, ": cuda kernels take contiguous tensors, got one of shape ",
                 engine::shape_str(t->shape()));
    ENGINE_CHECK(t->dtype() == (*ts.begin())->dtype(), op, ": every operand must have dtype ",
                 engine::dtype_name((*ts.begin())->dtype()), ", got ", engine::dtype_name(t->dtype()));
  }
  ENGINE_CHECK(g.p.groups >= 1 && g.cin % g.p.groups == 0 && g.cout % g.p.groups == 0, op, ": groups ", g.p.groups,
               " must divide Cin ", g.cin, " and Cout ", g.cout);
}

// A [rows, cols] view of t's storage with the given strides (no copy).
Tensor matrix(const Tensor& t, int64_t rows, int64_t cols, int64_t row_stride, int64_t col_stride) {
  return Tensor::view_of(t, {rows, cols}, {row_stride, col_stride}, t.offset());
}

// The padded convolution's operands in the op's workspace (conv_params.h's conv2d_padded): the weight
// [Cout', KH, KW, Cin'] and bias [Cout'], the input (x or dx) [N, H, W, Cin'] when Cin is padded, the output (y or
// dy) [N, Ho, Wo, Cout'] when Cout is (each undefined otherwise), and the padded geometry.
struct Padded {
  ConvGeometry g;
  Tensor w, bias, in, out;
};
Padded padded(const Tensor& pad, const ConvGeometry& g) {
  const int64_t es = int64_t(engine::dtype_size(pad.dtype()));
  ENGINE_CHECK(pad.is_contiguous() && pad.numel() == conv2d_padding_elems(g, es),
               "conv2d: the channel padding workspace must be contiguous with ", conv2d_padding_elems(g, es),
               " elements, got ", engine::shape_str(pad.shape()));
  Padded p;
  p.g = conv2d_padded(g, es);
  const int64_t cp = p.g.cout, ci = p.g.cin, k = p.g.gemm_k();
  int64_t at = pad.offset();
  p.w = Tensor::view_of(pad, {cp, g.kh, g.kw, ci}, {k, g.kw * ci, ci, 1}, at);
  at += cp * k;
  p.bias = Tensor::view_of(pad, {cp}, {1}, at);
  at += cp;
  if (ci != g.cin) {
    p.in = Tensor::view_of(pad, {g.n, g.h, g.w, ci}, {g.h * g.w * ci, g.w * ci, ci, 1}, at);
    at += g.n * g.h * g.w * ci;
  }
  if (cp != g.cout) p.out = Tensor::view_of(pad, {g.n, g.ho, g.wo, cp}, {g.ho * g.wo * cp, g.wo * cp, cp, 1}, at);
  return p;
}

// dst [rows, dst_cols] from src [rows, src_cols]: the common columns, zeros past src's when dst is wider (unless
// `zeroed`: the caller cleared dst already).
void copy_columns(const Tensor& dst, int64_t dst_cols, const Tensor& src, int64_t src_cols, int64_t rows,
                  bool zeroed = false) {
  const size_t es = engine::dtype_size(dst.dtype());
  cudaStream_t s = engine::cuda::stream();
  if (dst_cols > src_cols && !zeroed) ENGINE_CUDA_CHECK(cudaMemsetAsync(dst.data_ptr(), 0, es * rows * dst_cols, s));
  if (rows == 0) return;
  ENGINE_CUDA_CHECK(cudaMemcpy2DAsync(dst.data_ptr(), es * dst_cols, src.data_ptr(), es * src_cols,
                                      es * std::min(dst_cols, src_cols), rows, cudaMemcpyDeviceToDevice, s));
}

// The padded weight and bias: w's filters with zero channels past Cin, zero filters past Cout, the bias (when
// given) with zeros past Cout.
void pad_filters(const Padded& p, const ConvGeometry& g, const Tensor& w, const Tensor& bias) {
  cudaStream_t s = engine::cuda::stream();
  ENGINE_CUDA_CHECK(cudaMemsetAsync(p.w.data_ptr(), 0, p.w.nbytes() + p.bias.nbytes(), s));
  copy_columns(p.w, p.g.cin, w, g.cin, g.cout * g.kh * g.kw, /*zeroed=*/true);
  if (bias.defined())
    ENGINE_CUDA_CHECK(cudaMemcpyAsync(p.bias.data_ptr(), bias.data_ptr(), bias.nbytes(), cudaMemcpyDeviceToDevice, s));
}

// The unpadded choice (conv2d_path below adds the padding's suffix).
const char* kernel_path(ConvPass pass, const ConvGeometry& g, DType dtype) {
  if (g.pointwise()) return "gemm";
  if (g.depthwise()) return "depthwise";
  // Tensor cores copy Cout/g channels (the forward's epilogue, the weight gradient's dy rows) 16 bytes at a
  // time (8 bf16/f16, 4 f32), Cin/g channels too except in the gathering variants (the 3-channel stems, the GAN
  // discriminators' 39-channel inputs): forward and weight gradient gather x, the data gradient gathers w and
  // exists per stride phase only (conv_kernels.cuh's phases_fit). f32 goes there only with TF32 allowed.
  const bool gather_ok = pass != ConvPass::data || conv::phases_fit(g.kh, g.kw, g.p.stride_h, g.p.stride_w);
  if (igemm_dtype(dtype) && fits_int32(g) && g.cout_per_group() % 8 == 0) {
    if (g.cin_per_group() % 8 == 0) return "igemm";
    if (gather_ok) return "igemm_gather";
  }
  if (dtype == DType::f32 && engine::allow_tf32() && fits_int32(g) && g.cout_per_group() % 4 == 0) {
    if (g.cin_per_group() % 4 == 0) return "igemm_tf32";
    if (gather_ok) return "igemm_gather_tf32";
  }
  // f32 on CUDA cores, float4 copies.
  if (dtype == DType::f32 && fits_int32(g) && g.cin_per_group() % 4 == 0 && g.cout_per_group() % 4 == 0) return "simt";
  return "generic";
}

}  // namespace

const char* conv2d_path(ConvPass pass, const ConvGeometry& g, DType dtype) {
  const int64_t es = int64_t(engine::dtype_size(dtype));
  const ConvGeometry p = conv2d_padded(g, es);
  const bool winograd = conv2d_winograd(p, pass, es, engine::allow_tf32()).chunk > 0;
  if (p.cin == g.cin && p.cout == g.cout) return winograd ? "winograd" : kernel_path(pass, g, dtype);
  // The padded geometry's path with a suffix naming what was padded, e.g. "igemm_cin_padded".
  static const std::set<std::string> names = [] {
    std::set<std::string> all;
    for (const char* base : {"igemm", "igemm_gather", "igemm_tf32", "igemm_gather_tf32", "winograd", "simt", "generic"})
      for (const char* suffix : {"_cin_padded", "_cout_padded", "_cin_cout_padded"})
        all.insert(std::string(base) + suffix);
    return all;
  }();
  const char* suffix = p.cin == g.cin ? "_cout_padded" : p.cout == g.cout ? "_cin_padded" : "_cin_cout_padded";
  return names.find(std::string(winograd ? "winograd" : kernel_path(pass, p, dtype)) + suffix)->c_str();
}

void conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& y, const ConvGeometry& g,
                    const Tensor& pad, const Tensor& winograd) {
  check_operands("conv2d", g, {&y, &x, &w, &bias});
  if (g.gemm_m() == 0 || g.cout == 0) return;
  if (pad.defined()) {  // x with zero channels past Cin, zero filters past Cout; y = the padded y's first Cout
    const Padded p = padded(pad, g);
    pad_filters(p, g, w, bias);
    if (p.in.defined()) copy_columns(p.in, p.g.cin, x, g.cin, g.n * g.h * g.w);
    conv2d_forward(p.in.defined() ? p.in : x, p.w, bias.defined() ? p.bias : Tensor(), p.out.defined() ? p.out : y,
                   p.g, Tensor(), winograd);
    if (p.out.defined()) copy_columns(y, g.cout, p.out, p.g.cout, g.gemm_m());
    return;
  }
  if (winograd.defined()) return conv::winograd_forward(x, w, bias, y, g, winograd);
  const DType t = y.dtype();
  const conv::Dims d = conv::dims_of(g);
  const std::string path = kernel_path(ConvPass::forward, g, t);
  if (path == "gemm") {
    const int64_t M = g.gemm_m();
    matmul(matrix(x, M, g.cin, g.cin, 1), matrix(w, g.cin, g.cout, 1, g.cin), bias, matrix(y, M, g.cout, g.cout, 1));
  } else if (path == "depthwise") {
    conv::depthwise_forward(d, t, x.data_ptr(), w.data_ptr(), bias.defined() ? bias.data_ptr() : nullptr,
                            y.data_ptr());
  } else if (path.rfind("igemm", 0) == 0 && all_aligned({&x, &w, &bias, &y})) {
    conv::igemm_forward(d, t, x.data_ptr(), w.data_ptr(), bias.defined() ? bias.data_ptr() : nullptr, y.data_ptr());
  } else if (path == "simt" && all_aligned({&x, &w, &bias, &y})) {
    conv::simt_forward(d, x.data<float>(), w.data<float>(), bias.defined() ? bias.data<float>() : nullptr,
                       y.data<float>());
  } else {
    conv::generic_forward(d, t, x.data_ptr(), w.data_ptr(), bias.defined() ? bias.data_ptr() : nullptr,
                          y.data_ptr());
  }
}

void conv2d_backward_data(const Tensor& dy, const Tensor& w, const Tensor& dx, const ConvGeometry& g,
                          const Tensor& pad, const Tensor& winograd) {
  check_operands("conv2d_backward_data", g, {&dx, &dy, &w});
  if (g.n * g.h * g.w * g.cin == 0) return;
  if (pad.defined()) {  // dy with zero channels past Cout, zero filters; dx = the padded dx's first Cin channels
    const Padded p = padded(pad, g);
    pad_filters(p, g, w, Tensor());
    if (p.out.defined()) copy_columns(p.out, p.g.cout, dy, g.cout, g.gemm_m());
    conv2d_backward_data(p.out.defined() ? p.out : dy, p.w, p.in.defined() ? p.in : dx, p.g, Tensor(), winograd);
    if (p.in.defined()) copy_columns(dx, g.cin, p.in, p.g.cin, g.n * g.h * g.w);
    return;
  }
  if (winograd.defined()) return conv::winograd_data(dy, w, dx, g, winograd);
  const DType t = dx.dtype();
  const conv::Dims d = conv::dims_of(g);
  const std::string path = kernel_path(ConvPass::data, g, t);
  if (path == "gemm") {
    const int64_t M = g.gemm_m();
    matmul(matrix(dy, M, g.cout, g.cout, 1), matrix(w, g.cout, g.cin, g.cin, 1), Tensor(),
           matrix(dx, M, g.cin, g.cin, 1));
  } else if (path == "depthwise") {
    conv::depthwise_data(d, t, dy.data_ptr(), w.data_ptr(), dx.data_ptr());
  } else if (path.rfind("igemm", 0) == 0 && all_aligned({&dy, &w, &dx})) {
    if (!conv::igemm_data_phases(d, t, dy.data_ptr(), w.data_ptr(), dx.data_ptr()))
      conv::igemm_data(d, t, dy.data_ptr(), w.data_ptr(), dx.data_ptr());
  } else if (path == "simt" && all_aligned({&dy, &w, &dx})) {
    conv::simt_data(d, dy.data<float>(), w.data<float>(), dx.data<float>());
  } else {
    conv::generic_data(d, t, dy.data_ptr(), w.data_ptr(), dx.data_ptr());
  }
}

void conv2d_backward_weight(const Tensor& x, const Tensor& dy, const Tensor& dw, const Tensor& workspace,
                            const ConvGeometry& g, const Tensor& pad, const Tensor& winograd) {
  check_operands("conv2d_backward_weight", g, {&dw, &x, &dy});
  if (dw.numel() == 0) return;
  if (pad.defined()) {  // x and dy with zero channels past Cin and Cout; dw = the padded dw's real filters
    const Padded p = padded(pad, g);
    if (p.in.defined()) copy_columns(p.in, p.g.cin, x, g.cin, g.n * g.h * g.w);
    if (p.out.defined()) copy_columns(p.out, p.g.cout, dy, g.cout, g.gemm_m());
    conv2d_backward_weight(p.in.defined() ? p.in : x, p.out.defined() ? p.out : dy, p.w, workspace, p.g, Tensor(),
                           winograd);
    copy_columns(dw, g.cin, p.w, p.g.cin, g.cout * g.kh * g.kw);  // the first Cout filters' first Cin channels
    return;
  }
  if (winograd.defined()) return conv::winograd_weight(x, dy, dw, g, winograd);
  const DType t = dw.dtype();
  const conv::Dims d = conv::dims_of(g);
  const int64_t splits = conv2d_weight_grad_splits(g);
  float* ws = nullptr;
  if (splits > 1 && workspace.defined()) {
    ENGINE_CHECK(workspace.dtype() == DType::f32 && workspace.is_contiguous() &&
                     workspace.numel() == splits * dw.numel(),
                 "conv2d_backward_weight: workspace must be f32 contiguous [", splits, ", Cout, KH, KW, Cin/g], got ",
                 engine::dtype_name(workspace.dtype()), " ", engine::shape_str(workspace.shape()));
    ws = static_cast<float*>(workspace.data_ptr());
  }
  const std::string path = kernel_path(ConvPass::weight, g, t);
  if (path == "gemm") {
    const int64_t M = g.gemm_m();
    if (M == 0) {
      ENGINE_CUDA_CHECK(cudaMemsetAsync(dw.data_ptr(), 0, dw.nbytes(), engine::cuda::stream()));
      return;
    }
    matmul(matrix(dy, g.cout, M, 1, g.cout), matrix(x, M, g.cin, g.cin, 1), Tensor(),
           matrix(dw, g.cout, g.cin, g.cin, 1));
  } else if (path == "depthwise") {
    conv::depthwise_weight(d, t, x.data_ptr(), dy.data_ptr(), dw.data_ptr(), ws, int(ws ? splits : 1));
  } else if (path.rfind("igemm", 0) == 0 && all_aligned({&x, &dy, &dw, &workspace})) {
    conv::igemm_weight(d, t, x.data_ptr(), dy.data_ptr(), dw.data_ptr(), ws, int(ws ? splits : 1));
  } else if (path == "simt" && all_aligned({&x, &dy, &dw, &workspace})) {
    conv::simt_weight(d, x.data<float>(), dy.data<float>(), dw.data<float>(), ws, int(ws ? splits : 1));
  } else {
    conv::generic_weight(d, t, x.data_ptr(), dy.data_ptr(), dw.data_ptr());
  }
}

}  // namespace ops::cuda
