// cuda/norm.cu: layer norm forward and backward over the last dimension (C), rows located with an Indexer.
//
// Two kernel shapes, as in softmax.cu:
//   warp   unit stride along C, 16-byte aligned, C <= 1024: one warp per row, the row in registers, lane l
//          owning columns ((i * 32 + l) * VEC + k). Statistics take two passes over the registers (mean,
//          then the sum of squared deviations), exactly the CPU's formula, with no extra memory traffic.
//   block  anything else (long or strided rows): one 256-thread block per row, re-reading the row from L2.
// Backward column sums (dweight = sum_rows g * xhat, dbias = sum_rows g) are deterministic and use no
// atomics: the op hands us a workspace [P, 2, C]; chunk b of the rows (a fixed split, the same on every
// GPU) is one block, whose lanes add their columns' terms row after row into their warp's shared-memory
// sums; the block adds its warps in order and writes workspace[b]; then
// layer_norm_param_grads adds the P partial rows in a fixed tree (32 stripes, then the stripes in order).
// Weight normalization: its per-channel sums are reduce.cu's sum_of_products (the op's split workspace, fixed
// order); the two passes here are pointwise over v viewed as [outer, n, inner], a thread per 16-byte pack, each
// element's channel coefficients computed from the [n] sums (read from cache) in float.
#include "engine/rng.h"
#include "ops/cuda/dropout.h"
#include "ops/cuda/elementwise.h"
#include "ops/cuda/kernel_util.cuh"
#include "ops/cuda/norm.h"

namespace ops::cuda {

using engine::Shape;
using engine::Tensor;

namespace {

constexpr int kWarpsPerBlock = 4;    // forward warp kernel: 4 rows per 128-thread block
constexpr int kBackwardWarps = 4;    // backward warp kernel: one row chunk per 128-thread block
constexpr int kRowBlock = 256;       // block kernels

// x[c] for the warp kernels' chunk layout: VEC elements at p + c (VEC == 1: a single element).
template <int VEC, typename T, typename A>
__device__ __forceinline__ void load_or_fill(const T* p, int c, A fill, A (&out)[VEC]) {
  if (p) {
    load_vec<VEC>(p + c, out);
  } else {
#pragma unroll
    for (int k = 0; k < VEC; k++) out[k] = fill;
  }
}

// ---------------------------------------------------------------------------------------------------
// Forward

// dropout_add_layer_norm's prologue: the normalized row is x = st(st(keep(e) ? y * scale : 0) + residual),
// e = row * C + c (contiguous rows), each rounding where ops::dropout and ops::add round; x is also stored
// (backward's saved input). keep(e): engine::dropout_bits(seed, offset, e) >= threshold (threshold 0 and
// scale 1 when nothing is dropped).
template <typename T> struct ResidualArgs {
  const T* residual = nullptr;
  T* sum = nullptr;
  uint32_t threshold = 0;
  acc_t<T> scale = 1;
  uint64_t seed = 0, offset = 0;
};

// The 16-bit dropout numbers of elements e0 .. e0 + VEC: one Philox block when they are halves of the same
// block (a 16-byte vector at an aligned offset: the common case), else one block each.
template <int VEC>
__device__ __forceinline__ void dropout_bits_vec(uint64_t seed, uint64_t offset, uint64_t e0, uint32_t (&bits)[VEC]) {
  const uint64_t half = 2 * offset + e0;
  if ((half & 7) + VEC <= 8) {
    uint32_t r[4];
    engine::dropout_block(seed, half >> 3, r);
#pragma unroll
    for (int k = 0; k < VEC; k++) bits[k] = engine::philox_half(r, uint32_t(half & 7) + k);
  } else {
#pragma unroll
    for (int k = 0; k < VEC; k++) bits[k] = engine::dropout_bits(seed, offset, e0 + k);
  }
}

// Warp per row. Bytes per row: C reads of x, C writes of y (weight and bias hit L1); with the residual
// prologue (kResidual: x is dropout's input y) also C reads of the residual and C writes of the sum; bound:
// memory.
template <typename T, int VEC, int ITEMS, bool kResidual>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    layer_norm_forward_warp(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b,
                            T* __restrict__ y, acc_t<T>* __restrict__ mean, acc_t<T>* __restrict__ rstd,
                            const __grid_constant__ Indexer<2, int64_t> ix, int64_t rows, int C, acc_t<T> eps,
                            const ResidualArgs<T> res) {
  using A = acc_t<T>;
  const int lane = threadIdx.x & 31;
  for (int64_t row = int64_t(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5); row < rows;
       row += int64_t(gridDim.x) * kWarpsPerBlock) {
    int64_t off[2];
    ix.offsets(row, off);
    A v[ITEMS][VEC];
    A sum = 0;
#pragma unroll
    for (int i = 0; i < ITEMS; i++) {
      const int c = (i * 32 + lane) * VEC;
      if (c < C) {
        load_vec<VEC>(x + off[0] + c, v[i]);
        if constexpr (kResidual) {  // x = st(st(dropout(y)) + residual), stored
          A r[VEC];
          uint32_t bits[VEC];
          load_vec<VEC>(res.residual + off[0] + c, r);
          dropout_bits_vec<VEC>(res.seed, res.offset, uint64_t(row) * uint64_t(C) + uint64_t(c), bits);
#pragma unroll
          for (int k = 0; k < VEC; k++) {
            const A d = to_acc<A>(from_acc<T>(bits[k] >= res.threshold ? v[i][k] * res.scale : A(0)));
            v[i][k] = to_acc<A>(from_acc<T>(d + r[k]));
          }
          store_vec<VEC>(res.sum + off[0] + c, v[i]);
        }
#pragma unroll
        for (int k = 0; k < VEC; k++) sum += v[i][k];
      }
    }
    const A mu = warp_sum(sum) / A(C);
    A sq = 0;
#pragma unroll
    for (int i = 0; i < ITEMS; i++) {
      if ((i * 32 + lane) * VEC < C) {
#pragma unroll
        for (int k = 0; k < VEC; k++) sq += (v[i][k] - mu) * (v[i][k] - mu);
      }
    }
    const A r = A(1) / std::sqrt(warp_sum(sq) / A(C) + eps);
#pragma unroll
    for (int i = 0; i < ITEMS; i++) {
      const int c = (i * 32 + lane) * VEC;
      if (c < C) {
        A wv[VEC], bv[VEC], o[VEC];
        load_or_fill<VEC>(w, c, A(1), wv);
        load_or_fill<VEC>(b, c, A(0), bv);
#pragma unroll
        for (int k = 0; k < VEC; k++) o[k] = (v[i][k] - mu) * r * wv[k] + bv[k];
        store_vec<VEC>(y + off[1] + c, o);
      }
    }
    if (lane == 0) {
      mean[row] = mu;
      rstd[row] = r;
    }
  }
}

// Block per row, any strides along C. Bytes per row: 3 C reads (two from L2) + C writes; bound: memory.
template <typename T>
__global__ void __launch_bounds__(kRowBlock)
    layer_norm_forward_block(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b,
                             T* __restrict__ y, acc_t<T>* __restrict__ mean, acc_t<T>* __restrict__ rstd,
                             const __grid_constant__ Indexer<2, int64_t> ix, int64_t rows, int64_t C, int64_t sx,
                             int64_t sy, int64_t sw, int64_t sb, acc_t<T> eps) {
  using A = acc_t<T>;
  __shared__ A scratch[32];
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    int64_t off[2];
    ix.offsets(row, off);
    const T* xr = x + off[0];
    A sum = 0;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) sum += to_acc<A>(xr[c * sx]);
    const A mu = block_sum(sum, scratch) / A(C);
    A sq = 0;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
      A d = to_acc<A>(xr[c * sx]) - mu;
      sq += d * d;
    }
    const A r = A(1) / std::sqrt(block_sum(sq, scratch) / A(C) + eps);
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x)
      y[off[1] + c * sy] =
          from_acc<T>((to_acc<A>(xr[c * sx]) - mu) * r * load_or(w, c * sw, A(1)) + load_or(b, c * sb, A(0)));
    if (threadIdx.x == 0) {
      mean[row] = mu;
      rstd[row] = r;
    }
  }
}

