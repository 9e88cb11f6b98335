// cuda/reduce.cu: sum over any set of dimensions (of x, or of the products x * y into the accumulation type:
// sum_of_products), and the max (value and first index) along one.
//
// The host first collapses x's layout: size-1 dimensions go, neighbouring dimensions merge where strides
// allow, and the rest split into kept dimensions (which index the outputs, row-major: out is contiguous)
// and reduced ones (which index the R inputs of each output). Then one of two mappings:
//   rows     the innermost dimension is reduced: each output's inputs are a run along memory, read by a
//            warp (or a whole block for long runs) with 16-byte packs where the run is dense, then summed
//            by a shuffle tree;
//   columns  the innermost dimension is kept (sum over the batch: bias gradients): a block covers 32
//            (16-bit types: 64) neighbouring outputs (coalesced reads along the kept dimension) and 8 lanes
//            (16) over the inputs, each lane a strided loop, the lane sums added in order through shared memory.
// When the op passed a workspace of partial sums [splits, O] (few outputs, many inputs each), the inputs
// of an output are cut into `splits` pieces summed by separate blocks, and sum_partials adds the pieces in
// order. Every thread's share of the work is fixed by the shape alone and every tree has a fixed shape:
// the result is the same on every run (no atomics). Sums accumulate in float (double for f64) as on the
// cpu, in a different order (trees instead of one running sum), so they agree to rounding.
// All kernels are bound by memory: bytes = x read once + outputs (+ 2 x partials) written. Measured on an H200
// ([65536, 1024], GB/s of x read; copy ceiling 4.3 TB/s): rows 4.2 (f32) / 3.9 (bf16), columns 3.8 / 3.3,
// full sum 3.2 / 2.9, argmax rows 3.5 / 1.8 (its comparisons, not its bytes, bound bf16).
#include "ops/cuda/convert.cuh"
#include "ops/cuda/reduce.h"

