// cpu/optim.cpp: reference loops of the optimizer updates (formulas in ops/optim.h).
//
// Each kernel is one pass over the parameter: load p, g and the slots, update in acc_t<T>, store. The
// order of operations follows PyTorch's single-tensor implementation (lerp for first moments, mul then
// addcmul for second moments) so that f32 results agree with it to the last bit or two.
// Each kernel is a template over T, the type of the weight it updates and of the slots, and G, the type of
// the gradient: T = G without a master copy; T = f32 and G = bf16/f16 with one (mixed precision), the
// weight then also being stored, rounded, into the bf16/f16 parameter (Weights::low).
#include "ops/cpu/optim.h"

#include <algorithm>
#include <cmath>

#include "ops/cpu/cpu_util.h"

namespace ops::cpu {

namespace {

// The weight (the master copy when there is one), the gradient, and the low-precision copy to refresh.
template <typename T, typename G>
struct Weights {
  T* p;
  const G* g;
  G* low;  // the bf16/f16 parameter under a master copy, else nullptr
  acc_t<T> grad_scale;
  explicit Weights(const ParamUpdate& t)
      : p((t.master.defined() ? t.master : t.param).template data<T>()),
        g(t.grad.data<G>()),
        low(t.master.defined() ? t.param.data<G>() : nullptr),
        grad_scale(acc_t<T>(t.scale_by.defined() ? t.scale_by.data<double>()[0] : t.grad_scale)) {}
  acc_t<T> grad(int64_t i) const { return acc_t<T>(ld(g[i])) * grad_scale; }  // x * 1 is exact
  void store(int64_t i, acc_t<T> v) const {
    p[i] = st<T>(v);
    if (low) low[i] = st<G>(v);
  }
};

// Calls kernel<T, G>: T = G = the parameter's dtype, or T = f32 and G = the parameter's dtype under a master.
#define OPTIM_SWITCH(t, kernel, ...)                                                             \
  do {                                                                                           \
    if ((t).master.defined()) {                                                                  \
      ENGINE_FLOAT_SWITCH((t).param.dtype(), G, { kernel<float, G>(__VA_ARGS__); });            \
    } else {                                                                                     \
      ENGINE_FLOAT_SWITCH((t).param.dtype(), T, { kernel<T, T>(__VA_ARGS__); });                \
    }                                                                                            \
  } while (0)

template <typename T, typename G>
void sgd_kernel(const ParamUpdate& t, const SgdStep& h) {
  using A = acc_t<T>;
  const Weights<T, G> w(t);
  T* buf = h.momentum != 0 ? t.slots[0].data<T>() : nullptr;
  const A lr = A(h.lr), wd = A(h.weight_decay), mom = A(h.momentum), keep = A(1 - h.dampening);
  parallel_for(t.param.numel(), [&](int64_t i) {
    A pi = ld(w.p[i]);
    A d = w.grad(i);
    if (h.weight_decay != 0) d += wd * pi;
    if (buf) {
      A b = h.first_step ? d : mom * ld(buf[i]) + keep * d;
      buf[i] = st<T>(b);
      d = h.nesterov ? d + mom * b : b;
    }
    w.store(i, pi - lr * d);
  });
}

template <typename T, typename G>
void adam_kernel(const ParamUpdate& t, const AdamStep& h) {
  using A = acc_t<T>;
  const Weights<T, G> w(t);
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
    A pi = ld(w.p[i]);
    A gi = w.grad(i);
    if (l2) gi += wd * pi;
    if (decoupled) pi *= decay;
    A mi = ld(m[i]);
    mi += one_minus_b1 * (gi - mi);
    A vi = b2 * ld(v[i]) + one_minus_b2 * gi * gi;
    m[i] = st<T>(mi);
    v[i] = st<T>(vi);
    w.store(i, pi - step_size * mi / (std::sqrt(vi) / bc2_sqrt + eps));
  });
}

template <typename T, typename G>
void adamax_kernel(const ParamUpdate& t, const AdamaxStep& h) {
  using A = acc_t<T>;
  const Weights<T, G> w(t);
  T* m = t.slots[0].data<T>();  // exp_avg
  T* u = t.slots[1].data<T>();  // exp_inf
  const A clr = A(h.lr / (1 - std::pow(h.beta1, double(h.step))));
  const A one_minus_b1 = A(1 - h.beta1), b2 = A(h.beta2), eps = A(h.eps), wd = A(h.weight_decay);
  parallel_for(t.param.numel(), [&](int64_t i) {
    A pi = ld(w.p[i]);
    A gi = w.grad(i);
    if (h.weight_decay != 0) gi += wd * pi;
    A mi = ld(m[i]);
    mi += one_minus_b1 * (gi - mi);
    A ui = std::max(b2 * ld(u[i]), std::abs(gi) + eps);
    m[i] = st<T>(mi);
    u[i] = st<T>(ui);
    w.store(i, pi - clr * mi / ui);
  });
}

template <typename T, typename G>
void rmsprop_kernel(const ParamUpdate& t, const RmsPropStep& h) {
  using A = acc_t<T>;
  const Weights<T, G> w(t);
  size_t k = 0;
  T* sq = t.slots[k++].data<T>();                                    // square_avg
  T* buf = h.momentum != 0 ? t.slots[k++].data<T>() : nullptr;      // momentum_buffer
  T* ga = h.centered ? t.slots[k++].data<T>() : nullptr;            // grad_avg
  const A lr = A(h.lr), alpha = A(h.alpha), one_minus_alpha = A(1 - h.alpha), eps = A(h.eps);
  const A wd = A(h.weight_decay), mom = A(h.momentum);
  parallel_for(t.param.numel(), [&](int64_t i) {
    A pi = ld(w.p[i]);
    A gi = w.grad(i);
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
      w.store(i, pi - step);
    } else {
      A scaled = gi / (std::sqrt(mean_sq) + eps);  // eps outside the sqrt
      if (buf) {
        scaled += mom * ld(buf[i]);
        buf[i] = st<T>(scaled);
      }
      w.store(i, pi - lr * scaled);
    }
  });
}

}  // namespace

void sgd_update(const ParamUpdate& t, const SgdStep& h) {
  OPTIM_SWITCH(t, sgd_kernel, t, h);
}

void adam_update(const ParamUpdate& t, const AdamStep& h) {
  OPTIM_SWITCH(t, adam_kernel, t, h);
}

void adamax_update(const ParamUpdate& t, const AdamaxStep& h) {
  OPTIM_SWITCH(t, adamax_kernel, t, h);
}

void rmsprop_update(const ParamUpdate& t, const RmsPropStep& h) {
  OPTIM_SWITCH(t, rmsprop_kernel, t, h);
}

namespace {
// Fixed chunks summed in a fixed order: the result does not depend on the thread count or timing (an
// OpenMP reduction clause combines partial sums in whatever order threads finish).
template <typename T>
double squared_norm(const T* px, int64_t n) {
  const int64_t chunk = kNormChunk;
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

void clip_coefficient(const engine::Tensor& sums, double max_norm) {
  double* s = sums.data<double>();
  s[0] = clip_coefficient_of(s, sums.numel(), max_norm);
}

}  // namespace ops::cpu
