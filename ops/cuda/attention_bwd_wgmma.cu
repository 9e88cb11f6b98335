// cuda/attention_bwd_wgmma.cu: the flash attention backward's matrix products on Hopper's wgmma (sm_90a; bf16/f16,
// head dim 64 or 128): attention_bwd.cu's three deterministic passes (delta, dK dV, dQ) with the same per-warp steps
// (attention_common.cuh: masks, dropout, dS, the stores), the products issued by warpgroups from shared memory.
//
//   dK, dV   a block of kWG warpgroups, each owning 64 keys, walks the query tiles of Br = 64 rows that can see them:
//                S^T = K Q^T, dP^T = V dO^T    wgmma m64n64k16, K / V (A) and Q / dO (B) K-major from shared memory
//                dS^T, (P Z)^T                 in registers (dkdv_scores_to_ds)
//                dV += (P Z)^T dO              wgmma m64nDk16, A from registers (the accumulators packed to 16 bits),
//                dK += dS^T Q                  dO / Q MN-major from shared memory (their rows are the k dimension)
//                                              dS written out when kept, while these two run
//            Dropout's decisions Z: the forward's keep bits when it kept them (Drop::bits: a tile's [Br, Bk / 8] bytes
//            copied into shared memory with its Q and dO), else drawn again as the forward drew them.
//   dQ       from the kept dS: a block of kWG warpgroups of 64 queries walks the 64-key tiles, dQ += dS K (dS K-major,
//            K MN-major, both from shared memory); without it (long keys) the same block recomputes S = Q K^T and
//            dP = dO V^T per key tile (Q, dO, K, V from shared memory), dS in registers, dQ += dS K with dS from
//            registers.
//   dQ sums  instead of that dQ pass where the op gave dQ's f32 sums (head dim 128, two warpgroups: ops/attention.h,
//            ENGINE_FLASH_DQ_SUMS=1), the dK dV block also computes its dQ product per query tile, dS K (dS^T through
//            shared memory), and adds it to the sums by a bulk reduction in the order of the key blocks
//            (DsUse::add_dq, below); a last kernel scales the sums into dQ. Five products per tile pair instead of
//            seven, but slower so far (8x16x4096x128 on an H100: 10.9 ms against the dQ pass's 7.6; ncu: a third of
//            the stalls at the block barriers behind thread 0's turn waits; BENCHMARKS.md), hence off by default.
// Tiles are attention_common.cuh's panels (the 128-byte swizzle wgmma's descriptors describe), loaded by cp.async,
// the next query (or key) tile's while this one is computed; one block barrier per tile. No float atomics in any
// order: the same inputs give the same bits every run, as attention_bwd.cu's kernels (whose values these equal up to
// the order of the f32 sums inside a product).
// Measured (BENCHMARKS.md): bf16 32x12x512x64 backward 0.357 ms (180 TFLOP/s, H100) with dS kept, 0.307 with dQ
// recomputing it (ENGINE_FLASH_KEEP_DS=0); with BERT's dropout 0.410 ms drawing it again and 0.360 reading the
// forward's keep bits (H200, 2026-12-05).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>

#include "engine/cuda/runtime.h"
#include "ops/cuda/attention_wgmma.cuh"

