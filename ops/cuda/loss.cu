// cuda/loss.cu: cross-entropy (fused log-softmax) forward and backward, and the pointwise losses.
//
// Cross-entropy forward: one block per row of logits [N, V] (up to 256 threads for a vocabulary), an online
// (max, sum of exp) plus the plain sum of x per thread, block reductions, then thread 0 writes lse and the row's
// loss; or, for a few classes (V <= kSmallClasses: a segmentation's pixels), a thread per row. Backward: one
// block per row writes a_i (exp(x - lse_i) - q), or a thread per element for a few classes.
// Reductions over rows and elements (mean, sum) are deterministic without atomics: per-row losses or
// per-block partial sums go to a workspace the op allocated, and one block adds them in a fixed order.
//
// The few-class kernels, measured on the H200 (2026-12-04; deeplabv3's loss, [8 x 513 x 513, 21] bf16 logits, in
// the training step's profile): forward 2.21 -> 0.08 ms, backward 0.89 -> 0.22 ms, where a block per row had spent
// 32 threads and two block reductions on 21 values. CrossEntropyCuda.DISABLED_Bandwidth: 0.104 / 0.227 ms.
// Math in acc_t (f32; f64 for f64), pointwise terms from the same ENGINE_HD function as the CPU's.
#include "ops/cpu/cpu_util.h"  // broadcast_strides
#include "ops/cuda/kernel_util.cuh"
#include "ops/cuda/loss.h"

