// cuda/attention_wgmma.cuh: what the flash attention kernels on Hopper's wgmma (attention_fwd_wgmma.cu,
// attention_bwd_wgmma.cu) share beside attention_common.cuh: their shared-memory tiles and the loops that issue a
// tile's products.
//
// A [rows, D] tile of 16-bit elements is D / 64 panels of 64 columns, each panel rows of 128 bytes with 16-byte chunk
// c of row r at chunk c ^ (r % 8) (the 128-byte swizzle of wgmma.cuh's descriptors; for D = 64 the same bytes as
// attention_common.cuh's swizzle<64>), panels rows * 128 bytes apart, the tile 1024-byte aligned.
#pragma once
#include <cstdint>
#include <type_traits>

#include "ops/cuda/attention_common.cuh"
#include "ops/cuda/wgmma.cuh"

namespace ops::cuda::attn {

constexpr int kPanel = 64;                  // columns of a panel
constexpr int kPanelRowBytes = kPanel * 2;  // bytes of a panel's row

// Element offset of 16-byte chunk `chunk` (of D / 8) of row `row` in a [kRows, D] panel tile.
template <int kRows>
__device__ __forceinline__ int panel_chunk(int row, int chunk) {
  return (chunk >> 3) * (kRows * kPanel) + row * kPanel + (((chunk & 7) ^ (row & 7)) << 3);
}

// Rows [row0, row0 + kRows) of a [L, D] matrix (row stride in elements) into a panel tile, 16 bytes per cp.async;
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

// Keeps the compiler from reusing registers an asynchronous wgmma still reads (its A fragments) until after its wait.
template <int N>
__device__ __forceinline__ void fence_fragments(uint32_t (&r)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; i++)
#pragma unroll
    for (int j = 0; j < 4; j++) asm volatile("" : "+r"(r[i][j])::"memory");
}

// A [N][4] array of accumulator fragments as the flat [4 N] array the wgmma wrappers take (the same registers:
// element 4 n + e of a wgmma accumulator is fragment n's element e, wgmma.cuh).
template <int N>
__device__ __forceinline__ float (&flat(float (&x)[N][4]))[4 * N] {
  return reinterpret_cast<float(&)[4 * N]>(x);
}

// The 1024-byte aligned start of the dynamic shared memory (the launch asks for 1 KB more).
__device__ __forceinline__ uint16_t* aligned_smem(uint16_t* raw) {
  return raw + ((1024 - (smem_addr(raw) & 1023)) & 1023) / 2;
}

// X[64, N] += A[64, 16 KS] B[16 KS, N] for this warpgroup, A and B K-major panel tiles: a_base / b_base are the
// shared addresses of the operands' first rows, a_rows / b_rows the rows of their tiles (the panels' heights).
template <typename T, int N, int KS, int kFloats>
__device__ __forceinline__ void issue_kmajor(float (&x)[kFloats], uint32_t a_base, int a_rows, uint32_t b_base,
                                             int b_rows) {
#pragma unroll
  for (int ks = 0; ks < KS; ks++) {
    const uint32_t off = uint32_t((ks % 4) * 32);  // the k16 step within its panel
    wgmma::mma_m64k16<T, 0, 0>(x, wgmma::desc_k128(a_base + uint32_t((ks / 4) * a_rows * kPanelRowBytes) + off),
                               wgmma::desc_k128(b_base + uint32_t((ks / 4) * b_rows * kPanelRowBytes) + off),
                               std::integral_constant<int, N>{});
  }
}

// X[64, N] += A[64, 16 KK] B[16 KK, N] with A from registers (k16 step kk in a[kk]) and B an MN-major panel tile of
// b_rows (= 16 KK) rows at b_base: k-step kk starts 2048 bytes (16 rows) further into every panel.
template <typename T, int N, int KK, int kFloats>
__device__ __forceinline__ void issue_rs(float (&x)[kFloats], const uint32_t (&a)[KK][4], uint32_t b_base, int b_rows) {
#pragma unroll
  for (int kk = 0; kk < KK; kk++)
    wgmma::mma_m64k16_rs<T, 1>(x, a[kk],
                               wgmma::desc_mn128(b_base + uint32_t(kk * 2048), uint32_t(b_rows * kPanelRowBytes)),
                               std::integral_constant<int, N>{});
}

// X = A1 B1 and Y = A2 B2 for this warpgroup, [64, N] each (the dK dV pass's S^T = K Q^T and dP^T = V dO^T, the dQ
// pass's S = Q K^T and dP = dO V^T): every operand a K-major panel tile (A's of a_rows rows, B's of b_rows), issued as
// one group and waited for; the accumulators then hold the products.
template <typename T, int N, int KS, int NT>
__device__ __forceinline__ void two_products(float (&x)[NT][4], float (&y)[NT][4], uint32_t x_a, uint32_t y_a,
                                             int a_rows, uint32_t x_b, uint32_t y_b, int b_rows) {
#pragma unroll
  for (int i = 0; i < NT; i++) x[i][0] = x[i][1] = x[i][2] = x[i][3] = y[i][0] = y[i][1] = y[i][2] = y[i][3] = 0.f;
  wgmma::fence_operands(flat(x));
  wgmma::fence_operands(flat(y));
  wgmma::fence();
  issue_kmajor<T, N, KS>(flat(x), x_a, a_rows, x_b, b_rows);
  issue_kmajor<T, N, KS>(flat(y), y_a, a_rows, y_b, b_rows);
  wgmma::commit();
  wgmma::wait<0>();
  wgmma::fence_operands(flat(x));
  wgmma::fence_operands(flat(y));
}

}  // namespace ops::cuda::attn