namespace ops::cuda::attn {

namespace {

constexpr float kLog2e = 1.4426950408889634f;

// Accumulator fragments packed as the A operand of the next product (attention_common.cuh's acc_to_a).
template <typename T, int NT>
__device__ __forceinline__ void pack_a(const float (&x)[NT][4], uint32_t (&a)[NT / 2][4]) {
#pragma unroll
  for (int kk = 0; kk < NT / 2; kk++) acc_to_a<T>(x[2 * kk], x[2 * kk + 1], a[kk]);
}

template <int N>
__device__ __forceinline__ void zero(float (&x)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; i++) x[i][0] = x[i][1] = x[i][2] = x[i][3] = 0.f;
}

// ---------------------------------------------------------------------------------------------------
// dK, dV

// What the dK dV pass does with dS besides dK: nothing (a dQ pass recomputes it), writes it out (kept dS: the dQ pass
// reads it), or multiplies it by K itself and adds the product to dQ's f32 sums in key-block order (below).
enum class DsUse { none, write, add_dq };

template <int D_, int kWG_, int kMinBlocks_>
struct WgDkdvConfig {
  static constexpr int D = D_, Br = 64, Bk = 64 * kWG_, kThreads = 128 * kWG_, kMinBlocks = kMinBlocks_;
  static constexpr int kKVElems = Bk * D, kQElems = Br * D, kKeepBytes = Br * Bk / 8;
  static constexpr int kBaseBytes = (2 * kKVElems + 4 * kQElems) * 2 + 4 * Br * 4 + 2 * kKeepBytes;
  static constexpr int kSmemBytes = kBaseBytes + 1024;
  // DsUse::add_dq (two warpgroups at head dim 128, each computing dQ's half of the columns): the block's dS^T [Bk, Br]
  // (one panel, 1024-byte aligned) and two [Br, D] f32 buffers of dQ products on their way to the sums.
  static constexpr bool kAddsDq = kWG_ == 2 && D == 128;
  static constexpr int kDsOffset = (kBaseBytes + 1023) / 1024 * 1024, kDqOffset = kDsOffset + Bk * Br * 2;
  static constexpr int kAddDqSmemBytes = kDqOffset + 2 * Br * D * 4 + 1024;
  static_assert(!kAddsDq || kAddDqSmemBytes <= 227 * 1024, "an SM has 227 KB of shared memory for a block");
};

// DsUse::add_dq: dQ = scale * sum over key blocks of dS K. Each block (Bk keys) computes its [Br, D] product for
// every query tile it visits and adds it to dq_sums by one bulk reduction, in the order of the key blocks: tile m's
// turn counter says how many blocks have added theirs (its contributors are the blocks from the row's first unpadded
// key's on, every one of them visits m: query_tiles), and block n waits until it reads n - n_first. The sums are
// therefore the same bits every run. A block waits only on blocks of lower index in the grid (launched before it),
// so the waits cannot deadlock, and it visits its tiles from the last down, so that causal blocks all start on the
// last tile (which every block sees) rather than block n waiting for n - 1 to reach its first. The turn is passed
// on one tile late (after the next tile's products are issued), when the reduction has completed.

// DsUse::add_dq, query tile m: this block's dQ product [Br, D] = dS K (dS^T in sDs: the MN-major A operand; K's
// panels in sK: MN-major B), warpgroup w computing columns 64 w .. 64 w + 63, into the f32 buffer sdq (rows of D);
// then thread 0 waits for the tile's turn and adds the buffer to the sums by one bulk reduction, whose turn it passes
// on later (pending_turn: the kernel's pass_turn).
template <typename Cfg, typename T>
__device__ __forceinline__ void add_dq_tile(const FlashArgs& a, int bh, int m, const uint16_t* sDs, const uint16_t* sK,
                                            float* sdq, uint32_t rank, uint32_t*& pending_turn) {
  constexpr int Br = Cfg::Br, Bk = Cfg::Bk, D = Cfg::D, kCols = D / 2;  // a warpgroup's columns: one panel of K
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, wg = warp / 4, g = lane / 4, tq = lane % 4;
  wgmma::fence_proxy_async();  // dS^T as every thread wrote it, for the tensor cores
  __syncthreads();             // both warpgroups' rows
  float dq[kCols / 8][4];
  zero(dq);
  wgmma::fence_operands(flat(dq));
  wgmma::fence();
  const uint32_t ds_base = smem_addr(sDs), k_base = smem_addr(sK) + uint32_t(wg * Bk * kPanelRowBytes);
#pragma unroll
  for (int kk = 0; kk < Bk / 16; kk++)
    wgmma::mma_m64k16<T, 1, 1>(flat(dq),
                               wgmma::desc_mn128(ds_base + uint32_t(kk * 2048), uint32_t(Bk * kPanelRowBytes)),
                               wgmma::desc_mn128(k_base + uint32_t(kk * 2048), uint32_t(Bk * kPanelRowBytes)),
                               std::integral_constant<int, kCols>{});
  wgmma::commit();
  wgmma::wait<0>();
  wgmma::fence_operands(flat(dq));
  const int row = (warp % 4) * 16 + g;
#pragma unroll
  for (int nt = 0; nt < kCols / 8; nt++)
#pragma unroll
    for (int half = 0; half < 2; half++)
      *reinterpret_cast<float2*>(sdq + (row + 8 * half) * D + wg * kCols + nt * 8 + 2 * tq) =
          make_float2(dq[nt][2 * half], dq[nt][2 * half + 1]);
  wgmma::fence_proxy_async();  // for the bulk reduction
  __syncthreads();
  if (tid == 0) {
    uint32_t* turn = a.dq_turns + int64_t(bh) * ((a.Lq + Br - 1) / Br) + m;
    // (The blocks before this one add theirs within microseconds of each other; a wait of about a minute is a
    // broken invariant, which traps rather than hangs.)
    for (int64_t spins = 0; wgmma::load_acquire(turn) != rank; spins++)
      if (spins > (int64_t(1) << 27)) __trap();
    wgmma::fence_proxy_async_global();
    const int rows = min(Br, a.Lq - m * Br);
    wgmma::bulk_reduce_add_f32(a.dq_sums + (int64_t(bh) * a.Lq + int64_t(m) * Br) * D, smem_addr(sdq),
                               uint32_t(rows * D * 4));
    wgmma::bulk_commit();
    pending_turn = turn;
  }
}

template <typename Cfg, typename T, Drop kDrop, DsUse kDs>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kMinBlocks) dkdv_wgmma_kernel(const FlashArgs a) {
#if defined(ENGINE_WGMMA_DEVICE)
  constexpr bool kDropout = kDrop != Drop::none, shared_draw = kDrop == Drop::shared;
  constexpr int kKeepLd = Cfg::Bk / 8;  // bytes of a tile's row of keep bits
  constexpr int D = Cfg::D, Br = Cfg::Br, Bk = Cfg::Bk, kThreads = Cfg::kThreads;
  constexpr int NT = Br / 8, DT = D / 8, KS = D / 16;
  extern __shared__ __align__(128) uint16_t smem_raw[];
  uint16_t* sK = aligned_smem(smem_raw);                           // [Bk, D] panels
  uint16_t* sV = sK + Cfg::kKVElems;                               // [Bk, D] panels
  uint16_t* sQ = sV + Cfg::kKVElems;                               // [2][Br, D] panels
  uint16_t* sdO = sQ + 2 * Cfg::kQElems;                           // [2][Br, D] panels
  float* sLse = reinterpret_cast<float*>(sdO + 2 * Cfg::kQElems);  // [2][Br]
  float* sDelta = sLse + 2 * Br;                                   // [2][Br]
  uint8_t* sKeep = reinterpret_cast<uint8_t*>(sDelta + 2 * Br);    // [2][Br, Bk / 8] keep bits (Drop::bits)
  uint16_t* sDs = sK + Cfg::kDsOffset / 2;                         // add_dq: [Bk, Br] dS^T, one panel
  float* sDq = reinterpret_cast<float*>(sK + Cfg::kDqOffset / 2);  // add_dq: [2][Br, D] f32, rows unswizzled

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, wg = warp / 4;
  const int h = blockIdx.y, b = blockIdx.z, bh = b * a.H + h;
  const int k0 = int(blockIdx.x) * Bk;
  const int warp_key = wg * 64 + (warp % 4) * 16;  // this warp's first key in the block
  const uint16_t* qh = head_rows(a.q, a.qs, b, h);
  const uint16_t* kh = head_rows(a.k, a.ks, b, h);
  const uint16_t* vh = head_rows(a.v, a.vs, b, h);
  const uint16_t* doh = head_rows(a.dout, a.dos, b, h);
  const float* lse_h = static_cast<const float*>(a.lse) + int64_t(bh) * a.Lq;
  const float* delta_h = static_cast<const float*>(a.delta) + int64_t(bh) * a.Lq;
  const uint8_t* pad_row = pad_row_of(a, b);

  load_panels_async<Bk, D, kThreads>(sK, kh, a.ks.l, k0, a.Lk);
  load_panels_async<Bk, D, kThreads>(sV, vh, a.vs.l, k0, a.Lk);
  cp_async_commit();

  // The query tiles that can see the block's keys (attention_bwd.cu's dK dV pass: causal limit, padded blocks none).
  const QueryTiles queries = query_tiles<Br>(a, pad_row, k0, Bk);
  const int m_first = queries.first, m_end = queries.end;
  // Rows past Lq load as zeros (Q, dO, lse, delta): P = 1 there but dV, dK gain 1 * 0 and 0 * 0.
  auto load_query_tile = [&](int m, int buf) {
    load_panels_async<Br, D, kThreads>(sQ + buf * Cfg::kQElems, qh, a.qs.l, m * Br, a.Lq);
    load_panels_async<Br, D, kThreads>(sdO + buf * Cfg::kQElems, doh, a.dos.l, m * Br, a.Lq);
    for (int r = tid; r < Br; r += kThreads) {
      const int i = m * Br + r;
      const bool valid = i < a.Lq;
      cp_async4(smem_addr(sLse + buf * Br + r), lse_h + (valid ? i : 0), valid);
      cp_async4(smem_addr(sDelta + buf * Br + r), delta_h + (valid ? i : 0), valid);
    }
    if constexpr (kDrop == Drop::bits) {  // 8 bytes (64 keys) per copy; rows past Lq, keys past the row: zeros
      const uint8_t* keep_h = a.keep_in + int64_t(bh) * a.Lq * a.keep_ld;
      for (int c = tid; c < Br * kKeepLd / 8; c += kThreads) {
        const int r = c / (kKeepLd / 8), col = k0 / 8 + c % (kKeepLd / 8) * 8, i = m * Br + r;
        const bool valid = i < a.Lq && col < a.keep_ld;
        cp_async8(smem_addr(sKeep + buf * Cfg::kKeepBytes + c * 8),
                  keep_h + (valid ? int64_t(i) * a.keep_ld + col : 0), valid);
      }
    }
  };
  // The tiles from the last down (DsUse::add_dq's order; the same sums for the others, in another order).
  if (m_first < m_end) load_query_tile(m_end - 1, 0);
  cp_async_commit();

  bool key_ok[2];  // this lane's two keys (rows g and g + 8 of the warp's 16) are in range and not padding
#pragma unroll
  for (int half = 0; half < 2; half++) {
    const int j = k0 + warp_key + g + half * 8;
    key_ok[half] = j < a.Lk && !(pad_row && pad_row[j]);
  }

  float dk[DT][4], dv[DT][4];  // this warpgroup's [64 keys, D]
  zero(dk);
  zero(dv);
  const uint32_t k_base = smem_addr(sK) + uint32_t(wg * 64 * kPanelRowBytes);  // this warpgroup's 64 rows of each panel
  const uint32_t v_base = smem_addr(sV) + uint32_t(wg * 64 * kPanelRowBytes);

  // add_dq: this block's place among tile m's contributors, and the turn it passes on after its reduction completed.
  [[maybe_unused]] uint32_t rank = 0, *pending_turn = nullptr;
  if constexpr (kDs == DsUse::add_dq) rank = uint32_t(int(blockIdx.x) - unpadded_keys(pad_row, a.Lk).first / Bk);
  [[maybe_unused]] auto pass_turn = [&] {
    if (tid == 0 && pending_turn) {
      wgmma::bulk_wait_all();
      wgmma::fence_proxy_async_global();
      wgmma::store_release(pending_turn, rank + 1);
      pending_turn = nullptr;
    }
  };

  for (int step = 0; step < m_end - m_first; step++) {
    const int m = m_end - 1 - step, buf = step & 1, i0 = m * Br;
    cp_async_wait<0>();
    wgmma::fence_proxy_async();
    __syncthreads();  // tile m (and K, V) landed for every thread and the tensor cores; the other buffer is free
    if (m > m_first) load_query_tile(m - 1, buf ^ 1);
    cp_async_commit();
    const uint32_t q_base = smem_addr(sQ + buf * Cfg::kQElems), do_base = smem_addr(sdO + buf * Cfg::kQElems);

    [[maybe_unused]] KeepBytes<NT / 2> keep_bits;
    if constexpr (kDrop == Drop::bits) {  // the lane's byte of each 16 queries, gathered as draw_keep_cols does
      const uint8_t* tile_keep = sKeep + buf * Cfg::kKeepBytes + (warp_key + keep_cols_key(lane)) / 8;
#pragma unroll
      for (int nt2 = 0; nt2 < NT / 2; nt2++)
        keep_bits.set(nt2, keep_cols_from_byte(tile_keep[(nt2 * 16 + keep_cols_query(lane)) * kKeepLd], lane));
    } else if constexpr (kDropout) {
      draw_keep_cols<shared_draw, NT>(a, bh, i0, k0 + warp_key, lane, keep_bits);
    }

    // S^T = K Q^T and dP^T = V dO^T                                     [64 keys, Br] per warpgroup
    float s[NT][4], dp[NT][4];
    two_products<T, Br, KS>(s, dp, k_base, v_base, Bk, q_base, do_base, Br, [&] {
      if constexpr (kDs == DsUse::add_dq) pass_turn();  // (the previous tile's reduction, beside these products)
    });

    dkdv_scores_to_ds<kDropout>(a, s, dp, keep_bits, sLse + buf * Br, sDelta + buf * Br, key_ok, i0, k0 + warp_key,
                                lane);

    // dV += (P Z)^T dO, dK += dS^T Q                                     [64 keys, D] per warpgroup
    uint32_t pa[NT / 2][4], da[NT / 2][4];
    pack_a<T>(s, pa);
    pack_a<T>(dp, da);
    wgmma::fence_operands(flat(dv));
    wgmma::fence_operands(flat(dk));
    wgmma::fence();
    issue_rs<T, D>(flat(dv), pa, do_base, Br);
    issue_rs<T, D>(flat(dk), da, q_base, Br);
    wgmma::commit();
    // While the products run: dS out, or this warpgroup's rows of dS^T into sDs.
    if constexpr (kDs == DsUse::write) store_ds_transposed<T>(a, bh, i0, k0 + warp_key, lane, dp);
    if constexpr (kDs == DsUse::add_dq) {
#pragma unroll
      for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int half = 0; half < 2; half++)
          *reinterpret_cast<uint32_t*>(sDs + panel_chunk<Bk>(warp_key + g + 8 * half, nt) + 2 * (lane % 4)) =
              pack2<T>(dp[nt][2 * half], dp[nt][2 * half + 1]);
    }
    wgmma::wait<0>();  // before the next tile's barrier lets this buffer be refilled
    wgmma::fence_operands(flat(dv));
    wgmma::fence_operands(flat(dk));
    fence_fragments(pa);
    fence_fragments(da);
    if constexpr (kDs == DsUse::add_dq) add_dq_tile<Cfg, T>(a, bh, m, sDs, sK, sDq + buf * Br * D, rank, pending_turn);
  }
  cp_async_wait<0>();
  if constexpr (kDs == DsUse::add_dq) pass_turn();
  store_dkdv<T>(a, b, h, k0 + warp_key, lane, dk, dv);
