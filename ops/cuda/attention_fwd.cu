// cuda/attention_fwd.cu: the FlashAttention-2 forward on tensor cores (bf16/f16, head dim 64 or 128).
//
// Tiling. One thread block per (query tile of Br rows, head); its warps split the Br rows, 16 * kMT rows
// each, so every row's softmax state (running max m, running sum l, output accumulator O) lives in the
// registers of one warp and no row statistic ever crosses warps. The block walks the key tiles (Bc keys):
//     S = Q K^T             mma m16n8k16, Q fragments from registers (or shared memory), K via ldmatrix
//     online softmax        m' = max(m, rowmax S), P = exp2(S*scale*log2e - m'*scale*log2e), l, O rescaled
//     O += P V              P re-packed from the S accumulators straight into A fragments (no shared
//                           memory round trip), V via ldmatrix.trans
// Shared memory holds Q [Br, D] and two buffers of K and V tiles [Bc, D], swizzled (attention_common.cuh):
// the next tile's K and V load (cp.async) while this tile is computed, with one barrier per tile.
// Causal: a query tile stops at the last key its last row sees, and blocks run in reverse tile order so
// the longest tiles start first. Padding: only the key tiles from the batch row's first unpadded key to its last
// are walked (attention_common.cuh's key_tiles; the others would add exactly nothing). Masks are applied only on
// tiles that need them (the last key tile, the diagonal tiles, and with a padding mask the tiles holding padded
// keys: in a dense row, only those at its ends).
//
// Bound: the tensor cores and the instruction issue around them. Per head 4 * Lq * Lk * D FLOPs (halved
// causal) against (Lq + 2 Lk Lq / Br) * D * 2 bytes, the repeated K/V reads served by L2. With mma.sync a
// warp's S = Q K^T, its softmax (about 5 ALU instructions per score) and its P V run one after the other,
// so at D = 64 the softmax's issue slots are a large share of the time (measured on an H200, bf16:
// ~240 TFLOP/s at D = 64, L = 512; ~320 at D = 128, L = 4096). Hopper's asynchronous wgmma would overlap them.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>

#include "engine/cuda/runtime.h"
#include "ops/cuda/attention_common.cuh"

