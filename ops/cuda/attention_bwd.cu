// cuda/attention_bwd.cu: the FlashAttention-2 backward on tensor cores (bf16/f16, head dim 64 or 128), in
// three deterministic passes (no atomics: the same inputs give the same bits every run):
//
//   delta    delta_i = dO_i . O_i - dlse_i                one warp per row (any dtype, any strides)
//   dK, dV   one block per key tile of Bc keys; its warps own 16 keys each and walk every query tile that
//            can see them, recomputing the transposed tiles in registers:
//                S^T = K Q^T,  dP^T = V dO^T               (keys x queries, f32 accumulators)
//                P^T = exp2(S^T * scale*log2e - lse*log2e) (dropout factors Z regenerated from Philox)
//                dS^T = P^T (dP^T Z - delta)
//                dV += (P^T Z) dO,  dK += dS^T Q           (P^T and dS^T re-packed from accumulators
//                                                          straight into A fragments)
//   dQ       one block per query tile, warps own 16 queries, walking the key tiles like the forward:
//                S = Q K^T, dP = dO V^T, dS = P (dP Z - delta), dQ += dS K
// The dQ pass recomputes S and dP (7 GEMM-sized products instead of FlashAttention-2's 5 with atomic adds
// on an f32 dQ): 40% more tensor-core work bought for determinism and no dq accumulator traffic.
// When the op gives a dS buffer (ops/attention.cpp: when a head's [Lq, Lk] dS, padded to 64 x 64 tiles, takes at
// most 8 times its q), the dK dV pass also writes dS (16-bit, as the tensor cores take it) and the dQ pass becomes
//   dQ from dS  one block per query tile of 64, walking the 64-key tiles: dQ += dS K, dS and K double-buffered
// one product instead of three, the exponentials and the dropout draws, for dS's bytes written and read once:
// the same values (dS is rounded to 16 bits for the MMA either way), still deterministic.
// Q/dO (dK dV pass) and K/V (dQ pass) tiles are double-buffered with cp.async so loads overlap the MMAs.
// Key tiles outside the batch row's unpadded keys are skipped by every pass (attention_common.cuh's key_tiles):
// their dK, dV are zero, and a batch of short sequences costs their lengths, not the padded length.
//
// Bound: FLOPs (7 * 2 * Lq * Lk * D per head, halved causal); smem bandwidth for the fragment loads is the
// next limit (each warp reads every Q/dO, or K/V, fragment of the tile once per 16 of its rows).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "engine/cuda/runtime.h"
#include "engine/dtype.h"
#include "ops/cuda/attention_common.cuh"
#include "ops/cuda/kernel_util.cuh"

