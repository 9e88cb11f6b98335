// cuda/shape_scatter.cu: scatter-add, the gradient of gather / index_select / embedding (ops/cuda/shape.h).
//
// Scatter-add is deterministic and uses no float atomics; each output element sums its contributions in
// increasing index position, the CPU's order. Rows form with the op's workspace (index_select_backward,
// embedding_backward: a 1-D index along dim, g contiguous): the index is counting-sorted into one segment
// of positions per output row (integer atomics, then a scan), and one block per row sorts its segment in
// shared memory and sums it: O(J + K + g); rows with more than 256 entries (hot ids) are summed by
// 128-byte column slices in many blocks that stage up to 256 of their g rows in shared memory at once.
// Rows form without a workspace (a caller that passes none): a block owns a tile of R output rows x W
// columns, accumulated in shared memory in acc_t; it scans the index in chunks of 256, compacts the entries
// that land in its tile in index order (ballot + prefix count), and adds their g rows in that order:
// O(K x J) index reads. General form (gather_backward, any index): one thread per (line, k) of the output
// scans the line's index entries in order.
#include <algorithm>

#include "ops/cuda/kernel_util.cuh"
#include "ops/cuda/shape.h"
#include "ops/cuda/shape_util.cuh"

namespace ops::cuda {

using engine::Shape;
using engine::Tensor;

namespace {

constexpr int kThreads = 256;


constexpr int kScatterAccBytes = 32 * 1024;  // shared accumulator tile of the rows form

// Rows form: g contiguous [P, J, Q], index 1-D along dim (stride is), out [P, K, Q]. Tiles of R output
// rows x Wc columns, numbered (p, k tile, column chunk); grid-stride over tiles. Bytes: g read once over
// all tiles (each entry lands in one tile), out written once, the index read once per tile (from L2);
// bound: the index scans when K x Q is large against J, else memory.
template <typename T, typename Idx>
__global__ void __launch_bounds__(kThreads)
    scatter_add_rows(const T* __restrict__ g, const Idx* __restrict__ index, int64_t is, T* __restrict__ out,
                     int64_t P, int64_t J, int64_t K, int64_t Q, int R, int Wc, int64_t skip, IndexError* err) {
  using A = acc_t<T>;
  extern __shared__ __align__(16) unsigned char acc_bytes[];
  A* acc = reinterpret_cast<A*>(acc_bytes);  // [R][Wc]
  __shared__ int32_t match_j[kThreads], match_k[kThreads];
  __shared__ int32_t warp_counts[kThreads / 32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t k_tiles = (K + R - 1) / R, c_chunks = (Q + Wc - 1) / Wc, tiles = P * k_tiles * c_chunks;
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const int64_t cc = tile % c_chunks, kt = (tile / c_chunks) % k_tiles, p = tile / (c_chunks * k_tiles);
    const int64_t k0 = kt * R, c0 = cc * Wc;
    const int rows = int(min(int64_t(R), K - k0)), cols = int(min(int64_t(Wc), Q - c0));
    for (int e = threadIdx.x; e < rows * Wc; e += blockDim.x) acc[e] = A(0);
    __syncthreads();
    int64_t v_next = threadIdx.x < J ? int64_t(index[threadIdx.x * is]) : 0;  // prefetched one chunk ahead
    for (int64_t j0 = 0; j0 < J; j0 += blockDim.x) {
      const int64_t j = j0 + threadIdx.x, v = v_next;
      if (j + blockDim.x < J) v_next = int64_t(index[(j + blockDim.x) * is]);
      bool hit = j < J && v != skip;
      if (hit && (v < 0 || v >= K)) {
        report_bad_index(err, v);
        hit = false;
      }
      hit = hit && v >= k0 && v < k0 + rows;
      // Compact this chunk's hits in index order: warp ballots, then warps in order.
      const unsigned ballot = __ballot_sync(0xffffffffu, hit);
      if (lane == 0) warp_counts[warp] = __popc(ballot);
      __syncthreads();
      int base = 0, total = 0;
      for (int w = 0; w < int(blockDim.x >> 5); w++) {
        base += w < warp ? warp_counts[w] : 0;
        total += warp_counts[w];
      }
      if (hit) {
        const int slot = base + __popc(ballot & ((1u << lane) - 1u));
        match_j[slot] = int32_t(j - j0);
        match_k[slot] = int32_t(v - k0);
      }
      __syncthreads();
      // Thread t always owns columns t, t + blockDim, ...: its accumulators see the hits in order.
      for (int m = 0; m < total; m++) {
        const T* gr = g + (p * J + j0 + match_j[m]) * Q + c0;
        A* ar = acc + int64_t(match_k[m]) * Wc;
        for (int c = threadIdx.x; c < cols; c += blockDim.x) ar[c] += to_acc<A>(gr[c]);
      }
      __syncthreads();
    }
    for (int r = 0; r < rows; r++) {
      T* orow = out + (p * K + k0 + r) * Q + c0;
      for (int c = threadIdx.x; c < cols; c += blockDim.x) orow[c] = from_acc<T>(acc[r * Wc + c]);
    }
    __syncthreads();
  }
}

// General form: lines are the positions of index's shape with dim collapsed; thread t = (line, k) sums
// g[line, j] over the j with index[line, j] == k, in increasing j, and writes out[line, k] (out was zeroed:
// positions beyond index's shape get nothing). Bytes: J index + hit g reads per thread (shared across a
// line's threads through the cache), one write; bound: K x J index reads per line.
template <typename T, typename Idx>
__global__ void scatter_add_lines(const T* __restrict__ g, const Idx* __restrict__ index, T* __restrict__ out,
                                  const __grid_constant__ Indexer<3, int64_t> ix, int64_t lines, int64_t J,
                                  int64_t K, int64_t gs, int64_t is, int64_t os, int64_t skip, IndexError* err) {
  using A = acc_t<T>;
  for (int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; t < lines * K;
       t += int64_t(gridDim.x) * blockDim.x) {
    const int64_t k = t % K, line = t / K;
    int64_t off[3];
    ix.offsets(line, off);
    A sum = 0;
    for (int64_t j = 0; j < J; j++) {
      const int64_t v = int64_t(index[off[1] + j * is]);
      if (v == skip) continue;
      if (v < 0 || v >= K) {
        if (k == 0) report_bad_index(err, v);
        continue;
      }
      if (v == k) sum += to_acc<A>(g[off[0] + j * gs]);
    }
    out[off[2] + k * os] = from_acc<T>(sum);
  }
}

// ---------------------------------------------------------------------------------------------------
// Scatter-add, rows form by segments (when the op passes a workspace). Four launches:
//   1. count:  counts[k] = #{j : index[j] == k}, skip and out-of-range entries left out (integer atomics:
//              the totals do not depend on their order)
//   2. scan:   start = exclusive prefix sums of counts, K + 1 entries (start[K] = entries kept), in place
//   3. fill:   perm[start[k] + atomicAdd(&fill[k], 1)] = j: each row's positions j in one segment, in an
//              arbitrary order (rows of more than kSegCapacity entries left out: step 4b finds its own)
//   4. rows:   one block per output row k sorts its segment ascending in shared memory and sums the g rows
//              in that order in acc_t: each output element sums its contributions in increasing j, the
//              CPU's order, whatever order step 3 left (bit-identical to the CPU, deterministic); a row
//              of more than kSegCapacity entries is summed by segment_long_rows instead, in the same order
// Workspace i32 [2K + 1 + J]: start [K + 1] | fill [K] | perm [J].

constexpr int kSegThreads = 256;    // threads of the count, fill and row kernels
// Positions a row block sorts at once (shared memory; a multiple of kSegThreads); longer rows are "long". A row
// block's sum is a chain of its rows' loads, 8 in flight: at 256 rows that is 32 round trips to memory, the
// long-row kernel's cost for 256 x 256 positions of index.
constexpr int kSegCapacity = 256;
constexpr int kScanThreads = 1024, kScanItems = 8;

// Step 1. Thread per index entry j, grid-stride. Bytes: the index once; bound: memory (J is small).
template <typename Idx>
__global__ void segment_count(const Idx* __restrict__ index, int64_t is, int64_t J, int64_t K, int64_t skip,
                              int32_t* __restrict__ counts, IndexError* err) {
  for (int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; j < J; j += int64_t(gridDim.x) * blockDim.x) {
    const int64_t v = int64_t(index[j * is]);
    if (v == skip) continue;
    if (v < 0 || v >= K) {
      report_bad_index(err, v);
      continue;
    }
    atomicAdd(counts + v, 1);
  }
}

// Step 2. One block; tiles of kScanThreads x kScanItems entries, thread t owning kScanItems consecutive
// entries of a tile; totals scanned by warp shuffles, then warps in order, carried across tiles. Bytes:
// 8 (K + 1); bound: latency (4 tiles at K = 30522).
__global__ void __launch_bounds__(kScanThreads) segment_scan(int32_t* __restrict__ start, int64_t n) {
  __shared__ int32_t warp_totals[kScanThreads / 32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int32_t carry = 0;  // the same in every thread: the sum of the tiles before
  for (int64_t t0 = 0; t0 < n; t0 += int64_t(kScanThreads) * kScanItems) {
    const int64_t b = t0 + int64_t(threadIdx.x) * kScanItems;
    int32_t v[kScanItems];
    int32_t sum = 0;
#pragma unroll
    for (int i = 0; i < kScanItems; i++) {
      v[i] = b + i < n ? start[b + i] : 0;
      sum += v[i];
    }
    int32_t incl = sum;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int32_t y = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= o) incl += y;
    }
    if (lane == 31) warp_totals[warp] = incl;
    __syncthreads();
    int32_t run = carry + incl - sum, total = 0;
    for (int w = 0; w < kScanThreads / 32; w++) {
      const int32_t t = warp_totals[w];
      if (w < warp) run += t;
      total += t;
    }
#pragma unroll
    for (int i = 0; i < kScanItems; i++) {
      if (b + i < n) start[b + i] = run;
      run += v[i];
    }
    carry += total;
    __syncthreads();  // warp_totals is rewritten by the next tile
  }
}

// Step 3. Thread per index entry j, grid-stride; entries of long rows are left out (8192 atomics on one counter
// took as long as the rest). Bytes: the index, start and fill once, perm written once; bound: memory (J is
// small).
template <typename Idx>
__global__ void segment_fill(const Idx* __restrict__ index, int64_t is, int64_t J, int64_t K, int64_t skip,
                             const int32_t* __restrict__ start, int32_t* __restrict__ fill,
                             int32_t* __restrict__ perm) {
  for (int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; j < J; j += int64_t(gridDim.x) * blockDim.x) {
    const int64_t v = int64_t(index[j * is]);
    if (v == skip || v < 0 || v >= K) continue;
    const int32_t s = start[v];
    if (start[v + 1] - s > kSegCapacity) continue;  // a long row: segment_long_rows
    perm[s + atomicAdd(fill + v, 1)] = int32_t(j);
  }
}

// acc += the g rows at positions sorted[0..n) (VEC columns from `base`, rows Q apart), in that order; eight
// loads in flight before their adds (a hot row's sum is one chain of n loads per thread: latency-bound).
constexpr int kRowsInFlight = 8;

template <int VEC, typename T, typename A>
__device__ __forceinline__ void add_rows(const T* __restrict__ base, int64_t Q, const int32_t* sorted, int n,
                                         A (&acc)[VEC]) {
  int m = 0;
  for (; m + kRowsInFlight <= n; m += kRowsInFlight) {
    A v[kRowsInFlight][VEC];
#pragma unroll
    for (int u = 0; u < kRowsInFlight; u++) load_vec<VEC>(base + int64_t(sorted[m + u]) * Q, v[u]);
#pragma unroll
    for (int u = 0; u < kRowsInFlight; u++)
#pragma unroll
      for (int e = 0; e < VEC; e++) acc[e] += v[u][e];
  }
  for (; m < n; m++) {
    A v[VEC];
    load_vec<VEC>(base + int64_t(sorted[m]) * Q, v);
#pragma unroll
    for (int e = 0; e < VEC; e++) acc[e] += v[e];
  }
}

// Step 4a. g contiguous [P, J, Q], out [P, K, Q]; block of kSegThreads per output row k (grid-stride over
// k); thread t owns the column vectors t, t + kSegThreads, ... of VEC elements (16 bytes when Q and the
// pointers allow) in every p. The segment (n <= kSegCapacity positions) is loaded to shared memory and
// sorted by rank (rank(j) = #{j' < j}: n^2 / kSegThreads comparisons, shared broadcasts), then summed.
// Longer segments (hot ids: BERT's token types, [MASK]) are left to segment_long_rows. Bytes: g read once,
// out written once (empty rows written as zeros), start and perm once; bound: memory plus per-row latency.
template <typename T, int VEC>
__global__ void __launch_bounds__(kSegThreads)
    segment_rows(const T* __restrict__ g, const int32_t* __restrict__ start, const int32_t* __restrict__ perm,
                 T* __restrict__ out, int64_t P, int64_t J, int64_t K, int64_t Q) {
  using A = acc_t<T>;
  __shared__ int32_t keys[kSegCapacity];    // the segment as found
  __shared__ int32_t sorted[kSegCapacity];  // positions, ascending
  const int64_t vectors = Q / VEC;          // column vectors per row
  for (int64_t k = blockIdx.x; k < K; k += gridDim.x) {
    const int32_t s = start[k], n = start[k + 1] - s;
    if (n > kSegCapacity) continue;  // segment_long_rows
    for (int i = threadIdx.x; i < n; i += kSegThreads) keys[i] = perm[s + i];
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += kSegThreads) {
      const int32_t key = keys[i];
      int r = 0;
      for (int m = 0; m < n; m++) r += keys[m] < key;
      sorted[r] = key;
    }
    __syncthreads();
    for (int64_t p = 0; p < P; p++) {
      for (int64_t c = threadIdx.x; c < vectors; c += kSegThreads) {
        A acc[VEC];
#pragma unroll
        for (int e = 0; e < VEC; e++) acc[e] = A(0);
        add_rows<VEC>(g + p * J * Q + c * VEC, Q, sorted, n, acc);
        store_vec<VEC>(out + (p * K + k) * Q + c * VEC, acc);
      }
    }
    __syncthreads();  // keys and sorted serve the next row
  }
}

