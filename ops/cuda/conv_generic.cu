// cuda/conv_generic.cu: the generic convolution kernels on CUDA cores: every geometry (stride, padding,
// dilation, groups), every floating dtype (f32, f64, bf16, f16; computed in acc_t, rounded once on store).
// They are the fallback (f32/f64, channels per group not a multiple of 8) and the correctness anchor of
// the faster paths, so they are written as the plain sums of the definition:
//   y[n,ho,wo,co]  = bias[co] + sum_{kh,kw,c} x[n, ho*s-p+kh*d, wo*s-p+kw*d, g*Cg+c] w[co,kh,kw,c]
//   dx[n,h,w,ci]   = sum over (kh,kw,co) with ho = (h+p-kh*d)/s integral and in range of dy[n,ho,wo,g*Coutg+co] w[..]
//   dw[co,kh,kw,c] = sum over output pixels of dy[pixel, co] x[pixel's input at (kh,kw), g*Cg+c]
// Bound: memory latency and L1/L2 traffic (every thread re-reads its operands; no tiling).
// Also here: the fixed-order sum of the weight gradient's split-K partials (shared by the fast paths).
#include "ops/cuda/conv_kernels.cuh"
#include "ops/cuda/kernel_util.cuh"

namespace ops::cuda::conv {

namespace {

constexpr int kThreads = 256;

// One thread per output element (co fastest, so a warp shares its x reads and the loads broadcast).
template <typename T>
__global__ void __launch_bounds__(kThreads) generic_forward_kernel(const Dims d, const T* __restrict__ x,
                                                                   const T* __restrict__ w,
                                                                   const T* __restrict__ bias, T* __restrict__ y,
                                                                   int64_t total) {
  using A = acc_t<T>;
  const int64_t taps_c = int64_t(d.kh) * d.kw * d.cg;  // one filter's length
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int co = int(i % d.cout);
    int64_t pix = i / d.cout;
    const int wo = int(pix % d.wo);
    pix /= d.wo;
    const int ho = int(pix % d.ho);
    const int64_t n = pix / d.ho;
    const int grp = co / d.coutg;
    const T* wr = w + int64_t(co) * taps_c;
    A acc = A(0);
    for (int kh = 0; kh < d.kh; kh++) {
      const int hi = ho * d.sh - d.ph + kh * d.dh;
      if (hi < 0 || hi >= d.h) continue;
      for (int kw = 0; kw < d.kw; kw++) {
        const int wi = wo * d.sw - d.pw + kw * d.dw;
        if (wi < 0 || wi >= d.w) continue;
        const T* xr = x + ((n * d.h + hi) * d.w + wi) * d.cin + int64_t(grp) * d.cg;
        const T* wk = wr + (kh * d.kw + kw) * d.cg;
        for (int c = 0; c < d.cg; c++) acc += to_acc<A>(xr[c]) * to_acc<A>(wk[c]);
      }
    }
    if (bias) acc += to_acc<A>(bias[co]);
    y[i] = from_acc<T>(acc);
  }
}

// One thread per dx element (ci fastest).
template <typename T>
__global__ void __launch_bounds__(kThreads) generic_data_kernel(const Dims d, const T* __restrict__ dy,
                                                                const T* __restrict__ w, T* __restrict__ dx,
                                                                int64_t total) {
  using A = acc_t<T>;
  const int64_t taps_c = int64_t(d.kh) * d.kw * d.cg;  // stride between output channels in w
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int ci = int(i % d.cin);
    int64_t pix = i / d.cin;
    const int wx = int(pix % d.w);
    pix /= d.w;
    const int hx = int(pix % d.h);
    const int64_t n = pix / d.h;
    const int grp = ci / d.cg, c = ci - grp * d.cg;
    A acc = A(0);
    for (int kh = 0; kh < d.kh; kh++) {
      const int th = hx + d.ph - kh * d.dh;
      if (th < 0 || th % d.sh != 0 || th / d.sh >= d.ho) continue;
      const int ho = th / d.sh;
      for (int kw = 0; kw < d.kw; kw++) {
        const int tw = wx + d.pw - kw * d.dw;
        if (tw < 0 || tw % d.sw != 0 || tw / d.sw >= d.wo) continue;
        const int wo = tw / d.sw;
        const T* dyr = dy + ((n * d.ho + ho) * d.wo + wo) * d.cout + int64_t(grp) * d.coutg;
        const T* wk = w + int64_t(grp) * d.coutg * taps_c + (kh * d.kw + kw) * d.cg + c;
        for (int co = 0; co < d.coutg; co++) acc += to_acc<A>(dyr[co]) * to_acc<A>(wk[co * taps_c]);
      }
    }
    dx[i] = from_acc<T>(acc);
  }
}