namespace ops::cuda {

using engine::DType;
using engine::Shape;
using engine::Tensor;

namespace {

constexpr int kThreads = 256;
constexpr int kColTile = 32;   // outputs per block along the kept inner dimension
constexpr int kColLanes = 8;   // lanes over the reduced inputs per output
constexpr int64_t kBlockRowMin = 2048;  // a row of at least this many inputs gets a block, else a warp

// Everything a sum kernel needs, passed by value. O: the output's type (T, or A for a sum of products).
template <typename T, typename I, typename O = T>
struct SumParams {
  using A = acc_t<T>;
  const T* x;
  const T* y;             // the second factor of a sum of products (x's layout), or nullptr
  Indexer<1, I> kept;     // output index -> offset in x (rows: all kept dims; columns: the outer ones)
  Indexer<1, I> reduced;  // input index within an output -> offset in x
  int64_t outputs;        // O
  int64_t count;          // R, inputs per output
  int64_t chunk;          // inputs per piece (count when splits == 1)
  int64_t splits;
  A scale;
  O* out;                 // [O], when splits == 1
  A* partials;            // [splits, O], when splits > 1
  // columns only
  int64_t inner;          // size of the kept inner dimension
  I inner_stride;
  int64_t col_tiles;      // ceil(inner / kColTile)
};

template <typename T, typename I, typename O>
__device__ __forceinline__ void write_sum(const SumParams<T, I, O>& p, int64_t o, int64_t s, acc_t<T> total) {
  if (p.splits == 1)
    p.out[o] = st<O>(total * p.scale);
  else p.partials[s * p.outputs + o] = total;
}

// One term of a sum: x's element at offset i, times y's (kDot: a sum of products).
template <bool kDot, typename T, typename I, typename O>
__device__ __forceinline__ acc_t<T> term(const SumParams<T, I, O>& p, I i) {
  using A = acc_t<T>;
  if constexpr (kDot)
    return A(ld(p.x[i])) * A(ld(p.y[i]));
  else
    return A(ld(p.x[i]));
}

// Sum of the terms at base + reduced(q) for q in [q0, q1) taken by `lane` of `lanes` threads (lanes strided).
// A dense run (one reduced dimension of stride 1) is read in 16-byte packs after a scalar head that
// reaches 16-byte alignment, and a scalar tail (x and y share their layout, so y's packs are aligned as x's).
template <bool kDot, typename T, typename I, typename O>
__device__ acc_t<T> partial_run(const SumParams<T, I, O>& p, I base, int64_t q0, int64_t q1, int lane, int lanes) {
  using A = acc_t<T>;
  A acc = A(0);
  const bool dense = p.reduced.ndim == 0 || (p.reduced.ndim == 1 && p.reduced.stride[0][0] == 1);
  if (dense) {
    constexpr int VEC = vec16<T>();
    const I start = base + I(q0);
    const T* run = p.x + start;
    const int64_t len = q1 - q0;
    int64_t head = int64_t((16 - (reinterpret_cast<uintptr_t>(run) & 15u)) & 15u) / int64_t(sizeof(T));
    if ((reinterpret_cast<uintptr_t>(run) % sizeof(T)) != 0 || head > len) head = len;
    if constexpr (kDot) {  // y's run must be aligned as x's for the packs
      if ((reinterpret_cast<uintptr_t>(p.y + start) & 15u) != (reinterpret_cast<uintptr_t>(run) & 15u)) head = len;
    }
    for (int64_t k = lane; k < head; k += lanes) acc += term<kDot>(p, start + I(k));
    const int64_t packs = (len - head) / VEC;
    const Vec<T, VEC>* vp = reinterpret_cast<const Vec<T, VEC>*>(run + head);
    const Vec<T, VEC>* wp = kDot ? reinterpret_cast<const Vec<T, VEC>*>(p.y + start + I(head)) : nullptr;
#pragma unroll 4
    for (int64_t k = lane; k < packs; k += lanes) {
      Vec<T, VEC> v = vp[k];
      if constexpr (kDot) {
        Vec<T, VEC> w = wp[k];
#pragma unroll
        for (int j = 0; j < VEC; j++) acc += A(ld(v.v[j])) * A(ld(w.v[j]));
      } else {
#pragma unroll
        for (int j = 0; j < VEC; j++) acc += A(ld(v.v[j]));
      }
    }
    for (int64_t k = head + packs * VEC + lane; k < len; k += lanes) acc += term<kDot>(p, start + I(k));
    return acc;
  }
#pragma unroll 4
  for (int64_t q = q0 + lane; q < q1; q += lanes) {
    I off[1];
    p.reduced.offsets(I(q), off);
    acc += term<kDot>(p, base + off[0]);
  }
  return acc;
}

// sum_rows: one task = (output o, piece s). kBlock: a block of kThreads per task (grid = tasks), summed
// with block_sum; else a warp per task (kThreads / 32 tasks per block), summed with warp_sum.
template <bool kBlock, bool kDot, typename T, typename I, typename O>
__global__ void sum_rows(SumParams<T, I, O> p) {
  using A = acc_t<T>;
  __shared__ A scratch[32];
  const int lanes = kBlock ? blockDim.x : 32;
  const int lane = kBlock ? threadIdx.x : (threadIdx.x & 31);
  const int64_t task = kBlock ? int64_t(blockIdx.x) : int64_t(blockIdx.x) * (blockDim.x / 32) + (threadIdx.x >> 5);
  if (!kBlock && task >= p.outputs * p.splits) return;  // whole warps only: the shuffles stay full
  const int64_t s = task / p.outputs, o = task - s * p.outputs;
  I base[1];
  p.kept.offsets(I(o), base);
  const int64_t q0 = s * p.chunk, q1 = min(p.count, q0 + p.chunk);
  A acc = partial_run<kDot>(p, base[0], q0, q1, lane, lanes);
  acc = kBlock ? block_sum(acc, scratch) : warp_sum(acc);
  if (lane == 0) write_sum(p, o, s, acc);
}

// sum_cols: grid (col_tiles * outer outputs, splits); block (kColTile, kColLanes * CV). Thread (tx, ty) sums
// inputs ty, ty + lanes, ... of the CV output columns (tile * 32 + tx) * CV + j within piece blockIdx.y,
// reading them with one CV-element access (CV = 2 for 16-bit types on dense rows: 4-byte loads; twice the
// lanes then keep as many threads per output column); the lane sums of each column are added in lane order.
template <int CV, bool kDot, typename T, typename I, typename O>
__global__ void sum_cols(SumParams<T, I, O> p) {
  using A = acc_t<T>;
  constexpr int kLanes = kColLanes * CV;
  __shared__ A lane_sums[kLanes][kColTile * CV + 1];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t tile = int64_t(blockIdx.x) % p.col_tiles, outer = int64_t(blockIdx.x) / p.col_tiles;
  const int64_t c = (tile * kColTile + tx) * CV, s = blockIdx.y;
  A acc[CV];
#pragma unroll
  for (int j = 0; j < CV; j++) acc[j] = A(0);
  if (c < p.inner) {
    I base[1];
    p.kept.offsets(I(outer), base);
    const I at = base[0] + I(c) * p.inner_stride;
    const int64_t q0 = s * p.chunk, q1 = min(p.count, q0 + p.chunk);
    auto add_at = [&](I off) {  // the CV columns' inputs at reduced offset `off`
      if constexpr (CV == 1) {
        acc[0] += term<kDot>(p, at + off);
      } else {
        Vec<T, CV> v = *reinterpret_cast<const Vec<T, CV>*>(p.x + at + off);
        if constexpr (kDot) {
          Vec<T, CV> w = *reinterpret_cast<const Vec<T, CV>*>(p.y + at + off);
#pragma unroll
          for (int j = 0; j < CV; j++) acc[j] += A(ld(v.v[j])) * A(ld(w.v[j]));
        } else {
#pragma unroll
          for (int j = 0; j < CV; j++) acc[j] += A(ld(v.v[j]));
        }
      }
    };
    // Two loops rather than a test per input: the compiler then unrolls and issues 4 loads at once.
    if (p.reduced.ndim <= 1) {
      const I rs = p.reduced.ndim == 1 ? p.reduced.stride[0][0] : I(0);
#pragma unroll 4
      for (int64_t q = q0 + ty; q < q1; q += kLanes) add_at(I(q) * rs);
    } else {
#pragma unroll 4
      for (int64_t q = q0 + ty; q < q1; q += kLanes) {
        I off[1];
        p.reduced.offsets(I(q), off);
        add_at(off[0]);
      }
    }
  }
#pragma unroll
  for (int j = 0; j < CV; j++) lane_sums[ty][tx * CV + j] = acc[j];
  __syncthreads();
  if (ty == 0) {
#pragma unroll
    for (int j = 0; j < CV; j++) {
      if (c + j >= p.inner) break;
      A total = A(0);
#pragma unroll
      for (int k = 0; k < kLanes; k++) total += lane_sums[k][tx * CV + j];
      write_sum(p, outer * p.inner + c + j, s, total);
    }
  }
}

// sum_partials: out[o] = scale * sum over s of partials[s, o]; a warp per output, lanes strided over s,
// then a shuffle tree. splits == 0 (no inputs at all) writes zeros.
template <typename T, typename O>
__global__ void sum_partials(const acc_t<T>* partials, int64_t outputs, int64_t splits, acc_t<T> scale, O* out) {
  using A = acc_t<T>;
  const int64_t o = int64_t(blockIdx.x) * (blockDim.x / 32) + (threadIdx.x >> 5);
  if (o >= outputs) return;
  const int lane = threadIdx.x & 31;
  A acc = A(0);
  for (int64_t s = lane; s < splits; s += 32) acc += partials[s * outputs + o];
  acc = warp_sum(acc);
  if (lane == 0) out[o] = st<O>(acc * scale);
}

// ---------------------------------------------------------------------------------------------------
// Max with its first index. The order that picks the winner: a NaN beats any number; otherwise the larger
// value; on equal values (or two NaNs) the smaller index. That is the cpu's sequential rule ("v > best, or
// v is the first NaN"), made symmetric so that any tree of combinations gives the sequential answer.

template <typename A> struct ArgMax {
  A value;
  int64_t index;
};

template <typename A> __device__ __forceinline__ bool beats(const ArgMax<A>& a, const ArgMax<A>& b) {
  const bool an = a.value != a.value, bn = b.value != b.value;
  if (an != bn) return an;
  if (!an && a.value != b.value) return a.value > b.value;
  return a.index < b.index;
}

template <typename A> __device__ __forceinline__ ArgMax<A> warp_argmax(ArgMax<A> m) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    ArgMax<A> other{__shfl_xor_sync(0xffffffffu, m.value, o), __shfl_xor_sync(0xffffffffu, m.index, o)};
    if (beats(other, m)) m = other;
  }
  return m;
}

