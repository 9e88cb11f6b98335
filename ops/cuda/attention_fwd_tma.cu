// cuda/attention_fwd_tma.cu: the FlashAttention forward on Hopper, warp-specialized (sm_90a; bf16/f16, head dim 64 or
// 128): FlashAttention-3's structure on attention_fwd_wgmma.cu's per-warp steps (the masks, online softmax, dropout
// and packing of attention_wgmma.cuh).
//
// A block is Br = 128 query rows and 384 threads: two consumer warpgroups of 64 rows each (warps 0-7) and a producer
// warpgroup (warps 8-11) whose first lane issues every copy by the bulk tensor copy (TMA): the block's Q tile once,
// then each key tile's K and V [Bc = 128, D] into one of two stages, as soon as the consumers released the stage.
// The consumers compute no addresses and meet at no block barrier: per key tile a warpgroup waits for its K (an
// mbarrier), issues S = Q K^T (wgmma, both operands in shared memory), runs the softmax on S's registers, then
// O += P V (P from registers, V's MN-major panels), and releases K and V as soon as the products that read them are
// done.
//
// The two warpgroups take turns issuing their products (two named barriers: "ping-pong"), so that one warpgroup's
// softmax runs while the other's products occupy the tensor cores, which the per-block barrier of the threads-copy
// kernel prevents (its two warpgroups run their products and softmax in step; a second block per SM overlapped them
// instead, at Bc = 64). kOverlap: within a warpgroup, tile t's S = Q K^T is issued together with tile t - 1's
// O += P V and tile t's softmax runs while P V finishes (FlashAttention-3's intra-warpgroup pipelining; the stages then
// hold K of tile t and V of tile t - 1 at once, which separate K and V barriers allow).
//
// Shared memory at head dim 128: Q 32 KB and two stages of K and V (32 KB each): 160 KB, one block per SM; each tile as
// D / 64 panels of 64 columns (128-byte rows, the 128-byte swizzle: exactly what a TMA box of 64 x rows writes). Rows
// past L read zeros (the copy's out-of-bounds fill) and are masked like the threads-copy kernel's.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>

#include "engine/cuda/runtime.h"
#include "ops/cuda/attention_wgmma.cuh"
#include "ops/cuda/tma.cuh"

