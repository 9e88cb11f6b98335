// conv.cpp: conv2d and conv_transpose2d: shape rules, allocation, dispatch, and the backward rules that
// close the three kernels under differentiation (see conv.h).
#include "ops/conv.h"

#include <array>

#include "ops/cpu/conv.h"
#ifdef ENGINE_CUDA
#include "ops/cuda/conv.h"
#endif
#include "ops/elementwise.h"
#include "ops/matmul.h"
#include "ops/op.h"
#include "ops/reduce.h"

namespace ops {

namespace {

using engine::shape_str;

// Model FLOPs of any of the three kernels: a multiply-add per (output pixel, output channel, tap, channel).
double conv_flops(const ConvGeometry& g) {
  return 2.0 * double(g.gemm_m()) * double(g.cout) * double(g.gemm_k());
}

void check_params(const char* op, const Conv2dParams& p) {
  ENGINE_CHECK(p.stride_h >= 1 && p.stride_w >= 1, op, ": stride must be >= 1, got (", p.stride_h, ", ",
               p.stride_w, ")");
  ENGINE_CHECK(p.dilation_h >= 1 && p.dilation_w >= 1, op, ": dilation must be >= 1, got (", p.dilation_h, ", ",
               p.dilation_w, ")");
  ENGINE_CHECK(p.pad_h >= 0 && p.pad_w >= 0, op, ": padding must be >= 0, got (", p.pad_h, ", ", p.pad_w, ")");
  ENGINE_CHECK(p.groups >= 1, op, ": groups must be >= 1, got ", p.groups);
}

void check_nhwc(const char* op, const char* arg, const Shape& s, const char* layout) {
  ENGINE_CHECK(s.size() == 4, op, ": ", arg, " must be 4-D ", layout, ", got ", shape_str(s));
}

// The convolution's output size along one axis, or an Error naming every term when it is <= 0.
int64_t conv_output_size(const char* op, const char* axis, int64_t in, int64_t k, int64_t stride, int64_t pad,
                         int64_t dilation) {
  const int64_t span = dilation * (k - 1) + 1;  // the dilated kernel's extent
  ENGINE_CHECK(in + 2 * pad >= span, op, ": output ", axis, " would be <= 0: input ", axis, " ", in, " + 2 * padding ",
               pad, " is smaller than the dilated kernel (", k, " taps, dilation ", dilation, ": extent ", span,
               "), stride ", stride);
  return (in + 2 * pad - span) / stride + 1;
}

void expect_shape(const char* op, const char* arg, const Tensor& t, const Shape& expected) {
  ENGINE_CHECK(t.shape() == expected, op, ": ", arg, " must be ", shape_str(expected), " for this geometry, got ",
               shape_str(t.shape()));
}

// The GPU's padded-channel workspace for this geometry in t's dtype (conv2d_padded), on every device so that meta
// predicts it; undefined when the geometry needs none.
Tensor channel_padding(const Tensor& t, const ConvGeometry& g) {
  const int64_t elems = conv2d_padding_elems(g, int64_t(engine::dtype_size(t.dtype())));
  return elems ? new_workspace(t, {elems}, t.dtype(), "the weight and the input or output with their channels padded")
               : Tensor();
}

// The GPU's Winograd workspace for this pass (conv_params.h's conv2d_winograd, of the geometry the GPU computes), on
// every device so that meta predicts it; undefined when the pass takes another kernel.
Tensor winograd_workspace(const Tensor& t, const ConvGeometry& g, ConvPass pass) {
  const int64_t es = int64_t(engine::dtype_size(t.dtype()));
  const WinogradPlan plan = conv2d_winograd(conv2d_padded(g, es), pass, es, engine::allow_tf32());
  if (!plan.chunk) return Tensor();
  return new_workspace(t, {plan.elems}, DType::f32, "Winograd's transformed filters and tiles");
}

// Floating, same dtype, same device as x.
void check_operand(const char* op, const char* arg, const Tensor& x, const Tensor& t) {
  check_floating(op, arg, t);
  check_same_dtype(op, x, t);
  check_same_device(op, x, t);
}

void check_bias(const char* op, const Tensor& x, const Tensor& bias, int64_t cout) {
  if (!bias.defined()) return;
  check_operand(op, "bias", x, bias);
  ENGINE_CHECK(bias.dim() == 1 && bias.size(0) == cout, op, ": bias must be [", cout, "] (output channels), got ",
               shape_str(bias.shape()));
}

}  // namespace

ConvGeometry conv2d_geometry(const char* op, const Shape& x, const Shape& weight, const Conv2dParams& p) {
  check_nhwc(op, "x", x, "NHWC [N, H, W, Cin]");
  check_nhwc(op, "weight", weight, "[Cout, KH, KW, Cin/groups]");
  check_params(op, p);
  ConvGeometry g;
  g.p = p;
  g.n = x[0], g.h = x[1], g.w = x[2], g.cin = x[3];
  g.cout = weight[0], g.kh = weight[1], g.kw = weight[2];
  ENGINE_CHECK(g.cin % p.groups == 0, op, ": groups ", p.groups, " must divide the input channels Cin = ", g.cin,
               " of x ", shape_str(x));
  ENGINE_CHECK(g.cout % p.groups == 0, op, ": groups ", p.groups, " must divide the output channels Cout = ", g.cout,
               " of weight ", shape_str(weight));
  ENGINE_CHECK(weight[3] == g.cin / p.groups, op, ": weight ", shape_str(weight), " has ", weight[3],
               " input channels per group, but x ", shape_str(x), " with groups ", p.groups, " has ", g.cin / p.groups,
               " (weight is [Cout, KH, KW, Cin/groups])");
  ENGINE_CHECK(g.kh >= 1 && g.kw >= 1, op, ": kernel must be at least 1x1, got weight ", shape_str(weight));
  g.ho = conv_output_size(op, "height", g.h, g.kh, p.stride_h, p.pad_h, p.dilation_h);
  g.wo = conv_output_size(op, "width", g.w, g.kw, p.stride_w, p.pad_w, p.dilation_w);
  return g;
}

// ---------------------------------------------------------------------------------------------------
// The three kernels as ops

Tensor conv2d_forward(const Tensor& x_in, const Tensor& weight_in, const Tensor& bias_in, const ConvGeometry& g) {
  OpScope scope("conv2d");
  check_floating("conv2d", "x", x_in);
  check_operand("conv2d", "weight", x_in, weight_in);
  check_bias("conv2d", x_in, bias_in, g.cout);
  expect_shape("conv2d", "x", x_in, {g.n, g.h, g.w, g.cin});
  expect_shape("conv2d", "weight", weight_in, {g.cout, g.kh, g.kw, g.cin_per_group()});
  // The kernels take contiguous operands (copies are recorded, so gradients flow through them).
  Tensor x = contiguous(x_in), weight = contiguous(weight_in);
  Tensor bias = bias_in.defined() ? contiguous(bias_in) : Tensor();
  Tensor y = new_empty(x, {g.n, g.ho, g.wo, g.cout});  // [N, Ho, Wo, Cout]
  y.device().workspace(kGemmWorkspaceBytes);  // the GPU's 1x1 convolutions are cuBLASLt GEMMs
  Tensor pad = channel_padding(x, g), winograd = winograd_workspace(x, g, ConvPass::forward);
  run_kernel("conv2d", y, [&] { cpu::conv2d_forward(x, weight, bias, y, g); },
             CUDA_KERNEL(cuda::conv2d_forward(x, weight, bias, y, g, pad, winograd)));
  pad = winograd = Tensor();
  engine::count_op("conv2d", conv_flops(g),
                   double(x.nbytes() + weight.nbytes() + (bias.defined() ? bias.nbytes() : 0) + y.nbytes()));
  if (graph::any_requires_grad({x, weight, bias})) {
    // dx needs the weight and dw needs x: save each only when the other's gradient needs it.
    Tensor save_x = weight.requires_grad() ? x : Tensor();
    Tensor save_w = x.requires_grad() ? weight : Tensor();
    graph::record("conv2d", {x, weight, bias}, {y}, {save_x, save_w}, [g](Node& n, const Grads& gy) -> Grads {
      Tensor gx, gw, gb;
      if (n.needs_input_grad(0)) gx = conv2d_backward_data(gy[0], n.saved(1), g);
      if (n.needs_input_grad(1)) gw = conv2d_backward_weight(n.saved(0), gy[0], g);
      if (n.needs_input_grad(2)) gb = sum(gy[0], {0, 1, 2});
      return {gx, gw, gb};
    });
  }
  return y;
}

Tensor conv2d_backward_data(const Tensor& dy_in, const Tensor& weight_in, const ConvGeometry& g) {
  OpScope scope("conv2d_backward_data");
  check_floating("conv2d_backward_data", "dy", dy_in);
  check_operand("conv2d_backward_data", "weight", dy_in, weight_in);
  expect_shape("conv2d_backward_data", "dy", dy_in, {g.n, g.ho, g.wo, g.cout});
  expect_shape("conv2d_backward_data", "weight", weight_in, {g.cout, g.kh, g.kw, g.cin_per_group()});
  Tensor dy = contiguous(dy_in), weight = contiguous(weight_in);  // dy may be a broadcast gradient
  Tensor dx = new_empty(dy, {g.n, g.h, g.w, g.cin});               // [N, H, W, Cin]
  dx.device().workspace(kGemmWorkspaceBytes);
  Tensor pad = channel_padding(dy, g), winograd = winograd_workspace(dy, g, ConvPass::data);
  run_kernel("conv2d_backward_data", dx, [&] { cpu::conv2d_backward_data(dy, weight, dx, g); },
             CUDA_KERNEL(cuda::conv2d_backward_data(dy, weight, dx, g, pad, winograd)));
  pad = winograd = Tensor();
  engine::count_op("conv2d_backward_data", conv_flops(g), double(dy.nbytes() + weight.nbytes() + dx.nbytes()));
  if (graph::any_requires_grad({dy, weight})) {
    Tensor save_dy = weight.requires_grad() ? dy : Tensor();
    Tensor save_w = dy.requires_grad() ? weight : Tensor();
    graph::record("conv2d_backward_data", {dy, weight}, {dx}, {save_dy, save_w},
                  [g](Node& n, const Grads& gdx) -> Grads {
                    Tensor d_dy, d_w;
                    if (n.needs_input_grad(0)) d_dy = conv2d_forward(gdx[0], n.saved(1), Tensor(), g);
                    if (n.needs_input_grad(1)) d_w = conv2d_backward_weight(gdx[0], n.saved(0), g);
                    return {d_dy, d_w};
                  });
  }
  return dx;
}

Tensor conv2d_backward_weight(const Tensor& x_in, const Tensor& dy_in, const ConvGeometry& g) {
  OpScope scope("conv2d_backward_weight");
  check_floating("conv2d_backward_weight", "x", x_in);
  check_operand("conv2d_backward_weight", "dy", x_in, dy_in);
  expect_shape("conv2d_backward_weight", "x", x_in, {g.n, g.h, g.w, g.cin});
  expect_shape("conv2d_backward_weight", "dy", dy_in, {g.n, g.ho, g.wo, g.cout});
  Tensor x = contiguous(x_in), dy = contiguous(dy_in);
  Tensor dw = new_empty(x, {g.cout, g.kh, g.kw, g.cin_per_group()});  // [Cout, KH, KW, Cin/g]
  // The GPU's partial sums over pieces of the N*Ho*Wo pixels, allocated on every device (conv_params.h), for the
  // geometry the GPU computes (its channels padded where conv2d_padded says); none when Winograd runs.
  Tensor pad = channel_padding(x, g), winograd = winograd_workspace(x, g, ConvPass::weight);
  const ConvGeometry gs = conv2d_padded(g, int64_t(engine::dtype_size(x.dtype())));
  const int64_t splits = winograd.defined() ? 1 : conv2d_weight_grad_splits(gs);
  Tensor workspace;  // [splits, Cout, KH, KW, Cin/g] f32, freed with this op
  if (splits > 1)
    workspace = new_workspace(x, {splits, gs.cout, gs.kh, gs.kw, gs.cin_per_group()}, DType::f32,
                              "the weight gradient's partial sums, one per piece of the pixels");
  dw.device().workspace(kGemmWorkspaceBytes);
  run_kernel("conv2d_backward_weight", dw, [&] { cpu::conv2d_backward_weight(x, dy, dw, workspace, g); },
             CUDA_KERNEL(cuda::conv2d_backward_weight(x, dy, dw, workspace, g, pad, winograd)));
  workspace = pad = winograd = Tensor();
  engine::count_op("conv2d_backward_weight", conv_flops(g), double(x.nbytes() + dy.nbytes() + dw.nbytes()));
  if (graph::any_requires_grad({x, dy})) {
    Tensor save_x = dy.requires_grad() ? x : Tensor();
    Tensor save_dy = x.requires_grad() ? dy : Tensor();
    graph::record("conv2d_backward_weight", {x, dy}, {dw}, {save_x, save_dy},
                  [g](Node& n, const Grads& gdw) -> Grads {
                    Tensor d_x, d_dy;
                    if (n.needs_input_grad(0)) d_x = conv2d_backward_data(n.saved(1), gdw[0], g);
                    if (n.needs_input_grad(1)) d_dy = conv2d_forward(n.saved(0), gdw[0], Tensor(), g);
                    return {d_x, d_dy};
                  });
  }
  return dw;
}

// ---------------------------------------------------------------------------------------------------
// Public ops

Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, const Conv2dParams& p) {
  check_defined("conv2d", "x", x);
  check_defined("conv2d", "weight", weight);
  return conv2d_forward(x, weight, bias, conv2d_geometry("conv2d", x.shape(), weight.shape(), p));
}

