// norm.cpp: layer_norm, its fused multi-output backward op, and that op's own rule (double backward);
// dropout_add_layer_norm (the post-norm residual step in one op); weight_norm and its backward op.
#include "ops/norm.h"

#include <algorithm>

#include "ops/cpu/dropout.h"
#include "ops/cpu/elementwise.h"
#include "ops/cpu/norm.h"
#ifdef ENGINE_CUDA
#include "ops/cuda/norm.h"
#include "ops/cuda/reduce.h"
#endif
#include "ops/dropout.h"
#include "ops/elementwise.h"
#include "ops/op.h"
#include "ops/reduce.h"

namespace ops {

namespace {

// Checks a [C] parameter (weight or bias) of layer_norm against x [..., C].
void check_norm_param(const char* op, const char* arg, const Tensor& p, const Tensor& x) {
  if (!p.defined()) return;
  check_same_dtype(op, x, p);
  check_same_device(op, x, p);
  ENGINE_CHECK(p.dim() == 1 && p.size(0) == x.size(-1), op, ": ", arg, " must be [", x.size(-1), "] for x ",
               engine::shape_str(x.shape()), ", got ", engine::shape_str(p.shape()));
}

// The statistics' dtype: float, or double for f64 inputs (the kernel's acc_t).
DType stats_dtype(const Tensor& x) { return x.dtype() == DType::f64 ? DType::f64 : DType::f32; }

// layer_norm's node (when anything needs a gradient): saves x, mean, rstd and weight; its rule is one
// layer_norm_backward op.
void record_layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& y, const Tensor& mean,
                       const Tensor& rstd, double eps) {
  if (!graph::any_requires_grad({x, weight, bias})) return;
  std::vector<Tensor> saved = {x, mean, rstd};
  if (weight.defined()) saved.push_back(weight);
  const bool has_weight = weight.defined();
  graph::record("layer_norm", {x, weight, bias}, {y}, saved, [eps, has_weight](Node& n, const Grads& g) -> Grads {
    Tensor w = has_weight ? n.saved(3) : Tensor();
    LayerNormGrads r = layer_norm_backward(g[0], n.saved(0), w, n.saved(1), n.saved(2), eps,
                                           {n.needs_input_grad(0), n.needs_input_grad(1), n.needs_input_grad(2)});
    return {r.dx, r.dweight, r.dbias};
  });
}

// Row chunks of layer_norm_backward's column sums: about 16 rows each, at most 512 (a few MB of partial
// sums at BERT widths; enough blocks to fill a GPU).
int64_t column_sum_chunks(int64_t rows) { return std::min<int64_t>(512, std::max<int64_t>(1, (rows + 15) / 16)); }

// Rule of layer_norm_backward. Its outputs (dx, dweight, dbias) get upstream gradients (hx, hw, hb); we need
// the gradients of  L2 = <hx, dx> + <hw, dweight> + <hb, dbias>  with respect to g, x and weight.
// Per row, with r = rstd, xhat = (x - mean) r, a = g * weight, P(v) = v - mean(v) - xhat * mean(v * xhat)
// (the projection in dx = r P(a); P is self-adjoint):
//   d/dg      = weight * r P(hx) + hw * xhat + hb
//   d/dweight = sum_rows g * r P(hx)
//   d/dx      = r P(u) - (dL2/dr) r^2 xhat / C,  where u = dL2/dxhat at fixed r
//               = hw * g - r (hx * mean(a xhat) + a * mean(hx xhat)),  dL2/dr = sum(hx * P(a))
// (the first term is the usual layer-norm chain through xhat; the second the explicit r of dx = r P(a)).
Grads layer_norm_double_backward(Node& n, const Tensor& hx, const Tensor& hw, const Tensor& hb, double eps,
                                 bool has_weight) {
  Tensor g = n.saved(0), x = n.saved(1);
  Tensor w = has_weight ? n.saved(2) : Tensor();
  // Statistics recomputed with ops, so that this rule is itself differentiable in x.
  Tensor xc = sub(x, mean(x, {-1}, true));
  Tensor r = rsqrt(add(mean(mul(xc, xc), {-1}, true), eps));  // [..., 1]
  return normalization_double_backward(g, w, r, mul(xc, r), {-1}, double(x.size(-1)), true, hx, hw, hb,
                                       {n.needs_input_grad(0), n.needs_input_grad(1), n.needs_input_grad(2)});
}

}  // namespace