// One warp per dw element; lane l sums output pixels l, l + 32, ...; a fixed butterfly adds the lanes.
template <typename T>
__global__ void __launch_bounds__(kThreads) generic_weight_kernel(const Dims d, const T* __restrict__ x,
                                                                  const T* __restrict__ dy, T* __restrict__ dw,
                                                                  int64_t total) {
  using A = acc_t<T>;
  const int lane = threadIdx.x % 32;
  const int64_t pixels = int64_t(d.n) * d.ho * d.wo;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / 32);
  for (int64_t e = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32; e < total; e += warps) {
    const int c = int(e % d.cg);
    const int64_t rest = e / d.cg;
    const int tap = int(rest % (d.kh * d.kw));
    const int co = int(rest / (d.kh * d.kw));
    const int kh = tap / d.kw, kw = tap % d.kw;
    const int ci = (co / d.coutg) * d.cg + c;
    A acc = A(0);
    for (int64_t p = lane; p < pixels; p += 32) {
      const int wo = int(p % d.wo);
      const int64_t q = p / d.wo;
      const int ho = int(q % d.ho);
      const int64_t n = q / d.ho;
      const int hi = ho * d.sh - d.ph + kh * d.dh, wi = wo * d.sw - d.pw + kw * d.dw;
      if (hi < 0 || hi >= d.h || wi < 0 || wi >= d.w) continue;
      acc += to_acc<A>(dy[p * d.cout + co]) * to_acc<A>(x[((n * d.h + hi) * d.w + wi) * d.cin + ci]);
    }
    acc = warp_sum(acc);
    if (lane == 0) dw[e] = from_acc<T>(acc);
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads) finalize_kernel(const float* __restrict__ ws, int splits, int64_t count,
                                                            T* __restrict__ dw) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x) {
    float s = 0.f;
    for (int k = 0; k < splits; k++) s += ws[int64_t(k) * count + i];
    dw[i] = from_acc<T>(s);
  }
}

}  // namespace

void generic_forward(const Dims& d, engine::DType t, const void* x, const void* w, const void* bias, void* y) {
  const int64_t total = int64_t(d.n) * d.ho * d.wo * d.cout;
  if (total == 0) return;
  ENGINE_CUDA_FLOAT_SWITCH(t, T, {
    generic_forward_kernel<T><<<grid_for(total, kThreads), kThreads, 0, engine::cuda::stream()>>>(
        d, static_cast<const T*>(x), static_cast<const T*>(w), static_cast<const T*>(bias), static_cast<T*>(y), total);
  });
  ENGINE_CUDA_LAUNCH_CHECK("conv2d (generic forward)");
}

void generic_data(const Dims& d, engine::DType t, const void* dy, const void* w, void* dx) {
  const int64_t total = int64_t(d.n) * d.h * d.w * d.cin;
  if (total == 0) return;
  ENGINE_CUDA_FLOAT_SWITCH(t, T, {
    generic_data_kernel<T><<<grid_for(total, kThreads), kThreads, 0, engine::cuda::stream()>>>(
        d, static_cast<const T*>(dy), static_cast<const T*>(w), static_cast<T*>(dx), total);
  });
  ENGINE_CUDA_LAUNCH_CHECK("conv2d_backward_data (generic)");
}

void generic_weight(const Dims& d, engine::DType t, const void* x, const void* dy, void* dw) {
  const int64_t total = int64_t(d.cout) * d.kh * d.kw * d.cg;
  if (total == 0) return;
  ENGINE_CUDA_FLOAT_SWITCH(t, T, {
    generic_weight_kernel<T><<<grid_for(total * 32, kThreads, 16), kThreads, 0, engine::cuda::stream()>>>(
        d, static_cast<const T*>(x), static_cast<const T*>(dy), static_cast<T*>(dw), total);
  });
  ENGINE_CUDA_LAUNCH_CHECK("conv2d_backward_weight (generic)");
}

void weight_grad_finalize(engine::DType t, const float* ws, int splits, int64_t count, void* dw) {
  if (count == 0) return;
  switch (t) {
    case engine::DType::f32:
      finalize_kernel<float><<<grid_for(count, kThreads), kThreads, 0, engine::cuda::stream()>>>(
          ws, splits, count, static_cast<float*>(dw));
      break;
    case engine::DType::bf16:
      finalize_kernel<__nv_bfloat16><<<grid_for(count, kThreads), kThreads, 0, engine::cuda::stream()>>>(
          ws, splits, count, static_cast<__nv_bfloat16*>(dw));
      break;
    case engine::DType::f16:
      finalize_kernel<__half><<<grid_for(count, kThreads), kThreads, 0, engine::cuda::stream()>>>(
          ws, splits, count, static_cast<__half*>(dw));
      break;
    default: throw engine::Error(engine::str("conv2d_backward_weight: no split-K sum for ", engine::dtype_name(t)));
  }
  ENGINE_CUDA_LAUNCH_CHECK("conv2d_backward_weight (split-K sum)");
}

}  // namespace ops::cuda::conv