// ---------------------------------------------------------------------------------------------------
// Backward: per row, with xhat = (x - mean) rstd and a = g * weight,
//   dx = rstd (a - mean(a) - xhat mean(a xhat));  partial column sums of g * xhat and g.

// Block b takes rows [b * rows_per_block, ...), its 4 warps one row at a time. Each lane adds its columns
// g * xhat and g into its warp's rows of shared memory (lane-private addresses: no barrier until the end,
// and no registers held across rows, which keeps occupancy up); at the end the block adds its warps in
// order and writes workspace[b]. Bytes per row: 2 C reads, C writes (dx); bound: memory.
template <typename T, int VEC, int ITEMS>
__global__ void __launch_bounds__(kBackwardWarps * 32)
    layer_norm_backward_warp(const T* __restrict__ g, const T* __restrict__ x, const T* __restrict__ w,
                             const acc_t<T>* __restrict__ mean, const acc_t<T>* __restrict__ rstd,
                             T* __restrict__ dx, acc_t<T>* __restrict__ workspace,
                             const __grid_constant__ Indexer<3, int64_t> ix, int64_t rows, int C,
                             int64_t rows_per_block) {
  using A = acc_t<T>;
  constexpr int kCap = 32 * ITEMS * VEC;  // columns one warp covers
  __shared__ __align__(16) A sums[kBackwardWarps][2][kCap];  // per warp: [dweight, dbias][columns]
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  A* warp_dw = sums[warp][0];
  A* warp_db = sums[warp][1];
  if (workspace) {
    for (int c = lane; c < kCap; c += 32) warp_dw[c] = warp_db[c] = A(0);
    __syncwarp();
  }
  const int64_t begin = int64_t(blockIdx.x) * rows_per_block;
  const int64_t end = min(rows, begin + rows_per_block);
  for (int64_t row = begin + warp; row < end; row += kBackwardWarps) {
    int64_t off[3];
    ix.offsets(row, off);
    const A mu = mean[row], r = rstd[row];
    A gv[ITEMS][VEC], xh[ITEMS][VEC];
    A sum_a = 0, sum_a_xhat = 0;
#pragma unroll
    for (int i = 0; i < ITEMS; i++) {
      const int c = (i * 32 + lane) * VEC;
      if (c < C) {
        A wv[VEC];  // weight: re-read per row from L1 rather than held (registers bound occupancy here)
        load_or_fill<VEC>(w, c, A(1), wv);
        load_vec<VEC>(g + off[0] + c, gv[i]);
        load_vec<VEC>(x + off[1] + c, xh[i]);
#pragma unroll
        for (int k = 0; k < VEC; k++) {
          xh[i][k] = (xh[i][k] - mu) * r;
          const A a = gv[i][k] * wv[k];
          sum_a += a;
          sum_a_xhat += a * xh[i][k];
        }
        if (workspace) {
          Vec<A, VEC>& sw = *reinterpret_cast<Vec<A, VEC>*>(warp_dw + c);
          Vec<A, VEC>& sb = *reinterpret_cast<Vec<A, VEC>*>(warp_db + c);
          Vec<A, VEC> vw = sw, vb = sb;
#pragma unroll
          for (int k = 0; k < VEC; k++) {
            vw.v[k] += gv[i][k] * xh[i][k];
            vb.v[k] += gv[i][k];
          }
          sw = vw;
          sb = vb;
        }
      }
    }
    const A mean_a = warp_sum(sum_a) / A(C), mean_a_xhat = warp_sum(sum_a_xhat) / A(C);
    if (!dx) continue;
#pragma unroll
    for (int i = 0; i < ITEMS; i++) {
      const int c = (i * 32 + lane) * VEC;
      if (c < C) {
        A wv[VEC], o[VEC];
        load_or_fill<VEC>(w, c, A(1), wv);
#pragma unroll
        for (int k = 0; k < VEC; k++) o[k] = r * (gv[i][k] * wv[k] - mean_a - xh[i][k] * mean_a_xhat);
        store_vec<VEC>(dx + off[2] + c, o);
      }
    }
  }
  if (!workspace) return;
  __syncthreads();
  // The block's column sums: its warps added in warp order (deterministic).
  A* out = workspace + int64_t(blockIdx.x) * 2 * C;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    A sw = 0, sb = 0;
#pragma unroll
    for (int k = 0; k < kBackwardWarps; k++) {
      sw += sums[k][0][c];
      sb += sums[k][1][c];
    }
    out[c] = sw;
    out[C + c] = sb;
  }
}

