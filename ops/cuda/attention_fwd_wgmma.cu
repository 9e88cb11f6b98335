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
// Shared memory: Q [Br, D] and two buffers of K and V [Bc, D], each as D / 64 panels of 64 columns (rows of 128
// bytes, the 128-byte swizzle: wgmma.cuh's layout), 1024-byte aligned; the next tile's K and V load by cp.async while
// this tile is computed, one block barrier per tile.
// Measured: not yet (written without a GPU; the attention tests run it as the forward's last variant).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>

#include "engine/cuda/runtime.h"
#include "ops/cuda/attention_common.cuh"
#include "ops/cuda/wgmma.cuh"

namespace ops::cuda::attn {

namespace {

constexpr int kPanel = 64;  // columns of a panel: 128 bytes of 16-bit elements

// Element offset of 16-byte chunk `chunk` (of D / 8) of row `row` in a [rows, D] tile stored as panels.
template <int kRows>
__device__ __forceinline__ int panel_chunk(int row, int chunk) {
  return (chunk >> 3) * (kRows * kPanel) + row * kPanel + (((chunk & 7) ^ (row & 7)) << 3);
}

// Rows [row0, row0 + kRows) of a [L, D] head (row stride in elements) into a panel tile, 16 bytes per cp.async;
// rows at or past L become zeros.
template <int kRows, int D, int kThreads>
__device__ __forceinline__ void load_panels_async(uint16_t* tile, const uint16_t* head, int64_t row_stride, int row0,
                                                  int L) {
  constexpr int kChunks = D / 8, kRowStep = kThreads / kChunks;
  static_assert(kThreads % kChunks == 0 && kRows % kRowStep == 0, "tile loader shape");
  const int r0 = int(threadIdx.x) / kChunks, ch = int(threadIdx.x) % kChunks;
  const uint16_t* src = head + int64_t(row0 + r0) * row_stride + ch * 8;
  const int64_t step = int64_t(kRowStep) * row_stride;
#pragma unroll
  for (int it = 0; it < kRows / kRowStep; it++) {
    const int r = r0 + it * kRowStep;
    const bool valid = row0 + r < L;
    cp_async16(smem_addr(tile + panel_chunk<kRows>(r, ch)), valid ? src + it * step : head, valid);
  }
}

// kMinBlocks: blocks per SM the register allocation must allow. A block's two warpgroups meet at a barrier every key
// tile, so they run their products and their softmax in step; a second block per SM is what overlaps one block's
// softmax with the other's tensor-core work.
template <int D_, int kMinBlocks_>
struct WgFwdConfig {
  static constexpr int D = D_, Br = 128, Bc = 64, kThreads = 256, kMinBlocks = kMinBlocks_;
  static constexpr int kQElems = Br * D, kKVElems = Bc * D;
  static constexpr int kSmemBytes = (kQElems + 4 * kKVElems) * 2 + 1024;  // + the slack to align to 1024 bytes
};

template <typename Cfg, typename T, Drop kDrop>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kMinBlocks) forward_wgmma_kernel(const FlashArgs a) {
#if defined(ENGINE_WGMMA_DEVICE)
  constexpr bool kDropout = kDrop != Drop::none, shared_draw = kDrop == Drop::shared;
  constexpr int D = Cfg::D, Br = Cfg::Br, Bc = Cfg::Bc, kThreads = Cfg::kThreads;
  constexpr int NT = Bc / 8, DT = D / 8, KS = D / 16;
  extern __shared__ __align__(128) uint16_t smem_raw[];
  uint16_t* smem = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023) / 2;
  uint16_t* sQ = smem;                    // [Br, D] panels, later the output staging tile
  uint16_t* sK = sQ + Cfg::kQElems;       // [2][Bc, D] panels
  uint16_t* sV = sK + 2 * Cfg::kKVElems;  // [2][Bc, D] panels

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, tq = lane % 4, wg = warp / 4;
  const int m_block = int(gridDim.x) - 1 - int(blockIdx.x);
  const int h = blockIdx.y, b = blockIdx.z, bh = b * a.H + h;
  const int q0 = m_block * Br;
  const int warp_row = wg * 64 + (warp % 4) * 16;  // first row of this warp in the tile
  const uint16_t* qh = static_cast<const uint16_t*>(a.q) + b * a.qs.b + h * a.qs.h;
  const uint16_t* kh = static_cast<const uint16_t*>(a.k) + b * a.ks.b + h * a.ks.h;
  const uint16_t* vh = static_cast<const uint16_t*>(a.v) + b * a.vs.b + h * a.vs.h;
  const uint8_t* pad_row = a.pad ? a.pad + int64_t(b) * a.Lk : nullptr;

  int key_end = a.Lk;
  if (a.causal) key_end = max(0, min(a.Lk, q0 + Br + a.Lk - a.Lq));
  const KeyTiles tiles = key_tiles<Bc>(a, pad_row, key_end);

