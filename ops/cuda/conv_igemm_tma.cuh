// cuda/conv_igemm_tma.cuh: the implicit-GEMM convolutions' bulk tensor copies (TMA, sm_90a): the tensor maps the
// host makes for them (a plain array's tiles: k128_tile_map, swizzle128_map; an NHWC tensor's im2col boxes:
// im2col_map, x_im2col_map), and the warp-specialized main loop they feed (TmaWsTile, tma_ws_gemm_tile: a producer
// warp issues the copies, two consumer warpgroups run the wgmmas of conv_igemm.cuh), optionally in clusters of two
// blocks that share the B tile's copies (TmaWsTileIndex, tma_ws_grid, launch_tma_ws, tma_ws_load_b). The wgmma loop
// whose threads copy with cp.async (and its weight tiles by the bulk copy) stays in conv_igemm.cuh.
#pragma once
#include <cudaTypedefs.h>

#include "ops/cuda/conv_igemm.cuh"

namespace ops::cuda::conv::igemm {

// Hopper's warp-specialized main loop, both operands by the bulk tensor copy (TMA): A [m][k] and B [n][k] tiles of
// 128-byte rows with the 128-byte swizzle, as in wgmma_gemm_tile. Warps 0-7 are two consumer warpgroups running the
// wgmmas of a BM x BN tile (each BM / 2 rows); warp 8 is the producer, whose first lane issues slice kt's copies
// (produce(kt, a, b, bar): shared addresses of the stage's A and B tiles, and the barrier the copies complete on) into
// stage kt % kStages as soon as the consumers released it. A consumer warp releases a stage (one arrival on its
// `empty` barrier, and in clusters on the same barrier of every block of the cluster, whose producers copy into this
// block's stage too) once the wgmmas that read it are done. The loop has no block barrier and the consumers compute no
// addresses: the copies run up to kStages - 1 slices ahead of the tensor cores, whatever the consumers are doing.
// (ncu of wgmma_gemm_tile, where every thread copies with cp.async: tensor pipe ~49%, latency-bound on the copies'
// address arithmetic and the barrier per K-slice.) Measured on the H200 (2026-12-05, ConvCudaPerf bf16, Darknet 3x3
// 128->256 152^2): forward / data / weight 529 / 522 / 378 TFLOP/s against 493 / 324 / 261 with x by cp.async.
// What bounds it (ncu, H100, 2026-12-05, 128 x 128 tiles): tensor pipe active half the SMs' cycles, the consumers
// waiting on the full barriers, the tiles out of L2 (94% hits) at ~5.3 TB/s; per FLOP the 128 x 256 tile beats
// 128 x 128 by about the ratio of their bytes per FLOP, so the working hypothesis is L2-to-SM bandwidth, and the lever
// fewer bytes per FLOP: kCluster = 2 (TMA multicast of B). Made persistent (a block per SM looping over tiles, the
// next tile's copies during the epilogue) it gained nothing at 152^2 and lost 5-10% on small layers (BENCHMARKS.md).
template <int BM_, int BN_, int kStages_, int kCluster_ = 1>
struct TmaWsTile {
  using Elem = uint16_t;
  static constexpr bool kTf32 = false, kWgmma = true;
  static constexpr int kVec = 8, kU = 1;
  static constexpr int BM = BM_, BN = BN_, BK = 64;
  static constexpr int kMT = BM / 128;  // m64 blocks per consumer warpgroup
  static constexpr int kStages = kStages_;
  // Blocks per cluster (1 or 2): the blocks of a cluster compute tiles of the same columns (the same B tiles),
  // rows kCluster tiles apart, and each copies 1 / kCluster of every B tile into all of them (a multicast copy).
  static constexpr int kCluster = kCluster_;
  static constexpr int kConsumerWarps = 8, kThreads = 32 * kConsumerWarps + 32;  // + the producer warp
  static constexpr int kAElems = BM * BK, kBElems = BN * BK;
  static constexpr int kStageElems = kAElems + kBElems;
  static constexpr uint32_t kStageTxBytes = uint32_t(kStageElems) * 2;  // what a stage's copies deliver
  // The stages, the full and empty barriers (8 bytes each) and the slack to align to 1024 bytes.
  static constexpr int kSmemBytes = kStages * kStageElems * 2 + 2 * kStages * 8 + 1024;
  using Acc = float[kMT][BN / 2];
  static_assert(BM == 128 || BM == 256, "a consumer warpgroup's rows are one or two m64 blocks");
  static_assert(BN == 128 || BN == 256, "wgmma.cuh has n = 128 and 256");
  static_assert(kCluster == 1 || kCluster == 2, "clusters of one or two blocks");
  static_assert(kSmemBytes <= 227 * 1024, "an SM has 227 KB of shared memory for a block");
};

// The block's tile of a TmaWsTile launch over m_tiles x n_tiles tiles (n fastest; a grid of tma_ws_grid(..)
// blocks): the blocks of a cluster take the same column tile n and consecutive row tiles m (the last cluster's may
// lie past m_tiles: their copies read zeros and their stores are skipped).
template <typename Cfg>
struct TmaWsTileIndex {
  int m, n;
  __device__ explicit TmaWsTileIndex(int n_tiles) {
    const int pair = int(blockIdx.x) / Cfg::kCluster;
    m = pair / n_tiles * Cfg::kCluster + (Cfg::kCluster > 1 ? int(wgmma::cluster_rank()) : 0);
    n = pair % n_tiles;
  }
};
template <typename Cfg>
inline int64_t tma_ws_grid(int64_t m_tiles, int64_t n_tiles) {
  return (m_tiles + Cfg::kCluster - 1) / Cfg::kCluster * Cfg::kCluster * n_tiles;
}

// Launches kernel<<<blocks, Cfg::kThreads, Cfg::kSmemBytes>>>(args...) on the engine's stream, in clusters of
// Cfg::kCluster blocks.
template <typename Cfg, typename... Params, typename... Args>
void launch_tma_ws(void (*kernel)(Params...), int64_t blocks, Args&&... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(unsigned(blocks));
  config.blockDim = dim3(Cfg::kThreads);
  config.dynamicSmemBytes = Cfg::kSmemBytes;
  config.stream = engine::cuda::stream();
  cudaLaunchAttribute cluster[1];
  cluster[0].id = cudaLaunchAttributeClusterDimension;
  cluster[0].val.clusterDim.x = unsigned(Cfg::kCluster);
  cluster[0].val.clusterDim.y = 1;
  cluster[0].val.clusterDim.z = 1;
  config.attrs = cluster;
  config.numAttrs = 1;
  ENGINE_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
}

// kAKM / kBKN: A is [k][m] / B is [k][n] in MN-major panels of 64 columns (wgmma_gemm_tile's kn_chunk layout: a
// bulk copy of a box of 64 channels x 64 pixels is exactly one panel), else [m][k] / [n][k].
template <typename Cfg, typename T, bool kAKM, bool kBKN, typename Produce, typename Store>
__device__ __forceinline__ void tma_ws_gemm_tile(Produce&& produce, int k_tiles, uint16_t* smem_raw, Store&& store) {
  constexpr int kStages = Cfg::kStages, kStageElems = Cfg::kStageElems, kAElems = Cfg::kAElems, BN = Cfg::BN;
  constexpr int kMT = Cfg::kMT;
  uint16_t* smem = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023) / 2;  // the swizzle's period
  const uint32_t tiles = smem_addr(smem), full = smem_addr(smem + kStages * kStageElems), empty = full + 8 * kStages;
  const int warp = int(threadIdx.x / 32), lane = int(threadIdx.x % 32);
  constexpr int kCluster = Cfg::kCluster;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; s++) {
      wgmma::mbar_init(full + 8 * s, 1);  // the producer's arrival (with the bytes it expects)
      wgmma::mbar_init(empty + 8 * s, Cfg::kConsumerWarps * kCluster);  // one per consumer warp of the cluster
    }
    wgmma::fence_mbarrier_init();
  }
  if constexpr (kCluster > 1) wgmma::cluster_sync();  // a peer's copies complete on these barriers
  else __syncthreads();
  if (warp == Cfg::kConsumerWarps) {  // the producer
    if (lane == 0) {
      for (int kt = 0; kt < k_tiles; kt++) {
        const int s = kt % kStages;
        // Slice kt - kStages released by every consumer warp of the cluster: the peers' copies write this stage too.
        if (kt >= kStages) wgmma::mbar_wait(empty + 8 * s, (kt / kStages - 1) & 1);
        wgmma::mbar_expect_tx(full + 8 * s, Cfg::kStageTxBytes);
        const uint32_t a = tiles + uint32_t(s * kStageElems * 2);
        produce(kt, a, a + uint32_t(kAElems * 2), full + 8 * s);
      }
    }
    if constexpr (kCluster > 1) wgmma::cluster_sync();  // no peer arrives on this block's barriers after it exits
    return;
  }
  // A consumer warp's release of stage s: an arrival on the stage's empty barrier in every block of the cluster.
  auto release = [&](int s) {
    if (lane != 0) return;
    if constexpr (kCluster > 1) {
      for (uint32_t r = 0; r < uint32_t(kCluster); r++) wgmma::mbar_arrive_cluster(empty + 8 * s, r);
    } else {
      wgmma::mbar_arrive(empty + 8 * s);
    }
  };
  const int wg = warp / 4;
  const uint32_t a_off = uint32_t(wg * kMT) * kPanelBytes;  // this warpgroup's rows: kMT m64 blocks of 8 KB
  typename Cfg::Acc acc;
