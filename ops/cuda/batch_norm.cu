// cuda/batch_norm.cu: batch norm forward (statistics pass + normalize pass) and backward (one column-sum
// pass + one elementwise pass) over a contiguous x [M, C], channels innermost (NHWC).
//
// Column reductions (the statistics; sum g and sum g xhat) are deterministic and use no atomics. The M rows
// are cut into the op's P fixed chunks (ops::batch_norm_chunks, the workspace's first dimension). One block
// per (32-channel tile, chunk): 32 x 8 threads, lane (tx, ty) owns channel tile * 32 + tx and walks rows
// begin + ty, begin + ty + 8, ... of the chunk, so each warp reads 32 consecutive channels of one row
// (coalesced). The 8 row lanes are combined in order through shared memory and written to workspace[b];
// a finalize kernel (one thread per channel) combines the P chunk partials in chunk order. Statistics use
// Welford's update per lane and Chan et al.'s pairwise formula to combine lanes and chunks (no
// cancellation, unlike sum and sum of squares).
// Measured on the H200 (2026-11-29, before the 4-row load groups of the statistics lanes), bytes of x moved
// per pass counted (forward 3, backward 5): f32 [8, 129, 129, 64] forward 0.86 TB/s, backward 2.35 TB/s;
// [8, 33, 33, 2048] 1.87 / 2.94 TB/s; bf16 0.52-0.91 / 1.15-1.37 TB/s. What is left to reach 80% of copy
// bandwidth: 16-byte channel vectors in the column kernels, per-channel values loaded as vectors in the
// elementwise passes (bf16 is instruction-bound there), more row chunks when C is small.
#include "ops/cuda/batch_norm.h"
#include "ops/cuda/kernel_util.cuh"

namespace ops::cuda {

using engine::Tensor;

namespace {

constexpr int kTileC = 32;     // channels per column block
constexpr int kRowLanes = 8;   // row lanes per column block
constexpr int kThreads = 256;  // elementwise and finalize kernels
constexpr int kUnroll = 4;     // rows whose loads a statistics lane issues together

// Rows [begin, end) of chunk b (the cpu reference's chunk_rows).
__device__ __forceinline__ void chunk_rows(int64_t M, int64_t chunks, int64_t b, int64_t& begin, int64_t& end) {
  const int64_t per = (M + chunks - 1) / chunks;
  begin = min(M, b * per);
  end = min(M, (b + 1) * per);
}

// (n_a, mean_a, m2_a) += (n_b, mean_b, m2_b), Chan et al.
template <typename A> __device__ __forceinline__ void chan_combine(A& na, A& ma, A& m2a, A nb, A mb, A m2b) {
  if (nb == A(0)) return;
  const A nt = na + nb, delta = mb - ma;
  ma += delta * (nb / nt);
  m2a += m2b + delta * delta * (na * nb / nt);
  na = nt;
}

template <typename T> const T* ptr_or_null(const Tensor& t) {
  return t.defined() ? static_cast<const T*>(t.data_ptr()) : nullptr;
}
template <typename T, typename A> __device__ __forceinline__ A load_or(const T* p, int64_t i, A fill) {
  return p ? to_acc<A>(p[i]) : fill;
}

// ---------------------------------------------------------------------------------------------------
// Forward

// Chunk statistics: workspace[b] = (chunk mean [C], chunk M2 [C]). Grid (C tiles, P), block 32 x 8.
// Bytes: one read of x; bound: memory (one division per element in Welford's update).
template <typename T>
__global__ void __launch_bounds__(kTileC * kRowLanes)
    batch_norm_chunk_stats(const T* __restrict__ x, int64_t M, int64_t C, int64_t chunks, acc_t<T>* __restrict__ ws) {
  using A = acc_t<T>;
  __shared__ A s_n[kRowLanes][kTileC], s_m[kRowLanes][kTileC], s_m2[kRowLanes][kTileC];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t c = int64_t(blockIdx.x) * kTileC + tx, b = blockIdx.y;
  int64_t begin, end;
  chunk_rows(M, chunks, b, begin, end);
  A n = 0, m = 0, m2 = 0;
  // Welford's update; 1 / n does not depend on the data, so the division stays off the dependent chain.
  auto add = [&](A v) {
    n += A(1);
    const A inv_n = A(1) / n, d = v - m;
    m += d * inv_n;
    m2 += d * (v - m);
  };
  if (c < C) {
    // Rows in groups of kUnroll: their loads are issued together (the chain of updates is short, the load
    // latency is what a lane would otherwise wait on once per row).
    int64_t r = begin + ty;
    for (; r + (kUnroll - 1) * kRowLanes < end; r += kUnroll * kRowLanes) {
      A v[kUnroll];
#pragma unroll
      for (int k = 0; k < kUnroll; k++) v[k] = to_acc<A>(x[(r + k * kRowLanes) * C + c]);
#pragma unroll
      for (int k = 0; k < kUnroll; k++) add(v[k]);
    }
    for (; r < end; r += kRowLanes) add(to_acc<A>(x[r * C + c]));
  }
  s_n[ty][tx] = n;
  s_m[ty][tx] = m;
  s_m2[ty][tx] = m2;
  __syncthreads();
  if (ty != 0 || c >= C) return;
  for (int k = 1; k < kRowLanes; k++) chan_combine(n, m, m2, s_n[k][tx], s_m[k][tx], s_m2[k][tx]);
  ws[b * 2 * C + c] = m;
  ws[b * 2 * C + C + c] = m2;
}

// One thread per channel: the P chunk partials combined in order; mean, invstd and the running statistics.
template <typename A>
__global__ void __launch_bounds__(kThreads)
    batch_norm_finalize_stats(const A* __restrict__ ws, int64_t M, int64_t C, int64_t chunks, A eps, A momentum,
                              A* __restrict__ mean, A* __restrict__ invstd, A* __restrict__ running_mean,
                              A* __restrict__ running_var) {
  const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= C) return;
  A n = 0, m = 0, m2 = 0;
  for (int64_t b = 0; b < chunks; b++) {
    int64_t begin, end;
    chunk_rows(M, chunks, b, begin, end);
    chan_combine(n, m, m2, A(end - begin), ws[b * 2 * C + c], ws[b * 2 * C + C + c]);
  }
  mean[c] = m;
  invstd[c] = A(1) / std::sqrt(m2 / A(M) + eps);
  if (running_mean) {
    running_mean[c] = (A(1) - momentum) * running_mean[c] + momentum * m;
    running_var[c] = (A(1) - momentum) * running_var[c] + momentum * (m2 / A(M - 1));
  }
}

template <typename A>
__global__ void __launch_bounds__(kThreads)
    batch_norm_running_stats_kernel(const A* __restrict__ rm, const A* __restrict__ rv, int64_t C, A eps,
                                    A* __restrict__ mean, A* __restrict__ invstd) {
  const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= C) return;
  mean[c] = rm[c];
  invstd[c] = A(1) / std::sqrt(rv[c] + eps);
}

