// cuda/softmax.cu: softmax / log_softmax forward and backward along any dimension.
//
// A "row" is the line of n elements along `dim`; rows are numbered over the shape with `dim` collapsed and
// located with an Indexer (any strides). Three kernel shapes, chosen by the launcher:
//   warp    rows with unit stride along dim, 16-byte aligned, n <= 1024: one warp per row, the row held in
//           registers (at most 32 values per lane), so x is read once and y written once; rows shorter than
//           16 vectors use 8-byte vectors so that all 32 lanes load.
//   block   unit stride, longer (or unaligned) rows: one 256-thread block per row; pass 1 keeps an online
//           (max, sum of exp) per thread, pass 2 re-reads the row (from L2 for rows up to megabytes).
//   strided any other layout (dim not the unit-stride one): one thread per row, neighbouring threads on
//           neighbouring rows, which for a contiguous tensor are neighbouring addresses (coalesced).
// All three are memory-bound: forward moves 2 n elements per row (3 n for block rows), backward 3 n (5 n).
// Math in acc_t<T> (f32; f64 for f64), as the CPU reference; stores round to nearest even.
#include "ops/cuda/kernel_util.cuh"
#include "ops/cuda/softmax.h"

namespace ops::cuda {

using engine::Shape;
using engine::Tensor;

namespace {

constexpr int kWarpsPerBlock = 4;   // warp kernels: 4 rows per 128-thread block
constexpr int kRowBlock = 256;      // block kernels: one row per 256-thread block

// ---------------------------------------------------------------------------------------------------
// Forward

// Warp per row, row in registers. Lane l holds chunks (i * 32 + l) of VEC elements, i < ITEMS.
// Bytes: n reads + n writes per row; bound: memory bandwidth.
template <typename T, int VEC, int ITEMS>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    softmax_forward_warp(const T* __restrict__ x, T* __restrict__ y, const __grid_constant__ Indexer<2, int64_t> ix,
                         int64_t rows, int n, bool log) {
  using A = acc_t<T>;
  const int lane = threadIdx.x & 31;
  for (int64_t row = int64_t(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5); row < rows;
       row += int64_t(gridDim.x) * kWarpsPerBlock) {
    int64_t off[2];
    ix.offsets(row, off);
    const T* xr = x + off[0];
    T* yr = y + off[1];
    A v[ITEMS][VEC];
    A m = A(-INFINITY);
#pragma unroll
    for (int i = 0; i < ITEMS; i++) {
      const int c = (i * 32 + lane) * VEC;
      if (c < n) {
        load_vec<VEC>(xr + c, v[i]);
#pragma unroll
        for (int k = 0; k < VEC; k++) m = max(m, v[i][k]);
      }
    }
    m = warp_max(m);
    A s = 0;
#pragma unroll
    for (int i = 0; i < ITEMS; i++) {
      if ((i * 32 + lane) * VEC < n) {
#pragma unroll
        for (int k = 0; k < VEC; k++) s += std::exp(v[i][k] - m);
      }
    }
    s = warp_sum(s);
    const A log_s = std::log(s), inv_s = A(1) / s;
#pragma unroll
    for (int i = 0; i < ITEMS; i++) {
      const int c = (i * 32 + lane) * VEC;
      if (c < n) {
        A out[VEC];
#pragma unroll
        for (int k = 0; k < VEC; k++) out[k] = log ? (v[i][k] - m) - log_s : std::exp(v[i][k] - m) * inv_s;
        store_vec<VEC>(yr + c, out);
      }
    }
  }
}

// Block per row: online (max, sum) per thread over its chunks, block reduction, then a second read to
// write. Bytes: 2 n reads (the second mostly from L2) + n writes per row; bound: memory bandwidth.
template <typename T, int VEC>
__global__ void __launch_bounds__(kRowBlock)
    softmax_forward_block(const T* __restrict__ x, T* __restrict__ y, const __grid_constant__ Indexer<2, int64_t> ix,
                          int64_t rows, int64_t n, bool log) {
  using A = acc_t<T>;
  __shared__ A scratch[32];
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    int64_t off[2];
    ix.offsets(row, off);
    const T* xr = x + off[0];
    T* yr = y + off[1];
    A m = A(-INFINITY), s = 0;
    for (int64_t c = int64_t(threadIdx.x) * VEC; c < n; c += int64_t(blockDim.x) * VEC) {
      A v[VEC];
      load_vec<VEC>(xr + c, v);
#pragma unroll
      for (int k = 0; k < VEC; k++) online_add(m, s, v[k]);
    }
    block_online_reduce(m, s, scratch);
    const A log_s = std::log(s), inv_s = A(1) / s;
    for (int64_t c = int64_t(threadIdx.x) * VEC; c < n; c += int64_t(blockDim.x) * VEC) {
      A v[VEC];
      load_vec<VEC>(xr + c, v);
#pragma unroll
      for (int k = 0; k < VEC; k++) v[k] = log ? (v[k] - m) - log_s : std::exp(v[k] - m) * inv_s;
      store_vec<VEC>(yr + c, v);
    }
  }
}

// Thread per row, any strides (sx, sy along dim). Bytes: 2 n reads + n writes per row; bound: memory
// bandwidth when neighbouring rows are neighbouring addresses, else the number of memory transactions.
template <typename T>
__global__ void softmax_forward_strided(const T* __restrict__ x, T* __restrict__ y,
                                        const __grid_constant__ Indexer<2, int64_t> ix, int64_t rows, int64_t n,
                                        int64_t sx, int64_t sy, bool log) {
  using A = acc_t<T>;
  for (int64_t row = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; row < rows;
       row += int64_t(gridDim.x) * blockDim.x) {
    int64_t off[2];
    ix.offsets(row, off);
    const T* xr = x + off[0];
    T* yr = y + off[1];
    A m = A(-INFINITY), s = 0;
    for (int64_t k = 0; k < n; k++) online_add(m, s, to_acc<A>(xr[k * sx]));
    const A log_s = std::log(s), inv_s = A(1) / s;
    for (int64_t k = 0; k < n; k++) {
      A v = to_acc<A>(xr[k * sx]);
      yr[k * sy] = from_acc<T>(log ? (v - m) - log_s : std::exp(v - m) * inv_s);
    }
  }
}

// ---------------------------------------------------------------------------------------------------
// Backward: out = y (g - sum(g y))  or  (log) out = g - exp(y) sum(g).

// Warp per row, g and y in registers. Bytes: 2 n reads + n writes per row; bound: memory bandwidth.
template <typename T, int VEC, int ITEMS>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    softmax_backward_warp(const T* __restrict__ g, const T* __restrict__ y, T* __restrict__ out,
                          const __grid_constant__ Indexer<3, int64_t> ix, int64_t rows, int n, bool log) {
  using A = acc_t<T>;
  const int lane = threadIdx.x & 31;
  for (int64_t row = int64_t(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5); row < rows;
       row += int64_t(gridDim.x) * kWarpsPerBlock) {
    int64_t off[3];
    ix.offsets(row, off);
    A gv[ITEMS][VEC], yv[ITEMS][VEC];
    A dot = 0;
#pragma unroll
    for (int i = 0; i < ITEMS; i++) {
      const int c = (i * 32 + lane) * VEC;
      if (c < n) {
        load_vec<VEC>(g + off[0] + c, gv[i]);
        load_vec<VEC>(y + off[1] + c, yv[i]);
#pragma unroll
        for (int k = 0; k < VEC; k++) dot += log ? gv[i][k] : gv[i][k] * yv[i][k];
      }
    }
    dot = warp_sum(dot);
#pragma unroll
    for (int i = 0; i < ITEMS; i++) {
      const int c = (i * 32 + lane) * VEC;
      if (c < n) {
        A o[VEC];
#pragma unroll
        for (int k = 0; k < VEC; k++) o[k] = log ? gv[i][k] - std::exp(yv[i][k]) * dot : yv[i][k] * (gv[i][k] - dot);
        store_vec<VEC>(out + off[2] + c, o);
      }
    }
  }
}

// Block per row. Bytes: 4 n reads (half from L2) + n writes per row; bound: memory bandwidth.
template <typename T, int VEC>
__global__ void __launch_bounds__(kRowBlock)
    softmax_backward_block(const T* __restrict__ g, const T* __restrict__ y, T* __restrict__ out,
                           const __grid_constant__ Indexer<3, int64_t> ix, int64_t rows, int64_t n, bool log) {
  using A = acc_t<T>;
  __shared__ A scratch[32];
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    int64_t off[3];
    ix.offsets(row, off);
    A dot = 0;
    for (int64_t c = int64_t(threadIdx.x) * VEC; c < n; c += int64_t(blockDim.x) * VEC) {
      A gv[VEC], yv[VEC];
      load_vec<VEC>(g + off[0] + c, gv);
      load_vec<VEC>(y + off[1] + c, yv);
#pragma unroll
      for (int k = 0; k < VEC; k++) dot += log ? gv[k] : gv[k] * yv[k];
    }
    dot = block_sum(dot, scratch);
    for (int64_t c = int64_t(threadIdx.x) * VEC; c < n; c += int64_t(blockDim.x) * VEC) {
      A gv[VEC], yv[VEC];
      load_vec<VEC>(g + off[0] + c, gv);
      load_vec<VEC>(y + off[1] + c, yv);
#pragma unroll
      for (int k = 0; k < VEC; k++) gv[k] = log ? gv[k] - std::exp(yv[k]) * dot : yv[k] * (gv[k] - dot);
      store_vec<VEC>(out + off[2] + c, gv);
    }
  }
}

