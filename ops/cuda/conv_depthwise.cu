// cuda/conv_depthwise.cu: depthwise convolution (groups == Cin == Cout, one filter [KH, KW] per channel),
// direct kernels. With one input channel per output channel there is no reduction over channels to put on
// tensor cores: each output is KH*KW products, so the kernels are memory-bound and keep the channel
// dimension (contiguous in NHWC) across a warp's lanes for coalesced loads; neighbouring taps re-read x
// through L1/L2. Bytes: forward/data ~ read x (or dy) once + write y (or dx) once when the cache holds the
// KH rows a block touches.
//   forward  one thread per y element (c fastest)
//   data     one thread per dx element; taps whose (h + p - kh*d) is not a multiple of the stride skipped
//   weight   block = 32 channels x 8 pixel lanes for one tap and one split of the output pixels; the 8
//            lanes' sums meet in shared memory and are added in order (deterministic, no atomics). With
//            splits > 1 each split writes ws[split] and weight_grad_finalize adds them in order.
#include "ops/cuda/conv_kernels.cuh"
#include "ops/cuda/kernel_util.cuh"

namespace ops::cuda::conv {

namespace {

constexpr int kThreads = 256;
constexpr int kPixelLanes = 8;  // weight gradient: threads per channel, each over every 8th pixel

template <typename T>
__global__ void __launch_bounds__(kThreads) depthwise_forward_kernel(const Dims d, const T* __restrict__ x,
                                                                     const T* __restrict__ w,
                                                                     const T* __restrict__ bias, T* __restrict__ y,
                                                                     int64_t total) {
  using A = acc_t<T>;
  const int taps = d.kh * d.kw, C = d.cin;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int c = int(i % C);
    int64_t pix = i / C;
    const int wo = int(pix % d.wo);
    pix /= d.wo;
    const int ho = int(pix % d.ho);
    const int64_t n = pix / d.ho;
    const T* wc = w + int64_t(c) * taps;
    A acc = A(0);
    for (int kh = 0; kh < d.kh; kh++) {
      const int hi = ho * d.sh - d.ph + kh * d.dh;
      if (hi < 0 || hi >= d.h) continue;
      const T* xr = x + (n * d.h + hi) * d.w * C + c;
      for (int kw = 0; kw < d.kw; kw++) {
        const int wi = wo * d.sw - d.pw + kw * d.dw;
        if (wi < 0 || wi >= d.w) continue;
        acc += to_acc<A>(xr[int64_t(wi) * C]) * to_acc<A>(wc[kh * d.kw + kw]);
      }
    }
    if (bias) acc += to_acc<A>(bias[c]);
    y[i] = from_acc<T>(acc);
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads) depthwise_data_kernel(const Dims d, const T* __restrict__ dy,
                                                                  const T* __restrict__ w, T* __restrict__ dx,
                                                                  int64_t total) {
  using A = acc_t<T>;
  const int taps = d.kh * d.kw, C = d.cin;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int c = int(i % C);
    int64_t pix = i / C;
    const int wx = int(pix % d.w);
    pix /= d.w;
    const int hx = int(pix % d.h);
    const int64_t n = pix / d.h;
    const T* wc = w + int64_t(c) * taps;
    A acc = A(0);
    for (int kh = 0; kh < d.kh; kh++) {
      const int th = hx + d.ph - kh * d.dh;
      if (th < 0 || th % d.sh != 0 || th / d.sh >= d.ho) continue;
      const T* dyr = dy + (n * d.ho + th / d.sh) * d.wo * C + c;
      for (int kw = 0; kw < d.kw; kw++) {
        const int tw = wx + d.pw - kw * d.dw;
        if (tw < 0 || tw % d.sw != 0 || tw / d.sw >= d.wo) continue;
        acc += to_acc<A>(dyr[int64_t(tw / d.sw) * C]) * to_acc<A>(wc[kh * d.kw + kw]);
      }
    }
    dx[i] = from_acc<T>(acc);
  }
}

// grid (ceil(C / 32), KH * KW, splits), block (32, kPixelLanes). Output pixels [begin, end) of this split.
// out: dw (T) when splits == 1, else ws + split * C * taps (f32); element (c, tap) at c * taps + tap.
template <typename T, typename Out>
__global__ void __launch_bounds__(32 * kPixelLanes) depthwise_weight_kernel(const Dims d, const T* __restrict__ x,
                                                                            const T* __restrict__ dy,
                                                                            Out* __restrict__ out, int64_t per_split) {
  using A = acc_t<T>;
  __shared__ A partial[kPixelLanes][32];
  const int C = d.cin, taps = d.kh * d.kw;
  const int c = int(blockIdx.x) * 32 + int(threadIdx.x), tap = int(blockIdx.y), split = int(blockIdx.z);
  const int kh = tap / d.kw, kw = tap % d.kw;
  const int64_t pixels = int64_t(d.n) * d.ho * d.wo;
  const int64_t begin = split * per_split, end = min(pixels, begin + per_split);
  A acc = A(0);
  if (c < C) {
    for (int64_t p = begin + threadIdx.y; p < end; p += kPixelLanes) {
      const int wo = int(p % d.wo);
      const int64_t q = p / d.wo;
      const int ho = int(q % d.ho);
      const int64_t n = q / d.ho;
      const int hi = ho * d.sh - d.ph + kh * d.dh, wi = wo * d.sw - d.pw + kw * d.dw;
      if (hi < 0 || hi >= d.h || wi < 0 || wi >= d.w) continue;
      acc += to_acc<A>(dy[p * C + c]) * to_acc<A>(x[((n * d.h + hi) * d.w + wi) * C + c]);
    }
  }
  partial[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    A s = partial[0][threadIdx.x];
#pragma unroll
    for (int k = 1; k < kPixelLanes; k++) s += partial[k][threadIdx.x];
    Out* o = out + int64_t(split) * C * taps;
    if constexpr (std::is_same_v<Out, float> && !std::is_same_v<T, float>) o[int64_t(c) * taps + tap] = float(s);
    else o[int64_t(c) * taps + tap] = from_acc<Out>(s);
  }
}

}  // namespace

