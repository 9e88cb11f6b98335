// cpu/shape.cpp: reference loops for concat, gather / scatter-add, masked_fill and where. They move
// elements (no arithmetic except the scatter-add's sums), so every dtype goes through except in scatter_add,
// which is a gradient and therefore floating.
#include "ops/cpu/shape.h"

#include "ops/cpu/cpu_util.h"
#include "ops/cpu/elementwise.h"

namespace ops::cpu {

void concat(const std::vector<Tensor>& xs, int64_t dim, const Tensor& out) {
  // Each input is copied into its window of out: a view with out's strides, starting `start` along dim.
  int64_t start = 0;
  for (const Tensor& x : xs) {
    Tensor window = Tensor::view_of(out, x.shape(), out.strides(), out.offset() + start * out.strides()[dim]);
    copy(x, window);
    start += x.shape()[dim];
  }
}

void gather(const char* op, const Tensor& x, int64_t dim, const Tensor& index, const Tensor& out) {
  // Walk out's positions; x's offset comes from its strides with dim left out, plus index * stride[dim].
  Shape x_strides = x.strides();
  const int64_t step = x_strides[dim], n = x.shape()[dim];
  x_strides[dim] = 0;
  ENGINE_INDEX_SWITCH(index.dtype(), I, {
    const I* pi = index.data<I>();
    ENGINE_ALL_SWITCH(x.dtype(), T, {
      const T* px = static_cast<const T*>(x.data_ptr());
      T* po = static_cast<T*>(out.data_ptr());
      int64_t i = 0;
      for_each_index<2>(out.shape(), {x_strides, index.strides()}, [&](const std::array<int64_t, 2>& o) {
        po[i++] = px[o[0] + checked_index(op, int64_t(pi[o[1]]), n) * step];
      });
    });
  });
}

void scatter_add(const char* op, const Tensor& g, int64_t dim, const Tensor& index, int64_t skip,
                 const Tensor& out) {
  Shape out_strides = engine::contiguous_strides(out.shape());
  const int64_t step = out_strides[dim], n = out.shape()[dim];
  out_strides[dim] = 0;
  ENGINE_INDEX_SWITCH(index.dtype(), I, {
    const I* pi = index.data<I>();
    ENGINE_FLOAT_SWITCH(out.dtype(), T, {
      using A = acc_t<T>;
      // Host scratch in acc_t: bf16/f16 gradients are summed in float and rounded once.
      std::vector<A> acc(size_t(out.numel()), A(0));
      const T* pg = g.data<T>();
      for_each_index<3>(g.shape(), {g.strides(), index.strides(), out_strides},
                        [&](const std::array<int64_t, 3>& o) {
                          int64_t k = int64_t(pi[o[1]]);
                          if (k == skip) return;
                          acc[size_t(o[2] + checked_index(op, k, n) * step)] += ld(pg[o[0]]);
                        });
      T* po = out.data<T>();
      for (size_t i = 0; i < acc.size(); i++) po[i] = st<T>(acc[i]);
    });
  });
}

void masked_fill(const Tensor& x, const Tensor& mask, double value, const Tensor& out) {
  const uint8_t* pm = static_cast<const uint8_t*>(mask.data_ptr());
  ENGINE_ALL_SWITCH(x.dtype(), T, {
    const T v = static_cast<T>(static_cast<acc_t<T>>(value));
    const T* px = static_cast<const T*>(x.data_ptr());
    T* po = static_cast<T*>(out.data_ptr());
    int64_t i = 0;
    for_each_index<2>(out.shape(), {x.strides(), broadcast_strides(mask, out.shape())},
                      [&](const std::array<int64_t, 2>& o) { po[i++] = pm[o[1]] ? v : px[o[0]]; });
  });
}

void where(const Tensor& cond, const Tensor& a, const Tensor& b, const Tensor& out) {
  const uint8_t* pc = static_cast<const uint8_t*>(cond.data_ptr());
  ENGINE_ALL_SWITCH(a.dtype(), T, {
    const T* pa = static_cast<const T*>(a.data_ptr());
    const T* pb = static_cast<const T*>(b.data_ptr());
    T* po = static_cast<T*>(out.data_ptr());
    int64_t i = 0;
    for_each_index<3>(out.shape(),
                      {broadcast_strides(cond, out.shape()), broadcast_strides(a, out.shape()),
                       broadcast_strides(b, out.shape())},
                      [&](const std::array<int64_t, 3>& o) { po[i++] = pc[o[0]] ? pa[o[1]] : pb[o[2]]; });
  });
}

}  // namespace ops::cpu