// Step 4b, rows whose segment is longer than kSegCapacity (BERT's token types and [MASK]). A row's sum is
// one chain of adds per output element, in increasing position; what bounds it is the loads in flight. So the
// row is cut into slices of kLongSliceBytes per g row (64 columns of bf16, 32 of f32), one block each
// (grid.x = P x slices), and a block brings the slices of up to kSegThreads of the row's g rows into shared
// memory at once, every thread loading (16-byte vectors when Q and the pointers allow: 8 loads in flight per
// thread), before the slice's threads (one per column) add them in order. grid.y blocks share the rows: block
// y looks at rows [256 y', 256 y' + 256) for y' = y, y + grid.y, ... (start[] read 256 at a time), and block z
// of those takes the tile's long rows z, z + grid.z, ... For a long row k the block walks the index in chunks
// of kSegThreads positions: thread t tests index[j0 + t] == k (the next chunk's value prefetched), the hits
// are compacted in increasing j (warp ballots, warps in order), their slices are staged and added in that
// order: increasing j, the CPU's order. Bytes: the row's g slices once, the index once per (row, slice);
// bound: latency, one staged chunk (load, then adds) per kSegThreads positions.
constexpr int kLongSliceBytes = 128;

template <typename T, typename Idx, int VEC>
__global__ void __launch_bounds__(kSegThreads)
    segment_long_rows(const T* __restrict__ g, const Idx* __restrict__ index, int64_t is,
                      const int32_t* __restrict__ start, T* __restrict__ out, int64_t P, int64_t J, int64_t K,
                      int64_t Q) {
  using A = acc_t<T>;
  constexpr int W = kLongSliceBytes / int(sizeof(T));  // columns of a slice
  constexpr int kRowThreads = W / VEC;                  // threads that load one g row's slice
  constexpr int kRowsPerPass = kSegThreads / kRowThreads;
  constexpr int kPasses = kSegThreads / kRowsPerPass;   // loads per thread for a full chunk
  constexpr int kWarps = kSegThreads / 32;
  __shared__ __align__(16) T stage[kSegThreads][W];  // the chunk's hit rows, this slice
  __shared__ int32_t hits[kSegThreads];             // positions of this chunk's hits, ascending
  __shared__ int32_t long_rows[kSegThreads];
  __shared__ int32_t warp_counts[kWarps];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t slices = (Q + W - 1) / W;
  const int64_t p = blockIdx.x / slices, c0 = (blockIdx.x % slices) * W;
  const int load_row = threadIdx.x / kRowThreads, load_col = (threadIdx.x % kRowThreads) * VEC;
  const bool loader = c0 + load_col < Q;  // VEC > 1 only when Q % VEC == 0: the whole vector is in range
  const bool adder = threadIdx.x < W && c0 + threadIdx.x < Q;
  const T* gp = g + p * J * Q + c0 + load_col;
  for (int64_t k0 = int64_t(blockIdx.y) * kSegThreads; k0 < K; k0 += int64_t(gridDim.y) * kSegThreads) {
    // This tile's long rows, in order.
    const int64_t kt = k0 + threadIdx.x;
    const bool is_long = kt < K && start[kt + 1] - start[kt] > kSegCapacity;
    const unsigned ballot = __ballot_sync(0xffffffffu, is_long);
    if (lane == 0) warp_counts[warp] = __popc(ballot);
    __syncthreads();
    int slot = __popc(ballot & ((1u << lane) - 1u)), n_long = 0;
    for (int w = 0; w < kWarps; w++) {
      if (w < warp) slot += warp_counts[w];
      n_long += warp_counts[w];
    }
    if (is_long) long_rows[slot] = int32_t(kt);
    __syncthreads();
    for (int r = blockIdx.z; r < n_long; r += gridDim.z) {
      const int64_t k = long_rows[r];
      A acc = A(0);  // an adder's: column c0 + threadIdx.x of row k
      int64_t v_next = threadIdx.x < J ? int64_t(index[threadIdx.x * is]) : -1;
      for (int64_t j0 = 0; j0 < J; j0 += kSegThreads) {
        const int64_t j = j0 + threadIdx.x, v = v_next;
        if (j + kSegThreads < J) v_next = int64_t(index[(j + kSegThreads) * is]);
        const bool hit = j < J && v == k;
        const unsigned b = __ballot_sync(0xffffffffu, hit);
        if (lane == 0) warp_counts[warp] = __popc(b);
        __syncthreads();  // also: the adders are done with the previous chunk's stage
        int at = __popc(b & ((1u << lane) - 1u)), m = 0;
        for (int w = 0; w < kWarps; w++) {
          if (w < warp) at += warp_counts[w];
          m += warp_counts[w];
        }
        if (hit) hits[at] = int32_t(j);
        __syncthreads();
        if (loader) {  // every load of the chunk issued before the first store
          Vec<T, VEC> v[kPasses];
#pragma unroll
          for (int q = 0; q < kPasses; q++) {
            const int row = load_row + q * kRowsPerPass;
            if (row < m) v[q] = *reinterpret_cast<const Vec<T, VEC>*>(gp + int64_t(hits[row]) * Q);
          }
#pragma unroll
          for (int q = 0; q < kPasses; q++) {
            const int row = load_row + q * kRowsPerPass;
            if (row < m) *reinterpret_cast<Vec<T, VEC>*>(&stage[row][load_col]) = v[q];
          }
        }
        __syncthreads();
        if (adder)
          for (int row = 0; row < m; row++) acc += to_acc<A>(stage[row][threadIdx.x]);
      }
      if (adder) out[(p * K + k) * Q + c0 + threadIdx.x] = from_acc<T>(acc);
      __syncthreads();  // long_rows and warp_counts serve the next row
    }
    __syncthreads();  // long_rows and warp_counts serve the next tile
  }
}

