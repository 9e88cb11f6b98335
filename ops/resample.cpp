// resample.cpp: upsampling (nearest, bilinear) and 2-D padding (constant, reflection) with their gather-form
// backward ops; each backward op's rule is its forward op (the two are adjoint linear maps).
#include "ops/resample.h"

#include <cmath>

#include "ops/cpu/resample.h"
#ifdef ENGINE_CUDA
#include "ops/cuda/resample.h"
#endif
#include "ops/elementwise.h"
#include "ops/op.h"

namespace ops {

namespace {

void check_image(const char* op, const char* arg, const Shape& s) {
  ENGINE_CHECK(s.size() == 4, op, ": ", arg, " must be [N, H, W, C] (channels last), got ", engine::shape_str(s));
}

Shape upsample_output_shape(const char* op, const Shape& xs, const UpsampleParams& p) {
  check_image(op, "x", xs);
  ENGINE_CHECK(p.out_h > 0 && p.out_w > 0 && xs[1] > 0 && xs[2] > 0, op, ": output size (", p.out_h, ", ", p.out_w,
               ") and the input's H, W of x ", engine::shape_str(xs), " must be positive");
  ENGINE_CHECK(p.scale_h >= 0 && p.scale_w >= 0, op, ": scale factors must be positive (or 0: none), got (", p.scale_h,
               ", ", p.scale_w, ")");
  ENGINE_CHECK(p.mode == UpsampleMode::bilinear || !p.align_corners, op,
               ": align_corners applies to bilinear upsampling only");
  return {xs[0], p.out_h, p.out_w, xs[3]};
}

// F.interpolate's output size for a scale factor: floor(in * scale).
UpsampleParams scaled(const char* op, const Tensor& x, UpsampleMode mode, double sh, double sw, bool align_corners) {
  check_image(op, "x", x.shape());
  ENGINE_CHECK(sh > 0 && sw > 0, op, ": scale factors must be positive, got (", sh, ", ", sw, ")");
  UpsampleParams p;
  p.mode = mode;
  p.out_h = int64_t(std::floor(double(x.size(1)) * sh));
  p.out_w = int64_t(std::floor(double(x.size(2)) * sw));
  p.scale_h = sh, p.scale_w = sw;
  p.align_corners = align_corners;
  return p;
}

const char* upsample_name(const UpsampleParams& p) {
  return p.mode == UpsampleMode::nearest ? "upsample_nearest2d" : "upsample_bilinear2d";
}

Shape pad_output_shape(const char* op, const Shape& xs, const Pad2dParams& p) {
  check_image(op, "x", xs);
  // Constant padding may be negative, as torch.nn.ZeroPad2d's: a negative side crops that many rows or columns
  // (NASNet's factorized reduction shifts its second path so, ZeroPad2d((-1, 1, -1, 1))).
  const bool constant = p.mode == PadMode::constant;
  ENGINE_CHECK(constant ? (p.top > -xs[1] && p.bottom > -xs[1] && p.top + p.bottom > -xs[1] && p.left > -xs[2] &&
                           p.right > -xs[2] && p.left + p.right > -xs[2])
                        : (p.left >= 0 && p.right >= 0 && p.top >= 0 && p.bottom >= 0),
               op, ": padding (left ", p.left, ", right ", p.right, ", top ", p.top, ", bottom ", p.bottom, ") of x ",
               engine::shape_str(xs),
               constant ? " crops it away: a negative side must leave at least one row and column"
                        : " must be >= 0 for reflection");
  ENGINE_CHECK(constant || (std::max(p.top, p.bottom) < xs[1] && std::max(p.left, p.right) < xs[2]), op,
               ": reflection padding (left ", p.left, ", right ", p.right, ", top ", p.top, ", bottom ", p.bottom,
               ") must be less than the padded dimension of x ", engine::shape_str(xs));
  return {xs[0], xs[1] + p.top + p.bottom, xs[2] + p.left + p.right, xs[3]};
}

}  // namespace

Tensor upsample2d(const Tensor& x_in, const UpsampleParams& p) {
  const char* name = upsample_name(p);
  OpScope scope(name);
  check_floating(name, "x", x_in);
  const Shape ys = upsample_output_shape(name, x_in.shape(), p);
  Tensor x = contiguous(x_in);
  Tensor y = new_empty(x, ys);  // [N, out_h, out_w, C]
  run_kernel(
      name, y, [&] { cpu::upsample2d_forward(x, p, y); }, CUDA_KERNEL(cuda::upsample2d_forward(x, p, y)));
  engine::count_op(name, p.mode == UpsampleMode::bilinear ? 3.0 * double(y.numel()) : 0.0,
                   double(x.nbytes() + y.nbytes()));
  if (graph::any_requires_grad({x})) {
    graph::record(name, {x}, {y}, {},
                  [p, xs = x.shape()](Node&, const Grads& g) -> Grads { return {upsample2d_backward(g[0], xs, p)}; });
  }
  return y;
}

Tensor upsample2d_backward(const Tensor& g_in, const Shape& x_shape, const UpsampleParams& p) {
  const char* name = "upsample2d_backward";
  OpScope scope(name);
  check_floating(name, "g", g_in);
  const Shape ys = upsample_output_shape(name, x_shape, p);
  ENGINE_CHECK(g_in.shape() == ys, name, ": g ", engine::shape_str(g_in.shape()), " must be ", engine::shape_str(ys),
               " for x ", engine::shape_str(x_shape));
  Tensor g = contiguous(g_in);
  Tensor dx = new_empty(g, x_shape);  // [N, H, W, C]
  run_kernel(
      name, dx, [&] { cpu::upsample2d_backward(g, p, dx); }, CUDA_KERNEL(cuda::upsample2d_backward(g, p, dx)));
  engine::count_op(name, (p.mode == UpsampleMode::bilinear ? 3.0 : 1.0) * double(g.numel()),
                   double(g.nbytes() + dx.nbytes()));
  if (graph::any_requires_grad({g})) {
    graph::record(name, {g}, {dx}, {}, [p](Node&, const Grads& h) -> Grads { return {upsample2d(h[0], p)}; });
  }
  return dx;
}

Tensor upsample_nearest2d(const Tensor& x, int64_t out_h, int64_t out_w) {
  UpsampleParams p;
  p.mode = UpsampleMode::nearest;
  p.out_h = out_h, p.out_w = out_w;
  return upsample2d(x, p);
}

Tensor upsample_nearest2d_scale(const Tensor& x, double scale_h, double scale_w) {
  return upsample2d(x, scaled("upsample_nearest2d", x, UpsampleMode::nearest, scale_h, scale_w, false));
}

Tensor upsample_bilinear2d(const Tensor& x, int64_t out_h, int64_t out_w, bool align_corners) {
  UpsampleParams p;
  p.mode = UpsampleMode::bilinear;
  p.out_h = out_h, p.out_w = out_w;
  p.align_corners = align_corners;
  return upsample2d(x, p);
}

Tensor upsample_bilinear2d_scale(const Tensor& x, double scale_h, double scale_w, bool align_corners) {
  return upsample2d(x, scaled("upsample_bilinear2d", x, UpsampleMode::bilinear, scale_h, scale_w, align_corners));
}

Tensor pad2d(const Tensor& x_in, const Pad2dParams& p) {
  const char* name = "pad2d";
  OpScope scope(name);
  check_floating(name, "x", x_in);
  const Shape ys = pad_output_shape(name, x_in.shape(), p);
  Tensor x = contiguous(x_in);
  Tensor y = new_empty(x, ys);  // [N, top + H + bottom, left + W + right, C]
  run_kernel(
      name, y, [&] { cpu::pad2d_forward(x, p, y); }, CUDA_KERNEL(cuda::pad2d_forward(x, p, y)));
  engine::count_op(name, 0.0, double(x.nbytes() + y.nbytes()));
  if (graph::any_requires_grad({x})) {
    graph::record(name, {x}, {y}, {},
                  [p, xs = x.shape()](Node&, const Grads& g) -> Grads { return {pad2d_backward(g[0], xs, p)}; });
  }
  return y;
}

Tensor pad2d_backward(const Tensor& g_in, const Shape& x_shape, const Pad2dParams& p) {
  const char* name = "pad2d_backward";
  OpScope scope(name);
  check_floating(name, "g", g_in);
  const Shape ys = pad_output_shape(name, x_shape, p);
  ENGINE_CHECK(g_in.shape() == ys, name, ": g ", engine::shape_str(g_in.shape()), " must be ", engine::shape_str(ys),
               " for x ", engine::shape_str(x_shape));
  Tensor g = contiguous(g_in);
  Tensor dx = new_empty(g, x_shape);  // [N, H, W, C]
  run_kernel(
      name, dx, [&] { cpu::pad2d_backward(g, p, dx); }, CUDA_KERNEL(cuda::pad2d_backward(g, p, dx)));
  engine::count_op(name, double(g.numel()), double(g.nbytes() + dx.nbytes()));
  if (graph::any_requires_grad({g})) {
    Pad2dParams zero = p;
    zero.value = 0;  // the adjoint of pad2d_backward is padding with zeros (the constant is not g's)
    graph::record(name, {g}, {dx}, {}, [zero](Node&, const Grads& h) -> Grads { return {pad2d(h[0], zero)}; });
  }
  return dx;
}

}  // namespace ops
