// cuda/kernel_util.cuh: device-side helpers shared by the row and gather kernels of ops/cuda/*.cu:
// storage types and conversions, 16-byte vectors, warp and block reductions, a strided indexer, and the
// host-visible flag through which a kernel reports an out-of-range index.
//
// Conversions mirror the CPU reference exactly: bf16/f16 are loaded to float, all math runs in acc_t
// (float, double for f64), and stores round to nearest even (__float2bfloat16_rn, __float2half_rn), which
// is what engine::bf16 / engine::f16 do on the host. Reductions are fixed trees (xor butterflies in a
// warp, then warps in order), so every result is the same from run to run.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <array>
#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "engine/cuda/runtime.h"
#include "engine/tensor.h"

namespace ops::cuda {

// ---------------------------------------------------------------------------------------------------
// Storage types: T is what a tensor holds on the device, acc_t<T> what kernels compute in.

template <typename T> struct Acc { using type = float; };
template <> struct Acc<double> { using type = double; };
template <typename T> using acc_t = typename Acc<T>::type;

template <typename A> __device__ __forceinline__ A to_acc(float v) { return A(v); }
template <typename A> __device__ __forceinline__ A to_acc(double v) { return A(v); }
template <typename A> __device__ __forceinline__ A to_acc(__nv_bfloat16 v) { return A(__bfloat162float(v)); }
template <typename A> __device__ __forceinline__ A to_acc(__half v) { return A(__half2float(v)); }

template <typename T> __device__ __forceinline__ T from_acc(float v) { return T(v); }
template <typename T> __device__ __forceinline__ T from_acc(double v) { return T(v); }
template <> __device__ __forceinline__ float from_acc<float>(double v) { return float(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_acc<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <> __device__ __forceinline__ __half from_acc<__half>(float v) { return __float2half_rn(v); }

// ENGINE_CUDA_FLOAT_SWITCH(dtype, T, { body using T }): T is the device storage type of a floating dtype.
#define ENGINE_CUDA_FLOAT_SWITCH(dtype, T, ...)                                                          \
  switch (dtype) {                                                                                    \
    case ::engine::DType::f32: { using T = float; __VA_ARGS__; } break;                               \
    case ::engine::DType::f64: { using T = double; __VA_ARGS__; } break;                              \
    case ::engine::DType::bf16: { using T = __nv_bfloat16; __VA_ARGS__; } break;                      \
    case ::engine::DType::f16: { using T = __half; __VA_ARGS__; } break;                              \
    default: throw ::engine::Error(::engine::str("cuda kernel: dtype ", ::engine::dtype_name(dtype),  \
                                                 " is not a floating type"));                        \
  }

// ENGINE_CUDA_INDEX_SWITCH(dtype, I, { body using I }): index tensors are i32 or i64.
#define ENGINE_CUDA_INDEX_SWITCH(dtype, I, ...)                                                          \
  switch (dtype) {                                                                                    \
    case ::engine::DType::i32: { using I = int32_t; __VA_ARGS__; } break;                             \
    case ::engine::DType::i64: { using I = int64_t; __VA_ARGS__; } break;                             \
    default: throw ::engine::Error(::engine::str("cuda kernel: index dtype ", ::engine::dtype_name(dtype), \
                                                 " is not i32 or i64"));                             \
  }

// ---------------------------------------------------------------------------------------------------
// 16-byte vectors: VEC elements of T loaded or stored with one instruction.

template <typename T, int VEC> struct alignas(sizeof(T) * VEC) Vec { T v[VEC]; };

// Elements per 16-byte vector for T (4 for f32, 8 for bf16/f16, 2 for f64).
template <typename T> constexpr int vec16() { return int(16 / sizeof(T)); }

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }
// The widest vector of v elements of `elem` bytes, v a power of two <= most, that divides the channel count C
// and to which every pointer (nullptr: absent, ignored) is aligned; 1 when none wider does.
inline int channel_vector(int64_t C, size_t elem, int most, std::initializer_list<const void*> ptrs) {
  for (int v = most; v >= 2; v /= 2) {
    bool ok = C % v == 0;
    for (const void* p : ptrs) ok = ok && reinterpret_cast<uintptr_t>(p) % (elem * size_t(v)) == 0;
    if (ok) return v;
  }
  return 1;
}

// An optional operand (a norm's weight or bias, a loss's class weights): its data, or null when absent; the
// stride of a 1-D one (0 when absent); and on the device, element i as A, or `fill` when the pointer is null.
template <typename T> const T* ptr_or_null(const engine::Tensor& t) {
  return t.defined() ? static_cast<const T*>(t.data_ptr()) : nullptr;
}
inline int64_t stride_or_zero(const engine::Tensor& t) { return t.defined() ? t.strides().back() : 0; }
template <typename T, typename A> __device__ __forceinline__ A load_or(const T* p, int64_t i, A fill) {
  return p ? to_acc<A>(p[i]) : fill;
}

// Loads VEC consecutive elements p[0..VEC) as A (one vector load; p must be aligned when VEC > 1), or,
// when VEC == 1, the single element p[0].
template <int VEC, typename T, typename A>
__device__ __forceinline__ void load_vec(const T* p, A (&out)[VEC]) {
  Vec<T, VEC> v = *reinterpret_cast<const Vec<T, VEC>*>(p);
#pragma unroll
  for (int k = 0; k < VEC; k++) out[k] = to_acc<A>(v.v[k]);
}

template <int VEC, typename T, typename A>
__device__ __forceinline__ void store_vec(T* p, const A (&in)[VEC]) {
  Vec<T, VEC> v;
#pragma unroll
  for (int k = 0; k < VEC; k++) v.v[k] = from_acc<T>(in[k]);
  *reinterpret_cast<Vec<T, VEC>*>(p) = v;
}

// Calls f(std::integral_constant<int, VEC>) with the widest VEC in {8, 4, 2, 1} (at most one 16-byte vector of
// T) that divides the channel count C and to which every pointer is aligned: kernels over NHWC tensors that
// take VEC consecutive channels per thread.
template <typename T, typename F>
void with_channel_vector(int64_t C, std::initializer_list<const void*> ptrs, F&& f) {
  switch (channel_vector(C, sizeof(T), vec16<T>() < 8 ? vec16<T>() : 8, ptrs)) {
    case 8:
      f(std::integral_constant<int, 8>());
      break;
    case 4:
      f(std::integral_constant<int, 4>());
      break;
    case 2:
      f(std::integral_constant<int, 2>());
      break;
    default:
      f(std::integral_constant<int, 1>());
      break;
  }
}

// ---------------------------------------------------------------------------------------------------
// Reductions. Warp: xor butterfly, every lane ends with the same value. Block: each warp reduces, warp
// results go through shared memory (32 slots), warp 0 reduces them in order; every thread gets the result.

template <typename A> __device__ __forceinline__ A warp_sum(A v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

template <typename A> __device__ __forceinline__ A warp_max(A v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024). `scratch` holds 32 values; the call
// ends with a barrier, so the same scratch can serve the next reduction.
template <typename A> __device__ A block_sum(A v, A* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_sum(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  A total = lane < warps ? scratch[lane] : A(0);
  total = warp_sum(total);
  __syncthreads();
  return total;
}

template <typename A> __device__ A block_max(A v, A* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_max(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  A total = lane < warps ? scratch[lane] : A(-INFINITY);
  total = warp_max(total);
  __syncthreads();
  return total;
}

// The online softmax step: folds v into the running (max m, sum s of exp(x - m)). -inf adds nothing
// (so a row that starts with masked entries stays finite); an all -inf row ends with s = 0 and gives
// NaN, as the CPU's exp(-inf - -inf) does.
template <typename A> __device__ __forceinline__ void online_add(A& m, A& s, A v) {
  if (v > m) {
    s = s * std::exp(m - v) + A(1);
    m = v;
  } else if (v != A(-INFINITY)) {
    s += std::exp(v - m);
  }
}

// Combines per-thread (m, s) over the block; returns the row's (max, sum).
template <typename A> __device__ void block_online_reduce(A& m, A& s, A* scratch) {
  const A row_max = block_max(m, scratch);
  s = s == A(0) ? A(0) : s * std::exp(m - row_max);
  s = block_sum(s, scratch);
  m = row_max;
}

// ---------------------------------------------------------------------------------------------------
// Strided indexing: element offsets of K tensors that share one logical shape (a stride of 0 broadcasts).
// Built on the host with dimensions of size 1 dropped and neighbouring dimensions merged wherever every
// tensor's strides allow it, so a contiguous or simply sliced layout becomes one or two dimensions.
// I is the index type: int32_t when the element count fits (a 32-bit division is several times cheaper).

constexpr int kMaxDims = 12;

template <int K, typename I> struct Indexer {
  int ndim = 0;
  I size[kMaxDims];
  I stride[K][kMaxDims];

  // Offsets (in elements) of logical element i in each of the K tensors. The outermost dimension needs
  // no division: what is left of i after the inner dimensions is its index.
  __device__ __forceinline__ void offsets(I i, I (&off)[K]) const {
#pragma unroll
    for (int k = 0; k < K; k++) off[k] = 0;
    for (int d = ndim - 1; d > 0; d--) {
      I q = i / size[d], r = i - q * size[d];
      i = q;
#pragma unroll
      for (int k = 0; k < K; k++) off[k] += r * stride[k][d];
    }
    if (ndim > 0) {
#pragma unroll
      for (int k = 0; k < K; k++) off[k] += i * stride[k][0];
    }
  }
};

template <int K, typename I>
Indexer<K, I> make_indexer(const char* op, const engine::Shape& shape, const std::array<engine::Shape, K>& strides) {
  Indexer<K, I> ix;
  int n = 0;
  for (size_t d = 0; d < shape.size(); d++) {
    if (shape[d] == 1) continue;
    bool merge = n > 0;
    for (int k = 0; merge && k < K; k++) merge = ix.stride[k][n - 1] == I(strides[k][d] * shape[d]);
    if (merge) {
      ix.size[n - 1] *= I(shape[d]);
      for (int k = 0; k < K; k++) ix.stride[k][n - 1] = I(strides[k][d]);
      continue;
    }
    ENGINE_CHECK(n < kMaxDims, op, ": cuda kernels take at most ", kMaxDims, " non-mergeable dimensions, got shape ",
                 engine::shape_str(shape));
    ix.size[n] = I(shape[d]);
    for (int k = 0; k < K; k++) ix.stride[k][n] = I(strides[k][d]);
    n++;
  }
  ix.ndim = n;
  return ix;
}

// True when 32-bit indexing is safe for `numel` elements addressed through the given strides.
inline bool fits_int32(int64_t numel, const std::initializer_list<const engine::Tensor*>& ts) {
  if (numel >= (int64_t(1) << 31)) return false;
  for (const engine::Tensor* t : ts) {
    int64_t span = 1;
    for (size_t d = 0; d < t->shape().size(); d++) span += (t->shape()[d] - 1) * std::abs(t->strides()[d]);
    if (span >= (int64_t(1) << 31)) return false;
  }
  return true;
}

// ---------------------------------------------------------------------------------------------------
// Row kernels (softmax, layer norm, cross-entropy): a "row" is the line of n elements along one dimension;
// rows are numbered row-major over the shape with that dimension collapsed, and located with an Indexer.

// Each row's offset in each of K tensors (the dimension `dim` is the row itself).
template <int K>
Indexer<K, int64_t> row_indexer(const char* op, const engine::Shape& shape, int64_t dim,
                                const std::array<engine::Shape, K>& strides) {
  engine::Shape rows = shape;
  rows[size_t(dim)] = 1;
  return make_indexer<K, int64_t>(op, rows, strides);
}

// True when rows of n unit-stride elements can be read as vectors of `vec`: n divisible, every base
// pointer (nullptr: absent, ignored) 16-byte aligned, every row offset a multiple of vec.
template <int K>
bool rows_aligned(const Indexer<K, int64_t>& ix, int64_t n, int vec, std::initializer_list<const void*> bases) {
  if (n % vec != 0) return false;
  for (const void* p : bases)
    if (p && !aligned16(p)) return false;
  for (int k = 0; k < K; k++)
    for (int d = 0; d < ix.ndim; d++)
      if (ix.stride[k][d] % vec != 0) return false;
  return true;
}

// Warp-per-row kernels hold a row in registers: lane l owns chunks (i * 32 + l) of VEC elements, i < ITEMS.
// with_lane_items calls f(std::integral_constant<int, ITEMS>) with the smallest ITEMS in {1, 2, 3, 4, 6, 8}
// (with ITEMS * VEC <= kMaxLaneValues) whose warp covers n, and returns false when n is too long for a
// warp (3 and 6 fit the common widths 384 and 768 exactly).
constexpr int kMaxLaneValues = 32;

template <int VEC, int ITEMS, typename F> bool try_lane_items(int64_t chunks, F& f) {
  if constexpr (ITEMS * VEC <= kMaxLaneValues) {
    if (chunks <= 32 * ITEMS) {
      f(std::integral_constant<int, ITEMS>{});
      return true;
    }
  }
  return false;
}

template <int VEC, typename F> bool with_lane_items(int64_t n, F&& f) {
  const int64_t chunks = (n + VEC - 1) / VEC;
  return try_lane_items<VEC, 1>(chunks, f) || try_lane_items<VEC, 2>(chunks, f) ||
         try_lane_items<VEC, 3>(chunks, f) || try_lane_items<VEC, 4>(chunks, f) ||
         try_lane_items<VEC, 6>(chunks, f) || try_lane_items<VEC, 8>(chunks, f);
}

// ---------------------------------------------------------------------------------------------------
// Launch sizes. Grid-stride kernels get at most `waves` blocks per multiprocessor; the work per thread
// then does not depend on the grid, and no result depends on it either (no kernel reduces across a
// grid-sized partition; deterministic reductions use fixed partitions chosen by the op).

inline unsigned grid_for(int64_t work_items, int threads, int waves = 8) {
  int64_t blocks = (work_items + threads - 1) / threads;
  int64_t cap = int64_t(engine::cuda::multiprocessors()) * waves;
  if (cap <= 0) cap = 1024;
  return unsigned(std::max<int64_t>(1, std::min(blocks, cap)));
}

// ---------------------------------------------------------------------------------------------------
// Out-of-range indices. The CPU reference raises an Error while it runs; a kernel cannot. A kernel that
// finds an index outside [0, size) skips it and records it in a record that lives in mapped (zero-copy)
// pinned host memory: a ring of 1024 16-byte records allocated once per process with cudaHostAlloc, host
// memory and not part of the arena, so the device's accounting is unchanged. The launcher takes a cleared
// record before the kernel and files it under its op after; the records are read after the stream's next
// synchronization (engine::cuda::on_synchronized: Device::synchronize, copies to and from the host; at the
// latest the step's end), which throws the CPU's message for the first op that was hit. So an indexing op
// (embedding, gather, index_select, their backward ops, cross-entropy) no longer waits for the GPU: the
// error surfaces at the next synchronization, not at the op (as CUDA's own errors do), and the ops between
// ran on the skipped indices' unwritten values. A full ring synchronizes first.
struct IndexError {
  int32_t hit;    // 0 while no index was out of range
  int32_t pad;
  int64_t value;  // one offending index (which one, when several are, is unspecified)
};

// A cleared record, as a device pointer for the kernel.
IndexError* index_error_begin();
// Files that record under `op`: after the next synchronization, "op: index v is out of range for a dimension of
// size n" is thrown if it was hit.
void index_error_end(const char* op, int64_t size);

__device__ __forceinline__ void report_bad_index(IndexError* e, int64_t v) {
  if (atomicExch(&e->hit, 1) == 0) e->value = v;
}

}  // namespace ops::cuda
