// cuda/attention_simt.cu: true-fp32 flash attention on the CUDA cores at head dim 64 (f32, D == Dv == 64, rows of q,
// k, v, the output and the gradients unit-stride and 16-byte aligned), the fp32 models' case (BERT's heads). The
// generic kernels (attention_generic.cu) take every other f32 case. Same function as the cpu reference
// (ops/cpu/attention.cpp): same masks, the same dropout decisions (read from the keep bits), fully masked rows 0.
//
// Tiles of 64 queries x 64 keys, one block of 256 threads per tile of the grid's axis (queries for the forward and
// dQ, keys for dK dV) and head. Every operand lives in shared memory as rows of 64 floats, 68 apart ([row][68],
// copied by cp.async straight from q's, k's, v's rows): thread (ty, tx) = (tid / 16, tid % 16) owns rows ty + 16 i
// and columns tx + 16 j (i, j < 4) of a 64 x 64 product, whose dot products over 64 read float4s of 4 rows 16 apart
// (16 lanes x 16 bytes of rows 68 floats apart fall in distinct bank groups; the other operand is a broadcast), or
// rows ty + 16 i and columns 4 tx .. 4 tx + 3 of an accumulation A B (A's float4 along its rows, B's along its
// columns): 64 FMAs per 8 16-byte loads either way.
//   forward   S = Q K^T, the online softmax in base 2 (scale log2 e folded into the scores), P (times its dropout
//             factor) through shared memory, O += P V; a row's max and sum over the 16 lanes that share it.
//   dK dV     per key tile, for each query tile that sees it: S, dP = dO V^T, P, dS = P (dP Z - delta); P Z and dS
//             transposed into shared memory for dV += (P Z)^T dO and dK += dS^T Q, and dS (times the scale) written
//             to the op's dS buffer (ops/attention.h: kept for short keys).
//   dQ        per query tile: dQ = dS K over the key tiles it sees, dS read back from that buffer; where the op kept
//             none (long keys: ops/attention.h), S, dP and dS recomputed per key tile (a third pass of the products).
// Dropout decisions: read from the keep bits where the op kept them (written first by launch_keep_bits, then read by
// the forward and the backward), else drawn per element (engine/rng.h's draw, as the cpu). The backward is
// deterministic: no atomics, every sum in a fixed order.
// Measured (H200, 2026-12-06, engine_train --profile of bert_squad large 384 x 16 fp32, 24 layers): forward 8.72 ms,
// 26.6 TFLOP/s; backward 17.06 ms, 34.0 TFLOP/s counting its recomputed S (2.5 forwards' FLOPs); the naive
// composition's GEMMs and masked_fill/softmax/dropout passes took 47.5 ms on an H100 (BENCHMARKS.md). GPT-2 small,
// 1024 causal tokens x 8, dropout drawn and dQ recomputed (H100, 2026-12-07): forward 9.2 ms, 16.8 TFLOP/s; backward
// 25.7 ms, 15.1 TFLOP/s (causal pairs only); the step 174.3 ms against 225.3 on the generic kernels. Expected bound:
// the FMA pipes and shared memory (8 16-byte loads per 64 FMAs); ncu could not attach on the lent machine that day
// ("Failed to profile"), so this is not yet measured.
#include "engine/cuda/runtime.h"
#include "ops/cuda/attention_common.cuh"
#include "ops/cuda/kernel_util.cuh"