// ---------------------------------------------------------------------------------------------------
Grads normalization_double_backward(const Tensor& g, const Tensor& w, const Tensor& r, const Tensor& xhat,
                                    const std::vector<int64_t>& dims, double count, bool stats_of_x, const Tensor& hx,
                                    const Tensor& hw, const Tensor& hb, std::array<bool, 3> needs) {
  auto stat_mean = [&](const Tensor& t) { return mean(t, dims, true); };  // one value per statistic
  Tensor a = w.defined() ? mul(g, w) : g;
  // P(v) = v - mean(v) - xhat mean(v xhat): dx = r P(a) when the statistics depend on x (P is self-adjoint).
  auto project = [&](const Tensor& v) { return sub(sub(v, stat_mean(v)), mul(xhat, stat_mean(mul(v, xhat)))); };
  Tensor dg, dx, dw;
  Tensor r_p_hx = hx.defined() ? mul(r, stats_of_x ? project(hx) : hx) : Tensor();
  if (needs[0]) {
    if (r_p_hx.defined()) dg = w.defined() ? mul(r_p_hx, w) : r_p_hx;
    if (hw.defined()) dg = dg.defined() ? add(dg, mul(hw, xhat)) : mul(hw, xhat);
    if (hb.defined()) dg = dg.defined() ? add(dg, hb) : contiguous(broadcast_to(hb, g.shape()));
  }
  if (needs[2] && r_p_hx.defined()) dw = sum_to(mul(g, r_p_hx), w.shape());
  if (needs[1] && !stats_of_x) {  // dx = r a: only dweight's xhat depends on x
    if (hw.defined()) dx = mul(mul(hw, g), r);
  } else if (needs[1]) {
    Tensor u = hw.defined() ? mul(hw, g) : Tensor();
    if (hx.defined()) {
      Tensor via_xhat = neg(mul(r, add(mul(hx, stat_mean(mul(a, xhat))), mul(a, stat_mean(mul(hx, xhat))))));
      u = u.defined() ? add(u, via_xhat) : via_xhat;
    }
    if (u.defined()) dx = mul(r, project(u));
    if (hx.defined()) {
      Tensor dl2_dr = sum(mul(hx, project(a)), dims, true);
      Tensor via_r = mul(mul(dl2_dr, mul(r, r)), mul(xhat, -1.0 / count));
      dx = dx.defined() ? add(dx, via_r) : via_r;
    }
  }
  return {dg, dx, dw};
}

Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  OpScope scope("layer_norm");
  check_floating("layer_norm", "x", x);
  ENGINE_CHECK(x.dim() >= 1, "layer_norm: x must have at least 1 dimension (the normalized one), got a scalar");
  check_norm_param("layer_norm", "weight", weight, x);
  check_norm_param("layer_norm", "bias", bias, x);
  ENGINE_CHECK(eps >= 0, "layer_norm: eps must be >= 0, got ", eps);
  const int64_t C = x.size(-1), rows = C > 0 ? x.numel() / C : 0;
  Tensor y = empty_like(x);                                 // [..., C]
  Tensor mean = new_empty(x, {rows}, stats_dtype(x));       // [rows]
  Tensor rstd = new_empty(x, {rows}, stats_dtype(x));       // [rows]
  run_kernel("layer_norm", y, [&] { cpu::layer_norm_forward(x, weight, bias, eps, y, mean, rstd); },
             CUDA_KERNEL(cuda::layer_norm_forward(x, weight, bias, eps, y, mean, rstd)));
  engine::count_op("layer_norm", 8.0 * double(x.numel()),
                   double(x.nbytes() + y.nbytes() + mean.nbytes() + rstd.nbytes()));
  record_layer_norm(x, weight, bias, y, mean, rstd, eps);
  return y;
}

