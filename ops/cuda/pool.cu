// cuda/pool.cu: 2-D max and average pooling over contiguous NHWC tensors, forward and backward.
//
// Every kernel maps one thread to one (pixel, channel) element, channels fastest, so a warp reads 32
// consecutive channels of each tap (coalesced; the taps of neighbouring windows overlap and hit L1/L2).
// Forward: a thread per output element walks its window. Backward (a gather, deterministic and without
// atomics): a thread per input element walks the windows that contain it (PoolAxis::windows_containing) in
// increasing output position, exactly the cpu reference's order. Geometry: ops/pool_params.h, shared with it.
// Bound: memory (bytes: x or g read once from DRAM, each tap re-read from cache; y/dx written once).
#include "ops/cuda/kernel_util.cuh"
#include "ops/image_dims.h"
#include "ops/cuda/pool.h"

namespace ops::cuda {

using engine::Tensor;

namespace {

constexpr int kThreads = 256;

// One thread per output element (n, oh, ow, c): the first tap, a larger value or a NaN takes the place.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    max_pool2d_forward_kernel(const T* __restrict__ x, T* __restrict__ y, int32_t* __restrict__ indices, ImageDims d,
                              PoolAxis ah, PoolAxis aw, int64_t count) {
  using A = acc_t<T>;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x) {
    const auto [n, oh, ow, c] = pixel_of(i, d.Ho, d.Wo, d.C);
    A best = -INFINITY;
    int32_t idx = -1;
    for (int64_t kh = 0; kh < ah.k; kh++) {
      const int64_t ih = ah.start(oh) + kh * ah.dilation;
      if (ih < 0 || ih >= d.H) continue;
      for (int64_t kw = 0; kw < aw.k; kw++) {
        const int64_t iw = aw.start(ow) + kw * aw.dilation;
        if (iw < 0 || iw >= d.W) continue;
        const A v = to_acc<A>(x[((n * d.H + ih) * d.W + iw) * d.C + c]);
        if (idx < 0 || v > best || isnan(v)) {
          best = v;
          idx = int32_t(ih * d.W + iw);
        }
      }
    }
    y[i] = from_acc<T>(best);
    indices[i] = idx;
  }
}

// One thread per input element (n, ih, iw, c): g summed over the windows whose argmax it is.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    max_pool2d_backward_kernel(const T* __restrict__ g, const int32_t* __restrict__ indices, T* __restrict__ dx,
                               ImageDims d, PoolAxis ah, PoolAxis aw, int64_t count) {
  using A = acc_t<T>;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x) {
    const auto [n, ih, iw, c] = pixel_of(i, d.H, d.W, d.C);
    const int32_t self = int32_t(ih * d.W + iw);
    int64_t oh0, oh1, ow0, ow1;
    ah.windows_containing(ih, oh0, oh1);
    aw.windows_containing(iw, ow0, ow1);
    A acc = 0;
    for (int64_t oh = oh0; oh <= oh1; oh++)
      for (int64_t ow = ow0; ow <= ow1; ow++) {
        const int64_t o = ((n * d.Ho + oh) * d.Wo + ow) * d.C + c;
        if (indices[o] == self) acc += to_acc<A>(g[o]);
      }
    dx[i] = from_acc<T>(acc);
  }
}

// One thread per output element: the clipped window's sum over its divisor.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    avg_pool2d_forward_kernel(const T* __restrict__ x, T* __restrict__ y, ImageDims d, PoolAxis ah, PoolAxis aw,
                              bool count_include_pad, int64_t count) {
  using A = acc_t<T>;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x) {
    const auto [n, oh, ow, c] = pixel_of(i, d.Ho, d.Wo, d.C);
    int64_t h0, h1, hp, w0, w1, wp;
    ah.avg_window(oh, h0, h1, hp);
    aw.avg_window(ow, w0, w1, wp);
    const A divisor = A(count_include_pad ? hp * wp : (h1 - h0) * (w1 - w0));
    A acc = 0;
    for (int64_t ih = h0; ih < h1; ih++)
      for (int64_t iw = w0; iw < w1; iw++) acc += to_acc<A>(x[((n * d.H + ih) * d.W + iw) * d.C + c]);
    y[i] = from_acc<T>(acc / divisor);
  }
}