#endif
}

// ---------------------------------------------------------------------------------------------------
// dQ from the kept dS

template <int D_, int kWG_>
struct WgDqDsConfig {
  static constexpr int D = D_, Br = 64 * kWG_, Bc = 64, kThreads = 128 * kWG_;
  static constexpr int kSElems = Br * Bc, kKElems = Bc * D;
  static constexpr int kSmemBytes = 2 * (kSElems + kKElems) * 2 + 1024;
};

template <typename Cfg, typename T>
__global__ void __launch_bounds__(Cfg::kThreads) dq_from_ds_wgmma_kernel(const FlashArgs a) {
#if defined(ENGINE_WGMMA_DEVICE)
  constexpr int D = Cfg::D, Br = Cfg::Br, Bc = Cfg::Bc, kThreads = Cfg::kThreads, DT = D / 8;
  extern __shared__ __align__(128) uint16_t smem_raw[];
  uint16_t* sS = aligned_smem(smem_raw);  // [2][Br, Bc] panels (one panel: Bc = 64)
  uint16_t* sK = sS + 2 * Cfg::kSElems;   // [2][Bc, D] panels

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, wg = warp / 4;
  const int m_block = int(gridDim.x) - 1 - int(blockIdx.x);  // longest causal tiles first
  const int h = blockIdx.y, b = blockIdx.z, bh = b * a.H + h;
  const int q0 = m_block * Br, warp_row = wg * 64 + (warp % 4) * 16;
  const uint16_t* kh = head_rows(a.k, a.ks, b, h);
  const uint16_t* dsh = static_cast<const uint16_t*>(a.ds) + int64_t(bh) * a.ds_rows * a.ds_ld;

  // The key tiles the dK dV pass reached for these queries (the rest of dS is zero and unwritten).
  const KeyTiles tiles = key_tiles<Bc>(a, pad_row_of(a, b), q0 + Br);
  auto load = [&](int t, int buf) {  // dS rows past ds_rows and K rows past Lk: zeros
    load_panels_async<Br, Bc, kThreads>(sS + buf * Cfg::kSElems, dsh + t * Bc, a.ds_ld, q0, int(a.ds_rows));
    load_panels_async<Bc, D, kThreads>(sK + buf * Cfg::kKElems, kh, a.ks.l, t * Bc, a.Lk);
  };
  if (tiles.begin < tiles.end) load(tiles.begin, 0);
  cp_async_commit();
  // Causal: the dK dV pass wrote a key tile's dS only for the 64-row query tiles that see one of its keys, so a
  // warpgroup stops at its own rows' limit (the block's is its last warpgroup's).
  const int wg_end =
      a.causal ? min(tiles.end, (max(0, min(a.Lk, q0 + wg * 64 + 64 + a.Lk - a.Lq)) + Bc - 1) / Bc) : tiles.end;

  float dq[DT][4];  // this warpgroup's [64 queries, D]
  zero(dq);
  for (int t = tiles.begin; t < tiles.end; t++) {
    const int buf = (t - tiles.begin) & 1;
    cp_async_wait<0>();
    wgmma::fence_proxy_async();
    __syncthreads();  // tile t landed; every warpgroup is done with the other buffer
    if (t + 1 < tiles.end) load(t + 1, buf ^ 1);
    cp_async_commit();
    if (t >= wg_end) continue;  // (the same for the whole warpgroup)
    const uint32_t s_base = smem_addr(sS + buf * Cfg::kSElems) + uint32_t(wg * 64 * kPanelRowBytes);
    const uint32_t k_base = smem_addr(sK + buf * Cfg::kKElems);
    wgmma::fence_operands(flat(dq));
    wgmma::fence();
#pragma unroll
    for (int kk = 0; kk < Bc / 16; kk++)
      wgmma::mma_m64k16<T, 0, 1>(flat(dq), wgmma::desc_k128(s_base + uint32_t(kk * 32)),
                                 wgmma::desc_mn128(k_base + uint32_t(kk * 2048), uint32_t(Bc * kPanelRowBytes)),
                                 std::integral_constant<int, D>{});
    wgmma::commit();
    wgmma::wait<0>();
    wgmma::fence_operands(flat(dq));
  }
  cp_async_wait<0>();
  store_dq<T>(a, b, h, q0 + warp_row, lane, dq);
#endif
}