// y = (x - mean[c]) invstd[c] w[c] + b[c], VEC consecutive channels per thread (16-byte loads when VEC > 1:
// C % VEC == 0 and aligned pointers). Grid-stride. Bytes: read x, write y (per-channel values from L1/L2).
template <typename T, int VEC>
__global__ void __launch_bounds__(kThreads)
    batch_norm_normalize_kernel(const T* __restrict__ x, const acc_t<T>* __restrict__ mean,
                                const acc_t<T>* __restrict__ invstd, const T* __restrict__ w,
                                const T* __restrict__ bias, T* __restrict__ y, int64_t packs, int64_t C) {
  using A = acc_t<T>;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < packs; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t c0 = (i * VEC) % C;
    A v[VEC], o[VEC];
    load_vec<VEC>(x + i * VEC, v);
#pragma unroll
    for (int k = 0; k < VEC; k++) {
      const int64_t c = c0 + k;
      o[k] = (v[k] - mean[c]) * invstd[c] * load_or(w, c, A(1)) + load_or(bias, c, A(0));
    }
    store_vec<VEC>(y + i * VEC, o);
  }
}

// ---------------------------------------------------------------------------------------------------
// Backward

// Chunk column sums: workspace[b] = (sum g [C], sum g xhat [C]). Grid (C tiles, P), block 32 x 8.
// Bytes: one read of g and x; bound: memory.
template <typename T>
__global__ void __launch_bounds__(kTileC * kRowLanes)
    batch_norm_chunk_sums(const T* __restrict__ g, const T* __restrict__ x, const acc_t<T>* __restrict__ mean,
                          const acc_t<T>* __restrict__ invstd, int64_t M, int64_t C, int64_t chunks,
                          acc_t<T>* __restrict__ ws) {
  using A = acc_t<T>;
  __shared__ A s_g[kRowLanes][kTileC], s_gx[kRowLanes][kTileC];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t c = int64_t(blockIdx.x) * kTileC + tx, b = blockIdx.y;
  int64_t begin, end;
  chunk_rows(M, chunks, b, begin, end);
  A sg = 0, sgx = 0;
  if (c < C) {
    const A mu = mean[c], r = invstd[c];
    for (int64_t row = begin + ty; row < end; row += kRowLanes) {
      const A gv = to_acc<A>(g[row * C + c]);
      sg += gv;
      sgx += gv * ((to_acc<A>(x[row * C + c]) - mu) * r);
    }
  }
  s_g[ty][tx] = sg;
  s_gx[ty][tx] = sgx;
  __syncthreads();
  if (ty != 0 || c >= C) return;
  for (int k = 1; k < kRowLanes; k++) {
    sg += s_g[k][tx];
    sgx += s_gx[k][tx];
  }
  ws[b * 2 * C + c] = sg;
  ws[b * 2 * C + C + c] = sgx;
}