// Block per row, any strides; block b takes rows [b * rows_per_block, ...) and keeps its column sums
// directly in workspace[b] (each thread owns its columns: no races). Bytes per row: 4 C reads (two from
// L2) + C writes + 4 C workspace accesses (L2); bound: memory.
template <typename T>
__global__ void __launch_bounds__(kRowBlock)
    layer_norm_backward_block(const T* __restrict__ g, const T* __restrict__ x, const T* __restrict__ w,
                              const acc_t<T>* __restrict__ mean, const acc_t<T>* __restrict__ rstd, T* __restrict__ dx,
                              acc_t<T>* __restrict__ workspace, const __grid_constant__ Indexer<3, int64_t> ix,
                              int64_t rows, int64_t C, int64_t sg, int64_t sx, int64_t sdx, int64_t sw,
                              int64_t rows_per_block) {
  using A = acc_t<T>;
  __shared__ A scratch[32];
  A* part = workspace ? workspace + int64_t(blockIdx.x) * 2 * C : nullptr;
  if (part)
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) part[c] = part[C + c] = A(0);
  const int64_t begin = int64_t(blockIdx.x) * rows_per_block;
  const int64_t end = min(rows, begin + rows_per_block);
  for (int64_t row = begin; row < end; row++) {
    int64_t off[3];
    ix.offsets(row, off);
    const A mu = mean[row], r = rstd[row];
    A sum_a = 0, sum_a_xhat = 0;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
      const A gc = to_acc<A>(g[off[0] + c * sg]), xhat = (to_acc<A>(x[off[1] + c * sx]) - mu) * r;
      const A a = gc * load_or(w, c * sw, A(1));
      sum_a += a;
      sum_a_xhat += a * xhat;
      if (part) {
        part[c] += gc * xhat;
        part[C + c] += gc;
      }
    }
    const A mean_a = block_sum(sum_a, scratch) / A(C), mean_a_xhat = block_sum(sum_a_xhat, scratch) / A(C);
    if (!dx) continue;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
      const A xhat = (to_acc<A>(x[off[1] + c * sx]) - mu) * r;
      const A a = to_acc<A>(g[off[0] + c * sg]) * load_or(w, c * sw, A(1));
      dx[off[2] + c * sdx] = from_acc<T>(r * (a - mean_a - xhat * mean_a_xhat));
    }
  }
}

