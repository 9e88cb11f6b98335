// cuda/dropout.cu: dropout's keep mask drawn on the fly from Philox, never stored.
//
// Element i is kept iff dropout_bits(seed, offset, i) >= threshold (engine/rng.h's 16-bit draws, the same
// ENGINE_HD code the cpu runs) and then multiplied by keep_scale = 1 / (1 - p_q) in float (double for f64):
// one rounding, as on the cpu, so the outputs agree bit for bit, masks included.
//
//   dropout_packed   x dense and offset a multiple of 4 (the generator reserves in fours): a thread takes 8
//                    consecutive elements, the 8 halves of one Philox block (engine::dropout_block: 7 rounds
//                    per 8 elements), loaded and stored as 16-byte vectors; two packs per pass, loads first.
//   dropout_strided  anything else: a thread per element, dropout_bits for it, x read through the
//                    collapsed layout (kernel_util.cuh's Indexer).
//   drop_path_*      one draw per sample of `group` elements (NASNet's drop path): a block row per sample.
// Bound: memory (x read, out written: 2 x nbytes); the Philox rounds (two 32x32->64 multiplies per round)
// are 7 per 8 elements. Measured on an H200 (ElementwiseCuda.DISABLED_Bandwidth, 2026-12-04): 2.6 TB/s f32,
// 3.5 TB/s bf16 with 10 rounds per 8 elements (with 32-bit draws, one block per 4 elements, bf16 had been
// Philox-bound at 2.85 TB/s).
#include <algorithm>

#include "engine/rng.h"
#include "ops/cuda/convert.cuh"
#include "ops/cuda/dropout.h"

namespace ops::cuda {

using engine::Shape;
using engine::Tensor;

namespace {

constexpr int kThreads = 256;

template <typename T>
struct DropoutArgs {
  using A = acc_t<T>;
  uint32_t threshold;  // keep iff the element's 16-bit draw >= threshold
  A scale;             // 1 / (1 - p_q), or 0 when nothing is kept
  uint64_t seed, offset;
};

template <typename T>
DropoutArgs<T> dropout_args(double p, uint64_t seed, uint64_t offset) {
  const engine::DropoutRate rate = engine::dropout_rate(p);
  return DropoutArgs<T>{rate.threshold, acc_t<T>(rate.keep_scale), seed, offset};
}

template <typename T>
__device__ __forceinline__ T drop(const DropoutArgs<T>& d, uint32_t bits, T x) {
  using A = acc_t<T>;
  return st<T>(bits >= d.threshold ? A(ld(x)) * d.scale : A(0));
}

// Elements per thread in the packed kernel: one Philox block's 8 draws.
constexpr int kPacked = 8;

// dropout_packed: grid-stride over packs of 8 elements; pack k covers elements [8k, 8k + 8), whose draws are
// the halves of Philox block offset/4 + k. A thread takes two packs per pass (k and k + the grid's threads) and
// issues both packs' loads before either's Philox rounds, so that its loads are in flight while the rounds run
// (ncu, H200 2026-12-04, f32 with one pack per pass: 52-56% of DRAM bandwidth, the warps waiting on their one
// load). The n % 8 tail elements go to the first threads, one each, through dropout_bits.
template <typename T>
__global__ void dropout_packed(const T* x, T* out, int64_t n, DropoutArgs<T> d) {
  constexpr int E = kPacked, VEC = vec16<T>(), V = E / VEC, kPasses = 2;
  static_assert(E % VEC == 0, "a pack is whole 16-byte vectors");
  const int64_t packs = n / E;
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  for (int64_t k0 = tid; k0 < packs; k0 += kPasses * step) {
    Vec<T, VEC> in[kPasses][V];
#pragma unroll
    for (int p = 0; p < kPasses; p++) {
      const int64_t k = k0 + p * step;
      if (k < packs)
#pragma unroll
        for (int v = 0; v < V; v++) in[p][v] = reinterpret_cast<const Vec<T, VEC>*>(x + k * E)[v];
    }
#pragma unroll
    for (int p = 0; p < kPasses; p++) {
      const int64_t k = k0 + p * step;
      if (k >= packs) break;
      uint32_t r[4];
      engine::dropout_block(d.seed, d.offset / 4 + uint64_t(k), r);
#pragma unroll
      for (int v = 0; v < V; v++) {
        Vec<T, VEC> o;
#pragma unroll
        for (int j = 0; j < VEC; j++) o.v[j] = drop(d, engine::philox_half(r, uint32_t(v * VEC + j)), in[p][v].v[j]);
        reinterpret_cast<Vec<T, VEC>*>(out + k * E)[v] = o;
      }
    }
  }
  const int64_t i = packs * E + tid;
  if (i < n) out[i] = drop(d, engine::dropout_bits(d.seed, d.offset, uint64_t(i)), x[i]);
}

// dropout_strided: grid-stride, a thread per element i (row-major over x's shape), x at its strided
// offset, out[i] dense.
template <typename T, typename I>
__global__ void dropout_strided(const T* x, T* out, int64_t n, Indexer<1, I> ix, DropoutArgs<T> d) {
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    I off[1];
    ix.offsets(I(i), off);
    out[i] = drop(d, engine::dropout_bits(d.seed, d.offset, uint64_t(i)), x[off[0]]);
  }
}

// drop_path_dense: x dense; block row blockIdx.y is sample n (one draw, taken once per thread), threads walk
// its `group` elements with 16-byte vectors when group and the pointers allow, else one element at a time.
template <typename T, int VEC>
__global__ void drop_path_dense(const T* x, T* out, int64_t group, DropoutArgs<T> d) {
  const int64_t n = blockIdx.y;
  const T* xs = x + n * group;
  T* os = out + n * group;
  const uint32_t bits = engine::dropout_bits(d.seed, d.offset, uint64_t(n));
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; k < group / VEC; k += step) {
    Vec<T, VEC> in = reinterpret_cast<const Vec<T, VEC>*>(xs)[k], o;
#pragma unroll
    for (int j = 0; j < VEC; j++) o.v[j] = drop(d, bits, in.v[j]);
    reinterpret_cast<Vec<T, VEC>*>(os)[k] = o;
  }
}