// The rows form by segments (see the kernels): g contiguous [P, J, Q], index 1-D along dim, out [P, K, Q].
void scatter_add_segments(const char* op, const Tensor& g, int64_t dim, const Tensor& index, int64_t skip,
                          const Tensor& out, const Tensor& workspace) {
  const int64_t K = out.shape()[size_t(dim)], J = g.shape()[size_t(dim)];
  ENGINE_CHECK(g.is_contiguous() && index_is_rows(index, dim) && same_except(g.shape(), out.shape(), dim), op,
               ": the cuda scatter-add workspace serves a contiguous g of shape ", engine::shape_str(g.shape()),
               " with a 1-D index along dimension ", dim, " only");
  ENGINE_CHECK(workspace.dtype() == engine::DType::i32 && workspace.is_contiguous() &&
                   workspace.numel() == 2 * K + 1 + J && workspace.numel() < (int64_t(1) << 31),
               op, ": the scatter-add workspace must be i32 [2 * ", K, " + 1 + ", J, "], got ",
               engine::dtype_name(workspace.dtype()), " ", engine::shape_str(workspace.shape()));
  if (out.numel() == 0) return;
  const int64_t P = prod(out.shape(), 0, size_t(dim)), Q = prod(out.shape(), size_t(dim) + 1, out.shape().size());
  const int64_t is = index.strides()[size_t(dim)];
  int32_t* start = workspace.data<int32_t>();  // [K + 1]
  int32_t* fill = start + K + 1;               // [K]
  int32_t* perm = fill + K;                    // [J]
  cudaStream_t stream = engine::cuda::stream();
  IndexError* err = index_error_begin();
  ENGINE_CUDA_CHECK(cudaMemsetAsync(start, 0, size_t(2 * K + 1) * sizeof(int32_t), stream));
  ENGINE_CUDA_INDEX_SWITCH(index.dtype(), Idx, {
    const Idx* pi = static_cast<const Idx*>(index.data_ptr());
    if (J > 0) {
      segment_count<Idx><<<grid_for(J, kSegThreads), kSegThreads, 0, stream>>>(pi, is, J, K, skip, start, err);
      ENGINE_CUDA_LAUNCH_CHECK("scatter_add (count)");
    }
    segment_scan<<<1, kScanThreads, 0, stream>>>(start, K + 1);
    ENGINE_CUDA_LAUNCH_CHECK("scatter_add (scan)");
    if (J > 0) {
      segment_fill<Idx><<<grid_for(J, kSegThreads), kSegThreads, 0, stream>>>(pi, is, J, K, skip, start, fill, perm);
      ENGINE_CUDA_LAUNCH_CHECK("scatter_add (fill)");
    }
  });
  ENGINE_CUDA_FLOAT_SWITCH(out.dtype(), T, {
    constexpr int kVec = vec16<T>();
    const T* pg = static_cast<const T*>(g.data_ptr());
    T* po = static_cast<T*>(out.data_ptr());
    const unsigned grid = grid_for(K * kSegThreads, kSegThreads);  // blocks: min(K, 8 per multiprocessor)
    if (Q % kVec == 0 && aligned16(pg) && aligned16(po))
      segment_rows<T, kVec><<<grid, kSegThreads, 0, stream>>>(pg, start, perm, po, P, J, K, Q);
    else
      segment_rows<T, 1><<<grid, kSegThreads, 0, stream>>>(pg, start, perm, po, P, J, K, Q);
    ENGINE_CUDA_LAUNCH_CHECK("scatter_add (rows)");
    if (J > kSegCapacity) {  // some segment may be long
      constexpr int kSlice = kLongSliceBytes / int(sizeof(T));
      const int64_t slices = (Q + kSlice - 1) / kSlice;
      const dim3 long_grid(unsigned(P * slices), unsigned(std::min<int64_t>((K + kSegThreads - 1) / kSegThreads, 64)),
                           4);
      ENGINE_CUDA_INDEX_SWITCH(index.dtype(), Idx, {
        const Idx* pi = static_cast<const Idx*>(index.data_ptr());
        if (Q % kVec == 0 && aligned16(pg))
          segment_long_rows<T, Idx, kVec><<<long_grid, kSegThreads, 0, stream>>>(pg, pi, is, start, po, P, J, K, Q);
        else
          segment_long_rows<T, Idx, 1><<<long_grid, kSegThreads, 0, stream>>>(pg, pi, is, start, po, P, J, K, Q);
      });
      ENGINE_CUDA_LAUNCH_CHECK("scatter_add (long rows)");
    }
  });
  index_error_end(op, K);
}

}  // namespace