// dweight[c], dbias[c] = sums of the P partial rows. Block: 32 columns x 32 stripes; stripe s adds partial
// rows s, s + 32, ... in order, then thread (column, 0) adds the 32 stripes in order. Bytes: 2 P C reads.
template <typename T>
__global__ void __launch_bounds__(1024)
    layer_norm_param_grads(const acc_t<T>* __restrict__ workspace, int64_t P, int64_t C, T* __restrict__ dw,
                           int64_t sdw, T* __restrict__ db, int64_t sdb) {
  using A = acc_t<T>;
  __shared__ A stripes[2][32][33];
  const int tx = threadIdx.x & 31, ty = threadIdx.x >> 5;
  const int64_t c = int64_t(blockIdx.x) * 32 + tx;
  A sw = 0, sb = 0;
  if (c < C) {
    for (int64_t b = ty; b < P; b += 32) {
      sw += workspace[b * 2 * C + c];
      sb += workspace[b * 2 * C + C + c];
    }
  }
  stripes[0][ty][tx] = sw;
  stripes[1][ty][tx] = sb;
  __syncthreads();
  if (ty != 0 || c >= C) return;
  sw = sb = 0;
  for (int s = 0; s < 32; s++) {
    sw += stripes[0][s][tx];
    sb += stripes[1][s][tx];
  }
  if (dw) dw[c * sdw] = from_acc<T>(sw);
  if (db) db[c * sdb] = from_acc<T>(sb);
}

// ---------------------------------------------------------------------------------------------------
// Launch helpers

bool unit_or_undefined(const Tensor& t) { return !t.defined() || t.strides().back() == 1 || t.size(-1) == 1; }

}  // namespace

// ---------------------------------------------------------------------------------------------------

namespace {

// dropout_add_layer_norm's other inputs (host side): the residual, the sum written, the dropout drawn.
struct ResidualInput {
  Tensor residual, sum;
  double p = 0;
  uint64_t seed = 0, offset = 0;
};

// Layer norm by the warp kernel (with the residual prologue when `res` is given) when the rows suit it: unit
// stride along C, 16-byte aligned, C within a warp's registers (and, with `res`, x, the residual and the sum
// contiguous and aligned alike). Returns whether it launched.
bool forward_warp(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps, const Tensor& y,
                  const Tensor& mean, const Tensor& rstd, const ResidualInput* res) {
  const int64_t C = x.size(-1), rows = x.numel() / C;
  const auto ix = row_indexer<2>("layer_norm", x.shape(), x.dim() - 1, {x.strides(), y.strides()});
  const bool unit = C == 1 || (x.strides().back() == 1 && y.strides().back() == 1 && unit_or_undefined(weight) &&
                               unit_or_undefined(bias));
  if (res && !(x.is_contiguous() && res->residual.is_contiguous() && res->sum.is_contiguous())) return false;
  cudaStream_t stream = engine::cuda::stream();
  bool done = false;
  ENGINE_CUDA_FLOAT_SWITCH(x.dtype(), T, {
    using A = acc_t<T>;
    const T* px = static_cast<const T*>(x.data_ptr());
    const T *pw = ptr_or_null<T>(weight), *pb = ptr_or_null<T>(bias);
    T* py = static_cast<T*>(y.data_ptr());
    A* pm = static_cast<A*>(mean.data_ptr());
    A* pr = static_cast<A*>(rstd.data_ptr());
    ResidualArgs<T> ra;
    if (res) {
      const engine::DropoutRate rate = engine::dropout_rate(res->p);
      ra = {static_cast<const T*>(res->residual.data_ptr()), static_cast<T*>(res->sum.data_ptr()), rate.threshold,
            A(rate.keep_scale), res->seed, res->offset};
    }
    constexpr int V = vec16<T>();
    const bool vec = unit && rows_aligned<2>(ix, C, V, {px, py, pw, pb, ra.residual, ra.sum});
    done = vec && with_lane_items<V>(C, [&](auto items) {
             const dim3 grid = grid_for(rows, kWarpsPerBlock, 16), block(kWarpsPerBlock * 32);
             if (res)
               layer_norm_forward_warp<T, V, decltype(items)::value, true>
                   <<<grid, block, 0, stream>>>(px, pw, pb, py, pm, pr, ix, rows, int(C), A(eps), ra);
             else
               layer_norm_forward_warp<T, V, decltype(items)::value, false>
                   <<<grid, block, 0, stream>>>(px, pw, pb, py, pm, pr, ix, rows, int(C), A(eps), ra);
           });
  });
  return done;
}

}  // namespace

void layer_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps, const Tensor& y,
                        const Tensor& mean, const Tensor& rstd) {
  const int64_t C = x.size(-1), rows = C > 0 ? x.numel() / C : 0;
  if (rows == 0) return;
  if (!forward_warp(x, weight, bias, eps, y, mean, rstd, nullptr)) {
    const auto ix = row_indexer<2>("layer_norm", x.shape(), x.dim() - 1, {x.strides(), y.strides()});
    ENGINE_CUDA_FLOAT_SWITCH(x.dtype(), T, {
      using A = acc_t<T>;
      layer_norm_forward_block<T><<<grid_for(rows, 1, 8), kRowBlock, 0, engine::cuda::stream()>>>(
          static_cast<const T*>(x.data_ptr()), ptr_or_null<T>(weight), ptr_or_null<T>(bias),
          static_cast<T*>(y.data_ptr()), static_cast<A*>(mean.data_ptr()), static_cast<A*>(rstd.data_ptr()), ix, rows,
          C, x.strides().back(), y.strides().back(), stride_or_zero(weight), stride_or_zero(bias), A(eps));
    });
  }
  ENGINE_CUDA_LAUNCH_CHECK("layer_norm");
}