template <typename T, typename I> struct MaxParams {
  const T* x;
  Indexer<1, I> outer;  // output index -> offset in x (every dimension but dim)
  int64_t outputs;
  int64_t n;            // size of dim
  I stride;             // stride of dim
  T* values;
  int64_t* indices;
};

// amax_rows: dim is the innermost, dense dimension. A warp per output (kBlock: a block), lanes strided
// along the row, each lane keeps its running winner (the cpu's loop), then a shuffle tree of winners.
template <bool kBlock, typename T, typename I>
__global__ void amax_rows(MaxParams<T, I> p) {
  using A = acc_t<T>;
  __shared__ ArgMax<A> scratch[32];
  const int lanes = kBlock ? blockDim.x : 32;
  const int lane = kBlock ? threadIdx.x : (threadIdx.x & 31);
  const int64_t o = kBlock ? int64_t(blockIdx.x) : int64_t(blockIdx.x) * (blockDim.x / 32) + (threadIdx.x >> 5);
  if (!kBlock && o >= p.outputs) return;
  I base[1];
  p.outer.offsets(I(o), base);
  ArgMax<A> m{A(-INFINITY), INT64_MAX};
  for (int64_t k = lane; k < p.n; k += lanes) {
    ArgMax<A> c{A(ld(p.x[base[0] + I(k) * p.stride])), k};
    if (beats(c, m)) m = c;
  }
  m = warp_argmax(m);
  if (kBlock) {
    if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = m;
    __syncthreads();
    if (threadIdx.x < 32) {
      m = threadIdx.x < blockDim.x / 32 ? scratch[threadIdx.x] : ArgMax<A>{A(-INFINITY), INT64_MAX};
      m = warp_argmax(m);
    }
  }
  if (threadIdx.x == 0 || (!kBlock && lane == 0)) {
    p.values[o] = st<T>(m.value);
    p.indices[o] = m.index;
  }
}