// One thread per channel: the P partials added in order; dweight, dbias written, and the totals kept in
// workspace[0] for the dx pass (each thread reads its own channel's partials before overwriting them).
template <typename T>
__global__ void __launch_bounds__(kThreads)
    batch_norm_finalize_sums(acc_t<T>* __restrict__ ws, int64_t C, int64_t chunks, T* __restrict__ dw,
                             int64_t sdw, T* __restrict__ db, int64_t sdb) {
  using A = acc_t<T>;
  const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= C) return;
  A sg = 0, sgx = 0;
  for (int64_t b = 0; b < chunks; b++) {
    sg += ws[b * 2 * C + c];
    sgx += ws[b * 2 * C + C + c];
  }
  ws[c] = sg;
  ws[C + c] = sgx;
  if (dw) dw[c * sdw] = from_acc<T>(sgx);
  if (db) db[c * sdb] = from_acc<T>(sg);
}

// dx = invstd w (g - sum_g / M - xhat sum_gxhat / M) (batch statistics; sums = workspace[0]), or
// dx = invstd w g (running statistics; sums unused). VEC channels per thread as in the normalize kernel.
// Bytes: read g (and x), write dx; bound: memory.
template <typename T, int VEC>
__global__ void __launch_bounds__(kThreads)
    batch_norm_dx_kernel(const T* __restrict__ g, const T* __restrict__ x, const T* __restrict__ w,
                         const acc_t<T>* __restrict__ mean, const acc_t<T>* __restrict__ invstd,
                         const acc_t<T>* __restrict__ sums, T* __restrict__ dx, int64_t packs, int64_t M, int64_t C) {
  using A = acc_t<T>;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < packs; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t c0 = (i * VEC) % C;
    A gv[VEC], xv[VEC], o[VEC];
    load_vec<VEC>(g + i * VEC, gv);
    if (sums) load_vec<VEC>(x + i * VEC, xv);
#pragma unroll
    for (int k = 0; k < VEC; k++) {
      const int64_t c = c0 + k;
      const A scale = invstd[c] * load_or(w, c, A(1));
      if (!sums) {
        o[k] = gv[k] * scale;
      } else {
        const A xhat = (xv[k] - mean[c]) * invstd[c];
        o[k] = scale * (gv[k] - sums[c] / A(M) - xhat * (sums[C + c] / A(M)));
      }
    }
    store_vec<VEC>(dx + i * VEC, o);
  }
}

// Launches an elementwise kernel with the widest VEC the layout allows (C % VEC == 0, aligned pointers).
template <typename T, typename F> void with_channel_vec(int64_t C, std::initializer_list<const void*> ptrs, F&& f) {
  constexpr int V = vec16<T>();
  bool aligned = C % V == 0;
  for (const void* p : ptrs)
    if (p && !aligned16(p)) aligned = false;
  if (aligned) f(std::integral_constant<int, V>{});
  else f(std::integral_constant<int, 1>{});
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
    dim3 grid(unsigned((C + kTileC - 1) / kTileC), unsigned(chunks));
    batch_norm_chunk_stats<T><<<grid, dim3(kTileC, kRowLanes), 0, stream>>>(
        static_cast<const T*>(x.data_ptr()), M, C, chunks, ws);
    ENGINE_CUDA_LAUNCH_CHECK("batch_norm (chunk statistics)");
    A* rm = running_mean.defined() ? static_cast<A*>(running_mean.data_ptr()) : nullptr;
    A* rv = running_var.defined() ? static_cast<A*>(running_var.data_ptr()) : nullptr;
    batch_norm_finalize_stats<A><<<unsigned((C + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
        ws, M, C, chunks, A(eps), A(momentum), static_cast<A*>(mean.data_ptr()), static_cast<A*>(invstd.data_ptr()),
        rm, rv);
    ENGINE_CUDA_LAUNCH_CHECK("batch_norm (statistics)");
  });
}