void dropout_add_layer_norm(const Tensor& y, const Tensor& residual, const Tensor& weight, const Tensor& bias,
                            double p, uint64_t seed, uint64_t offset, double eps, const Tensor& sum, const Tensor& out,
                            const Tensor& mean, const Tensor& rstd) {
  const int64_t C = y.size(-1), rows = C > 0 ? y.numel() / C : 0;
  if (rows == 0) return;
  const ResidualInput res{residual, sum, p, seed, offset};
  if (forward_warp(y, weight, bias, eps, out, mean, rstd, &res)) {
    ENGINE_CUDA_LAUNCH_CHECK("dropout_add_layer_norm");
    return;
  }
  // Any other layout: the three kernels, into the same buffers.
  if (p > 0) {
    dropout(y, p, seed, offset, sum);
    binary(BinaryOp::add, sum, residual, sum);
  } else {
    binary(BinaryOp::add, y, residual, sum);
  }
  layer_norm_forward(sum, weight, bias, eps, out, mean, rstd);
}

void layer_norm_backward(const Tensor& g, const Tensor& x, const Tensor& weight, const Tensor& mean,
                         const Tensor& rstd, const Tensor& dx, const Tensor& dweight, const Tensor& dbias,
                         const Tensor& workspace) {
  const int64_t C = x.size(-1), rows = C > 0 ? x.numel() / C : 0;
  if (C == 0) return;
  const bool sums = dweight.defined() || dbias.defined();
  ENGINE_CHECK(!sums || (workspace.defined() && workspace.dim() == 3 && workspace.size(1) == 2 &&
                         workspace.size(2) == C && workspace.is_contiguous()),
               "layer_norm_backward: cuda needs a contiguous [P, 2, ", C, "] workspace for dweight/dbias");
  // Row chunks: the workspace's P when column sums are wanted (a fixed split), else about 32 rows each.
  const int64_t chunks = sums ? workspace.size(0) : std::max<int64_t>(1, (rows + 31) / 32);
  ENGINE_CHECK(chunks >= 1, "layer_norm_backward: the workspace has no row chunks");
  const int64_t rows_per_block = std::max<int64_t>(1, (rows + chunks - 1) / chunks);
  const Shape& dx_strides = dx.defined() ? dx.strides() : x.strides();
  const auto ix = row_indexer<3>("layer_norm_backward", x.shape(), x.dim() - 1, {g.strides(), x.strides(), dx_strides});
  const bool unit = C == 1 || (g.strides().back() == 1 && x.strides().back() == 1 && unit_or_undefined(dx) &&
                               unit_or_undefined(weight));
  cudaStream_t stream = engine::cuda::stream();
  ENGINE_CUDA_FLOAT_SWITCH(x.dtype(), T, {
    using A = acc_t<T>;
    const T* pg = static_cast<const T*>(g.data_ptr());
    const T* px = static_cast<const T*>(x.data_ptr());
    const T* pw = ptr_or_null<T>(weight);
    const A* pm = static_cast<const A*>(mean.data_ptr());
    const A* pr = static_cast<const A*>(rstd.data_ptr());
    T* pdx = dx.defined() ? static_cast<T*>(dx.data_ptr()) : nullptr;
    A* ws = sums ? static_cast<A*>(workspace.data_ptr()) : nullptr;
    constexpr int V = vec16<T>();
    const bool vec = unit && rows_aligned<3>(ix, C, V, {pg, px, pw, pdx});
    if (rows > 0 || sums) {
      bool done = vec && with_lane_items<V>(C, [&](auto items) {
        layer_norm_backward_warp<T, V, decltype(items)::value><<<unsigned(chunks), kBackwardWarps * 32, 0, stream>>>(
            pg, px, pw, pm, pr, pdx, ws, ix, rows, int(C), rows_per_block);
      });
      if (!done)
        layer_norm_backward_block<T><<<unsigned(chunks), kRowBlock, 0, stream>>>(
            pg, px, pw, pm, pr, pdx, ws, ix, rows, C, g.strides().back(), x.strides().back(), stride_or_zero(dx),
            stride_or_zero(weight), rows_per_block);
      ENGINE_CUDA_LAUNCH_CHECK("layer_norm_backward");
    }
    if (sums) {
      T* pdw = dweight.defined() ? static_cast<T*>(dweight.data_ptr()) : nullptr;
      T* pdb = dbias.defined() ? static_cast<T*>(dbias.data_ptr()) : nullptr;
      layer_norm_param_grads<T><<<unsigned((C + 31) / 32), 1024, 0, stream>>>(
          ws, chunks, C, pdw, stride_or_zero(dweight), pdb, stride_or_zero(dbias));
      ENGINE_CUDA_LAUNCH_CHECK("layer_norm_backward (column sums)");
    }
  });
}

// ---------------------------------------------------------------------------------------------------
// Weight normalization's pointwise passes