Tensor dropout_add_layer_norm(const Tensor& y, const Tensor& residual, const Tensor& weight, const Tensor& bias,
                              double p, bool training, double eps) {
  const char* name = "dropout_add_layer_norm";
  OpScope scope(name);
  check_floating(name, "y", y);
  check_same_dtype(name, y, residual);
  check_same_device(name, y, residual);
  ENGINE_CHECK(y.shape() == residual.shape(), name, ": y ", engine::shape_str(y.shape()), " and the residual ",
               engine::shape_str(residual.shape()), " must have the same shape");
  ENGINE_CHECK(y.dim() >= 1, name, ": y must have at least 1 dimension (the normalized one), got a scalar");
  check_drop_probability(name, p);
  check_norm_param(name, "weight", weight, y);
  check_norm_param(name, "bias", bias, y);
  ENGINE_CHECK(eps >= 0, name, ": eps must be >= 0, got ", eps);
  // ops::dropout's draw, reserved where it would reserve it (none without dropout).
  const bool drop = training && p > 0;
  const DropoutDraw draw = drop ? reserve_dropout_draw(uint64_t(y.numel())) : DropoutDraw{};
  const uint64_t seed = draw.seed, offset = draw.offset;
  const int64_t C = y.size(-1), rows = C > 0 ? y.numel() / C : 0;
  Tensor x = empty_like(y);                             // [..., C] dropout(y) + residual: saved, as layer_norm's x
  Tensor out = empty_like(y);                           // [..., C]
  Tensor mean = new_empty(y, {rows}, stats_dtype(y));  // [rows]
  Tensor rstd = new_empty(y, {rows}, stats_dtype(y));  // [rows]
  run_kernel(
      name, out,
      [&] {
        if (drop) {
          cpu::dropout(y, p, seed, offset, x);
          cpu::binary(BinaryOp::add, x, residual, x);
        } else {
          cpu::binary(BinaryOp::add, y, residual, x);
        }
        cpu::layer_norm_forward(x, weight, bias, eps, out, mean, rstd);
      },
      CUDA_KERNEL(cuda::dropout_add_layer_norm(y, residual, weight, bias, drop ? p : 0.0, seed, offset, eps, x, out,
                                               mean, rstd)));
  engine::count_op(name, 10.0 * double(y.numel()),
                   double(y.nbytes() + residual.nbytes() + x.nbytes() + out.nbytes() + mean.nbytes() + rstd.nbytes()));
  // The graph of the three ops: a node for the sum (dropout's and add's rules) and layer_norm's node on it, so
  // that the saved sum stays differentiable in y and the residual (double backward) and backward runs as before.
  if (graph::any_requires_grad({y, residual})) {
    graph::record("dropout_add", {y, residual}, {x}, {}, [p, drop, seed, offset](Node& n, const Grads& g) -> Grads {
      Tensor dy;
      if (n.needs_input_grad(0)) dy = drop ? dropout_mask_apply(g[0], p, seed, offset) : g[0];
      return {dy, n.needs_input_grad(1) ? g[0] : Tensor()};
    });
  }
  record_layer_norm(x, weight, bias, out, mean, rstd, eps);
  return out;
}

LayerNormGrads layer_norm_backward(const Tensor& g, const Tensor& x, const Tensor& weight, const Tensor& mean,
                                   const Tensor& rstd, double eps, std::array<bool, 3> output_mask) {
  const char* name = "layer_norm_backward";
  OpScope scope(name);
  check_floating(name, "g", g);
  check_floating(name, "x", x);
  check_same_dtype(name, g, x);
  check_same_device(name, g, x);
  ENGINE_CHECK(g.shape() == x.shape(), name, ": gradient g ", engine::shape_str(g.shape()), " and x ",
               engine::shape_str(x.shape()), " must have the same shape");
  check_norm_param(name, "weight", weight, x);
  const int64_t C = x.size(-1), rows = C > 0 ? x.numel() / C : 0;
  for (const Tensor* s : {&mean, &rstd}) {
    check_dtype(name, s == &mean ? "mean" : "rstd", *s, stats_dtype(x));
    ENGINE_CHECK(s->shape() == Shape{rows}, name, ": saved statistics must be [", rows, "] for x ",
                 engine::shape_str(x.shape()), ", got ", engine::shape_str(s->shape()));
  }
  ENGINE_CHECK(!output_mask[1] || weight.defined(), name, ": dweight requested without a weight");
  LayerNormGrads out;
  if (output_mask[0]) out.dx = empty_like(x);                         // [..., C]
  if (output_mask[1]) out.dweight = new_empty(x, {C});                // [C]
  if (output_mask[2]) out.dbias = new_empty(x, {C});                  // [C]
  // The GPU's deterministic column sums of dweight/dbias: per-chunk partial rows [P, 2, C], P a fixed function
  // of the row count (never of the GPU), allocated on every device so that meta predicts cuda exactly.
  Tensor workspace;
  if (output_mask[1] || output_mask[2])
    workspace = new_workspace(x, {column_sum_chunks(rows), 2, C}, stats_dtype(x),
                              "the weight and bias gradients' partial sums, one per chunk of rows");
  run_kernel(
      name, x, [&] { cpu::layer_norm_backward(g, x, weight, mean, rstd, out.dx, out.dweight, out.dbias); },
      CUDA_KERNEL(cuda::layer_norm_backward(g, x, weight, mean, rstd, out.dx, out.dweight, out.dbias, workspace)));
  workspace = Tensor();
  engine::count_op(name, 10.0 * double(x.numel()),
                   double(g.nbytes() + x.nbytes() + (out.dx.defined() ? x.nbytes() : 0)));

  if (graph::any_requires_grad({g, x, weight})) {  // one node for dx, dweight, dbias
    std::vector<Tensor> saved = {g, x};
    if (weight.defined()) saved.push_back(weight);
    const bool has_weight = weight.defined();
    graph::record_optional(name, {g, x, weight}, {out.dx, out.dweight, out.dbias}, saved,
                           [eps, has_weight](Node& n, const Grads& h) -> Grads {
                             return layer_norm_double_backward(n, h[0], h[1], h[2], eps, has_weight);
                           });
  }
  return out;
}