// One thread per input element: g / divisor summed over the windows that contain it.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    avg_pool2d_backward_kernel(const T* __restrict__ g, T* __restrict__ dx, ImageDims d, PoolAxis ah, PoolAxis aw,
                               bool count_include_pad, int64_t count) {
  using A = acc_t<T>;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x) {
    const auto [n, ih, iw, c] = pixel_of(i, d.H, d.W, d.C);
    int64_t oh0, oh1, ow0, ow1;
    ah.windows_containing(ih, oh0, oh1);
    aw.windows_containing(iw, ow0, ow1);
    A acc = 0;
    for (int64_t oh = oh0; oh <= oh1; oh++) {
      int64_t h0, h1, hp;
      ah.avg_window(oh, h0, h1, hp);
      for (int64_t ow = ow0; ow <= ow1; ow++) {
        int64_t w0, w1, wp;
        aw.avg_window(ow, w0, w1, wp);
        const A divisor = A(count_include_pad ? hp * wp : (h1 - h0) * (w1 - w0));
        acc += to_acc<A>(g[((n * d.Ho + oh) * d.Wo + ow) * d.C + c]) / divisor;
      }
    }
    dx[i] = from_acc<T>(acc);
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------------

void max_pool2d_forward(const Tensor& x, const Pool2dParams& p, const Tensor& y, const Tensor& indices) {
  const ImageDims d = image_dims(x, y);
  const int64_t count = y.numel();
  if (count == 0) return;
  ENGINE_CUDA_FLOAT_SWITCH(x.dtype(), T, {
    max_pool2d_forward_kernel<T><<<grid_for(count, kThreads), kThreads, 0, engine::cuda::stream()>>>(
        static_cast<const T*>(x.data_ptr()), static_cast<T*>(y.data_ptr()), static_cast<int32_t*>(indices.data_ptr()),
        d, pool_axis_h(d.H, p), pool_axis_w(d.W, p), count);
  });
  ENGINE_CUDA_LAUNCH_CHECK("max_pool2d");
}

void max_pool2d_backward(const Tensor& g, const Tensor& indices, const Pool2dParams& p, const Tensor& dx) {
  const ImageDims d = image_dims(dx, g);
  const int64_t count = dx.numel();
  if (count == 0) return;
  ENGINE_CUDA_FLOAT_SWITCH(g.dtype(), T, {
    max_pool2d_backward_kernel<T><<<grid_for(count, kThreads), kThreads, 0, engine::cuda::stream()>>>(
        static_cast<const T*>(g.data_ptr()), static_cast<const int32_t*>(indices.data_ptr()),
        static_cast<T*>(dx.data_ptr()), d, pool_axis_h(d.H, p), pool_axis_w(d.W, p), count);
  });
  ENGINE_CUDA_LAUNCH_CHECK("max_pool2d_backward");
}

void avg_pool2d_forward(const Tensor& x, const Pool2dParams& p, const Tensor& y) {
  const ImageDims d = image_dims(x, y);
  const int64_t count = y.numel();
  if (count == 0) return;
  ENGINE_CUDA_FLOAT_SWITCH(x.dtype(), T, {
    avg_pool2d_forward_kernel<T><<<grid_for(count, kThreads), kThreads, 0, engine::cuda::stream()>>>(
        static_cast<const T*>(x.data_ptr()), static_cast<T*>(y.data_ptr()), d, pool_axis_h(d.H, p),
        pool_axis_w(d.W, p), p.count_include_pad, count);
  });
  ENGINE_CUDA_LAUNCH_CHECK("avg_pool2d");
}

void avg_pool2d_backward(const Tensor& g, const Pool2dParams& p, const Tensor& dx) {
  const ImageDims d = image_dims(dx, g);
  const int64_t count = dx.numel();
  if (count == 0) return;
  ENGINE_CUDA_FLOAT_SWITCH(g.dtype(), T, {
    avg_pool2d_backward_kernel<T><<<grid_for(count, kThreads), kThreads, 0, engine::cuda::stream()>>>(
        static_cast<const T*>(g.data_ptr()), static_cast<T*>(dx.data_ptr()), d, pool_axis_h(d.H, p),
        pool_axis_w(d.W, p), p.count_include_pad, count);
  });
  ENGINE_CUDA_LAUNCH_CHECK("avg_pool2d_backward");
}

}  // namespace ops::cuda
