// pool.cpp: max_pool2d, avg_pool2d, global_avg_pool2d and the gather-form backward ops of the first two, with
// their own rules (double backward).
#include "ops/pool.h"

#include "ops/cpu/pool.h"
#ifdef ENGINE_CUDA
#include "ops/cuda/pool.h"
#endif
#include "ops/elementwise.h"
#include "ops/op.h"
#include "ops/reduce.h"
#include "ops/shape.h"
#include "ops/view.h"

namespace ops {

namespace {

// Checks x [N, H, W, C] and the parameters; returns the output shape [N, Ho, Wo, C].
Shape pool_output_shape(const char* op, const Shape& xs, const Pool2dParams& p, bool is_max) {
  ENGINE_CHECK(xs.size() == 4, op, ": x must be [N, H, W, C] (channels last), got ", engine::shape_str(xs));
  ENGINE_CHECK(p.kernel_h > 0 && p.kernel_w > 0 && p.stride_h > 0 && p.stride_w > 0 && p.dilation_h > 0 &&
                   p.dilation_w > 0,
               op, ": kernel (", p.kernel_h, ", ", p.kernel_w, "), stride (", p.stride_h, ", ", p.stride_w,
               ") and dilation (", p.dilation_h, ", ", p.dilation_w, ") must be positive");
  ENGINE_CHECK(is_max || (p.dilation_h == 1 && p.dilation_w == 1), op, ": average pooling has no dilation, got (",
               p.dilation_h, ", ", p.dilation_w, ")");
  ENGINE_CHECK(p.pad_top >= 0 && p.pad_bottom >= 0 && p.pad_left >= 0 && p.pad_right >= 0 &&
                   2 * std::max(p.pad_top, p.pad_bottom) <= p.kernel_h &&
                   2 * std::max(p.pad_left, p.pad_right) <= p.kernel_w,
               op, ": padding (top ", p.pad_top, ", bottom ", p.pad_bottom, ", left ", p.pad_left, ", right ",
               p.pad_right, ") must be >= 0 and at most half the kernel (", p.kernel_h, ", ", p.kernel_w, ")");
  const PoolAxis ah = pool_axis_h(xs[1], p), aw = pool_axis_w(xs[2], p);
  ENGINE_CHECK(ah.out > 0 && aw.out > 0, op, ": the window (kernel (", p.kernel_h, ", ", p.kernel_w,
               "), dilation (", p.dilation_h, ", ", p.dilation_w, ")) does not fit the padded input of x ",
               engine::shape_str(xs));
  return {xs[0], ah.out, aw.out, xs[3]};
}

double window_taps(const Shape& ys, const Pool2dParams& p) {
  return double(engine::numel_of(ys)) * double(p.kernel_h * p.kernel_w);
}

}  // namespace

Tensor max_pool2d(const Tensor& x_in, const Pool2dParams& p) {
  const char* name = "max_pool2d";
  OpScope scope(name);
  check_floating(name, "x", x_in);
  const Shape ys = pool_output_shape(name, x_in.shape(), p, true);
  ENGINE_CHECK(x_in.size(1) * x_in.size(2) < (int64_t(1) << 31), name, ": H * W of x ",
               engine::shape_str(x_in.shape()), " does not fit the i32 indices");
  Tensor x = contiguous(x_in);
  Tensor y = new_empty(x, ys);                           // [N, Ho, Wo, C]
  Tensor indices = new_empty(x, ys, DType::i32);         // [N, Ho, Wo, C]: h * W + w of each maximum
  run_kernel(name, y, [&] { cpu::max_pool2d_forward(x, p, y, indices); },
             CUDA_KERNEL(cuda::max_pool2d_forward(x, p, y, indices)));
  engine::count_op(name, window_taps(ys, p), double(x.nbytes() + y.nbytes() + indices.nbytes()));
  if (graph::any_requires_grad({x})) {
    graph::record(name, {x}, {y}, {indices}, [p, xs = x.shape()](Node& n, const Grads& g) -> Grads {
      return {max_pool2d_backward(g[0], n.saved(0), xs, p)};
    });
  }
  return y;
}

Tensor max_pool2d_backward(const Tensor& g_in, const Tensor& indices, const Shape& x_shape, const Pool2dParams& p) {
  const char* name = "max_pool2d_backward";
  OpScope scope(name);
  check_floating(name, "g", g_in);
  check_dtype(name, "indices", indices, DType::i32);
  check_same_device(name, g_in, indices);
  const Shape ys = pool_output_shape(name, x_shape, p, true);
  ENGINE_CHECK(g_in.shape() == ys && indices.shape() == ys, name, ": g ", engine::shape_str(g_in.shape()),
               " and indices ", engine::shape_str(indices.shape()), " must be ", engine::shape_str(ys),
               " for x ", engine::shape_str(x_shape));
  Tensor g = contiguous(g_in), idx = contiguous(indices);
  Tensor dx = new_empty(g, x_shape);  // [N, H, W, C]
  run_kernel(name, dx, [&] { cpu::max_pool2d_backward(g, idx, p, dx); },
             CUDA_KERNEL(cuda::max_pool2d_backward(g, idx, p, dx)));
  engine::count_op(name, double(g.numel()), double(g.nbytes() + idx.nbytes() + dx.nbytes()));
  if (graph::any_requires_grad({g})) {
    // Linear in g: d/dg <h, dx> = h at each window's argmax, a gather over the flattened image planes.
    graph::record(name, {g}, {dx}, {idx}, [ys](Node& n, const Grads& h) -> Grads {
      const Tensor& hx = h[0];
      const Shape& xs = hx.shape();
      Tensor planes = reshape(hx, {xs[0], xs[1] * xs[2], xs[3]});                     // [N, H * W, C]
      Tensor at = reshape(n.saved(0), {ys[0], ys[1] * ys[2], ys[3]});                  // [N, Ho * Wo, C]
      return {reshape(gather(planes, 1, at), ys)};
    });
  }
  return dx;
}

Tensor avg_pool2d(const Tensor& x_in, const Pool2dParams& p) {
  const char* name = "avg_pool2d";
  OpScope scope(name);
  check_floating(name, "x", x_in);
  const Shape ys = pool_output_shape(name, x_in.shape(), p, false);
  Tensor x = contiguous(x_in);
  Tensor y = new_empty(x, ys);  // [N, Ho, Wo, C]
  run_kernel(name, y, [&] { cpu::avg_pool2d_forward(x, p, y); }, CUDA_KERNEL(cuda::avg_pool2d_forward(x, p, y)));
  engine::count_op(name, window_taps(ys, p), double(x.nbytes() + y.nbytes()));
  if (graph::any_requires_grad({x})) {
    graph::record(name, {x}, {y}, {}, [p, xs = x.shape()](Node&, const Grads& g) -> Grads {
      return {avg_pool2d_backward(g[0], xs, p)};
    });
  }
  return y;
}

Tensor avg_pool2d_backward(const Tensor& g_in, const Shape& x_shape, const Pool2dParams& p) {
  const char* name = "avg_pool2d_backward";
  OpScope scope(name);
  check_floating(name, "g", g_in);
  const Shape ys = pool_output_shape(name, x_shape, p, false);
  ENGINE_CHECK(g_in.shape() == ys, name, ": g ", engine::shape_str(g_in.shape()), " must be ", engine::shape_str(ys),
               " for x ", engine::shape_str(x_shape));
  Tensor g = contiguous(g_in);
  Tensor dx = new_empty(g, x_shape);  // [N, H, W, C]
  run_kernel(name, dx, [&] { cpu::avg_pool2d_backward(g, p, dx); }, CUDA_KERNEL(cuda::avg_pool2d_backward(g, p, dx)));
  engine::count_op(name, window_taps(ys, p), double(g.nbytes() + dx.nbytes()));
  if (graph::any_requires_grad({g})) {
    // avg_pool2d_backward is the adjoint of avg_pool2d (both linear): its gradient is avg_pool2d again.
    graph::record(name, {g}, {dx}, {}, [p](Node&, const Grads& h) -> Grads { return {avg_pool2d(h[0], p)}; });
  }
  return dx;
}

Tensor global_avg_pool2d(const Tensor& x) {
  OpScope scope("global_avg_pool2d");
  check_floating("global_avg_pool2d", "x", x);
  ENGINE_CHECK(x.dim() == 4, "global_avg_pool2d: x must be [N, H, W, C] (channels last), got ",
               engine::shape_str(x.shape()));
  return mean(x, {1, 2}, true);  // [N, 1, 1, C]: the column reduction of ops/reduce (deterministic)
}

}  // namespace ops
