// cpu/resample.cpp: upsampling and padding as plain loops over contiguous NHWC tensors: one output (forward)
// or input (backward) pixel at a time, channels innermost. Source indices and weights come from
// ops/resample_params.h (shared with the GPU); the backward loops are gathers in increasing output position.
#include "ops/cpu/resample.h"

#include "ops/cpu/cpu_util.h"
#include "ops/image_dims.h"

namespace ops::cpu {

void upsample2d_forward(const Tensor& x, const UpsampleParams& p, const Tensor& y) {
  const ImageDims d = image_dims(x, y);
  const int64_t N = d.N, H = d.H, W = d.W, C = d.C, Ho = d.Ho, Wo = d.Wo;
  ENGINE_FLOAT_SWITCH(x.dtype(), T, {
    using A = acc_t<T>;
    const ResampleAxis<A> ah = resample_axis<A>(H, Ho, p.scale_h, p), aw = resample_axis<A>(W, Wo, p.scale_w, p);
    const T* px = x.data<T>();
    T* py = y.data<T>();
    parallel_for(N * Ho * Wo, [&](int64_t o) {
      const int64_t n = o / (Ho * Wo), oh = o / Wo % Ho, ow = o % Wo;
      int64_t h0, h1, w0, w1;
      A wh0, wh1, ww0, ww1;
      ah.taps(oh, h0, h1, wh0, wh1);
      aw.taps(ow, w0, w1, ww0, ww1);
      const T* r0 = px + (n * H + h0) * W * C;
      const T* r1 = px + (n * H + h1) * W * C;
      if (ah.nearest) {  // a copy (exact; an inf neighbour with weight 0 must not make a NaN)
        for (int64_t c = 0; c < C; c++) py[o * C + c] = r0[w0 * C + c];
        return;
      }
      for (int64_t c = 0; c < C; c++) {
        const A top = ww0 * ld(r0[w0 * C + c]) + ww1 * ld(r0[w1 * C + c]);
        const A bottom = ww0 * ld(r1[w0 * C + c]) + ww1 * ld(r1[w1 * C + c]);
        py[o * C + c] = st<T>(wh0 * top + wh1 * bottom);
      }
    });
  });
}

void upsample2d_backward(const Tensor& g, const UpsampleParams& p, const Tensor& dx) {
  const ImageDims d = image_dims(dx, g);
  const int64_t N = d.N, H = d.H, W = d.W, C = d.C, Ho = d.Ho, Wo = d.Wo;
  ENGINE_FLOAT_SWITCH(g.dtype(), T, {
    using A = acc_t<T>;
    const ResampleAxis<A> ah = resample_axis<A>(H, Ho, p.scale_h, p), aw = resample_axis<A>(W, Wo, p.scale_w, p);
    const T* pg = g.data<T>();
    T* pdx = dx.data<T>();
    parallel_for(N * H * W, [&](int64_t i) {
      const int64_t n = i / (H * W), ih = i / W % H, iw = i % W;
      int64_t oh0, oh1, ow0, ow1;
      ah.outputs_reading(ih, oh0, oh1);
      aw.outputs_reading(iw, ow0, ow1);
      std::vector<A> acc(size_t(C), A(0));
      for (int64_t oh = oh0; oh < oh1; oh++) {
        const A wh = ah.weight(oh, ih);
        for (int64_t ow = ow0; ow < ow1; ow++) {
          const A w = wh * aw.weight(ow, iw);
          const T* gp = pg + ((n * Ho + oh) * Wo + ow) * C;
          for (int64_t c = 0; c < C; c++) acc[size_t(c)] += w * ld(gp[c]);
        }
      }
      for (int64_t c = 0; c < C; c++) pdx[i * C + c] = st<T>(acc[size_t(c)]);
    });
  });
}

void pad2d_forward(const Tensor& x, const Pad2dParams& p, const Tensor& y) {
  const ImageDims d = image_dims(x, y);
  const int64_t N = d.N, H = d.H, W = d.W, C = d.C, Ho = d.Ho, Wo = d.Wo;
  const PadAxis ah = pad_axis_h(H, p), aw = pad_axis_w(W, p);
  ENGINE_FLOAT_SWITCH(x.dtype(), T, {
    const T* px = x.data<T>();
    T* py = y.data<T>();
    const T fill = st<T>(p.value);
    parallel_for(N * Ho * Wo, [&](int64_t o) {
      const int64_t n = o / (Ho * Wo), ih = ah.src(o / Wo % Ho), iw = aw.src(o % Wo);
      const T* src = ih >= 0 && iw >= 0 ? px + ((n * H + ih) * W + iw) * C : nullptr;
      for (int64_t c = 0; c < C; c++) py[o * C + c] = src ? src[c] : fill;
    });
  });
}

void pad2d_backward(const Tensor& g, const Pad2dParams& p, const Tensor& dx) {
  const ImageDims d = image_dims(dx, g);
  const int64_t N = d.N, H = d.H, W = d.W, C = d.C, Ho = d.Ho, Wo = d.Wo;
  const PadAxis ah = pad_axis_h(H, p), aw = pad_axis_w(W, p);
  ENGINE_FLOAT_SWITCH(g.dtype(), T, {
    using A = acc_t<T>;
    const T* pg = g.data<T>();
    T* pdx = dx.data<T>();
    parallel_for(N * H * W, [&](int64_t i) {
      const int64_t n = i / (H * W), ih = i / W % H, iw = i % W;
      int64_t rows[3], cols[3];
      const int nr = ah.outputs_reading(ih, rows), nc = aw.outputs_reading(iw, cols);
      std::vector<A> acc(size_t(C), A(0));
      for (int a = 0; a < nr; a++)
        for (int b = 0; b < nc; b++) {
          const T* gp = pg + ((n * Ho + rows[a]) * Wo + cols[b]) * C;
          for (int64_t c = 0; c < C; c++) acc[size_t(c)] += ld(gp[c]);
        }
      for (int64_t c = 0; c < C; c++) pdx[i * C + c] = st<T>(acc[size_t(c)]);
    });
  });
}

}  // namespace ops::cpu