void depthwise_forward(const Dims& d, engine::DType t, const void* x, const void* w, const void* bias, void* y) {
  const int64_t total = int64_t(d.n) * d.ho * d.wo * d.cout;
  if (total == 0) return;
  ENGINE_CUDA_FLOAT_SWITCH(t, T, {
    depthwise_forward_kernel<T><<<grid_for(total, kThreads), kThreads, 0, engine::cuda::stream()>>>(
        d, static_cast<const T*>(x), static_cast<const T*>(w), static_cast<const T*>(bias), static_cast<T*>(y), total);
  });
  ENGINE_CUDA_LAUNCH_CHECK("conv2d (depthwise forward)");
}

void depthwise_data(const Dims& d, engine::DType t, const void* dy, const void* w, void* dx) {
  const int64_t total = int64_t(d.n) * d.h * d.w * d.cin;
  if (total == 0) return;
  ENGINE_CUDA_FLOAT_SWITCH(t, T, {
    depthwise_data_kernel<T><<<grid_for(total, kThreads), kThreads, 0, engine::cuda::stream()>>>(
        d, static_cast<const T*>(dy), static_cast<const T*>(w), static_cast<T*>(dx), total);
  });
  ENGINE_CUDA_LAUNCH_CHECK("conv2d_backward_data (depthwise)");
}

void depthwise_weight(const Dims& d, engine::DType t, const void* x, const void* dy, void* dw, float* ws, int splits) {
  const int64_t pixels = int64_t(d.n) * d.ho * d.wo, count = int64_t(d.cout) * d.kh * d.kw;
  if (count == 0) return;
  // f64 keeps one split: its partial sums would lose precision in the f32 workspace.
  if (t == engine::DType::f64 || ws == nullptr) splits = 1;
  const int64_t per_split = std::max<int64_t>(1, (pixels + splits - 1) / splits);
  const dim3 grid(unsigned((d.cin + 31) / 32), unsigned(d.kh * d.kw), unsigned(splits)), block(32, kPixelLanes);
  ENGINE_CUDA_FLOAT_SWITCH(t, T, {
    if (splits == 1) {
      depthwise_weight_kernel<T, T><<<grid, block, 0, engine::cuda::stream()>>>(
          d, static_cast<const T*>(x), static_cast<const T*>(dy), static_cast<T*>(dw), per_split);
    } else {
      depthwise_weight_kernel<T, float><<<grid, block, 0, engine::cuda::stream()>>>(
          d, static_cast<const T*>(x), static_cast<const T*>(dy), ws, per_split);
    }
  });
  ENGINE_CUDA_LAUNCH_CHECK("conv2d_backward_weight (depthwise)");
  if (splits > 1) weight_grad_finalize(t, ws, splits, count, dw);
}

}  // namespace ops::cuda::conv