namespace ops::cuda::attn {

namespace {

template <int D_, bool kOverlap_>
struct TmaFwdConfig {
  static constexpr int D = D_, Br = 128, Bc = 128, kStages = 2;
  // Two consumer warpgroups and a producer warpgroup (ptxas sizes registers by whole warpgroups: a lone producer warp
  // would cost the same as four), its registers handed to the consumers (setmaxnreg: 24 + 2 x 240 per lane).
  static constexpr int kConsumerWarps = 8, kThreads = 32 * kConsumerWarps + 128;
  static constexpr int kProducerRegs = 24, kConsumerRegs = 240;
  static constexpr bool kOverlap = kOverlap_;
  static constexpr int kQElems = Br * D, kKVElems = Bc * D;
  // Barriers: Q's, then per stage K full, V full, K empty, V empty.
  static constexpr int kBarriers = 1 + 4 * kStages;
  static constexpr int kSmemBytes = (kQElems + 2 * kStages * kKVElems) * 2 + 8 * kBarriers + 1024;
  static_assert(kSmemBytes <= 227 * 1024, "an SM has 227 KB of shared memory for a block");
};

// Named barrier ids: kTurn + w, warpgroup w's turn to issue its products; kStaged + w, its output rows staged.
constexpr int kTurn = 1, kStaged = 3;

template <typename Cfg, typename T, Drop kDrop>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    forward_tma_kernel(const FlashArgs a, const __grid_constant__ CUtensorMap qmap,
                       const __grid_constant__ CUtensorMap kmap, const __grid_constant__ CUtensorMap vmap) {
#if defined(ENGINE_WGMMA_DEVICE)
  constexpr bool kDropout = kDrop != Drop::none;
  constexpr int D = Cfg::D, Br = Cfg::Br, Bc = Cfg::Bc, kStages = Cfg::kStages;
  constexpr int NT = Bc / 8, DT = D / 8, KS = D / 16, kPanels = D / 64;
  constexpr uint32_t kTileBytes = uint32_t(Cfg::kKVElems) * 2;
  extern __shared__ __align__(128) uint16_t smem_raw[];
  uint16_t* smem = aligned_smem(smem_raw);
  uint16_t* sQ = smem;                          // [Br, D] panels, later each warpgroup's output staging rows
  uint16_t* sK = sQ + Cfg::kQElems;             // [kStages][Bc, D] panels
  uint16_t* sV = sK + kStages * Cfg::kKVElems;  // [kStages][Bc, D] panels
  const uint32_t bars = smem_addr(sV + kStages * Cfg::kKVElems);
  const uint32_t q_full = bars;
  auto k_full = [&](int s) { return bars + uint32_t(8 * (1 + s)); };
  auto v_full = [&](int s) { return bars + uint32_t(8 * (1 + kStages + s)); };
  auto k_empty = [&](int s) { return bars + uint32_t(8 * (1 + 2 * kStages + s)); };
  auto v_empty = [&](int s) { return bars + uint32_t(8 * (1 + 3 * kStages + s)); };

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int m_block = int(gridDim.x) - 1 - int(blockIdx.x);  // the longest causal rows first
  const int h = blockIdx.y, b = blockIdx.z, bh = b * a.H + h;
  const int q0 = m_block * Br;
  const uint8_t* pad_row = pad_row_of(a, b);
  const KeyTiles tiles = key_tiles<Bc>(a, pad_row, q0 + Br);  // (a block-wide scan: every thread)
  const int n_tiles = max(0, tiles.end - tiles.begin);

  if (tid == 0) {
    wgmma::mbar_init(q_full, 1);
    for (int s = 0; s < kStages; s++) {
      wgmma::mbar_init(k_full(s), 1);  // the producer's arrival, with the bytes it expects
      wgmma::mbar_init(v_full(s), 1);
      wgmma::mbar_init(k_empty(s), Cfg::kConsumerWarps);  // one arrival per consumer warp
      wgmma::mbar_init(v_empty(s), Cfg::kConsumerWarps);
    }
    wgmma::fence_mbarrier_init();
  }
  __syncthreads();

  // The consumers (warps 0-7).
  auto consume = [&] {
    const int wg = warp / 4;
    const int warp_row = wg * 64 + (warp % 4) * 16;                              // first row of this warp in the tile
    const uint32_t q_base = smem_addr(sQ) + uint32_t(wg * 64 * kPanelRowBytes);  // this warpgroup's 64 rows of Q
    float o[D / 2];  // this thread's share of the warpgroup's [64, D] unnormalized output (wgmma.cuh's fragment)
#pragma unroll
    for (int i = 0; i < D / 2; i++) o[i] = 0.f;
    float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.f, 0.f};  // rows g, g + 8 of the warp
    auto stage = [](int n) { return n % kStages; };
    auto phase = [](int n) { return (n / kStages) & 1; };
    auto release = [&](uint32_t empty) {
      if (lane == 0) wgmma::mbar_arrive(empty);
    };
    // Turns: warpgroup 0 issues first; after its turn each lets the other issue (warpgroup 1 not after its last turn,
    // so that every arrival meets a wait).
    auto begin_turn = [&] { wgmma::bar_sync(kTurn + wg, 2 * 128); };
    auto end_turn = [&](int n) {
      if (wg == 0 || n + 1 < n_tiles) wgmma::bar_arrive(kTurn + (1 - wg), 2 * 128);
    };
    auto issue_s = [&](int n, float(&s)[Bc / 2]) {  // S = Q K^T of tile n, one group
#pragma unroll
      for (int i = 0; i < Bc / 2; i++) s[i] = 0.f;
      wgmma::fence_operands(s);
      wgmma::fence();
      issue_kmajor<T, Bc, KS>(s, q_base, Br, smem_addr(sK + stage(n) * Cfg::kKVElems), Bc);
      wgmma::commit();
    };
    auto issue_pv = [&](int n, uint32_t(&pa)[Bc / 16][4]) {  // O += P V of tile n, one group
      wgmma::fence_operands(o);
      wgmma::fence();
      issue_rs<T, D>(o, pa, smem_addr(sV + stage(n) * Cfg::kKVElems), Bc);
      wgmma::commit();
    };
    auto softmax = [&](int n, float(&s)[Bc / 2], const KeepBytes<NT / 2>& keep, float(&alpha)[2]) {
      online_softmax<kDropout, Bc>(a, tiles, pad_row, q0, q0 + warp_row, (tiles.begin + n) * Bc, lane, s, keep, row_max,
                                   row_sum, alpha);
    };

    wgmma::mbar_wait(q_full, 0);  // (also before the staging below overwrites Q)
    if (wg == 1 && n_tiles > 0) wgmma::bar_arrive(kTurn + 0, 2 * 128);
    if constexpr (!Cfg::kOverlap) {
      for (int n = 0; n < n_tiles; n++) {
        [[maybe_unused]] KeepBytes<NT / 2> keep;
        draw_keep_tile<kDrop, NT>(a, bh, q0 + warp_row, (tiles.begin + n) * Bc, lane, keep);
        float s[Bc / 2], alpha[2];
        wgmma::mbar_wait(k_full(stage(n)), phase(n));
        begin_turn();
        issue_s(n, s);
        end_turn(n);
        wgmma::wait<0>();
        wgmma::fence_operands(s);
        release(k_empty(stage(n)));
        softmax(n, s, keep, alpha);
        uint32_t pa[Bc / 16][4];
        pack_p<T, Bc>(s, pa);
        rescale_rows<D>(o, alpha);
        wgmma::mbar_wait(v_full(stage(n)), phase(n));
        issue_pv(n, pa);
        wgmma::wait<0>();
        wgmma::fence_operands(o);
        fence_fragments(pa);
        release(v_empty(stage(n)));
      }
    } else if (n_tiles > 0) {
      // (Tile 0 apart: every wait below is unconditional, as ptxas needs to see that no instruction reads an
      // accumulator a wgmma in flight writes; with a branch between wait<1> and wait<0> it serialized every wgmma,
      // advisory C7514.)
      uint32_t pa[Bc / 16][4];  // the previous tile's P, its P V not yet issued
      {
        [[maybe_unused]] KeepBytes<NT / 2> keep;
        draw_keep_tile<kDrop, NT>(a, bh, q0 + warp_row, tiles.begin * Bc, lane, keep);
        float s[Bc / 2], alpha[2];
        wgmma::mbar_wait(k_full(0), 0);
        begin_turn();
        issue_s(0, s);
        end_turn(0);
        wgmma::wait<0>();
        wgmma::fence_operands(s);
        release(k_empty(0));
        softmax(0, s, keep, alpha);  // o is zero: nothing to rescale
        pack_p<T, Bc>(s, pa);
      }
      for (int n = 1; n < n_tiles; n++) {
        [[maybe_unused]] KeepBytes<NT / 2> keep;
        draw_keep_tile<kDrop, NT>(a, bh, q0 + warp_row, (tiles.begin + n) * Bc, lane, keep);
        float s[Bc / 2], alpha[2];
        wgmma::mbar_wait(k_full(stage(n)), phase(n));
        wgmma::mbar_wait(v_full(stage(n - 1)), phase(n - 1));
        begin_turn();
        issue_s(n, s);        // group 1
        issue_pv(n - 1, pa);  // group 2
        end_turn(n);
        wgmma::wait<1>();  // S of tile n is done (groups complete in order)
        wgmma::fence_operands(s);
        release(k_empty(stage(n)));
        softmax(n, s, keep, alpha);  // beside the tensor cores' P V
        wgmma::wait<0>();            // P V of tile n - 1 is done: o and pa are free, and its V
        wgmma::fence_operands(o);
        fence_fragments(pa);
        release(v_empty(stage(n - 1)));
        rescale_rows<D>(o, alpha);
        pack_p<T, Bc>(s, pa);
      }
      wgmma::mbar_wait(v_full(stage(n_tiles - 1)), phase(n_tiles - 1));
      issue_pv(n_tiles - 1, pa);
      wgmma::wait<0>();
      wgmma::fence_operands(o);
      fence_fragments(pa);
    }

    // out = O / l into this warpgroup's rows of sQ (its own Q rows, which no product reads any more), then to a.out.
    stage_output_rows<T, D>(a, bh, q0, warp_row, o, row_max, row_sum, sQ,
                            [](int r, int dt) { return panel_chunk<Br>(r, dt); });
    wgmma::bar_sync(kStaged + wg, 128);
    uint16_t* out = static_cast<uint16_t*>(a.out) + b * a.outs.b + h * a.outs.h;
    const int t = tid % 128;
#pragma unroll
    for (int it = 0; it < 64 * DT / 128; it++) {
      const int c = it * 128 + t, r = wg * 64 + c / DT, ch = c % DT;
      if (q0 + r < a.Lq)
        *reinterpret_cast<uint4*>(out + int64_t(q0 + r) * a.outs.l + ch * 8) =
            *reinterpret_cast<const uint4*>(sQ + panel_chunk<Br>(r, ch));
    }
  };