// dropout_strided with one draw per `group` elements (drop path on a strided x).
template <typename T, typename I>
__global__ void drop_path_strided(const T* x, T* out, int64_t n, int64_t group, Indexer<1, I> ix, DropoutArgs<T> d) {
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    I off[1];
    ix.offsets(I(i), off);
    out[i] = drop(d, engine::dropout_bits(d.seed, d.offset, uint64_t(i / group)), x[off[0]]);
  }
}

}  // namespace

namespace {

void drop_path(const Tensor& x, double p, uint64_t seed, uint64_t offset, const Tensor& out, int64_t group) {
  const int64_t n = x.numel(), samples = n / group;
  ENGINE_CHECK(samples <= 65535, "drop_path: at most 65535 samples on the GPU, got ", samples);
  cudaStream_t stream = engine::cuda::stream();
  ENGINE_CUDA_FLOAT_SWITCH(x.dtype(), T, {
    const DropoutArgs<T> d = dropout_args<T>(p, seed, offset);
    const T* px = static_cast<const T*>(x.data_ptr());
    T* po = static_cast<T*>(out.data_ptr());
    constexpr int VEC = vec16<T>();
    const dim3 grid(std::min<unsigned>(grid_for(group / VEC + 1, kThreads), 64u), unsigned(samples));
    if (x.is_contiguous() && group % VEC == 0 && aligned16(px) && aligned16(po)) {
      drop_path_dense<T, VEC><<<grid, kThreads, 0, stream>>>(px, po, group, d);
    } else if (x.is_contiguous()) {
      drop_path_dense<T, 1>
          <<<dim3(std::min<unsigned>(grid_for(group, kThreads), 64u), unsigned(samples)), kThreads, 0, stream>>>(
              px, po, group, d);
    } else {
      auto ix = make_indexer<1, int64_t>("drop_path", x.shape(), {x.strides()});
      drop_path_strided<<<grid_for(n, kThreads), kThreads, 0, stream>>>(px, po, n, group, ix, d);
    }
  });
  ENGINE_CUDA_LAUNCH_CHECK("drop_path");
}

}  // namespace

void dropout(const Tensor& x, double p, uint64_t seed, uint64_t offset, const Tensor& out, int64_t group) {
  if (x.numel() == 0) return;
  if (group > 1) return drop_path(x, p, seed, offset, out, group);
  const int64_t n = x.numel();
  cudaStream_t stream = engine::cuda::stream();
  ENGINE_CUDA_FLOAT_SWITCH(x.dtype(), T, {
    const DropoutArgs<T> d = dropout_args<T>(p, seed, offset);
    const T* px = static_cast<const T*>(x.data_ptr());
    T* po = static_cast<T*>(out.data_ptr());
    if (x.is_contiguous() && offset % 4 == 0 && aligned16(px) && aligned16(po)) {
      dropout_packed<<<grid_for(n / kPacked + 1, kThreads), kThreads, 0, stream>>>(px, po, n, d);
    } else if (fits_int32(n, {&x})) {
      auto ix = make_indexer<1, int32_t>("dropout", x.shape(), {x.strides()});
      dropout_strided<<<grid_for(n, kThreads), kThreads, 0, stream>>>(px, po, n, ix, d);
    } else {
      auto ix = make_indexer<1, int64_t>("dropout", x.shape(), {x.strides()});
      dropout_strided<<<grid_for(n, kThreads), kThreads, 0, stream>>>(px, po, n, ix, d);
    }
  });
  ENGINE_CUDA_LAUNCH_CHECK("dropout");
}

}  // namespace ops::cuda