// amax_cols: dim is not the innermost: a thread per output runs the cpu's loop along dim; neighbouring
// threads read neighbouring elements (coalesced when the innermost dimension is dense).
template <typename T, typename I>
__global__ void amax_cols(MaxParams<T, I> p) {
  using A = acc_t<T>;
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t o = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; o < p.outputs; o += step) {
    I base[1];
    p.outer.offsets(I(o), base);
    A best = A(ld(p.x[base[0]]));
    int64_t arg = 0;
    for (int64_t k = 1; k < p.n; k++) {
      A v = A(ld(p.x[base[0] + I(k) * p.stride]));
      if (v > best || (v != v && best == best)) { best = v; arg = k; }
    }
    p.values[o] = st<T>(best);
    p.indices[o] = arg;
  }
}

// ---------------------------------------------------------------------------------------------------
// Launchers

struct Dims {
  Shape size, stride;
  void add(int64_t n, int64_t s) {
    if (!size.empty() && stride.back() == s * n) {  // merges into the previous dimension
      size.back() *= n;
      stride.back() = s;
      return;
    }
    size.push_back(n);
    stride.push_back(s);
  }
};

template <typename I> Indexer<1, I> indexer(const char* op, const Dims& d) {
  return make_indexer<1, I>(op, d.size, {d.stride});
}

