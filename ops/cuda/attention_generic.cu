// cuda/attention_generic.cu: flash attention on the CUDA cores, for every case the tensor-core kernels do
// not take: f32 and f64, bf16/f16 with other head dims or layouts, GPUs before sm_80. It is the cpu
// reference's algorithm (ops/cpu/attention.cpp) on 32 x 32 tiles, computing in acc_t (f32, f64 for f64),
// with the same masks, dropout draw and fully-masked-row rules; correctness first, speed second.
//
// Tiling. One block of 256 threads per 32-row tile (query tile for the forward and dQ passes, key tile for
// the dK dV pass). Every tile lives in shared memory as [width][33]: element (row r, column w) at w*33 + r,
// which serves both access patterns without bank conflicts (a thread's 2x2 dot products read columns of
// two tiles; the accumulations read a tile along its rows). Thread (ty, tx) = (tid / 16, tid % 16) owns
// score entries (ty + 16a, tx + 16b), a, b in {0, 1}; a row's softmax reduces over the 16 lanes sharing ty.
// Accumulators (O, dK, dV, dQ) stay in shared memory, so any head dim fits that the shared memory holds:
// 33 * 32 * (3 D + 3 Dv + 2) * sizeof(acc) bytes for the dK dV pass, the largest (D = Dv = 128 in f64:
// 219 KB on an H200; larger head dims are refused with a message).
//
// Bound: shared-memory bandwidth (two loads per FMA pair in the dot products): a few TFLOP/s in f32.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>

#include "engine/cuda/runtime.h"
#include "engine/dtype.h"
#include "ops/cuda/attention_common.cuh"
#include "ops/cuda/kernel_util.cuh"

