// cuda/conv_depthwise.cu: depthwise convolution (groups == Cin == Cout, one filter [KH, KW] per channel).
// With one input channel per output channel there is no reduction over channels to put on tensor cores:
// each output is KH*KW products, so the kernels are memory-bound and keep the channel dimension (contiguous
// in NHWC) across a warp's lanes for coalesced loads. Two families:
//   tiled (below, the common case: 3x3 / 5x5 / 7x7, stride 1 or 2, even channel counts, f32/bf16/f16): a
//     thread owns a vector of channels and a strip of pixels, so each loaded pixel serves several taps from
//     registers; the weight gradient reads x and dy once per strip instead of once per tap.
//   direct (every other geometry, f64): one thread per output element, taps re-read through L1/L2:
//     forward  one thread per y element (c fastest)
//     data     one thread per dx element; taps whose (h + p - kh*d) is not a multiple of the stride skipped
//     weight   block = 32 channels x 8 pixel lanes for one tap and one split of the output pixels; the 8
//              lanes' sums meet in shared memory and are added in order (deterministic, no atomics).
// With splits > 1 (conv2d_weight_grad_splits) split s of the weight gradient writes ws[s] and
// weight_grad_finalize adds the splits in order.
#include "ops/cuda/conv_kernels.cuh"
#include "ops/cuda/kernel_util.cuh"