namespace ops::cuda::attn {

namespace {

template <int D_, int kWarps_, int kMT_, int Bc_, bool kQInRegs_, int kMinBlocks_ = 1>
struct FwdConfig {
  static constexpr int D = D_;
  static constexpr int kMT = kMT_;  // 16-row MMA tiles per warp
  static constexpr int Bc = Bc_;
  static constexpr int Br = 16 * kWarps_ * kMT_;
  static constexpr int kThreads = 32 * kWarps_;
  static constexpr bool kQInRegs = kQInRegs_;
  static constexpr int kMinBlocks = kMinBlocks_;  // blocks per SM the register allocation must allow
  static constexpr int kSmemBytes = (Br + 4 * Bc) * D * 2;
};

template <typename Cfg, typename T, Drop kDrop>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kMinBlocks) forward_kernel(const FlashArgs a) {
  constexpr bool kDropout = kDrop != Drop::none, shared_draw = kDrop == Drop::shared;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  constexpr int D = Cfg::D, Br = Cfg::Br, Bc = Cfg::Bc, MT = Cfg::kMT, kThreads = Cfg::kThreads;
  constexpr int NT = Bc / 8, DT = D / 8, KS = D / 16;
  extern __shared__ __align__(128) uint16_t smem[];
  uint16_t* sQ = smem;              // [Br, D], later the output tile
  uint16_t* sK = sQ + Br * D;       // [2][Bc, D]
  uint16_t* sV = sK + 2 * Bc * D;   // [2][Bc, D]

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, tq = lane % 4;
  const int m_block = int(gridDim.x) - 1 - int(blockIdx.x);
  const int h = blockIdx.y, b = blockIdx.z, bh = b * a.H + h;
  const int q0 = m_block * Br;
  const int warp_row = warp * 16 * MT;  // first row of this warp in the tile
  const uint16_t* qh = head_rows(a.q, a.qs, b, h);
  const uint16_t* kh = head_rows(a.k, a.ks, b, h);
  const uint16_t* vh = head_rows(a.v, a.vs, b, h);
  const uint8_t* pad_row = pad_row_of(a, b);

  // Keys after the tile's last row's causal limit are masked for every row, and so are padded tiles: skip them.
  const KeyTiles tiles = key_tiles<Bc>(a, pad_row, q0 + Br);

  load_tile_async<Br, D, kThreads>(sQ, qh, a.qs.l, q0, a.Lq);
  if (tiles.begin < tiles.end) {
    load_tile_async<Bc, D, kThreads>(sK, kh, a.ks.l, tiles.begin * Bc, a.Lk);
    load_tile_async<Bc, D, kThreads>(sV, vh, a.vs.l, tiles.begin * Bc, a.Lk);
  }
  cp_async_commit();

  float o[MT][DT][4];  // [16*MT rows, D] unnormalized output of this warp
  float row_max[MT][2], row_sum[MT][2];  // raw (unscaled) running max; partial sums over this lane's columns
#pragma unroll
  for (int mt = 0; mt < MT; mt++) {
#pragma unroll
    for (int dt = 0; dt < DT; dt++) o[mt][dt][0] = o[mt][dt][1] = o[mt][dt][2] = o[mt][dt][3] = 0.f;
    row_max[mt][0] = row_max[mt][1] = -INFINITY;
    row_sum[mt][0] = row_sum[mt][1] = 0.f;
  }
  uint32_t qf[Cfg::kQInRegs ? MT : 1][Cfg::kQInRegs ? KS : 1][4];
  const FragAddr<D> q_frag = frag_a<D>(sQ, lane);

  for (int t = tiles.begin; t < tiles.end; t++) {
    const int k0 = t * Bc, buf = (t - tiles.begin) & 1;
    cp_async_wait<0>();  // K and V of tile t (and Q) have landed
    __syncthreads();     // ... for every thread, and every warp is done with tile t - 1's buffers
    if (t + 1 < tiles.end) {
      load_tile_async<Bc, D, kThreads>(sK + (buf ^ 1) * Bc * D, kh, a.ks.l, k0 + Bc, a.Lk);
      load_tile_async<Bc, D, kThreads>(sV + (buf ^ 1) * Bc * D, vh, a.vs.l, k0 + Bc, a.Lk);
    }
    cp_async_commit();
    const FragAddr<D> k_frag = frag_b_rows<D>(sK + buf * Bc * D, lane),
                      v_frag = frag_b_trans<D>(sV + buf * Bc * D, lane);
    if constexpr (Cfg::kQInRegs) {
      if (t == tiles.begin) {
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
          for (int ks = 0; ks < KS; ks++)
            ldmatrix_x4(qf[mt][ks], q_frag(warp_row + mt * 16, ks));
      }
    }

    // Dropout's keep bits of this tile (byte mt * NT/2 + nt2: n-tiles 2 nt2, 2 nt2 + 1), drawn before the scores.
    [[maybe_unused]] KeepBytes<MT * NT / 2> keep;
    if constexpr (kDropout) {
#pragma unroll
      for (int mt = 0; mt < MT; mt++)
        draw_keep_rows<shared_draw, NT>(a, bh, q0 + warp_row + mt * 16, k0, lane, keep, mt * NT / 2);
    }

    // S = Q K^T                                                                  [16*MT, Bc] per warp
    float s[MT][NT][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
      for (int nt = 0; nt < NT; nt++) s[mt][nt][0] = s[mt][nt][1] = s[mt][nt][2] = s[mt][nt][3] = 0.f;
#pragma unroll
    for (int ks = 0; ks < KS; ks++) {
      uint32_t af[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; mt++) {
        if constexpr (Cfg::kQInRegs) {
#pragma unroll
          for (int x = 0; x < 4; x++) af[mt][x] = qf[mt][ks][x];
        } else {
          ldmatrix_x4(af[mt], q_frag(warp_row + mt * 16, ks));
        }
      }
#pragma unroll
      for (int nt2 = 0; nt2 < NT / 2; nt2++) {
        uint32_t bk[4];
        ldmatrix_x4(bk, k_frag(nt2 * 16, ks));
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
          mma16816<T>(s[mt][2 * nt2], af[mt], bk[0], bk[1]);
          mma16816<T>(s[mt][2 * nt2 + 1], af[mt], bk[2], bk[3]);
        }
      }
    }
    // Masks: -inf where query i does not see key j (key_visible, split into a per-column test shared by
    // the lane's rows and a per-row causal limit: two compares per score, on the tiles that need them).
    const bool need_mask = tile_needs_mask<Bc>(a, tiles, pad_row, k0, q0);
    if (need_mask) {
      bool col_ok[NT][2];
      key_columns_ok(a, pad_row, k0, tq, col_ok);
#pragma unroll
      for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int half = 0; half < 2; half++) {
          const int i = q0 + warp_row + mt * 16 + g + half * 8;
          const int last = a.causal ? i + a.Lk - a.Lq - k0 - 2 * tq : 0x7fffffff;  // last visible nt*8 + e
#pragma unroll
          for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int e = 0; e < 2; e++)
              if (!col_ok[nt][e] || nt * 8 + e > last) s[mt][nt][2 * half + e] = -INFINITY;
        }
    }

