// cpu/reduce.cpp: reductions as plain loops. Each output element accumulates its inputs in index order
// in acc_t<T>, so results are deterministic.
#include "ops/cpu/reduce.h"

#include "ops/cpu/cpu_util.h"

namespace ops::cpu {

void sum(const Tensor& x, const std::vector<bool>& reduced, double scale, const Tensor& out) {
  // Iterate over x; map each element to its output position via out strides that are 0 on reduced dims.
  Shape out_strides = engine::contiguous_strides(out.shape());
  ENGINE_FLOAT_SWITCH(x.dtype(), T, {
    using A = acc_t<T>;
    std::vector<A> acc(size_t(out.numel()), A(0));
    const T* px = x.data<T>();
    Shape ost(x.dim());
    for (int64_t d = 0; d < x.dim(); d++) ost[d] = reduced[d] ? 0 : out_strides[d];
    for_each_index<2>(x.shape(), {x.strides(), ost},
                      [&](const std::array<int64_t, 2>& o) { acc[o[1]] += ld(px[o[0]]); });
    T* po = out.data<T>();
    for (size_t i = 0; i < acc.size(); i++) po[i] = st<T>(acc[i] * A(scale));
  });
}

void amax(const Tensor& x, int64_t dim, const Tensor& values, const Tensor& indices) {
  ENGINE_FLOAT_SWITCH(x.dtype(), T, {
    using A = acc_t<T>;
    const T* px = x.data<T>();
    T* pv = values.data<T>();
    int64_t* pi = indices.data<int64_t>();
    Shape outer = x.shape();
    outer[dim] = 1;
    int64_t n = x.shape()[dim], stride = x.strides()[dim];
    int64_t i = 0;
    for_each_index<1>(outer, {x.strides()}, [&](const std::array<int64_t, 1>& o) {
      A best = ld(px[o[0]]);
      int64_t arg = 0;
      for (int64_t k = 1; k < n; k++) {
        A v = ld(px[o[0] + k * stride]);
        if (v > best || (v != v && best == best)) { best = v; arg = k; }  // NaN wins, as in PyTorch
      }
      pv[i] = st<T>(best);
      pi[i] = arg;
      i++;
    });
  });
}

}  // namespace ops::cpu