// ---------------------------------------------------------------------------------------------------
// dQ recomputing S and dP (long keys: no dS kept)

template <int D_, int kWG_>
struct WgDqConfig {
  static constexpr int D = D_, Br = 64 * kWG_, Bc = 64, kThreads = 128 * kWG_;
  static constexpr int kQElems = Br * D, kKElems = Bc * D, kKeepBytes = Br * Bc / 8;
  static constexpr int kSmemBytes = (2 * kQElems + 4 * kKElems) * 2 + 2 * kKeepBytes + 1024;
};

template <typename Cfg, typename T, Drop kDrop>
__global__ void __launch_bounds__(Cfg::kThreads) dq_wgmma_kernel(const FlashArgs a) {
#if defined(ENGINE_WGMMA_DEVICE)
  constexpr bool kDropout = kDrop != Drop::none, shared_draw = kDrop == Drop::shared;
  constexpr int D = Cfg::D, Br = Cfg::Br, Bc = Cfg::Bc, kThreads = Cfg::kThreads;
  constexpr int NT = Bc / 8, DT = D / 8, KS = D / 16;
  extern __shared__ __align__(128) uint16_t smem_raw[];
  uint16_t* sQ = aligned_smem(smem_raw);  // [Br, D] panels
  uint16_t* sdO = sQ + Cfg::kQElems;      // [Br, D] panels
  uint16_t* sK = sdO + Cfg::kQElems;      // [2][Bc, D] panels
  uint16_t* sV = sK + 2 * Cfg::kKElems;   // [2][Bc, D] panels
  uint8_t* sKeep = reinterpret_cast<uint8_t*>(sV + 2 * Cfg::kKElems);  // [2][Br, Bc / 8] keep bits (Drop::bits)

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, wg = warp / 4;
  const int m_block = int(gridDim.x) - 1 - int(blockIdx.x);  // longest causal tiles first
  const int h = blockIdx.y, b = blockIdx.z, bh = b * a.H + h;
  const int q0 = m_block * Br, warp_row = wg * 64 + (warp % 4) * 16;
  const uint16_t* qh = head_rows(a.q, a.qs, b, h);
  const uint16_t* kh = head_rows(a.k, a.ks, b, h);
  const uint16_t* vh = head_rows(a.v, a.vs, b, h);
  const uint16_t* doh = head_rows(a.dout, a.dos, b, h);
  const uint8_t* pad_row = pad_row_of(a, b);

  const KeyTiles tiles = key_tiles<Bc>(a, pad_row, q0 + Br);  // causal and padded tiles skipped
  auto load_kv = [&](int t, int buf) {
    load_panels_async<Bc, D, kThreads>(sK + buf * Cfg::kKElems, kh, a.ks.l, t * Bc, a.Lk);
    load_panels_async<Bc, D, kThreads>(sV + buf * Cfg::kKElems, vh, a.vs.l, t * Bc, a.Lk);
    if constexpr (kDrop == Drop::bits) {  // the tile's 8 bytes (64 keys) of each row; rows past Lq: zeros
      const uint8_t* keep_h = a.keep_in + int64_t(bh) * a.Lq * a.keep_ld;
      for (int r = tid; r < Br; r += kThreads) {
        const bool valid = q0 + r < a.Lq;
        cp_async8(smem_addr(sKeep + buf * Cfg::kKeepBytes + r * 8),
                  keep_h + (valid ? int64_t(q0 + r) * a.keep_ld + t * 8 : 0), valid);
      }
    }
  };
  load_panels_async<Br, D, kThreads>(sQ, qh, a.qs.l, q0, a.Lq);
  load_panels_async<Br, D, kThreads>(sdO, doh, a.dos.l, q0, a.Lq);
  if (tiles.begin < tiles.end) load_kv(tiles.begin, 0);
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
  const uint32_t q_base = smem_addr(sQ) + uint32_t(wg * 64 * kPanelRowBytes);  // this warpgroup's 64 rows
  const uint32_t do_base = smem_addr(sdO) + uint32_t(wg * 64 * kPanelRowBytes);

  float dq[DT][4];  // this warpgroup's [64 queries, D]
  zero(dq);
  for (int t = tiles.begin; t < tiles.end; t++) {
    const int buf = (t - tiles.begin) & 1, k0 = t * Bc;
    cp_async_wait<0>();
    wgmma::fence_proxy_async();
    __syncthreads();  // tile t landed; every warpgroup is done with the other buffer
    if (t + 1 < tiles.end) load_kv(t + 1, buf ^ 1);
    cp_async_commit();
    const uint32_t k_base = smem_addr(sK + buf * Cfg::kKElems), v_base = smem_addr(sV + buf * Cfg::kKElems);

    [[maybe_unused]] KeepBytes<NT / 2> keep_bits;
    if constexpr (kDrop == Drop::bits)
      read_keep_rows<NT>(sKeep + buf * Cfg::kKeepBytes, Bc / 8, warp_row, 0, lane, keep_bits);
    else if constexpr (kDropout)
      draw_keep_rows<shared_draw, NT>(a, bh, q0 + warp_row, k0, lane, keep_bits);

    // S = Q K^T, dP = dO V^T                                             [64 queries, Bc] per warpgroup
    float s[NT][4], dp[NT][4];
    two_products<T, Bc, KS>(s, dp, q_base, do_base, Br, k_base, v_base, Bc, [] {});

    const bool need_mask = tile_needs_mask<Bc>(a, tiles, pad_row, k0, q0);
    dq_scores_to_ds<kDropout>(a, s, dp, keep_bits, lse2, delta, need_mask, pad_row, q0 + warp_row, k0, lane);

    // dQ += dS K                                                         [64 queries, D] per warpgroup
    uint32_t da[NT / 2][4];
    pack_a<T>(dp, da);
    wgmma::fence_operands(flat(dq));
    wgmma::fence();
    issue_rs<T, D>(flat(dq), da, k_base, Bc);
    wgmma::commit();
    wgmma::wait<0>();
    wgmma::fence_operands(flat(dq));
    fence_fragments(da);
  }
  cp_async_wait<0>();
  store_dq<T>(a, b, h, q0 + warp_row, lane, dq);
#endif
}

