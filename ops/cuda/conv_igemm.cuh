// cuda/conv_igemm.cuh: the tensor-core main loop shared by the three implicit-GEMM convolution kernels
// (conv_igemm_fwd.cu: forward; conv_igemm_data_phases.cu / conv_igemm_data.cu: data gradient;
// conv_igemm_weight.cu: weight gradient), for two element types:
//   bf16/f16: mma.sync m16n8k16 (16-bit inputs, f32 accumulators), fragments by ldmatrix;
//   f32 with TF32 tensor cores (engine::cuda::allow_tf32()): mma.sync m16n8k8 .tf32, f32 accumulators, each
//   operand rounded to TF32 in registers with cvt.rna.tf32.f32 (round to nearest, ties away: cuBLAS's rounding).
//
// Each kernel is a GEMM C[M, N] = A[M, K] B[K, N] whose operands are gathered from the NHWC tensors on the
// fly (no im2col buffer): a per-kernel Loader copies one K-slice of A and of B into shared memory with
// 16-byte cp.async (a chunk of kVec channels: 8 16-bit or 4 f32; channel counts are multiples of kVec, so a
// chunk never straddles a filter tap; chunks outside the image, the padding, or past the end are zero-filled
// by the copy itself; the gathering variants for Cin/g % kVec != 0 load element by element and store 16
// bytes). The main loop then runs the MMAs on the tiles.
//
// Tiling (Tile below): a block computes a 128 x 128 (or 128 x 64, 64 x 128) tile of C, each warp a 64 x 32
// (or 64 x 64) sub-tile. K advances BK at a time (64 16-bit or 32 f32 elements: 128 bytes either way, so a
// stage holds the same bytes and a block the same shared memory in both types) through a 3-stage cp.async
// pipeline: while the tensor cores work on slice k, slices k+1 and k+2 are in flight. Shared tiles are rows
// split in 16-byte chunks; the operands come in two layouts each:
//   A [m][k] (rows of BK)  or  A [k][m] (rows of BM)  (weight gradient)
//   B [n][k] (rows of BK)  or  B [k][n] (rows of BN)  (data/weight gradient)
// Reading fragments: a k-step is 32 bytes of k (16 16-bit or 8 f32 elements), and the m16n8k8 TF32
// fragments of a [m][k] / [n][k] tile are, byte for byte, those ldmatrix (b16) gives for m16n8k16 (each lane's
// 32-bit register holds one f32 instead of a 16-bit pair: a0..a3 = rows 0-7/8-15 x k 0-3/4-7, b0/b1 = k 0-3/4-7),
// so those tiles use the same ldmatrix code and the same swizzle (chunk ^ row % 8, mma_sync.cuh's:
// conflict-free). ldmatrix.trans would split the f32 words, so the [k][m] / [k][n] f32 tiles are read one
// 32-bit word per lane (KMajorWords) and stored with another chunk permutation (tile_chunk): each lane reads
// (k = tq (+4), col = g (+8)) of an 8-row block, and chunk ^ ((r % 4) * 2 + (r / 4) % 2) puts the 32 lanes
// of every such load in 32 different banks (with chunk ^ row % 8 they would take 16, 2 lanes each).
#pragma once
#include <cstring>
#include <type_traits>

#include "engine/cuda/runtime.h"
#include "ops/cuda/mma_sync.cuh"
#include "ops/cuda/conv_kernels.cuh"
#include "ops/cuda/wgmma.cuh"