namespace {

// The channel of element e of a contiguous [outer, n, inner] tensor.
template <typename I>
__device__ __forceinline__ I channel_of(I e, I n, I inner) {
  return (e / inner) % n;
}

// Where the weight-norm kernels read and write: v viewed as [outer, n, inner], contiguous.
template <typename T, typename I>
struct WeightNormArgs {
  using A = acc_t<T>;
  const T* v;
  const T* g;        // [n]
  const A* norm_sq;  // [n]
  const T* dw;       // backward: the gradient of w
  const A* s;        // backward: [n] sums of dw * v
  T* out;            // forward: w; backward: dv (or null)
  T* dg;             // backward: [n] (or null)
  I numel, n, inner;
};

// Calls f(e0) for the first element of each of this thread's packs of VEC elements (grid-stride); the last pack
// may be short (f checks e0 + VEC against numel).
template <int VEC, typename I, typename F>
__device__ __forceinline__ void for_packs(I numel, F&& f) {
  const I packs = (numel + VEC - 1) / VEC;
  for (I k = I(blockIdx.x) * blockDim.x + threadIdx.x; k < packs; k += I(gridDim.x) * blockDim.x) f(k * VEC);
}

// w[e] = v[e] * (g[j] / sqrt(norm_sq[j])), as ops::cpu::weight_norm_forward.
template <int VEC, typename T, typename I>
__global__ void weight_norm_scale_kernel(WeightNormArgs<T, I> p) {
  using A = acc_t<T>;
  auto w = [&](A ve, I e) {
    const I j = channel_of(e, p.n, p.inner);
    return from_acc<T>(ve * (to_acc<A>(p.g[j]) / sqrt(p.norm_sq[j])));
  };
  for_packs<VEC>(p.numel, [&](I e0) {
    if (e0 + VEC <= p.numel) {
      Vec<T, VEC> x = *reinterpret_cast<const Vec<T, VEC>*>(p.v + e0), y;
#pragma unroll
      for (int q = 0; q < VEC; q++) y.v[q] = w(to_acc<A>(x.v[q]), e0 + q);
      *reinterpret_cast<Vec<T, VEC>*>(p.out + e0) = y;
    } else {
      for (I e = e0; e < p.numel; e++) p.out[e] = w(to_acc<A>(p.v[e]), e);
    }
  });
}

// dv[e] = a_j dw[e] + b_j v[e] with a_j = g_j / r_j, b_j = -a_j s_j / r_j^2 (r_j = sqrt(norm_sq_j)); the first n
// threads also write dg[j] = s_j / r_j. As ops::cpu::weight_norm_backward. out (dv) or dg may be null.
template <int VEC, typename T, typename I>
__global__ void weight_norm_backward_kernel(WeightNormArgs<T, I> p) {
  using A = acc_t<T>;
  const I t = I(blockIdx.x) * blockDim.x + threadIdx.x;
  if (p.dg && t < p.n) p.dg[t] = from_acc<T>(p.s[t] / sqrt(p.norm_sq[t]));
  if (!p.out) return;
  auto dv = [&](A dwe, A ve, I e) {
    const I j = channel_of(e, p.n, p.inner);
    const A a = to_acc<A>(p.g[j]) / sqrt(p.norm_sq[j]);
    const A b = -a * p.s[j] / p.norm_sq[j];
    return from_acc<T>(a * dwe + b * ve);
  };
  for_packs<VEC>(p.numel, [&](I e0) {
    if (e0 + VEC <= p.numel) {
      Vec<T, VEC> x = *reinterpret_cast<const Vec<T, VEC>*>(p.dw + e0);
      Vec<T, VEC> y = *reinterpret_cast<const Vec<T, VEC>*>(p.v + e0), z;
#pragma unroll
      for (int q = 0; q < VEC; q++) z.v[q] = dv(to_acc<A>(x.v[q]), to_acc<A>(y.v[q]), e0 + q);
      *reinterpret_cast<Vec<T, VEC>*>(p.out + e0) = z;
    } else {
      for (I e = e0; e < p.numel; e++) p.out[e] = dv(to_acc<A>(p.dw[e]), to_acc<A>(p.v[e]), e);
    }
  });
}

// Fills the arguments for v viewed around dim and launches the forward's or the backward's kernel with 16-byte
// packs where every pointer allows, else single elements; a thread per pack (grid-stride), at least n threads
// (the backward's dg).
template <bool kBackward, typename T>
void launch_weight_norm(const Tensor& v, int64_t dim, const Tensor& g, const Tensor& norm_sq, const Tensor& dw,
                        const Tensor& s, const Tensor& out, const Tensor& dg) {
  using A = acc_t<T>;
  int64_t inner = 1;
  for (int64_t d = dim + 1; d < v.dim(); d++) inner *= v.size(d);
  auto launch = [&](auto index) {
    using I = decltype(index);
    WeightNormArgs<T, I> p{static_cast<const T*>(v.data_ptr()),
                           static_cast<const T*>(g.data_ptr()),
                           static_cast<const A*>(norm_sq.data_ptr()),
                           ptr_or_null<T>(dw),
                           s.defined() ? static_cast<const A*>(s.data_ptr()) : nullptr,
                           out.defined() ? static_cast<T*>(out.data_ptr()) : nullptr,
                           dg.defined() ? static_cast<T*>(dg.data_ptr()) : nullptr,
                           I(v.numel()),
                           I(v.size(dim)),
                           I(inner)};
    constexpr int V = vec16<T>();
    const bool packs = aligned16(p.v) && (!p.dw || aligned16(p.dw)) && (!p.out || aligned16(p.out));
    const int64_t threads = std::max<int64_t>(packs ? (v.numel() + V - 1) / V : v.numel(), v.size(dim));
    const unsigned grid = std::max<unsigned>(grid_for(threads, 256), unsigned((v.size(dim) + 255) / 256));
    cudaStream_t stream = engine::cuda::stream();
    if (kBackward && packs)
      weight_norm_backward_kernel<V, T, I><<<grid, 256, 0, stream>>>(p);
    else if (kBackward)
      weight_norm_backward_kernel<1, T, I><<<grid, 256, 0, stream>>>(p);
    else if (packs)
      weight_norm_scale_kernel<V, T, I><<<grid, 256, 0, stream>>>(p);
    else
      weight_norm_scale_kernel<1, T, I><<<grid, 256, 0, stream>>>(p);
  };
  if (fits_int32(v.numel(), {&v}))
    launch(int32_t(0));
  else
    launch(int64_t(0));
}

// The one-pass kernels (weight_norm_one_pass in ops/norm.h: the channels are v's rows or its columns). Each
// channel's sum (of v * v forward, of dw * v backward) is taken in f32 in a fixed order, then the same elements are
// read again (from L1/L2) for the pointwise pass; the forward writes norm_sq, the backward reads the saved one and
// writes dg. No workspace, one launch: convs2s's 69 weights spent 10-20 us each in the sum, partials and scale
// launches.
template <bool kBackward, typename T>
struct OnePassArgs {
  using A = acc_t<T>;
  const T* v;
  const T* g;      // [n]
  A* norm_sq;      // [n]: written forward, read backward
  const T* dw;     // backward
  T* out;          // w forward, dv backward (or null)
  T* dg;           // backward (or null)
  int64_t n, len;  // channels, elements per channel
};

// The pointwise value for one element, given the channel's g, squared norm and (backward) sum s of dw * v:
// forward w = v g / r; backward dv = (g / r) dw - (g / r) (s / r^2) v, as weight_norm_backward_kernel.
template <bool kBackward, typename A>
struct ChannelScale {
  A a, b;  // out = a * (forward: v; backward: dw) + b * v
  __device__ ChannelScale(A g, A norm_sq, A s) {
    a = g / sqrt(norm_sq);
    b = kBackward ? -a * s / norm_sq : A(0);
  }
  __device__ A operator()(A x, A ve) const { return kBackward ? a * x + b * ve : a * ve; }
};

// Channels as rows of [n, len]: a warp per row (grid-stride), VEC-element packs when every row starts 16-byte
// aligned; lanes sum their packs, then a fixed shuffle tree.
template <bool kBackward, int VEC, typename T>
__global__ void weight_norm_rows_kernel(OnePassArgs<kBackward, T> p) {
  using A = acc_t<T>;
  const int lane = threadIdx.x & 31;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x >> 5);
  for (int64_t j = int64_t(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5); j < p.n; j += warps) {
    const T* v = p.v + j * p.len;
    const T* dw = kBackward ? p.dw + j * p.len : nullptr;
    A sum = 0;
    for (int64_t i = int64_t(lane) * VEC; i < p.len; i += 32 * VEC) {
      Vec<T, VEC> x = *reinterpret_cast<const Vec<T, VEC>*>(v + i), y = x;
      if (kBackward) y = *reinterpret_cast<const Vec<T, VEC>*>(dw + i);
#pragma unroll
      for (int q = 0; q < VEC; q++) sum += to_acc<A>(y.v[q]) * to_acc<A>(x.v[q]);
    }
    sum = warp_sum(sum);
    if (!kBackward && lane == 0) p.norm_sq[j] = sum;
    const A norm_sq = kBackward ? p.norm_sq[j] : sum;
    if (kBackward && p.dg && lane == 0) p.dg[j] = from_acc<T>(sum / sqrt(norm_sq));
    if (!p.out) continue;
    const ChannelScale<kBackward, A> f(to_acc<A>(p.g[j]), norm_sq, sum);
    T* out = p.out + j * p.len;
    for (int64_t i = int64_t(lane) * VEC; i < p.len; i += 32 * VEC) {
      Vec<T, VEC> x = *reinterpret_cast<const Vec<T, VEC>*>(v + i), y = x, z;
      if (kBackward) y = *reinterpret_cast<const Vec<T, VEC>*>(dw + i);
#pragma unroll
      for (int q = 0; q < VEC; q++) z.v[q] = from_acc<T>(f(to_acc<A>(y.v[q]), to_acc<A>(x.v[q])));
      *reinterpret_cast<Vec<T, VEC>*>(out + i) = z;
    }
  }
}