Tensor conv_transpose2d(const Tensor& x, const Tensor& weight, const Tensor& bias, const Conv2dParams& p,
                        int64_t output_padding_h, int64_t output_padding_w) {
  const char* op = "conv_transpose2d";
  OpScope scope(op);
  check_defined(op, "x", x);
  check_floating(op, "x", x);
  check_operand(op, "weight", x, weight);
  check_nhwc(op, "x", x.shape(), "NHWC [N, H, W, Cin]");
  check_nhwc(op, "weight", weight.shape(), "[Cin, KH, KW, Cout/groups]");
  check_params(op, p);
  for (auto [pad, stride, dilation] : {std::array<int64_t, 3>{output_padding_h, p.stride_h, p.dilation_h},
                                       std::array<int64_t, 3>{output_padding_w, p.stride_w, p.dilation_w}})
    ENGINE_CHECK(pad >= 0 && (pad < stride || pad < dilation), op, ": output_padding ", pad,
                 " must be >= 0 and smaller than the stride (", stride, ") or the dilation (", dilation, ")");
  // The convolution whose data gradient this is: its input is our output, its output is our input.
  ConvGeometry g;
  g.p = p;
  g.n = x.size(0), g.ho = x.size(1), g.wo = x.size(2), g.cout = x.size(3);
  g.kh = weight.size(1), g.kw = weight.size(2);
  ENGINE_CHECK(weight.size(0) == g.cout, op, ": weight ", shape_str(weight.shape()), " must have x's ", g.cout,
               " input channels first (weight is [Cin, KH, KW, Cout/groups]), x is ", shape_str(x.shape()));
  ENGINE_CHECK(g.cout % p.groups == 0, op, ": groups ", p.groups, " must divide the input channels Cin = ", g.cout,
               " of x ", shape_str(x.shape()));
  ENGINE_CHECK(g.kh >= 1 && g.kw >= 1 && weight.size(3) >= 1, op, ": weight ", shape_str(weight.shape()),
               " has an empty dimension");
  g.cin = weight.size(3) * p.groups;
  g.h = (g.ho - 1) * p.stride_h - 2 * p.pad_h + p.dilation_h * (g.kh - 1) + output_padding_h + 1;
  g.w = (g.wo - 1) * p.stride_w - 2 * p.pad_w + p.dilation_w * (g.kw - 1) + output_padding_w + 1;
  ENGINE_CHECK(g.h > 0 && g.w > 0, op, ": output size ", g.h, "x", g.w, " <= 0 for input ", g.ho, "x", g.wo,
               ", kernel ", g.kh, "x", g.kw, ", padding (", p.pad_h, ", ", p.pad_w, "), dilation (", p.dilation_h,
               ", ", p.dilation_w, "), stride (", p.stride_h, ", ", p.stride_w, ")");
  check_bias(op, x, bias, g.cin);
  Tensor y = conv2d_backward_data(x, weight, g);  // [N, Ho, Wo, Cout]
  return bias.defined() ? add(y, bias) : y;
}

}  // namespace ops
