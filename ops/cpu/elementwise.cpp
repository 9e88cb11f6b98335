// cpu/elementwise.cpp: reference loops for the elementwise family (math in elementwise_math.h).
#include "ops/cpu/elementwise.h"

#include <algorithm>

#include "ops/cpu/cpu_util.h"

namespace ops::cpu {

Shape broadcast_strides(const Tensor& t, const Shape& shape) {
  Shape st(shape.size(), 0);
  int64_t lead = int64_t(shape.size()) - t.dim();
  for (int64_t i = 0; i < t.dim(); i++)
    st[lead + i] = t.shape()[i] == 1 ? 0 : t.strides()[i];
  return st;
}

void binary(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  ENGINE_FLOAT_SWITCH(out.dtype(), T, {
    const T* pa = a.data<T>();
    const T* pb = b.data<T>();
    T* po = out.data<T>();
    if (a.shape() == out.shape() && b.shape() == out.shape() && a.is_contiguous() && b.is_contiguous()) {
      int64_t n = out.numel();
      parallel_for(n, [&](int64_t i) { po[i] = st<T>(binary_f(op, ld(pa[i]), ld(pb[i]))); });
    } else {
      int64_t i = 0;
      for_each_index<2>(out.shape(), {broadcast_strides(a, out.shape()), broadcast_strides(b, out.shape())},
                        [&](const std::array<int64_t, 2>& o) {
                          po[i++] = st<T>(binary_f(op, ld(pa[o[0]]), ld(pb[o[1]])));
                        });
    }
  });
}

void unary(UnaryOp op, double alpha, double beta, const Tensor& x, const Tensor& out) {
  ENGINE_FLOAT_SWITCH(out.dtype(), T, {
    using A = acc_t<T>;
    const T* px = x.data<T>();
    T* po = out.data<T>();
    if (x.is_contiguous()) {
      int64_t n = out.numel();
      parallel_for(n, [&](int64_t i) { po[i] = st<T>(unary_f<A>(op, ld(px[i]), A(alpha), A(beta))); });
    } else {
      int64_t i = 0;
      for_each_index<1>(out.shape(), {x.strides()}, [&](const std::array<int64_t, 1>& o) {
        po[i++] = st<T>(unary_f<A>(op, ld(px[o[0]]), A(alpha), A(beta)));
      });
    }
  });
}

void unary_backward(UnaryOp op, double alpha, double beta, const Tensor& g, const Tensor& s,
                    const Tensor& out) {
  ENGINE_FLOAT_SWITCH(out.dtype(), T, {
    using A = acc_t<T>;
    const T* pg = g.data<T>();
    const T* ps = s.data<T>();
    T* po = out.data<T>();
    int64_t i = 0;
    for_each_index<2>(out.shape(), {broadcast_strides(g, out.shape()), broadcast_strides(s, out.shape())},
                      [&](const std::array<int64_t, 2>& o) {
                        po[i++] = st<T>(ld(pg[o[0]]) * unary_df<A>(op, ld(ps[o[1]]), A(alpha), A(beta)));
                      });
  });
}

void unary_d2(UnaryOp op, double alpha, double beta, const Tensor& s, const Tensor& out) {
  ENGINE_FLOAT_SWITCH(out.dtype(), T, {
    using A = acc_t<T>;
    const T* ps = s.data<T>();
    T* po = out.data<T>();
    int64_t i = 0;
    for_each_index<1>(out.shape(), {s.strides()}, [&](const std::array<int64_t, 1>& o) {
      po[i++] = st<T>(unary_d2f<A>(op, ld(ps[o[0]]), A(alpha), A(beta)));
    });
  });
}

void compare(CompareOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  uint8_t* po = static_cast<uint8_t*>(out.data_ptr());
  ENGINE_ALL_SWITCH(a.dtype(), T, {
    const T* pa = static_cast<const T*>(a.data_ptr());
    const T* pb = static_cast<const T*>(b.data_ptr());
    int64_t i = 0;
    for_each_index<2>(out.shape(), {broadcast_strides(a, out.shape()), broadcast_strides(b, out.shape())},
                      [&](const std::array<int64_t, 2>& o) {
                        po[i++] = compare_f<double>(op, double(ld(pa[o[0]])), double(ld(pb[o[1]])));
                      });
  });
}

void compare_scalar(CompareOp op, const Tensor& a, double c, const Tensor& out) {
  uint8_t* po = static_cast<uint8_t*>(out.data_ptr());
  ENGINE_ALL_SWITCH(a.dtype(), T, {
    const T* pa = static_cast<const T*>(a.data_ptr());
    int64_t i = 0;
    for_each_index<1>(out.shape(), {a.strides()}, [&](const std::array<int64_t, 1>& o) {
      po[i++] = compare_f<double>(op, double(ld(pa[o[0]])), c);
    });
  });
}

namespace {
template <typename S>
void copy_from(const S* ps, const Tensor& src, const Tensor& dst) {
  ENGINE_ALL_SWITCH(dst.dtype(), D, {
    D* pd = static_cast<D*>(dst.data_ptr());
    if (src.is_contiguous() && dst.is_contiguous() && src.shape() == dst.shape()) {
      int64_t n = dst.numel();
      for (int64_t i = 0; i < n; i++) pd[i] = static_cast<D>(ld(ps[i]));
    } else {
      for_each_index<2>(dst.shape(), {broadcast_strides(src, dst.shape()), dst.strides()},
                        [&](const std::array<int64_t, 2>& o) { pd[o[1]] = static_cast<D>(ld(ps[o[0]])); });
    }
  });
}
}  // namespace

void copy(const Tensor& src, const Tensor& dst) {
  if (src.dtype() == dst.dtype()) {  // same type: move the elements as they are (no rounding of i64)
    ENGINE_ALL_SWITCH(src.dtype(), T, {
      const T* ps = static_cast<const T*>(src.data_ptr());
      T* pd = static_cast<T*>(dst.data_ptr());
      if (src.is_contiguous() && dst.is_contiguous() && src.shape() == dst.shape()) {
        std::copy(ps, ps + dst.numel(), pd);
      } else {
        for_each_index<2>(dst.shape(), {broadcast_strides(src, dst.shape()), dst.strides()},
                          [&](const std::array<int64_t, 2>& o) { pd[o[1]] = ps[o[0]]; });
      }
    });
    return;
  }
  ENGINE_ALL_SWITCH(src.dtype(), S, { copy_from(static_cast<const S*>(src.data_ptr()), src, dst); });
}

void fill(const Tensor& dst, double value) {
  ENGINE_ALL_SWITCH(dst.dtype(), T, {
    T* p = static_cast<T*>(dst.data_ptr());
    T v = static_cast<T>(static_cast<acc_t<T>>(value));
    if (dst.is_contiguous()) {
      int64_t n = dst.numel();
      for (int64_t i = 0; i < n; i++) p[i] = v;
    } else {
      for_each_index<1>(dst.shape(), {dst.strides()}, [&](const std::array<int64_t, 1>& o) { p[o[0]] = v; });
    }
  });
}

void add_inplace(const Tensor& a, const Tensor& b, double alpha) {
  ENGINE_FLOAT_SWITCH(a.dtype(), T, {
    using A = acc_t<T>;
    T* pa = a.data<T>();
    const T* pb = b.data<T>();
    if (a.shape() == b.shape() && a.is_contiguous() && b.is_contiguous()) {
      int64_t n = a.numel();
      parallel_for(n, [&](int64_t i) { pa[i] = st<T>(ld(pa[i]) + A(alpha) * ld(pb[i])); });
    } else {
      for_each_index<2>(a.shape(), {a.strides(), broadcast_strides(b, a.shape())},
                        [&](const std::array<int64_t, 2>& o) {
                          pa[o[0]] = st<T>(ld(pa[o[0]]) + A(alpha) * ld(pb[o[1]]));
                        });
    }
  });
}

void scale_inplace(const Tensor& a, double c) {
  ENGINE_FLOAT_SWITCH(a.dtype(), T, {
    using A = acc_t<T>;
    T* pa = a.data<T>();
    for_each_index<1>(a.shape(), {a.strides()},
                      [&](const std::array<int64_t, 1>& o) { pa[o[0]] = st<T>(ld(pa[o[0]]) * A(c)); });
  });
}

}  // namespace ops::cpu