namespace ops::cuda::attn {

namespace {

constexpr int kB = 64;   // queries or keys of a tile
constexpr int kD = 64;   // the head dim
constexpr int kLd = 68;  // floats between rows of a tile in shared memory
constexpr int kThreads = 256;
constexpr int kTileFloats = kB * kLd;
constexpr float kLog2e = 1.4426950408889634f, kLn2 = 0.6931471805599453f;

// Rows [r0, r0 + 64) of a head's [L, 64] rows (row stride ld floats) into a tile by cp.async; rows past L zeros.
__device__ __forceinline__ void load_tile(float* tile, const float* head, int64_t ld, int r0, int L) {
  for (int c = threadIdx.x; c < kB * 16; c += kThreads) {  // 16 float4s a row
    const int r = c / 16, x = c % 16, row = r0 + r;
    cp_async16(smem_addr(tile + r * kLd + 4 * x), head + int64_t(row < L ? row : L - 1) * ld + 4 * x, row < L);
  }
}

__device__ __forceinline__ float4 ld4(const float* p) { return *reinterpret_cast<const float4*>(p); }
__device__ __forceinline__ float at(const float4& v, int c) { return c == 0 ? v.x : c == 1 ? v.y : c == 2 ? v.z : v.w; }

// acc[i][j] += sum_d A[ty + 16 i][d] B[tx + 16 j][d]: rows of A dotted with rows of B (S = Q K^T, dP = dO V^T).
__device__ __forceinline__ void dot_rows(const float* A, const float* B, int ty, int tx, float (&acc)[4][4]) {
#pragma unroll 4
  for (int d = 0; d < kD; d += 4) {
    float4 x[4], y[4];
#pragma unroll
    for (int i = 0; i < 4; i++) x[i] = ld4(A + (ty + 16 * i) * kLd + d);
#pragma unroll
    for (int j = 0; j < 4; j++) y[j] = ld4(B + (tx + 16 * j) * kLd + d);
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
      for (int j = 0; j < 4; j++) {
        acc[i][j] = fmaf(x[i].x, y[j].x, acc[i][j]);
        acc[i][j] = fmaf(x[i].y, y[j].y, acc[i][j]);
        acc[i][j] = fmaf(x[i].z, y[j].z, acc[i][j]);
        acc[i][j] = fmaf(x[i].w, y[j].w, acc[i][j]);
      }
  }
}

// acc[i][e] += sum_c A[ty + 16 i][c] B[c][4 tx + e]: a [64 x 64] product A B into rows ty + 16 i, columns 4 tx + e.
__device__ __forceinline__ void accumulate(const float* A, const float* B, int ty, int tx, float (&acc)[4][4]) {
#pragma unroll 4
  for (int c = 0; c < kB; c += 4) {
    float4 x[4], y[4];
#pragma unroll
    for (int i = 0; i < 4; i++) x[i] = ld4(A + (ty + 16 * i) * kLd + c);
#pragma unroll
    for (int r = 0; r < 4; r++) y[r] = ld4(B + (c + r) * kLd + 4 * tx);
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
      for (int r = 0; r < 4; r++) {
        const float xv = at(x[i], r);
        acc[i][0] = fmaf(xv, y[r].x, acc[i][0]);
        acc[i][1] = fmaf(xv, y[r].y, acc[i][1]);
        acc[i][2] = fmaf(xv, y[r].z, acc[i][2]);
        acc[i][3] = fmaf(xv, y[r].w, acc[i][3]);
      }
  }
}

// Max and sum over the 16 lanes that share a row.
__device__ __forceinline__ float row_max(float v) {
#pragma unroll
  for (int o = 8; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float row_sum(float v) {
#pragma unroll
  for (int o = 8; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Whether each of the thread's key columns k0 + tx + 16 j exists and is not padding.
__device__ __forceinline__ void columns_ok(const FlashArgs& a, const uint8_t* pad_row, int k0, int tx, bool (&ok)[4]) {
#pragma unroll
  for (int j = 0; j < 4; j++) {
    const int key = k0 + tx + 16 * j;
    ok[j] = key < a.Lk && !(pad_row && pad_row[key]);
  }
}

// Query i sees key k0 + tx + 16 j (ok: the column's half of the masks; the causal limit here).
__device__ __forceinline__ bool sees(const FlashArgs& a, bool ok, int i, int key) {
  return ok && i < a.Lq && !(a.causal && key > i + (a.Lk - a.Lq));
}

// Query i's dropout decisions on keys k0 .. k0 + 63 as bits 0 .. 63 (read for query i < Lq; the caller ignores the
// word of a query past Lq): read from the kept bits (keep: a.keep_ld bytes a row, k0 a multiple of 64, so 8 aligned
// bytes), or, without them, drawn, only the bits of the thread's own keys k0 + tx + 16 j set. Drawn where the draw's
// Philox blocks start on multiples of 8 keys (dropout_blocks_aligned): the 16 lanes that share query i draw the tile
// row's 8 blocks (lane tx block tx % 8: lanes 8-15 repeat lanes 0-7, whose draws the warp issues anyway), make each a
// byte of keep bits (dropout_keep_byte) and every lane gathers the 4 bytes that hold its keys, bytes tx / 8 + 2 j, by
// shuffles within its 16 lanes: one Philox block a lane per row instead of one per key. Otherwise one block per key.
// Every lane of the warp calls it together (the shuffles), whatever its query.
__device__ __forceinline__ uint64_t keep_word(const uint8_t* keep, const FlashArgs& a, int bh, int i, int k0, int tx) {
  if (keep)
    return i < a.Lq ? *reinterpret_cast<const uint64_t*>(keep + (int64_t(bh) * a.Lq + i) * a.keep_ld + k0 / 8) : 0;
  uint64_t word = 0;
  if (dropout_blocks_aligned(a)) {
    const uint32_t byte = dropout_keep_byte(a, dropout_index(a, bh, i, k0 + 8 * (tx & 7)));
#pragma unroll
    for (int j = 0; j < 4; j++) {
      const int b = (tx >> 3) + 2 * j;
      word |= uint64_t(__shfl_sync(0xffffffffu, byte, b, 16) & 0xffu) << (8 * b);
    }
    return word;
  }
#pragma unroll
  for (int j = 0; j < 4; j++) {
    const int key = k0 + tx + 16 * j;
    if (key < a.Lk && dropout_keep(a, dropout_index(a, bh, i, key))) word |= uint64_t(1) << (tx + 16 * j);
  }
  return word;
}

// The backward's entries of one tile pair (queries q0 + ty + 16 i, keys k0 + tx + 16 j) from S = Q K^T and dP = dO V^T:
// P Z (P = exp(scale S - lse), Z the dropout factor) and scale * dS = scale * P (dP Z - delta); 0 where the query does
// not see the key. lse2: the rows' lse in base 2 (+inf past Lq); keep: the kept bits or nullptr (drawn).
__device__ __forceinline__ void probabilities_and_ds(const FlashArgs& a, const uint8_t* keep, const bool (&ok)[4],
                                                     int bh, int q0, int k0, int ty, int tx, const float (&s)[4][4],
                                                     const float (&dp)[4][4], const float (&lse2)[4],
                                                     const float (&delta)[4], float (&pz)[4][4], float (&ds)[4][4]) {
#pragma unroll
  for (int i = 0; i < 4; i++) {
    const int qi = q0 + ty + 16 * i;
    const uint64_t bits = a.dropout ? keep_word(keep, a, bh, qi, k0, tx) : ~uint64_t(0);  // (the whole warp)
#pragma unroll
    for (int j = 0; j < 4; j++) {
      const int c = tx + 16 * j;
      pz[i][j] = ds[i][j] = 0.f;
      if (sees(a, ok[j], qi, k0 + c)) {
        const float p = exp2f(s[i][j] * a.scale_log2 - lse2[i]);  // 0 when lse = +inf (a row that saw no key)
        const float z = a.dropout ? ((bits >> c) & 1 ? a.keep_scale : 0.f) : 1.f;
        ds[i][j] = a.scale * (p * (dp[i][j] * z - delta[i]));
        pz[i][j] = p * z;
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------------
// Forward: one block per (query tile, head).
__global__ void __launch_bounds__(kThreads, 2) forward_kernel(const FlashArgs a) {
  extern __shared__ __align__(16) float smem[];
  float* sQ = smem;              // [64 queries][68]
  float* sK = sQ + kTileFloats;  // [64 keys][68]
  float* sV = sK + kTileFloats;  // [64 keys][68]
  float* sP = sV + kTileFloats;  // [64 queries][68] P Z of the tile
  const int h = blockIdx.y, b = blockIdx.z, bh = b * a.H + h, q0 = int(blockIdx.x) * kB;
  const int ty = threadIdx.x / 16, tx = threadIdx.x % 16;
  const float* qh = head_rows<float>(a.q, a.qs, b, h);
  const float* kh = head_rows<float>(a.k, a.ks, b, h);
  const float* vh = head_rows<float>(a.v, a.vs, b, h);
  const uint8_t* pad_row = pad_row_of(a, b);
  const KeyTiles tiles = key_tiles<kB>(a, pad_row, min(q0 + kB, a.Lq));

  load_tile(sQ, qh, a.qs.l, q0, a.Lq);
  cp_async_commit();
  float o[4][4] = {}, m[4], l[4] = {};  // m: the running max in base 2; l: this thread's part of the running sum
#pragma unroll
  for (int i = 0; i < 4; i++) m[i] = -INFINITY;
  for (int kt = tiles.begin; kt < tiles.end; kt++) {
    const int k0 = kt * kB;
    __syncthreads();  // the previous tile's products are done with sK, sV, sP
    load_tile(sK, kh, a.ks.l, k0, a.Lk);
    load_tile(sV, vh, a.vs.l, k0, a.Lk);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
    float s[4][4] = {};
    dot_rows(sQ, sK, ty, tx, s);
    bool ok[4];
    columns_ok(a, pad_row, k0, tx, ok);
#pragma unroll
    for (int i = 0; i < 4; i++) {
      const int r = ty + 16 * i, qi = q0 + r;
      float x[4];
#pragma unroll
      for (int j = 0; j < 4; j++) x[j] = sees(a, ok[j], qi, k0 + tx + 16 * j) ? s[i][j] * a.scale_log2 : -INFINITY;
      const float m_new = fmaxf(m[i], row_max(fmaxf(fmaxf(x[0], x[1]), fmaxf(x[2], x[3]))));
      // As the cpu: a row with every key so far masked adds nothing (alpha 1, P 0).
      float alpha = 1, p[4] = {0, 0, 0, 0};
      if (m_new != -INFINITY) {
        alpha = exp2f(m[i] - m_new);
#pragma unroll
        for (int j = 0; j < 4; j++) p[j] = exp2f(x[j] - m_new);
      }
      m[i] = m_new;
      l[i] = alpha * l[i] + (p[0] + p[1]) + (p[2] + p[3]);
#pragma unroll
      for (int e = 0; e < 4; e++) o[i][e] *= alpha;
      if (a.dropout) {
        const uint64_t keep = keep_word(a.keep_out, a, bh, qi, k0, tx);  // (the whole warp)
#pragma unroll
        for (int j = 0; j < 4; j++) p[j] = (keep >> (tx + 16 * j)) & 1 ? p[j] * a.keep_scale : 0.f;
      }
#pragma unroll
      for (int j = 0; j < 4; j++) sP[r * kLd + tx + 16 * j] = p[j];
    }
    __syncthreads();
    accumulate(sP, sV, ty, tx, o);
  }
  cp_async_wait<0>();  // a block without key tiles never waited for its queries' copy
  float* out = static_cast<float*>(a.out) + b * a.outs.b + h * a.outs.h;  // [Lq, 64], rows outs.l apart
#pragma unroll
  for (int i = 0; i < 4; i++) {
    const int qi = q0 + ty + 16 * i;
    const float sum = row_sum(l[i]);
    if (qi >= a.Lq) continue;
    const float inv = sum == 0.f ? 0.f : 1.f / sum;
    *reinterpret_cast<float4*>(out + int64_t(qi) * a.outs.l + 4 * tx) =
        float4{o[i][0] * inv, o[i][1] * inv, o[i][2] * inv, o[i][3] * inv};
    if (tx == 0)
      static_cast<float*>(a.lse)[int64_t(bh) * a.Lq + qi] = sum == 0.f ? INFINITY : (m[i] + log2f(sum)) * kLn2;
  }
}

// ---------------------------------------------------------------------------------------------------
// dK, dV and dS: one block per (key tile, head), walking the query tiles that see it.
__global__ void __launch_bounds__(kThreads, 2) dkdv_kernel(const FlashArgs a) {
  extern __shared__ __align__(16) float smem[];
  float* sK = smem;                 // [64 keys][68]
  float* sV = sK + kTileFloats;     // [64 keys][68]
  float* sQ = sV + kTileFloats;     // [64 queries][68]
  float* sdO = sQ + kTileFloats;    // [64 queries][68]
  float* sPt = sdO + kTileFloats;   // [64 keys][68] (P Z)^T
  float* sSt = sPt + kTileFloats;   // [64 keys][68] (scale dS)^T
  float* sLse = sSt + kTileFloats;  // [64] lse in base 2 (+inf past Lq)
  float* sDelta = sLse + kB;        // [64]
  // (dS written to the op's buffer when it kept one: a.ds, [ds_rows, ds_ld] per head, queries x keys)
  const int h = blockIdx.y, b = blockIdx.z, bh = b * a.H + h, k0 = int(blockIdx.x) * kB;
  const int ty = threadIdx.x / 16, tx = threadIdx.x % 16;
  const float* qh = head_rows<float>(a.q, a.qs, b, h);
  const float* kh = head_rows<float>(a.k, a.ks, b, h);
  const float* vh = head_rows<float>(a.v, a.vs, b, h);
  const float* doh = head_rows<float>(a.dout, a.dos, b, h);
  const uint8_t* pad_row = pad_row_of(a, b);
  const QueryTiles tiles = query_tiles<kB>(a, pad_row, k0, kB);
  float* ds = a.ds ? static_cast<float*>(a.ds) + int64_t(bh) * a.ds_rows * a.ds_ld : nullptr;

  load_tile(sK, kh, a.ks.l, k0, a.Lk);
  load_tile(sV, vh, a.vs.l, k0, a.Lk);
  cp_async_commit();
  bool ok[4];
  columns_ok(a, pad_row, k0, tx, ok);
  float dk[4][4] = {}, dv[4][4] = {};  // keys ty + 16 i, dims 4 tx .. 4 tx + 3
  for (int qt = tiles.first; qt < tiles.end; qt++) {
    const int q0 = qt * kB;
    __syncthreads();  // the previous tile's products are done with sQ, sdO, sPt, sSt
    load_tile(sQ, qh, a.qs.l, q0, a.Lq);
    load_tile(sdO, doh, a.dos.l, q0, a.Lq);
    cp_async_commit();
    if (threadIdx.x < kB) {
      const int i = q0 + threadIdx.x;
      const bool in = i < a.Lq;
      sLse[threadIdx.x] = in ? static_cast<const float*>(a.lse)[int64_t(bh) * a.Lq + i] * kLog2e : INFINITY;
      sDelta[threadIdx.x] = in ? static_cast<const float*>(a.delta)[int64_t(bh) * a.Lq + i] : 0.f;
    }
    cp_async_wait<0>();
    __syncthreads();
    float s[4][4] = {}, dp[4][4] = {};  // queries ty + 16 i, keys tx + 16 j
    dot_rows(sQ, sK, ty, tx, s);
    dot_rows(sdO, sV, ty, tx, dp);
    float lse2[4], delta[4], pz[4][4], d[4][4];
#pragma unroll
    for (int i = 0; i < 4; i++) lse2[i] = sLse[ty + 16 * i], delta[i] = sDelta[ty + 16 * i];
    probabilities_and_ds(a, a.keep_in, ok, bh, q0, k0, ty, tx, s, dp, lse2, delta, pz, d);
#pragma unroll
    for (int i = 0; i < 4; i++) {
      const int r = ty + 16 * i;
#pragma unroll
      for (int j = 0; j < 4; j++) {
        const int c = tx + 16 * j;
        sPt[c * kLd + r] = pz[i][j];
        sSt[c * kLd + r] = d[i][j];
        if (ds) ds[int64_t(q0 + r) * a.ds_ld + k0 + c] = d[i][j];
      }
    }
    __syncthreads();
    accumulate(sPt, sdO, ty, tx, dv);  // dV(j, e) += sum_i PZ(i, j) dO(i, e)
    accumulate(sSt, sQ, ty, tx, dk);   // dK(j, d) += sum_i dS(i, j) Q(i, d)
  }
  cp_async_wait<0>();  // a block without query tiles never waited for its keys' copy
  float* dkh = static_cast<float*>(a.dk) + b * a.dks.b + h * a.dks.h;
  float* dvh = static_cast<float*>(a.dv) + b * a.dvs.b + h * a.dvs.h;
#pragma unroll
  for (int i = 0; i < 4; i++) {
    const int key = k0 + ty + 16 * i;
    if (key >= a.Lk) continue;
    *reinterpret_cast<float4*>(dkh + int64_t(key) * a.dks.l + 4 * tx) = float4{dk[i][0], dk[i][1], dk[i][2], dk[i][3]};
    *reinterpret_cast<float4*>(dvh + int64_t(key) * a.dvs.l + 4 * tx) = float4{dv[i][0], dv[i][1], dv[i][2], dv[i][3]};
  }
}

// dQ = dS K: one block per (query tile, head), over the key tiles it sees (those dkdv_kernel wrote dS for).
__global__ void __launch_bounds__(kThreads, 2) dq_kernel(const FlashArgs a) {
  extern __shared__ __align__(16) float smem[];
  float* sS = smem;              // [64 queries][68] scale dS
  float* sK = sS + kTileFloats;  // [64 keys][68]
  const int h = blockIdx.y, b = blockIdx.z, bh = b * a.H + h, q0 = int(blockIdx.x) * kB;
  const int ty = threadIdx.x / 16, tx = threadIdx.x % 16;
  const float* kh = head_rows<float>(a.k, a.ks, b, h);
  const float* ds = static_cast<const float*>(a.ds) + int64_t(bh) * a.ds_rows * a.ds_ld;
  const uint8_t* pad_row = pad_row_of(a, b);
  const KeyTiles tiles = key_tiles<kB>(a, pad_row, min(q0 + kB, a.Lq));
  float dq[4][4] = {};
  for (int kt = tiles.begin; kt < tiles.end; kt++) {
    const int k0 = kt * kB;
    __syncthreads();
    load_tile(sS, ds + k0, a.ds_ld, q0, int(a.ds_rows));
    load_tile(sK, kh, a.ks.l, k0, a.Lk);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
    accumulate(sS, sK, ty, tx, dq);
  }
  float* dqh = static_cast<float*>(a.dq) + b * a.dqs.b + h * a.dqs.h;
#pragma unroll
  for (int i = 0; i < 4; i++) {
    const int qi = q0 + ty + 16 * i;
    if (qi < a.Lq)
      *reinterpret_cast<float4*>(dqh + int64_t(qi) * a.dqs.l + 4 * tx) = float4{dq[i][0], dq[i][1], dq[i][2], dq[i][3]};
  }
}

// dQ where the op kept no dS: one block per (query tile, head), over the key tiles it sees, S, dP and dS recomputed
// (dS through shared memory, [query][key]) for dQ += dS K.
__global__ void __launch_bounds__(kThreads, 2) dq_recompute_kernel(const FlashArgs a) {
  extern __shared__ __align__(16) float smem[];
  float* sQ = smem;               // [64 queries][68]
  float* sdO = sQ + kTileFloats;  // [64 queries][68]
  float* sK = sdO + kTileFloats;  // [64 keys][68]
  float* sV = sK + kTileFloats;   // [64 keys][68]
  float* sS = sV + kTileFloats;   // [64 queries][68] scale dS
  const int h = blockIdx.y, b = blockIdx.z, bh = b * a.H + h, q0 = int(blockIdx.x) * kB;
  const int ty = threadIdx.x / 16, tx = threadIdx.x % 16;
  const float* qh = head_rows<float>(a.q, a.qs, b, h);
  const float* kh = head_rows<float>(a.k, a.ks, b, h);
  const float* vh = head_rows<float>(a.v, a.vs, b, h);
  const float* doh = head_rows<float>(a.dout, a.dos, b, h);
  const uint8_t* pad_row = pad_row_of(a, b);
  const KeyTiles tiles = key_tiles<kB>(a, pad_row, min(q0 + kB, a.Lq));

  load_tile(sQ, qh, a.qs.l, q0, a.Lq);
  load_tile(sdO, doh, a.dos.l, q0, a.Lq);
  cp_async_commit();
  float lse2[4], delta[4];
#pragma unroll
  for (int i = 0; i < 4; i++) {
    const int qi = q0 + ty + 16 * i;
    const bool in = qi < a.Lq;
    lse2[i] = in ? static_cast<const float*>(a.lse)[int64_t(bh) * a.Lq + qi] * kLog2e : INFINITY;
    delta[i] = in ? static_cast<const float*>(a.delta)[int64_t(bh) * a.Lq + qi] : 0.f;
  }
  float dq[4][4] = {};  // queries ty + 16 i, dims 4 tx .. 4 tx + 3
  for (int kt = tiles.begin; kt < tiles.end; kt++) {
    const int k0 = kt * kB;
    __syncthreads();  // the previous tile's product is done with sK, sS
    load_tile(sK, kh, a.ks.l, k0, a.Lk);
    load_tile(sV, vh, a.vs.l, k0, a.Lk);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
    float s[4][4] = {}, dp[4][4] = {}, pz[4][4], d[4][4];
    dot_rows(sQ, sK, ty, tx, s);
    dot_rows(sdO, sV, ty, tx, dp);
    bool ok[4];
    columns_ok(a, pad_row, k0, tx, ok);
    probabilities_and_ds(a, a.keep_in, ok, bh, q0, k0, ty, tx, s, dp, lse2, delta, pz, d);
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
      for (int j = 0; j < 4; j++) sS[(ty + 16 * i) * kLd + tx + 16 * j] = d[i][j];
    __syncthreads();
    accumulate(sS, sK, ty, tx, dq);
  }
  cp_async_wait<0>();  // a block without key tiles never waited for its queries' copy
  float* dqh = static_cast<float*>(a.dq) + b * a.dqs.b + h * a.dqs.h;
#pragma unroll
  for (int i = 0; i < 4; i++) {
    const int qi = q0 + ty + 16 * i;
    if (qi < a.Lq)
      *reinterpret_cast<float4*>(dqh + int64_t(qi) * a.dqs.l + 4 * tx) = float4{dq[i][0], dq[i][1], dq[i][2], dq[i][3]};
  }
}

template <typename Kernel>
void launch(Kernel kernel, int L, int tiles, const FlashArgs& a) {
  const int blocks = (L + kB - 1) / kB;
  if (blocks == 0 || a.B == 0 || a.H == 0) return;
  const int smem = int(sizeof(float)) * (tiles * kTileFloats + 2 * kB);
  engine::cuda::set_smem_limit(kernel, smem);
  kernel<<<dim3(unsigned(blocks), unsigned(a.H), unsigned(a.B)), kThreads, size_t(smem), engine::cuda::stream()>>>(a);
  ENGINE_CUDA_LAUNCH_CHECK("flash_attention (fp32 CUDA-core kernels)");
}

}  // namespace

bool simt_applies(const FlashArgs& a) { return a.D == kD && a.Dv == kD; }

void launch_forward_simt(const FlashArgs& a) { launch(forward_kernel, a.Lq, 4, a); }

void launch_backward_simt(const FlashArgs& a) {
  launch(dkdv_kernel, a.Lk, 6, a);
  if (a.ds)
    launch(dq_kernel, a.Lq, 2, a);
  else
    launch(dq_recompute_kernel, a.Lq, 5, a);
}

}  // namespace ops::cuda::attn
