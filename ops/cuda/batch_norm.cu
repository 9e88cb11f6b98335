// cuda/batch_norm.cu: batch norm forward (column statistics + finalize + normalize) and backward (column
// sums + finalize + dx) over a contiguous x [M, C], channels innermost (NHWC).
//
// Every kernel but the two finalizes has the same thread mapping: a thread owns one 16-byte vector of VEC
// consecutive channels (4 f32, 8 bf16/f16, 2 f64; VEC = 1 when C % VEC != 0 or a pointer is unaligned) and
// walks rows, so each load is 16 bytes, a warp's loads cover whole 32-byte sectors, and the per-channel values
// (mean, invstd, weight, bias, sums) are loaded once per thread instead of once per element. A block is
// tile vector columns x lanes row lanes; each thread issues kUnroll rows' loads before using them.
//
// Column reductions (the statistics; sum g and sum g xhat) are deterministic and use no atomics. The M rows
// are cut into the op's P fixed chunks (ops::batch_norm_chunks, the workspace's first dimension); one block
// per (column tile, chunk). The tile width is chosen from the shape alone (a constant target block count,
// never the GPU's), so that small C still gives ~kTargetBlocks blocks; the lanes of a block are combined by a
// fixed tree through shared memory and written to workspace[b]. Finalize kernels then combine the P
// partials: the statistics in chunk order, as the cpu does (their rounding matters, see
// batch_norm_finalize_stats), the sums by lanes and a fixed tree. Statistics use Welford's update per lane
// (one reciprocal per row shared by the VEC channels) and Chan et al.'s pairwise formula to combine lanes
// and chunks (no cancellation, unlike sum and sum of squares).
//
// Measured on the H200 (2026-11-30, tests/ops/batch_norm_cuda_test.cpp's DISABLED_Bandwidth, bytes of x
// counted per pass: forward 3, backward 5), deeplabv3's shapes [8, 257^2 | 129^2 | 65^2, C], TB/s
// forward / backward: this file as it is, f32 1.9-3.5 / 2.9-4.1 (the old one-thread-per-channel layout:
// 0.9-2.2 / 2.4-3.4), bf16 at 257^2 x 64 2.4 / 3.3 (was 1.3 / 1.9; the other bf16 shapes were measured only with
// a tree finalize: 1.7-3.2 / 2.3-3.6, was 0.6-1.3 / 1.1-1.9). Lowest at 65^2 x 256 and 129^2 x 64, where a
// pass moves 17-35 MB and the launches and finalize show. A bf16 deeplabv3 step (torchvision size, 8 x 513^2)
// went from 92.0 to 68.7 ms. 2026-12-04: the finalize's chain no longer waits on shared-memory loads (bf16
// 65^2 x 256 forward 35.6 -> 30.5 us); with a residual and ReLU, bf16 forward / backward 1.8-3.4 / 2.4-4.2 TB/s
// (4 and 7 passes). ncu (deeplabv3 bf16 step): the column kernels use 64 (stats) and 76-95 (sums) registers,
// so at 1064 blocks they run 2-4 waves with a nearly empty last one; the dx kernel 106-119.
#include "ops/cuda/batch_norm.h"
#include "ops/cuda/kernel_util.cuh"

#include <algorithm>