namespace ops::cuda::conv {

namespace {

constexpr int kThreads = 256;
constexpr int kPixelLanes = 8;  // weight gradient: threads per channel, each over every 8th pixel

template <typename T>
__global__ void __launch_bounds__(kThreads)
    depthwise_forward_kernel(const Dims d, const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ bias,
                             T* __restrict__ y, int64_t total) {
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
__global__ void __launch_bounds__(kThreads)
    depthwise_data_kernel(const Dims d, const T* __restrict__ dy, const T* __restrict__ w, T* __restrict__ dx,
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
__global__ void __launch_bounds__(32 * kPixelLanes)
    depthwise_weight_kernel(const Dims d, const T* __restrict__ x, const T* __restrict__ dy, Out* __restrict__ out,
                            int64_t per_split) {
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
    if constexpr (std::is_same_v<Out, float> && !std::is_same_v<T, float>)
      o[int64_t(c) * taps + tap] = float(s);
    else
      o[int64_t(c) * taps + tap] = from_acc<Out>(s);
  }
}

// ---------------------------------------------------------------------------------------------------
// Tiled kernels: square filters of 3, 5 or 7 taps, stride 1 or 2, no dilation (NASNet's separable
// convolutions, MobileNet's), f32/bf16/f16 with an even channel count. K, S and the channels per thread V
// are template parameters, so the register arrays below are indexed by constants.
//   Each thread owns V consecutive channels (one 8- or 16-byte load per pixel; a block's lanes cover
//   lanes * V consecutive channels, so a warp's loads are contiguous) and a strip of kStrip outputs along W.
//   forward  per filter row: the input row segment the strip needs, (kStrip - 1) * S + K pixels, is loaded
//            once into registers and reused by every tap of the row; the filter (transposed to [tap][channel],
//            f32) lives in shared memory. x is read about K times from L1/L2, once from DRAM.
//   data     the strip is kStrip pixels of one phase (wx = phase + S * (q0 + j)): every pixel of the strip
//            takes the same taps, and their dy pixels are consecutive, so one dy row segment of
//            kStrip + ceil(K / S) - 1 pixels per filter row serves all of them.
//   weight   a block takes R filter rows (all K for 3x3 / 5x5, one for 7x7: depthwise_weight_rows): each thread keeps
//            their R * K * V sums in registers and walks its share of the strips (per strip the dy strip once,
//            the x row segments as in the forward); the block's pixel rows meet in shared memory and are added
//            in order; split s of the output pixels writes ws[s] (f32), and weight_grad_finalize adds the
//            splits in order. Deterministic: no atomics.
constexpr int kStrip = 4;  // outputs per thread along W
constexpr int kTiledThreads = 256;
// The weight gradient's filter rows per thread, R = depthwise_weight_rows(K) (ops/conv_params.h, which the split
// count reads too): a thread keeps R * K * V sums in registers. All K rows for 3x3 and 5x5 (each dy strip then
// serves every tap); one row for 7x7, whose 49 * V sums would hold the kernel to one block per multiprocessor
// (one row: 7x7 s2 on 96 channels at 165^2, bf16, 0.75 -> 0.48 ms; one row for 3x3 and 5x5 measured slower:
// their dy strips are then loaded K times).
// Its channels per thread, V: 4 for 3x3 (9 * 4 sums) and for 7x7 (one row: 7 * 4), 2 for 5x5 (25 * 2).
constexpr int weight_vector_cap(int k) { return k == 5 ? 2 : 4; }
// The weight gradient's strip: 8 outputs for 5x5 and 7x7 at stride 1 (each x row segment then serves 8 dy
// pixels; measured faster on NASNet's shapes), else 4 (stride 2's segments are twice as long; 3x3 keeps 4
// channels per thread in registers).
constexpr int weight_strip(int k, int s) { return s == 1 && k >= 5 ? 8 : 4; }

// Threads per block along channels: the channel vectors split evenly into blocks of at most 32 lanes (168
// channels in vectors of 4: two blocks of 21 lanes, not 32 + 10).
inline int lanes_for(int channel_vectors) {
  const int blocks = (channel_vectors + 31) / 32;
  return (channel_vectors + blocks - 1) / blocks;
}

// Loads filter taps [0, K*K) of channels [c0, c0 + width) as f32 into sh[tap * width + cc] (0 past C).
template <typename T, int K>
__device__ __forceinline__ void load_filter(const T* __restrict__ w, int C, int c0, int width, float* sh) {
  const int threads = blockDim.x * blockDim.y, me = threadIdx.y * blockDim.x + threadIdx.x;
  for (int i = me; i < K * K * width; i += threads) {
    const int tap = i / width, c = c0 + i % width;
    sh[i] = c < C ? to_acc<float>(w[int64_t(c) * K * K + tap]) : 0.f;
  }
  __syncthreads();
}

// seg[l] = row[(start + l) * C] for l in [0, L), zero where start + l is outside [0, limit). Segments wholly
// inside the row (most of them) load without a test per pixel.
template <int L, int V, typename T>
__device__ __forceinline__ void load_segment(const T* __restrict__ row, int start, int limit, int C,
                                             float (&seg)[L][V]) {
  if (start >= 0 && start + L <= limit) {
#pragma unroll
    for (int l = 0; l < L; l++) load_vec<V>(row + int64_t(start + l) * C, seg[l]);
    return;
  }
#pragma unroll
  for (int l = 0; l < L; l++) {
    const int i = start + l;
    if (i >= 0 && i < limit)
      load_vec<V>(row + int64_t(i) * C, seg[l]);
    else
#pragma unroll
      for (int v = 0; v < V; v++) seg[l][v] = 0.f;
  }
}

// Where strip `strip` of `len` output pixels along W lies: image n, output row ho, first column wo0 (rows of
// ceil(wo / len) strips).
struct StripPosition {
  int64_t n;
  int ho, wo0;
};
__device__ __forceinline__ StripPosition strip_position(int64_t strip, int wo, int len, int ho_count) {
  const int per_row = (wo + len - 1) / len;
  const int64_t q = strip / per_row;
  return {q / ho_count, int(q % ho_count), int(strip % per_row) * len};
}

// grid (strip blocks, ceil(C / (V * blockDim.x))), block (lanes, kTiledThreads / lanes); each block loads its
// channels' filter once and walks strips blockIdx.x * blockDim.y + threadIdx.y, + gridDim.x * blockDim.y, ...
template <typename T, int K, int S, int V>
__global__ void __launch_bounds__(kTiledThreads)
    depthwise_forward_tiled(const Dims d, const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ bias,
                            T* __restrict__ y, int64_t strips) {
  extern __shared__ float filter[];  // [K * K][blockDim.x * V]
  constexpr int L = (kStrip - 1) * S + K;
  const int C = d.cin, width = blockDim.x * V, c0 = blockIdx.y * width;
  load_filter<T, K>(w, C, c0, width, filter);
  const int c = c0 + threadIdx.x * V;
  if (c >= C) return;
  for (int64_t strip = int64_t(blockIdx.x) * blockDim.y + threadIdx.y; strip < strips;
       strip += int64_t(gridDim.x) * blockDim.y) {
    const StripPosition at = strip_position(strip, d.wo, kStrip, d.ho);
    const int64_t n = at.n;
    const int ho = at.ho, wo0 = at.wo0;
    float acc[kStrip][V] = {};
#pragma unroll
    for (int kh = 0; kh < K; kh++) {
      const int hi = ho * S - d.ph + kh;
      if (hi < 0 || hi >= d.h) continue;
      float seg[L][V];
      load_segment(x + (n * d.h + hi) * d.w * C + c, wo0 * S - d.pw, d.w, C, seg);
#pragma unroll
      for (int kw = 0; kw < K; kw++) {
        const float* f = filter + (kh * K + kw) * width + threadIdx.x * V;
#pragma unroll
        for (int j = 0; j < kStrip; j++)
#pragma unroll
          for (int v = 0; v < V; v++) acc[j][v] += seg[j * S + kw][v] * f[v];
      }
    }
    float b[V] = {};
    if (bias) load_vec<V>(bias + c, b);
    T* out = y + ((n * d.ho + ho) * d.wo + wo0) * C + c;
#pragma unroll
    for (int j = 0; j < kStrip; j++) {
      if (wo0 + j >= d.wo) break;
#pragma unroll
      for (int v = 0; v < V; v++) acc[j][v] += b[v];
      store_vec<V>(out + int64_t(j) * C, acc[j]);
    }
  }
}

// Strips of one phase: per dx row, S phases x ceil(ceil(W / S) / kStrip) strips. Grid and block as forward.
template <typename T, int K, int S, int V>
__global__ void __launch_bounds__(kTiledThreads)
    depthwise_data_tiled(const Dims d, const T* __restrict__ dy, const T* __restrict__ w, T* __restrict__ dx,
                         int64_t strips) {
  extern __shared__ float filter[];
  constexpr int M = (K + S - 1) / S;  // taps per filter row that reach one phase (at most)
  constexpr int L = kStrip + M - 1;
  const int C = d.cin, width = blockDim.x * V, c0 = blockIdx.y * width;
  load_filter<T, K>(w, C, c0, width, filter);
  const int c = c0 + threadIdx.x * V;
  if (c >= C) return;
  const int per_phase = ((d.w + S - 1) / S + kStrip - 1) / kStrip;
  for (int64_t strip = int64_t(blockIdx.x) * blockDim.y + threadIdx.y; strip < strips;
       strip += int64_t(gridDim.x) * blockDim.y) {
    int64_t q = strip;
    const int q0 = int(q % per_phase) * kStrip;
    q /= per_phase;
    const int phase = int(q % S);
    q /= S;
    const int hx = int(q % d.h);
    const int64_t n = q / d.h;
    // Pixel j of the strip is wx = phase + S * (q0 + j); tap kw reaches it from dy column (wx + pw - kw) / S
    // when S divides wx + pw - kw, that is for kw = r + S * m with r = (phase + pw) % S, at column
    // base + (M - 1 - m) + j of the segment that starts at base.
    const int a = phase + d.pw, r = a % S;
    const int base = q0 + (a - r) / S - (M - 1);
    float acc[kStrip][V] = {};
#pragma unroll
    for (int kh = 0; kh < K; kh++) {
      const int t = hx + d.ph - kh;
      if (t < 0 || t % S != 0 || t / S >= d.ho) continue;
      float seg[L][V];
      load_segment(dy + (n * d.ho + t / S) * d.wo * C + c, base, d.wo, C, seg);
#pragma unroll
      for (int m = 0; m < M; m++) {
        const int kw = r + S * m;
        if (kw >= K) continue;
        const float* f = filter + (kh * K + kw) * width + threadIdx.x * V;
#pragma unroll
        for (int j = 0; j < kStrip; j++)
#pragma unroll
          for (int v = 0; v < V; v++) acc[j][v] += seg[M - 1 - m + j][v] * f[v];
      }
    }
    T* row = dx + (n * d.h + hx) * d.w * C + c;
#pragma unroll
    for (int j = 0; j < kStrip; j++) {
      const int wx = phase + S * (q0 + j);
      if (wx >= d.w) break;
      store_vec<V>(row + int64_t(wx) * C, acc[j]);
    }
  }
}

// grid (ceil(C / (V * blockDim.x)), splits, K / R), block (lanes, kTiledThreads / lanes): a thread keeps the
// K * V sums of filter rows [blockIdx.z * R, + R) in registers. Split s walks strips [s * per_split,
// (s + 1) * per_split), its pixel rows taking every blockDim.y-th strip.
// out: dw (T) when splits == 1, else ws + split * C * K * K (f32); element (c, tap) at c * K * K + tap.
template <typename T, int K, int S, int V, typename Out>
__global__ void __launch_bounds__(kTiledThreads, 2)
    depthwise_weight_tiled(const Dims d, const T* __restrict__ x, const T* __restrict__ dy, Out* __restrict__ out,
                           int64_t strips, int64_t per_split) {
  extern __shared__ float partial[];  // [blockDim.y][blockDim.x * V]
  constexpr int R = depthwise_weight_rows(K), TW = weight_strip(K, S), L = (TW - 1) * S + K;
  const int C = d.cin, width = blockDim.x * V, kh0 = blockIdx.z * R;
  const int c = blockIdx.x * width + threadIdx.x * V;
  const int64_t begin = blockIdx.y * per_split, end = min(strips, begin + per_split);
  float acc[R * K][V] = {};
  if (c < C) {
    for (int64_t strip = begin + threadIdx.y; strip < end; strip += blockDim.y) {
      const StripPosition at = strip_position(strip, d.wo, TW, d.ho);
      const int hi0 = at.ho * S - d.ph + kh0;
      if (hi0 + R <= 0 || hi0 >= d.h) continue;  // none of the rows is inside the image
      float g[TW][V];
      load_segment(dy + (at.n * d.ho + at.ho) * d.wo * C + c, at.wo0, d.wo, C, g);
#pragma unroll
      for (int r = 0; r < R; r++) {
        const int hi = hi0 + r;
        if (hi < 0 || hi >= d.h) continue;
        float seg[L][V];
        load_segment(x + (at.n * d.h + hi) * d.w * C + c, at.wo0 * S - d.pw, d.w, C, seg);
#pragma unroll
        for (int kw = 0; kw < K; kw++)
#pragma unroll
          for (int j = 0; j < TW; j++)
#pragma unroll
            for (int v = 0; v < V; v++) acc[r * K + kw][v] += g[j][v] * seg[j * S + kw][v];
      }
    }
  }
  Out* o = out + int64_t(blockIdx.y) * C * K * K + kh0 * K;
#pragma unroll
  for (int tap = 0; tap < R * K; tap++) {
#pragma unroll
    for (int v = 0; v < V; v++) partial[threadIdx.y * width + threadIdx.x * V + v] = acc[tap][v];
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
#pragma unroll
      for (int v = 0; v < V; v++) {
        float s = partial[threadIdx.x * V + v];
        for (int k = 1; k < int(blockDim.y); k++) s += partial[k * width + threadIdx.x * V + v];
        o[int64_t(c + v) * K * K + tap] = from_acc<Out>(s);
      }
    }
    __syncthreads();
  }
}

// The tiled kernels' channels per thread for this geometry and dtype, or 0 when they do not apply (the
// direct kernels above run). `most` caps V (the weight gradient keeps K * K * V sums in registers).
int tiled_vector(const Dims& d, engine::DType t, std::initializer_list<const void*> ptrs, int most = 4) {
  if (t != engine::DType::f32 && t != engine::DType::bf16 && t != engine::DType::f16) return 0;
  if (d.kh != d.kw || (d.kh != 3 && d.kh != 5 && d.kh != 7) || d.sh != d.sw || (d.sh != 1 && d.sh != 2)) return 0;
  if (d.dh != 1 || d.dw != 1 || d.ph < 0 || d.pw < 0) return 0;
  const int v = channel_vector(d.cin, engine::dtype_size(t), most, ptrs);
  return v >= 2 ? v : 0;
}

// Calls f(K, S, V) with each as a std::integral_constant, for K in {3, 5, 7}, S in {1, 2}, V in {2, 4}.
template <typename F>
void with_tiled(int k, int s, int v, F&& f) {
  auto with_v = [&](auto K, auto S) {
    if (v == 4)
      f(K, S, std::integral_constant<int, 4>());
    else
      f(K, S, std::integral_constant<int, 2>());
  };
  auto with_s = [&](auto K) {
    if (s == 1)
      with_v(K, std::integral_constant<int, 1>());
    else
      with_v(K, std::integral_constant<int, 2>());
  };
  if (k == 3)
    with_s(std::integral_constant<int, 3>());
  else if (k == 5)
    with_s(std::integral_constant<int, 5>());
  else
    with_s(std::integral_constant<int, 7>());
}

// Grid and block of the forward and data kernels: `strips` strips, channel vectors of V.
struct TiledLaunch {
  dim3 grid, block;
  size_t filter_bytes;
};
TiledLaunch tiled_launch(const Dims& d, int v, int64_t strips) {
  const int lanes = lanes_for(d.cin / v), rows = kTiledThreads / lanes, width = lanes * v;
  const int64_t channel_blocks = (d.cin + width - 1) / width;
  // About 8 blocks per multiprocessor in all, so that each block's filter load serves many strips.
  const int64_t most = std::max<int64_t>(1, int64_t(engine::cuda::multiprocessors()) * 8 / channel_blocks);
  return {dim3(unsigned(std::min<int64_t>((strips + rows - 1) / rows, most)), unsigned(channel_blocks)),
          dim3(lanes, rows), size_t(d.kh) * d.kw * width * sizeof(float)};
}
}  // namespace

void depthwise_forward(const Dims& d, engine::DType t, const void* x, const void* w, const void* bias, void* y) {
  const int64_t total = int64_t(d.n) * d.ho * d.wo * d.cout;
  if (total == 0) return;
  if (const int v = tiled_vector(d, t, {x, y, bias})) {
    const int64_t strips = int64_t(d.n) * d.ho * ((d.wo + kStrip - 1) / kStrip);
    const TiledLaunch l = tiled_launch(d, v, strips);
    ENGINE_CUDA_FLOAT_SWITCH(t, T, {
      if constexpr (!std::is_same_v<T, double>) {
        with_tiled(d.kh, d.sh, v, [&](auto K, auto S, auto V) {
          depthwise_forward_tiled<T, K(), S(), V()><<<l.grid, l.block, l.filter_bytes, engine::cuda::stream()>>>(
              d, static_cast<const T*>(x), static_cast<const T*>(w), static_cast<const T*>(bias), static_cast<T*>(y),
              strips);
        });
      }
    });
    ENGINE_CUDA_LAUNCH_CHECK("conv2d (depthwise forward, tiled)");
    return;
  }
  ENGINE_CUDA_FLOAT_SWITCH(t, T, {
    depthwise_forward_kernel<T><<<grid_for(total, kThreads), kThreads, 0, engine::cuda::stream()>>>(
        d, static_cast<const T*>(x), static_cast<const T*>(w), static_cast<const T*>(bias), static_cast<T*>(y), total);
  });
  ENGINE_CUDA_LAUNCH_CHECK("conv2d (depthwise forward)");
}

void depthwise_data(const Dims& d, engine::DType t, const void* dy, const void* w, void* dx) {
  const int64_t total = int64_t(d.n) * d.h * d.w * d.cin;
  if (total == 0) return;
  if (const int v = tiled_vector(d, t, {dy, dx})) {
    const int64_t strips = int64_t(d.n) * d.h * d.sw * (((d.w + d.sw - 1) / d.sw + kStrip - 1) / kStrip);
    const TiledLaunch l = tiled_launch(d, v, strips);
    ENGINE_CUDA_FLOAT_SWITCH(t, T, {
      if constexpr (!std::is_same_v<T, double>) {
        with_tiled(d.kh, d.sh, v, [&](auto K, auto S, auto V) {
          depthwise_data_tiled<T, K(), S(), V()><<<l.grid, l.block, l.filter_bytes, engine::cuda::stream()>>>(
              d, static_cast<const T*>(dy), static_cast<const T*>(w), static_cast<T*>(dx), strips);
        });
      }
    });
    ENGINE_CUDA_LAUNCH_CHECK("conv2d_backward_data (depthwise, tiled)");
    return;
  }
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
  if (const int v = tiled_vector(d, t, {x, dy}, weight_vector_cap(d.kh))) {
    const int tw = weight_strip(d.kh, d.sh);
    const int64_t strips = int64_t(d.n) * d.ho * ((d.wo + tw - 1) / tw);
    const int64_t per_split = std::max<int64_t>(1, (strips + splits - 1) / splits);
    const int lanes = lanes_for(d.cin / v), rows = kTiledThreads / lanes, width = lanes * v;
    const dim3 grid(unsigned((d.cin + width - 1) / width), unsigned(splits),
                    unsigned(d.kh / depthwise_weight_rows(d.kh)));
    const dim3 block(lanes, rows);
    const size_t shared = size_t(rows) * width * sizeof(float);
    ENGINE_CUDA_FLOAT_SWITCH(t, T, {
      if constexpr (!std::is_same_v<T, double>) {
        with_tiled(d.kh, d.sh, v, [&](auto K, auto S, auto V) {
          if constexpr (V() <= weight_vector_cap(K())) {  // others are never chosen: not compiled
            if (splits == 1) {
              depthwise_weight_tiled<T, K(), S(), V(), T><<<grid, block, shared, engine::cuda::stream()>>>(
                  d, static_cast<const T*>(x), static_cast<const T*>(dy), static_cast<T*>(dw), strips, per_split);
            } else {
              depthwise_weight_tiled<T, K(), S(), V(), float><<<grid, block, shared, engine::cuda::stream()>>>(
                  d, static_cast<const T*>(x), static_cast<const T*>(dy), ws, strips, per_split);
            }
          }
        });
      }
    });
    ENGINE_CUDA_LAUNCH_CHECK("conv2d_backward_weight (depthwise, tiled)");
    if (splits > 1) weight_grad_finalize(t, ws, splits, count, dw);
    return;
  }
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
