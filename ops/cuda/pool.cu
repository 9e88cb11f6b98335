// cuda/pool.cu: 2-D max and average pooling over contiguous NHWC tensors, forward and backward.
//
// Every kernel maps one thread to one (pixel, channel vector) item, channels fastest, so a warp reads
// consecutive channels of each tap (coalesced; the taps of neighbouring windows overlap and hit L1/L2).
// Forward: a thread per output element walks its window. Backward (a gather, deterministic and without
// atomics): a thread per input element walks the windows that contain it (PoolAxis::windows_containing) in
// increasing output position, exactly the cpu reference's order. Geometry: ops/pool_params.h, shared with it.
// Bound: memory (bytes: x or g read once from DRAM, each tap re-read from cache; y/dx written once).
#include "ops/cuda/kernel_util.cuh"
#include "ops/cuda/pool.h"
#include "ops/image_dims.h"

namespace ops::cuda {

using engine::Tensor;

namespace {

constexpr int kThreads = 256;

// Each kernel takes VEC consecutive channels per thread (one vector load per tap; VEC = 1 when the channel
// count or an address does not allow more): the index arithmetic, in 64 bits, is shared by VEC elements and
// each element's arithmetic is the same as with VEC = 1. `count` is the number of (pixel, vector) items.

// One thread per output element (n, oh, ow, c): the first tap, a larger value or a NaN takes the place.
template <typename T, int VEC>
__global__ void __launch_bounds__(kThreads)
    max_pool2d_forward_kernel(const T* __restrict__ x, T* __restrict__ y, int32_t* __restrict__ indices, ImageDims d,
                              PoolAxis ah, PoolAxis aw, int64_t count) {
  using A = acc_t<T>;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x) {
    const auto [n, oh, ow, cv] = pixel_of(i, d.Ho, d.Wo, d.C / VEC);
    const int64_t c = cv * VEC;
    A best[VEC];
    int32_t idx[VEC];
#pragma unroll
    for (int k = 0; k < VEC; k++) best[k] = -INFINITY, idx[k] = -1;
    for (int64_t kh = 0; kh < ah.k; kh++) {
      const int64_t ih = ah.start(oh) + kh * ah.dilation;
      if (ih < 0 || ih >= d.H) continue;
      for (int64_t kw = 0; kw < aw.k; kw++) {
        const int64_t iw = aw.start(ow) + kw * aw.dilation;
        if (iw < 0 || iw >= d.W) continue;
        A v[VEC];
        load_vec<VEC>(x + ((n * d.H + ih) * d.W + iw) * d.C + c, v);
#pragma unroll
        for (int k = 0; k < VEC; k++)
          if (idx[k] < 0 || v[k] > best[k] || isnan(v[k])) {
            best[k] = v[k];
            idx[k] = int32_t(ih * d.W + iw);
          }
      }
    }
    store_vec<VEC>(y + i * VEC, best);
#pragma unroll
    for (int k = 0; k < VEC; k++) indices[i * VEC + k] = idx[k];
  }
}

// One thread per input element (n, ih, iw, c): g summed over the windows whose argmax it is.
template <typename T, int VEC>
__global__ void __launch_bounds__(kThreads)
    max_pool2d_backward_kernel(const T* __restrict__ g, const int32_t* __restrict__ indices, T* __restrict__ dx,
                               ImageDims d, PoolAxis ah, PoolAxis aw, int64_t count) {
  using A = acc_t<T>;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x) {
    const auto [n, ih, iw, cv] = pixel_of(i, d.H, d.W, d.C / VEC);
    const int32_t self = int32_t(ih * d.W + iw);
    int64_t oh0, oh1, ow0, ow1;
    ah.windows_containing(ih, oh0, oh1);
    aw.windows_containing(iw, ow0, ow1);
    A acc[VEC] = {};
    for (int64_t oh = oh0; oh <= oh1; oh++)
      for (int64_t ow = ow0; ow <= ow1; ow++) {
        const int64_t o = ((n * d.Ho + oh) * d.Wo + ow) * d.C + cv * VEC;
        A v[VEC];
        load_vec<VEC>(g + o, v);
#pragma unroll
        for (int k = 0; k < VEC; k++)
          if (indices[o + k] == self) acc[k] += v[k];
      }
    store_vec<VEC>(dx + i * VEC, acc);
  }
}

// One thread per output element: the clipped window's sum over its divisor.
template <typename T, int VEC>
__global__ void __launch_bounds__(kThreads)
    avg_pool2d_forward_kernel(const T* __restrict__ x, T* __restrict__ y, ImageDims d, PoolAxis ah, PoolAxis aw,
                              bool count_include_pad, int64_t count) {
  using A = acc_t<T>;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x) {
    const auto [n, oh, ow, cv] = pixel_of(i, d.Ho, d.Wo, d.C / VEC);
    int64_t h0, h1, hp, w0, w1, wp;
    ah.avg_window(oh, h0, h1, hp);
    aw.avg_window(ow, w0, w1, wp);
    const A divisor = A(count_include_pad ? hp * wp : (h1 - h0) * (w1 - w0));
    A acc[VEC] = {};
    for (int64_t ih = h0; ih < h1; ih++)
      for (int64_t iw = w0; iw < w1; iw++) {
        A v[VEC];
        load_vec<VEC>(x + ((n * d.H + ih) * d.W + iw) * d.C + cv * VEC, v);
#pragma unroll
        for (int k = 0; k < VEC; k++) acc[k] += v[k];
      }
#pragma unroll
    for (int k = 0; k < VEC; k++) acc[k] /= divisor;
    store_vec<VEC>(y + i * VEC, acc);
  }
}