  load_panels_async<Br, D, kThreads>(sQ, qh, a.qs.l, q0, a.Lq);
  if (tiles.begin < tiles.end) {
    load_panels_async<Bc, D, kThreads>(sK, kh, a.ks.l, tiles.begin * Bc, a.Lk);
    load_panels_async<Bc, D, kThreads>(sV, vh, a.vs.l, tiles.begin * Bc, a.Lk);
  }
  cp_async_commit();

  float o[D / 2];  // this thread's share of the warpgroup's [64, D] unnormalized output (wgmma.cuh's fragment)
#pragma unroll
  for (int i = 0; i < D / 2; i++) o[i] = 0.f;
  float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.f, 0.f};  // rows g, g + 8 of the warp
  // This warpgroup's Q rows: 64 rows of each panel, 8 KB into it.
  const uint32_t q_base = smem_addr(sQ) + uint32_t(wg * 64 * kPanel * 2);

  for (int t = tiles.begin; t < tiles.end; t++) {
    const int k0 = t * Bc, buf = (t - tiles.begin) & 1;
    cp_async_wait<0>();          // K and V of tile t (and Q) have landed for this thread's copies
    wgmma::fence_proxy_async();  // ... and are visible to the tensor cores' reads
    __syncthreads();             // every thread's; and both warpgroups are done with tile t - 1's buffers
    if (t + 1 < tiles.end) {
      load_panels_async<Bc, D, kThreads>(sK + (buf ^ 1) * Cfg::kKVElems, kh, a.ks.l, k0 + Bc, a.Lk);
      load_panels_async<Bc, D, kThreads>(sV + (buf ^ 1) * Cfg::kKVElems, vh, a.vs.l, k0 + Bc, a.Lk);
    }
    cp_async_commit();
    const uint32_t k_base = smem_addr(sK + buf * Cfg::kKVElems), v_base = smem_addr(sV + buf * Cfg::kKVElems);

    [[maybe_unused]] KeepBytes<NT / 2> keep;
    if constexpr (kDropout) {
#pragma unroll
      for (int nt2 = 0; nt2 < NT / 2; nt2++) {
        const int i = q0 + warp_row + g, j0 = k0 + nt2 * 16;
        keep.set(nt2, shared_draw ? dropout_keep_rows(a, bh, i, j0, lane)  // a block per 8 elements
                                  : dropout_keep_rows_each(a, bh, i, j0, lane));
      }
    }

    // S = Q K^T: this warpgroup's [64, Bc]; s[4 nt + e] is attention_fwd.cu's s[0][nt][e].
    float s[Bc / 2];
#pragma unroll
    for (int i = 0; i < Bc / 2; i++) s[i] = 0.f;
    wgmma::fence_operands(s);
    wgmma::fence();
#pragma unroll
    for (int ks = 0; ks < KS; ks++) {
      const uint32_t off = uint32_t((ks % 4) * 32);  // the k16 step within its panel
      const uint64_t dq = wgmma::desc_k128(q_base + uint32_t((ks / 4) * Br * kPanel * 2) + off);
      const uint64_t dk = wgmma::desc_k128(k_base + uint32_t((ks / 4) * Bc * kPanel * 2) + off);
      wgmma::mma_m64k16<T, 0, 0>(s, dq, dk, std::integral_constant<int, Bc>{});
    }
    wgmma::commit();
    wgmma::wait<0>();
    wgmma::fence_operands(s);

    const bool need_mask =
        k0 + Bc > a.Lk || (pad_row && tiles.keys.padded_within(k0, Bc)) || (a.causal && k0 + Bc - 1 > q0 + a.Lk - a.Lq);
    if (need_mask) {
      bool col_ok[NT][2];
#pragma unroll
      for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
          const int j = k0 + nt * 8 + 2 * tq + e;
          col_ok[nt][e] = j < a.Lk && !(pad_row && pad_row[j]);
        }
#pragma unroll
      for (int half = 0; half < 2; half++) {
        const int i = q0 + warp_row + g + half * 8;
        const int last = a.causal ? i + a.Lk - a.Lq - k0 - 2 * tq : 0x7fffffff;  // last visible nt*8 + e
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
          for (int e = 0; e < 2; e++)
            if (!col_ok[nt][e] || nt * 8 + e > last) s[4 * nt + 2 * half + e] = -INFINITY;
      }
    }

    // Online softmax (attention_fwd.cu's): each row lives in the 4 lanes of a quad.