#pragma unroll
  for (int mi = 0; mi < kMT; mi++)
#pragma unroll
    for (int i = 0; i < BN / 2; i++) acc[mi][i] = 0.f;
  for (int kt = 0; kt < k_tiles; kt++) {
    const int s = kt % kStages;
    wgmma::mbar_wait(full + 8 * s, (kt / kStages) & 1);
    const uint32_t sa = tiles + uint32_t(s * kStageElems * 2) + a_off;
    const uint32_t sb = tiles + uint32_t(s * kStageElems * 2 + kAElems * 2);
    wgmma_slice<Cfg, T, kAKM, kBKN>(acc, sa, sb);
    wgmma::wait<1>();  // slice kt - 1's wgmmas are done: its stage goes back to the producer
    if (kt > 0) release((kt - 1) % kStages);
  }
  wgmma::wait<0>();
#pragma unroll
  for (int mi = 0; mi < kMT; mi++) wgmma::fence_operands(acc[mi]);
  wgmma_for_each_pair<Cfg>(acc, store);
  if constexpr (kCluster > 1) wgmma::cluster_sync();
}

// The tensor map of a `rank`-dimensional array of 16-bit T (dims and box innermost first, the innermost contiguous;
// strides: the byte strides of dimensions 1 .. rank - 1, multiples of 16; base 16-byte aligned) for bulk copies
// of boxes whose innermost extent is 64 elements (128 bytes) into tiles of 128-byte rows with the 128-byte swizzle
// (tile_chunk's and kn_chunk's layout); boxes past the array read zeros. cuTensorMapEncodeTiled comes from the
// driver through the runtime.
// A CUDA 12.0 driver function, through the runtime (no driver library is linked).
template <typename Fn>
Fn driver_function(const char* name) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found{};
  ENGINE_CUDA_CHECK(cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &found));
  ENGINE_CHECK(found == cudaDriverEntryPointSuccess && fn, "the CUDA driver has no ", name);
  return reinterpret_cast<Fn>(fn);
}
template <typename T>
constexpr CUtensorMapDataType tensor_map_type =
    std::is_same_v<T, __nv_bfloat16> ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;

