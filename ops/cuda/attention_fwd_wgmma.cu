// cuda/attention_fwd_wgmma.cu: the FlashAttention forward on Hopper's wgmma (sm_90a; bf16/f16, head dim 64 or 128):
// attention_fwd.cu's algorithm (tiling, masks, online softmax, dropout, output) with its two matrix products on
// warpgroup MMAs.
//
// A block is two warpgroups (256 threads) and Br = 128 query rows, 64 per warpgroup; each warp holds 16 rows, so a
// warp's share of the scores and of the output is exactly attention_fwd.cu's with one 16-row tile (kMT = 1), in the
// same registers (wgmma's accumulator fragment is mma.sync's m16n8, wgmma.cuh), and the masks, the softmax and the
// dropout are that file's code. Per key tile of Bc = 64 keys:
//     S = Q K^T   wgmma m64n64k16, Q and K from shared memory (K-major: Q's and K's rows of head-dim elements)
//     softmax     on the S accumulators in registers, as attention_fwd.cu
//     O += P V    wgmma m64nDk16 with P from registers (the S accumulators packed to 16 bits: acc_to_a) and V from
//                 shared memory (MN-major: V's rows are keys of head-dim elements)
// so no thread loads a fragment (no ldmatrix) and the tensor cores read Q, K and V straight from shared memory.
// Shared memory: Q [Br, D] and two (three when pipelined) buffers of K and V [Bc, D], each as D / 64 panels of 64
// columns (rows of 128 bytes, the 128-byte swizzle: wgmma.cuh's layout), 1024-byte aligned; the next tile's K and V
// load by cp.async while this tile is computed, one block barrier per tile.
// Measured (bf16, 2026-12-05): 279 TFLOP/s at 32x12x512x64, 460 at 8x16x4096x128 on an H200 (PyTorch's cuDNN SDPA:
// 291 and 634); 275 and 461 on an H100 (cuDNN 248 and 650). The default at head dim 64; at 128 the warp-specialized
// kernel of attention_fwd_tma.cu (its products' issue and the softmax of two warpgroups interleaved, the copies by a
// producer warpgroup) is faster: 582 against 455 on an H100 (2026-12-07).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>

#include "engine/cuda/runtime.h"
#include "ops/cuda/attention_wgmma.cuh"

