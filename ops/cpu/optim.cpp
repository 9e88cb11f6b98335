// cpu/optim.cpp: reference loops of the optimizer updates (formulas in ops/optim.h).
//
// Each kernel is one pass over the parameter: load p, g and the slots, update in acc_t<T>, store. The
// order of operations follows PyTorch's single-tensor implementation (lerp for first moments, mul then
// addcmul for second moments) so that f32 results agree with it to the last bit or two.
#include "ops/cpu/optim.h"

#include <algorithm>
#include <cmath>

#include "ops/cpu/cpu_util.h"

namespace ops::cpu {

namespace {

template <typename T>
void sgd_kernel(const ParamUpdate& t, const SgdStep& h) {
  using A = acc_t<T>;
  T* p = t.param.data<T>();
  const T* g = t.grad.data<T>();
  T* buf = h.momentum != 0 ? t.slots[0].data<T>() : nullptr;
  const A lr = A(h.lr), wd = A(h.weight_decay), mom = A(h.momentum), keep = A(1 - h.dampening);
  parallel_for(t.param.numel(), [&](int64_t i) {
    A pi = ld(p[i]);
    A d = ld(g[i]);
    if (h.weight_decay != 0) d += wd * pi;
    if (buf) {
      A b = h.first_step ? d : mom * ld(buf[i]) + keep * d;
      buf[i] = st<T>(b);
      d = h.nesterov ? d + mom * b : b;
    }
    p[i] = st<T>(pi - lr * d);
  });
}

template <typename T>
void adam_kernel(const ParamUpdate& t, const AdamStep& h) {
  using A = acc_t<T>;
  T* p = t.param.data<T>();
  const T* g = t.grad.data<T>();
  T* m = t.slots[0].data<T>();  // exp_avg
  T* v = t.slots[1].data<T>();  // exp_avg_sq
  const double t_ = double(h.step);
  const A step_size = A(h.lr / (1 - std::pow(h.beta1, t_)));
  const A bc2_sqrt = A(std::sqrt(1 - std::pow(h.beta2, t_)));
  const A one_minus_b1 = A(1 - h.beta1), b2 = A(h.beta2), one_minus_b2 = A(1 - h.beta2), eps = A(h.eps);
  const A wd = A(h.weight_decay), decay = A(1 - h.lr * h.weight_decay);
  const bool l2 = h.weight_decay != 0 && !h.decoupled_weight_decay;
  const bool decoupled = h.weight_decay != 0 && h.decoupled_weight_decay;
  parallel_for(t.param.numel(), [&](int64_t i) {
    A pi = ld(p[i]);
    A gi = ld(g[i]);
    if (l2) gi += wd * pi;
    if (decoupled) pi *= decay;
    A mi = ld(m[i]);
    mi += one_minus_b1 * (gi - mi);
    A vi = b2 * ld(v[i]) + one_minus_b2 * gi * gi;
    m[i] = st<T>(mi);
    v[i] = st<T>(vi);
    p[i] = st<T>(pi - step_size * mi / (std::sqrt(vi) / bc2_sqrt + eps));
  });
}

template <typename T>
void adamax_kernel(const ParamUpdate& t, const AdamaxStep& h) {
  using A = acc_t<T>;
  T* p = t.param.data<T>();
  const T* g = t.grad.data<T>();
  T* m = t.slots[0].data<T>();  // exp_avg
  T* u = t.slots[1].data<T>();  // exp_inf
  const A clr = A(h.lr / (1 - std::pow(h.beta1, double(h.step))));
  const A one_minus_b1 = A(1 - h.beta1), b2 = A(h.beta2), eps = A(h.eps), wd = A(h.weight_decay);
  parallel_for(t.param.numel(), [&](int64_t i) {
    A pi = ld(p[i]);
    A gi = ld(g[i]);
    if (h.weight_decay != 0) gi += wd * pi;
    A mi = ld(m[i]);
    mi += one_minus_b1 * (gi - mi);
    A ui = std::max(b2 * ld(u[i]), std::abs(gi) + eps);
    m[i] = st<T>(mi);
    u[i] = st<T>(ui);
    p[i] = st<T>(pi - clr * mi / ui);
  });
}

template <typename T>
void rmsprop_kernel(const ParamUpdate& t, const RmsPropStep& h) {
  using A = acc_t<T>;
  T* p = t.param.data<T>();
  const T* g = t.grad.data<T>();
  size_t k = 0;
  T* sq = t.slots[k++].data<T>();                                    // square_avg
  T* buf = h.momentum != 0 ? t.slots[k++].data<T>() : nullptr;      // momentum_buffer
  T* ga = h.centered ? t.slots[k++].data<T>() : nullptr;            // grad_avg
  const A lr = A(h.lr), alpha = A(h.alpha), one_minus_alpha = A(1 - h.alpha), eps = A(h.eps);
  const A wd = A(h.weight_decay), mom = A(h.momentum);
  parallel_for(t.param.numel(), [&](int64_t i) {
    A pi = ld(p[i]);
    A gi = ld(g[i]);
    if (h.weight_decay != 0) gi += wd * pi;
    A vi = ld(sq[i]);
    A mean_sq = 0;  // the (centered) second moment under the sqrt
    if (h.tf_style) {
      vi += (gi * gi - vi) * one_minus_alpha;  // TF's ApplyRMSProp form
      mean_sq = vi;
      if (ga) {
        A gai = ld(ga[i]);
        gai += (gi - gai) * one_minus_alpha;
        ga[i] = st<T>(gai);
        mean_sq -= gai * gai;
      }
    } else {
      vi = alpha * vi + one_minus_alpha * gi * gi;
      mean_sq = vi;
      if (ga) {
        A gai = ld(ga[i]);
        gai += one_minus_alpha * (gi - gai);
        ga[i] = st<T>(gai);
        mean_sq -= gai * gai;
      }
    }
    sq[i] = st<T>(vi);
    if (h.tf_style) {
      A step = lr * gi / std::sqrt(mean_sq + eps);  // eps inside the sqrt, lr inside the buffer
      if (buf) {
        step += mom * ld(buf[i]);
        buf[i] = st<T>(step);
      }
      p[i] = st<T>(pi - step);
    } else {
      A scaled = gi / (std::sqrt(mean_sq) + eps);  // eps outside the sqrt
      if (buf) {
        scaled += mom * ld(buf[i]);
        buf[i] = st<T>(scaled);
      }
      p[i] = st<T>(pi - lr * scaled);
    }
  });
}

}  // namespace

void sgd_update(const ParamUpdate& t, const SgdStep& h) {
  ENGINE_FLOAT_SWITCH(t.param.dtype(), T, { sgd_kernel<T>(t, h); });
}

void adam_update(const ParamUpdate& t, const AdamStep& h) {
  ENGINE_FLOAT_SWITCH(t.param.dtype(), T, { adam_kernel<T>(t, h); });
}

void adamax_update(const ParamUpdate& t, const AdamaxStep& h) {
  ENGINE_FLOAT_SWITCH(t.param.dtype(), T, { adamax_kernel<T>(t, h); });
}

void rmsprop_update(const ParamUpdate& t, const RmsPropStep& h) {
  ENGINE_FLOAT_SWITCH(t.param.dtype(), T, { rmsprop_kernel<T>(t, h); });
}

namespace {
// Fixed chunks summed in a fixed order: the result does not depend on the thread count or timing (an
// OpenMP reduction clause combines partial sums in whatever order threads finish).
template <typename T>
double squared_norm(const T* px, int64_t n) {
  const int64_t chunk = 1 << 16;
  std::vector<double> partial(size_t((n + chunk - 1) / chunk), 0.0);  // host scratch
#pragma omp parallel for if (partial.size() > 1)
  for (int64_t c = 0; c < int64_t(partial.size()); c++) {
    double s = 0;
    for (int64_t i = c * chunk; i < std::min(n, (c + 1) * chunk); i++) {
      double x = double(ld(px[i]));
      s += x * x;
    }
    partial[size_t(c)] = s;
  }
  double total = 0;
  for (double s : partial) total += s;
  return total;
}
}  // namespace

void squared_norms(const std::vector<engine::Tensor>& xs, const engine::Tensor& out) {
  double* po = out.data<double>();
  for (size_t k = 0; k < xs.size(); k++)
    ENGINE_FLOAT_SWITCH(xs[k].dtype(), T, { po[k] = squared_norm(xs[k].data<T>(), xs[k].numel()); });
}

}  // namespace ops::cpu