// Thread per row, any strides. Bytes: 4 n reads + n writes per row; bound as softmax_forward_strided.
template <typename T>
__global__ void softmax_backward_strided(const T* __restrict__ g, const T* __restrict__ y, T* __restrict__ out,
                                         const __grid_constant__ Indexer<3, int64_t> ix, int64_t rows, int64_t n,
                                         int64_t sg, int64_t sy, int64_t so, bool log) {
  using A = acc_t<T>;
  for (int64_t row = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; row < rows;
       row += int64_t(gridDim.x) * blockDim.x) {
    int64_t off[3];
    ix.offsets(row, off);
    A dot = 0;
    for (int64_t k = 0; k < n; k++) {
      A gk = to_acc<A>(g[off[0] + k * sg]);
      dot += log ? gk : gk * to_acc<A>(y[off[1] + k * sy]);
    }
    for (int64_t k = 0; k < n; k++) {
      A gk = to_acc<A>(g[off[0] + k * sg]), yk = to_acc<A>(y[off[1] + k * sy]);
      out[off[2] + k * so] = from_acc<T>(log ? gk - std::exp(yk) * dot : yk * (gk - dot));
    }
  }
}

// Which of the kernels above a launch takes, for rows of n elements (shared by forward and backward): `vec`
// when every row is unit-stride and 16-byte aligned, `unit` when unit-stride. Short rows (n <= 16 V, e.g. 128
// in bf16) take half vectors so that every lane of the warp loads; rows a warp holds in registers take the
// warp kernel with that many items per lane; longer rows a block per row; other strides the strided kernel.
// warp(vector width, items per lane), block(vector width) and strided() launch; the widths are
// std::integral_constant, so each branch instantiates the kernel it launches.
template <int V, typename Warp, typename Block, typename Strided>
void launch_by_row_length(int64_t n, bool vec, bool unit, Warp&& warp, Block&& block, Strided&& strided) {
  constexpr int VH = V > 1 ? V / 2 : 1;
  if (vec && n <= 16 * V) return warp(std::integral_constant<int, VH>{}, std::integral_constant<int, 1>{});
  if (vec && with_lane_items<V>(n, [&](auto items) { warp(std::integral_constant<int, V>{}, items); })) return;
  if (vec) block(std::integral_constant<int, V>{});
  else if (unit) block(std::integral_constant<int, 1>{});
  else strided();
}

}  // namespace