#pragma unroll
    for (int half = 0; half < 2; half++) {
      float mx = row_max[half];
#pragma unroll
      for (int nt = 0; nt < NT; nt++) mx = fmaxf(mx, fmaxf(s[4 * nt + 2 * half], s[4 * nt + 2 * half + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float base = mx == -INFINITY ? 0.f : mx * a.scale_log2;
      const float alpha = fast_exp2(row_max[half] * a.scale_log2 - base);
      row_max[half] = mx;
      float sum = 0.f;
#pragma unroll
      for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
          const float p = fast_exp2(fmaf(s[4 * nt + 2 * half + e], a.scale_log2, -base));
          s[4 * nt + 2 * half + e] = p;
          sum += p;
        }
      row_sum[half] = row_sum[half] * alpha + sum;
#pragma unroll
      for (int dt = 0; dt < DT; dt++) {
        o[4 * dt + 2 * half] *= alpha;
        o[4 * dt + 2 * half + 1] *= alpha;
      }
    }

    if constexpr (kDropout) {
#pragma unroll
      for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++)
          s[4 * nt + e] *= keep(nt / 2, row_keep_bit(nt % 2, e >> 1, e & 1)) ? a.keep_scale : 0.f;
    }

    // O += P V: P's k16 step kk is n-tiles 2 kk, 2 kk + 1 of S; V's keys 16 kk .. are 2048 bytes into each panel.
    uint32_t pa[Bc / 16][4];  // acc_to_a's packing of n-tiles 2 kk (lo) and 2 kk + 1 (hi)
#pragma unroll
    for (int kk = 0; kk < Bc / 16; kk++) {
      pa[kk][0] = pack2<T>(s[8 * kk], s[8 * kk + 1]);
      pa[kk][1] = pack2<T>(s[8 * kk + 2], s[8 * kk + 3]);
      pa[kk][2] = pack2<T>(s[8 * kk + 4], s[8 * kk + 5]);
      pa[kk][3] = pack2<T>(s[8 * kk + 6], s[8 * kk + 7]);
    }
    wgmma::fence_operands(o);
    wgmma::fence();
#pragma unroll
    for (int kk = 0; kk < Bc / 16; kk++)
      wgmma::mma_m64k16_rs<T, 1>(o, pa[kk], wgmma::desc_mn128(v_base + uint32_t(kk * 2048), Bc * kPanel * 2),
                                 std::integral_constant<int, D>{});
    wgmma::commit();
    wgmma::wait<0>();  // before the next tile rescales o, and before its K / V buffer is refilled
    wgmma::fence_operands(o);
  }

  // out = O / l, lse = m * scale + log(l); a row that saw no key (l = 0): out 0, lse +inf (attention_fwd.cu's).
  cp_async_wait<0>();
  __syncthreads();  // sQ becomes the output staging tile (rows of D elements, attention_common.cuh's swizzle)
  float* lse = static_cast<float*>(a.lse) + int64_t(bh) * a.Lq;
#pragma unroll
  for (int half = 0; half < 2; half++) {
    float l = row_sum[half];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    const float inv = l > 0.f ? 1.f / l : 0.f;
    const int r = warp_row + g + half * 8;
#pragma unroll
    for (int dt = 0; dt < DT; dt++)
      *reinterpret_cast<uint32_t*>(sQ + swizzle<D>(r, dt * 8) + 2 * tq) =
          pack2<T>(o[4 * dt + 2 * half] * inv, o[4 * dt + 2 * half + 1] * inv);
    if (tq == 0 && q0 + r < a.Lq) lse[q0 + r] = l > 0.f ? row_max[half] * a.scale + logf(l) : INFINITY;
  }
  __syncthreads();
  uint16_t* out = static_cast<uint16_t*>(a.out) + b * a.outs.b + h * a.outs.h;  // [Lq, D], rows outs.l apart
  constexpr int kChunks = D / 8;
#pragma unroll
  for (int it = 0; it < (Br * kChunks + kThreads - 1) / kThreads; it++) {
    const int c = it * kThreads + tid;
    if (c >= Br * kChunks) break;
    const int r = c / kChunks, ch = c % kChunks;
    if (q0 + r < a.Lq)
      *reinterpret_cast<uint4*>(out + int64_t(q0 + r) * a.outs.l + ch * 8) =
          *reinterpret_cast<const uint4*>(sQ + swizzle<D>(r, ch * 8));
  }
#endif
}

template <typename Cfg, typename T, Drop kDrop>
void launch(const FlashArgs& a) {
  auto kernel = forward_wgmma_kernel<Cfg, T, kDrop>;
  static const bool configured = [&] {
    ENGINE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes));
    return true;
  }();
  (void)configured;
  const dim3 grid(unsigned((a.Lq + Cfg::Br - 1) / Cfg::Br), unsigned(a.H), unsigned(a.B));
  kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, engine::cuda::stream()>>>(a);
  ENGINE_CUDA_LAUNCH_CHECK("flash_attention (wgmma forward)");
}

template <typename Cfg>
void run(const FlashArgs& a, bool bf16) {
  with_drop_mode(a, [&](auto drop) {
    if (bf16)
      launch<Cfg, __nv_bfloat16, decltype(drop)::value>(a);
    else
      launch<Cfg, __half, decltype(drop)::value>(a);
  });
}

}  // namespace

bool forward_wgmma_available() {
#if defined(ENGINE_WGMMA)
  return engine::cuda::compute_capability() == 90;
#else
  return false;
#endif
}

bool launch_forward_wgmma(const FlashArgs& a, bool bf16) {
  if (!forward_wgmma_available() || a.D != a.Dv || (a.D != 64 && a.D != 128)) return false;
  if (a.D == 64)
    run<WgFwdConfig<64, 2>>(a, bf16);
  else
    run<WgFwdConfig<128, 2>>(a, bf16);
  return true;
}

}  // namespace ops::cuda::attn