void batch_norm_running_stats(const Tensor& running_mean, const Tensor& running_var, double eps, const Tensor& mean,
                              const Tensor& invstd) {
  const int64_t C = mean.numel();
  cudaStream_t stream = engine::cuda::stream();
  auto launch = [&](auto zero) {
    using A = decltype(zero);
    batch_norm_running_stats_kernel<A><<<unsigned((C + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
        static_cast<const A*>(running_mean.data_ptr()), static_cast<const A*>(running_var.data_ptr()), C, A(eps),
        static_cast<A*>(mean.data_ptr()), static_cast<A*>(invstd.data_ptr()));
    ENGINE_CUDA_LAUNCH_CHECK("batch_norm (running statistics)");
  };
  if (mean.dtype() == engine::DType::f64) launch(0.0);
  else launch(0.0f);
}

void batch_norm_normalize(const Tensor& x, const Tensor& mean, const Tensor& invstd, const Tensor& weight,
                          const Tensor& bias, const Tensor& y) {
  const int64_t C = x.size(-1), n = x.numel();
  if (n == 0) return;
  cudaStream_t stream = engine::cuda::stream();
  ENGINE_CUDA_FLOAT_SWITCH(x.dtype(), T, {
    using A = acc_t<T>;
    const T* px = static_cast<const T*>(x.data_ptr());
    T* py = static_cast<T*>(y.data_ptr());
    with_channel_vec<T>(C, {px, py}, [&](auto vec) {
      constexpr int V = decltype(vec)::value;
      const int64_t packs = n / V;
      batch_norm_normalize_kernel<T, V><<<grid_for(packs, kThreads), kThreads, 0, stream>>>(
          px, static_cast<const A*>(mean.data_ptr()), static_cast<const A*>(invstd.data_ptr()), ptr_or_null<T>(weight),
          ptr_or_null<T>(bias), py, packs, C);
    });
    ENGINE_CUDA_LAUNCH_CHECK("batch_norm (normalize)");
  });
}

void batch_norm_backward(const Tensor& g, const Tensor& x, const Tensor& weight, const Tensor& mean,
                         const Tensor& invstd, bool batch_stats, const Tensor& dx, const Tensor& dweight,
                         const Tensor& dbias, const Tensor& workspace) {
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
    if (sums) {
      const int64_t chunks = workspace.size(0);
      dim3 grid(unsigned((C + kTileC - 1) / kTileC), unsigned(chunks));
      batch_norm_chunk_sums<T><<<grid, dim3(kTileC, kRowLanes), 0, stream>>>(pg, px, pm, pr, M, C, chunks, ws);
      ENGINE_CUDA_LAUNCH_CHECK("batch_norm_backward (chunk sums)");
      T* pdw = dweight.defined() ? static_cast<T*>(dweight.data_ptr()) : nullptr;
      T* pdb = dbias.defined() ? static_cast<T*>(dbias.data_ptr()) : nullptr;
      batch_norm_finalize_sums<T><<<unsigned((C + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
          ws, C, chunks, pdw, dweight.defined() ? dweight.strides()[0] : 0, pdb,
          dbias.defined() ? dbias.strides()[0] : 0);
      ENGINE_CUDA_LAUNCH_CHECK("batch_norm_backward (sums)");
    }
    if (dx.defined() && n > 0) {
      T* pdx = static_cast<T*>(dx.data_ptr());
      const A* totals = batch_stats ? ws : nullptr;
      with_channel_vec<T>(C, {pg, px, pdx}, [&](auto vec) {
        constexpr int V = decltype(vec)::value;
        const int64_t packs = n / V;
        batch_norm_dx_kernel<T, V><<<grid_for(packs, kThreads), kThreads, 0, stream>>>(
            pg, px, ptr_or_null<T>(weight), pm, pr, totals, pdx, packs, M, C);
      });
      ENGINE_CUDA_LAUNCH_CHECK("batch_norm_backward (dx)");
    }
  });
}

}  // namespace ops::cuda