  if (warp >= Cfg::kConsumerWarps) {  // the producer warpgroup: its first lane issues every copy
    wgmma::setmaxnreg_dec<Cfg::kProducerRegs>();
    if (warp == Cfg::kConsumerWarps && lane == 0) {
      wgmma::mbar_expect_tx(q_full, uint32_t(Cfg::kQElems) * 2);
      for (int p = 0; p < kPanels; p++)
        wgmma::tma_load_4d(smem_addr(sQ) + uint32_t(p * Br * kPanelRowBytes), &qmap, 64 * p, q0, h, b, q_full);
      for (int n = 0; n < n_tiles; n++) {
        const int s = n % kStages, k0 = (tiles.begin + n) * Bc;
        const int released = (n / kStages - 1) & 1;  // the phase in which tile n - kStages released the stage
        if (n >= kStages) wgmma::mbar_wait(k_empty(s), released);
        wgmma::mbar_expect_tx(k_full(s), kTileBytes);
        for (int p = 0; p < kPanels; p++)
          wgmma::tma_load_4d(smem_addr(sK + s * Cfg::kKVElems) + uint32_t(p * Bc * kPanelRowBytes), &kmap, 64 * p, k0,
                             h, b, k_full(s));
        if (n >= kStages) wgmma::mbar_wait(v_empty(s), released);
        wgmma::mbar_expect_tx(v_full(s), kTileBytes);
        for (int p = 0; p < kPanels; p++)
          wgmma::tma_load_4d(smem_addr(sV + s * Cfg::kKVElems) + uint32_t(p * Bc * kPanelRowBytes), &vmap, 64 * p, k0,
                             h, b, v_full(s));
      }
    }
  } else {
    wgmma::setmaxnreg_inc<Cfg::kConsumerRegs>();
    consume();
  }
#endif
}

// The tensor map of a [B, H, L, D] operand (strides s in elements; rows of 16 bytes, the caller checked) for boxes of
// 64 columns x `rows` rows of one head. A dimension of size 1 is given a stride the copy accepts (it is never stepped).
template <typename T>
CUtensorMap head_map(const void* base, const Strides& s, int B, int H, int L, int D, int rows) {
  auto stride = [](int64_t st, int size) { return cuuint64_t(size > 1 ? st * 2 : 16); };
  const cuuint64_t dims[4] = {cuuint64_t(D), cuuint64_t(L), cuuint64_t(H), cuuint64_t(B)};
  const cuuint64_t strides[3] = {stride(s.l, L), stride(s.h, H), stride(s.b, B)};
  const cuuint32_t box[4] = {64, cuuint32_t(rows), 1, 1};
  return swizzle128_map<T>(base, 4, dims, strides, box);
}

template <typename Cfg, typename T, Drop kDrop>
void launch(const FlashArgs& a) {
  auto kernel = forward_tma_kernel<Cfg, T, kDrop>;
  static const bool configured = engine::cuda::set_smem_limit(kernel, Cfg::kSmemBytes);
  (void)configured;
  const CUtensorMap qmap = head_map<T>(a.q, a.qs, a.B, a.H, a.Lq, a.D, Cfg::Br);
  const CUtensorMap kmap = head_map<T>(a.k, a.ks, a.B, a.H, a.Lk, a.D, Cfg::Bc);
  const CUtensorMap vmap = head_map<T>(a.v, a.vs, a.B, a.H, a.Lk, a.D, Cfg::Bc);
  const dim3 grid(unsigned((a.Lq + Cfg::Br - 1) / Cfg::Br), unsigned(a.H), unsigned(a.B));
  kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, engine::cuda::stream()>>>(a, qmap, kmap, vmap);
  ENGINE_CUDA_LAUNCH_CHECK("flash_attention (wgmma forward, TMA)");
}

template <typename Cfg>
void run(const FlashArgs& a, bool bf16) {
  with_forward_type_and_drop(a, bf16, [&](auto t, auto drop) { launch<Cfg, decltype(t), decltype(drop)::value>(a); });
}

}  // namespace

void launch_forward_tma(const FlashArgs& a, bool bf16, bool overlap) {
  if (a.D == 64) {
    if (overlap)
      run<TmaFwdConfig<64, true>>(a, bf16);
    else
      run<TmaFwdConfig<64, false>>(a, bf16);
  } else {
    if (overlap)
      run<TmaFwdConfig<128, true>>(a, bf16);
    else
      run<TmaFwdConfig<128, false>>(a, bf16);
  }
}

}  // namespace ops::cuda::attn
