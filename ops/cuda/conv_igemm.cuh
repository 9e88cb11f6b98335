// cuda/conv_igemm.cuh: the tensor-core main loop shared by the three implicit-GEMM convolution kernels
// (conv_igemm_fwd.cu: forward; conv_igemm_data_phases.cu / conv_igemm_data.cu: data gradient;
// conv_igemm_weight.cu: weight gradient).
//
// Each kernel is a GEMM C[M, N] = A[M, K] B[K, N] whose operands are gathered from the NHWC tensors on the
// fly (no im2col buffer): a per-kernel Loader copies one K-slice of A and of B into shared memory with
// 16-byte cp.async (8 channels at a time: channel counts are multiples of 8, so an 8-chunk never straddles
// a filter tap; chunks outside the image, the padding, or past the end are zero-filled by the copy itself;
// the gathering variants for Cin/g % 8 != 0 load element by element and store 16 bytes). The main loop then runs mma.sync m16n8k16 (bf16/f16 in, f32 accumulators) on the tiles.
//
// Tiling (Tile below): a block computes a 128 x 128 (or 128 x 64, 64 x 128) tile of C, each warp a 64 x 32
// (or 64 x 64) sub-tile. K advances 64 at a time through a 3-stage cp.async pipeline: while the tensor cores work on
// slice k, slices k+1 and k+2 are in flight. Shared tiles are rows of 64 or 128 16-bit elements,
// split in 16-byte chunks stored at chunk ^ (row % 8) (attention_common.cuh's swizzle), so every ldmatrix
// is conflict-free. The operands come in two layouts each:
//   A [m][k] (rows of BK, ldmatrix)       or  A [k][m] (rows of BM, ldmatrix.trans)  (weight gradient)
//   B [n][k] (rows of BK, ldmatrix)       or  B [k][n] (rows of BN, ldmatrix.trans)  (data/weight gradient)
#pragma once
#include "engine/cuda/runtime.h"
#include "ops/cuda/attention_common.cuh"
#include "ops/cuda/conv_kernels.cuh"