// ---------------------------------------------------------------------------------------------------
// Launchers

using engine::cuda::set_smem_limit;

// dQ = scale * its f32 sums, in dq's layout (8 columns a thread).
template <typename T>
__global__ void dq_from_sums_kernel(const FlashArgs a) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x, chunks = a.D / 8;
  if (i >= int64_t(a.B) * a.H * a.Lq * chunks) return;
  const int64_t row = i / chunks, bh = row / a.Lq;
  const int c = int(i % chunks), l = int(row % a.Lq), b = int(bh / a.H), h = int(bh % a.H);
  const float4* src = reinterpret_cast<const float4*>(a.dq_sums + row * a.D + c * 8);
  const float4 x = src[0], y = src[1];
  uint4 out;
  out.x = pack2<T>(x.x * a.scale, x.y * a.scale);
  out.y = pack2<T>(x.z * a.scale, x.w * a.scale);
  out.z = pack2<T>(y.x * a.scale, y.y * a.scale);
  out.w = pack2<T>(y.z * a.scale, y.w * a.scale);
  *reinterpret_cast<uint4*>(static_cast<uint16_t*>(a.dq) + b * a.dqs.b + h * a.dqs.h + int64_t(l) * a.dqs.l + c * 8) =
      out;
}

template <typename DkdvCfg, int kDqWG, typename T, Drop kDrop>
void launch(const FlashArgs& a) {
  using DqDs = WgDqDsConfig<DkdvCfg::D, kDqWG>;
  using Dq = WgDqConfig<DkdvCfg::D, kDqWG>;
  const bool keep_ds = a.ds && a.Lq > 0 && a.Lk > 0;
  const bool add_dq = DkdvCfg::kAddsDq && !keep_ds && a.dq_sums && a.Lq > 0 && a.Lk > 0;
  auto dkdv =
      keep_ds ? dkdv_wgmma_kernel<DkdvCfg, T, kDrop, DsUse::write> : dkdv_wgmma_kernel<DkdvCfg, T, kDrop, DsUse::none>;
  if constexpr (DkdvCfg::kAddsDq)
    if (add_dq) dkdv = dkdv_wgmma_kernel<DkdvCfg, T, kDrop, DsUse::add_dq>;
  static const bool configured = [] {
    set_smem_limit(dkdv_wgmma_kernel<DkdvCfg, T, kDrop, DsUse::write>, DkdvCfg::kSmemBytes);
    set_smem_limit(dkdv_wgmma_kernel<DkdvCfg, T, kDrop, DsUse::none>, DkdvCfg::kSmemBytes);
    if constexpr (DkdvCfg::kAddsDq)
      set_smem_limit(dkdv_wgmma_kernel<DkdvCfg, T, kDrop, DsUse::add_dq>, DkdvCfg::kAddDqSmemBytes);
    set_smem_limit(dq_from_ds_wgmma_kernel<DqDs, T>, DqDs::kSmemBytes);
    set_smem_limit(dq_wgmma_kernel<Dq, T, kDrop>, Dq::kSmemBytes);
    return true;
  }();
  (void)configured;
  cudaStream_t stream = engine::cuda::stream();
  if (add_dq) {  // the sums and the turns start at zero
    const int64_t rows = int64_t(a.B) * a.H * a.Lq,
                  tiles = int64_t(a.B) * a.H * ((a.Lq + DkdvCfg::Br - 1) / DkdvCfg::Br);
    ENGINE_CUDA_CHECK(cudaMemsetAsync(a.dq_sums, 0, size_t(rows * a.D) * sizeof(float), stream));
    ENGINE_CUDA_CHECK(cudaMemsetAsync(a.dq_turns, 0, size_t(tiles) * sizeof(uint32_t), stream));
  }
  if (a.Lk > 0) {  // (with Lq = 0: dK, dV zero)
    const dim3 grid_kv(unsigned((a.Lk + DkdvCfg::Bk - 1) / DkdvCfg::Bk), unsigned(a.H), unsigned(a.B));
    dkdv<<<grid_kv, DkdvCfg::kThreads, add_dq ? DkdvCfg::kAddDqSmemBytes : DkdvCfg::kSmemBytes, stream>>>(a);
    ENGINE_CUDA_LAUNCH_CHECK("flash_attention_backward (wgmma dK dV)");
  }
  if (a.Lq == 0) return;
  if (add_dq) {
    const int64_t threads = int64_t(a.B) * a.H * a.Lq * (a.D / 8);
    dq_from_sums_kernel<T><<<unsigned((threads + 255) / 256), 256, 0, stream>>>(a);
    ENGINE_CUDA_LAUNCH_CHECK("flash_attention_backward (dQ from its sums)");
  } else if (keep_ds) {
    const dim3 grid_q(unsigned((a.Lq + DqDs::Br - 1) / DqDs::Br), unsigned(a.H), unsigned(a.B));
    dq_from_ds_wgmma_kernel<DqDs, T><<<grid_q, DqDs::kThreads, DqDs::kSmemBytes, stream>>>(a);
    ENGINE_CUDA_LAUNCH_CHECK("flash_attention_backward (wgmma dQ from dS)");
  } else {
    const dim3 grid_q(unsigned((a.Lq + Dq::Br - 1) / Dq::Br), unsigned(a.H), unsigned(a.B));
    dq_wgmma_kernel<Dq, T, kDrop><<<grid_q, Dq::kThreads, Dq::kSmemBytes, stream>>>(a);
    ENGINE_CUDA_LAUNCH_CHECK("flash_attention_backward (wgmma dQ)");
  }
}