// ---------------------------------------------------------------------------------------------------

void softmax_forward(const Tensor& x, int64_t dim, bool log, const Tensor& y) {
  const int64_t n = x.shape()[size_t(dim)];
  const int64_t rows = n > 0 ? x.numel() / n : 0;
  if (rows == 0) return;
  const auto ix = row_indexer<2>("softmax", x.shape(), dim, {x.strides(), y.strides()});
  const int64_t sx = x.strides()[size_t(dim)], sy = y.strides()[size_t(dim)];
  const bool unit = n == 1 || (sx == 1 && sy == 1);
  cudaStream_t stream = engine::cuda::stream();
  ENGINE_CUDA_FLOAT_SWITCH(x.dtype(), T, {
    const T* px = static_cast<const T*>(x.data_ptr());
    T* py = static_cast<T*>(y.data_ptr());
    constexpr int V = vec16<T>();
    const bool vec = unit && rows_aligned<2>(ix, n, V, {px, py});
    launch_by_row_length<V>(
        n, vec, unit,
        [&](auto v, auto items) {
          softmax_forward_warp<T, decltype(v)::value, decltype(items)::value>
              <<<grid_for(rows, kWarpsPerBlock, 16), kWarpsPerBlock * 32, 0, stream>>>(px, py, ix, rows, int(n), log);
        },
        [&](auto v) {
          softmax_forward_block<T, decltype(v)::value><<<grid_for(rows, 1, 8), kRowBlock, 0, stream>>>(px, py, ix,
                                                                                                      rows, n, log);
        },
        [&] { softmax_forward_strided<T><<<grid_for(rows, 256), 256, 0, stream>>>(px, py, ix, rows, n, sx, sy, log); });
  });
  ENGINE_CUDA_LAUNCH_CHECK("softmax_forward");
}

