// cpu/norm.cpp: layer norm rows as plain loops. Rows (the last dimension) are visited with for_each_index
// over the shape with the last dimension collapsed, then walked with its stride, so inputs may be views.
// Statistics are computed in acc_t<T> with two passes (mean, then sum of squared deviations), which loses
// nothing to cancellation. dweight and dbias are summed over rows in row order in a host accumulator
// (deterministic).
#include "ops/cpu/norm.h"

#include <cmath>

#include "ops/cpu/cpu_util.h"

namespace ops::cpu {

namespace {

// weight or bias as a row of acc_t<T> values (`fill` when undefined), read once per call.
template <typename T>
std::vector<acc_t<T>> load_row(const Tensor& t, int64_t C, acc_t<T> fill) {
  std::vector<acc_t<T>> row(size_t(C), fill);
  if (!t.defined()) return row;
  const T* p = t.data<T>();
  for (int64_t c = 0; c < C; c++) row[size_t(c)] = ld(p[c * t.strides()[0]]);
  return row;
}

Shape rows_shape(const Shape& s) {
  Shape r = s;
  r.back() = 1;
  return r;
}

}  // namespace

void layer_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps, const Tensor& y,
                        const Tensor& mean, const Tensor& rstd) {
  const int64_t C = x.size(-1), sx = x.strides().back(), sy = y.strides().back();
  ENGINE_FLOAT_SWITCH(x.dtype(), T, {
    using A = acc_t<T>;
    const T* px = x.data<T>();
    T* py = y.data<T>();
    A* pmean = mean.data<A>();  // [rows]
    A* prstd = rstd.data<A>();  // [rows]
    std::vector<A> w = load_row<T>(weight, C, A(1)), b = load_row<T>(bias, C, A(0));
    int64_t row = 0;
    for_each_index<2>(rows_shape(x.shape()), {x.strides(), y.strides()}, [&](const std::array<int64_t, 2>& o) {
      const T* xr = px + o[0];
      T* yr = py + o[1];
      A sum = 0;
      for (int64_t c = 0; c < C; c++) sum += ld(xr[c * sx]);
      A mu = sum / A(C);
      A sq = 0;
      for (int64_t c = 0; c < C; c++) {
        A d = ld(xr[c * sx]) - mu;
        sq += d * d;
      }
      A r = A(1) / std::sqrt(sq / A(C) + A(eps));
      for (int64_t c = 0; c < C; c++) yr[c * sy] = st<T>((ld(xr[c * sx]) - mu) * r * w[size_t(c)] + b[size_t(c)]);
      pmean[row] = mu;
      prstd[row] = r;
      row++;
    });
  });
}

void layer_norm_backward(const Tensor& g, const Tensor& x, const Tensor& weight, const Tensor& mean,
                         const Tensor& rstd, const Tensor& dx, const Tensor& dweight, const Tensor& dbias) {
  const int64_t C = x.size(-1), sg = g.strides().back(), sx = x.strides().back();
  const int64_t sdx = dx.defined() ? dx.strides().back() : 0;
  Shape dx_strides = dx.defined() ? dx.strides() : Shape(size_t(x.dim()), 0);
  ENGINE_FLOAT_SWITCH(x.dtype(), T, {
    using A = acc_t<T>;
    const T* pg = g.data<T>();
    const T* px = x.data<T>();
    T* pdx = dx.defined() ? dx.data<T>() : nullptr;
    const A* pmean = mean.data<A>();
    const A* prstd = rstd.data<A>();
    std::vector<A> w = load_row<T>(weight, C, A(1));
    std::vector<A> dw(size_t(C), A(0)), db(size_t(C), A(0));  // sums over rows
    int64_t row = 0;
    for_each_index<3>(rows_shape(x.shape()), {g.strides(), x.strides(), dx_strides},
                      [&](const std::array<int64_t, 3>& o) {
      const T* gr = pg + o[0];
      const T* xr = px + o[1];
      const A mu = pmean[row], r = prstd[row];
      row++;
      A mean_a = 0, mean_a_xhat = 0;  // a = g * weight = dL/dxhat
      for (int64_t c = 0; c < C; c++) {
        A gc = ld(gr[c * sg]), xhat = (ld(xr[c * sx]) - mu) * r;
        A a = gc * w[size_t(c)];
        mean_a += a;
        mean_a_xhat += a * xhat;
        dw[size_t(c)] += gc * xhat;
        db[size_t(c)] += gc;
      }
      mean_a /= A(C);
      mean_a_xhat /= A(C);
      if (!pdx) return;
      T* dxr = pdx + o[2];
      for (int64_t c = 0; c < C; c++) {
        A xhat = (ld(xr[c * sx]) - mu) * r;
        A a = ld(gr[c * sg]) * w[size_t(c)];
        dxr[c * sdx] = st<T>(r * (a - mean_a - xhat * mean_a_xhat));
      }
    });
    if (dweight.defined()) {
      T* p = dweight.data<T>();
      for (int64_t c = 0; c < C; c++) p[c * dweight.strides()[0]] = st<T>(dw[size_t(c)]);
    }
    if (dbias.defined()) {
      T* p = dbias.data<T>();
      for (int64_t c = 0; c < C; c++) p[c * dbias.strides()[0]] = st<T>(db[size_t(c)]);
    }
  });
}