// ---------------------------------------------------------------------------------------------------
// Weight normalization

namespace {

// Every dimension of an ndim-dimensional v but dim: those weight_norm sums over.
std::vector<int64_t> dims_but(int64_t dim, int64_t ndim) {
  std::vector<int64_t> dims;
  for (int64_t d = 0; d < ndim; d++)
    if (d != dim) dims.push_back(d);
  return dims;
}

std::vector<bool> mask_but(int64_t dim, int64_t ndim) {
  std::vector<bool> mask(size_t(ndim), true);
  mask[size_t(dim)] = false;
  return mask;
}

// g's shape for v: v's with 1 in every dimension but dim.
Shape channel_shape(const Shape& v, int64_t dim) {
  Shape s(v.size(), 1);
  s[size_t(dim)] = v[size_t(dim)];
  return s;
}

// The sum of t over every dimension but dim, kept as size 1 (a 1-d t: each element is its own channel, while
// ops::sum over no dimensions would sum all).
Tensor channel_sum(const Tensor& t, int64_t dim) {
  const std::vector<int64_t> dims = dims_but(dim, t.dim());
  return dims.empty() ? t : sum(t, dims, true);
}

// weight_norm_backward with engine ops, from v (so differentiable in dw, v and g): the rule under create_graph.
WeightNormGrads weight_norm_backward_composite(const Tensor& dw, const Tensor& v, const Tensor& g, int64_t dim,
                                               std::array<bool, 2> output_mask) {
  Tensor norm_sq = channel_sum(mul(v, v), dim), r = sqrt(norm_sq);
  Tensor s = channel_sum(mul(dw, v), dim);  // [.., n, ..]
  WeightNormGrads out;
  if (output_mask[0]) out.dv = mul(div(g, r), sub(dw, mul(v, div(s, norm_sq))));
  if (output_mask[1]) out.dg = div(s, r);
  return out;
}

}  // namespace

Tensor weight_norm_magnitude(const Tensor& v, int64_t dim) {
  return sqrt(channel_sum(mul(v, v), normalize_dim("weight_norm_magnitude", dim, v.dim())));
}

bool weight_norm_one_pass(const Shape& v_shape, int64_t dim) {
  auto all_ones = [](auto first, auto last) { return std::all_of(first, last, [](int64_t n) { return n == 1; }); };
  return all_ones(v_shape.begin(), v_shape.begin() + dim) || all_ones(v_shape.begin() + dim + 1, v_shape.end());
}

