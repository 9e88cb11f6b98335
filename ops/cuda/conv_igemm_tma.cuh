// cuda/conv_igemm_tma.cuh: the implicit-GEMM convolutions' bulk tensor copies (TMA, sm_90a): the tensor maps the
// host makes for them (a plain array's tiles: k128_tile_map, over tma.cuh's swizzle128_map; an NHWC tensor's im2col
// boxes: im2col_map, x_im2col_map), and the warp-specialized main loop they feed (TmaWsTile, tma_ws_gemm_tile: a
// producer warp issues the copies, two consumer warpgroups run the wgmmas of conv_igemm.cuh). The wgmma loop whose
// threads copy with cp.async (and its weight tiles by the bulk copy) stays in conv_igemm.cuh.
#pragma once
#include "ops/cuda/conv_igemm.cuh"
#include "ops/cuda/tma.cuh"

namespace ops::cuda::conv::igemm {

// Hopper's warp-specialized main loop, both operands by the bulk tensor copy (TMA): A [m][k] and B [n][k] tiles of
// 128-byte rows with the 128-byte swizzle, as in wgmma_gemm_tile. Warps 0-7 are two consumer warpgroups running the
// wgmmas of a BM x BN tile (each BM / 2 rows); warp 8 is the producer, whose first lane issues slice kt's copies
// (produce(kt, a, b, bar): shared addresses of the stage's A and B tiles, and the barrier the copies complete on) into
// stage kt % kStages as soon as the consumers released it. A consumer warp releases a stage (one arrival on its
// `empty` barrier) once the wgmmas that read it are done. The loop has no block barrier and the consumers compute no
// addresses: the copies run up to kStages - 1 slices ahead of the tensor cores, whatever the consumers are doing.
// (ncu of wgmma_gemm_tile, where every thread copies with cp.async: tensor pipe ~49%, latency-bound on the copies'
// address arithmetic and the barrier per K-slice.) Measured on the H200 (2026-12-05, ConvCudaPerf bf16, Darknet 3x3
// 128->256 152^2): forward / data / weight 529 / 522 / 378 TFLOP/s against 493 / 324 / 261 with x by cp.async.
// What bounds it (ncu, H100, 2026-12-05, 128 x 128 tiles): tensor pipe active half the SMs' cycles, the consumers
// waiting on the full barriers, the tiles out of L2 (94% hits) at ~5.3 TB/s; per FLOP the 128 x 256 tile beats
// 128 x 128 by about the ratio of their bytes per FLOP, so the working hypothesis was L2-to-SM bandwidth. Two
// attempts measured and dropped (BENCHMARKS.md, 2026-12-05): persistent blocks (one per SM looping over tiles, the
// next tile's copies during the epilogue) gained nothing at 152^2 and lost 5-10% on small layers; clusters of two
// blocks sharing each weight tile's copy (TMA multicast, a third fewer bytes from L2 at 128 x 256) lost 0-12% on every
// shape of the perf test (Darknet 128->256 152^2 forward 515 -> 455, data 506 -> 468 TFLOP/s on the H100).
// Beside cuDNN (ncu, 2026-12-07, Darknet 128->256 152^2 forward, bf16; BENCHMARKS.md): this kernel at 128 x 256 keeps
// the tensor pipe busy 57.8% of the cycles and moves 1.49 GB through L2; cuDNN's 79.9% and 0.82 GB, with persistent
// blocks of three warpgroups in clusters of 8 (its 128 x 128 tiles shared through multicast) and, by its name, one
// consumer warpgroup per tile in turn (ping-pong). The stall profiles look alike (barrier and copy-scoreboard waits
// lead in both), so what separates them is bytes per FLOP and the epilogue beside the products, not one stall.
template <int BM_, int BN_, int kStages_>
struct TmaWsTile {
  using Elem = uint16_t;
  static constexpr bool kTf32 = false, kWgmma = true;
  static constexpr int kVec = 8, kU = 1;
  static constexpr int BM = BM_, BN = BN_, BK = 64;
  static constexpr int kMT = BM / 128;  // m64 blocks per consumer warpgroup
  static constexpr int kStages = kStages_;
  static constexpr int kConsumerWarps = 8, kThreads = 32 * kConsumerWarps + 32;  // + the producer warp
  static constexpr int kAElems = BM * BK, kBElems = BN * BK;
  static constexpr int kStageElems = kAElems + kBElems;
  static constexpr uint32_t kStageTxBytes = uint32_t(kStageElems) * 2;  // what a stage's copies deliver
  // The stages, the full and empty barriers (8 bytes each) and the slack to align to 1024 bytes.
  static constexpr int kSmemBytes = kStages * kStageElems * 2 + 2 * kStages * 8 + 1024;
  using Acc = float[kMT][BN / 2];
  static_assert(BM == 128 || BM == 256, "a consumer warpgroup's rows are one or two m64 blocks");
  static_assert(BN == 128 || BN == 256, "wgmma.cuh has n = 128 and 256");
  static_assert(kSmemBytes <= 227 * 1024, "an SM has 227 KB of shared memory for a block");
};

// kAKM / kBKN: A is [k][m] / B is [k][n] in MN-major panels of 64 columns (wgmma_gemm_tile's kn_chunk layout: a
// bulk copy of a box of 64 channels x 64 pixels is exactly one panel), else [m][k] / [n][k].
template <typename Cfg, typename T, bool kAKM, bool kBKN, typename Produce, typename Store>
__device__ __forceinline__ void tma_ws_gemm_tile(Produce&& produce, int k_tiles, uint16_t* smem_raw, Store&& store) {
  constexpr int kStages = Cfg::kStages, kStageElems = Cfg::kStageElems, kAElems = Cfg::kAElems, BN = Cfg::BN;
  constexpr int kMT = Cfg::kMT;
  uint16_t* smem = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023) / 2;  // the swizzle's period
  const uint32_t tiles = smem_addr(smem), full = smem_addr(smem + kStages * kStageElems), empty = full + 8 * kStages;
  const int warp = int(threadIdx.x / 32), lane = int(threadIdx.x % 32);
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; s++) {
      wgmma::mbar_init(full + 8 * s, 1);                     // the producer's arrival (with the bytes it expects)
      wgmma::mbar_init(empty + 8 * s, Cfg::kConsumerWarps);  // one arrival per consumer warp
    }
    wgmma::fence_mbarrier_init();
  }
  __syncthreads();
  if (warp == Cfg::kConsumerWarps) {  // the producer
    if (lane == 0) {
      for (int kt = 0; kt < k_tiles; kt++) {
        const int s = kt % kStages;
        if (kt >= kStages) wgmma::mbar_wait(empty + 8 * s, (kt / kStages - 1) & 1);  // slice kt - kStages released
        wgmma::mbar_expect_tx(full + 8 * s, Cfg::kStageTxBytes);
        const uint32_t a = tiles + uint32_t(s * kStageElems * 2);
        produce(kt, a, a + uint32_t(kAElems * 2), full + 8 * s);
      }
    }
    return;
  }
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
    if (kt > 0 && lane == 0) wgmma::mbar_arrive(empty + 8 * ((kt - 1) % kStages));
  }
  wgmma::wait<0>();
#pragma unroll
  for (int mi = 0; mi < kMT; mi++) wgmma::fence_operands(acc[mi]);
  wgmma_for_each_pair<Cfg>(acc, store);
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

// f(Cfg{}) with the warp-specialized TMA tile of shape s: 4 stages of 48 KB, or 6 of 32 KB for 128 x 128.
template <typename F>
void with_tma_ws_tile(WgShape s, F&& f) {
  if (s == WgShape::m128n256)
    f(TmaWsTile<128, 256, 4>{});
  else if (s == WgShape::m256n128)
    f(TmaWsTile<256, 128, 4>{});
  else
    f(TmaWsTile<128, 128, 6>{});
}

}  // namespace ops::cuda::conv::igemm