    // Online softmax. Each row lives in the 4 lanes of a quad: reduce the max over them.
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
      for (int half = 0; half < 2; half++) {
        float mx = row_max[mt][half];
#pragma unroll
        for (int nt = 0; nt < NT; nt++) mx = fmaxf(mx, fmaxf(s[mt][nt][2 * half], s[mt][nt][2 * half + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        // A row with every key so far masked keeps max -inf: subtract 0 instead, so exp2 gives 0, not NaN.
        const float base = mx == -INFINITY ? 0.f : mx * a.scale_log2;
        const float alpha = fast_exp2(row_max[mt][half] * a.scale_log2 - base);
        row_max[mt][half] = mx;
        float sum = 0.f;
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
          for (int e = 0; e < 2; e++) {
            const float p = fast_exp2(fmaf(s[mt][nt][2 * half + e], a.scale_log2, -base));
            s[mt][nt][2 * half + e] = p;
            sum += p;
          }
        row_sum[mt][half] = row_sum[mt][half] * alpha + sum;
#pragma unroll
        for (int dt = 0; dt < DT; dt++) {
          o[mt][dt][2 * half] *= alpha;
          o[mt][dt][2 * half + 1] *= alpha;
        }
      }

    // Dropout: after the row sum (l counts every probability), before P V.
    if constexpr (kDropout) {
#pragma unroll
      for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
          for (int e = 0; e < 4; e++)
            s[mt][nt][e] *= keep(mt * NT / 2 + nt / 2, row_keep_bit(nt % 2, e >> 1, e & 1)) ? a.keep_scale : 0.f;
    }

    // O += P V                                                                   [16*MT, D] per warp
#pragma unroll
    for (int kk = 0; kk < NT / 2; kk++) {
      uint32_t pa[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; mt++) acc_to_a<T>(s[mt][2 * kk], s[mt][2 * kk + 1], pa[mt]);
#pragma unroll
      for (int dt2 = 0; dt2 < D / 16; dt2++) {
        uint32_t bv[4];
        ldmatrix_x4_trans(bv, v_frag(kk * 16, dt2));
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
          mma16816<T>(o[mt][2 * dt2], pa[mt], bv[0], bv[1]);
          mma16816<T>(o[mt][2 * dt2 + 1], pa[mt], bv[2], bv[3]);
        }
      }
    }
  }

  // out = O / l, lse = m * scale + log(l); a row that saw no key (l = 0): out 0, lse +inf.
  cp_async_wait<0>();
  __syncthreads();  // sQ becomes the output staging tile
  float* lse = static_cast<float*>(a.lse) + int64_t(bh) * a.Lq;
#pragma unroll
  for (int mt = 0; mt < MT; mt++)
#pragma unroll
    for (int half = 0; half < 2; half++) {
      float l = row_sum[mt][half];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      const float inv = l > 0.f ? 1.f / l : 0.f;
      const int r = warp_row + mt * 16 + g + half * 8;
#pragma unroll
      for (int dt = 0; dt < DT; dt++)
        *reinterpret_cast<uint32_t*>(sQ + swizzle<D>(r, dt * 8) + 2 * tq) =
            pack2<T>(o[mt][dt][2 * half] * inv, o[mt][dt][2 * half + 1] * inv);
      if (tq == 0 && q0 + r < a.Lq) lse[q0 + r] = l > 0.f ? row_max[mt][half] * a.scale + logf(l) : INFINITY;
    }
  __syncthreads();
  store_output_tile<Br, D, kThreads>(sQ, a, b, h, q0);
#endif
}

template <typename Cfg, typename T, Drop kDrop>
void launch(const FlashArgs& a) {
  auto kernel = forward_kernel<Cfg, T, kDrop>;
  static const bool configured = engine::cuda::set_smem_limit(kernel, Cfg::kSmemBytes);
  (void)configured;
  const dim3 grid(unsigned((a.Lq + Cfg::Br - 1) / Cfg::Br), unsigned(a.H), unsigned(a.B));
  kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, engine::cuda::stream()>>>(a);
  ENGINE_CUDA_LAUNCH_CHECK("flash_attention (tensor-core forward)");
}

// Every dtype and dropout for the configurations some shape uses by default (kFull); the others (benchmark
// alternatives) are built for bf16 without dropout only.
template <typename Cfg, bool kFull>
void run(const FlashArgs& a, bool bf16) {
  if constexpr (kFull) {
    with_drop_mode(a, [&](auto drop) {
      if (bf16) launch<Cfg, __nv_bfloat16, decltype(drop)::value>(a);
      else launch<Cfg, __half, decltype(drop)::value>(a);
    });
  } else {
    launch<Cfg, __nv_bfloat16, Drop::none>(a);
  }
}

// The configurations per head dim (Br = 16 * warps * kMT), and which one each shape uses by default
// (measured on an H200, bf16: 32x12x512x64 and 8x16x4096x128, ops/cuda/attention.h's benchmark).
using Fwd64_0 = FwdConfig<64, 4, 2, 64, true>;      // Br 128, Bc 64: default, not causal
using Fwd64_1 = FwdConfig<64, 4, 2, 64, false, 3>;  // the same, Q from shared memory, 3 blocks per SM
using Fwd64_2 = FwdConfig<64, 4, 1, 64, true, 4>;   // Br 64, Bc 64, 4 blocks per SM: default, causal
using Fwd128_0 = FwdConfig<128, 8, 1, 64, true>;    // Br 128, Bc 64
using Fwd128_1 = FwdConfig<128, 4, 1, 64, true>;    // Br 64, Bc 64
using Fwd128_2 = FwdConfig<128, 4, 2, 32, false>;   // Br 128, Bc 32, Q from shared memory: default
constexpr bool kFull64[] = {true, false, true};
constexpr bool kFull128[] = {false, false, true};

int default_variant(const FlashArgs& a) { return a.D == 64 ? (a.causal ? 2 : 0) : 2; }

}  // namespace