Tensor weight_norm(const Tensor& v, const Tensor& g, int64_t dim) {
  const char* name = "weight_norm";
  OpScope scope(name);
  check_floating(name, "v", v);
  check_same_dtype(name, v, g);
  check_same_device(name, v, g);
  ENGINE_CHECK(v.dim() >= 1, name, ": v must have at least 1 dimension (the channels'), got a scalar");
  const int64_t d = normalize_dim(name, dim, v.dim()), n = v.size(d);
  ENGINE_CHECK(g.shape() == channel_shape(v.shape(), d), name, ": g ", engine::shape_str(g.shape()), " must be ",
               engine::shape_str(channel_shape(v.shape(), d)), " for v ", engine::shape_str(v.shape()),
               " normalized over every dimension but ", d);
  Tensor vc = contiguous(v), gc = contiguous(g);       // parameters: no copy
  Tensor norm_sq = new_empty(v, {n}, stats_dtype(v));  // [n], saved
  Tensor w = empty_like(vc);                           // v's shape
  if (weight_norm_one_pass(v.shape(), d)) {
    run_kernel(
        name, w, [&] { cpu::weight_norm_forward(vc, gc, d, w, norm_sq); },
        CUDA_KERNEL(cuda::weight_norm_forward_one_pass(vc, gc, d, norm_sq, w)));
  } else {
    const std::vector<bool> mask = mask_but(d, v.dim());
    Tensor partials = sum_workspace(vc, mask, n);  // freed with this scope
    run_kernel(
        name, w, [&] { cpu::weight_norm_forward(vc, gc, d, w, norm_sq); },
        CUDA_KERNEL(cuda::sum_of_products(vc, vc, mask, norm_sq, partials);
                    cuda::weight_norm_scale(vc, gc, norm_sq, d, w)));
  }
  engine::count_op(name, 3.0 * double(v.numel()), double(2 * v.nbytes() + w.nbytes() + norm_sq.nbytes()));
  if (graph::any_requires_grad({v, g})) {
    graph::record(name, {v, g}, {w}, {vc, gc, norm_sq}, [d](Node& n, const Grads& gr) -> Grads {
      WeightNormGrads r = weight_norm_backward(gr[0], n.saved(0), n.saved(1), n.saved(2), d,
                                               {n.needs_input_grad(0), n.needs_input_grad(1)});
      return {r.dv, r.dg};
    });
  }
  return w;
}

WeightNormGrads weight_norm_backward(const Tensor& dw, const Tensor& v, const Tensor& g, const Tensor& norm_sq,
                                     int64_t dim, std::array<bool, 2> output_mask) {
  const char* name = "weight_norm_backward";
  OpScope scope(name);
  check_floating(name, "dw", dw);
  check_same_dtype(name, dw, v);
  check_same_dtype(name, v, g);
  check_same_device(name, dw, v);
  check_same_device(name, v, g);
  const int64_t d = normalize_dim(name, dim, v.dim()), n = v.size(d);
  ENGINE_CHECK(dw.shape() == v.shape(), name, ": the gradient dw ", engine::shape_str(dw.shape()),
               " must have v's shape ", engine::shape_str(v.shape()));
  ENGINE_CHECK(g.shape() == channel_shape(v.shape(), d), name, ": g ", engine::shape_str(g.shape()), " must be ",
               engine::shape_str(channel_shape(v.shape(), d)));
  check_dtype(name, "norm_sq", norm_sq, stats_dtype(v));
  ENGINE_CHECK(norm_sq.shape() == Shape{n}, name, ": the saved squared norms must be [", n, "], got ",
               engine::shape_str(norm_sq.shape()));

  // The gradient will be differentiated again (create_graph): compute it with engine ops.
  if (graph::any_requires_grad({dw, v, g})) return weight_norm_backward_composite(dw, v, g, d, output_mask);

  Tensor dwc = contiguous(dw), vc = contiguous(v), gc = contiguous(g);
  WeightNormGrads out;
  if (output_mask[0]) out.dv = empty_like(vc);
  if (output_mask[1]) out.dg = empty_like(gc);
  if (!out.dv.defined() && !out.dg.defined()) return out;
  if (weight_norm_one_pass(v.shape(), d)) {
    run_kernel(
        name, vc, [&] { cpu::weight_norm_backward(dwc, vc, gc, norm_sq, d, out.dv, out.dg); },
        CUDA_KERNEL(cuda::weight_norm_backward_one_pass(dwc, vc, gc, norm_sq, d, out.dv, out.dg)));
  } else {
    const std::vector<bool> mask = mask_but(d, v.dim());
    Tensor s = new_workspace(v, {n}, stats_dtype(v), "weight_norm's per-channel sums of dw * v");
    Tensor partials = sum_workspace(vc, mask, n);
    run_kernel(
        name, vc, [&] { cpu::weight_norm_backward(dwc, vc, gc, norm_sq, d, out.dv, out.dg); },
        CUDA_KERNEL(cuda::sum_of_products(dwc, vc, mask, s, partials);
                    cuda::weight_norm_backward(dwc, vc, gc, norm_sq, s, d, out.dv, out.dg)));
  }
  engine::count_op(name, 5.0 * double(v.numel()),
                   double(3 * v.nbytes() + (out.dv.defined() ? v.nbytes() : 0) + norm_sq.nbytes()));
  return out;
}

}  // namespace ops