void softmax_backward(const Tensor& g, const Tensor& y, int64_t dim, bool log, const Tensor& out) {
  const int64_t n = out.shape()[size_t(dim)];
  const int64_t rows = n > 0 ? out.numel() / n : 0;
  if (rows == 0) return;
  const auto ix = row_indexer<3>("softmax_backward", out.shape(), dim, {g.strides(), y.strides(), out.strides()});
  const int64_t sg = g.strides()[size_t(dim)], sy = y.strides()[size_t(dim)], so = out.strides()[size_t(dim)];
  const bool unit = n == 1 || (sg == 1 && sy == 1 && so == 1);
  cudaStream_t stream = engine::cuda::stream();
  ENGINE_CUDA_FLOAT_SWITCH(out.dtype(), T, {
    const T* pg = static_cast<const T*>(g.data_ptr());
    const T* py = static_cast<const T*>(y.data_ptr());
    T* po = static_cast<T*>(out.data_ptr());
    constexpr int V = vec16<T>();
    const bool vec = unit && rows_aligned<3>(ix, n, V, {pg, py, po});
    launch_by_row_length<V>(
        n, vec, unit,
        [&](auto v, auto items) {
          softmax_backward_warp<T, decltype(v)::value, decltype(items)::value>
              <<<grid_for(rows, kWarpsPerBlock, 16), kWarpsPerBlock * 32, 0, stream>>>(pg, py, po, ix, rows, int(n),
                                                                                      log);
        },
        [&](auto v) {
          softmax_backward_block<T, decltype(v)::value><<<grid_for(rows, 1, 8), kRowBlock, 0, stream>>>(
              pg, py, po, ix, rows, n, log);
        },
        [&] {
          softmax_backward_strided<T>
              <<<grid_for(rows, 256), 256, 0, stream>>>(pg, py, po, ix, rows, n, sg, sy, so, log);
        });
  });
  ENGINE_CUDA_LAUNCH_CHECK("softmax_backward");
}

}  // namespace ops::cuda