void scatter_add(const char* op, const Tensor& g, int64_t dim, const Tensor& index, int64_t skip, const Tensor& out) {
  scatter_add(op, g, dim, index, skip, out, Tensor());
}

void scatter_add(const char* op, const Tensor& g, int64_t dim, const Tensor& index, int64_t skip, const Tensor& out,
                 const Tensor& workspace) {
  if (workspace.defined()) {
    scatter_add_segments(op, g, dim, index, skip, out, workspace);
    return;
  }
  const int64_t K = out.shape()[size_t(dim)];
  const int64_t J = g.shape()[size_t(dim)];
  cudaStream_t stream = engine::cuda::stream();
  if (out.numel() == 0) return;
  IndexError* err = index_error_begin();
  ENGINE_CUDA_INDEX_SWITCH(index.dtype(), Idx, {
    const Idx* pi = static_cast<const Idx*>(index.data_ptr());
    ENGINE_CUDA_FLOAT_SWITCH(out.dtype(), T, {
      using A = acc_t<T>;
      const T* pg = static_cast<const T*>(g.data_ptr());
      T* po = static_cast<T*>(out.data_ptr());
      if (g.is_contiguous() && index_is_rows(index, dim) && same_except(g.shape(), out.shape(), dim)) {
        const int64_t P = prod(out.shape(), 0, size_t(dim)), Q = prod(out.shape(), size_t(dim) + 1, out.shape().size());
        const int64_t budget = kScatterAccBytes / int64_t(sizeof(A));  // accumulator elements per block
        const int Wc = int(std::min<int64_t>(std::max<int64_t>(Q, 1), budget));
        const int R = int(std::max<int64_t>(1, std::min<int64_t>(K, budget / Wc)));
        const int64_t tiles = P * ((K + R - 1) / R) * ((Q + Wc - 1) / Wc);
        const unsigned grid = unsigned(std::min<int64_t>(tiles, int64_t(1) << 30));
        scatter_add_rows<T, Idx><<<grid, kThreads, size_t(R) * size_t(Wc) * sizeof(A), stream>>>(
            pg, pi, index.strides()[size_t(dim)], po, P, J, K, Q, R, Wc, skip, err);
      } else {
        ENGINE_CUDA_CHECK(cudaMemsetAsync(po, 0, out.nbytes(), stream));
        Shape lines_shape = index.shape();
        lines_shape[size_t(dim)] = 1;
        const int64_t lines = engine::numel_of(lines_shape);
        const Shape out_strides = engine::contiguous_strides(out.shape());
        const auto ix = make_indexer<3, int64_t>(op, lines_shape, {g.strides(), index.strides(), out_strides});
        if (lines > 0)
          scatter_add_lines<T, Idx><<<grid_for(lines * K, kThreads), kThreads, 0, stream>>>(
              pg, pi, po, ix, lines, J, K, g.strides()[size_t(dim)], index.strides()[size_t(dim)],
              out_strides[size_t(dim)], skip, err);
      }
    });
  });
  ENGINE_CUDA_LAUNCH_CHECK("scatter_add");
  index_error_end(op, K);
}

}  // namespace ops::cuda