namespace ops::cuda::conv::igemm {

// A block's tile: BM x BN of C, K advancing BK per slice through kStages shared-memory stages. Warps
// are laid out (BM / 64) x (BN / WN), each computing a 64 x WN sub-tile (4 x WN/8 MMA tiles; 64 or 128 f32
// accumulators per thread): 128 x 128 with 8 warps of 64 x 32 (96 KB, 2 blocks per SM) or 4 warps of
// 64 x 64 (fewer shared-memory reads per MMA: 4 KB of fragments per 32 MMAs instead of 3 KB per 16);
// 128 x 64 or 64 x 128 with 4 warps of 64 x 32 (72 KB, 3 blocks per SM) for layers with 64 channels or
// too few 128 x 128 tiles to fill the GPU. Elem is the storage element in global and shared memory:
// uint16_t (bf16/f16 bits) or float (TF32 MMAs). Shared memory is addressed in 16-bit units (uint16_t*):
// the k*Elems counts below are in those units.
template <int BM_, int BN_, int WN_ = 32, typename Elem_ = uint16_t>
struct Tile {
  using Elem = Elem_;
  static constexpr bool kTf32 = std::is_same_v<Elem, float>;
  static constexpr int kVec = 16 / int(sizeof(Elem));  // elements per 16-byte chunk
  static constexpr int kU = int(sizeof(Elem)) / 2;     // 16-bit units per element
  static constexpr int BM = BM_, BN = BN_, BK = 8 * kVec;  // BK: 128 bytes of k
  static constexpr int kStages = 3;
  static constexpr int WM = 64, WN = WN_;
  static constexpr int MT = WM / 16, NT = WN / 8;  // MMA tiles per warp
  static constexpr int kWarpsM = BM / WM, kWarpsN = BN / WN;
  static constexpr int kThreads = 32 * kWarpsM * kWarpsN;
  static constexpr int kMinBlocks = (kThreads >= 256 || WN == 64) ? 2 : 3;
  static constexpr bool kWgmma = false;  // mma.sync (WgTile below: wgmma)
  static constexpr bool kTma = false;
  static constexpr int kLoadThreads = kThreads;  // every thread copies
  static constexpr int kAElems = BM * BK * kU, kBElems = BN * BK * kU;
  static constexpr int kStageElems = kAElems + kBElems;
  static constexpr int kSmemBytes = kStages * kStageElems * 2;
  // Accumulators of one warp: acc[mt][nt] is the 16 x 8 tile at rows warp_m*WM + mt*16, cols
  // warp_n*WN + nt*8; a lane holds (row g, cols 2tq, 2tq+1) in [0], [1] and (row g + 8, same cols) in [2], [3].
  using Acc = float[MT][NT][4];
  static_assert(BM % WM == 0 && BN % WN == 0 && (WN == 32 || WN == 64), "warp tiles are 64 x 32 or 64 x 64");
};
constexpr int kKRowUnits = 64;  // 16-bit units in a row of BK (128 bytes) of a [m][k] / [n][k] tile

// The storage element of dtype T's tiles, and the tile of T.
template <typename T>
using StorageOf = std::conditional_t<std::is_same_v<T, float>, float, uint16_t>;
template <typename T, int BM, int BN, int WN = 32>
using TileOf = Tile<BM, BN, WN, StorageOf<T>>;

// Offset (16-bit units) of 16-byte chunk `chunk` of row `row` in a tile whose rows hold kRowElems elements:
// at chunk ^ (row % 8), or chunk ^ ((r % 4) * 2 + r / 4) with r = row % 8 for the f32 tiles stored k-major
// ([k][m], [k][n]: read one word per lane, see the header).
template <typename Cfg, int kRowElems, bool kKMajor>
__device__ __forceinline__ int tile_chunk(int row, int chunk) {
  constexpr int D = kRowElems * Cfg::kU;
  const int r = row & 7;
  const int x = (Cfg::kTf32 && kKMajor) ? (((r & 3) << 1) | (r >> 2)) : r;
  return row * D + ((chunk ^ x) << 3);
}

// One 32-bit word per lane from a k-major f32 tile [k][kCols] (stored by tile_chunk<.., true>): the lane's
// element (k0 + tq + 4h, c0 + g + 8j), g = lane / 4, tq = lane % 4, for k0 a multiple of 8 and c0 of 16:
// A's a[j + 2h] of the m16n8k8 TF32 fragment from a [k][m] tile, B's b[h] of n-tile j from a [k][n] tile.
// c0 / 4 has its two low bits clear, so the swizzled chunk is (c0 / 4) ^ (g / 4 + 2j) ^ perm(tq + 4h), with
// perm(tq + 4h) = 2tq + h: (c0 / 4 ^ 2j ^ h) ^ lane_chunk, a constant XOR the lane's (g / 4) ^ 2tq.
template <int kCols>
struct KMajorWords {
  uint32_t base;  // tile + row tq + word g % 4, bytes
  int lane_chunk;  // (g / 4) ^ 2tq
  __device__ __forceinline__ KMajorWords(const uint16_t* tile, int lane) {
    const int g = lane >> 2, tq = lane & 3;
    base = smem_addr(tile) + uint32_t(tq * kCols * 4 + (g & 3) * 4);
    lane_chunk = (g >> 2) ^ (tq << 1);
  }
  __device__ __forceinline__ uint32_t operator()(int k0, int c0, int j, int h) const {
    const int chunk = ((c0 >> 2) ^ (2 * j) ^ h) ^ lane_chunk;
    const uint32_t addr = base + uint32_t((k0 + 4 * h) * kCols * 4 + (chunk << 4));
    uint32_t v;
    asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(v) : "r"(addr));
    return v;
  }
};

// f32 bits rounded to TF32 (10 mantissa bits; nearest, ties away from zero: cuBLAS's rounding), in place.
// On sm_90 cvt.rna.tf32.f32 is three instructions (|x| < inf ? x + 0x1000 : x, then a mask of the low 13
// bits, which the MMA ignores anyway). Measured on the H200 (2026-11-30, Darknet 3x3 layers): dropping the
// mask (CUTLASS's round_half_ulp_truncate, guard kept) gained nothing; a bare x + 0x1000 ran ~10% faster
// but turns a NaN such as 0x7fffffff into -0 (the carry reaches the sign bit), hiding a diverged step.
template <int N>
__device__ __forceinline__ void round_tf32(uint32_t (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; i++) asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r[i]) : "f"(__uint_as_float(r[i])));
}

