// cuda/attention_wgmma.cuh: what the flash attention kernels on Hopper's wgmma (attention_fwd_wgmma.cu,
// attention_bwd_wgmma.cu) share beside attention_common.cuh: their shared-memory tiles and the loops that issue a
// tile's products.
//
// A [rows, D] tile of 16-bit elements is D / 64 panels of 64 columns, each panel rows of 128 bytes with 16-byte chunk
// c of row r at chunk c ^ (r % 8) (the 128-byte swizzle of wgmma.cuh's descriptors; for D = 64 the same bytes as
// attention_common.cuh's swizzle<64>), panels rows * 128 bytes apart, the tile 1024-byte aligned.
#pragma once
#include <cmath>
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
// one group and waited for (`meanwhile()` runs while the tensor cores work); the accumulators then hold the products.
template <typename T, int N, int KS, int NT, typename Meanwhile>
__device__ __forceinline__ void two_products(float (&x)[NT][4], float (&y)[NT][4], uint32_t x_a, uint32_t y_a,
                                             int a_rows, uint32_t x_b, uint32_t y_b, int b_rows,
                                             Meanwhile&& meanwhile) {
#pragma unroll
  for (int i = 0; i < NT; i++) x[i][0] = x[i][1] = x[i][2] = x[i][3] = y[i][0] = y[i][1] = y[i][2] = y[i][3] = 0.f;
  wgmma::fence_operands(flat(x));
  wgmma::fence_operands(flat(y));
  wgmma::fence();
  issue_kmajor<T, N, KS>(flat(x), x_a, a_rows, x_b, b_rows);
  issue_kmajor<T, N, KS>(flat(y), y_a, a_rows, y_b, b_rows);
  wgmma::commit();
  meanwhile();
  wgmma::wait<0>();
  wgmma::fence_operands(flat(x));
  wgmma::fence_operands(flat(y));
}

// Host: calls go(std::integral_constant<Drop, mode>) for a Hopper forward kernel of a's dropout mode. The keep bits
// (a.keep_out: the op keeps them only with shared draws) are written as they are drawn (Drop::bits); otherwise, if
// asked for, by their own kernel after the forward.
template <typename Go>
void with_forward_drop_mode(const FlashArgs& a, Go&& go) {
  if (a.keep_out && drop_mode(a) == Drop::shared) {
    go(std::integral_constant<Drop, Drop::bits>{});
    return;
  }
  with_drop_mode(a, go);
  if (a.keep_out) launch_keep_bits(a);
}
// Host: go(T{}, drop) for a Hopper forward kernel: T __nv_bfloat16 (bf16) or __half, drop as with_forward_drop_mode.
template <typename Go>
void with_forward_type_and_drop(const FlashArgs& a, bool bf16, Go&& go) {
  with_forward_drop_mode(a, [&](auto drop) {
    if (bf16)
      go(__nv_bfloat16{}, drop);
    else
      go(__half{}, drop);
  });
}

// ---------------------------------------------------------------------------------------------------
// The forward's per-warp steps on a key tile, shared by the wgmma forwards (attention_fwd_wgmma.cu, whose threads
// copy the tiles, and attention_fwd_tma.cu, whose producer warp does): a warp holds 16 query rows of a warpgroup's
// [64, Bc] scores, s[4 nt + e] being attention_fwd.cu's s[0][nt][e] (rows row0 + g + 8 (e >> 1), keys k0 + 8 nt +
// 2 tq + (e & 1)), and the same rows of the [64, D] output, o[4 dt + e].

// Dropout's keep bits of the warp's tile at rows row0 .., keys k0 .. (byte nt2: n-tiles 2 nt2, 2 nt2 + 1), drawn before
// its scores; Drop::bits also writes them to a.keep_out.
template <Drop kDrop, int NT>
__device__ __forceinline__ void draw_keep_tile(const FlashArgs& a, int bh, int row0, int k0, int lane,
                                               KeepBytes<NT / 2>& keep) {
  if constexpr (kDrop != Drop::none)
    draw_keep_rows<kDrop == Drop::shared || kDrop == Drop::bits, NT, kDrop == Drop::bits>(a, bh, row0, k0, lane, keep);
}