namespace ops::cuda::attn {

namespace {

constexpr int kTile = 32, kLd = 33, kThreads = 256;

template <typename A> __device__ __forceinline__ A scale_of(const FlashArgs& a);
template <> __device__ __forceinline__ float scale_of<float>(const FlashArgs& a) { return a.scale; }
template <> __device__ __forceinline__ double scale_of<double>(const FlashArgs& a) { return a.scale_f64; }
template <typename A> __device__ __forceinline__ A keep_scale_of(const FlashArgs& a);
template <> __device__ __forceinline__ float keep_scale_of<float>(const FlashArgs& a) { return a.keep_scale; }
template <> __device__ __forceinline__ double keep_scale_of<double>(const FlashArgs& a) { return a.keep_scale_f64; }

// Rows [row0, row0 + 32) x W columns of a strided head into tile[w * 33 + r]; rows past L are zeros.
template <typename T, typename A>
__device__ void load_tile(A* tile, const T* head, int64_t sl, int64_t sd, int row0, int L, int W) {
  for (int idx = threadIdx.x; idx < kTile * W; idx += kThreads) {
    const int r = idx / W, w = idx % W, row = row0 + r;
    tile[w * kLd + r] = row < L ? to_acc<A>(head[int64_t(row) * sl + int64_t(w) * sd]) : A(0);
  }
}

template <typename A>
__device__ void zero_tile(A* tile, int W) {
  for (int idx = threadIdx.x; idx < kTile * W; idx += kThreads) tile[(idx / kTile) * kLd + idx % kTile] = A(0);
}

// out[a][b] = sum_w X(ty + 16a, w) * Y(tx + 16b, w), the sum in order of w like the cpu reference.
template <typename A>
__device__ __forceinline__ void dot2x2(const A* X, const A* Y, int W, int ty, int tx, A (&out)[2][2]) {
  out[0][0] = out[0][1] = out[1][0] = out[1][1] = A(0);
  for (int w = 0; w < W; w++) {
    const A x0 = X[w * kLd + ty], x1 = X[w * kLd + ty + 16], y0 = Y[w * kLd + tx], y1 = Y[w * kLd + tx + 16];
    out[0][0] += x0 * y0;
    out[0][1] += x0 * y1;
    out[1][0] += x1 * y0;
    out[1][1] += x1 * y1;
  }
}

// acc(r, e) = alpha_r * acc(r, e) + sum_c M(r, c) * Y(e, c) for r < 32, e < W, with acc and Y tiles and M a
// [32][33] matrix read as M[r*33 + c], or M[c*33 + r] when kTransposed. alpha nullptr means 1.
template <bool kTransposed, typename A>
__device__ void accumulate(A* acc, const A* M, const A* Y, int W, const A* alpha) {
  for (int idx = threadIdx.x; idx < kTile * W; idx += kThreads) {
    const int r = idx % kTile, e = idx / kTile;
    A sum = 0;
#pragma unroll 8
    for (int c = 0; c < kTile; c++) sum += (kTransposed ? M[c * kLd + r] : M[r * kLd + c]) * Y[e * kLd + c];
    A& out = acc[e * kLd + r];
    out = (alpha ? alpha[r] * out : out) + sum;
  }
}

// Max and sum over the 16 lanes that share a row (lanes 0-15 or 16-31 of a warp).
template <typename A> __device__ __forceinline__ A row16_max(A v) {
  for (int o = 8; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
template <typename A> __device__ __forceinline__ A row16_sum(A v) {
  for (int o = 8; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

template <typename A> __device__ __forceinline__ A dropout_factor(const FlashArgs& a, int bh, int i, int j) {
  if (!a.dropout) return A(1);
  return dropout_keep(a, dropout_index(a, bh, i, j)) ? keep_scale_of<A>(a) : A(0);
}

// ---------------------------------------------------------------------------------------------------
// Forward: one block per (query tile, head).

template <typename T, typename A>
__global__ void __launch_bounds__(kThreads) forward_kernel(const FlashArgs a) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int D = a.D, Dv = a.Dv;
  A* sQ = reinterpret_cast<A*>(smem_raw);  // [D][33]
  A* sK = sQ + D * kLd;                    // [D][33]
  A* sV = sK + D * kLd;                    // [Dv][33]
  A* sO = sV + Dv * kLd;                   // [Dv][33] unnormalized output
  A* sP = sO + Dv * kLd;                   // [32][33] probabilities (row-major)
  A* sM = sP + kTile * kLd;                // [32] running max
  A* sL = sM + kTile;                      // [32] running sum
  A* sAlpha = sL + kTile;                  // [32] this tile's rescale factor

  const int h = blockIdx.y, b = blockIdx.z, bh = b * a.H + h, q0 = int(blockIdx.x) * kTile;
  const int ty = threadIdx.x / 16, tx = threadIdx.x % 16;
  const T* qh = head_rows<T>(a.q, a.qs, b, h);
  const T* kh = head_rows<T>(a.k, a.ks, b, h);
  const T* vh = head_rows<T>(a.v, a.vs, b, h);
  const uint8_t* pad_row = pad_row_of(a, b);
  const A scale = scale_of<A>(a), neg_inf = -INFINITY;

  load_tile<T, A>(sQ, qh, a.qs.l, a.qs.d, q0, a.Lq, D);
  zero_tile<A>(sO, Dv);
  if (threadIdx.x < kTile) {
    sM[threadIdx.x] = neg_inf;
    sL[threadIdx.x] = A(0);
  }
  const int rows = min(kTile, a.Lq - q0);
  const int key_end = visible_keys(a, q0 + rows);
  for (int k0 = 0; k0 < key_end; k0 += kTile) {
    __syncthreads();  // the previous tile's accumulation is done with sK, sV, sP
    load_tile<T, A>(sK, kh, a.ks.l, a.ks.d, k0, a.Lk, D);
    load_tile<T, A>(sV, vh, a.vs.l, a.vs.d, k0, a.Lk, Dv);
    __syncthreads();
    A dots[2][2];
    dot2x2(sQ, sK, D, ty, tx, dots);
#pragma unroll
    for (int ra = 0; ra < 2; ra++) {
      const int r = ty + 16 * ra, i = q0 + r;
      A s[2];
#pragma unroll
      for (int cb = 0; cb < 2; cb++)
        s[cb] = key_visible(a, pad_row, i, k0 + tx + 16 * cb) ? scale * dots[ra][cb] : neg_inf;
      const A m_old = sM[r];
      const A m_new = max(m_old, row16_max(max(s[0], s[1])));
      // As the cpu: a row with every key so far masked adds nothing (alpha 1, P 0).
      A alpha = A(1), p[2] = {A(0), A(0)};
      if (m_new != neg_inf) {
        alpha = exp(m_old - m_new);
        p[0] = exp(s[0] - m_new);
        p[1] = exp(s[1] - m_new);
      }
      const A row_sum = row16_sum(p[0] + p[1]);
#pragma unroll
      for (int cb = 0; cb < 2; cb++)
        sP[r * kLd + tx + 16 * cb] = p[cb] * dropout_factor<A>(a, bh, i, k0 + tx + 16 * cb);
      __syncwarp();  // every lane of the row has read sM[r]
      if (tx == 0) {
        sL[r] = alpha * sL[r] + row_sum;
        sM[r] = m_new;
        sAlpha[r] = alpha;
      }
    }
    __syncthreads();
    accumulate<false>(sO, sP, sV, Dv, sAlpha);
  }
  __syncthreads();
  T* out = static_cast<T*>(a.out) + b * a.outs.b + h * a.outs.h;  // [Lq, Dv], element strides outs.l, outs.d
  for (int idx = threadIdx.x; idx < kTile * Dv; idx += kThreads) {
    const int r = idx / Dv, e = idx % Dv;
    if (q0 + r >= a.Lq) continue;
    const A l = sL[r];
    out[int64_t(q0 + r) * a.outs.l + e * a.outs.d] = from_acc<T>(l == A(0) ? A(0) : sO[e * kLd + r] / l);
  }
  if (threadIdx.x < kTile && q0 + int(threadIdx.x) < a.Lq) {
    const A l = sL[threadIdx.x];
    static_cast<A*>(a.lse)[int64_t(bh) * a.Lq + q0 + threadIdx.x] = l == A(0) ? A(INFINITY) : sM[threadIdx.x] + log(l);
  }
}

// ---------------------------------------------------------------------------------------------------
// Backward. The 2x2 entries of thread (ty, tx) are queries q0 + ty + 16a and keys k0 + tx + 16b in both
// passes; P and dS go to [query][key] matrices sP, sS (dS already times scale, as the cpu adds it).

// P Z and scale * dS of the thread's four entries into sP, sS. sQ, sdO, sK, sV are loaded; lse and delta
// hold the tile's 32 rows.
template <typename A>
__device__ void probabilities_and_ds(const FlashArgs& a, const uint8_t* pad_row, int bh, int q0, int k0,
                                     const A* sQ, const A* sdO, const A* sK, const A* sV, const A* lse,
                                     const A* delta, A* sP, A* sS) {
  const int ty = threadIdx.x / 16, tx = threadIdx.x % 16;
  const A scale = scale_of<A>(a);
  A s[2][2], dp[2][2];
  dot2x2(sQ, sK, a.D, ty, tx, s);
  dot2x2(sdO, sV, a.Dv, ty, tx, dp);
#pragma unroll
  for (int ra = 0; ra < 2; ra++)
#pragma unroll
    for (int cb = 0; cb < 2; cb++) {
      const int r = ty + 16 * ra, c = tx + 16 * cb, i = q0 + r, j = k0 + c;
      A pz = 0, ds = 0;
      if (i < a.Lq && key_visible(a, pad_row, i, j)) {
        const A p = exp(scale * s[ra][cb] - lse[r]);  // 0 when lse = +inf (a row that saw no key)
        const A z = dropout_factor<A>(a, bh, i, j);
        ds = p * (dp[ra][cb] * z - delta[r]);
        pz = p * z;
      }
      sP[r * kLd + c] = pz;
      sS[r * kLd + c] = scale * ds;
    }
}

template <typename A>
__device__ void load_rows(A* dst, const void* src, int64_t bh, int Lq, int i0) {
  if (threadIdx.x < kTile) {
    const int i = i0 + threadIdx.x;
    dst[threadIdx.x] = i < Lq ? static_cast<const A*>(src)[bh * Lq + i] : A(0);
  }
}

// dK, dV: one block per (key tile, head), walking the query tiles that see it.
template <typename T, typename A>
__global__ void __launch_bounds__(kThreads) dkdv_kernel(const FlashArgs a) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int D = a.D, Dv = a.Dv;
  A* sK = reinterpret_cast<A*>(smem_raw);  // [D][33]
  A* sV = sK + D * kLd;                    // [Dv][33]
  A* sQ = sV + Dv * kLd;                   // [D][33]
  A* sdO = sQ + D * kLd;                   // [Dv][33]
  A* sdK = sdO + Dv * kLd;                 // [D][33]
  A* sdV = sdK + D * kLd;                  // [Dv][33]
  A* sP = sdV + Dv * kLd;                  // [32][33]
  A* sS = sP + kTile * kLd;                // [32][33]
  A* sLse = sS + kTile * kLd;              // [32]
  A* sDelta = sLse + kTile;                // [32]

  const int h = blockIdx.y, b = blockIdx.z, bh = b * a.H + h, k0 = int(blockIdx.x) * kTile;
  const T* qh = head_rows<T>(a.q, a.qs, b, h);
  const T* kh = head_rows<T>(a.k, a.ks, b, h);
  const T* vh = head_rows<T>(a.v, a.vs, b, h);
  const T* doh = head_rows<T>(a.dout, a.dos, b, h);
  const uint8_t* pad_row = pad_row_of(a, b);

  load_tile<T, A>(sK, kh, a.ks.l, a.ks.d, k0, a.Lk, D);
  load_tile<T, A>(sV, vh, a.vs.l, a.vs.d, k0, a.Lk, Dv);
  zero_tile<A>(sdK, D);
  zero_tile<A>(sdV, Dv);
  // Causal: query i sees key k0 only from i = k0 - (Lk - Lq) on; start at that query's tile.
  const int first_q = a.causal ? max(0, min(a.Lq, k0 - (a.Lk - a.Lq))) : 0;
  for (int i0 = first_q / kTile * kTile; i0 < a.Lq; i0 += kTile) {
    __syncthreads();
    load_tile<T, A>(sQ, qh, a.qs.l, a.qs.d, i0, a.Lq, D);
    load_tile<T, A>(sdO, doh, a.dos.l, a.dos.d, i0, a.Lq, Dv);
    load_rows<A>(sLse, a.lse, bh, a.Lq, i0);
    load_rows<A>(sDelta, a.delta, bh, a.Lq, i0);
    __syncthreads();
    probabilities_and_ds<A>(a, pad_row, bh, i0, k0, sQ, sdO, sK, sV, sLse, sDelta, sP, sS);
    __syncthreads();
    accumulate<true>(sdV, sP, sdO, Dv, static_cast<const A*>(nullptr));  // dV(j, e) += sum_i PZ(i, j) dO(i, e)
    accumulate<true>(sdK, sS, sQ, D, static_cast<const A*>(nullptr));    // dK(j, d) += sum_i dS(i, j) Q(i, d)
  }
  __syncthreads();
  T* dk = static_cast<T*>(a.dk) + b * a.dks.b + h * a.dks.h;
  T* dv = static_cast<T*>(a.dv) + b * a.dvs.b + h * a.dvs.h;
  for (int idx = threadIdx.x; idx < kTile * D; idx += kThreads) {
    const int j = idx / D, d = idx % D;
    if (k0 + j < a.Lk) dk[int64_t(k0 + j) * a.dks.l + d * a.dks.d] = from_acc<T>(sdK[d * kLd + j]);
  }
  for (int idx = threadIdx.x; idx < kTile * Dv; idx += kThreads) {
    const int j = idx / Dv, e = idx % Dv;
    if (k0 + j < a.Lk) dv[int64_t(k0 + j) * a.dvs.l + e * a.dvs.d] = from_acc<T>(sdV[e * kLd + j]);
  }
}

// dQ: one block per (query tile, head), walking the key tiles it sees.
template <typename T, typename A>
__global__ void __launch_bounds__(kThreads) dq_kernel(const FlashArgs a) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int D = a.D, Dv = a.Dv;
  A* sQ = reinterpret_cast<A*>(smem_raw);  // [D][33]
  A* sdO = sQ + D * kLd;                   // [Dv][33]
  A* sK = sdO + Dv * kLd;                  // [D][33]
  A* sV = sK + D * kLd;                    // [Dv][33]
  A* sdQ = sV + Dv * kLd;                  // [D][33]
  A* sP = sdQ + D * kLd;                   // [32][33] (unused here but filled: one helper for both passes)
  A* sS = sP + kTile * kLd;                // [32][33]
  A* sLse = sS + kTile * kLd;              // [32]
  A* sDelta = sLse + kTile;                // [32]

  const int h = blockIdx.y, b = blockIdx.z, bh = b * a.H + h, q0 = int(blockIdx.x) * kTile;
  const T* qh = head_rows<T>(a.q, a.qs, b, h);
  const T* kh = head_rows<T>(a.k, a.ks, b, h);
  const T* vh = head_rows<T>(a.v, a.vs, b, h);
  const T* doh = head_rows<T>(a.dout, a.dos, b, h);
  const uint8_t* pad_row = pad_row_of(a, b);

  load_tile<T, A>(sQ, qh, a.qs.l, a.qs.d, q0, a.Lq, D);
  load_tile<T, A>(sdO, doh, a.dos.l, a.dos.d, q0, a.Lq, Dv);
  load_rows<A>(sLse, a.lse, bh, a.Lq, q0);
  load_rows<A>(sDelta, a.delta, bh, a.Lq, q0);
  zero_tile<A>(sdQ, D);
  const int rows = min(kTile, a.Lq - q0);
  const int key_end = visible_keys(a, q0 + rows);
  for (int k0 = 0; k0 < key_end; k0 += kTile) {
    __syncthreads();
    load_tile<T, A>(sK, kh, a.ks.l, a.ks.d, k0, a.Lk, D);
    load_tile<T, A>(sV, vh, a.vs.l, a.vs.d, k0, a.Lk, Dv);
    __syncthreads();
    probabilities_and_ds<A>(a, pad_row, bh, q0, k0, sQ, sdO, sK, sV, sLse, sDelta, sP, sS);
    __syncthreads();
    accumulate<false>(sdQ, sS, sK, D, static_cast<const A*>(nullptr));  // dQ(i, d) += sum_j dS(i, j) K(j, d)
  }
  __syncthreads();
  T* dq = static_cast<T*>(a.dq) + b * a.dqs.b + h * a.dqs.h;
  for (int idx = threadIdx.x; idx < kTile * D; idx += kThreads) {
    const int i = idx / D, d = idx % D;
    if (q0 + i < a.Lq) dq[int64_t(q0 + i) * a.dqs.l + d * a.dqs.d] = from_acc<T>(sdQ[d * kLd + i]);
  }
}

// ---------------------------------------------------------------------------------------------------
// Launchers

int max_shared_bytes() {
  static const int bytes = [] {
    int v = 0;
    ENGINE_CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0));
    return v;
  }();
  return bytes;
}

template <typename Kernel>
void launch_tiles(Kernel kernel, const char* what, int tiles, size_t smem, const FlashArgs& a) {
  ENGINE_CHECK(smem <= size_t(max_shared_bytes()), what, ": head dims D = ", a.D, ", Dv = ", a.Dv,
               " need ", smem, " bytes of shared memory per block in the generic cuda kernel, the GPU has ",
               max_shared_bytes());
  if (tiles == 0 || a.B == 0 || a.H == 0) return;
  engine::cuda::set_smem_limit(kernel, int(smem));
  const dim3 grid(unsigned(tiles), unsigned(a.H), unsigned(a.B));
  kernel<<<grid, kThreads, smem, engine::cuda::stream()>>>(a);
  ENGINE_CUDA_LAUNCH_CHECK("flash_attention (generic kernel)");
}

int tiles_of(int L) { return (L + kTile - 1) / kTile; }

}  // namespace