// Channels as columns of [len, n]: a block of kColLanes x 16 threads per 16 columns, thread (lane, c) summing rows
// lane, lane + kColLanes, ... of column c (a warp reads two rows of 16 adjacent elements; the loops unrolled so that
// several rows' loads are in flight: a conv weight's few blocks are otherwise latency-bound), the lanes' sums added
// in lane order through shared memory.
constexpr int kColLanes = 64;
template <bool kBackward, typename T>
__global__ void weight_norm_cols_kernel(OnePassArgs<kBackward, T> p) {
  using A = acc_t<T>;
  __shared__ A partial[kColLanes][16];
  __shared__ A total[16];
  const int c = threadIdx.x & 15, lane = threadIdx.x >> 4;
  const int64_t j = int64_t(blockIdx.x) * 16 + c;
  const bool live = j < p.n;
  A sum = 0;
  if (live)
#pragma unroll 8
    for (int64_t r = lane; r < p.len; r += kColLanes) {
      const A ve = to_acc<A>(p.v[r * p.n + j]);
      sum += (kBackward ? to_acc<A>(p.dw[r * p.n + j]) : ve) * ve;
    }
  partial[lane][c] = sum;
  __syncthreads();
  if (lane == 0) {
    A t = 0;
    for (int l = 0; l < kColLanes; l++) t += partial[l][c];
    total[c] = t;
    if (live && !kBackward) p.norm_sq[j] = t;
    if (live && kBackward && p.dg) p.dg[j] = from_acc<T>(t / sqrt(p.norm_sq[j]));
  }
  __syncthreads();
  if (!live || !p.out) return;
  const ChannelScale<kBackward, A> f(to_acc<A>(p.g[j]), kBackward ? p.norm_sq[j] : total[c], total[c]);
#pragma unroll 4
  for (int64_t r = lane; r < p.len; r += kColLanes) {
    const A ve = to_acc<A>(p.v[r * p.n + j]);
    p.out[r * p.n + j] = from_acc<T>(f(kBackward ? to_acc<A>(p.dw[r * p.n + j]) : ve, ve));
  }
}