namespace ops::cuda::attn {

namespace {

// kMinBlocks: blocks per SM the register allocation must allow. kPipelined: the products of consecutive key tiles
// overlap within a warpgroup (FlashAttention-3's intra-warpgroup pipelining): tile t's S = Q K^T and tile t - 1's
// O += P V are issued together, and tile t's softmax runs while the tensor cores finish P V; K and V then need three
// buffers (tile t + 1 loading, t computing, t - 1's V still read). Without it, the two warpgroups of a block meet at a
// barrier every key tile and run their products and their softmax in step, and a second block per SM is what overlaps
// one block's softmax with the other's tensor-core work.
// The softmax works in S's own registers and P is packed to 16 bits only after P V of the previous tile is done: no
// register a wgmma in flight reads is written before its wait. (Packing P into a second fragment array during the
// overlap made ptxas serialize every wgmma of the kernel, its advisory C7513: 268 against the plain kernel's 279
// TFLOP/s at 32x12x512x64, H200. `make check-ptxas` now fails the build on such advisories.)
// Measured with that fixed (H100, bf16, 2026-12-05, BENCHMARKS.md): the overlap ties at head dim 64 (277 against 275
// TFLOP/s at 32x12x512x64) and loses at 128 (358 against 461 at 8x16x4096x128: one block of two warpgroups per SM
// against two blocks), so the plain kernel stays the default. Key tiles of 128 with the overlap (half the barriers
// and row reductions per key, 225 KB of shared memory at head dim 128) lost at both: 206 and 403.
template <int D_, int kMinBlocks_, bool kPipelined_>
struct WgFwdConfig {
  static constexpr int D = D_, Br = 128, Bc = 64, kThreads = 256, kMinBlocks = kMinBlocks_;
  static constexpr bool kPipelined = kPipelined_;
  static constexpr int kSlots = kPipelined ? 3 : 2;  // K and V buffers
  static constexpr int kQElems = Br * D, kKVElems = Bc * D;
  static constexpr int kSmemBytes = (kQElems + 2 * kSlots * kKVElems) * 2 + 1024;  // + the slack to align to 1 KB
};

template <typename Cfg, typename T, Drop kDrop>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kMinBlocks) forward_wgmma_kernel(const FlashArgs a) {
#if defined(ENGINE_WGMMA_DEVICE)
  constexpr bool kDropout = kDrop != Drop::none;  // (Drop::bits: shared draws, also written to the keep bits)
  constexpr int D = Cfg::D, Br = Cfg::Br, Bc = Cfg::Bc, kThreads = Cfg::kThreads, kSlots = Cfg::kSlots;
  constexpr int NT = Bc / 8, KS = D / 16;
  extern __shared__ __align__(128) uint16_t smem_raw[];
  uint16_t* smem = aligned_smem(smem_raw);
  uint16_t* sQ = smem;                         // [Br, D] panels, later the output staging tile
  uint16_t* sK = sQ + Cfg::kQElems;            // [kSlots][Bc, D] panels
  uint16_t* sV = sK + kSlots * Cfg::kKVElems;  // [kSlots][Bc, D] panels

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, wg = warp / 4;
  const int m_block = int(gridDim.x) - 1 - int(blockIdx.x);
  const int h = blockIdx.y, b = blockIdx.z, bh = b * a.H + h;
  const int q0 = m_block * Br;
  const int warp_row = wg * 64 + (warp % 4) * 16;  // first row of this warp in the tile
  const uint16_t* qh = head_rows(a.q, a.qs, b, h);
  const uint16_t* kh = head_rows(a.k, a.ks, b, h);
  const uint16_t* vh = head_rows(a.v, a.vs, b, h);
  const uint8_t* pad_row = pad_row_of(a, b);

  const KeyTiles tiles = key_tiles<Bc>(a, pad_row, q0 + Br);
  auto slot = [&](int t) { return (t - tiles.begin) % kSlots; };
  auto load_kv = [&](int t) {  // tile t's K and V into its slot (nothing past the last tile)
    if (t < tiles.end) {
      load_panels_async<Bc, D, kThreads>(sK + slot(t) * Cfg::kKVElems, kh, a.ks.l, t * Bc, a.Lk);
      load_panels_async<Bc, D, kThreads>(sV + slot(t) * Cfg::kKVElems, vh, a.vs.l, t * Bc, a.Lk);
    }
  };
  // Tile t's K and V have landed, for every thread and for the tensor cores; every warpgroup is done with what it
  // read before. Then tile t + 1's copies start.
  auto tile_ready = [&](int t) {
    cp_async_wait<0>();
    wgmma::fence_proxy_async();
    __syncthreads();
    load_kv(t + 1);
    cp_async_commit();
  };

  load_panels_async<Br, D, kThreads>(sQ, qh, a.qs.l, q0, a.Lq);
  load_kv(tiles.begin);
  cp_async_commit();

  float o[D / 2];  // this thread's share of the warpgroup's [64, D] unnormalized output (wgmma.cuh's fragment)
#pragma unroll
  for (int i = 0; i < D / 2; i++) o[i] = 0.f;
  float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.f, 0.f};  // rows g, g + 8 of the warp
  // This warpgroup's Q rows: 64 rows of each panel, 8 KB into it.
  const uint32_t q_base = smem_addr(sQ) + uint32_t(wg * 64 * kPanelRowBytes);

