// loss.cpp: the losses' checks, allocations and backward rules (kernels in cpu/loss.cpp).
#include "ops/loss.h"

#include <cmath>

#include "ops/cpu/loss.h"
#ifdef ENGINE_CUDA
#include "ops/cuda/loss.h"
#endif
#include "ops/elementwise.h"
#include "ops/factory.h"
#include "ops/op.h"
#include "ops/reduce.h"
#include "ops/shape.h"
#include "ops/softmax.h"
#include "ops/view.h"

namespace ops {

DType loss_dtype(DType input) { return input == DType::f64 ? DType::f64 : DType::f32; }

namespace {

Shape loss_shape(Reduction r, const Shape& per_element) { return r == Reduction::none ? per_element : Shape{}; }

// What each element's derivative is multiplied by: g in the input's dtype, divided by the element count for
// a mean ([] for mean/sum, the input's shape for none; it broadcasts either way).
Tensor upstream(const Tensor& g, Reduction r, int64_t numel, DType dtype) {
  Tensor gi = to(g, dtype);
  return r == Reduction::mean ? mul(gi, numel > 0 ? 1.0 / double(numel) : 0.0) : gi;
}

// softplus(-x) = log(1 + exp(-x)) in the stable form max(-x, 0) + log(1 + exp(-|x|)), with ops.
Tensor softplus_neg(const Tensor& x) {
  Tensor abs_x = maximum(x, neg(x));
  return add(relu(neg(x)), log(add(exp(neg(abs_x)), 1.0)));
}

// Checks, allocation, kernel and counters shared by mse_loss, l1_loss, smooth_l1_loss and bce_with_logits.
Tensor pointwise_loss_forward(const char* name, cpu::PointwiseLoss kind, const Tensor& a, const char* a_name,
                              const Tensor& b, const char* b_name, const Tensor& w, Reduction r,
                              double flops_per_element, double param = 0) {
  check_floating(name, a_name, a);
  check_floating(name, b_name, b);
  check_same_dtype(name, a, b);
  check_same_device(name, a, b);
  ENGINE_CHECK(a.shape() == b.shape(), name, ": ", a_name, " of shape ", engine::shape_str(a.shape()), " and ",
               b_name, " of shape ", engine::shape_str(b.shape()), " differ (expected one shape)");
  Tensor out = new_empty(a, loss_shape(r, a.shape()), loss_dtype(a.dtype()));
  // A mean or sum on the GPU adds per-block partial sums in a fixed order: one per 4096 elements, at most
  // 1024, allocated on every device (meta predicts cuda exactly).
  Tensor partials;
  if (r != Reduction::none)
    partials = new_workspace(a, {std::min<int64_t>(1024, std::max<int64_t>(1, (a.numel() + 4095) / 4096))},
                             out.dtype(), "the loss's partial sums, one per block of 4096 elements");
  run_kernel(
      name, out, [&] { cpu::pointwise_loss(kind, a, b, w, param, r, out); },
      CUDA_KERNEL(cuda::pointwise_loss(kind, a, b, w, param, r, out, partials)));
  partials = Tensor();
  engine::count_op(name, flops_per_element * double(a.numel()),
                   double(a.nbytes() + b.nbytes() + (w.defined() ? w.nbytes() : 0) + out.nbytes()));
  return out;
}

void check_cross_entropy_args(const char* op, const Tensor& logits, const Tensor& target, double label_smoothing) {
  check_floating(op, "logits", logits);
  check_dim(op, "logits", logits, 2);
  check_index_dtype(op, "target", target);
  check_same_device(op, logits, target);
  ENGINE_CHECK(target.shape() == Shape{logits.shape()[0]}, op, ": target of shape ", engine::shape_str(target.shape()),
               " for logits of shape ", engine::shape_str(logits.shape()), " (expected [", logits.shape()[0], "])");
  ENGINE_CHECK(label_smoothing >= 0.0 && label_smoothing <= 1.0, op, ": label_smoothing ", label_smoothing,
               " is outside [0, 1]");
}

}  // namespace

// ---------------------------------------------------------------------------------------------------
// Cross-entropy

Tensor cross_entropy(const Tensor& logits, const Tensor& target, int64_t ignore_index, double label_smoothing,
                     Reduction reduction) {
  OpScope scope("cross_entropy");
  check_cross_entropy_args("cross_entropy", logits, target, label_smoothing);
  const int64_t N = logits.shape()[0], V = logits.shape()[1];
  const DType dt = loss_dtype(logits.dtype());
  Tensor loss = new_empty(logits, loss_shape(reduction, {N}), dt);  // [] or [N]
  Tensor lse = new_empty(logits, {N}, dt);                           // [N] row log-sum-exp, kept for backward
  Tensor divisor = reduction == Reduction::mean ? new_empty(logits, {}, dt) : Tensor();  // [] max(#counted, 1)
  // The GPU adds a mean or sum from per-row losses in a fixed order: [N], allocated on every device.
  Tensor row_loss = reduction != Reduction::none ? new_empty(logits, {N}, dt) : Tensor();
  run_kernel(
      "cross_entropy", loss,
      [&] { cpu::cross_entropy_forward(logits, target, ignore_index, label_smoothing, reduction, loss, lse, divisor); },
      CUDA_KERNEL(cuda::cross_entropy_forward(logits, target, ignore_index, label_smoothing, reduction, loss, lse,
                                              divisor, row_loss)));
  row_loss = Tensor();
  engine::count_op("cross_entropy", 4.0 * double(N * V),
                   double(logits.nbytes() + target.nbytes() + lse.nbytes() + loss.nbytes()));
  if (graph::any_requires_grad({logits})) {
    std::vector<Tensor> saved = {logits, target, lse};
    if (divisor.defined()) saved.push_back(divisor);
    graph::record("cross_entropy", {logits}, {loss}, saved,
                  [ignore_index, label_smoothing, reduction](Node& n, const Grads& g) -> Grads {
                    Tensor divisor = reduction == Reduction::mean ? n.saved(3) : Tensor();
                    return {cross_entropy_backward(g[0], n.saved(0), n.saved(1), n.saved(2), divisor, ignore_index,
                                                   label_smoothing, reduction)};
                  });
  }
  return loss;
}

Tensor cross_entropy_backward(const Tensor& g, const Tensor& logits, const Tensor& target, const Tensor& lse,
                              const Tensor& divisor, int64_t ignore_index, double label_smoothing,
                              Reduction reduction) {
  const char* name = "cross_entropy_backward";
  OpScope scope(name);
  check_cross_entropy_args(name, logits, target, label_smoothing);
  const int64_t N = logits.shape()[0], V = logits.shape()[1];
  const DType dt = loss_dtype(logits.dtype());
  check_dtype(name, "g", g, dt);
  ENGINE_CHECK(g.shape() == loss_shape(reduction, {N}), name, ": g of shape ", engine::shape_str(g.shape()),
               " for ", N, " rows (expected [] for a mean or sum, [", N, "] for none)");
  check_dtype(name, "lse", lse, dt);
  ENGINE_CHECK(lse.shape() == Shape{N}, name, ": lse of shape ", engine::shape_str(lse.shape()), ", expected [", N,
               "]");
  ENGINE_CHECK(divisor.defined() == (reduction == Reduction::mean), name,
               ": the divisor is given for a mean reduction, and only then");
  if (divisor.defined()) {
    check_dtype(name, "divisor", divisor, dt);
    ENGINE_CHECK(divisor.numel() == 1, name, ": divisor of shape ", engine::shape_str(divisor.shape()),
                 ", expected []");
  }
  Tensor dlogits = empty_like(logits);  // [N, V]
  run_kernel(
      name, dlogits,
      [&] {
        cpu::cross_entropy_backward(g, logits, target, lse, divisor, ignore_index, label_smoothing, reduction, dlogits);
      },
      CUDA_KERNEL(cuda::cross_entropy_backward(g, logits, target, lse, divisor, ignore_index, label_smoothing,
                                               reduction, dlogits)));
  engine::count_op(name, 4.0 * double(N * V), double(2 * logits.nbytes() + target.nbytes() + lse.nbytes()));
  if (graph::any_requires_grad({g, logits})) {
    std::vector<Tensor> saved = {g, logits, target, lse};
    if (divisor.defined()) saved.push_back(divisor);
    graph::record(name, {g, logits}, {dlogits}, saved,
                  [ignore_index, label_smoothing, reduction](Node& n, const Grads& gg) -> Grads {
                    Tensor g = n.saved(0), x = n.saved(1), target = n.saved(2), lse = n.saved(3);
                    Tensor divisor = reduction == Reduction::mean ? n.saved(4) : Tensor();
                    Tensor dg, dx;
                    if (n.needs_input_grad(0)) {
                      // dlogits is linear in g: its derivative is the kernel's output at g = 1.
                      Tensor unit = cross_entropy_backward(ones_like(g), x, target, lse, divisor, ignore_index,
                                                           label_smoothing, reduction);
                      Tensor h = mul(gg[0], unit);  // [N, V]
                      dg = to(reduction == Reduction::none ? sum(h, {1}) : sum(h), g.dtype());
                    }
                    if (n.needs_input_grad(1)) {
                      // dlogits = a (softmax(x) - q) with q constant: d/dx is softmax's backward of gg, times
                      // the row scale a = [not ignored] * g (/ divisor for a mean).
                      Tensor counted = to(compare(CompareOp::ne, target, double(ignore_index)), x.dtype());  // [N]
                      Tensor a = mul(counted, to(g, x.dtype()));
                      if (divisor.defined()) a = div(a, to(divisor, x.dtype()));
                      dx = mul(softmax_backward(gg[0], softmax(x, 1), 1), reshape(a, {x.shape()[0], 1}));
                    }
                    return {dg, dx};
                  });
  }
  return dlogits;
}

// ---------------------------------------------------------------------------------------------------
// Pointwise losses

Tensor mse_loss(const Tensor& a, const Tensor& b, Reduction reduction) {
  OpScope scope("mse_loss");
  Tensor out = pointwise_loss_forward("mse_loss", cpu::PointwiseLoss::mse, a, "a", b, "b", Tensor(), reduction, 3);
  if (graph::any_requires_grad({a, b})) {
    graph::record("mse_loss", {a, b}, {out}, {a, b}, [reduction, numel = a.numel()](Node& n, const Grads& g) -> Grads {
      Tensor a = n.saved(0), b = n.saved(1);
      Tensor ga = mul(mul(sub(a, b), upstream(g[0], reduction, numel, a.dtype())), 2.0);  // 2 (a - b) g
      return {n.needs_input_grad(0) ? ga : Tensor(), n.needs_input_grad(1) ? neg(ga) : Tensor()};
    });
  }
  return out;
}

Tensor l1_loss(const Tensor& a, const Tensor& b, Reduction reduction) {
  OpScope scope("l1_loss");
  Tensor out = pointwise_loss_forward("l1_loss", cpu::PointwiseLoss::l1, a, "a", b, "b", Tensor(), reduction, 2);
  if (graph::any_requires_grad({a, b})) {
    graph::record("l1_loss", {a, b}, {out}, {a, b}, [reduction, numel = a.numel()](Node& n, const Grads& g) -> Grads {
      Tensor d = sub(n.saved(0), n.saved(1));
      DType dt = d.dtype();
      // sign(a - b) from comparisons: 0 at a == b (as PyTorch), and no second derivative.
      Tensor sign = sub(to(compare(CompareOp::gt, d, 0.0), dt), to(compare(CompareOp::lt, d, 0.0), dt));
      Tensor ga = mul(sign, upstream(g[0], reduction, numel, dt));
      return {n.needs_input_grad(0) ? ga : Tensor(), n.needs_input_grad(1) ? neg(ga) : Tensor()};
    });
  }
  return out;
}

Tensor smooth_l1_loss(const Tensor& a, const Tensor& b, double beta, Reduction reduction) {
  const char* name = "smooth_l1_loss";
  OpScope scope(name);
  ENGINE_CHECK(std::isfinite(beta) && beta >= 0, name, ": beta must be finite and >= 0, got ", beta);
  if (beta == 0) return l1_loss(a, b, reduction);  // PyTorch's limit: the quadratic part vanishes
  Tensor out =
      pointwise_loss_forward(name, cpu::PointwiseLoss::smooth_l1, a, "a", b, "b", Tensor(), reduction, 5, beta);
  if (graph::any_requires_grad({a, b})) {
    graph::record(name, {a, b}, {out}, {a, b}, [reduction, beta, numel = a.numel()](Node& n, const Grads& g) -> Grads {
      // d/da = clamp((a - b) / beta, -1, 1): (a - b) / beta inside the quadratic part, sign(a - b) beyond it.
      Tensor d = mul(sub(n.saved(0), n.saved(1)), 1.0 / beta);
      Tensor one = full(d.shape(), 1.0, d.dtype(), d.device_ptr()), minus_one = neg(one);
      Tensor slope = maximum(minimum(d, one), minus_one);
      Tensor ga = mul(slope, upstream(g[0], reduction, numel, d.dtype()));
      return {n.needs_input_grad(0) ? ga : Tensor(), n.needs_input_grad(1) ? neg(ga) : Tensor()};
    });
  }
  return out;
}

Tensor bce_with_logits(const Tensor& logits, const Tensor& target, const Tensor& pos_weight, Reduction reduction) {
  const char* name = "bce_with_logits";
  OpScope scope(name);
  check_floating(name, "logits", logits);
  const bool weighted = pos_weight.defined();
  if (weighted) {
    check_floating(name, "pos_weight", pos_weight);
    check_same_dtype(name, logits, pos_weight);
    check_same_device(name, logits, pos_weight);
    ENGINE_CHECK(broadcast_shapes(name, logits.shape(), pos_weight.shape()) == logits.shape(), name,
                 ": pos_weight of shape ", engine::shape_str(pos_weight.shape()),
                 " does not broadcast to logits of shape ", engine::shape_str(logits.shape()));
  }
  Tensor out = pointwise_loss_forward(name, cpu::PointwiseLoss::bce_with_logits, logits, "logits", target, "target",
                                      pos_weight, reduction, 8);
  if (graph::any_requires_grad({logits, target, pos_weight})) {
    auto rule = [reduction, weighted, numel = logits.numel()](Node& n, const Grads& g) -> Grads {
      Tensor x = n.saved(0), t = n.saved(1), p = weighted ? n.saved(2) : Tensor();
      Tensor gs = upstream(g[0], reduction, numel, x.dtype());
      Tensor gx, gt, gp;
      if (n.needs_input_grad(0)) {
        // d/dx = (1 - t) - (1 + (p - 1) t) sigmoid(-x), which is sigmoid(x) - t when p = 1.
        Tensor dx = weighted ? sub(add(neg(t), 1.0), mul(add(mul(t, add(p, -1.0)), 1.0), sigmoid(neg(x))))
                             : sub(sigmoid(x), t);
        gx = mul(dx, gs);
      }
      const bool need_softplus = weighted && (n.needs_input_grad(1) || n.needs_input_grad(2));
      Tensor sp = need_softplus ? softplus_neg(x) : Tensor();
      if (n.needs_input_grad(1)) {
        Tensor dt = weighted ? add(neg(x), mul(add(p, -1.0), sp)) : neg(x);  // d/dt = -x + (p - 1) softplus(-x)
        gt = mul(dt, gs);
      }
      if (weighted && n.needs_input_grad(2)) gp = sum_to(mul(mul(t, sp), gs), p.shape());  // d/dp = t softplus(-x)
      return {gx, gt, gp};
    };
    std::vector<Tensor> saved = {logits, target};
    if (weighted) saved.push_back(pos_weight);
    graph::record(name, {logits, target, pos_weight}, {out}, saved, rule);
  }
  return out;
}

}  // namespace ops