// The tile's scores (computed) into probabilities in place: masked (when the tile needs it: tile_needs_mask for the
// block's first row q0), the running max and sum of the lane's two rows updated, dropout applied after the sum (l
// counts every probability); alpha: each row's rescaling of the output, which the caller applies once no product
// writes it. Each row lives in the 4 lanes of a quad (attention_fwd.cu's online softmax).
template <bool kDropout, int Bc>
__device__ __forceinline__ void online_softmax(const FlashArgs& a, const KeyTiles& tiles, const uint8_t* pad_row,
                                               int q0, int row0, int k0, int lane, float (&s)[Bc / 2],
                                               const KeepBytes<Bc / 16>& keep, float (&row_max)[2], float (&row_sum)[2],
                                               float (&alpha)[2]) {
  constexpr int NT = Bc / 8;
  const int g = lane / 4, tq = lane % 4;
  if (tile_needs_mask<Bc>(a, tiles, pad_row, k0, q0)) {
    bool col_ok[NT][2];
    key_columns_ok(a, pad_row, k0, tq, col_ok);
#pragma unroll
    for (int half = 0; half < 2; half++) {
      const int i = row0 + g + half * 8;
      const int last = a.causal ? i + a.Lk - a.Lq - k0 - 2 * tq : 0x7fffffff;  // last visible nt*8 + e
#pragma unroll
      for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int e = 0; e < 2; e++)
          if (!col_ok[nt][e] || nt * 8 + e > last) s[4 * nt + 2 * half + e] = -INFINITY;
    }
  }
#pragma unroll
  for (int half = 0; half < 2; half++) {
    float mx = row_max[half];
#pragma unroll
    for (int nt = 0; nt < NT; nt++) mx = fmaxf(mx, fmaxf(s[4 * nt + 2 * half], s[4 * nt + 2 * half + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float base = mx == -INFINITY ? 0.f : mx * a.scale_log2;
    alpha[half] = fast_exp2(row_max[half] * a.scale_log2 - base);
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
    row_sum[half] = row_sum[half] * alpha[half] + sum;
  }
  if constexpr (kDropout) {
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
      for (int e = 0; e < 4; e++)
        s[4 * nt + e] *= keep(nt / 2, row_keep_bit(nt % 2, e >> 1, e & 1)) ? a.keep_scale : 0.f;
  }
}

// P (the probabilities in S's registers) packed to 16 bits as P V's A fragment (acc_to_a's packing): P's k16 step kk
// is n-tiles 2 kk, 2 kk + 1 of S.
template <typename T, int Bc>
__device__ __forceinline__ void pack_p(const float (&s)[Bc / 2], uint32_t (&pa)[Bc / 16][4]) {
#pragma unroll
  for (int kk = 0; kk < Bc / 16; kk++) {
    pa[kk][0] = pack2<T>(s[8 * kk], s[8 * kk + 1]);
    pa[kk][1] = pack2<T>(s[8 * kk + 2], s[8 * kk + 3]);
    pa[kk][2] = pack2<T>(s[8 * kk + 4], s[8 * kk + 5]);
    pa[kk][3] = pack2<T>(s[8 * kk + 6], s[8 * kk + 7]);
  }
}

// The output rows times their alpha (online_softmax's).
template <int D>
__device__ __forceinline__ void rescale_rows(float (&o)[D / 2], const float (&alpha)[2]) {
#pragma unroll
  for (int dt = 0; dt < D / 8; dt++)
#pragma unroll
    for (int half = 0; half < 2; half++) {
      o[4 * dt + 2 * half] *= alpha[half];
      o[4 * dt + 2 * half + 1] *= alpha[half];
    }
}

// The end of a wgmma forward's rows, for the lane's two rows of its warp's 16 (warp_row: the first, in the tile of
// query q0): out = O / l (o: the thread's share of the warpgroup's [64, D] fragment; l summed over the quad) as T into
// the staging tile at chunk(r, dt), row r's 8 columns dt .. (each kernel's own layout), and lse = m scale + log(l)
// into a.lse. A row that saw no key (l = 0): out 0, lse +inf (attention_fwd.cu's).
template <typename T, int D, typename Chunk>
__device__ __forceinline__ void stage_output_rows(const FlashArgs& a, int bh, int q0, int warp_row, const float* o,
                                                  const float (&row_max)[2], const float (&row_sum)[2],
                                                  uint16_t* staged, Chunk&& chunk) {
  const int lane = int(threadIdx.x % 32), g = lane / 4, tq = lane % 4;
  float* lse = static_cast<float*>(a.lse) + int64_t(bh) * a.Lq;
  float inv[2], row_lse[2];
#pragma unroll
  for (int half = 0; half < 2; half++) {
    float l = row_sum[half];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    inv[half] = l > 0.f ? 1.f / l : 0.f;
    row_lse[half] = l > 0.f ? row_max[half] * a.scale + logf(l) : INFINITY;
  }
#pragma unroll
  for (int half = 0; half < 2; half++) {
    const int r = warp_row + g + half * 8;
#pragma unroll
    for (int dt = 0; dt < D / 8; dt++)
      *reinterpret_cast<uint32_t*>(staged + chunk(r, dt) + 2 * tq) =
          pack2<T>(o[4 * dt + 2 * half] * inv[half], o[4 * dt + 2 * half + 1] * inv[half]);
    if (tq == 0 && q0 + r < a.Lq) lse[q0 + r] = row_lse[half];
  }
}

}  // namespace ops::cuda::attn
