// optim.cpp: the fused update ops and the gradient norms.
#include "ops/optim.h"

#include <cmath>
#include <limits>
#include <set>

#include "graph/autograd.h"
#include "ops/cpu/optim.h"
#ifdef ENGINE_CUDA
#include "ops/cuda/optim.h"
#endif
#include "ops/elementwise.h"
#include "ops/factory.h"
#include "ops/op.h"
#include "ops/reduce.h"
#include "ops/view.h"

namespace ops {

// ---------------------------------------------------------------------------------------------------
// Fused update ops: checks, kernel, counters. They allocate nothing.

namespace {

void check_update(const char* op, const ParamUpdate& t, const ParamUpdate& first, size_t num_slots) {
  check_floating(op, "param", t.param);
  check_defined(op, "grad", t.grad);
  check_same_device(op, first.param, t.param);
  ENGINE_CHECK(t.param.is_contiguous(), op, ": the parameter must be contiguous, got shape ",
               engine::shape_str(t.param.shape()), " with strides ", engine::shape_str(t.param.strides()));
  ENGINE_CHECK(t.slots.size() == num_slots, op, ": expected ", num_slots, " state tensors, got ", t.slots.size());
  // The weight the math updates: the f32 master when there is one (then the slots are f32 too).
  const DType weight_dtype = t.master.defined() ? t.master.dtype() : t.param.dtype();
  ENGINE_CHECK(!t.master.defined() || t.master.dtype() == DType::f32, op, ": the master weight must be f32, got ",
               engine::dtype_name(weight_dtype));
  auto check_like = [&](const char* what, const Tensor& x, DType dtype) {
    check_defined(op, what, x);
    ENGINE_CHECK(x.shape() == t.param.shape(), op, ": ", what, " has shape ", engine::shape_str(x.shape()),
                 ", the parameter ", engine::shape_str(t.param.shape()));
    ENGINE_CHECK(x.dtype() == dtype, op, ": ", what, " has dtype ", engine::dtype_name(x.dtype()), ", expected ",
                 engine::dtype_name(dtype), t.master.defined() ? " (mixed precision: f32 master and state)" : "");
    check_same_device(op, t.param, x);
    ENGINE_CHECK(x.is_contiguous(), op, ": ", what, " must be contiguous");
  };
  check_like("grad", t.grad, t.param.dtype());
  if (t.master.defined()) check_like("master", t.master, DType::f32);
  for (const Tensor& s : t.slots) check_like("state", s, weight_dtype);
}

// Bytes: param and slots read and written, grad read.
// With a master: the master and slots (f32) read and written, the grad read and the low copy written.
double update_bytes(const ParamUpdate& t) {
  const double n = double(t.param.numel()), low = double(engine::dtype_size(t.param.dtype()));
  const double state = 2 * double(t.slots.size());
  return t.master.defined() ? n * (4 * (2 + state) + 2 * low) : n * low * (3 + state);
}

// The frame of every update op: checks each parameter, runs the cpu reference one parameter at a time (or the
// cuda multi-tensor kernel on the whole list) and counts flops_per_element and the bytes.
void run_update(const char* op, const ParamUpdates& ts, size_t num_slots, double flops_per_element,
                const std::function<void(const ParamUpdate&)>& cpu, const std::function<void()>& cuda) {
  OpScope scope(op);
  if (ts.empty()) return;
  double elements = 0, bytes = 0;
  for (const ParamUpdate& t : ts) {
    check_update(op, t, ts[0], num_slots);
    elements += double(t.param.numel());
    bytes += update_bytes(t);
  }
  run_kernel(
      op, ts[0].param,
      [&] {
        for (const ParamUpdate& t : ts) cpu(t);
      },
      cuda);
  engine::count_op(op, flops_per_element * elements, bytes);
}

}  // namespace

void sgd_update(const ParamUpdates& ts, const SgdStep& h) {
  run_update(
      "sgd", ts, h.momentum != 0 ? 1 : 0, 6, [&](const ParamUpdate& t) { cpu::sgd_update(t, h); },
      CUDA_KERNEL(cuda::sgd_update(ts, h)));
}

void adam_update(const ParamUpdates& ts, const AdamStep& h) {
  run_update(
      "adam", ts, 2, 12, [&](const ParamUpdate& t) { cpu::adam_update(t, h); }, CUDA_KERNEL(cuda::adam_update(ts, h)));
}

void adamax_update(const ParamUpdates& ts, const AdamaxStep& h) {
  run_update(
      "adamax", ts, 2, 10, [&](const ParamUpdate& t) { cpu::adamax_update(t, h); },
      CUDA_KERNEL(cuda::adamax_update(ts, h)));
}

void rmsprop_update(const ParamUpdates& ts, const RmsPropStep& h) {
  run_update(
      "rmsprop", ts, 1 + (h.momentum != 0) + h.centered, 10, [&](const ParamUpdate& t) { cpu::rmsprop_update(t, h); },
      CUDA_KERNEL(cuda::rmsprop_update(ts, h)));
}

// ---------------------------------------------------------------------------------------------------
// Adafactor, composed of ops (see optimizer.h for the math)

void adafactor_update(const ParamUpdates& ts, const AdafactorStep& h) {
  OpScope scope("adafactor");
  graph::NoGrad no_grad;
  engine::CategoryScope category(engine::Category::optimizer);
  const double t = double(h.step);
  const double b = std::pow(t, h.beta2_decay), rho = std::min(h.lr, 1 / std::sqrt(t));
  for (const ParamUpdate& u : ts) {
    check_floating("adafactor", "param", u.param);
    check_defined("adafactor", "grad", u.grad);
    ENGINE_CHECK(u.grad.shape() == u.param.shape(), "adafactor: grad has shape ", engine::shape_str(u.grad.shape()),
                 ", the parameter ", engine::shape_str(u.param.shape()));
    const bool factored = u.param.dim() >= 2;
    ENGINE_CHECK(u.slots.size() == (factored ? 2u : 1u), "adafactor: expected ", factored ? 2 : 1,
                 " state tensors, got ", u.slots.size());
    const Tensor w = u.master.defined() ? u.master : u.param;  // the weight the math updates
    const DType dt = w.dtype();
    const double eps1 = h.eps1 > 0 ? h.eps1 : engine::dtype_epsilon(dt);
    const double n = double(w.numel());
    auto constant = [&](double v) { return scalar(v, dt, w.device_ptr()); };
    auto rms = [&](const Tensor& x) { return sqrt(mul(sum(mul(x, x)), 1 / n)); };  // a [] tensor
    // The gradient times grad_scale, folded in place into g^2 and the update (a scale that depends on values, such
    // as a clip coefficient, must not change what is allocated: meta sees no values).
    const double s = u.grad_scale;
    Tensor g = u.grad.dtype() == dt ? u.grad : to(u.grad, dt);
    const Tensor alpha = mul(maximum(rms(w), constant(h.eps2)), rho);
    if (h.weight_decay != 0) mul_(w, 1 - h.lr * h.weight_decay);
    Tensor v;  // the second-moment estimate, then the update
    {
      Tensor g2 = mul(g, g);
      mul_(g2, s * s);
      if (factored) {
        const Tensor& row = u.slots[0];
        const Tensor& col = u.slots[1];
        add_(row, sub(mean(g2, {-1}, true), row), b);
        add_(col, sub(mean(g2, {-2}, true), col), b);
        g2 = Tensor();
        v = mul(row, col);
        v = div(v, maximum(mean(row, {-2}, true), constant(eps1)));
      } else {
        add_(u.slots[0], sub(g2, u.slots[0]), b);
        v = u.slots[0];
      }
    }
    v = maximum(v, constant(eps1 * eps1));
    v = rsqrt(v);
    v = mul(v, g);
    mul_(v, s);
    g = Tensor();
    const Tensor step = div(alpha, maximum(mul(rms(v), 1 / h.d), constant(1)));
    add_(w, mul(v, step), -1);
    if (u.master.defined()) copy_(u.param, w);  // the low-precision copy, rounded to nearest-even
  }
}

// ---------------------------------------------------------------------------------------------------
// Gradient clipping

Tensor squared_norms(const std::vector<Tensor>& xs) {
  OpScope scope("squared_norms");
  ENGINE_CHECK(!xs.empty(), "squared_norms: no tensors given");
  double bytes = 0;
  for (const Tensor& x : xs) {
    check_floating("squared_norms", "x", x);
    check_same_device("squared_norms", xs[0], x);
    ENGINE_CHECK(x.is_contiguous(), "squared_norms: tensors must be contiguous, got shape ",
                 engine::shape_str(x.shape()), " with strides ", engine::shape_str(x.strides()));
    bytes += double(x.nbytes());
  }
  Tensor out = new_empty(xs[0], {int64_t(xs.size())}, engine::DType::f64);
  // The GPU's deterministic two-stage sum: one f64 partial per 65536 elements of each tensor, allocated on
  // every device (meta predicts cuda exactly).
  int64_t chunks = 0;
  for (const Tensor& x : xs) chunks += (x.numel() + kNormChunk - 1) / kNormChunk;
  Tensor partials = new_empty(xs[0], {chunks}, engine::DType::f64);
  run_kernel(
      "squared_norms", out, [&] { cpu::squared_norms(xs, out); }, CUDA_KERNEL(cuda::squared_norms(xs, out, partials)));
  engine::count_op("squared_norms", 2 * bytes, bytes + double(out.nbytes()));
  return out;
}

namespace {
// The gradients of `params` that exist, contiguous (what grad_norm and clip_coefficient sum).
std::vector<Tensor> present_grads(const char* op, const std::vector<Tensor>& params) {
  std::vector<Tensor> grads;
  for (const Tensor& p : params) {
    check_defined(op, "param", p);
    if (p.grad().defined()) grads.push_back(contiguous(p.grad()));
  }
  return grads;
}
}  // namespace

double grad_norm(const std::vector<Tensor>& params) {
  graph::NoGrad no_grad;
  engine::PhaseScope phase(engine::Phase::optimizer);
  OpScope scope("grad_norm");
  const std::vector<Tensor> grads = present_grads("grad_norm", params);
  if (grads.empty()) return 0.0;
  // One small tensor of per-grad sums, read once: a single device-to-host sync on cuda.
  double total = 0;
  for (double s : squared_norms(grads).to_double()) total += s;
  return std::sqrt(total);
}

Tensor clip_coefficient(const std::vector<Tensor>& params, double max_norm) {
  graph::NoGrad no_grad;
  engine::PhaseScope phase(engine::Phase::optimizer);
  OpScope scope("grad_norm");
  ENGINE_CHECK(max_norm > 0, "clip_coefficient: max_norm must be > 0, got ", max_norm);
  const std::vector<Tensor> grads = present_grads("clip_coefficient", params);
  if (grads.empty()) return Tensor();
  // The per-gradient sums, folded into element 0 in place: no block beyond grad_norm's.
  Tensor sums = squared_norms(grads);
  run_kernel(
      "clip_coefficient", sums, [&] { cpu::clip_coefficient(sums, max_norm); },
      CUDA_KERNEL(cuda::clip_coefficient(sums, max_norm)));
  engine::count_op("clip_coefficient", double(sums.numel()), double(sums.nbytes()));
  return slice(sums, 0, 0, 1);
}

double clip_grad_norm(const std::vector<Tensor>& params, double max_norm) {
  ENGINE_CHECK(max_norm > 0, "clip_grad_norm: max_norm must be > 0, got ", max_norm);
  const double norm = grad_norm(params);
  graph::NoGrad no_grad;
  OpScope scope("clip_grad_norm");
  double coef = max_norm / (norm + 1e-6);
  if (coef < 1.0 || std::isnan(coef)) {
    for (const Tensor& p : params)
      if (p.grad().defined()) mul_(p.grad(), coef);
  }
  return norm;
}

}  // namespace ops