namespace ops::cuda::conv::igemm {

using attn::cp_async16;
using attn::cp_async_commit;
using attn::cp_async_wait;
using attn::FragAddr;
using attn::ldmatrix_x4;
using attn::ldmatrix_x4_trans;
using attn::mma16816;
using attn::smem_addr;
using attn::swizzle;

// A block's tile: BM x BN of C, K advancing BK = 64 per slice through kStages shared-memory stages. Warps
// are laid out (BM / 64) x (BN / WN), each computing a 64 x WN sub-tile (4 x WN/8 MMA tiles; 64 or 128 f32
// accumulators per thread): 128 x 128 with 8 warps of 64 x 32 (96 KB, 2 blocks per SM) or 4 warps of
// 64 x 64 (fewer shared-memory reads per MMA: 4 KB of fragments per 32 MMAs instead of 3 KB per 16);
// 128 x 64 or 64 x 128 with 4 warps of 64 x 32 (72 KB, 3 blocks per SM) for layers with 64 channels or
// too few 128 x 128 tiles to fill the GPU.
template <int BM_, int BN_, int WN_ = 32>
struct Tile {
  static constexpr int BM = BM_, BN = BN_, BK = 64;
  static constexpr int kStages = 3;
  static constexpr int WM = 64, WN = WN_;
  static constexpr int MT = WM / 16, NT = WN / 8;  // MMA tiles per warp
  static constexpr int kWarpsM = BM / WM, kWarpsN = BN / WN;
  static constexpr int kThreads = 32 * kWarpsM * kWarpsN;
  static constexpr int kMinBlocks = (kThreads >= 256 || WN == 64) ? 2 : 3;
  static constexpr int kAElems = BM * BK, kBElems = BN * BK;
  static constexpr int kStageElems = kAElems + kBElems;
  static constexpr int kSmemBytes = kStages * kStageElems * 2;
  // Accumulators of one warp: acc[mt][nt] is the 16 x 8 tile at rows warp_m*WM + mt*16, cols
  // warp_n*WN + nt*8; a lane holds (row g, cols 2tq, 2tq+1) in [0], [1] and (row g + 8, same cols) in [2], [3].
  using Acc = float[MT][NT][4];
  static_assert(BM % WM == 0 && BN % WN == 0 && (WN == 32 || WN == 64), "warp tiles are 64 x 32 or 64 x 64");
};
constexpr int BK = 64;

// Fragment addresses (attention_common.cuh's lane mappings): A [m][k] as frag_a, A [k][m] with ldmatrix.trans
// as frag_b_rows' mapping (its four 8x8 matrices are (k 0-7, m 0-7), (k 0-7, m 8-15), (k 8-15, m 0-7),
// (k 8-15, m 8-15), transposed into a0..a3), B [n][k] as frag_b_rows, B [k][n] as frag_b_trans.
template <bool kKM, int BM>
__device__ __forceinline__ FragAddr<kKM ? BM : BK> a_frag(const uint16_t* sA, int lane) {
  if constexpr (kKM) return FragAddr<BM>(sA, (lane >> 4) * 8 + (lane & 7), (lane >> 3) & 1);
  else return FragAddr<BK>(sA, lane & 15, lane >> 4);
}
template <bool kKN, int BN>
__device__ __forceinline__ FragAddr<kKN ? BN : BK> b_frag(const uint16_t* sB, int lane) {
  if constexpr (kKN) return FragAddr<BN>(sB, ((lane >> 3) & 1) * 8 + (lane & 7), lane >> 4);
  else return FragAddr<BK>(sB, (lane >> 4) * 8 + (lane & 7), (lane >> 3) & 1);
}

// C += A B over one staged K-slice.
template <typename Cfg, typename T, bool kAKM, bool kBKN>
__device__ __forceinline__ void mma_slice(const uint16_t* sA, const uint16_t* sB, typename Cfg::Acc& acc, int warp_m,
                                          int warp_n, int lane) {
  constexpr int MT = Cfg::MT, NT = Cfg::NT, WM = Cfg::WM, WN = Cfg::WN;
  const auto fa = a_frag<kAKM, Cfg::BM>(sA, lane);
  const auto fb = b_frag<kBKN, Cfg::BN>(sB, lane);
#pragma unroll
  for (int ks = 0; ks < BK / 16; ks++) {
    uint32_t af[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
      const int m0 = warp_m * WM + mt * 16;
      if constexpr (kAKM) ldmatrix_x4_trans(af[mt], fa(ks * 16, m0 / 16));
      else ldmatrix_x4(af[mt], fa(m0, ks));
    }
#pragma unroll
    for (int nt2 = 0; nt2 < NT / 2; nt2++) {
      const int n0 = warp_n * WN + nt2 * 16;
      uint32_t bf[4];
      if constexpr (kBKN) ldmatrix_x4_trans(bf, fb(ks * 16, n0 / 16));
      else ldmatrix_x4(bf, fb(n0, ks));
#pragma unroll
      for (int mt = 0; mt < MT; mt++) {
        mma16816<T>(acc[mt][2 * nt2], af[mt], bf[0], bf[1]);
        mma16816<T>(acc[mt][2 * nt2 + 1], af[mt], bf[2], bf[3]);
      }
    }
  }
}

// The pipelined loop over k_tiles K-slices. loader.load(sA, sB, kt) issues the copies of slice kt.
template <typename Cfg, typename T, bool kAKM, bool kBKN, typename Loader>
__device__ __forceinline__ void mainloop(Loader& loader, int k_tiles, uint16_t* smem, typename Cfg::Acc& acc) {
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

// Calls store(row, col, v0, v1) for each accumulator pair (C[row, col], C[row, col + 1]) of this thread,
// rows and cols relative to the block's tile; col is even.
template <typename Cfg, typename Store>
__device__ __forceinline__ void for_each_pair(const typename Cfg::Acc& acc, Store&& store) {
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

// Division by a divisor fixed for the whole kernel, as a multiply-high and a shift (the divisions of the
// pixel and tap decodes would otherwise cost ~20 instructions each, per K-slice). Exact for 0 <= n < 2^31.
struct FastDiv {
  uint32_t d = 1, magic = 0, shift = 0;
  FastDiv() = default;
  explicit FastDiv(int divisor) : d(uint32_t(divisor)) {
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

// The geometry with fast divisors for the decodes the loaders do per K-slice.
struct FastDims {
  Dims d;
  FastDiv wo, ho, w, h, kw, cg, coutg, sh, sw;
  explicit FastDims(const Dims& dims)
      : d(dims), wo(std::max(dims.wo, 1)), ho(std::max(dims.ho, 1)), w(std::max(dims.w, 1)), h(std::max(dims.h, 1)),
        kw(std::max(dims.kw, 1)), cg(std::max(dims.cg, 1)), coutg(std::max(dims.coutg, 1)), sh(dims.sh), sw(dims.sw) {}
};

// Raises the kernel's dynamic shared-memory limit. Each launcher calls it once, from a static of its own
// (kernels of different tiles share one function type, so the static cannot live here).
template <typename Kernel>
bool set_smem_limit(Kernel kernel, int bytes) {
  ENGINE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  return true;
}

// Two floats stored as a pair of T (one 4-byte store) or kept as f32 (8 bytes).
template <typename T>
__device__ __forceinline__ void store_pair(T* p, float v0, float v1) {
  *reinterpret_cast<uint32_t*>(p) = attn::pack2<T>(v0, v1);
}
__device__ __forceinline__ void store_pair(float* p, float v0, float v1) { *reinterpret_cast<float2*>(p) = {v0, v1}; }

__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }

// 8 16-bit values as one 16-byte shared-memory store (the gathering loaders' copy of cp_async16).
__device__ __forceinline__ void store_chunk(uint16_t* dst, const uint16_t (&v)[8]) {
  uint4 u;
  u.x = uint32_t(v[0]) | (uint32_t(v[1]) << 16);
  u.y = uint32_t(v[2]) | (uint32_t(v[3]) << 16);
  u.z = uint32_t(v[4]) | (uint32_t(v[5]) << 16);
  u.w = uint32_t(v[6]) | (uint32_t(v[7]) << 16);
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

// Whether a GEMM with n columns (per group) takes the 64-wide tiles: 64 channels or fewer (a 128-wide tile
// would be half zeros), or too few 128 x 128 tiles for two blocks on every SM.
inline bool narrow_n(int64_t m, int64_t n, int64_t groups) {
  if (n <= 64) return true;
  const int64_t tiles = ((m + 127) / 128) * ((n + 127) / 128) * groups;
  return tiles < 2 * int64_t(engine::cuda::multiprocessors());
}

constexpr int kFarAway = -(1 << 29);  // a coordinate base that puts every tap outside the image

}  // namespace ops::cuda::conv::igemm
