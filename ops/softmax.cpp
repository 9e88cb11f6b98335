// softmax.cpp: softmax and log_softmax, their fused backward ops, and the rules that make those
// differentiable again (double backward). One implementation serves both variants (`log`).
#include "ops/softmax.h"

#include "ops/cpu/softmax.h"
#ifdef ENGINE_CUDA
#include "ops/cuda/softmax.h"
#endif
#include "ops/elementwise.h"
#include "ops/op.h"
#include "ops/reduce.h"

namespace ops {

namespace {

Tensor softmax_impl(const char* name, const Tensor& x, int64_t dim, bool log) {
  OpScope scope(name);
  check_floating(name, "x", x);
  ENGINE_CHECK(x.dim() >= 1, name, ": x must have at least 1 dimension, got a scalar");
  int64_t d = normalize_dim(name, dim, x.dim());
  Tensor y = empty_like(x);
  run_kernel(name, y, [&] { cpu::softmax_forward(x, d, log, y); }, CUDA_KERNEL(cuda::softmax_forward(x, d, log, y)));
  engine::count_op(name, 5.0 * double(x.numel()), double(x.nbytes() + y.nbytes()));
  if (graph::any_requires_grad({x})) {
    graph::record(name, {x}, {y}, {y}, [d, log](Node& n, const Grads& g) -> Grads {
      return {log ? log_softmax_backward(g[0], n.saved(0), d) : softmax_backward(g[0], n.saved(0), d)};
    });
  }
  return y;
}

// The rule of softmax_backward / log_softmax_backward, given the gradient h of their output.
Grads softmax_backward_rule(Node& n, const Tensor& h, int64_t d, bool log) {
  Tensor g = n.saved(0), y = n.saved(1);
  Tensor dg, dy;
  if (log) {
    Tensor h_p = mul(h, exp(y));  // h * softmax
    if (n.needs_input_grad(0)) dg = sub(h, sum(h_p, {d}, true));
    if (n.needs_input_grad(1)) dy = neg(mul(h_p, sum(g, {d}, true)));
  } else {
    if (n.needs_input_grad(0)) dg = softmax_backward(h, y, d);  // the op is self-adjoint in g
    if (n.needs_input_grad(1)) {
      Tensor g_dot_y = sum(mul(g, y), {d}, true);
      Tensor h_dot_y = sum(mul(h, y), {d}, true);
      dy = sub(mul(h, sub(g, g_dot_y)), mul(g, h_dot_y));
    }
  }
  return {dg, dy};
}

Tensor softmax_backward_impl(const char* name, const Tensor& g, const Tensor& y, int64_t dim, bool log) {
  OpScope scope(name);
  check_floating(name, "g", g);
  check_floating(name, "y", y);
  check_same_dtype(name, g, y);
  check_same_device(name, g, y);
  ENGINE_CHECK(g.shape() == y.shape(), name, ": gradient g ", engine::shape_str(g.shape()),
               " and output y ", engine::shape_str(y.shape()), " must have the same shape");
  ENGINE_CHECK(y.dim() >= 1, name, ": y must have at least 1 dimension, got a scalar");
  int64_t d = normalize_dim(name, dim, y.dim());
  Tensor out = empty_like(y);
  run_kernel(name, out, [&] { cpu::softmax_backward(g, y, d, log, out); },
             CUDA_KERNEL(cuda::softmax_backward(g, y, d, log, out)));
  engine::count_op(name, 4.0 * double(y.numel()), double(g.nbytes() + y.nbytes() + out.nbytes()));
  if (graph::any_requires_grad({g, y})) {
    graph::record(name, {g, y}, {out}, {g, y}, [d, log](Node& n, const Grads& h) -> Grads {
      return softmax_backward_rule(n, h[0], d, log);
    });
  }
  return out;
}

}  // namespace

Tensor softmax(const Tensor& x, int64_t dim) { return softmax_impl("softmax", x, dim, false); }
Tensor log_softmax(const Tensor& x, int64_t dim) { return softmax_impl("log_softmax", x, dim, true); }

Tensor softmax_backward(const Tensor& g, const Tensor& y, int64_t dim) {
  return softmax_backward_impl("softmax_backward", g, y, dim, false);
}

Tensor log_softmax_backward(const Tensor& g, const Tensor& y, int64_t dim) {
  return softmax_backward_impl("log_softmax_backward", g, y, dim, true);
}

}  // namespace ops
