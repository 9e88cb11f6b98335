// batch_norm.cpp: batch_norm (batch or running statistics), its fused multi-output backward op, and that op's
// own rule (double backward). The shape of ops/norm.cpp (layer norm), with the reduction over the rows
// (every dimension but the channels) instead of along them.
#include "ops/batch_norm.h"

#include <cmath>
#include <numeric>

#include "ops/cpu/batch_norm.h"
#ifdef ENGINE_CUDA
#include "ops/cuda/batch_norm.h"
#endif
#include "ops/elementwise.h"
#include "ops/norm.h"
#include "ops/op.h"
#include "ops/reduce.h"
#include "ops/view.h"

namespace ops {

namespace {

// The statistics' dtype: float, or double for f64 inputs (the kernels' acc_t).
DType stats_dtype(const Tensor& x) { return x.dtype() == DType::f64 ? DType::f64 : DType::f32; }

// Checks a [C] parameter (weight or bias) against x [..., C].
void check_channel_param(const char* op, const char* arg, const Tensor& p, const Tensor& x) {
  if (!p.defined()) return;
  check_same_dtype(op, x, p);
  check_same_device(op, x, p);
  ENGINE_CHECK(p.dim() == 1 && p.size(0) == x.size(-1), op, ": ", arg, " must be [", x.size(-1), "] for x ",
               engine::shape_str(x.shape()), " (channels last), got ", engine::shape_str(p.shape()));
}

// Checks a [C] statistics tensor (running or saved) against x.
void check_stats(const char* op, const char* arg, const Tensor& s, const Tensor& x) {
  check_defined(op, arg, s);
  check_dtype(op, arg, s, stats_dtype(x));
  check_same_device(op, x, s);
  ENGINE_CHECK(s.dim() == 1 && s.size(0) == x.size(-1) && s.is_contiguous(), op, ": ", arg,
               " must be a contiguous [", x.size(-1), "] for x ", engine::shape_str(x.shape()), ", got ",
               engine::shape_str(s.shape()));
}

void check_input(const char* op, const Tensor& x) {
  check_floating(op, "x", x);
  ENGINE_CHECK(x.dim() >= 2 && x.size(-1) > 0, op, ": x must be [..., C] with at least 2 dimensions and C > 0 ",
               "(channels last, e.g. NHWC), got ", engine::shape_str(x.shape()));
}

// A backward op's upstream gradient g: floating, x's dtype, device and shape.
void check_gradient(const char* op, const Tensor& g, const Tensor& x) {
  check_floating(op, "g", g);
  check_same_dtype(op, g, x);
  check_same_device(op, g, x);
  ENGINE_CHECK(g.shape() == x.shape(), op, ": gradient g ", engine::shape_str(g.shape()), " and x ",
               engine::shape_str(x.shape()), " must have the same shape");
}

// A tensor of x's shape, dtype and device besides it (a residual, a saved output).
void check_like_x(const char* op, const char* arg, const Tensor& t, const Tensor& x) {
  check_floating(op, arg, t);
  check_same_dtype(op, t, x);
  check_same_device(op, t, x);
  ENGINE_CHECK(t.shape() == x.shape(), op, ": ", arg, " ", engine::shape_str(t.shape()), " must have x's shape ",
               engine::shape_str(x.shape()));
}

// Every dimension but the channels: the ones the statistics reduce.
std::vector<int64_t> row_dims(const Tensor& x) {
  std::vector<int64_t> dims(size_t(x.dim() - 1));
  std::iota(dims.begin(), dims.end(), int64_t(0));
  return dims;
}

// Rule of batch_norm_backward. Its outputs (dx, dweight, dbias) get upstream gradients (hx, hw, hb); we need
// the gradients of  L2 = <hx, dx> + <hw, dweight> + <hb, dbias>  with respect to g, x and weight.
// Per channel, sums and means over the M rows, r = invstd, xhat = (x - mean) r, a = g * weight.
// Running statistics (constants): dx = r a, dweight = sum g xhat, so
//   d/dg = r weight hx + hw xhat + hb,   d/dweight = sum g r hx,   d/dx = r hw g.
// Batch statistics: dx = r P(a) with P(v) = v - mean(v) - xhat mean(v xhat) (self-adjoint), as in layer
// norm (ops/norm.cpp) with rows and columns exchanged:
//   d/dg      = weight r P(hx) + hw xhat + hb,    d/dweight = sum g r P(hx)
//   d/dx      = r P(u) - (dL2/dr) r^2 xhat / M,   u = hw g - r (hx mean(a xhat) + a mean(hx xhat)),
//               dL2/dr = sum hx P(a)
// mean and invstd are recomputed from x with ops (batch statistics), so the rule is differentiable in x.
// A fused activation (NormActivation): dx, dweight and dbias are those of batch norm for g' = g m, with
// m = p > 0 ? 1 : slope at p = xhat weight + bias, or m = y > 0 ? 1 : slope from the forward's output y (a residual).
// m is piecewise constant in x, weight, bias and the residual (its derivative is 0 wherever it is defined), so the
// rule is the one above for g', with d/dg = m (d/dg' + hr), hr the upstream gradient of dresidual = g'.
// Saved: g, x, then weight (when there is one), mean and invstd (running statistics), bias (an activation with one)
// or y (an activation of a residual).
Grads batch_norm_double_backward(Node& n, const Tensor& hx, const Tensor& hw, const Tensor& hb, const Tensor& hr,
                                 double eps, bool has_weight, bool batch_stats, bool has_bias, NormActivation act,
                                 bool from_y) {
  Tensor g = n.saved(0), x = n.saved(1);
  size_t next = 2;
  Tensor w = has_weight ? n.saved(next++) : Tensor();
  const std::vector<int64_t> rows = row_dims(x);
  Tensor r, xhat;
  if (batch_stats) {
    Tensor xc = sub(x, mean(x, rows, true));  // [1, ..., 1, C] statistics
    r = rsqrt(add(mean(mul(xc, xc), rows, true), eps));
    xhat = mul(xc, r);
  } else {
    r = to(n.saved(next + 1), x.dtype());
    xhat = mul(sub(x, to(n.saved(next), x.dtype())), r);
    next += 2;
  }
  Tensor m;
  if (act.on()) {
    {
      graph::NoGrad constant;  // piecewise constant: no gradient flows through the mask
      Tensor p;
      if (from_y) {
        p = n.saved(next);
      } else {
        p = w.defined() ? mul(xhat, w) : xhat;
        if (has_bias) p = add(p, n.saved(next));
      }
      m = add(mul(to(compare(CompareOp::gt, p, 0.0), x.dtype()), 1.0 - act.slope), act.slope);
    }
    g = mul(g, m);  // recorded: the rule's results stay differentiable in g (a third derivative)
  }
  Grads d = normalization_double_backward(g, w, r, xhat, rows, double(x.numel() / x.size(-1)), batch_stats, hx, hw,
                                          hb, {n.needs_input_grad(0), n.needs_input_grad(1), n.needs_input_grad(2)});
  if (hr.defined() && n.needs_input_grad(0)) d[0] = d[0].defined() ? add(d[0], hr) : hr;
  if (act.on() && d[0].defined()) d[0] = mul(d[0], m);
  return d;
}

}  // namespace

Tensor batch_norm(const Tensor& x_in, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                  const Tensor& running_var, bool training, double momentum, double eps, NormActivation act,
                  const Tensor& residual_in) {
  const char* name = "batch_norm";
  OpScope scope(name);
  check_input(name, x_in);
  check_channel_param(name, "weight", weight, x_in);
  check_channel_param(name, "bias", bias, x_in);
  const bool has_residual = residual_in.defined();
  if (has_residual) check_like_x(name, "residual", residual_in, x_in);
  ENGINE_CHECK(!has_residual || act.slope >= 0, name, ": an activation after a residual add needs a negative slope ",
               ">= 0 (its gradient is read from the sign of the output), got ", act.slope);
  ENGINE_CHECK(running_mean.defined() == running_var.defined(), name,
               ": running_mean and running_var must both be given or both be undefined");
  const bool has_running = running_mean.defined();
  if (has_running) {
    check_stats(name, "running_mean", running_mean, x_in);
    check_stats(name, "running_var", running_var, x_in);
  }
  ENGINE_CHECK(eps >= 0, name, ": eps must be >= 0, got ", eps);
  ENGINE_CHECK(std::isfinite(act.slope), name, ": the fused activation's negative slope must be finite, got ",
               act.slope);
  const bool batch_stats = training || !has_running;
  const int64_t C = x_in.size(-1), M = x_in.numel() / C;
  ENGINE_CHECK(!batch_stats || M > 1, name, ": batch statistics need more than 1 value per channel, got x ",
               engine::shape_str(x_in.shape()));
  const bool update = training && has_running;
  ENGINE_CHECK(!update || !(graph::grad_enabled() && (running_mean.requires_grad() || running_var.requires_grad())),
               name, ": the running statistics are updated in place and must not require grad");

  Tensor x = contiguous(x_in);                              // [..., C]
  Tensor residual = has_residual ? contiguous(residual_in) : Tensor();  // [..., C] or undefined
  Tensor y = empty_like(x);                                 // [..., C]
  Tensor mean = new_empty(x, {C}, stats_dtype(x));          // [C]
  Tensor invstd = new_empty(x, {C}, stats_dtype(x));        // [C]
  if (batch_stats) {
    const int64_t chunks = batch_norm_chunks(M);
    // The GPU's chunk means and M2s [P, 2, C], allocated on every device (meta predicts cuda), freed here.
    Tensor workspace =
        new_workspace(x, {chunks, 2, C}, stats_dtype(x), "the statistics' means and M2s, one per chunk of rows");
    Tensor rm = update ? running_mean : Tensor(), rv = update ? running_var : Tensor();
    run_kernel(
        name, y,
        [&] {
          cpu::batch_norm_stats(x, chunks, eps, momentum, mean, invstd, rm, rv);
          cpu::batch_norm_normalize(x, mean, invstd, weight, bias, y, act.slope, residual);
        },
        CUDA_KERNEL(cuda::batch_norm_stats(x, eps, momentum, mean, invstd, rm, rv, workspace);
                    cuda::batch_norm_normalize(x, mean, invstd, weight, bias, y, act.slope, residual)));
  } else {
    run_kernel(
        name, y,
        [&] {
          cpu::batch_norm_running_stats(running_mean, running_var, eps, mean, invstd);
          cpu::batch_norm_normalize(x, mean, invstd, weight, bias, y, act.slope, residual);
        },
        CUDA_KERNEL(cuda::batch_norm_running_stats(running_mean, running_var, eps, mean, invstd);
                    cuda::batch_norm_normalize(x, mean, invstd, weight, bias, y, act.slope, residual)));
  }
  engine::count_op(
      name, ((batch_stats ? 7.0 : 4.0) + (act.on() ? 1.0 : 0.0) + (has_residual ? 1.0 : 0.0)) * double(x.numel()),
      double((batch_stats ? 2 : 1) * x.nbytes() + y.nbytes() + (has_residual ? residual.nbytes() : 0)));
  if (graph::any_requires_grad({x, weight, bias, residual})) {
    std::vector<Tensor> saved = {x, mean, invstd, weight};
    // The activation's mask: from the bias (a parameter: no memory of x's size), or after a residual from y.
    const bool from_y = act.on() && has_residual;
    if (act.on()) saved.push_back(from_y ? y : bias);
    const bool has_weight = weight.defined();
    graph::record(name, {x, weight, bias, residual}, {y}, saved,
                  [eps, has_weight, batch_stats, act, from_y, has_residual](Node& n, const Grads& g) -> Grads {
                    Tensor w = has_weight ? n.saved(3) : Tensor();
                    const bool dres = has_residual && n.needs_input_grad(3);
                    BatchNormGrads r = batch_norm_backward(
                        g[0], n.saved(0), w, n.saved(1), n.saved(2), batch_stats, eps,
                        {n.needs_input_grad(0), n.needs_input_grad(1), n.needs_input_grad(2), from_y && dres},
                        act.on() && !from_y ? n.saved(4) : Tensor(), act, from_y ? n.saved(4) : Tensor());
                    // Without an activation the residual's gradient is g itself (as add's).
                    return {r.dx, r.dweight, r.dbias, !dres ? Tensor() : from_y ? r.dresidual : g[0]};
                  });
  }
  return y;
}

BatchNormGrads batch_norm_backward(const Tensor& g_in, const Tensor& x_in, const Tensor& weight, const Tensor& mean,
                                   const Tensor& invstd, bool batch_stats, double eps, std::array<bool, 4> output_mask,
                                   const Tensor& bias, NormActivation act, const Tensor& y_in) {
  const char* name = "batch_norm_backward";
  OpScope scope(name);
  check_input(name, x_in);
  check_gradient(name, g_in, x_in);
  check_channel_param(name, "weight", weight, x_in);
  check_channel_param(name, "bias", bias, x_in);
  check_stats(name, "mean", mean, x_in);
  check_stats(name, "invstd", invstd, x_in);
  ENGINE_CHECK(!output_mask[1] || weight.defined(), name, ": dweight requested without a weight");
  const bool from_y = y_in.defined();  // the activation's derivative read from the output of act(p + residual)
  if (from_y) {
    check_like_x(name, "y", y_in, x_in);
    ENGINE_CHECK(act.on() && act.slope >= 0, name, ": y is the output of an activation with a negative slope >= 0 ",
                 "after a residual; got slope ", act.slope);
  }
  ENGINE_CHECK(!output_mask[3] || from_y, name, ": dresidual requested without the forward's output y");
  const int64_t C = x_in.size(-1), M = x_in.numel() / C;
  Tensor g = contiguous(g_in), x = contiguous(x_in), y = from_y ? contiguous(y_in) : Tensor();
  BatchNormGrads out;
  if (output_mask[0]) out.dx = empty_like(x);           // [..., C]
  if (output_mask[1]) out.dweight = new_empty(x, {C});  // [C]
  if (output_mask[2]) out.dbias = new_empty(x, {C});    // [C]
  if (output_mask[3]) out.dresidual = empty_like(x);    // [..., C]
  const int64_t chunks = batch_norm_chunks(M);
  // The GPU's column partial sums [P, 2, C] (sum g, sum g xhat per row chunk), on every device alike.
  Tensor workspace;
  if (output_mask[1] || output_mask[2] || (output_mask[0] && batch_stats))
    workspace = new_workspace(x, {chunks, 2, C}, stats_dtype(x), "the gradients' column sums, one per chunk of rows");
  run_kernel(
      name, x,
      [&] {
        cpu::batch_norm_backward(g, x, weight, mean, invstd, batch_stats, chunks, out.dx, out.dweight, out.dbias, bias,
                                 act.slope, y, out.dresidual);
      },
      CUDA_KERNEL(cuda::batch_norm_backward(g, x, weight, mean, invstd, batch_stats, out.dx, out.dweight, out.dbias,
                                            workspace, bias, act.slope, y, out.dresidual)));
  workspace = Tensor();
  // Bytes of the GPU's passes: the sums read g and x (and y), dx reads g (or dresidual, once written) and x.
  const double passes_y = from_y ? (out.dresidual.defined() ? 1.0 : 2.0) : 0.0;
  engine::count_op(name, (act.on() ? 13.0 : 11.0) * double(x.numel()),
                   double(g.nbytes() + x.nbytes() + (out.dx.defined() ? g.nbytes() + x.nbytes() + x.nbytes() : 0)) +
                       passes_y * double(x.nbytes()) + (out.dresidual.defined() ? double(x.nbytes()) : 0.0));

  if (graph::any_requires_grad({g, x, weight})) {  // one node for dx, dweight, dbias, dresidual
    std::vector<Tensor> saved = {g, x};
    if (weight.defined()) saved.push_back(weight);
    if (!batch_stats) {  // constants of the rule; with batch statistics it recomputes them from x
      saved.push_back(mean);
      saved.push_back(invstd);
    }
    const bool has_bias = act.on() && !from_y && bias.defined();
    if (has_bias) saved.push_back(bias);  // the activation's mask
    if (from_y) saved.push_back(y);       // the activation's mask after a residual
    const bool has_weight = weight.defined();
    graph::record_optional(name, {g, x, weight}, {out.dx, out.dweight, out.dbias, out.dresidual}, saved,
                           [eps, has_weight, batch_stats, has_bias, act, from_y](Node& n, const Grads& h) -> Grads {
                             return batch_norm_double_backward(n, h[0], h[1], h[2], h[3], eps, has_weight, batch_stats,
                                                               has_bias, act, from_y);
                           });
  }
  return out;
}

// ---------------------------------------------------------------------------------------------------
// Instance norm: batch norm of each sample (ops/batch_norm.h).

namespace {

void check_instance_input(const char* op, const Tensor& x) {
  check_floating(op, "x", x);
  ENGINE_CHECK(x.dim() >= 3 && x.size(-1) > 0, op, ": x must be [N, ..., C] (channels last, e.g. NHWC) with at least ",
               "3 dimensions and C > 0, got ", engine::shape_str(x.shape()));
  ENGINE_CHECK(x.numel() / (x.size(0) * x.size(-1)) > 1, op,
               ": instance statistics need more than 1 value per sample and channel, got x ",
               engine::shape_str(x.shape()));
}

// Sample n of a contiguous [N, ..., C] tensor as the contiguous [S, C] block the batch-norm kernels take, and row n
// of an [N, C] statistics tensor as a [C].
Tensor sample_rows(const Tensor& t, int64_t n) {
  const int64_t C = t.size(-1), S = t.numel() / (t.size(0) * C);
  return Tensor::view_of(t, {S, C}, {C, 1}, t.offset() + n * S * C);
}
Tensor sample_stats(const Tensor& t, int64_t n) {
  return Tensor::view_of(t, {t.size(1)}, {1}, t.offset() + n * t.size(1));
}

// Rule of instance_norm_backward: normalization_double_backward with the statistics of x seen as [N, S, C] over S.
Grads instance_norm_double_backward(Node& n, const Tensor& hx, double eps) {
  Tensor x_in = n.saved(1);
  const int64_t N = x_in.size(0), C = x_in.size(-1), S = x_in.numel() / (N * C);
  Tensor g = reshape(n.saved(0), {N, S, C}), x = reshape(x_in, {N, S, C});
  Tensor xc = sub(x, mean(x, {1}, true));  // [N, 1, C] statistics
  Tensor r = rsqrt(add(mean(mul(xc, xc), {1}, true), eps));
  Grads d = normalization_double_backward(g, Tensor(), r, mul(xc, r), {1}, double(S), true, reshape(hx, {N, S, C}),
                                          Tensor(), Tensor(), {n.needs_input_grad(0), n.needs_input_grad(1), false});
  for (size_t i = 0; i < 2; i++)
    if (d[i].defined()) d[i] = reshape(d[i], x_in.shape());
  return {d[0], d[1]};
}

}  // namespace

Tensor instance_norm(const Tensor& x_in, double eps) {
  const char* name = "instance_norm";
  OpScope scope(name);
  check_instance_input(name, x_in);
  ENGINE_CHECK(eps >= 0, name, ": eps must be >= 0, got ", eps);
  Tensor x = contiguous(x_in);  // [N, ..., C]
  const int64_t N = x.size(0), C = x.size(-1), S = x.numel() / (N * C), chunks = batch_norm_chunks(S);
  Tensor y = empty_like(x);                              // [N, ..., C]
  Tensor mean = new_empty(x, {N, C}, stats_dtype(x));    // [N, C]
  Tensor invstd = new_empty(x, {N, C}, stats_dtype(x));  // [N, C]
  // The GPU's chunk partials [P, 2, C] of one sample, reused sample after sample (one stream: in order), on every
  // device alike so that meta predicts the GPU.
  Tensor workspace =
      new_workspace(x, {chunks, 2, C}, stats_dtype(x), "one sample's means and M2s, one per chunk of its pixels");
  run_kernel(
      name, y,
      [&] {
        for (int64_t n = 0; n < N; n++) {
          Tensor xs = sample_rows(x, n), m = sample_stats(mean, n), r = sample_stats(invstd, n);
          cpu::batch_norm_stats(xs, chunks, eps, 0.0, m, r, Tensor(), Tensor());
          cpu::batch_norm_normalize(xs, m, r, Tensor(), Tensor(), sample_rows(y, n));
        }
      },
      CUDA_KERNEL(for (int64_t n = 0; n < N; n++) {
        Tensor xs = sample_rows(x, n), m = sample_stats(mean, n), r = sample_stats(invstd, n);
        cuda::batch_norm_stats(xs, eps, 0.0, m, r, Tensor(), Tensor(), workspace);
        cuda::batch_norm_normalize(xs, m, r, Tensor(), Tensor(), sample_rows(y, n));
      }));
  workspace = Tensor();
  engine::count_op(name, 7.0 * double(x.numel()), double(2 * x.nbytes() + y.nbytes()));
  if (graph::any_requires_grad({x})) {
    graph::record(name, {x}, {y}, {x, mean, invstd}, [eps](Node& n, const Grads& g) -> Grads {
      return {instance_norm_backward(g[0], n.saved(0), n.saved(1), n.saved(2), eps)};
    });
  }
  return y;
}

Tensor instance_norm_backward(const Tensor& g_in, const Tensor& x_in, const Tensor& mean, const Tensor& invstd,
                              double eps) {
  const char* name = "instance_norm_backward";
  OpScope scope(name);
  check_instance_input(name, x_in);
  check_gradient(name, g_in, x_in);
  const int64_t N = x_in.size(0), C = x_in.size(-1), S = x_in.numel() / (N * C), chunks = batch_norm_chunks(S);
  for (const auto& [arg, t] : {std::pair<const char*, const Tensor&>{"mean", mean}, {"invstd", invstd}}) {
    check_defined(name, arg, t);
    check_dtype(name, arg, t, stats_dtype(x_in));
    check_same_device(name, x_in, t);
    ENGINE_CHECK(t.dim() == 2 && t.size(0) == N && t.size(1) == C && t.is_contiguous(), name, ": ", arg,
                 " must be a contiguous [", N, ", ", C, "] for x ", engine::shape_str(x_in.shape()), ", got ",
                 engine::shape_str(t.shape()));
  }
  Tensor g = contiguous(g_in), x = contiguous(x_in);
  Tensor dx = empty_like(x);                                        // [N, ..., C]
  Tensor workspace = new_workspace(x, {chunks, 2, C}, stats_dtype(x),  // one sample's column sums, reused
                                   "one sample's column sums, one per chunk of its pixels");
  run_kernel(
      name, x,
      [&] {
        for (int64_t n = 0; n < N; n++)
          cpu::batch_norm_backward(sample_rows(g, n), sample_rows(x, n), Tensor(), sample_stats(mean, n),
                                   sample_stats(invstd, n), true, chunks, sample_rows(dx, n), Tensor(), Tensor());
      },
      CUDA_KERNEL(for (int64_t n = 0; n < N; n++) cuda::batch_norm_backward(
          sample_rows(g, n), sample_rows(x, n), Tensor(), sample_stats(mean, n), sample_stats(invstd, n), true,
          sample_rows(dx, n), Tensor(), Tensor(), workspace)));
  workspace = Tensor();
  engine::count_op(name, 11.0 * double(x.numel()), double(3 * g.nbytes() + 2 * x.nbytes()));
  if (graph::any_requires_grad({g, x}))
    graph::record(name, {g, x}, {dx}, {g, x},
                  [eps](Node& n, const Grads& h) -> Grads { return instance_norm_double_backward(n, h[0], eps); });
  return dx;
}

}  // namespace ops