// Three mma.sync configurations per head dim, and on Hopper kForwardWgmmaConfigs more: the wgmma kernels
// (attention_fwd_wgmma.cu), variants kWgmmaVariant + config.
constexpr int kWgmmaVariant = 3;
int forward_tensor_core_variants(int head_dim) {
  if (head_dim != 64 && head_dim != 128) return 0;
  return forward_wgmma_available() ? kWgmmaVariant + kForwardWgmmaConfigs : kWgmmaVariant;
}

const char* forward_tensor_core_name(int head_dim, int variant) {
  static const char* d64[] = {"Br128 Bc64 4 warps", "Br128 Bc64 4 warps Q smem 3 blocks/SM",
                              "Br64 Bc64 4 warps 4 blocks/SM"};
  static const char* d128[] = {"Br128 Bc64 8 warps", "Br64 Bc64 4 warps", "Br128 Bc32 4 warps Q smem"};
  static const char* wgmma[kForwardWgmmaConfigs] = {
      "wgmma Br128 Bc64 2 warpgroups", "wgmma Br128 Bc64 2 warpgroups, tiles overlapped",
      "wgmma TMA Br128 Bc128 producer warp, ping-pong", "wgmma TMA Br128 Bc128 producer warp, ping-pong, overlapped"};
  if (variant >= kWgmmaVariant && variant < kWgmmaVariant + kForwardWgmmaConfigs) return wgmma[variant - kWgmmaVariant];
  if (variant < 0 || variant >= 3) variant = 0;
  return head_dim == 64 ? d64[variant] : d128[variant];
}

bool launch_forward_tensor_core(const FlashArgs& a, bool bf16, int variant) {
  if (a.D != a.Dv || (a.D != 64 && a.D != 128)) return false;
  // The defaults on Hopper: at head dim 64 the wgmma kernel whose threads copy, without overlapped tiles (H200, bf16,
  // 2026-12-05: 279 against the best mma.sync's 235 TFLOP/s at 32x12x512x64; H100, 2026-12-07: 289 against the
  // warp-specialized kernel's 259-271); at head dim 128 the warp-specialized TMA kernel with overlapped tiles (H100,
  // 2026-12-07: 582 against 455 at 8x16x4096x128, causal 523 against 421; attention_fwd_tma.cu).
  if ((variant < 0 || variant >= forward_tensor_core_variants(a.D)) && forward_wgmma_available())
    variant = kWgmmaVariant + (a.D == 128 ? 3 : 0);
  if (variant >= kWgmmaVariant && launch_forward_wgmma(a, bf16, variant - kWgmmaVariant)) return true;
  if (a.keep_out) launch_keep_bits(a);  // (these kernels do not write them)
  if (variant < 0 || variant >= 3) variant = default_variant(a);
  const bool full = a.D == 64 ? kFull64[variant] : kFull128[variant];
  if (!full && (!bf16 || a.dropout)) variant = default_variant(a);
  if (a.D == 64) {
    switch (variant) {
      case 1: run<Fwd64_1, kFull64[1]>(a, bf16); break;
      case 2: run<Fwd64_2, kFull64[2]>(a, bf16); break;
      default: run<Fwd64_0, kFull64[0]>(a, bf16); break;
    }
  } else {
    switch (variant) {
      case 0: run<Fwd128_0, kFull128[0]>(a, bf16); break;
      case 1: run<Fwd128_1, kFull128[1]>(a, bf16); break;
      default: run<Fwd128_2, kFull128[2]>(a, bf16); break;
    }
  }
  return true;
}

}  // namespace ops::cuda::attn
