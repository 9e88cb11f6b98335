// cuda/shape.cu: concat, gather / index_select / embedding, their scatter-add gradients, masked_fill, where.
//
// These ops move elements without arithmetic (except scatter-add's sums), so the copying kernels work on
// raw words of the element's size (1, 2, 4 or 8 bytes; 16 where a whole row can move as vectors) and
// serve every dtype. Element positions come from an Indexer (any strides, broadcasting by stride 0).
//
// Scatter-add is deterministic and uses no float atomics; each output element sums its contributions in
// increasing index position, the CPU's order. Rows form with the op's workspace (index_select_backward,
// embedding_backward: a 1-D index along dim, g contiguous): the index is counting-sorted into one segment
// of positions per output row (integer atomics, then a scan), and one block per row sorts its segment in
// shared memory and sums it: O(J + K + g); rows with more than 2048 entries (hot ids) are summed by
// 32-column slices in many blocks that stage their g rows in shared memory. Rows form without a workspace (a caller that passes none): a
// block owns a tile of R output rows x W columns, accumulated in shared memory in acc_t; it scans the index
// in chunks of 256, compacts the entries that land in its tile in index order (ballot + prefix count), and
// adds their g rows in that order: O(K x J) index reads. General form (gather_backward, any index): one
// thread per (line, k) of the output scans the line's index entries in order.
#include <cstring>

#include "ops/cpu/cpu_util.h"  // broadcast_strides, ENGINE_ALL_SWITCH (masked_fill's value on the host)
#include "ops/cpu/shape.h"     // checked_index: the CPU's error message
#include "ops/cuda/kernel_util.cuh"
#include "ops/cuda/shape.h"

namespace ops::cuda {

using engine::Shape;
using engine::Tensor;

// ---------------------------------------------------------------------------------------------------
// The out-of-range index flag (declared in kernel_util.cuh): one record of mapped pinned host memory.

namespace {
IndexError* g_index_error_host = nullptr;
IndexError* g_index_error_device = nullptr;
}  // namespace

IndexError* index_error_begin() {
  if (!g_index_error_host) {
    ENGINE_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&g_index_error_host), sizeof(IndexError),
                                    cudaHostAllocMapped));
    ENGINE_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&g_index_error_device), g_index_error_host, 0));
  }
  volatile IndexError* h = g_index_error_host;
  h->hit = 0;
  h->value = 0;
  return g_index_error_device;
}

void index_error_end(const char* op, int64_t size) {
  ENGINE_CUDA_CHECK(cudaStreamSynchronize(engine::cuda::stream()));
  volatile IndexError* h = g_index_error_host;
  if (h->hit) cpu::checked_index(op, h->value, size);  // throws the CPU's message
}