// c[16x8] += a[16x8] b[8x8] on TF32 inputs, f32 accumulators.
__device__ __forceinline__ void mma1688_tf32(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Fragment addresses (mma_sync.cuh's lane mappings): A [m][k] as frag_a, A [k][m] with ldmatrix.trans
// as frag_b_rows' mapping (its four 8x8 matrices are (k 0-7, m 0-7), (k 0-7, m 8-15), (k 8-15, m 0-7),
// (k 8-15, m 8-15), transposed into a0..a3), B [n][k] as frag_b_rows, B [k][n] as frag_b_trans. The [k][m] and
// [k][n] mappings serve the 16-bit tiles only (TF32 reads those with KMajorWords).
template <bool kKM, int BM>
__device__ __forceinline__ FragAddr<kKM ? BM : kKRowUnits> a_frag(const uint16_t* sA, int lane) {
  if constexpr (kKM) return FragAddr<BM>(sA, (lane >> 4) * 8 + (lane & 7), (lane >> 3) & 1);
  else return FragAddr<kKRowUnits>(sA, lane & 15, lane >> 4);
}
template <bool kKN, int BN>
__device__ __forceinline__ FragAddr<kKN ? BN : kKRowUnits> b_frag(const uint16_t* sB, int lane) {
  if constexpr (kKN) return FragAddr<BN>(sB, ((lane >> 3) & 1) * 8 + (lane & 7), lane >> 4);
  else return FragAddr<kKRowUnits>(sB, (lane >> 4) * 8 + (lane & 7), (lane >> 3) & 1);
}

// C += A B over one staged K-slice: 4 k-steps of 32 bytes (k16 MMAs for 16-bit T, k8 TF32 MMAs for float).
template <typename Cfg, typename T, bool kAKM, bool kBKN>
__device__ __forceinline__ void mma_slice(const uint16_t* sA, const uint16_t* sB, typename Cfg::Acc& acc, int warp_m,
                                          int warp_n, int lane) {
  constexpr int MT = Cfg::MT, NT = Cfg::NT, WM = Cfg::WM, WN = Cfg::WN;
  constexpr bool kTf32 = std::is_same_v<T, float>;
  static_assert(kTf32 == Cfg::kTf32, "float tiles run TF32 MMAs");
  constexpr bool kAWords = kTf32 && kAKM, kBWords = kTf32 && kBKN;  // k-major f32 tiles: word loads
  const auto fa = a_frag<kAKM, Cfg::BM * Cfg::kU>(sA, lane);
  const auto fb = b_frag<kBKN, Cfg::BN * Cfg::kU>(sB, lane);
  const KMajorWords<Cfg::BM> wa(sA, lane);
  const KMajorWords<Cfg::BN> wb(sB, lane);
  (void)wa, (void)wb;
#pragma unroll
  for (int ks = 0; ks < kKRowUnits / 16; ks++) {
    uint32_t af[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
      const int m0 = warp_m * WM + mt * 16;
      if constexpr (kAWords) {
#pragma unroll
        for (int i = 0; i < 4; i++) af[mt][i] = wa(ks * 8, m0, i & 1, i >> 1);
      } else if constexpr (kAKM) {
        ldmatrix_x4_trans(af[mt], fa(ks * 16, m0 / 16));
      } else {
        ldmatrix_x4(af[mt], fa(m0, ks));
      }
      if constexpr (kTf32) round_tf32(af[mt]);
    }
#pragma unroll
    for (int nt2 = 0; nt2 < NT / 2; nt2++) {
      const int n0 = warp_n * WN + nt2 * 16;
      uint32_t bf[4];
      if constexpr (kBWords) {
#pragma unroll
        for (int i = 0; i < 4; i++) bf[i] = wb(ks * 8, n0, i >> 1, i & 1);
      } else if constexpr (kBKN) {
        ldmatrix_x4_trans(bf, fb(ks * 16, n0 / 16));
      } else {
        ldmatrix_x4(bf, fb(n0, ks));
      }
      if constexpr (kTf32) round_tf32(bf);
#pragma unroll
      for (int mt = 0; mt < MT; mt++) {
        if constexpr (kTf32) {
          mma1688_tf32(acc[mt][2 * nt2], af[mt], bf[0], bf[1]);
          mma1688_tf32(acc[mt][2 * nt2 + 1], af[mt], bf[2], bf[3]);
        } else {
          mma16816<T>(acc[mt][2 * nt2], af[mt], bf[0], bf[1]);
          mma16816<T>(acc[mt][2 * nt2 + 1], af[mt], bf[2], bf[3]);
        }
      }
    }
  }
}

// The pipelined loop over k_tiles K-slices. loader.load(sA, sB, kt) issues the copies of slice kt.
template <typename Cfg, typename T, bool kAKM, bool kBKN, typename Loader>
__device__ __forceinline__ void mma_sync_mainloop(Loader& loader, int k_tiles, uint16_t* smem,
                                                  typename Cfg::Acc& acc) {
  constexpr int MT = Cfg::MT, NT = Cfg::NT;
  constexpr int kStages = Cfg::kStages, kStageElems = Cfg::kStageElems, kAElems = Cfg::kAElems;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int warp_m = warp / Cfg::kWarpsN, warp_n = warp % Cfg::kWarpsN;
#pragma unroll
  for (int mt = 0; mt < MT; mt++)
#pragma unroll
    for (int nt = 0; nt < NT; nt++) acc[mt][nt][0] = acc[mt][nt][1] = acc[mt][nt][2] = acc[mt][nt][3] = 0.f;
#pragma unroll
  for (int s = 0; s < kStages - 1; s++) {
    if (s < k_tiles) loader.load(smem + s * kStageElems, smem + s * kStageElems + kAElems, s);
    cp_async_commit();
  }
  for (int kt = 0; kt < k_tiles; kt++) {
    cp_async_wait<kStages - 2>();  // slice kt has landed (for this thread's copies)
    __syncthreads();               // ... for every thread's; and every warp is done with slice kt - 1
    const int next = kt + kStages - 1;
    if (next < k_tiles) {
      uint16_t* st = smem + (next % kStages) * kStageElems;  // the stage slice kt - 1 used
      loader.load(st, st + kAElems, next);
    }
    cp_async_commit();
    const uint16_t* st = smem + (kt % kStages) * kStageElems;
    mma_slice<Cfg, T, kAKM, kBKN>(st, st + kAElems, acc, warp_m, warp_n, lane);
  }
  cp_async_wait<0>();
}

// Calls store(row, col, v0, v1) for each accumulator pair of this thread (gemm_tile below), mma.sync tiles.
template <typename Cfg, typename Store>
__device__ __forceinline__ void mma_sync_for_each_pair(const typename Cfg::Acc& acc, Store&& store) {
  constexpr int MT = Cfg::MT, NT = Cfg::NT, WM = Cfg::WM, WN = Cfg::WN;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int warp_m = warp / Cfg::kWarpsN, warp_n = warp % Cfg::kWarpsN, g = lane / 4, tq = lane % 4;
#pragma unroll
  for (int mt = 0; mt < MT; mt++)
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
      for (int half = 0; half < 2; half++)
        store(warp_m * WM + mt * 16 + g + half * 8, warp_n * WN + nt * 8 + 2 * tq, acc[mt][nt][2 * half],
              acc[mt][nt][2 * half + 1]);
}

// ---------------------------------------------------------------------------------------------------
// Hopper's main loop (sm_90a, 16-bit inputs; wgmma.cuh). A block of two warpgroups (256 threads) computes a
// BM x BN tile of C (BM 128 or 256), each warpgroup BM / 2 rows x BN with BM / 128 m64nBNk16 wgmmas per 16
// elements of k: the accumulators stay in registers (BM / 128 x BN / 2 per thread) and the tensor cores read
// both operands from shared memory, so no thread spends issue slots on ldmatrix or MMAs. Tiles: [m][k] / [n][k]
// rows of BK = 64 elements (128 bytes) stored by tile_chunk are exactly wgmma's K-major 128-byte swizzle; [k][m] /
// [k][n] tiles are stored by kn_chunk in wgmma's MN-major panels of 64 columns (wgmma.cuh), so the same loaders
// serve both main loops.
// Stages: every thread copies (the loaders as in the mma.sync loop); while the tensor cores run slice kt, the
// copies of slices kt + 1 .. kt + kStages - 2 are in flight and slice kt - 1's wgmmas may still run (one
// group is kept in flight across the barrier), so the copy of slice kt + kStages - 2 goes to the stage slice
// kt - 2 used.
// Measured on the H200 (2026-12-04, Darknet 3x3 128->256 152^2, bf16): 468 TFLOP/s forward against 327 for
// the mma.sync loop; ncu: tensor pipe ~49%, L2 ~53%, 8 warps per SM issuing 1.4 instructions per cycle, so
// latency-bound (copies and barrier) rather than bandwidth-bound. A warp-specialized version with the same cp.async
// copies (a producer warpgroup, two consumer warpgroups, mbarriers, setmaxnreg) ran slower (401): branch
// exp/conv-wgmma-warp-specialized. With both operands by the bulk tensor copy it wins (conv_igemm_tma.cuh's
// tma_ws_gemm_tile).
template <int BM_, int BN_, int kStages_, bool kTma_ = false>
struct WgTile {
  using Elem = uint16_t;
  static constexpr bool kTf32 = false, kWgmma = true;
  // The loader copies its weight tiles (B) by the bulk tensor copy (TMA) where it can: the forward's and the data
  // gradient's; the other copies stay with the threads.
  static constexpr bool kTma = kTma_;
  static constexpr int kVec = 8, kU = 1;
  static constexpr int BM = BM_, BN = BN_, BK = 64;
  static constexpr int kMT = BM / 128;  // m64 blocks per warpgroup
  static constexpr int kStages = kStages_;
  static constexpr int kThreads = 256, kLoadThreads = 256, kMinBlocks = 1;  // two warpgroups
  static constexpr int kAElems = BM * BK, kBElems = BN * BK;
  static constexpr int kStageElems = kAElems + kBElems;
  // The stages, the B copies' barriers (8 bytes each) and the slack to align to 1024 bytes.
  static constexpr int kSmemBytes = kStages * kStageElems * 2 + kStages * 8 + 1024;
  using Acc = float[kMT][BN / 2];
  static_assert(BM == 128 || BM == 256, "a warpgroup's rows are one or two m64 blocks");
  static_assert(BN == 128 || BN == 256, "wgmma.cuh has n = 128 and 256");
  static_assert(kStages >= 3, "one stage computing, one with wgmmas in flight, at least one loading");
};
constexpr int kPanelBytes = 64 * 128;  // an MN-major panel of a WgTile: 64 columns x BK rows of k

// Offset (16-bit units) of 16-byte chunk `chunk` of k-row `row` in a [k][m] / [k][n] tile of kRowElems columns.
template <typename Cfg, int kRowElems>
__device__ __forceinline__ int kn_chunk(int row, int chunk) {
  if constexpr (Cfg::kWgmma) return (chunk >> 3) * (kPanelBytes / 2) + row * 64 + (((chunk & 7) ^ (row & 7)) << 3);
  else return tile_chunk<Cfg, kRowElems, true>(row, chunk);
}

// Whether a loader copies its B tiles by the bulk tensor copy: it says so with kTmaB = true (and has tma_b).
template <typename L, typename = void>
struct TmaB : std::false_type {};
template <typename L>
struct TmaB<L, std::void_t<decltype(L::kTmaB)>> : std::bool_constant<L::kTmaB> {};

// One K-slice's wgmmas as one committed group: acc += A B over the stage's A tile at shared address sa (this
// warpgroup's first m64 block; the next 8 KB further) and B tile at sb, K- or MN-major (kAKM / kBKN).
template <typename Cfg, typename T, bool kAKM, bool kBKN>
__device__ __forceinline__ void wgmma_slice(typename Cfg::Acc& acc, uint32_t sa, uint32_t sb) {
#pragma unroll
  for (int mi = 0; mi < Cfg::kMT; mi++) wgmma::fence_operands(acc[mi]);
  wgmma::fence();
#pragma unroll
  for (int ks = 0; ks < Cfg::BK / 16; ks++) {
    const uint64_t db = kBKN ? wgmma::desc_mn128(sb + 2048 * ks, kPanelBytes) : wgmma::desc_k128(sb + 32 * ks);
#pragma unroll
    for (int mi = 0; mi < Cfg::kMT; mi++) {
      const uint32_t a = sa + mi * kPanelBytes;
      const uint64_t da = kAKM ? wgmma::desc_mn128(a + 2048 * ks, kPanelBytes) : wgmma::desc_k128(a + 32 * ks);
      wgmma::mma_m64k16<T, kAKM, kBKN>(acc[mi], da, db, std::integral_constant<int, Cfg::BN>{});
    }
  }
  wgmma::commit();
#pragma unroll
  for (int mi = 0; mi < Cfg::kMT; mi++) wgmma::fence_operands(acc[mi]);
}

// Calls store(row, col, v0, v1) for each accumulator pair of this thread, wgmma tiles (wgmma.cuh's fragment: per
// warp 16 rows, per 8 columns four values; warpgroup wg holds rows wg * BM / 2 ..).
template <typename Cfg, typename Store>
__device__ __forceinline__ void wgmma_for_each_pair(const typename Cfg::Acc& acc, Store&& store) {
  const int lane = int(threadIdx.x % 32), g = lane / 4, tq = lane % 4;
  const int row0 = int(threadIdx.x / 128) * Cfg::kMT * 64 + int(threadIdx.x / 32 % 4) * 16 + g;
#pragma unroll
  for (int mi = 0; mi < Cfg::kMT; mi++)
#pragma unroll
    for (int j = 0; j < Cfg::BN / 8; j++)
#pragma unroll
      for (int half = 0; half < 2; half++)
        store(row0 + mi * 64 + half * 8, 8 * j + 2 * tq, acc[mi][4 * j + 2 * half], acc[mi][4 * j + 2 * half + 1]);
}

template <typename Cfg, typename T, bool kAKM, bool kBKN, typename Loader, typename Store>
__device__ __forceinline__ void wgmma_gemm_tile(const Loader& loader, int k_tiles, uint16_t* smem_raw, Store&& store) {
  constexpr int kStages = Cfg::kStages, kAhead = kStages - 2;  // slices in flight ahead of the one computed
  constexpr int kStageElems = Cfg::kStageElems, kAElems = Cfg::kAElems, BN = Cfg::BN;
  // The swizzle's period: the tiles start at multiples of 1024 bytes.
  uint16_t* smem = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023) / 2;
  constexpr int kMT = Cfg::kMT;
  const int wg = int(threadIdx.x / 128);
  // This warpgroup's first 64 rows of A (its m64 block mi is 8 KB further per mi): 64 rows of 128 bytes, or the
  // 64-column panel (the same 8 KB).
  const uint32_t a_off = uint32_t(wg * kMT) * kPanelBytes;
  typename Cfg::Acc acc;
#pragma unroll
  for (int mi = 0; mi < kMT; mi++)
#pragma unroll
    for (int i = 0; i < BN / 2; i++) acc[mi][i] = 0.f;
  // With kTmaB, thread 0 copies each slice's B tile by bulk tensor copies (loader.tma_b) completing on the stage's
  // barrier, and every thread waits for it after the block barrier. (The weight gradient's dy tiles by the same
  // copy ran 5-6% slower than by cp.async on the Darknet layers: H200, 2026-12-04.)
  constexpr bool kTma = TmaB<Loader>::value;
  const uint32_t bars = smem_addr(smem + kStages * kStageElems);  // barrier s at bars + 8 s
  if constexpr (kTma) {
    if (threadIdx.x == 0) {
      for (int s = 0; s < kStages; s++) wgmma::mbar_init(bars + 8 * s, 1);
      wgmma::fence_mbarrier_init();
    }
    __syncthreads();
  }
  auto load = [&](int slice) {
    uint16_t* st = smem + (slice % kStages) * kStageElems;
    loader.load(st, st + kAElems, slice);
    if constexpr (kTma) {
      if (threadIdx.x == 0) {
        const uint32_t bar = bars + 8 * (slice % kStages);
        wgmma::mbar_expect_tx(bar, uint32_t(Cfg::kBElems * 2));
        loader.tma_b(smem_addr(st + kAElems), bar, slice);
      }
    }
  };
#pragma unroll
  for (int s = 0; s < kAhead; s++) {
    if (s < k_tiles) load(s);
    cp_async_commit();
  }
  for (int kt = 0; kt < k_tiles; kt++) {
    cp_async_wait<kAhead - 1>();  // this thread's copies of slice kt have landed
    wgmma::fence_proxy_async();   // ... and, with its plain stores (gathering loaders), are visible to wgmma
    __syncthreads();              // every thread's; and both warpgroups are done with slice kt - 2
    if constexpr (kTma) wgmma::mbar_wait(bars + 8 * (kt % kStages), (kt / kStages) & 1);
    // Slice kt's wgmmas first, so that the tensor cores hold slices kt - 1 and kt while this thread computes the
    // next copies' addresses.
    const uint32_t sa = smem_addr(smem + (kt % kStages) * kStageElems) + a_off;
    const uint32_t sb = smem_addr(smem + (kt % kStages) * kStageElems + kAElems);
    wgmma_slice<Cfg, T, kAKM, kBKN>(acc, sa, sb);
    // The copies of slice kt + kAhead go to the stage slice kt - 2 used (neither kt - 1's nor kt's).
    if (kt + kAhead < k_tiles) load(kt + kAhead);
    cp_async_commit();
    wgmma::wait<1>();  // slice kt - 1's group is done; slice kt's runs on across the next barrier
  }
  wgmma::wait<0>();
#pragma unroll
  for (int mi = 0; mi < kMT; mi++) wgmma::fence_operands(acc[mi]);
  cp_async_wait<0>();
  wgmma_for_each_pair<Cfg>(acc, store);
}

// A block's tile of C = A B over k_tiles K-slices that loader.load(sA, sB, kt) copies (A is [k][m] when kAKM,
// else [m][k]; B [k][n] when kBKN, else [n][k]), then store(row, col, v0, v1) for each accumulator pair
// (C[row, col], C[row, col + 1]) of this thread, rows and cols relative to the tile, col even.
template <typename Cfg, typename T, bool kAKM, bool kBKN, typename Loader, typename Store>
__device__ __forceinline__ void gemm_tile(Loader& loader, int k_tiles, uint16_t* smem, Store&& store) {
  if constexpr (Cfg::kWgmma) {
    wgmma_gemm_tile<Cfg, T, kAKM, kBKN>(loader, k_tiles, smem, store);
  } else {
    typename Cfg::Acc acc;
    mma_sync_mainloop<Cfg, T, kAKM, kBKN>(loader, k_tiles, smem, acc);
    mma_sync_for_each_pair<Cfg>(acc, store);
  }
}

// Division by a divisor fixed for the whole kernel, as a multiply-high and a shift (the divisions of the
// pixel and tap decodes would otherwise cost ~20 instructions each, per K-slice). Exact for 0 <= n < 2^31.
struct FastDiv {
  uint32_t d = 1, magic = 0, shift = 0;
  FastDiv() = default;
  __host__ __device__ explicit FastDiv(int divisor) : d(uint32_t(divisor)) {
    while (shift < 32 && (uint32_t(1) << shift) < d) shift++;
    magic = uint32_t(((uint64_t(1) << 32) * ((uint64_t(1) << shift) - d)) / d + 1);
  }
  __device__ __forceinline__ int div(int n) const { return int((__umulhi(uint32_t(n), magic) + uint32_t(n)) >> shift); }
  // n / d and n % d
  __device__ __forceinline__ void divmod(int n, int& q, int& r) const {
    q = div(n);
    r = n - q * int(d);
  }
};

// The data gradient's stride phases, one filter dimension (k taps, dilation dil, padding p, stride s): the input
// positions of residue r (mod s) receive gradient from the taps first, first + step, .. (count of them; step =
// s / gcd(dil, s): those with r + p - t dil divisible by s), and input position r + s i reads, for its v-th valid
// tap, the output position i + off - v doff (off = (r + p - first dil) / s, doff = step dil / s). count = 0: no
// tap reaches those positions (their gradient is zero). Used by conv_igemm_data_phases.cu and conv_simt.cu.
struct PhaseTaps {
  int first = 0, count = 0, step = 1, off = 0, doff = 0;
  PhaseTaps() = default;
  __host__ __device__ PhaseTaps(int r, int p, int dil, int s, int k) {
    for (int t = k - 1; t >= 0; t--)
      if ((r + p - t * dil) % s == 0) first = t, count++;
    int a = dil, b = s;  // gcd(dil, s)
    while (b != 0) {
      const int c = a % b;
      a = b, b = c;
    }
    step = s / a;
    off = (r + p - first * dil) / s;
    doff = step * dil / s;
  }
  __host__ __device__ int tap(int v) const { return first + v * step; }  // the v-th valid tap
  __host__ __device__ int off_of(int v) const { return off - v * doff; }  // its output offset (the last's smallest)
};

// The geometry with fast divisors for the decodes the loaders do per K-slice.
struct FastDims {
  Dims d;
  FastDiv wo, ho, w, h, kw, cg, coutg, sh, sw;
  explicit FastDims(const Dims& dims)
      : d(dims), wo(std::max(dims.wo, 1)), ho(std::max(dims.ho, 1)), w(std::max(dims.w, 1)), h(std::max(dims.h, 1)),
        kw(std::max(dims.kw, 1)), cg(std::max(dims.cg, 1)), coutg(std::max(dims.coutg, 1)), sh(dims.sh), sw(dims.sw) {}
};

using engine::cuda::set_smem_limit;

// Two floats stored as a pair of T (one 4-byte store) or kept as f32 (8 bytes).
template <typename T>
__device__ __forceinline__ void store_pair(T* p, float v0, float v1) {
  *reinterpret_cast<uint32_t*>(p) = pack2<T>(v0, v1);
}
__device__ __forceinline__ void store_pair(float* p, float v0, float v1) { *reinterpret_cast<float2*>(p) = {v0, v1}; }

__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(float v) { return v; }

// A chunk's elements (8 16-bit or 4 f32) as one 16-byte shared-memory store (the gathering loaders' copy
// of cp_async16).
template <typename E, int N>
__device__ __forceinline__ void store_chunk(uint16_t* dst, const E (&v)[N]) {
  static_assert(sizeof(E) * N == 16, "a chunk is 16 bytes");
  uint4 u;
  memcpy(&u, v, 16);
  *reinterpret_cast<uint4*>(dst) = u;
}

// Two values at p[0], p[1] (p[1] only when `second`), one at a time: the gathering weight gradient's
// rows have odd lengths, so pairs are not aligned.
template <typename Out>
__device__ __forceinline__ void store_two(Out* p, float v0, float v1, bool second) {
  if constexpr (std::is_same_v<Out, float>) {
    p[0] = v0;
    if (second) p[1] = v1;
  } else if constexpr (std::is_same_v<Out, __nv_bfloat16>) {
    p[0] = __float2bfloat16_rn(v0);
    if (second) p[1] = __float2bfloat16_rn(v1);
  } else {
    p[0] = __float2half_rn(v0);
    if (second) p[1] = __float2half_rn(v1);
  }
}

// Whether a 128 x 128 tile has 4 warps of 64 x 64 (variant 1) rather than 8 of 64 x 32 (variant 0): as
// set_igemm_wide_variant chose (tests, benchmarks), else each kernel's measured default `by_default`
// (H200, 2026-11-30: v1 for the TF32 forward and weight gradient, whose k-major word loads and roundings
// per MMA halve with the wider warp tile, +10-20%; v0 for the rest).
inline bool wide_warps_64x64(bool by_default) {
  const int v = igemm_wide_variant();
  return v < 0 ? by_default : v == 1;
}

// Whether a GEMM with n columns (per group) takes the 64-wide tiles: 64 channels or fewer (a 128-wide tile
// would be half zeros), or too few 128 x 128 tiles for two blocks on every SM.
inline bool narrow_n(int64_t m, int64_t n, int64_t groups) {
  if (n <= 64) return true;
  const int64_t tiles = ((m + 127) / 128) * ((n + 127) / 128) * groups;
  return tiles < 2 * int64_t(engine::cuda::multiprocessors());
}

// The wgmma tile for a GEMM of m rows and n columns, `blocks` times over (groups, splits): as
// set_igemm_wgmma_shape forces (tests, benchmarks), else the tile whose waves of 132 blocks cost least, a wave of a
// large tile (128 x 256 where n > 128, 256 x 128 where m > 128) counted 200 / 127 of a wave of 128 x 128; ties go to
// the large tiles, 128 x 256 first. Per FLOP the large tiles ran ~1.27x faster than 128 x 128 (H200, 2026-12-04,
// Darknet 3x3 128->256 152^2 forward: 468 vs 367 TFLOP/s), but a wave of one does twice the work: ResNet d2 256->256
// 32^2 (64 wide tiles for 132 SMs) ran 375 on 128 x 128 against 266-272, 3x3 s2 128->256 76^2 (91 wide tiles) 274 on
// 128 x 256 against 242. 256 x 128 is a candidate wherever m > 128, not only where n <= 128: Darknet 128->256 152^2's
// weight gradient (m = Cout 256, n = 1152, 14 pieces: 126 blocks of 256 x 128, one wave, against 252 of 128 x 128,
// two) ran 742 TFLOP/s on it against 530 on 128 x 128 and 398 on 128 x 256 (H100, 2026-12-07; cuDNN 641), and 717
// by this rule in the next call. On every other perf row the rule picks the shape it picked before, the fastest
// measured or within 3% of it (BENCHMARKS.md).
inline WgShape wgmma_shape(int64_t m, int64_t n, int64_t blocks) {
  if (const WgShape forced = igemm_wgmma_shape(); forced != WgShape::by_shape) return forced;
  const int64_t sms = engine::cuda::multiprocessors();
  auto cost = [&](int64_t bm, int64_t bn) {  // waves, in waves of 128 x 128 tiles (x 127)
    const int64_t waves = (((m + bm - 1) / bm) * ((n + bn - 1) / bn) * blocks + sms - 1) / sms;
    return waves * (bm * bn > 128 * 128 ? 200 : 127);
  };
  WgShape best = WgShape::m128n128;  // ties go to the large tiles, 128 x 256 first
  int64_t least = cost(128, 128);
  if (n > 128 && cost(128, 256) <= least) best = WgShape::m128n256, least = cost(128, 256);
  if (m > 128 && (best == WgShape::m128n128 ? cost(256, 128) <= least : cost(256, 128) < least))
    best = WgShape::m256n128;
  return best;
}

// f(Cfg{}) with the WgTile of shape s (kTma: its loader copies the weight tiles by the bulk tensor copy).
template <bool kTma = false, typename F>
void with_wgmma_tile(WgShape s, F&& f) {
  if (s == WgShape::m128n256) f(WgTile<128, 256, 4, kTma>{});
  else if (s == WgShape::m256n128) f(WgTile<256, 128, 4, kTma>{});
  else f(WgTile<128, 128, 5, kTma>{});
}

constexpr int kFarAway = -(1 << 29);  // a coordinate base that puts every tap outside the image

// The entry points' dispatch, one home for the four passes: f(T{}) for the element type of `t` (f32, bf16,
// f16), and f(T{}, kGather) with kGather a std::bool_constant: true when a group's input channels are not a
// whole number of 16-byte vectors (4 f32 or 8 16-bit), so the loaders gather element by element.
template <typename F>
void with_elem(engine::DType t, F&& f) {
  if (t == engine::DType::f32) f(float{});
  else if (t == engine::DType::bf16) f(__nv_bfloat16{});
  else f(__half{});
}
template <typename F>
void with_elem_and_gather(engine::DType t, int cg, F&& f) {
  const bool gather = cg % (t == engine::DType::f32 ? 4 : 8) != 0;
  with_elem(t, [&](auto elem) {
    if (gather) f(elem, std::true_type{});
    else f(elem, std::false_type{});
  });
}

}  // namespace ops::cuda::conv::igemm
