// conv1d.cpp: conv1d (+ its input and weight gradients as ops) and glu (+ glu_backward): checks, allocation,
// dispatch, FLOP counts and the backward rules (see conv1d.h for the algebra behind them).
#include "ops/conv1d.h"

#include "ops/cpu/conv1d.h"
#ifdef ENGINE_CUDA
#include "ops/cuda/conv1d.h"
#endif
#include "ops/elementwise.h"
#include "ops/matmul.h"  // kGemmWorkspaceBytes: the taps run as cuBLASLt GEMMs on cuda
#include "ops/op.h"
#include "ops/reduce.h"
#include "ops/shape.h"
#include "ops/view.h"

namespace ops {

namespace {

// Checks shared by the three convolution ops: a [B, *, C] sequence tensor and the weight [K, Cin, Cout].
void check_sequence(const char* op, const char* arg, const Tensor& t) {
  check_floating(op, arg, t);
  ENGINE_CHECK(t.dim() == 3, op, ": ", arg, " must be [B, T, C] (3 dimensions), got ", engine::shape_str(t.shape()));
}

void check_pads(const char* op, int64_t pad_left, int64_t pad_right) {
  ENGINE_CHECK(pad_left >= 0 && pad_right >= 0, op, ": paddings must be >= 0, got left ", pad_left, " right ",
               pad_right);
}

// 2 * B * Cin * Cout per (output row, tap) pair that reads a real (not padding) input row.
double conv1d_flops(int64_t B, int64_t T, int64_t To, int64_t K, int64_t Cin, int64_t Cout, int64_t pad_left) {
  int64_t pairs = 0;
  for (int64_t k = 0; k < K; k++) pairs += conv1d_tap_rows(k, pad_left, T, To).count();
  return 2.0 * double(B) * double(pairs) * double(Cin) * double(Cout);
}

}  // namespace

Tensor conv1d(const Tensor& x_in, const Tensor& weight_in, const Tensor& bias, int64_t pad_left, int64_t pad_right) {
  OpScope scope("conv1d");
  check_sequence("conv1d", "x", x_in);
  check_floating("conv1d", "weight", weight_in);
  check_same_dtype("conv1d", x_in, weight_in);
  check_same_device("conv1d", x_in, weight_in);
  check_pads("conv1d", pad_left, pad_right);
  ENGINE_CHECK(weight_in.dim() == 3 && weight_in.size(1) == x_in.size(2),
               "conv1d: weight must be [K, Cin, Cout] with Cin = ", x_in.size(2), " (x ",
               engine::shape_str(x_in.shape()), "), got ", engine::shape_str(weight_in.shape()));
  const int64_t B = x_in.size(0), T = x_in.size(1), Cin = x_in.size(2);
  const int64_t K = weight_in.size(0), Cout = weight_in.size(2), To = T + pad_left + pad_right - K + 1;
  ENGINE_CHECK(K >= 1 && To >= 1, "conv1d: kernel size ", K, " with paddings (", pad_left, ", ", pad_right,
               ") leaves no output for x ", engine::shape_str(x_in.shape()));
  if (bias.defined()) {
    check_same_dtype("conv1d", x_in, bias);
    check_same_device("conv1d", x_in, bias);
    ENGINE_CHECK(bias.dim() == 1 && bias.size(0) == Cout, "conv1d: bias must be [", Cout, "] to match weight ",
                 engine::shape_str(weight_in.shape()), ", got ", engine::shape_str(bias.shape()));
  }
  Tensor x, weight, b;
  {
    graph::NoGrad ng;  // kernel operands: contiguous copies only when needed, the same on every device
    x = contiguous(x_in);
    weight = contiguous(weight_in);
    b = bias.defined() ? contiguous(bias) : Tensor();
  }
  Tensor y = new_empty(x, {B, To, Cout});  // [B, To, Cout]
  y.device().workspace(kGemmWorkspaceBytes);
  run_kernel("conv1d", y, [&] { cpu::conv1d_forward(x, weight, b, pad_left, y); },
             CUDA_KERNEL(cuda::conv1d_forward(x, weight, b, pad_left, y)));
  x = weight = b = Tensor();  // copies (if any) die here, before anything is saved
  engine::count_op("conv1d", conv1d_flops(B, T, To, K, Cin, Cout, pad_left),
                   double(x_in.nbytes() + weight_in.nbytes() + (bias.defined() ? bias.nbytes() : 0) + y.nbytes()));
  if (graph::any_requires_grad({x_in, weight_in, bias})) {
    Tensor save_x = weight_in.requires_grad() ? x_in : Tensor();
    Tensor save_w = x_in.requires_grad() ? weight_in : Tensor();
    graph::record("conv1d", {x_in, weight_in, bias}, {y}, {save_x, save_w},
                  [K, Cout, pad_left, pad_right](Node& n, const Grads& g) -> Grads {
                    Tensor gx, gw, gb;
                    if (n.needs_input_grad(0)) gx = conv1d_backward_input(g[0], n.saved(1), pad_left, pad_right);
                    if (n.needs_input_grad(1)) gw = conv1d_backward_weight(g[0], n.saved(0), K, pad_left, pad_right);
                    if (n.needs_input_grad(2)) gb = sum_to(g[0], {Cout});
                    return {gx, gw, gb};
                  });
  }
  return y;
}

Tensor conv1d_backward_input(const Tensor& g_in, const Tensor& weight_in, int64_t pad_left, int64_t pad_right) {
  OpScope scope("conv1d_backward_input");
  check_sequence("conv1d_backward_input", "g", g_in);
  check_floating("conv1d_backward_input", "weight", weight_in);
  check_same_dtype("conv1d_backward_input", g_in, weight_in);
  check_same_device("conv1d_backward_input", g_in, weight_in);
  check_pads("conv1d_backward_input", pad_left, pad_right);
  ENGINE_CHECK(weight_in.dim() == 3 && weight_in.size(2) == g_in.size(2),
               "conv1d_backward_input: weight must be [K, Cin, Cout] with Cout = ", g_in.size(2), " (g ",
               engine::shape_str(g_in.shape()), "), got ", engine::shape_str(weight_in.shape()));
  const int64_t B = g_in.size(0), To = g_in.size(1), Cout = g_in.size(2);
  const int64_t K = weight_in.size(0), Cin = weight_in.size(1), T = To - pad_left - pad_right + K - 1;
  ENGINE_CHECK(T >= 1, "conv1d_backward_input: g ", engine::shape_str(g_in.shape()), " with kernel ", K,
               " and paddings (", pad_left, ", ", pad_right, ") has no input length");
  Tensor g, weight;
  {
    graph::NoGrad ng;
    g = contiguous(g_in);
    weight = contiguous(weight_in);
  }
  Tensor dx = new_empty(g, {B, T, Cin});  // [B, T, Cin]
  dx.device().workspace(kGemmWorkspaceBytes);
  run_kernel("conv1d_backward_input", dx, [&] { cpu::conv1d_backward_input(g, weight, pad_left, dx); },
             CUDA_KERNEL(cuda::conv1d_backward_input(g, weight, pad_left, dx)));
  g = weight = Tensor();
  engine::count_op("conv1d_backward_input", conv1d_flops(B, T, To, K, Cin, Cout, pad_left),
                   double(g_in.nbytes() + weight_in.nbytes() + dx.nbytes()));
  if (graph::any_requires_grad({g_in, weight_in})) {
    Tensor save_g = weight_in.requires_grad() ? g_in : Tensor();
    Tensor save_w = g_in.requires_grad() ? weight_in : Tensor();
    graph::record("conv1d_backward_input", {g_in, weight_in}, {dx}, {save_g, save_w},
                  [K, pad_left, pad_right](Node& n, const Grads& gg) -> Grads {
                    Tensor d_g, d_w;
                    if (n.needs_input_grad(0)) d_g = conv1d(gg[0], n.saved(1), Tensor(), pad_left, pad_right);
                    if (n.needs_input_grad(1)) d_w = conv1d_backward_weight(n.saved(0), gg[0], K, pad_left, pad_right);
                    return {d_g, d_w};
                  });
  }
  return dx;
}

Tensor conv1d_backward_weight(const Tensor& g_in, const Tensor& x_in, int64_t kernel_size, int64_t pad_left,
                              int64_t pad_right) {
  OpScope scope("conv1d_backward_weight");
  check_sequence("conv1d_backward_weight", "g", g_in);
  check_sequence("conv1d_backward_weight", "x", x_in);
  check_same_dtype("conv1d_backward_weight", g_in, x_in);
  check_same_device("conv1d_backward_weight", g_in, x_in);
  check_pads("conv1d_backward_weight", pad_left, pad_right);
  const int64_t B = x_in.size(0), T = x_in.size(1), Cin = x_in.size(2), K = kernel_size;
  const int64_t To = g_in.size(1), Cout = g_in.size(2);
  ENGINE_CHECK(K >= 1 && g_in.size(0) == B && To == T + pad_left + pad_right - K + 1,
               "conv1d_backward_weight: g ", engine::shape_str(g_in.shape()), " is not the output shape of x ",
               engine::shape_str(x_in.shape()), " under kernel ", K, " and paddings (", pad_left, ", ", pad_right, ")");
  Tensor g, x;
  {
    graph::NoGrad ng;
    g = contiguous(g_in);
    x = contiguous(x_in);
  }
  Tensor dw = new_empty(g, {K, Cin, Cout});  // [K, Cin, Cout]
  dw.device().workspace(kGemmWorkspaceBytes);    // the unshifted tap is a cuBLASLt GEMM on cuda
  run_kernel("conv1d_backward_weight", dw, [&] { cpu::conv1d_backward_weight(g, x, pad_left, dw); },
             CUDA_KERNEL(cuda::conv1d_backward_weight(g, x, pad_left, dw)));
  g = x = Tensor();
  engine::count_op("conv1d_backward_weight", conv1d_flops(B, T, To, K, Cin, Cout, pad_left),
                   double(g_in.nbytes() + x_in.nbytes() + dw.nbytes()));
  if (graph::any_requires_grad({g_in, x_in})) {
    Tensor save_g = x_in.requires_grad() ? g_in : Tensor();
    Tensor save_x = g_in.requires_grad() ? x_in : Tensor();
    graph::record("conv1d_backward_weight", {g_in, x_in}, {dw}, {save_g, save_x},
                  [pad_left, pad_right](Node& n, const Grads& gg) -> Grads {
                    Tensor d_g, d_x;
                    if (n.needs_input_grad(0)) d_g = conv1d(n.saved(1), gg[0], Tensor(), pad_left, pad_right);
                    if (n.needs_input_grad(1)) d_x = conv1d_backward_input(n.saved(0), gg[0], pad_left, pad_right);
                    return {d_g, d_x};
                  });
  }
  return dw;
}

// ---------------------------------------------------------------------------------------------------
// GLU

namespace {

int64_t glu_dim(const char* op, const Tensor& x, int64_t dim) {
  check_floating(op, "x", x);
  const int64_t d = normalize_dim(op, dim, x.dim());
  ENGINE_CHECK(x.size(d) % 2 == 0, op, ": dimension ", d, " of x ", engine::shape_str(x.shape()),
               " must have an even size (it is split into two halves)");
  return d;
}

}  // namespace

Tensor glu(const Tensor& x_in, int64_t dim) {
  OpScope scope("glu");
  const int64_t d = glu_dim("glu", x_in, dim);
  Tensor x;
  {
    graph::NoGrad ng;
    x = contiguous(x_in);
  }
  Shape out_shape = x.shape();
  out_shape[size_t(d)] /= 2;
  Tensor y = new_empty(x, out_shape);  // x's shape with dim halved
  run_kernel("glu", y, [&] { cpu::glu_forward(x, d, y); }, CUDA_KERNEL(cuda::glu_forward(x, d, y)));
  x = Tensor();
  engine::count_op("glu", 4.0 * double(y.numel()), double(x_in.nbytes() + y.nbytes()));
  if (graph::any_requires_grad({x_in}))
    graph::record("glu", {x_in}, {y}, {x_in},
                  [d](Node& n, const Grads& g) -> Grads { return {glu_backward(g[0], n.saved(0), d)}; });
  return y;
}

Tensor glu_backward(const Tensor& g_in, const Tensor& x_in, int64_t dim) {
  OpScope scope("glu_backward");
  const int64_t d = glu_dim("glu_backward", x_in, dim);
  check_same_dtype("glu_backward", g_in, x_in);
  check_same_device("glu_backward", g_in, x_in);
  Shape half_shape = x_in.shape();
  half_shape[size_t(d)] /= 2;
  ENGINE_CHECK(g_in.shape() == half_shape, "glu_backward: g ", engine::shape_str(g_in.shape()), " must be ",
               engine::shape_str(half_shape), " (x ", engine::shape_str(x_in.shape()), " halved along ", d, ")");
  Tensor g, x;
  {
    graph::NoGrad ng;
    g = contiguous(g_in);
    x = contiguous(x_in);
  }
  Tensor dx = empty_like(x);  // [x's shape]
  run_kernel("glu_backward", dx, [&] { cpu::glu_backward(g, x, d, dx); },
             CUDA_KERNEL(cuda::glu_backward(g, x, d, dx)));
  g = x = Tensor();
  engine::count_op("glu_backward", 6.0 * double(g_in.numel()), double(g_in.nbytes() + x_in.nbytes() + dx.nbytes()));
  if (graph::any_requires_grad({g_in, x_in})) {
    // dx = [g s | g a s'] with s = sigmoid(b), s' = s (1 - s), s'' = s' (1 - 2 s). With gg = [gga | ggb]:
    //   d/dg = gga s + ggb a s'          d/da = ggb g s'          d/db = gga g s' + ggb g a s''
    graph::record("glu_backward", {g_in, x_in}, {dx}, {g_in, x_in}, [d](Node& n, const Grads& gg) -> Grads {
      Tensor g = n.saved(0), x = n.saved(1);
      const int64_t h = x.size(d) / 2;
      Tensor a = slice(x, d, 0, h), s = sigmoid(slice(x, d, h, 2 * h));
      Tensor gga = slice(gg[0], d, 0, h), ggb = slice(gg[0], d, h, 2 * h);
      Tensor s1 = mul(s, add(neg(s), 1.0));       // s (1 - s)
      Tensor s2 = mul(s1, add(mul(s, -2.0), 1.0));  // s (1 - s) (1 - 2 s)
      Tensor d_g, d_x;
      if (n.needs_input_grad(0)) d_g = add(mul(gga, s), mul(mul(ggb, a), s1));
      if (n.needs_input_grad(1)) {
        Tensor d_a = mul(mul(ggb, g), s1);
        Tensor d_b = add(mul(mul(gga, g), s1), mul(mul(mul(ggb, g), a), s2));
        d_x = concat({d_a, d_b}, d);
      }
      return {d_g, d_x};
    });
  }
  return dx;
}

}  // namespace ops