namespace ops::cuda::attn {

namespace {

constexpr float kLog2e = 1.4426950408889634f;

// ---------------------------------------------------------------------------------------------------
// delta = rowsum(dO * O) - dlse. Bytes: 2 * B*H*Lq*Dv * sizeof(T) read, 4 per row written: memory-bound.
// Vectorized: kLanes threads per row, each reading 16-byte chunks of O and dO, a shuffle tree over the
// kLanes; rows are spread over the block so every load is in flight at once. The generic kernel (any strides)
// gives each row a warp.

template <typename T, int kLanes>
__global__ void delta_kernel_vec(const FlashArgs a) {
  using A = acc_t<T>;
  constexpr int kVec = vec16<T>(), kRowsPerBlock = 256 / kLanes;
  const int64_t rows = int64_t(a.B) * a.H * a.Lq;
  const int lane = threadIdx.x % kLanes;
  for (int64_t r0 = int64_t(blockIdx.x) * kRowsPerBlock; r0 < rows; r0 += int64_t(gridDim.x) * kRowsPerBlock) {
    const int64_t row = r0 + threadIdx.x / kLanes;
    A sum = 0;
    if (row < rows) {
      const int64_t bh = row / a.Lq, i = row - bh * a.Lq, b = bh / a.H, h = bh - b * a.H;
      const T* o = static_cast<const T*>(a.o) + b * a.os.b + h * a.os.h + i * a.os.l;
      const T* d = head_rows<T>(a.dout, a.dos, b, h) + i * a.dos.l;
      for (int e = lane * kVec; e < a.Dv; e += kLanes * kVec) {
        A ov[kVec], dv[kVec];
        load_vec<kVec>(o + e, ov);
        load_vec<kVec>(d + e, dv);
#pragma unroll
        for (int x = 0; x < kVec; x++) sum += dv[x] * ov[x];
      }
    }
#pragma unroll
    for (int off = kLanes / 2; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
    if (row < rows && lane == 0)
      static_cast<A*>(a.delta)[row] = sum - (a.dlse ? static_cast<const A*>(a.dlse)[row] : A(0));
  }
}

template <typename T>
__global__ void delta_kernel(const FlashArgs a) {
  using A = acc_t<T>;
  const int64_t rows = int64_t(a.B) * a.H * a.Lq;
  const int lane = threadIdx.x % 32;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / 32);
  for (int64_t row = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32; row < rows; row += warps) {
    const int64_t bh = row / a.Lq, i = row % a.Lq, b = bh / a.H, h = bh % a.H;
    const T* o = static_cast<const T*>(a.o) + b * a.os.b + h * a.os.h + i * a.os.l;
    const T* d = head_rows<T>(a.dout, a.dos, b, h) + i * a.dos.l;
    A sum = 0;
    for (int e = lane; e < a.Dv; e += 32) sum += to_acc<A>(d[e * a.dos.d]) * to_acc<A>(o[e * a.os.d]);
    sum = warp_sum(sum);
    if (lane == 0) {
      const A dlse = a.dlse ? static_cast<const A*>(a.dlse)[row] : A(0);
      static_cast<A*>(a.delta)[row] = sum - dlse;
    }
  }
}

// Rows of x ([B, H, Lq, Dv], strides xs) made of 16-byte vectors: unit stride along Dv, aligned start,
// every other stride a multiple of the vector.
template <typename T>
bool rows_of_vectors(const void* x, const Strides& xs, const FlashArgs& a) {
  constexpr int kVec = vec16<T>();
  if (!aligned16(x) || xs.d != 1 || a.Dv % kVec != 0) return false;
  return (a.B == 1 || xs.b % kVec == 0) && (a.H == 1 || xs.h % kVec == 0) && (a.Lq == 1 || xs.l % kVec == 0);
}

template <typename T, int kLanes>
void launch_delta_vec(const FlashArgs& a, int64_t rows) {
  constexpr int kRowsPerBlock = 256 / kLanes;
  const int64_t blocks = std::min<int64_t>((rows + kRowsPerBlock - 1) / kRowsPerBlock,
                                           int64_t(engine::cuda::multiprocessors()) * 16);
  delta_kernel_vec<T, kLanes><<<unsigned(std::max<int64_t>(blocks, 1)), 256, 0, engine::cuda::stream()>>>(a);
  ENGINE_CUDA_LAUNCH_CHECK("flash_attention_backward (delta)");
}

// ---------------------------------------------------------------------------------------------------
// dK, dV

template <int D_, int kWarps_, int Br_, bool kKVInRegs_, int kMinBlocks_ = 1>
struct DkdvConfig {
  static constexpr int D = D_;
  static constexpr int Bc = 16 * kWarps_;  // keys per block
  static constexpr int Br = Br_;           // queries per step
  static constexpr int kThreads = 32 * kWarps_;
  static constexpr bool kKVInRegs = kKVInRegs_;
  static constexpr int kMinBlocks = kMinBlocks_;
  static constexpr int kSmemBytes = (2 * Bc * D + 4 * Br * D) * 2 + 4 * Br * 4;
};

template <typename Cfg, typename T, Drop kDrop, bool kWriteDs = false>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kMinBlocks) dkdv_kernel(const FlashArgs a) {
  constexpr bool kDropout = kDrop != Drop::none, shared_draw = kDrop == Drop::shared;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  constexpr int D = Cfg::D, Br = Cfg::Br, Bc = Cfg::Bc, kThreads = Cfg::kThreads;
  constexpr int NT = Br / 8, DT = D / 8, KS = D / 16;
  extern __shared__ __align__(128) uint16_t smem[];
  uint16_t* sK = smem;               // [Bc, D]
  uint16_t* sV = sK + Bc * D;        // [Bc, D]
  uint16_t* sQ = sV + Bc * D;        // [2][Br, D]
  uint16_t* sdO = sQ + 2 * Br * D;   // [2][Br, D]
  float* sLse = reinterpret_cast<float*>(sdO + 2 * Br * D);  // [2][Br]
  float* sDelta = sLse + 2 * Br;                              // [2][Br]

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4;
  const int h = blockIdx.y, b = blockIdx.z, bh = b * a.H + h;
  const int k0 = int(blockIdx.x) * Bc;
  const int warp_key = warp * 16;
  const uint16_t* qh = head_rows(a.q, a.qs, b, h);
  const uint16_t* kh = head_rows(a.k, a.ks, b, h);
  const uint16_t* vh = head_rows(a.v, a.vs, b, h);
  const uint16_t* doh = head_rows(a.dout, a.dos, b, h);
  const float* lse_h = static_cast<const float*>(a.lse) + int64_t(bh) * a.Lq;
  const float* delta_h = static_cast<const float*>(a.delta) + int64_t(bh) * a.Lq;
  const uint8_t* pad_row = pad_row_of(a, b);

  load_tile_async<Bc, D, kThreads>(sK, kh, a.ks.l, k0, a.Lk);
  load_tile_async<Bc, D, kThreads>(sV, vh, a.vs.l, k0, a.Lk);
  cp_async_commit();

  // Causal: query i sees key k0 only from i = k0 - (Lk - Lq) on. A tile outside the batch row's unpadded keys sees
  // no query (attention_common.cuh's key_tiles): its dK and dV are zero, its dS columns are not written.
  const QueryTiles queries = query_tiles<Br>(a, pad_row, k0, Bc);
  const int m_first = queries.first, m_end = queries.end;
  // Rows past Lq load as zeros (Q, dO, lse, delta): P = 1 there but dV, dK gain 1 * 0 and 0 * 0.
  auto load_query_tile = [&](int m, int buf) {
    load_tile_async<Br, D, kThreads>(sQ + buf * Br * D, qh, a.qs.l, m * Br, a.Lq);
    load_tile_async<Br, D, kThreads>(sdO + buf * Br * D, doh, a.dos.l, m * Br, a.Lq);
    for (int r = tid; r < Br; r += kThreads) {
      const int i = m * Br + r;
      const bool valid = i < a.Lq;
      cp_async4(smem_addr(sLse + buf * Br + r), lse_h + (valid ? i : 0), valid);
      cp_async4(smem_addr(sDelta + buf * Br + r), delta_h + (valid ? i : 0), valid);
    }
  };
  if (m_first < m_end) load_query_tile(m_first, 0);
  cp_async_commit();

  // This lane's two keys (rows g and g + 8 of the warp's 16): visible at all (in range, not padding)?
  bool key_ok[2];
#pragma unroll
  for (int half = 0; half < 2; half++) {
    const int j = k0 + warp_key + g + half * 8;
    key_ok[half] = j < a.Lk && !(pad_row && pad_row[j]);
  }

  float dk[DT][4], dv[DT][4];  // [16 keys, D] per warp
#pragma unroll
  for (int dt = 0; dt < DT; dt++)
#pragma unroll
    for (int e = 0; e < 4; e++) dk[dt][e] = dv[dt][e] = 0.f;

  const FragAddr<D> k_frag = frag_a<D>(sK, lane), v_frag = frag_a<D>(sV, lane);
  uint32_t kf[Cfg::kKVInRegs ? KS : 1][4], vf[Cfg::kKVInRegs ? KS : 1][4];
  cp_async_wait<1>();  // K and V have landed
  __syncthreads();
  if constexpr (Cfg::kKVInRegs) {
#pragma unroll
    for (int ks = 0; ks < KS; ks++) {
      ldmatrix_x4(kf[ks], k_frag(warp_key, ks));
      ldmatrix_x4(vf[ks], v_frag(warp_key, ks));
    }
  }

  for (int m = m_first; m < m_end; m++) {
    const int buf = (m - m_first) & 1;
    cp_async_wait<0>();
    __syncthreads();  // tile m has landed, and every warp is done with the other buffer
    if (m + 1 < m_end) load_query_tile(m + 1, buf ^ 1);
    cp_async_commit();
    const uint16_t* q_t = sQ + buf * Br * D;
    const uint16_t* do_t = sdO + buf * Br * D;
    const float* lse_t = sLse + buf * Br;
    const float* delta_t = sDelta + buf * Br;
    const int i0 = m * Br;

    // Dropout's keep bits of this step (byte nt2: n-tiles 2 nt2, 2 nt2 + 1), drawn before the products.
    [[maybe_unused]] KeepBytes<NT / 2> keep_bits;
    if constexpr (kDropout) draw_keep_cols<shared_draw, NT>(a, bh, i0, k0 + warp_key, lane, keep_bits);

    // S^T = K Q^T and dP^T = V dO^T                                              [16 keys, Br] per warp
    float s[NT][4], dp[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
      for (int e = 0; e < 4; e++) s[nt][e] = dp[nt][e] = 0.f;
    const FragAddr<D> q_rows = frag_b_rows<D>(q_t, lane), do_rows = frag_b_rows<D>(do_t, lane);
#pragma unroll
    for (int ks = 0; ks < KS; ks++) {
      uint32_t ka[4], va[4];
      if constexpr (Cfg::kKVInRegs) {
#pragma unroll
        for (int x = 0; x < 4; x++) ka[x] = kf[ks][x], va[x] = vf[ks][x];
      } else {
        ldmatrix_x4(ka, k_frag(warp_key, ks));
        ldmatrix_x4(va, v_frag(warp_key, ks));
      }
#pragma unroll
      for (int nt2 = 0; nt2 < NT / 2; nt2++) {
        uint32_t bq[4], bo[4];
        ldmatrix_x4(bq, q_rows(nt2 * 16, ks));
        mma16816<T>(s[2 * nt2], ka, bq[0], bq[1]);
        mma16816<T>(s[2 * nt2 + 1], ka, bq[2], bq[3]);
        ldmatrix_x4(bo, do_rows(nt2 * 16, ks));
        mma16816<T>(dp[2 * nt2], va, bo[0], bo[1]);
        mma16816<T>(dp[2 * nt2 + 1], va, bo[2], bo[3]);
      }
    }

    // P^T, dS^T (masked), and dS [queries, keys] out for the dQ pass.
    dkdv_scores_to_ds<kDropout>(a, s, dp, keep_bits, lse_t, delta_t, key_ok, i0, k0 + warp_key, lane);
    if constexpr (kWriteDs) store_ds_transposed<T>(a, bh, i0, k0 + warp_key, lane, dp);

    // dV += (P Z)^T dO, dK += dS^T Q                                              [16 keys, D] per warp
    const FragAddr<D> do_trans = frag_b_trans<D>(do_t, lane), q_trans = frag_b_trans<D>(q_t, lane);
#pragma unroll
    for (int kk = 0; kk < NT / 2; kk++) {
      uint32_t pa[4], da[4];
      acc_to_a<T>(s[2 * kk], s[2 * kk + 1], pa);
      acc_to_a<T>(dp[2 * kk], dp[2 * kk + 1], da);
#pragma unroll
      for (int dt2 = 0; dt2 < D / 16; dt2++) {
        uint32_t bo[4], bq[4];
        ldmatrix_x4_trans(bo, do_trans(kk * 16, dt2));
        mma16816<T>(dv[2 * dt2], pa, bo[0], bo[1]);
        mma16816<T>(dv[2 * dt2 + 1], pa, bo[2], bo[3]);
        ldmatrix_x4_trans(bq, q_trans(kk * 16, dt2));
        mma16816<T>(dk[2 * dt2], da, bq[0], bq[1]);
        mma16816<T>(dk[2 * dt2 + 1], da, bq[2], bq[3]);
      }
    }
  }
  cp_async_wait<0>();

  store_dkdv<T>(a, b, h, k0 + warp_key, lane, dk, dv);
#endif
}

// ---------------------------------------------------------------------------------------------------
// dQ

// dq [16 rows, D] += A [16, 16 KK] K-tile [16 KK, D] for one warp: A's 16-key step kk from a_step(kk, fragment)
// (dS re-packed from accumulators, or loaded from the kept dS), K through its transposed fragments.
template <typename T, int KK, int DT, int D = DT * 8, typename AStep>
__device__ __forceinline__ void add_times_k(float (&dq)[DT][4], const FragAddr<D>& k_trans, AStep a_step) {
#pragma unroll
  for (int kk = 0; kk < KK; kk++) {
    uint32_t da[4];
    a_step(kk, da);
#pragma unroll
    for (int dt2 = 0; dt2 < D / 16; dt2++) {
      uint32_t bk[4];
      ldmatrix_x4_trans(bk, k_trans(kk * 16, dt2));
      mma16816<T>(dq[2 * dt2], da, bk[0], bk[1]);
      mma16816<T>(dq[2 * dt2 + 1], da, bk[2], bk[3]);
    }
  }
}

template <int D_, int kWarps_, int Bc_, int kMinBlocks_ = 1>
struct DqConfig {
  static constexpr int D = D_;
  static constexpr int Br = 16 * kWarps_;  // queries per block
  static constexpr int Bc = Bc_;           // keys per step
  static constexpr int kThreads = 32 * kWarps_;
  static constexpr int kMinBlocks = kMinBlocks_;
  static constexpr int kSmemBytes = (2 * Br * D + 4 * Bc * D) * 2;
};

template <typename Cfg, typename T, Drop kDrop>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kMinBlocks) dq_kernel(const FlashArgs a) {
  constexpr bool kDropout = kDrop != Drop::none, shared_draw = kDrop == Drop::shared;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  constexpr int D = Cfg::D, Br = Cfg::Br, Bc = Cfg::Bc, kThreads = Cfg::kThreads;
  constexpr int NT = Bc / 8, DT = D / 8, KS = D / 16;
  extern __shared__ __align__(128) uint16_t smem[];
  uint16_t* sQ = smem;              // [Br, D]
  uint16_t* sdO = sQ + Br * D;      // [Br, D]
  uint16_t* sK = sdO + Br * D;      // [2][Bc, D]
  uint16_t* sV = sK + 2 * Bc * D;   // [2][Bc, D]

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4;
  const int m_block = int(gridDim.x) - 1 - int(blockIdx.x);  // longest causal tiles first
  const int h = blockIdx.y, b = blockIdx.z, bh = b * a.H + h;
  const int q0 = m_block * Br;
  const int warp_row = warp * 16;
  const uint16_t* qh = head_rows(a.q, a.qs, b, h);
  const uint16_t* kh = head_rows(a.k, a.ks, b, h);
  const uint16_t* vh = head_rows(a.v, a.vs, b, h);
  const uint16_t* doh = head_rows(a.dout, a.dos, b, h);
  const uint8_t* pad_row = pad_row_of(a, b);

  const KeyTiles tiles = key_tiles<Bc>(a, pad_row, q0 + Br);  // causal and padded tiles skipped

  load_tile_async<Br, D, kThreads>(sQ, qh, a.qs.l, q0, a.Lq);
  load_tile_async<Br, D, kThreads>(sdO, doh, a.dos.l, q0, a.Lq);
  if (tiles.begin < tiles.end) {
    load_tile_async<Bc, D, kThreads>(sK, kh, a.ks.l, tiles.begin * Bc, a.Lk);
    load_tile_async<Bc, D, kThreads>(sV, vh, a.vs.l, tiles.begin * Bc, a.Lk);
  }
  cp_async_commit();

  // This lane's two rows: lse (in log2 units) and delta. Rows past Lq: 0 (not written).
  float lse2[2], delta[2];
#pragma unroll
  for (int half = 0; half < 2; half++) {
    const int i = q0 + warp_row + g + half * 8;
    const bool valid = i < a.Lq;
    lse2[half] = valid ? static_cast<const float*>(a.lse)[int64_t(bh) * a.Lq + i] * kLog2e : 0.f;
    delta[half] = valid ? static_cast<const float*>(a.delta)[int64_t(bh) * a.Lq + i] : 0.f;
  }

  cp_async_wait<0>();
  __syncthreads();
  uint32_t qf[KS][4], dof[KS][4];
  {
    const FragAddr<D> q_frag = frag_a<D>(sQ, lane), do_frag = frag_a<D>(sdO, lane);
#pragma unroll
    for (int ks = 0; ks < KS; ks++) {
      ldmatrix_x4(qf[ks], q_frag(warp_row, ks));
      ldmatrix_x4(dof[ks], do_frag(warp_row, ks));
    }
  }
  float dq[DT][4];  // [16 queries, D] per warp
#pragma unroll
  for (int dt = 0; dt < DT; dt++) dq[dt][0] = dq[dt][1] = dq[dt][2] = dq[dt][3] = 0.f;

  for (int t = tiles.begin; t < tiles.end; t++) {
    const int buf = (t - tiles.begin) & 1, k0 = t * Bc;
    if (t > tiles.begin) {
      cp_async_wait<0>();
      __syncthreads();  // tile t has landed, and every warp is done with the other buffer
    }
    if (t + 1 < tiles.end) {
      load_tile_async<Bc, D, kThreads>(sK + (buf ^ 1) * Bc * D, kh, a.ks.l, k0 + Bc, a.Lk);
      load_tile_async<Bc, D, kThreads>(sV + (buf ^ 1) * Bc * D, vh, a.vs.l, k0 + Bc, a.Lk);
    }
    cp_async_commit();
    const uint16_t* k_t = sK + buf * Bc * D;
    const uint16_t* v_t = sV + buf * Bc * D;

    // Dropout's keep bits of this tile (byte nt2: n-tiles 2 nt2, 2 nt2 + 1), drawn before the products.
    [[maybe_unused]] KeepBytes<NT / 2> keep_bits;
    if constexpr (kDropout) draw_keep_rows<shared_draw, NT>(a, bh, q0 + warp_row, k0, lane, keep_bits);

    // S = Q K^T, dP = dO V^T                                                     [16, Bc] per warp
    float s[NT][4], dp[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
      for (int e = 0; e < 4; e++) s[nt][e] = dp[nt][e] = 0.f;
    const FragAddr<D> k_rows = frag_b_rows<D>(k_t, lane), v_rows = frag_b_rows<D>(v_t, lane);
#pragma unroll
    for (int ks = 0; ks < KS; ks++)
#pragma unroll
      for (int nt2 = 0; nt2 < NT / 2; nt2++) {
        uint32_t bk[4], bv[4];
        ldmatrix_x4(bk, k_rows(nt2 * 16, ks));
        mma16816<T>(s[2 * nt2], qf[ks], bk[0], bk[1]);
        mma16816<T>(s[2 * nt2 + 1], qf[ks], bk[2], bk[3]);
        ldmatrix_x4(bv, v_rows(nt2 * 16, ks));
        mma16816<T>(dp[2 * nt2], dof[ks], bv[0], bv[1]);
        mma16816<T>(dp[2 * nt2 + 1], dof[ks], bv[2], bv[3]);
      }

    // dS = P (dP Z - delta), masked where the tile needs it.
    const bool need_mask = tile_needs_mask<Bc>(a, tiles, pad_row, k0, q0);
    dq_scores_to_ds<kDropout>(a, s, dp, keep_bits, lse2, delta, need_mask, pad_row, q0 + warp_row, k0, lane);

    // dQ += dS K                                                                   [16, D] per warp
    add_times_k<T, NT / 2>(dq, frag_b_trans<D>(k_t, lane),
                           [&](int kk, uint32_t(&da)[4]) { acc_to_a<T>(dp[2 * kk], dp[2 * kk + 1], da); });
  }
  cp_async_wait<0>();
  store_dq<T>(a, b, h, q0 + warp_row, lane, dq);
#endif
}

// ---------------------------------------------------------------------------------------------------
// dQ from the dS the dK dV pass wrote

template <int D_, int kWarps_>
struct DqDsConfig {
  static constexpr int D = D_;
  static constexpr int Br = 16 * kWarps_;  // queries per block: the dK dV pass's query tile
  static constexpr int Bc = 64;            // keys per step: dS tiles of 64 x 64
  static constexpr int kThreads = 32 * kWarps_;
  static constexpr int kSmemBytes = 2 * (Br * Bc + Bc * D) * 2;
};

template <typename Cfg, typename T>
__global__ void __launch_bounds__(Cfg::kThreads) dq_from_ds_kernel(const FlashArgs a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  constexpr int D = Cfg::D, Br = Cfg::Br, Bc = Cfg::Bc, kThreads = Cfg::kThreads;
  constexpr int DT = D / 8;
  extern __shared__ __align__(128) uint16_t smem[];
  uint16_t* sS = smem;              // [2][Br, Bc]
  uint16_t* sK = sS + 2 * Br * Bc;  // [2][Bc, D]

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int m_block = int(gridDim.x) - 1 - int(blockIdx.x);  // longest causal tiles first
  const int h = blockIdx.y, b = blockIdx.z, bh = b * a.H + h;
  const int q0 = m_block * Br, warp_row = warp * 16;
  const uint16_t* kh = head_rows(a.k, a.ks, b, h);
  const uint16_t* dsh = static_cast<const uint16_t*>(a.ds) + int64_t(bh) * a.ds_rows * a.ds_ld;

  // The key tiles the dK dV pass reached for these queries (causal, padding: the rest of dS is zero and unwritten).
  const KeyTiles tiles = key_tiles<Bc>(a, pad_row_of(a, b), q0 + Br);
  auto load = [&](int t, int buf) {  // dS rows past ds_rows and K rows past Lk: zeros
    load_tile_async<Br, Bc, kThreads>(sS + buf * Br * Bc, dsh + t * Bc, a.ds_ld, q0, int(a.ds_rows));
    load_tile_async<Bc, D, kThreads>(sK + buf * Bc * D, kh, a.ks.l, t * Bc, a.Lk);
  };
  if (tiles.begin < tiles.end) load(tiles.begin, 0);
  cp_async_commit();

  float dq[DT][4];  // [16 queries, D] per warp
#pragma unroll
  for (int dt = 0; dt < DT; dt++) dq[dt][0] = dq[dt][1] = dq[dt][2] = dq[dt][3] = 0.f;
  for (int t = tiles.begin; t < tiles.end; t++) {
    const int buf = (t - tiles.begin) & 1;
    cp_async_wait<0>();
    __syncthreads();  // tile t has landed, and every warp is done with the other buffer
    if (t + 1 < tiles.end) load(t + 1, buf ^ 1);
    cp_async_commit();
    const FragAddr<Bc> s_frag = frag_a<Bc>(sS + buf * Br * Bc, lane);
    add_times_k<T, Bc / 16>(dq, frag_b_trans<D>(sK + buf * Bc * D, lane),
                            [&](int kk, uint32_t(&da)[4]) { ldmatrix_x4(da, s_frag(warp_row, kk)); });
  }
  cp_async_wait<0>();
  store_dq<T>(a, b, h, q0 + warp_row, lane, dq);
#endif
}

// ---------------------------------------------------------------------------------------------------
// Launchers

using engine::cuda::set_smem_limit;

// The dK dV pass writing dS, then dQ from it (a.ds given, the default configurations: 64-key, 64-query tiles).
template <typename DkdvCfg, typename T, Drop kDrop>
void launch_with_ds(const FlashArgs& a) {
  static_assert(DkdvCfg::Bc == 64 && DkdvCfg::Br == 64, "dS is written in the 64 x 64 tiles dq_from_ds reads");
  using DqDs = DqDsConfig<DkdvCfg::D, 4>;
  auto dkdv = dkdv_kernel<DkdvCfg, T, kDrop, true>;
  auto dq = dq_from_ds_kernel<DqDs, T>;
  static const bool configured =
      (set_smem_limit(dkdv, DkdvCfg::kSmemBytes), set_smem_limit(dq, DqDs::kSmemBytes), true);
  (void)configured;
  const dim3 grid_kv(unsigned((a.Lk + DkdvCfg::Bc - 1) / DkdvCfg::Bc), unsigned(a.H), unsigned(a.B));
  dkdv<<<grid_kv, DkdvCfg::kThreads, DkdvCfg::kSmemBytes, engine::cuda::stream()>>>(a);
  ENGINE_CUDA_LAUNCH_CHECK("flash_attention_backward (tensor-core dK dV, dS kept)");
  const dim3 grid_q(unsigned((a.Lq + DqDs::Br - 1) / DqDs::Br), unsigned(a.H), unsigned(a.B));
  dq<<<grid_q, DqDs::kThreads, DqDs::kSmemBytes, engine::cuda::stream()>>>(a);
  ENGINE_CUDA_LAUNCH_CHECK("flash_attention_backward (tensor-core dQ from dS)");
}

template <typename DkdvCfg, typename DqCfg, typename T, Drop kDrop>
void launch(const FlashArgs& a) {
  auto dkdv = dkdv_kernel<DkdvCfg, T, kDrop>;
  auto dq = dq_kernel<DqCfg, T, kDrop>;
  static const bool configured =
      (set_smem_limit(dkdv, DkdvCfg::kSmemBytes), set_smem_limit(dq, DqCfg::kSmemBytes), true);
  (void)configured;
  if (a.Lk > 0) {
    const dim3 grid(unsigned((a.Lk + DkdvCfg::Bc - 1) / DkdvCfg::Bc), unsigned(a.H), unsigned(a.B));
    dkdv<<<grid, DkdvCfg::kThreads, DkdvCfg::kSmemBytes, engine::cuda::stream()>>>(a);
    ENGINE_CUDA_LAUNCH_CHECK("flash_attention_backward (tensor-core dK dV)");
  }
  if (a.Lq > 0) {
    const dim3 grid(unsigned((a.Lq + DqCfg::Br - 1) / DqCfg::Br), unsigned(a.H), unsigned(a.B));
    dq<<<grid, DqCfg::kThreads, DqCfg::kSmemBytes, engine::cuda::stream()>>>(a);
    ENGINE_CUDA_LAUNCH_CHECK("flash_attention_backward (tensor-core dQ)");
  }
}

// Every dtype and dropout for the default configurations (kFull), with dS kept when the op gave a buffer; the
// benchmark's alternatives are built for bf16 without dropout only, and recompute dQ.
template <typename DkdvCfg, typename DqCfg, bool kFull>
void run(const FlashArgs& a, bool bf16) {
  if constexpr (kFull) {
    with_drop_mode(a, [&](auto drop) {
      constexpr Drop kDrop = decltype(drop)::value;
      if (a.ds && a.Lq > 0 && a.Lk > 0) {
        if (bf16)
          launch_with_ds<DkdvCfg, __nv_bfloat16, kDrop>(a);
        else
          launch_with_ds<DkdvCfg, __half, kDrop>(a);
      } else if (bf16) {
        launch<DkdvCfg, DqCfg, __nv_bfloat16, kDrop>(a);
      } else {
        launch<DkdvCfg, DqCfg, __half, kDrop>(a);
      }
    });
  } else {
    launch<DkdvCfg, DqCfg, __nv_bfloat16, Drop::none>(a);
  }
}

// Configurations per head dim, measured on an H200 (bf16, 32x12x512x64 and 8x16x4096x128).
using Dkdv64_0 = DkdvConfig<64, 4, 64, true>;     // Bc 64 keys, Br 64 queries per step: default
using Dq64_0 = DqConfig<64, 4, 64>;               // Br 64 queries, Bc 64 keys per step: default
using Dkdv64_1 = DkdvConfig<64, 8, 64, true>;     // Bc 128, Br 64
using Dq64_1 = DqConfig<64, 8, 64>;               // Br 128, Bc 64
using Dkdv64_2 = DkdvConfig<64, 4, 64, true, 3>;  // variant 0 with registers capped for 3 blocks per SM
using Dq64_2 = DqConfig<64, 4, 64, 3>;
using Dkdv128_0 = DkdvConfig<128, 8, 32, false>;  // Bc 128, Br 32, K V fragments from shared memory
using Dq128_0 = DqConfig<128, 4, 32>;             // Br 64, Bc 32
using Dkdv128_1 = DkdvConfig<128, 4, 64, false>;  // Bc 64, Br 64: default
using Dq128_1 = DqConfig<128, 8, 32>;             // Br 128, Bc 32: default

}  // namespace

void launch_backward_delta(const FlashArgs& a, int dtype) {
  const int64_t rows = int64_t(a.B) * a.H * a.Lq;
  if (rows == 0) return;
  ENGINE_CUDA_FLOAT_SWITCH(engine::DType(dtype), T, {
    const int lanes = a.Dv / vec16<T>();  // threads per row when rows are 16-byte vectors
    if (rows_of_vectors<T>(a.o, a.os, a) && rows_of_vectors<T>(a.dout, a.dos, a) && lanes <= 32 &&
        (lanes & (lanes - 1)) == 0) {
      switch (lanes) {
        case 1: launch_delta_vec<T, 1>(a, rows); return;
        case 2: launch_delta_vec<T, 2>(a, rows); return;
        case 4: launch_delta_vec<T, 4>(a, rows); return;
        case 8: launch_delta_vec<T, 8>(a, rows); return;
        case 16: launch_delta_vec<T, 16>(a, rows); return;
        default: launch_delta_vec<T, 32>(a, rows); return;
      }
    }
    delta_kernel<T><<<grid_for(rows * 32, 256), 256, 0, engine::cuda::stream()>>>(a);
    ENGINE_CUDA_LAUNCH_CHECK("flash_attention_backward (delta)");
  });
}

// The mma.sync configurations of each head dim; on Hopper two more follow them, the wgmma kernels
// (attention_bwd_wgmma.cu) with one and two warpgroups per block, every dtype and dropout mode.
namespace {
int mma_sync_variants(int head_dim) { return head_dim == 64 ? 3 : head_dim == 128 ? 2 : 0; }
}  // namespace

int backward_tensor_core_variants(int head_dim) {
  const int n = mma_sync_variants(head_dim);
  return n > 0 && forward_wgmma_available() ? n + 2 : n;
}

const char* backward_tensor_core_name(int head_dim, int variant) {
  static const char* d64[] = {"dKdV Bc64 Br64 4w, dQ Br64 Bc64 4w", "dKdV Bc128 Br64 8w, dQ Br128 Bc64 8w",
                              "as 0, 3 blocks/SM"};
  static const char* d128[] = {"dKdV Bc128 Br32 8w, dQ Br64 Bc32 4w", "dKdV Bc64 Br64 4w, dQ Br128 Bc32 8w"};
  static const char* wgmma[] = {"wgmma dKdV Bc64 Br64 1 warpgroup, dQ Br64 Bc64",
                                "wgmma dKdV Bc128 Br64 2 warpgroups, dQ Br128 Bc64"};
  const int n = mma_sync_variants(head_dim);
  if (variant >= n && variant < backward_tensor_core_variants(head_dim)) return wgmma[variant - n];
  if (variant < 0 || variant >= n) variant = 0;
  return head_dim == 64 ? d64[variant] : d128[variant];
}

bool launch_backward_tensor_core(const FlashArgs& a, bool bf16, int variant) {
  if (a.D != a.Dv || (a.D != 64 && a.D != 128)) return false;
  const int n = mma_sync_variants(a.D);
  // The default on Hopper: the wgmma kernels, a warpgroup per block at head dim 64 and two at 128 (H200, bf16,
  // 2026-12-05: 195 against the best mma.sync's 175 TFLOP/s at 32x12x512x64, 341 against 220 at 8x16x4096x128).
  if ((variant < 0 || variant >= backward_tensor_core_variants(a.D)) && forward_wgmma_available())
    variant = n + (a.D == 64 ? 0 : 1);
  if (variant >= n && variant < backward_tensor_core_variants(a.D) && launch_backward_wgmma(a, bf16, variant - n))
    return true;
  const int default_variant = a.D == 64 ? 0 : 1;
  if (variant < 0 || variant >= n || !bf16 || a.dropout) variant = default_variant;
  if (a.D == 64) {
    if (variant == 1) run<Dkdv64_1, Dq64_1, false>(a, bf16);
    else if (variant == 2) run<Dkdv64_2, Dq64_2, false>(a, bf16);
    else run<Dkdv64_0, Dq64_0, true>(a, bf16);
  } else {
    if (variant == 0) run<Dkdv128_0, Dq128_0, false>(a, bf16);
    else run<Dkdv128_1, Dq128_1, true>(a, bf16);
  }
  return true;
}

}  // namespace ops::cuda::attn