template <typename T, typename I, typename O, bool kDot>
void launch_sum(const Tensor& x, const Tensor& y, const std::vector<bool>& reduced, double scale, const Tensor& out,
                const Tensor& partials) {
  using A = acc_t<T>;
  const Shape& xs = x.shape();
  // Kept and reduced dimensions, and which kind the innermost (size > 1) dimension is.
  Dims kept, red;
  bool inner_reduced = true;
  for (size_t d = 0; d < xs.size(); d++) {
    if (xs[d] == 1) continue;
    (reduced[d] ? red : kept).add(xs[d], x.strides()[d]);
    inner_reduced = reduced[d];
  }
  SumParams<T, I, O> p{};
  p.x = static_cast<const T*>(x.data_ptr());
  p.y = kDot ? static_cast<const T*>(y.data_ptr()) : nullptr;
  p.outputs = out.numel();
  p.count = x.numel() / std::max<int64_t>(p.outputs, 1);
  p.splits = partials.defined() ? partials.shape()[0] : 1;
  p.chunk = (p.count + p.splits - 1) / p.splits;
  p.chunk = (p.chunk + 7) / 8 * 8;  // pieces start 16-byte aligned where the run is
  p.scale = A(scale);
  p.out = static_cast<O*>(out.data_ptr());
  p.partials = partials.defined() ? static_cast<A*>(partials.data_ptr()) : nullptr;
  p.reduced = indexer<I>("sum", red);
  cudaStream_t stream = engine::cuda::stream();
  if (p.count == 0) {  // nothing to add: every output is 0
    sum_partials<T, O><<<unsigned((p.outputs + 7) / 8), kThreads, 0, stream>>>(nullptr, p.outputs, 0, p.scale, p.out);
    return;
  }
  if (inner_reduced) {
    p.kept = indexer<I>("sum", kept);
    const int64_t tasks = p.outputs * p.splits;
    if (p.chunk >= kBlockRowMin) {
      sum_rows<true, kDot><<<unsigned(tasks), kThreads, 0, stream>>>(p);
    } else {
      sum_rows<false, kDot><<<unsigned((tasks + kThreads / 32 - 1) / (kThreads / 32)), kThreads, 0, stream>>>(p);
    }
  } else {
    p.inner = kept.size.back();
    p.inner_stride = I(kept.stride.back());
    kept.size.pop_back();
    kept.stride.pop_back();
    p.kept = indexer<I>("sum", kept);
    const int64_t outer = p.outputs / p.inner;
    ENGINE_CHECK(p.splits <= 65535, "sum: ", p.splits, " partial sums per output is more than a grid allows");
    // 16-bit types on dense rows: two columns per thread (4-byte loads), when every row start is even.
    bool pairs = sizeof(T) == 2 && p.inner_stride == 1 && p.inner % 2 == 0 &&
                 reinterpret_cast<uintptr_t>(p.x) % 4 == 0;
    for (int64_t st : kept.stride) pairs = pairs && st % 2 == 0;
    for (int64_t st : red.stride) pairs = pairs && st % 2 == 0;
    const int cv = pairs ? 2 : 1;
    p.col_tiles = (p.inner + kColTile * cv - 1) / (kColTile * cv);
    const dim3 grid(unsigned(p.col_tiles * outer), unsigned(p.splits)), block(kColTile, kColLanes * cv);
    if (pairs && kDot) pairs = reinterpret_cast<uintptr_t>(p.y) % 4 == 0;
    if (pairs)
      sum_cols<2, kDot><<<grid, block, 0, stream>>>(p);
    else
      sum_cols<1, kDot><<<grid, block, 0, stream>>>(p);
  }
  if (p.splits > 1) {
    ENGINE_CUDA_LAUNCH_CHECK("sum");
    sum_partials<T, O>
        <<<unsigned((p.outputs + 7) / 8), kThreads, 0, stream>>>(p.partials, p.outputs, p.splits, p.scale, p.out);
  }
}