template <bool kBackward, typename T>
void launch_one_pass(const Tensor& v, int64_t dim, const Tensor& g, const Tensor& norm_sq, const Tensor& dw,
                     const Tensor& out, const Tensor& dg) {
  using A = acc_t<T>;
  const int64_t n = v.size(dim), len = n == 0 ? 0 : v.numel() / n;
  if (n == 0) return;
  int64_t outer = 1;
  for (int64_t d = 0; d < dim; d++) outer *= v.size(d);
  OnePassArgs<kBackward, T> p{static_cast<const T*>(v.data_ptr()),
                              static_cast<const T*>(g.data_ptr()),
                              static_cast<A*>(norm_sq.data_ptr()),
                              ptr_or_null<T>(dw),
                              out.defined() ? static_cast<T*>(out.data_ptr()) : nullptr,
                              dg.defined() ? static_cast<T*>(dg.data_ptr()) : nullptr,
                              n,
                              len};
  cudaStream_t stream = engine::cuda::stream();
  if (outer > 1) {  // columns of [len, n] (weight_norm_one_pass: then nothing follows dim)
    weight_norm_cols_kernel<kBackward, T><<<unsigned((n + 15) / 16), 16 * kColLanes, 0, stream>>>(p);
    return;
  }
  constexpr int V = vec16<T>();
  const bool packs = len % V == 0 && aligned16(p.v) && (!p.dw || aligned16(p.dw)) && (!p.out || aligned16(p.out));
  const unsigned grid = unsigned(std::min<int64_t>((n + 7) / 8, 65535));  // 8 warps (rows) a block
  if (packs)
    weight_norm_rows_kernel<kBackward, V, T><<<grid, 256, 0, stream>>>(p);
  else
    weight_norm_rows_kernel<kBackward, 1, T><<<grid, 256, 0, stream>>>(p);
}

}  // namespace

void weight_norm_scale(const Tensor& v, const Tensor& g, const Tensor& norm_sq, int64_t dim, const Tensor& w) {
  if (v.numel() == 0) return;
  ENGINE_CUDA_FLOAT_SWITCH(v.dtype(), T,
                           { launch_weight_norm<false, T>(v, dim, g, norm_sq, Tensor(), Tensor(), w, Tensor()); });
  ENGINE_CUDA_LAUNCH_CHECK("weight_norm");
}

void weight_norm_forward_one_pass(const Tensor& v, const Tensor& g, int64_t dim, const Tensor& norm_sq,
                                  const Tensor& w) {
  if (v.numel() == 0) return;
  ENGINE_CUDA_FLOAT_SWITCH(v.dtype(), T, { launch_one_pass<false, T>(v, dim, g, norm_sq, Tensor(), w, Tensor()); });
  ENGINE_CUDA_LAUNCH_CHECK("weight_norm (one pass)");
}

void weight_norm_backward_one_pass(const Tensor& dw, const Tensor& v, const Tensor& g, const Tensor& norm_sq,
                                   int64_t dim, const Tensor& dv, const Tensor& dg) {
  if (v.size(dim) == 0 || (!dv.defined() && !dg.defined())) return;
  ENGINE_CUDA_FLOAT_SWITCH(v.dtype(), T, { launch_one_pass<true, T>(v, dim, g, norm_sq, dw, dv, dg); });
  ENGINE_CUDA_LAUNCH_CHECK("weight_norm_backward (one pass)");
}

void weight_norm_backward(const Tensor& dw, const Tensor& v, const Tensor& g, const Tensor& norm_sq, const Tensor& s,
                          int64_t dim, const Tensor& dv, const Tensor& dg) {
  if (v.size(dim) == 0 || (!dv.defined() && !dg.defined())) return;
  ENGINE_CUDA_FLOAT_SWITCH(v.dtype(), T, { launch_weight_norm<true, T>(v, dim, g, norm_sq, dw, s, dv, dg); });
  ENGINE_CUDA_LAUNCH_CHECK("weight_norm_backward");
}

}  // namespace ops::cuda
