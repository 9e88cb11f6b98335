// cpu/softmax.cpp: softmax rows as plain loops. A "row" is the line of elements along `dim`; rows are
// visited with for_each_index over the shape with `dim` collapsed to 1, and each row is walked with the
// tensor's stride along dim, so no input needs to be contiguous. Math in acc_t<T>.
#include "ops/cpu/softmax.h"

#include <cmath>
#include <limits>

#include "ops/cpu/cpu_util.h"

namespace ops::cpu {

void softmax_forward(const Tensor& x, int64_t dim, bool log, const Tensor& y) {
  Shape rows = x.shape();
  rows[dim] = 1;
  const int64_t n = x.shape()[dim], sx = x.strides()[dim], sy = y.strides()[dim];
  ENGINE_FLOAT_SWITCH(x.dtype(), T, {
    using A = acc_t<T>;
    const T* px = x.data<T>();
    T* py = y.data<T>();
    for_each_index<2>(rows, {x.strides(), y.strides()}, [&](const std::array<int64_t, 2>& o) {
      const T* xr = px + o[0];
      T* yr = py + o[1];
      A max = -std::numeric_limits<A>::infinity();
      for (int64_t k = 0; k < n; k++) max = std::max(max, ld(xr[k * sx]));
      A sum = 0;
      for (int64_t k = 0; k < n; k++) sum += std::exp(ld(xr[k * sx]) - max);
      if (log) {
        A log_sum = std::log(sum);  // (x - max) - log_sum: no rounding at the scale of max
        for (int64_t k = 0; k < n; k++) yr[k * sy] = st<T>((ld(xr[k * sx]) - max) - log_sum);
      } else {
        A inv_sum = A(1) / sum;
        for (int64_t k = 0; k < n; k++) yr[k * sy] = st<T>(std::exp(ld(xr[k * sx]) - max) * inv_sum);
      }
    });
  });
}

void softmax_backward(const Tensor& g, const Tensor& y, int64_t dim, bool log, const Tensor& out) {
  Shape rows = out.shape();
  rows[dim] = 1;
  const int64_t n = out.shape()[dim], sg = g.strides()[dim], sy = y.strides()[dim], so = out.strides()[dim];
  ENGINE_FLOAT_SWITCH(out.dtype(), T, {
    using A = acc_t<T>;
    const T* pg = g.data<T>();
    const T* py = y.data<T>();
    T* po = out.data<T>();
    for_each_index<3>(rows, {g.strides(), y.strides(), out.strides()}, [&](const std::array<int64_t, 3>& o) {
      const T* gr = pg + o[0];
      const T* yr = py + o[1];
      T* outr = po + o[2];
      A dot = 0;  // softmax: sum(g * y); log_softmax: sum(g)
      for (int64_t k = 0; k < n; k++) dot += log ? ld(gr[k * sg]) : ld(gr[k * sg]) * ld(yr[k * sy]);
      for (int64_t k = 0; k < n; k++) {
        A gk = ld(gr[k * sg]), yk = ld(yr[k * sy]);
        outr[k * so] = st<T>(log ? gk - std::exp(yk) * dot : yk * (gk - dot));
      }
    });
  });
}

}  // namespace ops::cpu