template <typename T>
CUtensorMap swizzle128_map(const void* base, int rank, const cuuint64_t* dims, const cuuint64_t* strides,
                           const cuuint32_t* box) {
  static const auto encode = driver_function<PFN_cuTensorMapEncodeTiled_v12000>("cuTensorMapEncodeTiled");
  CUtensorMap map;
  const cuuint32_t elem_strides[3] = {1, 1, 1};
  const CUtensorMapDataType type = tensor_map_type<T>;
  const CUresult r = encode(&map, type, cuuint32_t(rank), const_cast<void*>(base), dims, strides, box, elem_strides,
                            CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  ENGINE_CHECK(r == CUDA_SUCCESS, "cuTensorMapEncodeTiled failed (", int(r), ") for a ", rank, "-dimensional array (",
               dims[0], " innermost)");
  return map;
}

// A row-major [rows, k] matrix (k a multiple of 8) in boxes of 64 k x box_rows rows: the forward's weight tiles.
template <typename T>
CUtensorMap k128_tile_map(const void* base, int64_t rows, int64_t k, int box_rows) {
  const cuuint64_t dims[2] = {cuuint64_t(k), cuuint64_t(rows)}, strides[1] = {cuuint64_t(k) * 2};
  const cuuint32_t box[2] = {64, cuuint32_t(box_rows)};
  return swizzle128_map<T>(base, 2, dims, strides, box);
}

// The im2col map of an NHWC tensor [n, h, w, c] (16-bit T) for boxes of 64 channels x `pixels` output pixels into
// 128-byte rows with the 128-byte swizzle. A pixel's first tap traverses the bounding box from `lower` to (h or w) - 1
// + `upper`, `stride` apart (so the box holds (h + upper - lower - 1) / stride + 1 positions per dimension: the
// output's size), and each copy reads its pixels at that position plus the copy's tap offsets, at most `max_off`
// (zeros outside the tensor). False when the geometry is outside what the copy can express (the corners of a
// 4-dimensional map within [-128, 127], the offsets within [0, 255], strides up to 8) or the driver refuses it: the
// caller takes another kernel.
struct Im2colDims {
  int n, h, w, c;
  int lower_h, lower_w, upper_h, upper_w, max_off_h, max_off_w, stride_h, stride_w;
};
template <typename T>
bool im2col_map(CUtensorMap* map, const void* base, const Im2colDims& g, int pixels) {
  const int lower[2] = {g.lower_w, g.lower_h}, upper[2] = {g.upper_w, g.upper_h};
  for (int c : {lower[0], lower[1], upper[0], upper[1]})
    if (c < -128 || c > 127) return false;
  if (g.max_off_w > 255 || g.max_off_h > 255 || g.stride_w > 8 || g.stride_h > 8) return false;
  static const auto encode = driver_function<PFN_cuTensorMapEncodeIm2col_v12000>("cuTensorMapEncodeIm2col");
  const cuuint64_t es = sizeof(T);
  const cuuint64_t dims[4] = {cuuint64_t(g.c), cuuint64_t(g.w), cuuint64_t(g.h), cuuint64_t(g.n)};
  const cuuint64_t strides[3] = {es * g.c, es * g.c * g.w, es * g.c * g.w * g.h};
  const cuuint32_t elem_strides[4] = {1, cuuint32_t(g.stride_w), cuuint32_t(g.stride_h), 1};
  return encode(map, tensor_map_type<T>, 4, const_cast<void*>(base), dims, strides, lower, upper, 64,
                cuuint32_t(pixels), elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}
// The forward's and the weight gradient's map: x under the convolution itself, corners -pad and pad - span (span =
// dilation (K - 1), the farthest tap's offset; CUTLASS's make_im2col_tma_copy_desc uses the same corners).
template <typename T>
bool x_im2col_map(CUtensorMap* map, const void* x, const Dims& d, int pixels) {
  const int span_h = d.dh * (d.kh - 1), span_w = d.dw * (d.kw - 1);
  return im2col_map<T>(
      map, x, {d.n, d.h, d.w, d.cin, -d.ph, -d.pw, d.ph - span_h, d.pw - span_w, span_h, span_w, d.sh, d.sw}, pixels);
}

// f(Cfg{}) with the warp-specialized TMA tile of shape s: 4 stages of 48 KB, or 6 of 32 KB for 128 x 128; in
// clusters of two blocks sharing their B tiles where kMayMulticast and igemm_multicast() (the forward and the data
// gradient, whose B tiles are the weight's; the weight gradient's kernel has no clusters).
template <bool kMayMulticast, typename F>
void with_tma_ws_tile(WgShape s, F&& f) {
  auto with = [&](auto cluster) {
    constexpr int kCluster = decltype(cluster)::value;
    if (s == WgShape::m128n256) f(TmaWsTile<128, 256, 4, kCluster>{});
    else if (s == WgShape::m256n128) f(TmaWsTile<256, 128, 4, kCluster>{});
    else f(TmaWsTile<128, 128, 6, kCluster>{});
  };
  if (kMayMulticast && igemm_multicast()) with(std::integral_constant<int, 2>{});
  else with(std::integral_constant<int, 1>{});
}

// A K-slice's B tile of a TmaWsTile block, made of kParts bulk copies: copy(j, mask) issues part j with that
// multicast mask (wgmma.cuh's tma_load_2d / 3d; 0: into this block only). Without clusters the block copies every part;
// in a cluster each block copies its 1 / kCluster share of them into every block of the cluster.
template <typename Cfg, int kParts, typename Copy>
__device__ __forceinline__ void tma_ws_load_b(Copy&& copy) {
  static_assert(kParts % Cfg::kCluster == 0, "the blocks of a cluster share a B tile's copies equally");
  constexpr int kShare = kParts / Cfg::kCluster;
  const int first = Cfg::kCluster > 1 ? int(wgmma::cluster_rank()) * kShare : 0;
  const uint16_t mask = Cfg::kCluster > 1 ? uint16_t((1 << Cfg::kCluster) - 1) : uint16_t(0);
#pragma unroll
  for (int j = first; j < first + kShare; j++) copy(j, mask);
}

}  // namespace ops::cuda::conv::igemm