// ---------------------------------------------------------------------------------------------------
// Weight normalization

namespace {

struct ChannelView {
  int64_t outer, n, inner;
};

ChannelView channel_view(const Tensor& v, int64_t dim) {
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < dim; d++) outer *= v.size(d);
  for (int64_t d = dim + 1; d < v.dim(); d++) inner *= v.size(d);
  return {outer, v.size(dim), inner};
}

// Per channel j, the sum over (o, i) of a * b at [o, j, i], in (o, i) order.
template <typename T>
std::vector<acc_t<T>> channel_dots(const T* a, const T* b, const ChannelView& c) {
  std::vector<acc_t<T>> sums(size_t(c.n), acc_t<T>(0));
  for (int64_t o = 0; o < c.outer; o++)
    for (int64_t j = 0; j < c.n; j++)
      for (int64_t i = 0; i < c.inner; i++) {
        const int64_t e = (o * c.n + j) * c.inner + i;
        sums[size_t(j)] += ld(a[e]) * ld(b[e]);
      }
  return sums;
}

}  // namespace

void weight_norm_forward(const Tensor& v, const Tensor& g, int64_t dim, const Tensor& w, const Tensor& norm_sq) {
  const ChannelView c = channel_view(v, dim);
  ENGINE_FLOAT_SWITCH(v.dtype(), T, {
    using A = acc_t<T>;
    const T* pv = v.data<T>();
    const T* pg = g.data<T>();
    T* pw = w.data<T>();
    std::vector<A> sq = channel_dots(pv, pv, c);
    std::vector<A> factor(size_t(c.n));
    for (int64_t j = 0; j < c.n; j++) {
      norm_sq.data<A>()[j] = sq[size_t(j)];
      factor[size_t(j)] = ld(pg[j]) / std::sqrt(sq[size_t(j)]);
    }
    for (int64_t o = 0; o < c.outer; o++)
      for (int64_t j = 0; j < c.n; j++)
        for (int64_t i = 0; i < c.inner; i++) {
          const int64_t e = (o * c.n + j) * c.inner + i;
          pw[e] = st<T>(ld(pv[e]) * factor[size_t(j)]);
        }
  });
}

void weight_norm_backward(const Tensor& dw, const Tensor& v, const Tensor& g, const Tensor& norm_sq, int64_t dim,
                          const Tensor& dv, const Tensor& dg) {
  const ChannelView c = channel_view(v, dim);
  ENGINE_FLOAT_SWITCH(v.dtype(), T, {
    using A = acc_t<T>;
    const T* pv = v.data<T>();
    const T* pdw = dw.data<T>();
    const T* pg = g.data<T>();
    const A* psq = norm_sq.data<A>();
    std::vector<A> s = channel_dots(pdw, pv, c);
    std::vector<A> a(size_t(c.n)), b(size_t(c.n));  // dv = a dw + b v
    for (int64_t j = 0; j < c.n; j++) {
      const A r = std::sqrt(psq[j]);
      a[size_t(j)] = ld(pg[j]) / r;
      b[size_t(j)] = -a[size_t(j)] * s[size_t(j)] / psq[j];
      if (dg.defined()) dg.data<T>()[j] = st<T>(s[size_t(j)] / r);
    }
    if (dv.defined()) {
      T* pdv = dv.data<T>();
      for (int64_t o = 0; o < c.outer; o++)
        for (int64_t j = 0; j < c.n; j++)
          for (int64_t i = 0; i < c.inner; i++) {
            const int64_t e = (o * c.n + j) * c.inner + i;
            pdv[e] = st<T>(a[size_t(j)] * ld(pdw[e]) + b[size_t(j)] * ld(pv[e]));
          }
    }
  });
}

}  // namespace ops::cpu
