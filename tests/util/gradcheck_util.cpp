// gradcheck_util.cpp: finite-difference gradient checks (see gradcheck_util.h).
#include "tests/util/gradcheck_util.h"

#include <gtest/gtest.h>

#include <cmath>

#include "graph/autograd.h"
#include "ops/elementwise.h"
#include "ops/factory.h"
#include "ops/reduce.h"

namespace testutil {

Tensor rand_input(const engine::Shape& shape, double low, double high, bool requires_grad) {
  Tensor t = ops::rand(shape, low, high, engine::DType::f64);
  t.set_requires_grad(requires_grad);
  return t;
}

namespace {

// L(x) = sum(f(x) * w)
Tensor weighted_sum(const Fn& f, const std::vector<Tensor>& inputs, Tensor& w) {
  Tensor y = f(inputs);
  if (!w.defined()) {
    w = ops::rand(y.shape(), 0.5, 1.5, y.dtype(), y.device_ptr());
  }
  return ops::sum(ops::mul(y, w));
}

double check(const char* what, const std::vector<Tensor>& inputs, const std::vector<Tensor>& analytic,
             const std::function<double()>& loss, double eps, double atol, double rtol) {
  double worst = 0;
  for (size_t k = 0; k < inputs.size(); k++) {
    const Tensor& x = inputs[k];
    if (!x.requires_grad()) continue;
    std::vector<double> a = analytic[k].defined() ? analytic[k].to_double() : std::vector<double>(x.numel(), 0.0);
    double* p = x.data<double>();
    for (int64_t i = 0; i < x.numel(); i++) {
      // x must be contiguous for this indexing.
      double saved = p[i];
      p[i] = saved + eps;
      double lp = loss();
      p[i] = saved - eps;
      double lm = loss();
      p[i] = saved;
      double numeric = (lp - lm) / (2 * eps);
      double err = std::fabs(a[i] - numeric) / (atol + rtol * std::fabs(numeric));
      worst = std::max(worst, err);
      if (err > 1) {
        ADD_FAILURE() << what << ": input " << k << " element " << i << ": analytic " << a[i] << " vs numeric "
                      << numeric;
        return err;
      }
    }
  }
  return worst;
}

}  // namespace

double expect_gradcheck(const Fn& f, const std::vector<Tensor>& inputs, double eps, double atol, double rtol) {
  Tensor w;
  std::vector<Tensor> grad_inputs;
  for (const Tensor& x : inputs)
    if (x.requires_grad()) grad_inputs.push_back(x);
  Tensor L = weighted_sum(f, inputs, w);
  std::vector<Tensor> g = graph::grad({L}, grad_inputs);
  std::vector<Tensor> analytic;
  for (size_t k = 0, j = 0; k < inputs.size(); k++) analytic.push_back(inputs[k].requires_grad() ? g[j++] : Tensor());
  auto loss = [&] {
    graph::NoGrad ng;
    return weighted_sum(f, inputs, w).item();
  };
  return check("gradcheck", inputs, analytic, loss, eps, atol, rtol);
}

double expect_double_backward(const Fn& f, const std::vector<Tensor>& inputs, double eps, double atol, double rtol) {
  Tensor w;
  std::vector<Tensor> gi;
  for (const Tensor& x : inputs)
    if (x.requires_grad()) gi.push_back(x);
  std::vector<Tensor> v;  // random weights of the first gradients
  // L2(x) = sum_k sum(dL/dx_k * v_k)
  auto second = [&](bool create_graph) {
    Tensor L = weighted_sum(f, inputs, w);
    std::vector<Tensor> g = graph::grad({L}, gi, {}, create_graph);
    if (v.empty())
      for (const Tensor& t : gi) v.push_back(ops::rand(t.shape(), 0.5, 1.5, t.dtype()));
    Tensor L2;
    for (size_t k = 0; k < g.size(); k++) {
      if (!g[k].defined()) continue;
      Tensor term = ops::sum(ops::mul(g[k], v[k]));
      L2 = L2.defined() ? ops::add(L2, term) : term;
    }
    return L2;
  };
  Tensor L2 = second(true);
  EXPECT_TRUE(L2.defined()) << "double backward: no first gradient";
  if (!L2.defined()) return 1e9;
  // When the first gradient does not depend on x (f linear in x), it has no graph and the analytic
  // second derivative is zero: the finite differences below must then agree with zero.
  std::vector<Tensor> g2 = L2.requires_grad() ? graph::grad({L2}, gi) : std::vector<Tensor>(gi.size());
  std::vector<Tensor> analytic;
  for (size_t k = 0, j = 0; k < inputs.size(); k++) analytic.push_back(inputs[k].requires_grad() ? g2[j++] : Tensor());
  auto loss = [&] { return second(false).item(); };
  return check("double backward", inputs, analytic, loss, eps, atol, rtol);
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  std::vector<double> x = a.to_double(), y = b.to_double();
  double m = 0;
  for (size_t i = 0; i < x.size() && i < y.size(); i++) m = std::max(m, std::fabs(x[i] - y[i]));
  return m;
}

}  // namespace testutil