void launch_forward_generic(const FlashArgs& a, int dtype) {
  ENGINE_CUDA_FLOAT_SWITCH(engine::DType(dtype), T, {
    using A = acc_t<T>;
    const size_t smem = sizeof(A) * (size_t(kLd) * (2 * a.D + 2 * a.Dv + kTile) + 3 * kTile);
    launch_tiles(forward_kernel<T, A>, "flash_attention", tiles_of(a.Lq), smem, a);
  });
}

namespace {

// One byte of the keep bits per thread: keys 8 c .. 8 c + 7 of row r (every key below Lk): one Philox block for the
// 8 when the draw's blocks start on 8 keys (dropout_blocks_aligned, as every kept draw's do), else each on its own.
__global__ void keep_bits_kernel(const FlashArgs a, int64_t bytes) {
  const int64_t n = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (n >= bytes) return;
  const int64_t row = n / a.keep_ld, c = n % a.keep_ld;  // row (b H + h) Lq + i
  const uint64_t flat = uint64_t(row) * uint64_t(a.Lk) + uint64_t(8 * c);
  uint32_t v = 0;
  if (dropout_blocks_aligned(a) && 8 * c + 8 <= a.Lk)
    v = dropout_keep_byte(a, flat);
  else
    for (int e = 0; e < 8 && 8 * c + e < a.Lk; e++) v |= uint32_t(dropout_keep(a, flat + uint64_t(e))) << e;
  a.keep_out[n] = uint8_t(v);
}

}  // namespace

void launch_keep_bits(const FlashArgs& a) {
  const int64_t bytes = int64_t(a.B) * a.H * a.Lq * a.keep_ld;
  if (bytes == 0) return;
  keep_bits_kernel<<<unsigned((bytes + 255) / 256), 256, 0, engine::cuda::stream()>>>(a, bytes);
  ENGINE_CUDA_LAUNCH_CHECK("flash_attention (keep bits)");
}

void launch_backward_generic(const FlashArgs& a, int dtype) {
  ENGINE_CUDA_FLOAT_SWITCH(engine::DType(dtype), T, {
    using A = acc_t<T>;
    const size_t dkdv_smem = sizeof(A) * (size_t(kLd) * (3 * a.D + 3 * a.Dv + 2 * kTile) + 2 * kTile);
    const size_t dq_smem = sizeof(A) * (size_t(kLd) * (3 * a.D + 2 * a.Dv + 2 * kTile) + 2 * kTile);
    launch_tiles(dkdv_kernel<T, A>, "flash_attention_backward", tiles_of(a.Lk), dkdv_smem, a);
    launch_tiles(dq_kernel<T, A>, "flash_attention_backward", tiles_of(a.Lq), dq_smem, a);
  });
}

}  // namespace ops::cuda::attn
