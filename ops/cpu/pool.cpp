// cpu/pool.cpp: pooling as plain loops over contiguous NHWC tensors. Each output (forward) or input
// (backward) pixel keeps one accumulator per channel and visits its window taps in row-major order, channels
// innermost, so memory is read in the order it lies. The backward passes are gathers: an input pixel walks
// the windows that contain it (PoolAxis::windows_containing) in increasing output position.
#include "ops/cpu/pool.h"

#include <cmath>
#include <limits>

#include "ops/cpu/cpu_util.h"
#include "ops/image_dims.h"

namespace ops::cpu {

void max_pool2d_forward(const Tensor& x, const Pool2dParams& p, const Tensor& y, const Tensor& indices) {
  const ImageDims d = image_dims(x, y);
  const PoolAxis ah = pool_axis_h(d.H, p), aw = pool_axis_w(d.W, p);
  ENGINE_FLOAT_SWITCH(x.dtype(), T, {
    using A = acc_t<T>;
    const T* px = x.data<T>();
    T* py = y.data<T>();
    int32_t* pi = indices.data<int32_t>();
    parallel_for(d.N * d.Ho * d.Wo, [&](int64_t o) {
      const int64_t n = o / (d.Ho * d.Wo), oh = o / d.Wo % d.Ho, ow = o % d.Wo;
      std::vector<A> best(size_t(d.C), -std::numeric_limits<A>::infinity());
      std::vector<int32_t> idx(size_t(d.C), -1);
      for (int64_t kh = 0; kh < p.kernel_h; kh++) {
        const int64_t ih = ah.start(oh) + kh * p.dilation_h;
        if (ih < 0 || ih >= d.H) continue;
        for (int64_t kw = 0; kw < p.kernel_w; kw++) {
          const int64_t iw = aw.start(ow) + kw * p.dilation_w;
          if (iw < 0 || iw >= d.W) continue;
          const T* xp = px + ((n * d.H + ih) * d.W + iw) * d.C;
          for (int64_t c = 0; c < d.C; c++) {
            const A v = ld(xp[c]);
            // The first tap, a larger value or a NaN takes the place (PyTorch's rule).
            if (idx[size_t(c)] < 0 || v > best[size_t(c)] || std::isnan(v)) {
              best[size_t(c)] = v;
              idx[size_t(c)] = int32_t(ih * d.W + iw);
            }
          }
        }
      }
      for (int64_t c = 0; c < d.C; c++) {
        py[o * d.C + c] = st<T>(best[size_t(c)]);
        pi[o * d.C + c] = idx[size_t(c)];
      }
    });
  });
}

void max_pool2d_backward(const Tensor& g, const Tensor& indices, const Pool2dParams& p, const Tensor& dx) {
  const ImageDims d = image_dims(dx, g);
  const PoolAxis ah = pool_axis_h(d.H, p), aw = pool_axis_w(d.W, p);
  ENGINE_FLOAT_SWITCH(g.dtype(), T, {
    using A = acc_t<T>;
    const T* pg = g.data<T>();
    const int32_t* pi = indices.data<int32_t>();
    T* pdx = dx.data<T>();
    parallel_for(d.N * d.H * d.W, [&](int64_t i) {
      const int64_t n = i / (d.H * d.W), ih = i / d.W % d.H, iw = i % d.W;
      const int32_t self = int32_t(ih * d.W + iw);
      std::vector<A> acc(size_t(d.C), A(0));
      int64_t oh0, oh1, ow0, ow1;
      ah.windows_containing(ih, oh0, oh1);
      aw.windows_containing(iw, ow0, ow1);
      for (int64_t oh = oh0; oh <= oh1; oh++)
        for (int64_t ow = ow0; ow <= ow1; ow++) {
          const int64_t o = ((n * d.Ho + oh) * d.Wo + ow) * d.C;
          for (int64_t c = 0; c < d.C; c++)
            if (pi[o + c] == self) acc[size_t(c)] += ld(pg[o + c]);
        }
      for (int64_t c = 0; c < d.C; c++) pdx[i * d.C + c] = st<T>(acc[size_t(c)]);
    });
  });
}

void avg_pool2d_forward(const Tensor& x, const Pool2dParams& p, const Tensor& y) {
  const ImageDims d = image_dims(x, y);
  const PoolAxis ah = pool_axis_h(d.H, p), aw = pool_axis_w(d.W, p);
  ENGINE_FLOAT_SWITCH(x.dtype(), T, {
    using A = acc_t<T>;
    const T* px = x.data<T>();
    T* py = y.data<T>();
    parallel_for(d.N * d.Ho * d.Wo, [&](int64_t o) {
      const int64_t n = o / (d.Ho * d.Wo), oh = o / d.Wo % d.Ho, ow = o % d.Wo;
      int64_t h0, h1, hp, w0, w1, wp;
      ah.avg_window(oh, h0, h1, hp);
      aw.avg_window(ow, w0, w1, wp);
      const A divisor = A(p.count_include_pad ? hp * wp : (h1 - h0) * (w1 - w0));
      std::vector<A> acc(size_t(d.C), A(0));
      for (int64_t ih = h0; ih < h1; ih++)
        for (int64_t iw = w0; iw < w1; iw++) {
          const T* xp = px + ((n * d.H + ih) * d.W + iw) * d.C;
          for (int64_t c = 0; c < d.C; c++) acc[size_t(c)] += ld(xp[c]);
        }
      for (int64_t c = 0; c < d.C; c++) py[o * d.C + c] = st<T>(acc[size_t(c)] / divisor);
    });
  });
}

void avg_pool2d_backward(const Tensor& g, const Pool2dParams& p, const Tensor& dx) {
  const ImageDims d = image_dims(dx, g);
  const PoolAxis ah = pool_axis_h(d.H, p), aw = pool_axis_w(d.W, p);
  ENGINE_FLOAT_SWITCH(g.dtype(), T, {
    using A = acc_t<T>;
    const T* pg = g.data<T>();
    T* pdx = dx.data<T>();
    parallel_for(d.N * d.H * d.W, [&](int64_t i) {
      const int64_t n = i / (d.H * d.W), ih = i / d.W % d.H, iw = i % d.W;
      std::vector<A> acc(size_t(d.C), A(0));
      int64_t oh0, oh1, ow0, ow1;
      ah.windows_containing(ih, oh0, oh1);
      aw.windows_containing(iw, ow0, ow1);
      for (int64_t oh = oh0; oh <= oh1; oh++) {
        int64_t h0, h1, hp;
        ah.avg_window(oh, h0, h1, hp);
        for (int64_t ow = ow0; ow <= ow1; ow++) {
          int64_t w0, w1, wp;
          aw.avg_window(ow, w0, w1, wp);
          const A divisor = A(p.count_include_pad ? hp * wp : (h1 - h0) * (w1 - w0));
          const int64_t o = ((n * d.Ho + oh) * d.Wo + ow) * d.C;
          for (int64_t c = 0; c < d.C; c++) acc[size_t(c)] += ld(pg[o + c]) / divisor;
        }
      }
      for (int64_t c = 0; c < d.C; c++) pdx[i * d.C + c] = st<T>(acc[size_t(c)]);
    });
  });
}

}  // namespace ops::cpu