// One thread per input element: g / divisor summed over the windows that contain it.
template <typename T, int VEC>
__global__ void __launch_bounds__(kThreads)
    avg_pool2d_backward_kernel(const T* __restrict__ g, T* __restrict__ dx, ImageDims d, PoolAxis ah, PoolAxis aw,
                               bool count_include_pad, int64_t count) {
  using A = acc_t<T>;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x) {
    const auto [n, ih, iw, cv] = pixel_of(i, d.H, d.W, d.C / VEC);
    int64_t oh0, oh1, ow0, ow1;
    ah.windows_containing(ih, oh0, oh1);
    aw.windows_containing(iw, ow0, ow1);
    A acc[VEC] = {};
    for (int64_t oh = oh0; oh <= oh1; oh++) {
      int64_t h0, h1, hp;
      ah.avg_window(oh, h0, h1, hp);
      for (int64_t ow = ow0; ow <= ow1; ow++) {
        int64_t w0, w1, wp;
        aw.avg_window(ow, w0, w1, wp);
        // One division per window, not per element (within an ulp of g / divisor, the cpu's).
        const A inv = A(1) / A(count_include_pad ? hp * wp : (h1 - h0) * (w1 - w0));
        A v[VEC];
        load_vec<VEC>(g + ((n * d.Ho + oh) * d.Wo + ow) * d.C + cv * VEC, v);
#pragma unroll
        for (int k = 0; k < VEC; k++) acc[k] += v[k] * inv;
      }
    }
    store_vec<VEC>(dx + i * VEC, acc);
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------------

void max_pool2d_forward(const Tensor& x, const Pool2dParams& p, const Tensor& y, const Tensor& indices) {
  const ImageDims d = image_dims(x, y);
  const int64_t count = y.numel();
  if (count == 0) return;
  ENGINE_CUDA_FLOAT_SWITCH(x.dtype(), T, {
    with_channel_vector<T>(d.C, {x.data_ptr(), y.data_ptr()}, [&](auto V) {
      max_pool2d_forward_kernel<T, V()><<<grid_for(count / V(), kThreads), kThreads, 0, engine::cuda::stream()>>>(
          static_cast<const T*>(x.data_ptr()), static_cast<T*>(y.data_ptr()), static_cast<int32_t*>(indices.data_ptr()),
          d, pool_axis_h(d.H, p), pool_axis_w(d.W, p), count / V());
    });
  });
  ENGINE_CUDA_LAUNCH_CHECK("max_pool2d");
}

void max_pool2d_backward(const Tensor& g, const Tensor& indices, const Pool2dParams& p, const Tensor& dx) {
  const ImageDims d = image_dims(dx, g);
  const int64_t count = dx.numel();
  if (count == 0) return;
  ENGINE_CUDA_FLOAT_SWITCH(g.dtype(), T, {
    with_channel_vector<T>(d.C, {g.data_ptr(), dx.data_ptr()}, [&](auto V) {
      max_pool2d_backward_kernel<T, V()><<<grid_for(count / V(), kThreads), kThreads, 0, engine::cuda::stream()>>>(
          static_cast<const T*>(g.data_ptr()), static_cast<const int32_t*>(indices.data_ptr()),
          static_cast<T*>(dx.data_ptr()), d, pool_axis_h(d.H, p), pool_axis_w(d.W, p), count / V());
    });
  });
  ENGINE_CUDA_LAUNCH_CHECK("max_pool2d_backward");
}

void avg_pool2d_forward(const Tensor& x, const Pool2dParams& p, const Tensor& y) {
  const ImageDims d = image_dims(x, y);
  const int64_t count = y.numel();
  if (count == 0) return;
  ENGINE_CUDA_FLOAT_SWITCH(x.dtype(), T, {
    with_channel_vector<T>(d.C, {x.data_ptr(), y.data_ptr()}, [&](auto V) {
      avg_pool2d_forward_kernel<T, V()><<<grid_for(count / V(), kThreads), kThreads, 0, engine::cuda::stream()>>>(
          static_cast<const T*>(x.data_ptr()), static_cast<T*>(y.data_ptr()), d, pool_axis_h(d.H, p),
          pool_axis_w(d.W, p), p.count_include_pad, count / V());
    });
  });
  ENGINE_CUDA_LAUNCH_CHECK("avg_pool2d");
}

void avg_pool2d_backward(const Tensor& g, const Pool2dParams& p, const Tensor& dx) {
  const ImageDims d = image_dims(dx, g);
  const int64_t count = dx.numel();
  if (count == 0) return;
  ENGINE_CUDA_FLOAT_SWITCH(g.dtype(), T, {
    with_channel_vector<T>(d.C, {g.data_ptr(), dx.data_ptr()}, [&](auto V) {
      avg_pool2d_backward_kernel<T, V()><<<grid_for(count / V(), kThreads), kThreads, 0, engine::cuda::stream()>>>(
          static_cast<const T*>(g.data_ptr()), static_cast<T*>(dx.data_ptr()), d, pool_axis_h(d.H, p),
          pool_axis_w(d.W, p), p.count_include_pad, count / V());
    });
  });
  ENGINE_CUDA_LAUNCH_CHECK("avg_pool2d_backward");
}

}  // namespace ops::cuda