template <typename T, typename I>
void launch_amax(const Tensor& x, int64_t dim, const Tensor& values, const Tensor& indices) {
  Dims outer;
  for (int64_t d = 0; d < x.dim(); d++)
    if (d != dim) outer.add(x.shape()[size_t(d)], x.strides()[size_t(d)]);
  MaxParams<T, I> p{};
  p.x = static_cast<const T*>(x.data_ptr());
  p.outer = indexer<I>("amax", outer);
  p.outputs = values.numel();
  p.n = x.shape()[size_t(dim)];
  p.stride = I(x.strides()[size_t(dim)]);
  p.values = static_cast<T*>(values.data_ptr());
  p.indices = static_cast<int64_t*>(indices.data_ptr());
  cudaStream_t stream = engine::cuda::stream();
  if (p.stride == 1 || p.n == 1) {
    if (p.n >= kBlockRowMin) {
      amax_rows<true><<<unsigned(p.outputs), kThreads, 0, stream>>>(p);
    } else {
      amax_rows<false><<<unsigned((p.outputs + kThreads / 32 - 1) / (kThreads / 32)), kThreads, 0, stream>>>(p);
    }
  } else {
    amax_cols<<<grid_for(p.outputs, kThreads), kThreads, 0, stream>>>(p);
  }
}

}  // namespace

namespace {

void check_partials(const char* op, const Tensor& x, const Tensor& out, const Tensor& partials) {
  if (!partials.defined()) return;
  ENGINE_CHECK(partials.dim() == 2 && partials.shape()[1] == out.numel() && partials.is_contiguous() &&
                   partials.dtype() == (x.dtype() == DType::f64 ? DType::f64 : DType::f32),
               op, ": workspace ", engine::shape_str(partials.shape()), " ", engine::dtype_name(partials.dtype()),
               " is not [splits, ", out.numel(), "] of the accumulation type");
}

}  // namespace

void sum(const Tensor& x, const std::vector<bool>& reduced, double scale, const Tensor& out, const Tensor& partials) {
  if (out.numel() == 0) return;
  check_partials("cuda sum", x, out, partials);
  ENGINE_CUDA_FLOAT_SWITCH(x.dtype(), T, {
    if (fits_int32(x.numel(), {&x}))
      launch_sum<T, int32_t, T, false>(x, Tensor(), reduced, scale, out, partials);
    else
      launch_sum<T, int64_t, T, false>(x, Tensor(), reduced, scale, out, partials);
  });
  ENGINE_CUDA_LAUNCH_CHECK("sum");
}

void sum_of_products(const Tensor& x, const Tensor& y, const std::vector<bool>& reduced, const Tensor& out,
                     const Tensor& partials) {
  if (out.numel() == 0) return;
  check_partials("cuda sum_of_products", x, out, partials);
  ENGINE_CHECK(y.dtype() == x.dtype() && y.shape() == x.shape() && y.strides() == x.strides() &&
                   out.dtype() == (x.dtype() == DType::f64 ? DType::f64 : DType::f32) && out.is_contiguous(),
               "cuda sum_of_products: y must have x's dtype, shape and strides and out the accumulation type");
  ENGINE_CUDA_FLOAT_SWITCH(x.dtype(), T, {
    using A = acc_t<T>;
    if (fits_int32(x.numel(), {&x, &y}))
      launch_sum<T, int32_t, A, true>(x, y, reduced, 1.0, out, partials);
    else
      launch_sum<T, int64_t, A, true>(x, y, reduced, 1.0, out, partials);
  });
  ENGINE_CUDA_LAUNCH_CHECK("sum_of_products");
}

void amax(const Tensor& x, int64_t dim, const Tensor& values, const Tensor& indices) {
  if (values.numel() == 0 || x.numel() == 0) return;
  ENGINE_CUDA_FLOAT_SWITCH(x.dtype(), T, {
    if (fits_int32(x.numel(), {&x})) launch_amax<T, int32_t>(x, dim, values, indices);
    else launch_amax<T, int64_t>(x, dim, values, indices);
  });
  ENGINE_CUDA_LAUNCH_CHECK("amax");
}

}  // namespace ops::cuda
