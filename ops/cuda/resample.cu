// cuda/resample.cu: nearest / bilinear upsampling and constant / reflection padding over contiguous NHWC
// tensors, forward and backward.
//
// One thread per (pixel, channel) element, channels fastest, so a warp reads and writes 32 consecutive
// channels (coalesced); padding takes a vector of up to 16 bytes of channels per thread (with_channel_vector).
// Source indices and weights come from ops/resample_params.h, the functions the cpu
// reference calls, so both devices read the same taps with the same weights. Backward passes are gathers
// (deterministic, no atomics): a thread per input element finds the range of outputs that read it by
// bisection on the nondecreasing source index, then adds their weighted gradients in increasing output
// position, the cpu's order. Bound: memory (forward: x taps from cache, y written once; backward: each g
// element read by the <= 4 (bilinear), 1 (nearest) or <= 9 (reflection) input pixels it feeds).
#include "ops/cuda/kernel_util.cuh"
#include "ops/cuda/resample.h"
#include "ops/image_dims.h"

namespace ops::cuda {

using engine::Tensor;

namespace {

constexpr int kThreads = 256;

template <typename T>
__global__ void __launch_bounds__(kThreads)
    upsample2d_forward_kernel(const T* __restrict__ x, T* __restrict__ y, ImageDims d, ResampleAxis<acc_t<T>> ah,
                              ResampleAxis<acc_t<T>> aw, int64_t count) {
  using A = acc_t<T>;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x) {
    const auto [n, oh, ow, c] = pixel_of(i, d.Ho, d.Wo, d.C);
    int64_t h0, h1, w0, w1;
    A wh0, wh1, ww0, ww1;
    ah.taps(oh, h0, h1, wh0, wh1);
    aw.taps(ow, w0, w1, ww0, ww1);
    const T* r0 = x + (n * d.H + h0) * d.W * d.C + c;
    if (ah.nearest) {  // a copy, as the cpu's
      y[i] = r0[w0 * d.C];
      continue;
    }
    const T* r1 = x + (n * d.H + h1) * d.W * d.C + c;
    const A top = ww0 * to_acc<A>(r0[w0 * d.C]) + ww1 * to_acc<A>(r0[w1 * d.C]);
    const A bottom = ww0 * to_acc<A>(r1[w0 * d.C]) + ww1 * to_acc<A>(r1[w1 * d.C]);
    y[i] = from_acc<T>(wh0 * top + wh1 * bottom);
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    upsample2d_backward_kernel(const T* __restrict__ g, T* __restrict__ dx, ImageDims d, ResampleAxis<acc_t<T>> ah,
                               ResampleAxis<acc_t<T>> aw, int64_t count) {
  using A = acc_t<T>;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x) {
    const auto [n, ih, iw, c] = pixel_of(i, d.H, d.W, d.C);
    int64_t oh0, oh1, ow0, ow1;
    ah.outputs_reading(ih, oh0, oh1);
    aw.outputs_reading(iw, ow0, ow1);
    A acc = 0;
    for (int64_t oh = oh0; oh < oh1; oh++) {
      const A wh = ah.weight(oh, ih);
      for (int64_t ow = ow0; ow < ow1; ow++) {
        const A w = wh * aw.weight(ow, iw);
        acc += w * to_acc<A>(g[((n * d.Ho + oh) * d.Wo + ow) * d.C + c]);
      }
    }
    dx[i] = from_acc<T>(acc);
  }
}

// Padding: VEC consecutive channels per thread (with_channel_vector), `count` (pixel, vector) items.
template <typename T, int VEC>
__global__ void __launch_bounds__(kThreads)
    pad2d_forward_kernel(const T* __restrict__ x, T* __restrict__ y, ImageDims d, PadAxis ah, PadAxis aw, T fill,
                         int64_t count) {
  using A = acc_t<T>;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x) {
    const auto [n, oh, ow, cv] = pixel_of(i, d.Ho, d.Wo, d.C / VEC);
    const int64_t ih = ah.src(oh), iw = aw.src(ow);
    A v[VEC];
    if (ih >= 0 && iw >= 0) {
      load_vec<VEC>(x + ((n * d.H + ih) * d.W + iw) * d.C + cv * VEC, v);
    } else {
#pragma unroll
      for (int k = 0; k < VEC; k++) v[k] = to_acc<A>(fill);
    }
    store_vec<VEC>(y + i * VEC, v);
  }
}

template <typename T, int VEC>
__global__ void __launch_bounds__(kThreads) pad2d_backward_kernel(const T* __restrict__ g, T* __restrict__ dx,
                                                                  ImageDims d, PadAxis ah, PadAxis aw, int64_t count) {
  using A = acc_t<T>;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x) {
    const auto [n, ih, iw, cv] = pixel_of(i, d.H, d.W, d.C / VEC);
    int64_t rows[3], cols[3];
    const int nr = ah.outputs_reading(ih, rows), nc = aw.outputs_reading(iw, cols);
    A acc[VEC] = {};
    for (int a = 0; a < nr; a++)
      for (int b = 0; b < nc; b++) {
        A v[VEC];
        load_vec<VEC>(g + ((n * d.Ho + rows[a]) * d.Wo + cols[b]) * d.C + cv * VEC, v);
#pragma unroll
        for (int k = 0; k < VEC; k++) acc[k] += v[k];
      }
    store_vec<VEC>(dx + i * VEC, acc);
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------------

void upsample2d_forward(const Tensor& x, const UpsampleParams& p, const Tensor& y) {
  const ImageDims d = image_dims(x, y);
  const int64_t count = y.numel();
  if (count == 0) return;
  ENGINE_CUDA_FLOAT_SWITCH(x.dtype(), T, {
    using A = acc_t<T>;
    upsample2d_forward_kernel<T><<<grid_for(count, kThreads), kThreads, 0, engine::cuda::stream()>>>(
        static_cast<const T*>(x.data_ptr()), static_cast<T*>(y.data_ptr()), d,
        resample_axis<A>(d.H, d.Ho, p.scale_h, p), resample_axis<A>(d.W, d.Wo, p.scale_w, p), count);
  });
  ENGINE_CUDA_LAUNCH_CHECK("upsample2d");
}

void upsample2d_backward(const Tensor& g, const UpsampleParams& p, const Tensor& dx) {
  const ImageDims d = image_dims(dx, g);
  const int64_t count = dx.numel();
  if (count == 0) return;
  ENGINE_CUDA_FLOAT_SWITCH(g.dtype(), T, {
    using A = acc_t<T>;
    upsample2d_backward_kernel<T><<<grid_for(count, kThreads), kThreads, 0, engine::cuda::stream()>>>(
        static_cast<const T*>(g.data_ptr()), static_cast<T*>(dx.data_ptr()), d,
        resample_axis<A>(d.H, d.Ho, p.scale_h, p), resample_axis<A>(d.W, d.Wo, p.scale_w, p), count);
  });
  ENGINE_CUDA_LAUNCH_CHECK("upsample2d_backward");
}

void pad2d_forward(const Tensor& x, const Pad2dParams& p, const Tensor& y) {
  const ImageDims d = image_dims(x, y);
  const int64_t count = y.numel();
  if (count == 0) return;
  ENGINE_CUDA_FLOAT_SWITCH(x.dtype(), T, {
    using A = acc_t<T>;
    with_channel_vector<T>(d.C, {x.data_ptr(), y.data_ptr()}, [&](auto V) {
      pad2d_forward_kernel<T, V()><<<grid_for(count / V(), kThreads), kThreads, 0, engine::cuda::stream()>>>(
          static_cast<const T*>(x.data_ptr()), static_cast<T*>(y.data_ptr()), d, pad_axis_h(d.H, p), pad_axis_w(d.W, p),
          T(A(p.value)), count / V());
    });
  });
  ENGINE_CUDA_LAUNCH_CHECK("pad2d");
}

void pad2d_backward(const Tensor& g, const Pad2dParams& p, const Tensor& dx) {
  const ImageDims d = image_dims(dx, g);
  const int64_t count = dx.numel();
  if (count == 0) return;
  ENGINE_CUDA_FLOAT_SWITCH(g.dtype(), T, {
    with_channel_vector<T>(d.C, {g.data_ptr(), dx.data_ptr()}, [&](auto V) {
      pad2d_backward_kernel<T, V()><<<grid_for(count / V(), kThreads), kThreads, 0, engine::cuda::stream()>>>(
          static_cast<const T*>(g.data_ptr()), static_cast<T*>(dx.data_ptr()), d, pad_axis_h(d.H, p),
          pad_axis_w(d.W, p), count / V());
    });
  });
  ENGINE_CUDA_LAUNCH_CHECK("pad2d_backward");
}

}  // namespace ops::cuda