namespace {

// ENGINE_WORD_SWITCH(bytes, W, { body using W }): W is an unsigned word of the element's size.
#define ENGINE_WORD_SWITCH(bytes, W, ...)                                                               \
  switch (bytes) {                                                                                    \
    case 1: { using W = uint8_t; __VA_ARGS__; } break;                                                \
    case 2: { using W = uint16_t; __VA_ARGS__; } break;                                               \
    case 4: { using W = uint32_t; __VA_ARGS__; } break;                                               \
    case 8: { using W = uint64_t; __VA_ARGS__; } break;                                               \
    default: throw ::engine::Error(::engine::str("cuda shape kernel: element size ", bytes, " is not supported")); \
  }

constexpr int kThreads = 256;

// Calls f(int32_t{}) when 32-bit indexing is safe for n elements over these tensors, else f(int64_t{}).
template <typename F> void with_index_type(int64_t n, std::initializer_list<const Tensor*> ts, F&& f) {
  if (fits_int32(n, ts)) f(int32_t{});
  else f(int64_t{});
}

// ---------------------------------------------------------------------------------------------------
// Copies

// dst[j] = src[i] through an Indexer {src, dst}. Bytes: one read + one write per element; bound: memory.
template <typename W, typename I>
__global__ void strided_copy(const W* __restrict__ src, W* __restrict__ dst, const __grid_constant__ Indexer<2, I> ix,
                             I n) {
  for (I i = I(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += I(gridDim.x) * blockDim.x) {
    I off[2];
    ix.offsets(i, off);
    dst[off[1]] = src[off[0]];
  }
}

// ---------------------------------------------------------------------------------------------------
// Gather

// Rows form: x contiguous [O, n, U] (U words per row), index 1-D along dim; out [O, J, U].
// Thread per word t = (o, j, u). Bytes: one read + one write per word (16-byte words when rows allow),
// the index from cache; bound: memory.
template <typename W, typename I, typename Idx>
__global__ void gather_rows(const W* __restrict__ x, const Idx* __restrict__ index, int64_t is, W* __restrict__ out,
                            I total, I J, I U, int64_t n, IndexError* err) {
  for (I t = I(blockIdx.x) * blockDim.x + threadIdx.x; t < total; t += I(gridDim.x) * blockDim.x) {
    const I u = t % U, r = t / U, j = r % J, o = r / J;
    const int64_t v = int64_t(index[j * is]);
    if (v < 0 || v >= n) {
      report_bad_index(err, v);
      continue;
    }
    out[t] = x[(int64_t(o) * n + v) * U + u];
  }
}

// Any layout: out[i] = x[x_off(i) + index[index_off(i)] * step] with x's stride along dim zeroed in the
// Indexer. Bytes: one read of x and of the index + one write per element; bound: memory transactions.
template <typename W, typename I, typename Idx>
__global__ void gather_elements(const W* __restrict__ x, const Idx* __restrict__ index, W* __restrict__ out,
                                const __grid_constant__ Indexer<2, I> ix, I numel, int64_t n, int64_t step,
                                IndexError* err) {
  for (I i = I(blockIdx.x) * blockDim.x + threadIdx.x; i < numel; i += I(gridDim.x) * blockDim.x) {
    I off[2];
    ix.offsets(i, off);
    const int64_t v = int64_t(index[off[1]]);
    if (v < 0 || v >= n) {
      report_bad_index(err, v);
      continue;
    }
    out[i] = x[int64_t(off[0]) + v * step];
  }
}

// ---------------------------------------------------------------------------------------------------
// Scatter-add

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
  for (int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; t < lines * K; t += int64_t(gridDim.x) * blockDim.x) {
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
//              arbitrary order
//   4. rows:   one block per output row k sorts its segment ascending in shared memory and sums the g rows
//              in that order in acc_t: each output element sums its contributions in increasing j, the
//              CPU's order, whatever order step 3 left (bit-identical to the CPU, deterministic); a row
//              of more than kSegCapacity entries is summed by segment_hot_rows instead, in the same order
// Workspace i32 [2K + 1 + J]: start [K + 1] | fill [K] | perm [J].

constexpr int kSegThreads = 256;    // threads of the count, fill and row kernels
constexpr int kSegCapacity = 2048;  // positions a row block sorts at once (shared memory; a multiple of kSegThreads)
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

// Step 3. Thread per index entry j, grid-stride. Bytes: the index, start and fill once, perm written once;
// bound: memory (J is small).
template <typename Idx>
__global__ void segment_fill(const Idx* __restrict__ index, int64_t is, int64_t J, int64_t K, int64_t skip,
                             const int32_t* __restrict__ start, int32_t* __restrict__ fill, int32_t* __restrict__ perm) {
  for (int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; j < J; j += int64_t(gridDim.x) * blockDim.x) {
    const int64_t v = int64_t(index[j * is]);
    if (v == skip || v < 0 || v >= K) continue;
    perm[start[v] + atomicAdd(fill + v, 1)] = int32_t(j);
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
// Longer segments (hot ids: BERT's token types, [MASK]) are left to segment_hot_rows. Bytes: g read once,
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
    if (n > kSegCapacity) continue;  // segment_hot_rows
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

// Step 4b, rows whose segment is longer than kSegCapacity. A row's sum is one chain per output element, so
// its speed is the loads in flight ahead of the adds: the row is cut into slices of 32 columns, one block
// each (grid.x = P x slices), and a block stages its slice of kHotStage g rows at a time in shared memory.
// grid.y blocks share the rows: block y looks at rows [256 y', 256 y' + 256) for y' = y, y + grid.y, ...
// (start[] read 256 at a time), and block z of those takes the tile's long rows z, z + grid.z, ... (two
// token types: 2 x Q / 32 busy blocks). For a long row k the block walks the index in
// chunks of kHotStage positions: thread t tests index[j0 + t] == k (the next chunk's value prefetched),
// the hits are compacted in increasing j (warp ballots, warps in order), the 8 warps load the hits' slices
// into the stage, and warp 0 (lane = column) adds them in order to its accumulators: increasing j, the
// CPU's order. Bytes: the row's g slices once, the index once per (row, slice); bound: memory latency.
constexpr int kHotSlice = 32;

template <typename T, typename Idx>
__global__ void __launch_bounds__(kSegThreads)
    segment_hot_rows(const T* __restrict__ g, const Idx* __restrict__ index, int64_t is,
                     const int32_t* __restrict__ start, T* __restrict__ out, int64_t P, int64_t J, int64_t K,
                     int64_t Q) {
  using A = acc_t<T>;
  constexpr int kHotStage = int(32 * 1024 / (kHotSlice * sizeof(A)));  // 256 rows (f32), 128 (f64)
  constexpr int kWarps = kSegThreads / 32;
  __shared__ A stage[kHotStage][kHotSlice];  // [rows, columns of the slice]
  __shared__ int32_t hits[kHotStage];        // positions of this chunk's hits, ascending
  __shared__ int32_t long_rows[kSegThreads];
  __shared__ int32_t warp_counts[kWarps];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t slices = (Q + kHotSlice - 1) / kHotSlice;
  const int64_t p = blockIdx.x / slices, c = (blockIdx.x % slices) * kHotSlice + lane;
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
      A acc = A(0);  // warp 0's: column c of row k
      const bool tester = threadIdx.x < kHotStage;
      int64_t v_next = tester && threadIdx.x < J ? int64_t(index[threadIdx.x * is]) : -1;
      for (int64_t j0 = 0; j0 < J; j0 += kHotStage) {
        const int64_t j = j0 + threadIdx.x, v = v_next;
        if (tester && j + kHotStage < J) v_next = int64_t(index[(j + kHotStage) * is]);
        const bool hit = tester && j < J && v == k;
        const unsigned b = __ballot_sync(0xffffffffu, hit);
        if (lane == 0) warp_counts[warp] = __popc(b);
        __syncthreads();  // also: warp 0 has added the previous chunk's stage
        int at = __popc(b & ((1u << lane) - 1u)), m = 0;
        for (int w = 0; w < kWarps; w++) {
          if (w < warp) at += warp_counts[w];
          m += warp_counts[w];
        }
        if (hit) hits[at] = int32_t(j);
        __syncthreads();
        if (c < Q) {
          const T* gp = g + p * J * Q + c;
#pragma unroll
          for (int i = 0; i < kHotStage / kWarps; i++) {
            const int row = warp + i * kWarps;
            if (row < m) stage[row][lane] = to_acc<A>(gp[int64_t(hits[row]) * Q]);
          }
        }
        __syncthreads();
        if (warp == 0)
          for (int row = 0; row < m; row++) acc += stage[row][lane];
      }
      if (warp == 0 && c < Q) out[(p * K + k) * Q + c] = from_acc<T>(acc);
      __syncthreads();  // stage, hits and warp_counts serve the next row
    }
    __syncthreads();  // long_rows and warp_counts serve the next tile
  }
}

// ---------------------------------------------------------------------------------------------------
// masked_fill and where: one thread per output element. Bytes: the inputs' reads (broadcast ones from
// cache) + one write per element; bound: memory.

template <typename W, typename I>
__global__ void masked_fill_elements(const W* __restrict__ x, const uint8_t* __restrict__ mask, W value,
                                     W* __restrict__ out, const __grid_constant__ Indexer<2, I> ix, I n) {
  for (I i = I(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += I(gridDim.x) * blockDim.x) {
    I off[2];
    ix.offsets(i, off);
    out[i] = mask[off[1]] ? value : x[off[0]];
  }
}

template <typename W, typename I>
__global__ void where_elements(const uint8_t* __restrict__ cond, const W* __restrict__ a, const W* __restrict__ b,
                               W* __restrict__ out, const __grid_constant__ Indexer<3, I> ix, I n) {
  for (I i = I(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += I(gridDim.x) * blockDim.x) {
    I off[3];
    ix.offsets(i, off);
    out[i] = cond[off[0]] ? a[off[1]] : b[off[2]];
  }
}

// ---------------------------------------------------------------------------------------------------
// Host helpers

int64_t prod(const Shape& s, size_t from, size_t to) {
  int64_t p = 1;
  for (size_t d = from; d < to; d++) p *= s[d];
  return p;
}

// True when index is a 1-D index along dim seen through expand_index (stride 0 everywhere else).
bool index_is_rows(const Tensor& index, int64_t dim) {
  for (int64_t d = 0; d < index.dim(); d++)
    if (d != dim && index.strides()[size_t(d)] != 0 && index.shape()[size_t(d)] != 1) return false;
  return true;
}

// True when a and b have the same shape except along dim.
bool same_except(const Shape& a, const Shape& b, int64_t dim) {
  if (a.size() != b.size()) return false;
  for (size_t d = 0; d < a.size(); d++)
    if (int64_t(d) != dim && a[d] != b[d]) return false;
  return true;
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
      const int64_t slices = (Q + kHotSlice - 1) / kHotSlice;
      const dim3 hot_grid(unsigned(P * slices), unsigned(std::min<int64_t>((K + kSegThreads - 1) / kSegThreads, 64)),
                          4);
      ENGINE_CUDA_INDEX_SWITCH(index.dtype(), Idx, {
        segment_hot_rows<T, Idx><<<hot_grid, kSegThreads, 0, stream>>>(
            pg, static_cast<const Idx*>(index.data_ptr()), is, start, po, P, J, K, Q);
      });
      ENGINE_CUDA_LAUNCH_CHECK("scatter_add (hot rows)");
    }
  });
  index_error_end(op, K);
}

}  // namespace

// ---------------------------------------------------------------------------------------------------

void concat(const std::vector<Tensor>& xs, int64_t dim, const Tensor& out) {
  const size_t es = engine::dtype_size(out.dtype());
  const int64_t outer = prod(out.shape(), 0, size_t(dim)), inner = prod(out.shape(), size_t(dim) + 1, out.shape().size());
  cudaStream_t stream = engine::cuda::stream();
  int64_t start = 0;
  for (const Tensor& x : xs) {
    const int64_t n = x.shape()[size_t(dim)];
    Tensor window = Tensor::view_of(out, x.shape(), out.strides(), out.offset() + start * out.strides()[size_t(dim)]);
    start += n;
    if (x.numel() == 0) continue;
    if (x.is_contiguous() && outer == 1) {
      ENGINE_CUDA_CHECK(cudaMemcpyAsync(window.data_ptr(), x.data_ptr(), x.nbytes(), cudaMemcpyDeviceToDevice, stream));
      continue;
    }
    if (x.is_contiguous()) {
      // outer rows of n * inner contiguous elements, landing every out.shape[dim] * inner elements.
      ENGINE_CUDA_CHECK(cudaMemcpy2DAsync(window.data_ptr(), size_t(out.shape()[size_t(dim)] * inner) * es, x.data_ptr(),
                                          size_t(n * inner) * es, size_t(n * inner) * es, size_t(outer),
                                          cudaMemcpyDeviceToDevice, stream));
      continue;
    }
    with_index_type(x.numel(), {&x, &window}, [&](auto tag) {
      using I = decltype(tag);
      const auto ix = make_indexer<2, I>("concat", x.shape(), {x.strides(), window.strides()});
      ENGINE_WORD_SWITCH(es, W, {
        strided_copy<W, I><<<grid_for(x.numel(), kThreads), kThreads, 0, stream>>>(
            static_cast<const W*>(x.data_ptr()), static_cast<W*>(window.data_ptr()), ix, I(x.numel()));
      });
    });
    ENGINE_CUDA_LAUNCH_CHECK("concat");
  }
}

void gather(const char* op, const Tensor& x, int64_t dim, const Tensor& index, const Tensor& out) {
  const int64_t numel = out.numel(), n = x.shape()[size_t(dim)];
  if (numel == 0) return;
  const size_t es = engine::dtype_size(x.dtype());
  cudaStream_t stream = engine::cuda::stream();
  IndexError* err = index_error_begin();
  ENGINE_CUDA_INDEX_SWITCH(index.dtype(), Idx, {
    const Idx* pi = static_cast<const Idx*>(index.data_ptr());
    if (x.is_contiguous() && index_is_rows(index, dim) && same_except(x.shape(), out.shape(), dim)) {
      // Rows form: whole rows of `inner` elements move, as 16-byte words when they allow it.
      const int64_t inner = prod(x.shape(), size_t(dim) + 1, x.shape().size()), J = out.shape()[size_t(dim)];
      const int64_t row_bytes = inner * int64_t(es);
      const bool wide = row_bytes % 16 == 0 && aligned16(x.data_ptr()) && aligned16(out.data_ptr());
      const int64_t word = wide ? 16 : int64_t(es), U = row_bytes / word, total = numel * int64_t(es) / word;
      const int64_t is = index.strides()[size_t(dim)];
      auto launch = [&](auto word_tag, auto index_tag) {
        using W = decltype(word_tag);
        using I = decltype(index_tag);
        gather_rows<W, I, Idx><<<grid_for(total, kThreads), kThreads, 0, stream>>>(
            static_cast<const W*>(x.data_ptr()), pi, is, static_cast<W*>(out.data_ptr()), I(total), I(J), I(U), n, err);
      };
      const bool small = x.numel() * int64_t(es) / word < (int64_t(1) << 31) && total < (int64_t(1) << 31);
      if (wide) {
        if (small) launch(uint4{}, int32_t{});
        else launch(uint4{}, int64_t{});
      } else {
        ENGINE_WORD_SWITCH(es, W, {
          if (small) launch(W{}, int32_t{});
          else launch(W{}, int64_t{});
        });
      }
    } else {
      Shape x_strides = x.strides();
      const int64_t step = x_strides[size_t(dim)];
      x_strides[size_t(dim)] = 0;
      with_index_type(numel, {&x, &index, &out}, [&](auto tag) {
        using I = decltype(tag);
        const auto ix = make_indexer<2, I>(op, out.shape(), {x_strides, index.strides()});
        ENGINE_WORD_SWITCH(es, W, {
          gather_elements<W, I, Idx><<<grid_for(numel, kThreads), kThreads, 0, stream>>>(
              static_cast<const W*>(x.data_ptr()), pi, static_cast<W*>(out.data_ptr()), ix, I(numel), n, step, err);
        });
      });
    }
  });
  ENGINE_CUDA_LAUNCH_CHECK("gather");
  index_error_end(op, n);
}

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

void masked_fill(const Tensor& x, const Tensor& mask, double value, const Tensor& out) {
  const int64_t n = out.numel();
  if (n == 0) return;
  const size_t es = engine::dtype_size(x.dtype());
  uint64_t bits = 0;  // value in x's dtype, converted on the host exactly as the CPU does
  ENGINE_ALL_SWITCH(x.dtype(), T, {
    const T v = static_cast<T>(static_cast<engine::acc_t<T>>(value));
    std::memcpy(&bits, &v, sizeof(T));
  });
  const Shape mask_strides = cpu::broadcast_strides(mask, out.shape());
  cudaStream_t stream = engine::cuda::stream();
  with_index_type(n, {&x, &mask, &out}, [&](auto tag) {
    using I = decltype(tag);
    const auto ix = make_indexer<2, I>("masked_fill", out.shape(), {x.strides(), mask_strides});
    ENGINE_WORD_SWITCH(es, W, {
      W v;
      std::memcpy(&v, &bits, sizeof(W));
      masked_fill_elements<W, I><<<grid_for(n, kThreads), kThreads, 0, stream>>>(
          static_cast<const W*>(x.data_ptr()), static_cast<const uint8_t*>(mask.data_ptr()), v,
          static_cast<W*>(out.data_ptr()), ix, I(n));
    });
  });
  ENGINE_CUDA_LAUNCH_CHECK("masked_fill");
}

void where(const Tensor& cond, const Tensor& a, const Tensor& b, const Tensor& out) {
  const int64_t n = out.numel();
  if (n == 0) return;
  const size_t es = engine::dtype_size(a.dtype());
  const Shape& shape = out.shape();
  cudaStream_t stream = engine::cuda::stream();
  with_index_type(n, {&cond, &a, &b, &out}, [&](auto tag) {
    using I = decltype(tag);
    const auto ix = make_indexer<3, I>(
        "where", shape,
        {cpu::broadcast_strides(cond, shape), cpu::broadcast_strides(a, shape), cpu::broadcast_strides(b, shape)});
    ENGINE_WORD_SWITCH(es, W, {
      where_elements<W, I><<<grid_for(n, kThreads), kThreads, 0, stream>>>(
          static_cast<const uint8_t*>(cond.data_ptr()), static_cast<const W*>(a.data_ptr()),
          static_cast<const W*>(b.data_ptr()), static_cast<W*>(out.data_ptr()), ix, I(n));
    });
  });
  ENGINE_CUDA_LAUNCH_CHECK("where");
}

}  // namespace ops::cuda