namespace ops::cuda {

using engine::Tensor;

namespace {

constexpr int kReduceThreads = 1024;  // the single block that adds partials / per-row losses

// Threads per row block: a warp for a few classes, up to 256 for a vocabulary.
int row_threads(int64_t V) { return int(std::min<int64_t>(256, std::max<int64_t>(32, (V + 31) / 32 * 32))); }

// A thread per row (forward) and per element (backward) up to this many classes.
constexpr int64_t kSmallClasses = 64;
constexpr int kSmallThreads = 256, kSmallRowsPerThread = 8;
constexpr int64_t kSmallBlockRows = int64_t(kSmallThreads) * kSmallRowsPerThread;  // rows of a forward block

// ---------------------------------------------------------------------------------------------------
// Cross-entropy: what a row's loss and an element's gradient are (both kernel shapes use these), then the kernels.

// The loss of a row (xr: its logits, cs apart) from its log-sum-exp, the sum of its logits and its target t:
// (1 - eps)(lse - x_t) + eps (lse - mean x) (the smoothing term only when eps > 0, as the CPU computes it); 0 for an
// ignored row, and for a target out of range, which is reported.
template <typename T, typename A>
__device__ __forceinline__ A row_loss_of(const T* xr, int64_t cs, int64_t V, int64_t t, int64_t ignore_index, A eps,
                                         A row_lse, A sum_x, IndexError* err) {
  if (t == ignore_index) return A(0);
  if (t < 0 || t >= V) {
    report_bad_index(err, t);
    return A(0);
  }
  A loss = (A(1) - eps) * (row_lse - to_acc<A>(xr[t * cs]));
  if (eps > A(0)) loss += eps * (row_lse - sum_x / A(V));
  return loss;
}

// A row's target t for backward; false for a row whose gradient is 0: an ignored one, or one whose target is out of
// range (reported by the thread that `reports`).
template <typename I>
__device__ __forceinline__ bool counted_target(const I* target, int64_t ts, int64_t row, int64_t V,
                                               int64_t ignore_index, bool reports, IndexError* err, int64_t* t) {
  *t = int64_t(target[row * ts]);
  if (*t == ignore_index) return false;
  if (*t >= 0 && *t < V) return true;
  if (reports) report_bad_index(err, *t);
  return false;
}

// d[row, c] of a counted row with target t: a (exp(x_c - lse) - q), q = (1 - eps) onehot(t) + eps / V (smooth).
template <typename A>
__device__ __forceinline__ A grad_of(A a, A x_c, A row_lse, int64_t c, int64_t t, A eps, A smooth) {
  const A q = smooth + (c == t ? A(1) - eps : A(0));
  return a * (std::exp(x_c - row_lse) - q);
}

// The single reducing block's end: out = total, or total / max(count, 1) for a mean (an all-ignored batch has loss
// 0, not 0/0), with that divisor kept for backward.
template <typename A>
__device__ __forceinline__ void write_reduced(A total, long long count, bool mean, A* out, A* divisor) {
  __shared__ A scratch[32];
  __shared__ long long count_scratch[32];
  total = block_sum(total, scratch);
  count = block_sum(count, count_scratch);
  if (threadIdx.x != 0) return;
  const A div = A(count > 1 ? count : 1);
  out[0] = mean ? total / div : total;
  if (mean) divisor[0] = div;
}

// Block per row. Bytes per row: V reads of logits (strided by cs), one of the target; bound: memory.
// row_loss is `out` [N] for Reduction::none, the workspace otherwise.
template <typename T, typename I>
__global__ void __launch_bounds__(256)
    cross_entropy_forward_rows(const T* __restrict__ x, int64_t rs, int64_t cs, const I* __restrict__ target,
                               int64_t ts, int64_t N, int64_t V, int64_t ignore_index, acc_t<T> eps,
                               acc_t<T>* __restrict__ lse, acc_t<T>* __restrict__ row_loss, IndexError* err) {
  using A = acc_t<T>;
  __shared__ A scratch[32];
  for (int64_t row = blockIdx.x; row < N; row += gridDim.x) {
    const T* xr = x + row * rs;
    A m = A(-INFINITY), s = 0, sum_x = 0;
    for (int64_t c = threadIdx.x; c < V; c += blockDim.x) {
      const A v = to_acc<A>(xr[c * cs]);
      online_add(m, s, v);
      sum_x += v;
    }
    block_online_reduce(m, s, scratch);
    sum_x = block_sum(sum_x, scratch);
    if (threadIdx.x != 0) continue;
    const A row_lse = m + std::log(s);
    lse[row] = row_lse;
    row_loss[row] = row_loss_of(xr, cs, V, int64_t(target[row * ts]), ignore_index, eps, row_lse, sum_x, err);
  }
}

// A thread per row (V <= kSmallClasses), block b owning rows [b S, (b + 1) S), S = kSmallBlockRows, thread t the
// rows b S + t + k kSmallThreads: lse and the row's loss as cross_entropy_forward_rows computes them. Without
// partials the losses go to row_loss [N]; with them (a mean or sum) the block adds its losses and counts its
// counted rows (target != ignore_index), each by a fixed tree, into row_loss[b S] and row_loss[b S + 1]: its
// own slice of the workspace, which holds nothing else (the count is exact in A: at most S). Bytes per row: V
// reads of logits, one of the target, a write of lse; bound: memory.
template <typename T, typename I>
__global__ void __launch_bounds__(kSmallThreads)
    cross_entropy_forward_small(const T* __restrict__ x, int64_t rs, int64_t cs, const I* __restrict__ target,
                                int64_t ts, int64_t N, int64_t V, int64_t ignore_index, acc_t<T> eps,
                                acc_t<T>* __restrict__ lse, acc_t<T>* __restrict__ row_loss, bool partials,
                                IndexError* err) {
  using A = acc_t<T>;
  __shared__ A scratch[32];
  const int64_t base = int64_t(blockIdx.x) * kSmallBlockRows;
  A total = 0, count = 0;
  for (int k = 0; k < kSmallRowsPerThread; k++) {
    const int64_t row = base + int64_t(k) * kSmallThreads + threadIdx.x;
    if (row >= N) break;
    const T* xr = x + row * rs;
    A m = A(-INFINITY), s = 0, sum_x = 0;
    for (int64_t c = 0; c < V; c++) {
      const A v = to_acc<A>(xr[c * cs]);
      online_add(m, s, v);
      sum_x += v;
    }
    const A row_lse = m + std::log(s);
    lse[row] = row_lse;
    const int64_t t = int64_t(target[row * ts]);
    const A loss = row_loss_of(xr, cs, V, t, ignore_index, eps, row_lse, sum_x, err);
    if (t != ignore_index) count += A(1);
    if (partials)
      total += loss;
    else
      row_loss[row] = loss;
  }
  if (!partials) return;  // the same for every thread of the block
  total = block_sum(total, scratch);
  count = block_sum(count, scratch);
  if (threadIdx.x != 0) return;
  row_loss[base] = total;
  if (base + 1 < N) row_loss[base + 1] = count;  // (a last block of one row: its count is read from the target)
}

// One block: out = the sum (or the mean over the counted rows) of cross_entropy_forward_small's block partials,
// in block order; divisor = max(#counted, 1) for a mean.
template <typename A, typename I>
__global__ void __launch_bounds__(kReduceThreads)
    cross_entropy_reduce_small(const A* __restrict__ row_loss, const I* __restrict__ target, int64_t ts, int64_t N,
                               int64_t ignore_index, bool mean, A* __restrict__ out, A* __restrict__ divisor) {
  A total = 0;
  long long count = 0;
  const int64_t blocks = (N + kSmallBlockRows - 1) / kSmallBlockRows;
  for (int64_t b = threadIdx.x; b < blocks; b += blockDim.x) {
    const int64_t base = b * kSmallBlockRows;
    total += row_loss[base];
    count += base + 1 < N ? static_cast<long long>(row_loss[base + 1]) : int64_t(target[base * ts]) != ignore_index;
  }
  write_reduced(total, count, mean, out, divisor);
}

// One block: out = sum (or mean over the counted rows) of row_loss; divisor = max(#counted, 1) for a mean.
template <typename A, typename I>
__global__ void __launch_bounds__(kReduceThreads)
    cross_entropy_reduce(const A* __restrict__ row_loss, const I* __restrict__ target, int64_t ts, int64_t N,
                         int64_t ignore_index, bool mean, A* __restrict__ out, A* __restrict__ divisor) {
  A total = 0;
  long long count = 0;
  for (int64_t i = threadIdx.x; i < N; i += blockDim.x) {
    total += row_loss[i];
    count += int64_t(target[i * ts]) != ignore_index;
  }
  write_reduced(total, count, mean, out, divisor);
}

// Block per row: d[row, c] = a (exp(x - lse) - q), q = (1 - eps) onehot(t) + eps / V. Bytes per row: V
// reads + V writes; bound: memory.
template <typename T, typename I>
__global__ void __launch_bounds__(256)
    cross_entropy_backward_rows(const acc_t<T>* __restrict__ g, int64_t gs, const T* __restrict__ x, int64_t rs,
                                int64_t cs, const I* __restrict__ target, int64_t ts, const acc_t<T>* __restrict__ lse,
                                const acc_t<T>* __restrict__ divisor, int64_t N, int64_t V, int64_t ignore_index,
                                acc_t<T> eps, T* __restrict__ d, IndexError* err) {
  using A = acc_t<T>;
  const A smooth = eps / A(V);
  const A scale = divisor ? A(1) / divisor[0] : A(1);
  for (int64_t row = blockIdx.x; row < N; row += gridDim.x) {
    T* dr = d + row * V;
    int64_t t;
    if (!counted_target(target, ts, row, V, ignore_index, threadIdx.x == 0, err, &t)) {
      for (int64_t c = threadIdx.x; c < V; c += blockDim.x) dr[c] = from_acc<T>(A(0));
      continue;
    }
    const A a = g[row * gs] * scale, row_lse = lse[row];
    const T* xr = x + row * rs;
    for (int64_t c = threadIdx.x; c < V; c += blockDim.x)
      dr[c] = from_acc<T>(grad_of(a, to_acc<A>(xr[c * cs]), row_lse, c, t, eps, smooth));
  }
}

// A thread per element of d [N, V] (V <= kSmallClasses), grid-stride: the value of cross_entropy_backward_rows.
// Bytes per element: a read of x, a write of d (the row's target, lse and g come from cache); bound: memory.
template <typename T, typename I>
__global__ void __launch_bounds__(256)
    cross_entropy_backward_small(const acc_t<T>* __restrict__ g, int64_t gs, const T* __restrict__ x, int64_t rs,
                                 int64_t cs, const I* __restrict__ target, int64_t ts, const acc_t<T>* __restrict__ lse,
                                 const acc_t<T>* __restrict__ divisor, int64_t N, int64_t V, int64_t ignore_index,
                                 acc_t<T> eps, T* __restrict__ d, IndexError* err) {
  using A = acc_t<T>;
  const A smooth = eps / A(V);
  const A scale = divisor ? A(1) / divisor[0] : A(1);
  const int64_t n = N * V;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = i / V, c = i - row * V;
    int64_t t;
    if (!counted_target(target, ts, row, V, ignore_index, c == 0, err, &t)) {
      d[i] = from_acc<T>(A(0));
      continue;
    }
    d[i] = from_acc<T>(grad_of(g[row * gs] * scale, to_acc<A>(x[row * rs + c * cs]), lse[row], c, t, eps, smooth));
  }
}

// ---------------------------------------------------------------------------------------------------
// Pointwise losses: the term of element i from a, b (and w, broadcast), located through the Indexer.

template <typename T, typename I>
__device__ __forceinline__ acc_t<T> loss_term(cpu::PointwiseLoss kind, const T* a, const T* b, const T* w,
                                              acc_t<T> param, const Indexer<3, I>& ix, I i) {
  using A = acc_t<T>;
  I off[3];
  ix.offsets(i, off);
  return cpu::pointwise_loss_term<A>(kind, to_acc<A>(a[off[0]]), to_acc<A>(b[off[1]]), w ? to_acc<A>(w[off[2]]) : A(1),
                                     param);
}

// Reduction::none: out[i] = term(i), grid-stride. Bytes: 2-3 reads + one write per element; bound: memory.
template <typename T, typename I>
__global__ void pointwise_loss_elements(cpu::PointwiseLoss kind, const T* __restrict__ a, const T* __restrict__ b,
                                        const T* __restrict__ w, acc_t<T> param,
                                        const __grid_constant__ Indexer<3, I> ix, I n, acc_t<T>* __restrict__ out) {
  for (I i = I(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += I(gridDim.x) * blockDim.x)
    out[i] = loss_term(kind, a, b, w, param, ix, i);
}

// mean/sum, stage 1: block k sums the terms of elements [k * per_block, (k + 1) * per_block) into
// partials[k] (grid = P exactly: the split is the op's, not the GPU's). Bytes: 2-3 reads per element.
template <typename T, typename I>
__global__ void __launch_bounds__(256)
    pointwise_loss_partials(cpu::PointwiseLoss kind, const T* __restrict__ a, const T* __restrict__ b,
                            const T* __restrict__ w, acc_t<T> param, const __grid_constant__ Indexer<3, I> ix, I n,
                            I per_block, acc_t<T>* __restrict__ partials) {
  using A = acc_t<T>;
  __shared__ A scratch[32];
  const I begin = I(blockIdx.x) * per_block;
  const I end = n - begin < per_block ? n : begin + per_block;
  A total = 0;
  for (I i = begin + threadIdx.x; i < end; i += blockDim.x) total += loss_term(kind, a, b, w, param, ix, i);
  total = block_sum(total, scratch);
  if (threadIdx.x == 0) partials[blockIdx.x] = total;
}

// mean/sum, stage 2: one block adds the P partials (fixed order) and divides by n for a mean.
template <typename A>
__global__ void __launch_bounds__(kReduceThreads)
    sum_partials(const A* __restrict__ partials, int64_t P, int64_t n, bool mean, A* __restrict__ out) {
  __shared__ A scratch[32];
  A total = 0;
  for (int64_t k = threadIdx.x; k < P; k += blockDim.x) total += partials[k];
  total = block_sum(total, scratch);
  if (threadIdx.x == 0) out[0] = mean ? (n > 0 ? total / A(n) : A(0)) : total;
}


}  // namespace

// ---------------------------------------------------------------------------------------------------

void pointwise_loss(cpu::PointwiseLoss kind, const Tensor& a, const Tensor& b, const Tensor& w, double param,
                    Reduction reduction, const Tensor& out, const Tensor& partials) {
  const engine::Shape& shape = a.shape();
  const int64_t n = a.numel();
  const engine::Shape w_strides = w.defined() ? cpu::broadcast_strides(w, shape) : engine::Shape(shape.size(), 0);
  const bool reduce = reduction != Reduction::none;
  ENGINE_CHECK(!reduce || (partials.defined() && partials.numel() >= 1 && partials.is_contiguous()),
               "pointwise loss: cuda needs a [P] workspace for a mean or sum");
  cudaStream_t stream = engine::cuda::stream();
  auto launch = [&](auto index_tag) {
    using I = decltype(index_tag);
    const auto ix = make_indexer<3, I>("pointwise loss", shape, {a.strides(), b.strides(), w_strides});
    ENGINE_CUDA_FLOAT_SWITCH(a.dtype(), T, {
      using A = acc_t<T>;
      const T* pa = static_cast<const T*>(a.data_ptr());
      const T* pb = static_cast<const T*>(b.data_ptr());
      const T* pw = ptr_or_null<T>(w);
      A* po = static_cast<A*>(out.data_ptr());
      if (!reduce) {
        if (n > 0)
          pointwise_loss_elements<T, I><<<grid_for(n, 256), 256, 0, stream>>>(kind, pa, pb, pw, A(param), ix, I(n), po);
      } else {
        const int64_t P = partials.numel(), per_block = std::max<int64_t>(1, (n + P - 1) / P);
        A* pp = static_cast<A*>(partials.data_ptr());
        pointwise_loss_partials<T, I>
            <<<unsigned(P), 256, 0, stream>>>(kind, pa, pb, pw, A(param), ix, I(n), I(per_block), pp);
        ENGINE_CUDA_LAUNCH_CHECK("pointwise loss (partial sums)");
        sum_partials<A><<<1, kReduceThreads, 0, stream>>>(pp, P, n, reduction == Reduction::mean, po);
      }
    });
  };
  if (fits_int32(n, {&a, &b}) && (!w.defined() || fits_int32(n, {&w}))) launch(int32_t{});
  else launch(int64_t{});
  ENGINE_CUDA_LAUNCH_CHECK("pointwise loss");
}

void cross_entropy_forward(const Tensor& logits, const Tensor& target, int64_t ignore_index, double label_smoothing,
                           Reduction reduction, const Tensor& out, const Tensor& lse, const Tensor& divisor,
                           const Tensor& row_loss) {
  const int64_t N = logits.shape()[0], V = logits.shape()[1];
  const int64_t rs = logits.strides()[0], cs = logits.strides()[1], ts = target.strides()[0];
  const bool reduce = reduction != Reduction::none;
  ENGINE_CHECK(!reduce || (row_loss.defined() && row_loss.numel() == N),
               "cross_entropy: cuda needs a [", N, "] workspace for a mean or sum");
  cudaStream_t stream = engine::cuda::stream();
  IndexError* err = index_error_begin();
  ENGINE_CUDA_INDEX_SWITCH(target.dtype(), I, {
    const I* pt = static_cast<const I*>(target.data_ptr());
    ENGINE_CUDA_FLOAT_SWITCH(logits.dtype(), T, {
      using A = acc_t<T>;
      A* per_row = static_cast<A*>((reduce ? row_loss : out).data_ptr());
      const T* px = static_cast<const T*>(logits.data_ptr());
      A* plse = static_cast<A*>(lse.data_ptr());
      const bool small = N > 0 && V <= kSmallClasses;  // a thread per row
      if (small)
        cross_entropy_forward_small<T, I>
            <<<unsigned((N + kSmallBlockRows - 1) / kSmallBlockRows), kSmallThreads, 0, stream>>>(
                px, rs, cs, pt, ts, N, V, ignore_index, A(label_smoothing), plse, per_row, reduce, err);
      else if (N > 0)
        cross_entropy_forward_rows<T, I><<<grid_for(N, 1, 16), row_threads(V), 0, stream>>>(
            px, rs, cs, pt, ts, N, V, ignore_index, A(label_smoothing), plse, per_row, err);
      ENGINE_CUDA_LAUNCH_CHECK("cross_entropy");
      if (reduce) {
        auto reducer = small ? cross_entropy_reduce_small<A, I> : cross_entropy_reduce<A, I>;
        reducer<<<1, kReduceThreads, 0, stream>>>(per_row, pt, ts, N, ignore_index, reduction == Reduction::mean,
                                                  static_cast<A*>(out.data_ptr()),
                                                  divisor.defined() ? static_cast<A*>(divisor.data_ptr()) : nullptr);
        ENGINE_CUDA_LAUNCH_CHECK("cross_entropy (reduction)");
      }
    });
  });
  index_error_end("cross_entropy: target", V);
}

void cross_entropy_backward(const Tensor& g, const Tensor& logits, const Tensor& target, const Tensor& lse,
                            const Tensor& divisor, int64_t ignore_index, double label_smoothing, Reduction reduction,
                            const Tensor& dlogits) {
  const int64_t N = logits.shape()[0], V = logits.shape()[1];
  if (N == 0) return;
  const int64_t rs = logits.strides()[0], cs = logits.strides()[1], ts = target.strides()[0];
  const int64_t gs = reduction == Reduction::none ? g.strides()[0] : 0;
  cudaStream_t stream = engine::cuda::stream();
  IndexError* err = index_error_begin();
  ENGINE_CUDA_INDEX_SWITCH(target.dtype(), I, {
    ENGINE_CUDA_FLOAT_SWITCH(logits.dtype(), T, {
      using A = acc_t<T>;
      auto kernel = V <= kSmallClasses ? cross_entropy_backward_small<T, I> : cross_entropy_backward_rows<T, I>;
      const unsigned grid = V <= kSmallClasses ? grid_for(N * V, 256) : grid_for(N, 1, 16);
      kernel<<<grid, V <= kSmallClasses ? 256 : row_threads(V), 0, stream>>>(
          static_cast<const A*>(g.data_ptr()), gs, static_cast<const T*>(logits.data_ptr()), rs, cs,
          static_cast<const I*>(target.data_ptr()), ts, static_cast<const A*>(lse.data_ptr()),
          reduction == Reduction::mean ? static_cast<const A*>(divisor.data_ptr()) : nullptr, N, V, ignore_index,
          A(label_smoothing), static_cast<T*>(dlogits.data_ptr()), err);
    });
  });
  ENGINE_CUDA_LAUNCH_CHECK("cross_entropy_backward");
  index_error_end("cross_entropy_backward: target", V);
}

}  // namespace ops::cuda