  auto draw_keep = [&](int t, KeepBytes<NT / 2>& keep) {
    draw_keep_tile<kDrop, NT>(a, bh, q0 + warp_row, t * Bc, lane, keep);
  };
  // S = Q K^T of tile t, issued as one group: this warpgroup's [64, Bc]; s[4 nt + e] is attention_fwd.cu's
  // s[0][nt][e].
  auto issue_s = [&](int t, float(&s)[Bc / 2]) {
    const uint32_t k_base = smem_addr(sK + slot(t) * Cfg::kKVElems);
#pragma unroll
    for (int i = 0; i < Bc / 2; i++) s[i] = 0.f;
    wgmma::fence_operands(s);
    wgmma::fence();
    issue_kmajor<T, Bc, KS>(s, q_base, Br, k_base, Bc);
    wgmma::commit();
  };
  // O += P V of tile t, issued as one group: P's k16 step kk is n-tiles 2 kk, 2 kk + 1 of S; V's keys 16 kk .. are
  // 2048 bytes into each panel.
  auto issue_pv = [&](int t, uint32_t(&pa)[Bc / 16][4]) {
    const uint32_t v_base = smem_addr(sV + slot(t) * Cfg::kKVElems);
    wgmma::fence_operands(o);
    wgmma::fence();
    issue_rs<T, D>(o, pa, v_base, Bc);
    wgmma::commit();
  };
  auto softmax = [&](int t, float(&s)[Bc / 2], const KeepBytes<NT / 2>& keep, float(&alpha)[2]) {
    online_softmax<kDropout, Bc>(a, tiles, pad_row, q0, q0 + warp_row, t * Bc, lane, s, keep, row_max, row_sum, alpha);
  };
  auto rescale = [&](const float(&alpha)[2]) { rescale_rows<D>(o, alpha); };
  if constexpr (!Cfg::kPipelined) {
    for (int t = tiles.begin; t < tiles.end; t++) {
      tile_ready(t);
      [[maybe_unused]] KeepBytes<NT / 2> keep;
      draw_keep(t, keep);
      float s[Bc / 2];
      issue_s(t, s);
      wgmma::wait<0>();
      wgmma::fence_operands(s);
      float alpha[2];
      softmax(t, s, keep, alpha);
      uint32_t pa[Bc / 16][4];
      pack_p<T, Bc>(s, pa);
      rescale(alpha);
      issue_pv(t, pa);
      wgmma::wait<0>();  // before the next tile rescales o, and before its K / V buffer is refilled
      wgmma::fence_operands(o);
      fence_fragments(pa);
    }
  } else if (tiles.begin < tiles.end) {
    uint32_t pa[Bc / 16][4];  // the previous tile's P, its P V not yet issued
    {
      tile_ready(tiles.begin);
      [[maybe_unused]] KeepBytes<NT / 2> keep;
      draw_keep(tiles.begin, keep);
      float s[Bc / 2], alpha[2];
      issue_s(tiles.begin, s);
      wgmma::wait<0>();
      wgmma::fence_operands(s);
      softmax(tiles.begin, s, keep, alpha);  // o is zero: nothing to rescale
      pack_p<T, Bc>(s, pa);
    }
    for (int t = tiles.begin + 1; t < tiles.end; t++) {
      tile_ready(t);  // (every warpgroup's P V of tile t - 2 is done: tile t + 1 may take its slot)
      [[maybe_unused]] KeepBytes<NT / 2> keep;
      draw_keep(t, keep);
      float s[Bc / 2], alpha[2];
      issue_s(t, s);        // group 1
      issue_pv(t - 1, pa);  // group 2, over tile t - 1's V (its slot is not refilled before the next barrier)
      wgmma::wait<1>();     // S of tile t is done (groups complete in order)
      wgmma::fence_operands(s);
      softmax(t, s, keep, alpha);  // beside the tensor cores' P V
      wgmma::wait<0>();            // P V of tile t - 1 is done: o and pa are free
      wgmma::fence_operands(o);
      fence_fragments(pa);
      rescale(alpha);
      pack_p<T, Bc>(s, pa);
    }
    issue_pv(tiles.end - 1, pa);
    wgmma::wait<0>();
    wgmma::fence_operands(o);
    fence_fragments(pa);
  }

  // out = O / l, lse = m * scale + log(l); a row that saw no key (l = 0): out 0, lse +inf (attention_fwd.cu's).
  cp_async_wait<0>();
  __syncthreads();  // sQ becomes the output staging tile (rows of D elements, attention_common.cuh's swizzle)
  stage_output_rows<T, D>(a, bh, q0, warp_row, o, row_max, row_sum, sQ,
                          [](int r, int dt) { return swizzle<D>(r, dt * 8); });
  __syncthreads();
  store_output_tile<Br, D, kThreads>(sQ, a, b, h, q0);
#endif
}

template <typename Cfg, typename T, Drop kDrop>
void launch(const FlashArgs& a) {
  auto kernel = forward_wgmma_kernel<Cfg, T, kDrop>;
  static const bool configured = engine::cuda::set_smem_limit(kernel, Cfg::kSmemBytes);
  (void)configured;
  const dim3 grid(unsigned((a.Lq + Cfg::Br - 1) / Cfg::Br), unsigned(a.H), unsigned(a.B));
  kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, engine::cuda::stream()>>>(a);
  ENGINE_CUDA_LAUNCH_CHECK("flash_attention (wgmma forward)");
}

template <typename Cfg>
void run(const FlashArgs& a, bool bf16) {
  with_forward_type_and_drop(a, bf16, [&](auto t, auto drop) { launch<Cfg, decltype(t), decltype(drop)::value>(a); });
}

}  // namespace

bool forward_wgmma_available() { return wgmma::available(); }

bool launch_forward_wgmma(const FlashArgs& a, bool bf16, int config) {
  if (!forward_wgmma_available() || a.D != a.Dv || (a.D != 64 && a.D != 128)) return false;
  if (config < 0 || config >= kForwardWgmmaConfigs) return false;
  if (config >= 2) {  // the warp-specialized kernel (attention_fwd_tma.cu)
    launch_forward_tma(a, bf16, config == 3);
    return true;
  }
  // Shared memory at head dim 128: 97 KB (two blocks per SM) and 129 KB (one).
  const bool pipelined = config == 1;
  if (a.D == 64) {
    if (pipelined)
      run<WgFwdConfig<64, 2, true>>(a, bf16);
    else
      run<WgFwdConfig<64, 2, false>>(a, bf16);
  } else {
    if (pipelined)
      run<WgFwdConfig<128, 1, true>>(a, bf16);
    else
      run<WgFwdConfig<128, 2, false>>(a, bf16);
  }
  return true;
}

}  // namespace ops::cuda::attn