namespace ops::cuda {

using engine::Tensor;

namespace {

constexpr int kUnroll = 4;            // row vectors whose loads a thread issues together (8: no faster)
constexpr int kEwUnroll = 4;          // the same, elementwise kernels (2: slower)
constexpr int kTargetBlocks = 1024;   // column blocks wanted per reduction pass (2048: slower)
constexpr int kMinTile = 8;           // narrowest column tile, in vectors (128 bytes of f32)
constexpr int kMaxColumnThreads = 512;  // column kernels: 256 threads, 512 when blocks are few
constexpr int kElementwiseThreads = 256;
constexpr int kFinalizeTile = 32, kFinalizeLanes = 32;  // finalize blocks: 32 channels x 32 chunk lanes
constexpr int kFinalizeLoads = 8;                        // chunk partials a finalize lane loads together

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Rows [begin, end) of chunk b (the cpu reference's chunk_rows).
__device__ __forceinline__ void chunk_rows(int64_t M, int64_t chunks, int64_t b, int64_t& begin, int64_t& end) {
  const int64_t per = (M + chunks - 1) / chunks;
  begin = min(M, b * per);
  end = min(M, (b + 1) * per);
}

// (n_a, mean_a, m2_a) += (n_b, mean_b, m2_b), Chan et al., for V channels that share their counts.
template <int V, typename A>
__device__ __forceinline__ void chan_combine(A& na, A (&ma)[V], A (&m2a)[V], A nb, const A (&mb)[V],
                                             const A (&m2b)[V]) {
  if (nb == A(0)) return;
  const A nt = na + nb, wb = nb / nt, wab = na * nb / nt;
#pragma unroll
  for (int j = 0; j < V; j++) {
    const A delta = mb[j] - ma[j];
    ma[j] += delta * wb;
    m2a[j] += m2b[j] + delta * delta * wab;
  }
  na = nt;
}

template <typename T, int VEC> __device__ __forceinline__ Vec<T, VEC> load_raw(const T* p) {
  return *reinterpret_cast<const Vec<T, VEC>*>(p);
}


// The lanes of a column block combined by a fixed tree: at step s, lane ty (a multiple of 2s) absorbs lane
// ty + s. `values` holds each thread's NV accumulators as [NV][threads] (consecutive threads, consecutive
// words: no bank conflicts); `merge(other_index)` folds the values of thread `other_index` into the
// caller's registers, `publish()` writes them back. On return lane 0 holds the block's result.
template <typename Merge, typename Publish>
__device__ __forceinline__ void lane_tree(int tile, int lanes, Merge&& merge, Publish&& publish) {
  const int tx = threadIdx.x, ty = threadIdx.y, t = ty * tile + tx;
  publish();
  for (int s = 1; s < lanes; s <<= 1) {
    __syncthreads();
    if ((ty & (2 * s - 1)) == 0 && ty + s < lanes) {
      merge(t + s * tile);
      publish();
    }
  }
}

// ---------------------------------------------------------------------------------------------------
// Forward

// Chunk statistics: workspace[b] = (chunk mean [C], chunk M2 [C]). Grid (column tiles, P), block tile x
// lanes; dynamic shared memory (1 + 2 VEC) threads values. Bytes: one read of x; bound: memory.
template <typename T, int VEC>
__global__ void __launch_bounds__(kMaxColumnThreads)
    batch_norm_chunk_stats(const T* __restrict__ x, int64_t M, int64_t C, int64_t chunks, acc_t<T>* __restrict__ ws) {
  using A = acc_t<T>;
  extern __shared__ __align__(16) unsigned char smem[];
  const int tile = blockDim.x, lanes = blockDim.y, threads = tile * lanes;
  const int tx = threadIdx.x, ty = threadIdx.y, t = ty * tile + tx;
  A* s_n = reinterpret_cast<A*>(smem);  // [threads]
  A* s_m = s_n + threads;               // [VEC][threads]
  A* s_m2 = s_m + VEC * threads;        // [VEC][threads]
  const int64_t cols = C / VEC, col = int64_t(blockIdx.x) * tile + tx, b = blockIdx.y;
  int64_t begin, end;
  chunk_rows(M, chunks, b, begin, end);
  A n = 0, m[VEC], m2[VEC];
#pragma unroll
  for (int j = 0; j < VEC; j++) m[j] = m2[j] = A(0);
  // Welford's update; 1 / n does not depend on the data and is shared by the VEC channels.
  auto add = [&](const Vec<T, VEC>& v) {
    n += A(1);
    const A inv_n = A(1) / n;
#pragma unroll
    for (int j = 0; j < VEC; j++) {
      const A xv = to_acc<A>(v.v[j]), d = xv - m[j];
      m[j] += d * inv_n;
      m2[j] += d * (xv - m[j]);
    }
  };
  if (col < cols) {
    const T* p = x + col * VEC;
    int64_t r = begin + ty;
    for (; r + (kUnroll - 1) * lanes < end; r += kUnroll * lanes) {
      Vec<T, VEC> v[kUnroll];
#pragma unroll
      for (int k = 0; k < kUnroll; k++) v[k] = load_raw<T, VEC>(p + (r + k * lanes) * C);
#pragma unroll
      for (int k = 0; k < kUnroll; k++) add(v[k]);
    }
    for (; r < end; r += lanes) add(load_raw<T, VEC>(p + r * C));
  }
  lane_tree(
      tile, lanes,
      [&](int o) {
        A mb[VEC], m2b[VEC];
#pragma unroll
        for (int j = 0; j < VEC; j++) {
          mb[j] = s_m[j * threads + o];
          m2b[j] = s_m2[j * threads + o];
        }
        chan_combine<VEC>(n, m, m2, s_n[o], mb, m2b);
      },
      [&] {
        s_n[t] = n;
#pragma unroll
        for (int j = 0; j < VEC; j++) {
          s_m[j * threads + t] = m[j];
          s_m2[j * threads + t] = m2[j];
        }
      });
  if (ty != 0 || col >= cols) return;
  A* out = ws + b * 2 * C + col * VEC;
#pragma unroll
  for (int j = 0; j < VEC; j++) {
    out[j] = m[j];
    out[C + j] = m2[j];
  }
}

// x * y and x + y rounded once each (no contraction into an fma): the chunk-order combination below repeats
// the cpu reference's operations, so that its rounding follows the same path (see batch_norm_finalize_stats).
__device__ __forceinline__ float mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double mul_rn(double a, double b) { return __dmul_rn(a, b); }
__device__ __forceinline__ float add_rn(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ double add_rn(double a, double b) { return __dadd_rn(a, b); }

// Block 32 channels, 1024 threads. The chunk partials are combined in chunk order, as ops/batch_norm.h
// promises and the cpu does (Chan et al.): the mean's rounding, which the column sums of the backward pass
// multiply by ~M (dweight = sum g xhat), then follows the cpu's path; a tree order would round differently
// (measured on the H200: f16 dweight off by 0.1 at M = 70000 against the cpu). Per segment of up to
// kFinalizeSegment<A> chunks, all warps stage the partials [segment][32 channels] (coalesced) and the
// chunk weights n_b / n_t and n_a n_b / n_t (functions of the counts alone) in shared memory; then warp 0,
// one lane per channel, runs the sequential update from shared memory.
template <typename A> constexpr int kFinalizeSegment = 40960 / int(2 * kFinalizeTile * sizeof(A) + 2 * sizeof(A));
constexpr int kFinalizeGroup = 8;  // chunks whose partials warp 0 loads before combining them
constexpr int kFinalizeThreads = 1024;

template <typename A>
__global__ void __launch_bounds__(kFinalizeThreads)
    batch_norm_finalize_stats(const A* __restrict__ ws, int64_t M, int64_t C, int64_t chunks, A eps, A momentum,
                              A* __restrict__ mean, A* __restrict__ invstd, A* __restrict__ running_mean,
                              A* __restrict__ running_var) {
  constexpr int kSeg = kFinalizeSegment<A>;
  __shared__ A s_m[kSeg][kFinalizeTile], s_m2[kSeg][kFinalizeTile], s_wb[kSeg], s_wab[kSeg];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const int64_t c = int64_t(blockIdx.x) * kFinalizeTile + lane;
  A m = 0, m2 = 0;
  for (int64_t b0 = 0; b0 < chunks; b0 += kSeg) {
    const int seg = int(min(int64_t(kSeg), chunks - b0));
    if (b0 > 0) __syncthreads();  // warp 0 is done with the previous segment
#pragma unroll 4
    for (int k = warp; k < seg; k += warps) {
      const int64_t b = b0 + k;
      s_m[k][lane] = c < C ? ws[b * 2 * C + c] : A(0);
      s_m2[k][lane] = c < C ? ws[b * 2 * C + C + c] : A(0);
    }
    for (int k = threadIdx.x; k < seg; k += blockDim.x) {
      int64_t begin, end;
      chunk_rows(M, chunks, b0 + k, begin, end);
      const A na = A(begin), nb = A(end - begin), nt = na + nb;  // the cpu's running count before chunk b
      s_wb[k] = nb > A(0) ? nb / nt : A(0);
      s_wab[k] = nb > A(0) ? na * nb / nt : A(0);
    }
    __syncthreads();
    if (warp == 0) {
      // A group's partials and weights are loaded into registers before its updates, so that the chain of
      // dependent updates waits on no shared-memory load (with the loads inside it this kernel took ~16 us).
      for (int k0 = 0; k0 < seg; k0 += kFinalizeGroup) {
        A pm[kFinalizeGroup], pm2[kFinalizeGroup], wb[kFinalizeGroup], wab[kFinalizeGroup];
#pragma unroll
        for (int j = 0; j < kFinalizeGroup; j++) {
          const int k = min(k0 + j, seg - 1);
          pm[j] = s_m[k][lane], pm2[j] = s_m2[k][lane], wb[j] = s_wb[k], wab[j] = s_wab[k];
        }
#pragma unroll
        for (int j = 0; j < kFinalizeGroup; j++) {
          const A delta = add_rn(pm[j], -m);
          const A nm = add_rn(m, mul_rn(delta, wb[j]));
          const A nm2 = add_rn(m2, add_rn(pm2[j], mul_rn(mul_rn(delta, delta), wab[j])));
          if (k0 + j < seg && wb[j] != A(0)) m = nm, m2 = nm2;  // an empty chunk: skipped, as the cpu does
        }
      }
    }
  }
  if (warp != 0 || c >= C) return;
  mean[c] = m;
  invstd[c] = A(1) / std::sqrt(m2 / A(M) + eps);
  if (running_mean) {
    running_mean[c] = (A(1) - momentum) * running_mean[c] + momentum * m;
    running_var[c] = (A(1) - momentum) * running_var[c] + momentum * (m2 / A(M - 1));
  }
}

template <typename A>
__global__ void __launch_bounds__(kElementwiseThreads)
    batch_norm_running_stats_kernel(const A* __restrict__ rm, const A* __restrict__ rv, int64_t C, A eps,
                                    A* __restrict__ mean, A* __restrict__ invstd) {
  const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= C) return;
  mean[c] = rm[c];
  invstd[c] = A(1) / std::sqrt(rv[c] + eps);
}

// Where the backward finds the fused activation's derivative: none (no activation), at p recomputed from x, weight
// and bias, or at the forward's output y (an activation after a residual add; y > 0 exactly where p + residual > 0).
enum ActFrom : int { kNoAct = 0, kActFromX = 1, kActFromY = 2 };

// The fused activation (ops/batch_norm.h's NormActivation) at p, and its derivative: slope 1 is none.
template <typename A>
__device__ __forceinline__ A activate(A p, A slope) {
  return p > A(0) ? p : slope * p;
}
template <typename A>
__device__ __forceinline__ A activation_grad(A p, A slope) {
  return p > A(0) ? A(1) : slope;
}

// y = act((x - mean[c]) (invstd[c] w[c]) + b[c] (+ residual)). Grid (column tiles, row blocks), block tile x lanes;
// a thread keeps its VEC channels' mean, scale and shift in registers and walks rows with a grid stride.
// Bytes: read x (and the residual), write y; bound: memory.
template <typename T, int VEC, bool kRes>
__global__ void __launch_bounds__(kElementwiseThreads)
    batch_norm_normalize_kernel(const T* __restrict__ x, const acc_t<T>* __restrict__ mean,
                                const acc_t<T>* __restrict__ invstd, const T* __restrict__ w, int64_t sw,
                                const T* __restrict__ bias, int64_t sb, const T* __restrict__ res, T* __restrict__ y,
                                int64_t M, int64_t C, acc_t<T> slope) {
  using A = acc_t<T>;
  const int64_t cols = C / VEC, col = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (col >= cols) return;
  A mu[VEC], scale[VEC], shift[VEC];
#pragma unroll
  for (int j = 0; j < VEC; j++) {
    const int64_t c = col * VEC + j;
    mu[j] = mean[c];
    scale[j] = invstd[c] * load_or(w, c * sw, A(1));
    shift[j] = load_or(bias, c * sb, A(0));
  }
  const T* px = x + col * VEC;
  const T* pres = kRes ? res + col * VEC : nullptr;
  T* py = y + col * VEC;
  auto apply = [&](const Vec<T, VEC>& v, const Vec<T, VEC>& rv, int64_t row) {
    Vec<T, VEC> o;
#pragma unroll
    for (int j = 0; j < VEC; j++) {
      A p = (to_acc<A>(v.v[j]) - mu[j]) * scale[j] + shift[j];
      if constexpr (kRes) p += to_acc<A>(rv.v[j]);
      o.v[j] = from_acc<T>(activate(p, slope));
    }
    *reinterpret_cast<Vec<T, VEC>*>(py + row * C) = o;
  };
  auto load_res = [&](int64_t row) {
    if constexpr (kRes)
      return load_raw<T, VEC>(pres + row * C);
    else
      return Vec<T, VEC>{};
  };
  const int64_t step = int64_t(gridDim.y) * blockDim.y;
  int64_t r = int64_t(blockIdx.y) * blockDim.y + threadIdx.y;
  for (; r + (kEwUnroll - 1) * step < M; r += kEwUnroll * step) {
    Vec<T, VEC> v[kEwUnroll], rv[kEwUnroll];
#pragma unroll
    for (int k = 0; k < kEwUnroll; k++) {
      v[k] = load_raw<T, VEC>(px + (r + k * step) * C);
      rv[k] = load_res(r + k * step);
    }
#pragma unroll
    for (int k = 0; k < kEwUnroll; k++) apply(v[k], rv[k], r + k * step);
  }
  for (; r < M; r += step) apply(load_raw<T, VEC>(px + r * C), load_res(r), r);
}

// ---------------------------------------------------------------------------------------------------
// Backward

// Chunk column sums: workspace[b] = (sum g [C], sum g xhat [C]), the latter as invstd sum g (x - mean); with an
// activation, g times its derivative: at the normalization's output recomputed from x as the normalize kernel
// computed it (kActFromX), or at y (kActFromY; that product g' is then also written to dr when dr is given, for
// the residual and for the dx pass). Grid and block as batch_norm_chunk_stats; dynamic shared memory 2 VEC threads
// values. Bytes: one read of g and x (and y; a write of dr); bound: memory.
template <typename T, int VEC, int kAct>
__global__ void __launch_bounds__(kMaxColumnThreads)
    batch_norm_chunk_sums(const T* __restrict__ g, const T* __restrict__ x, const T* __restrict__ y,
                          const acc_t<T>* __restrict__ mean, const acc_t<T>* __restrict__ invstd,
                          const T* __restrict__ w, int64_t sw, const T* __restrict__ bias, int64_t sb, acc_t<T> slope,
                          int64_t M, int64_t C, int64_t chunks, acc_t<T>* __restrict__ ws, T* __restrict__ dr) {
  using A = acc_t<T>;
  extern __shared__ __align__(16) unsigned char smem[];
  const int tile = blockDim.x, lanes = blockDim.y, threads = tile * lanes;
  const int tx = threadIdx.x, ty = threadIdx.y, t = ty * tile + tx;
  A* s_g = reinterpret_cast<A*>(smem);  // [VEC][threads]
  A* s_gd = s_g + VEC * threads;        // [VEC][threads]
  const int64_t cols = C / VEC, col = int64_t(blockIdx.x) * tile + tx, b = blockIdx.y;
  int64_t begin, end;
  chunk_rows(M, chunks, b, begin, end);
  A sg[VEC], sgd[VEC], mu[VEC], scale[VEC], shift[VEC];
#pragma unroll
  for (int j = 0; j < VEC; j++) sg[j] = sgd[j] = mu[j] = scale[j] = shift[j] = A(0);
  T* pdr = kAct == kActFromY && dr ? dr + col * VEC : nullptr;
  auto add = [&](const Vec<T, VEC>& gv, const Vec<T, VEC>& xv, const Vec<T, VEC>& yv, int64_t row) {
    Vec<T, VEC> o{};  // g' (kActFromY)
#pragma unroll
    for (int j = 0; j < VEC; j++) {
      const A xc = to_acc<A>(xv.v[j]) - mu[j];
      A gj = to_acc<A>(gv.v[j]);
      if constexpr (kAct == kActFromX) gj *= activation_grad(xc * scale[j] + shift[j], slope);
      if constexpr (kAct == kActFromY) gj *= activation_grad(to_acc<A>(yv.v[j]), slope), o.v[j] = from_acc<T>(gj);
      sg[j] += gj;
      sgd[j] += gj * xc;
    }
    if (kAct == kActFromY && pdr) *reinterpret_cast<Vec<T, VEC>*>(pdr + row * C) = o;
  };
  if (col < cols) {
#pragma unroll
    for (int j = 0; j < VEC; j++) {
      const int64_t c = col * VEC + j;
      mu[j] = mean[c];
      if constexpr (kAct == kActFromX)
        scale[j] = invstd[c] * load_or(w, c * sw, A(1)), shift[j] = load_or(bias, c * sb, A(0));
    }
    const T* pg = g + col * VEC;
    const T* px = x + col * VEC;
    const T* py = kAct == kActFromY ? y + col * VEC : nullptr;
    auto load_y = [&](int64_t row) {
      if constexpr (kAct == kActFromY)
        return load_raw<T, VEC>(py + row * C);
      else
        return Vec<T, VEC>{};
    };
    int64_t r = begin + ty;
    for (; r + (kUnroll - 1) * lanes < end; r += kUnroll * lanes) {
      Vec<T, VEC> gv[kUnroll], xv[kUnroll], yv[kUnroll];
#pragma unroll
      for (int k = 0; k < kUnroll; k++) {
        gv[k] = load_raw<T, VEC>(pg + (r + k * lanes) * C);
        xv[k] = load_raw<T, VEC>(px + (r + k * lanes) * C);
        yv[k] = load_y(r + k * lanes);
      }
#pragma unroll
      for (int k = 0; k < kUnroll; k++) add(gv[k], xv[k], yv[k], r + k * lanes);
    }
    for (; r < end; r += lanes) add(load_raw<T, VEC>(pg + r * C), load_raw<T, VEC>(px + r * C), load_y(r), r);
  }
  lane_tree(
      tile, lanes,
      [&](int o) {
#pragma unroll
        for (int j = 0; j < VEC; j++) {
          sg[j] += s_g[j * threads + o];
          sgd[j] += s_gd[j * threads + o];
        }
      },
      [&] {
#pragma unroll
        for (int j = 0; j < VEC; j++) {
          s_g[j * threads + t] = sg[j];
          s_gd[j * threads + t] = sgd[j];
        }
      });
  if (ty != 0 || col >= cols) return;
  A* out = ws + b * 2 * C + col * VEC;
#pragma unroll
  for (int j = 0; j < VEC; j++) {
    out[j] = sg[j];
    out[C + j] = sgd[j] * invstd[col * VEC + j];
  }
}

// Block 32 channels x 32 chunk lanes: lane ty adds chunks ty, ty + 32, ... in order (loads issued
// kFinalizeLoads at a time), then the lanes by a fixed tree (sums round benignly, unlike the mean).
// dweight, dbias written, and the totals kept in workspace[0] for the dx pass (chunk 0 is read only by
// lane 0 of the channel's block, before that lane writes the totals).
template <typename T>
__global__ void __launch_bounds__(kFinalizeTile * kFinalizeLanes)
    batch_norm_finalize_sums(acc_t<T>* __restrict__ ws, int64_t C, int64_t chunks, T* __restrict__ dw,
                             int64_t sdw, T* __restrict__ db, int64_t sdb) {
  using A = acc_t<T>;
  __shared__ A s_g[kFinalizeLanes * kFinalizeTile], s_gx[kFinalizeLanes * kFinalizeTile];
  const int tx = threadIdx.x, ty = threadIdx.y, t = ty * kFinalizeTile + tx;
  const int64_t c = int64_t(blockIdx.x) * kFinalizeTile + tx;
  A sg = 0, sgx = 0;
  if (c < C) {
    for (int64_t b0 = ty; b0 < chunks; b0 += int64_t(kFinalizeLanes) * kFinalizeLoads) {
      A pg[kFinalizeLoads], pgx[kFinalizeLoads];
#pragma unroll
      for (int k = 0; k < kFinalizeLoads; k++) {
        const int64_t b = b0 + int64_t(k) * kFinalizeLanes;
        pg[k] = b < chunks ? ws[b * 2 * C + c] : A(0);
        pgx[k] = b < chunks ? ws[b * 2 * C + C + c] : A(0);
      }
#pragma unroll
      for (int k = 0; k < kFinalizeLoads; k++) {
        sg += pg[k];
        sgx += pgx[k];
      }
    }
  }
  lane_tree(
      kFinalizeTile, kFinalizeLanes,
      [&](int o) {
        sg += s_g[o];
        sgx += s_gx[o];
      },
      [&] {
        s_g[t] = sg;
        s_gx[t] = sgx;
      });
  if (ty != 0 || c >= C) return;
  ws[c] = sg;
  ws[C + c] = sgx;
  if (dw) dw[c * sdw] = from_acc<T>(sgx);
  if (db) db[c * sdb] = from_acc<T>(sg);
}

// dx = invstd w (g - sum_g / M - xhat sum_gxhat / M) (batch statistics; sums = workspace[0]), or
// dx = invstd w g (running statistics; sums unused); with an activation, g times its derivative as in the chunk
// sums (kActFromY writes that product to dr when dr is given). Grid and block as the normalize kernel; a thread
// keeps its channels' coefficients in registers; dx may be null (only dr wanted). Bytes: read g (and x, y), write
// dx (and dr); bound: memory.
template <typename T, int VEC, int kAct>
__global__ void __launch_bounds__(kElementwiseThreads)
    batch_norm_dx_kernel(const T* __restrict__ g, const T* __restrict__ x, const T* __restrict__ y,
                         const T* __restrict__ w, int64_t sw, const T* __restrict__ bias, int64_t sb, acc_t<T> slope,
                         const acc_t<T>* __restrict__ mean, const acc_t<T>* __restrict__ invstd,
                         const acc_t<T>* __restrict__ sums, T* __restrict__ dx, T* __restrict__ dr, int64_t M,
                         int64_t C) {
  using A = acc_t<T>;
  const int64_t cols = C / VEC, col = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (col >= cols) return;
  // dx = a ((g - mg) - (x - mu) k): a = invstd w, mg = sum_g / M, k = invstd sum_gxhat / M.
  A a[VEC], mg[VEC], mu[VEC], k[VEC], shift[VEC];
#pragma unroll
  for (int j = 0; j < VEC; j++) {
    const int64_t c = col * VEC + j;
    a[j] = invstd[c] * load_or(w, c * sw, A(1));
    shift[j] = kAct == kActFromX ? load_or(bias, c * sb, A(0)) : A(0);
    mu[j] = mean[c];
    mg[j] = sums ? sums[c] / A(M) : A(0);
    k[j] = sums ? invstd[c] * (sums[C + c] / A(M)) : A(0);
  }
  const T* pg = g + col * VEC;
  const T* px = x + col * VEC;
  const T* py = kAct == kActFromY ? y + col * VEC : nullptr;
  T* pdx = dx ? dx + col * VEC : nullptr;
  T* pdr = kAct == kActFromY && dr ? dr + col * VEC : nullptr;
  const bool batch = sums != nullptr;
  auto apply = [&](const Vec<T, VEC>& gv, const Vec<T, VEC>& xv, const Vec<T, VEC>& yv, int64_t row) {
    Vec<T, VEC> o, og{};  // dx, g' (kActFromY)
#pragma unroll
    for (int j = 0; j < VEC; j++) {
      const A xc = to_acc<A>(xv.v[j]) - mu[j];
      A gj = to_acc<A>(gv.v[j]);
      if constexpr (kAct == kActFromX) gj *= activation_grad(xc * a[j] + shift[j], slope);
      if constexpr (kAct == kActFromY) gj *= activation_grad(to_acc<A>(yv.v[j]), slope), og.v[j] = from_acc<T>(gj);
      o.v[j] = from_acc<T>(batch ? a[j] * ((gj - mg[j]) - xc * k[j]) : gj * a[j]);
    }
    if (pdx) *reinterpret_cast<Vec<T, VEC>*>(pdx + row * C) = o;
    if (kAct == kActFromY && pdr) *reinterpret_cast<Vec<T, VEC>*>(pdr + row * C) = og;
  };
  const bool need_x = batch || kAct == kActFromX;
  Vec<T, VEC> none{};
  auto load_x = [&](int64_t row) { return need_x ? load_raw<T, VEC>(px + row * C) : none; };
  auto load_y = [&](int64_t row) { return kAct == kActFromY ? load_raw<T, VEC>(py + row * C) : none; };
  const int64_t step = int64_t(gridDim.y) * blockDim.y;
  int64_t r = int64_t(blockIdx.y) * blockDim.y + threadIdx.y;
  for (; r + (kEwUnroll - 1) * step < M; r += kEwUnroll * step) {
    Vec<T, VEC> gv[kEwUnroll], xv[kEwUnroll], yv[kEwUnroll];
#pragma unroll
    for (int q = 0; q < kEwUnroll; q++) {
      gv[q] = load_raw<T, VEC>(pg + (r + q * step) * C);
      xv[q] = load_x(r + q * step);
      yv[q] = load_y(r + q * step);
    }
#pragma unroll
    for (int q = 0; q < kEwUnroll; q++) apply(gv[q], xv[q], yv[q], r + q * step);
  }
  for (; r < M; r += step) apply(load_raw<T, VEC>(pg + r * C), load_x(r), load_y(r), r);
}

// ---------------------------------------------------------------------------------------------------
// Launch shapes

// Calls f(std::integral_constant<int, VEC>) with the widest VEC the layout allows (C % VEC == 0, aligned
// pointers), else 1.
template <typename T, typename F> void with_channel_vec(int64_t C, std::initializer_list<const void*> ptrs, F&& f) {
  constexpr int V = vec16<T>();
  bool aligned = C % V == 0;
  for (const void* p : ptrs)
    if (p && !aligned16(p)) aligned = false;
  if (aligned) f(std::integral_constant<int, V>{});
  else f(std::integral_constant<int, 1>{});
}

// Column blocks of the reductions: tile vector columns (32, halved down to 8 while fewer than kTargetBlocks
// blocks would cover the (tiles, chunks) grid) x lanes row lanes (256 threads, 512 when blocks stay few, so
// more loads are in flight). A function of the shape alone: the lanes' partition, and so the rounding, is the
// same on any GPU.
struct ColumnBlocks {
  dim3 grid, block;
  size_t threads() const { return size_t(block.x) * block.y; }
};
ColumnBlocks column_blocks(int64_t cols, int64_t chunks) {
  int64_t tile = 32;
  while (tile > kMinTile && ceil_div(cols, tile) * chunks < kTargetBlocks) tile /= 2;
  tile = std::min(tile, cols);
  const int64_t tiles = ceil_div(cols, tile);
  const int64_t threads = tiles * chunks >= kTargetBlocks / 2 ? 256 : kMaxColumnThreads;
  return {dim3(unsigned(tiles), unsigned(chunks)),
          dim3(unsigned(tile), unsigned(std::max<int64_t>(1, threads / tile)))};
}

// Elementwise blocks: 32 vector columns (fewer when C is narrow) x the rest of 256 threads in rows; row blocks
// up to ~8 resident blocks per SM in all (grid stride beyond).
ColumnBlocks elementwise_blocks(int64_t cols, int64_t M) {
  const int64_t tile = std::min<int64_t>(32, cols), lanes = std::max<int64_t>(1, kElementwiseThreads / tile);
  const int64_t tiles = ceil_div(cols, tile);
  const int64_t cap = std::max<int64_t>(1, int64_t(engine::cuda::multiprocessors()) * 8 / tiles);
  const int64_t rows = std::min<int64_t>({ceil_div(M, lanes * kEwUnroll), cap, 65535});
  return {dim3(unsigned(tiles), unsigned(std::max<int64_t>(1, rows))), dim3(unsigned(tile), unsigned(lanes))};
}

void check_workspace(const char* op, const Tensor& ws, int64_t C) {
  ENGINE_CHECK(ws.defined() && ws.dim() == 3 && ws.size(1) == 2 && ws.size(2) == C && ws.is_contiguous() &&
                   ws.size(0) >= 1,
               op, ": cuda needs a contiguous [P, 2, ", C, "] workspace");
}

}  // namespace

// ---------------------------------------------------------------------------------------------------

void batch_norm_stats(const Tensor& x, double eps, double momentum, const Tensor& mean, const Tensor& invstd,
                      const Tensor& running_mean, const Tensor& running_var, const Tensor& workspace) {
  const int64_t C = x.size(-1), M = x.numel() / C;
  check_workspace("batch_norm", workspace, C);
  const int64_t chunks = workspace.size(0);
  cudaStream_t stream = engine::cuda::stream();
  ENGINE_CUDA_FLOAT_SWITCH(x.dtype(), T, {
    using A = acc_t<T>;
    A* ws = static_cast<A*>(workspace.data_ptr());
    const T* px = static_cast<const T*>(x.data_ptr());
    with_channel_vec<T>(C, {px}, [&](auto vec) {
      constexpr int V = decltype(vec)::value;
      const ColumnBlocks cb = column_blocks(C / V, chunks);
      batch_norm_chunk_stats<T, V><<<cb.grid, cb.block, cb.threads() * (1 + 2 * V) * sizeof(A), stream>>>(
          px, M, C, chunks, ws);
    });
    ENGINE_CUDA_LAUNCH_CHECK("batch_norm (chunk statistics)");
    A* rm = running_mean.defined() ? static_cast<A*>(running_mean.data_ptr()) : nullptr;
    A* rv = running_var.defined() ? static_cast<A*>(running_var.data_ptr()) : nullptr;
    batch_norm_finalize_stats<A><<<unsigned(ceil_div(C, kFinalizeTile)), kFinalizeThreads, 0, stream>>>(
        ws, M, C, chunks, A(eps), A(momentum), static_cast<A*>(mean.data_ptr()), static_cast<A*>(invstd.data_ptr()), rm,
        rv);
    ENGINE_CUDA_LAUNCH_CHECK("batch_norm (statistics)");
  });
}

void batch_norm_running_stats(const Tensor& running_mean, const Tensor& running_var, double eps, const Tensor& mean,
                              const Tensor& invstd) {
  const int64_t C = mean.numel();
  cudaStream_t stream = engine::cuda::stream();
  auto launch = [&](auto zero) {
    using A = decltype(zero);
    batch_norm_running_stats_kernel<A><<<unsigned(ceil_div(C, kElementwiseThreads)), kElementwiseThreads, 0,
                                         stream>>>(
        static_cast<const A*>(running_mean.data_ptr()), static_cast<const A*>(running_var.data_ptr()), C, A(eps),
        static_cast<A*>(mean.data_ptr()), static_cast<A*>(invstd.data_ptr()));
    ENGINE_CUDA_LAUNCH_CHECK("batch_norm (running statistics)");
  };
  if (mean.dtype() == engine::DType::f64) launch(0.0);
  else launch(0.0f);
}

void batch_norm_normalize(const Tensor& x, const Tensor& mean, const Tensor& invstd, const Tensor& weight,
                          const Tensor& bias, const Tensor& y, double slope, const Tensor& residual) {
  const int64_t C = x.size(-1), n = x.numel(), M = n / C;
  if (n == 0) return;
  cudaStream_t stream = engine::cuda::stream();
  ENGINE_CUDA_FLOAT_SWITCH(x.dtype(), T, {
    using A = acc_t<T>;
    const T* px = static_cast<const T*>(x.data_ptr());
    T* py = static_cast<T*>(y.data_ptr());
    const T* pres = ptr_or_null<T>(residual);
    with_channel_vec<T>(C, {px, py, pres}, [&](auto vec) {
      constexpr int V = decltype(vec)::value;
      const ColumnBlocks eb = elementwise_blocks(C / V, M);
      auto kernel = pres ? batch_norm_normalize_kernel<T, V, true> : batch_norm_normalize_kernel<T, V, false>;
      kernel<<<eb.grid, eb.block, 0, stream>>>(
          px, static_cast<const A*>(mean.data_ptr()), static_cast<const A*>(invstd.data_ptr()), ptr_or_null<T>(weight),
          stride_or_zero(weight), ptr_or_null<T>(bias), stride_or_zero(bias), pres, py, M, C, A(slope));
    });
    ENGINE_CUDA_LAUNCH_CHECK("batch_norm (normalize)");
  });
}

void batch_norm_backward(const Tensor& g, const Tensor& x, const Tensor& weight, const Tensor& mean,
                         const Tensor& invstd, bool batch_stats, const Tensor& dx, const Tensor& dweight,
                         const Tensor& dbias, const Tensor& workspace, const Tensor& bias, double slope,
                         const Tensor& y, const Tensor& dresidual) {
  const int64_t C = x.size(-1), n = x.numel(), M = n / C;
  const bool sums = dweight.defined() || dbias.defined() || (dx.defined() && batch_stats);
  if (sums) check_workspace("batch_norm_backward", workspace, C);
  cudaStream_t stream = engine::cuda::stream();
  ENGINE_CUDA_FLOAT_SWITCH(x.dtype(), T, {
    using A = acc_t<T>;
    const T* pg = static_cast<const T*>(g.data_ptr());
    const T* px = static_cast<const T*>(x.data_ptr());
    const A* pm = static_cast<const A*>(mean.data_ptr());
    const A* pr = static_cast<const A*>(invstd.data_ptr());
    A* ws = sums ? static_cast<A*>(workspace.data_ptr()) : nullptr;
    // The fused activation (NormActivation): its derivative from x, or from the forward's output y.
    const int act = slope == 1.0 ? kNoAct : y.defined() ? kActFromY : kActFromX;
    const T* py = ptr_or_null<T>(y);
    T* pdr = dresidual.defined() ? static_cast<T*>(dresidual.data_ptr()) : nullptr;
    const T* pw = ptr_or_null<T>(weight);
    const T* pb = ptr_or_null<T>(bias);
    const int64_t sw = stride_or_zero(weight), sb = stride_or_zero(bias);
    if (sums) {
      const int64_t chunks = workspace.size(0);
      with_channel_vec<T>(C, {pg, px, py, pdr}, [&](auto vec) {
        constexpr int V = decltype(vec)::value;
        const ColumnBlocks cb = column_blocks(C / V, chunks);
        auto kernel = act == kActFromY   ? batch_norm_chunk_sums<T, V, kActFromY>
                      : act == kActFromX ? batch_norm_chunk_sums<T, V, kActFromX>
                                         : batch_norm_chunk_sums<T, V, kNoAct>;
        kernel<<<cb.grid, cb.block, cb.threads() * 2 * V * sizeof(A), stream>>>(pg, px, py, pm, pr, pw, sw, pb, sb,
                                                                                A(slope), M, C, chunks, ws, pdr);
      });
      ENGINE_CUDA_LAUNCH_CHECK("batch_norm_backward (chunk sums)");
      T* pdw = dweight.defined() ? static_cast<T*>(dweight.data_ptr()) : nullptr;
      T* pdb = dbias.defined() ? static_cast<T*>(dbias.data_ptr()) : nullptr;
      batch_norm_finalize_sums<T><<<unsigned(ceil_div(C, kFinalizeTile)), dim3(kFinalizeTile, kFinalizeLanes), 0,
                                    stream>>>(ws, C, chunks, pdw, stride_or_zero(dweight), pdb, stride_or_zero(dbias));
      ENGINE_CUDA_LAUNCH_CHECK("batch_norm_backward (sums)");
    }
    // Once the sums pass has written g' = g act'(y) to dr, the dx pass reads it in place of g (no activation left).
    const bool dr_written = sums && act == kActFromY && pdr;
    if ((dx.defined() || (pdr && !dr_written)) && n > 0) {  // dx, or only g' (nothing else asked for)
      T* pdx = dx.defined() ? static_cast<T*>(dx.data_ptr()) : nullptr;
      const A* totals = batch_stats ? ws : nullptr;
      const T* pgin = dr_written ? pdr : pg;
      const int dx_act = dr_written ? int(kNoAct) : act;
      with_channel_vec<T>(C, {pgin, px, pdx, py, pdr}, [&](auto vec) {
        constexpr int V = decltype(vec)::value;
        const ColumnBlocks eb = elementwise_blocks(C / V, M);
        auto kernel = dx_act == kActFromY   ? batch_norm_dx_kernel<T, V, kActFromY>
                      : dx_act == kActFromX ? batch_norm_dx_kernel<T, V, kActFromX>
                                            : batch_norm_dx_kernel<T, V, kNoAct>;
        kernel<<<eb.grid, eb.block, 0, stream>>>(pgin, px, py, pw, sw, pb, sb, A(slope), pm, pr, totals, pdx,
                                                 dr_written ? nullptr : pdr, M, C);
      });
      ENGINE_CUDA_LAUNCH_CHECK("batch_norm_backward (dx)");
    }
  });
}

}  // namespace ops::cuda
