// cpu/loss.cpp: reference loops for the losses: one pass per row for cross-entropy (max, then exp-sum, then
// the loss), one pass over the elements for the pointwise losses.
#include "ops/cpu/loss.h"

#include <algorithm>
#include <limits>

#include "ops/cpu/cpu_util.h"
#include "ops/cpu/shape.h"

namespace ops::cpu {

void pointwise_loss(PointwiseLoss kind, const Tensor& a, const Tensor& b, const Tensor& w, double param,
                    Reduction reduction, const Tensor& out) {
  const Shape& shape = a.shape();
  const Shape w_strides = w.defined() ? broadcast_strides(w, shape) : Shape(shape.size(), 0);
  ENGINE_FLOAT_SWITCH(a.dtype(), T, {
    using A = acc_t<T>;
    const T* pa = a.data<T>();
    const T* pb = b.data<T>();
    const T* pw = w.defined() ? w.data<T>() : nullptr;
    A* po = out.data<A>();
    A total = 0;
    int64_t i = 0;
    for_each_index<3>(shape, {a.strides(), b.strides(), w_strides}, [&](const std::array<int64_t, 3>& o) {
      A term = pointwise_loss_term<A>(kind, ld(pa[o[0]]), ld(pb[o[1]]), pw ? ld(pw[o[2]]) : A(1), A(param));
      if (reduction == Reduction::none)
        po[i++] = term;
      else
        total += term;
    });
    const int64_t n = a.numel();
    if (reduction == Reduction::sum) po[0] = total;
    if (reduction == Reduction::mean) po[0] = n > 0 ? total / A(n) : A(0);
  });
}

void cross_entropy_forward(const Tensor& logits, const Tensor& target, int64_t ignore_index, double label_smoothing,
                           Reduction reduction, const Tensor& out, const Tensor& lse, const Tensor& divisor) {
  const int64_t N = logits.shape()[0], V = logits.shape()[1];
  const int64_t row_stride = logits.strides()[0], col_stride = logits.strides()[1], t_stride = target.strides()[0];
  ENGINE_INDEX_SWITCH(target.dtype(), I, {
    const I* pt = target.data<I>();
    ENGINE_FLOAT_SWITCH(logits.dtype(), T, {
      using A = acc_t<T>;
      const A eps = A(label_smoothing);
      const T* px = logits.data<T>();
      A* pl = lse.data<A>();
      A* po = out.data<A>();
      A total = 0;
      int64_t count = 0;
      for (int64_t i = 0; i < N; i++) {
        const T* row = px + i * row_stride;
        A m = -std::numeric_limits<A>::infinity();
        for (int64_t c = 0; c < V; c++) m = std::max(m, ld(row[c * col_stride]));
        A sum_exp = 0, sum_x = 0;
        for (int64_t c = 0; c < V; c++) {
          A v = ld(row[c * col_stride]);
          sum_exp += std::exp(v - m);
          sum_x += v;
        }
        const A row_lse = m + std::log(sum_exp);
        pl[i] = row_lse;
        int64_t t = int64_t(pt[i * t_stride]);
        A loss = 0;
        if (t != ignore_index) {
          t = checked_index("cross_entropy: target", t, V);
          loss = (A(1) - eps) * (row_lse - ld(row[t * col_stride]));
          // Only when smoothing: 0 * inf would turn a row with -inf logits (masked classes) into NaN.
          if (eps > A(0)) loss += eps * (row_lse - sum_x / A(V));
          count++;
        }
        if (reduction == Reduction::none) po[i] = loss;
        else total += loss;
      }
      // An all-ignored batch has loss 0 (PyTorch gives 0/0 = NaN): the divisor is at least 1.
      const A div = A(std::max<int64_t>(count, 1));
      if (reduction == Reduction::sum) po[0] = total;
      if (reduction == Reduction::mean) {
        po[0] = total / div;
        divisor.data<A>()[0] = div;
      }
    });
  });
}

void cross_entropy_backward(const Tensor& g, const Tensor& logits, const Tensor& target, const Tensor& lse,
                            const Tensor& divisor, int64_t ignore_index, double label_smoothing, Reduction reduction,
                            const Tensor& dlogits) {
  const int64_t N = logits.shape()[0], V = logits.shape()[1];
  const int64_t row_stride = logits.strides()[0], col_stride = logits.strides()[1], t_stride = target.strides()[0];
  ENGINE_INDEX_SWITCH(target.dtype(), I, {
    const I* pt = target.data<I>();
    ENGINE_FLOAT_SWITCH(logits.dtype(), T, {
      using A = acc_t<T>;
      const A eps = A(label_smoothing), smooth = eps / A(V);
      const T* px = logits.data<T>();
      const A* pg = g.data<A>();
      const A* pl = lse.data<A>();
      const int64_t g_stride = reduction == Reduction::none ? g.strides()[0] : 0;
      const A scale = reduction == Reduction::mean ? A(1) / divisor.data<A>()[0] : A(1);
      T* pd = dlogits.data<T>();
      for (int64_t i = 0; i < N; i++) {
        const T* row = px + i * row_stride;
        T* drow = pd + i * V;
        int64_t t = int64_t(pt[i * t_stride]);
        if (t == ignore_index) {
          std::fill(drow, drow + V, st<T>(A(0)));
          continue;
        }
        t = checked_index("cross_entropy_backward: target", t, V);
        const A a = pg[i * g_stride] * scale;
        for (int64_t c = 0; c < V; c++) {
          A q = smooth + (c == t ? A(1) - eps : A(0));
          drow[c] = st<T>(a * (std::exp(ld(row[c * col_stride]) - pl[i]) - q));
        }
      }
    });
  });
}

}  // namespace ops::cpu