template <typename DkdvCfg, int kDqWG>
void run(const FlashArgs& a, bool bf16) {
  auto go = [&](auto drop) {
    if (bf16)
      launch<DkdvCfg, kDqWG, __nv_bfloat16, decltype(drop)::value>(a);
    else
      launch<DkdvCfg, kDqWG, __half, decltype(drop)::value>(a);
  };
  // The forward's keep bits, where it kept them (shared draws: ops/attention.cpp keeps them only then).
  if (a.keep_in && drop_mode(a) == Drop::shared)
    go(std::integral_constant<Drop, Drop::bits>{});
  else
    with_drop_mode(a, go);
}

}  // namespace

bool launch_backward_wgmma(const FlashArgs& a, bool bf16, int config) {
  if (!forward_wgmma_available() || a.D != a.Dv || (a.D != 64 && a.D != 128)) return false;
  // config 0: a warpgroup per block (64 keys in dK dV, 64 queries in dQ); 1: two (128 keys, 128 queries).
  if (a.D == 64) {
    if (config == 0)
      run<WgDkdvConfig<64, 1, 2>, 1>(a, bf16);
    else
      run<WgDkdvConfig<64, 2, 1>, 2>(a, bf16);
  } else {
    if (config == 0)
      run<WgDkdvConfig<128, 1, 1>, 1>(a, bf16);
    else
      run<WgDkdvConfig<128, 2, 1>, 2>(a, bf16);
  }
  return true;
}

}  // namespace ops::cuda::attn
