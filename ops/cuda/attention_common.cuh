// cuda/attention_common.cuh: what every flash attention kernel shares: the argument struct (passed by value),
// the masks and the dropout keep test, the tiles' loads and stores and the backward's per-warp steps (the tensor-core
// primitives under them, cp.async, ldmatrix, mma.sync, are mma_sync.cuh's).
//
// The masks and the dropout are the cpu reference's (ops/cpu/attention.cpp), element for element:
//   query i sees key j  iff  j < Lk, not (causal and j > i + (Lk - Lq)), not key_padding_mask[b, j];
//   dropout keeps (b, h, i, j) iff dropout_bits(seed, offset, ((b*H + h)*Lq + i)*Lk + j) >= ceil(p * 2^16) and then
//   scales by 1 / (1 - p_q) (engine/rng.h: 16-bit draws, 8 per Philox block).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "engine/rng.h"
#include "ops/cuda/mma_sync.cuh"

namespace ops::cuda::attn {

// Element strides of a [B, H, L, D] tensor.
struct Strides {
  int64_t b = 0, h = 0, l = 0, d = 0;
};

// Everything a kernel reads; one struct for every pass (forward kernels ignore the backward's fields).
struct FlashArgs {
  const void* q = nullptr;   // [B, H, Lq, D]
  const void* k = nullptr;   // [B, H, Lk, D]
  const void* v = nullptr;   // [B, H, Lk, Dv]
  const uint8_t* pad = nullptr;  // [B, Lk] contiguous, true = padding; nullptr when there is no mask
  Strides qs, ks, vs;
  int B = 0, H = 0, Lq = 0, Lk = 0, D = 0, Dv = 0;
  bool causal = false;
  float scale = 1;        // the cpu's A(scale)
  double scale_f64 = 1;   // for f64 kernels
  float scale_log2 = 1;   // scale * log2(e): the tensor-core kernels use exp2
  bool dropout = false;
  uint32_t keep_threshold = 0;  // keep iff the 16-bit draw >= keep_threshold (engine::dropout_rate)
  float keep_scale = 1;         // 1 / (1 - p_q) as the cpu rounds it (A(rate.keep_scale))
  double keep_scale_f64 = 1;
  uint64_t seed = 0, offset = 0;
  // forward outputs
  void* out = nullptr;  // [B, H, Lq, Dv], unit-stride rows (strides outs: [B, Lq, H, Dv] after a head split)
  Strides outs;
  void* lse = nullptr;  // [B, H, Lq] f32 (f64 for f64) contiguous
  // backward
  const void* o = nullptr;     // forward output, [B, H, Lq, Dv] (strides os)
  const void* dout = nullptr;  // [B, H, Lq, Dv] (strides dos)
  Strides os, dos;
  const void* dlse = nullptr;  // [B, H, Lq] contiguous, or nullptr
  void* delta = nullptr;       // [B, H, Lq]
  void* dq = nullptr;          // [B, H, Lq, D], unit-stride rows (strides dqs), in q's layout
  void* dk = nullptr;          // [B, H, Lk, D] (dks), in k's layout
  void* dv = nullptr;          // [B, H, Lk, Dv] (dvs), in v's layout
  Strides dqs, dks, dvs;
  // dS kept (attention_bwd.cu): [B*H, ds_rows, ds_ld] of q's type, queries x keys, or nullptr (dQ recomputed)
  void* ds = nullptr;
  int64_t ds_rows = 0, ds_ld = 0;
  // dQ's f32 sums (ops/attention.h; attention_bwd_wgmma.cu): [B*H, Lq, D] and a turn counter per head and 64-row query
  // tile, [B*H, ceil(Lq / 64)], or nullptr (a dQ pass of its own)
  float* dq_sums = nullptr;
  uint32_t* dq_turns = nullptr;
  // The dropout keep bits (ops/attention.h): [B*H, Lq, keep_ld] bytes, bit j % 8 of byte j / 8 = key j kept. The
  // forward writes them (keep_out) as it draws; the Hopper backward reads them (keep_in) instead of drawing.
  // nullptr when not kept.
  uint8_t* keep_out = nullptr;
  const uint8_t* keep_in = nullptr;
  int keep_ld = 0;
};

// ---------------------------------------------------------------------------------------------------
// Masks and dropout

// Query i of head (b, h) sees key j.
__device__ __forceinline__ bool key_visible(const FlashArgs& a, const uint8_t* pad_row, int i, int j) {
  if (j >= a.Lk) return false;
  if (a.causal && j > i + (a.Lk - a.Lq)) return false;
  return !(pad_row && pad_row[j]);
}

// The unpadded keys of a batch row: [first, last] ([0, Lk - 1] without a mask; first > last when every key is
// padding), and whether every key between them is unpadded (dense: a right- or left-padded row). A block-wide
// scan of the row's Lk mask bytes: every thread of the block must call it.
struct UnpaddedKeys {
  int first, last;
  bool dense;
  // Keys k0 .. k0 + n - 1 include a padded one (or one outside [first, last]): the tile needs the padding mask.
  __device__ __forceinline__ bool padded_within(int k0, int n) const {
    return !(dense && k0 >= first && k0 + n - 1 <= last);
  }
};
__device__ __forceinline__ UnpaddedKeys unpadded_keys(const uint8_t* pad_row, int Lk) {
  if (!pad_row) return {0, Lk - 1, true};
  __shared__ int scan[3];  // first, last, count
  if (threadIdx.x == 0) scan[0] = Lk, scan[1] = -1, scan[2] = 0;
  __syncthreads();
  int f = Lk, l = -1, n = 0;
  for (int j = int(threadIdx.x); j < Lk; j += int(blockDim.x))
    if (!pad_row[j]) f = min(f, j), l = max(l, j), n++;
  f = __reduce_min_sync(0xffffffffu, f);
  l = __reduce_max_sync(0xffffffffu, l);
  n = __reduce_add_sync(0xffffffffu, n);
  if ((threadIdx.x & 31) == 0) atomicMin(&scan[0], f), atomicMax(&scan[1], l), atomicAdd(&scan[2], n);
  __syncthreads();
  return {scan[0], scan[1], scan[2] == scan[1] - scan[0] + 1};
}

// The first row of batch row b, head h of a [B, H, L, D] operand with strides s, as elements of type T (the
// tensor-core kernels read 16-bit elements as their bits).
template <typename T = uint16_t>
__device__ __forceinline__ const T* head_rows(const void* base, const Strides& s, int b, int h) {
  return static_cast<const T*>(base) + b * s.b + h * s.h;
}

// Batch row b's padding mask over the keys, or nullptr without one.
__device__ __forceinline__ const uint8_t* pad_row_of(const FlashArgs& a, int b) {
  return a.pad ? a.pad + int64_t(b) * a.Lk : nullptr;
}

// How many keys the query rows before q_end may see: Lk, or with causal masking (bottom-right: query i sees keys up
// to i + Lk - Lq) the limit of row q_end - 1.
__device__ __forceinline__ int visible_keys(const FlashArgs& a, int q_end) {
  return a.causal ? max(0, min(a.Lk, q_end + a.Lk - a.Lq)) : a.Lk;
}

// The key tiles [begin, end) of Bc keys the query block ending before row q_end walks (forward, dQ): up to its
// visible keys and, with a padding mask, only from the first unpadded key's tile to the last's. A
// padded key's score is -inf: its tile adds exactly nothing (the running max and sum unchanged, alpha = 1, P = 0;
// dS = 0), so skipping it changes no bit, and a batch row of short sequences costs its length rather than Lk.
// The dK dV pass skips the same key tiles (a tile outside [first, last]): their dK, dV are zero and their dS is
// never written, so dQ from dS must read no tile outside this range either. In a dense row only the tiles that
// hold its ends need the padding mask (keys.padded_within). Every thread must call it.
struct KeyTiles {
  int begin, end;
  UnpaddedKeys keys;
};
template <int Bc>
__device__ __forceinline__ KeyTiles key_tiles(const FlashArgs& a, const uint8_t* pad_row, int q_end) {
  const UnpaddedKeys keys = unpadded_keys(pad_row, a.Lk);
  return {keys.first / Bc, min((visible_keys(a, q_end) + Bc - 1) / Bc, (keys.last + Bc) / Bc), keys};
}

// Whether key tile [k0, k0 + Bc) needs masks for the query rows from q0 on: it reaches past Lk, holds padding inside
// the row's unpadded range, or crosses the causal limit of row q0 (the block's first and most restricted row).
template <int Bc>
__device__ __forceinline__ bool tile_needs_mask(const FlashArgs& a, const KeyTiles& tiles, const uint8_t* pad_row,
                                                int k0, int q0) {
  return k0 + Bc > a.Lk || (pad_row && tiles.keys.padded_within(k0, Bc)) ||
         (a.causal && k0 + Bc - 1 > q0 + a.Lk - a.Lq);
}

// The per-column half of the masks: whether each of a lane's score columns (keys k0 + 8 nt + 2 tq + e of its m16n8
// fragments) exists and is not padding.
template <int NT>
__device__ __forceinline__ void key_columns_ok(const FlashArgs& a, const uint8_t* pad_row, int k0, int tq,
                                               bool (&ok)[NT][2]) {
#pragma unroll
  for (int nt = 0; nt < NT; nt++)
#pragma unroll
    for (int e = 0; e < 2; e++) {
      const int j = k0 + nt * 8 + 2 * tq + e;
      ok[nt][e] = j < a.Lk && !(pad_row && pad_row[j]);
    }
}

// The query tiles [first, end) of Br rows that can see keys [k0, k0 + block_keys) (the dK dV passes): from the causal
// limit's tile on, none when the keys are outside the batch row's unpadded ones (key_tiles skips the same tiles:
// their dK and dV are zero, their dS columns unwritten). Every thread of the block must call it.
struct QueryTiles {
  int first, end;
};
template <int Br>
__device__ __forceinline__ QueryTiles query_tiles(const FlashArgs& a, const uint8_t* pad_row, int k0, int block_keys) {
  const UnpaddedKeys keys = unpadded_keys(pad_row, a.Lk);
  const int first = a.causal ? max(0, k0 - (a.Lk - a.Lq)) / Br : 0;
  return {first, k0 > keys.last || k0 + block_keys <= keys.first ? first : (a.Lq + Br - 1) / Br};
}

// Dropout keep test of the draw's element `flat` (engine/rng.h's 16-bit draw of element flat at a.offset).
__device__ __forceinline__ bool dropout_keep(const FlashArgs& a, uint64_t flat) {
  return engine::dropout_bits(a.seed, a.offset, flat) >= a.keep_threshold;
}

// The keep tests of elements flat and flat + 1 (neighbouring keys of one query), with one Philox block
// when both fall in it.
__device__ __forceinline__ void dropout_keep2(const FlashArgs& a, uint64_t flat, bool& keep0, bool& keep1) {
  const uint64_t half = 2 * a.offset + flat;  // position in 16-bit halves
  uint32_t r[4];
  engine::dropout_block(a.seed, half >> 3, r);
  const uint32_t h = uint32_t(half & 7);
  keep0 = engine::philox_half(r, h) >= a.keep_threshold;
  if (h == 7) {
    uint32_t r2[4];
    engine::dropout_block(a.seed, (half >> 3) + 1, r2);
    keep1 = engine::philox_half(r2, 0) >= a.keep_threshold;
  } else {
    keep1 = engine::philox_half(r, h + 1) >= a.keep_threshold;
  }
}

// The flat index of (b, h, i, j) in the [B, H, Lq, Lk] draw, for the head's (b*H + h).
__device__ __forceinline__ uint64_t dropout_index(const FlashArgs& a, int bh, int i, int j) {
  return (uint64_t(bh) * uint64_t(a.Lq) + uint64_t(i)) * uint64_t(a.Lk) + uint64_t(j);
}

// Shared draws. A Philox block gives the keep tests of 8 neighbouring keys j..j+7 of one query (j a multiple of 8)
// when the draw's blocks start on such keys: the generator offset a multiple of 4 and Lk a multiple of 8
// (dropout_blocks_aligned). The tensor-core kernels then draw each block once per warp: every lane draws one
// block, turns it into 8 keep bits (a byte) and the lanes that need each other's blocks gather the bytes by
// butterfly shuffles, instead of a block per element or pair (the Philox rounds' integer multiplies were most of
// a dropout step's attention time). Every lane of the warp must call these together.
__host__ __device__ __forceinline__ bool dropout_blocks_aligned(const FlashArgs& a) {
  return (a.offset & 3u) == 0 && (a.Lk & 7) == 0;
}

// How a tensor-core kernel draws its dropout: not at all, by shared draws (dropout_blocks_aligned), or each element
// on its own. Each is a kernel of its own: compiled together, the per-element path's registers made the shared
// path spill more (ptxas, bf16 forward at D = 64: 40 B of spill together, 20 B apart).
// A fourth mode, bits, is the Hopper kernels' alone: shared draws written to the keep bits a.keep_out (the forward,
// attention_fwd_wgmma.cu) or read from a.keep_in instead of drawn (the backward, attention_bwd_wgmma.cu).
enum class Drop { none, shared, each, bits };
inline Drop drop_mode(const FlashArgs& a) {
  return !a.dropout ? Drop::none : dropout_blocks_aligned(a) ? Drop::shared : Drop::each;
}
// Calls f(std::integral_constant<Drop, mode>) with a's mode.
template <typename F>
void with_drop_mode(const FlashArgs& a, F&& f) {
  switch (drop_mode(a)) {
    case Drop::none: f(std::integral_constant<Drop, Drop::none>{}); break;
    case Drop::shared: f(std::integral_constant<Drop, Drop::shared>{}); break;
    case Drop::each: f(std::integral_constant<Drop, Drop::each>{}); break;
  }
}

// The keep bits of the 8 elements flat .. flat + 7 (flat a multiple of 8 of an aligned draw): bit e = element e.
__device__ __forceinline__ uint32_t dropout_keep_byte(const FlashArgs& a, uint64_t flat) {
  uint32_t r[4];
  engine::dropout_block(a.seed, (2 * a.offset + flat) >> 3, r);
  // Bit 2w + k: half k of word w, engine::philox_half's order (written per word: the code the compiler makes of
  // philox_half in this loop differs, and this one is what was measured).
  uint32_t bits = 0;
#pragma unroll
  for (int w = 0; w < 4; w++) {
    bits |= uint32_t((r[w] & 0xffffu) >= a.keep_threshold) << (2 * w);
    bits |= uint32_t((r[w] >> 16) >= a.keep_threshold) << (2 * w + 1);
  }
  return bits;
}

// Bits 0, 1 of each byte of v, as bits 0..7.
__device__ __forceinline__ uint32_t low_pairs(uint32_t v) {
  return (v & 0x3u) | ((v >> 6) & 0xcu) | ((v >> 12) & 0x30u) | ((v >> 18) & 0xc0u);
}

// Two neighbouring m16n8 accumulator tiles with queries along their rows (n-tiles nt + t, t = 0, 1, keys
// j0 + 8 t .. + 7, j0 a multiple of 8): this lane's elements are rows i and i + 8 (h = 0, 1) and keys
// j0 + 8 t + 2 tq + e. The 4 lanes of a quad (tq = 0..3, one i) need the same 4 blocks (h, t): lane tq draws block
// (h, t) = (tq & 1, tq >> 1) into byte tq, and two xor shuffles give every lane all four bytes (dropout_keep_quad).
// The lane's 8 keep bits (keys 2 tq, 2 tq + 1 of each block) are then keep_rows_of(quad, tq): element (t, h, e) is
// bit row_keep_bit(t, h, e).
__device__ __forceinline__ uint32_t dropout_keep_quad(const FlashArgs& a, int bh, int i, int j0, int lane) {
  const int tq = lane & 3;
  uint32_t v = dropout_keep_byte(a, dropout_index(a, bh, i + 8 * (tq & 1), j0 + 8 * (tq >> 1))) << (8 * tq);
  v |= __shfl_xor_sync(0xffffffffu, v, 1);
  v |= __shfl_xor_sync(0xffffffffu, v, 2);
  return v;
}
__device__ __forceinline__ uint32_t keep_rows_of(uint32_t quad, int tq) { return low_pairs(quad >> (2 * tq)); }
__device__ __forceinline__ uint32_t dropout_keep_rows(const FlashArgs& a, int bh, int i, int j0, int lane) {
  return keep_rows_of(dropout_keep_quad(a, bh, i, j0, lane), lane & 3);
}
__host__ __device__ constexpr int row_keep_bit(int t, int h, int e) { return 2 * (h + 2 * t) + e; }

// The same 8 bits when the draw's blocks do not start on tile columns: each pair of keys drawn on its own.
__device__ __forceinline__ uint32_t dropout_keep_rows_each(const FlashArgs& a, int bh, int i, int j0, int lane) {
  const int tq = lane & 3;
  uint32_t bits = 0;
#pragma unroll
  for (int t = 0; t < 2; t++)
#pragma unroll
    for (int h = 0; h < 2; h++) {
      bool keep0, keep1;
      dropout_keep2(a, dropout_index(a, bh, i + 8 * h, j0 + 8 * t + 2 * tq), keep0, keep1);
      bits |= uint32_t(keep0) << row_keep_bit(t, h, 0) | uint32_t(keep1) << row_keep_bit(t, h, 1);
    }
  return bits;
}

// The transposed tile (dK, dV): keys along its rows (j0 + g + 8 h, j0 a multiple of 8), queries along its columns
// (n-tiles nt + t: queries i0 + 8 t + 2 tq + e). The 8 lanes of one tq (g = 0..7) need the same 8 blocks
// (t, h, e) (query i0 + 8 t + 2 tq + e, keys j0 + 8 h ..): lane g draws block (t, h, e) = (g >> 2, (g >> 1) & 1,
// g & 1) into byte g & 3 of a word per t, xor shuffles over g ^ 1 and g ^ 2 gather a t's four bytes and one over
// g ^ 4 fetches the other t's. Each lane keeps bit g (its key) of every byte: element (t, h, e) is bit
// col_keep_bit(t, h, e) of the 8 bits returned. keep_cols_from_byte gathers them from the lane's byte (keys
// j0 + keep_cols_key(lane) .. + 7 of query i0 + keep_cols_query(lane)), drawn here or read from the keep bits.
__device__ __forceinline__ int keep_cols_query(int lane) {
  return 8 * (lane >> 4) + 2 * (lane & 3) + ((lane >> 2) & 1);
}
__device__ __forceinline__ int keep_cols_key(int lane) { return 8 * ((lane >> 3) & 1); }
__device__ __forceinline__ uint32_t keep_cols_from_byte(uint32_t byte, int lane) {
  const int g = lane >> 2;
  uint32_t v = byte << (8 * (g & 3));
  v |= __shfl_xor_sync(0xffffffffu, v, 4);
  v |= __shfl_xor_sync(0xffffffffu, v, 8);
  const uint32_t other = __shfl_xor_sync(0xffffffffu, v, 16);
  const uint32_t w0 = g < 4 ? v : other, w1 = g < 4 ? other : v;  // the blocks of t = 0 and t = 1
  return low_pairs(((w0 >> g) & 0x01010101u) | (((w1 >> g) & 0x01010101u) << 1));
}
__device__ __forceinline__ uint32_t dropout_keep_cols(const FlashArgs& a, int bh, int i0, int j0, int lane) {
  return keep_cols_from_byte(
      dropout_keep_byte(a, dropout_index(a, bh, i0 + keep_cols_query(lane), j0 + keep_cols_key(lane))), lane);
}
__host__ __device__ constexpr int col_keep_bit(int t, int h, int e) { return 2 * (2 * h + e) + t; }

// The same 8 bits when the draw's blocks do not start on tile rows: each element drawn on its own.
__device__ __forceinline__ uint32_t dropout_keep_cols_each(const FlashArgs& a, int bh, int i0, int j0, int lane) {
  const int g = lane >> 2, tq = lane & 3;
  uint32_t bits = 0;
#pragma unroll
  for (int t = 0; t < 2; t++)
#pragma unroll
    for (int h = 0; h < 2; h++)
#pragma unroll
      for (int e = 0; e < 2; e++)
        bits |= uint32_t(dropout_keep(a, dropout_index(a, bh, i0 + 8 * t + 2 * tq + e, j0 + g + 8 * h)))
                << col_keep_bit(t, h, e);
  return bits;
}

// The keep bytes of N pairs of n-tiles (dropout_keep_rows or _cols, byte n = pair n), in registers when n is a
// compile-time constant (unrolled loops). The kernels draw a tile's bytes before its matrix products, while the
// score accumulators are not yet live: the draws depend on nothing the tile computes, and the Philox rounds then
// cost no registers the scores need.
template <int N>
struct KeepBytes {
  static_assert(N <= 8, "eight pairs of n-tiles at most");
  uint64_t w = 0;
  __device__ __forceinline__ void set(int n, uint32_t byte) { w |= uint64_t(byte) << (8 * n); }
  __device__ __forceinline__ bool operator()(int n, int bit) const { return (w >> (8 * n + bit)) & 1u; }
};

// ---------------------------------------------------------------------------------------------------
// Softmax and the tiles

// 2^x in one MUFU instruction (exp2f adds a denormal fix-up around it: 4 instructions). -inf gives +0;
// results below 2^-126 flush to 0, far under anything a probability in f32 or bf16 can hold.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Copies rows [row0, row0 + kRows) of a [L, D] head (row stride in elements) into a swizzled tile,
// 16 bytes per cp.async; rows at or past L become zeros (so masked or missing rows never hold NaN).
// Each thread copies one column chunk of every (kThreads / chunks)-th row: one pointer, one stride.
template <int kRows, int D, int kThreads>
__device__ __forceinline__ void load_tile_async(uint16_t* tile, const uint16_t* head, int64_t row_stride, int row0,
                                                int L) {
  constexpr int kChunks = D / 8, kRowStep = kThreads / kChunks;
  static_assert(kThreads % kChunks == 0 && kRowStep % 8 == 0 && kRows % kRowStep == 0, "tile loader shape");
  const int r0 = int(threadIdx.x) / kChunks, ch = int(threadIdx.x) % kChunks;
  const uint16_t* src = head + int64_t(row0 + r0) * row_stride + ch * 8;
  const int64_t step = int64_t(kRowStep) * row_stride;
  const uint32_t dst = smem_addr(tile + swizzle<D>(r0, ch * 8));
#pragma unroll
  for (int it = 0; it < kRows / kRowStep; it++) {
    const bool valid = row0 + r0 + it * kRowStep < L;
    cp_async16(dst + uint32_t(it * kRowStep * D * 2), valid ? src + it * step : head, valid);
  }
}

// The forward's output rows [q0, q0 + kRows) of head (b, h), staged in shared memory as a swizzled [kRows, D] tile of
// 16-bit values, to a.out (rows a.outs.l apart), 16 bytes per store; rows at or past Lq are not written.
template <int kRows, int D, int kThreads>
__device__ __forceinline__ void store_output_tile(const uint16_t* staged, const FlashArgs& a, int b, int h, int q0) {
  uint16_t* out = static_cast<uint16_t*>(a.out) + b * a.outs.b + h * a.outs.h;
  constexpr int kChunks = D / 8;
#pragma unroll
  for (int it = 0; it < (kRows * kChunks + kThreads - 1) / kThreads; it++) {
    const int c = it * kThreads + int(threadIdx.x);
    if (c >= kRows * kChunks) break;
    const int r = c / kChunks, ch = c % kChunks;
    if (q0 + r < a.Lq)
      *reinterpret_cast<uint4*>(out + int64_t(q0 + r) * a.outs.l + ch * 8) =
          *reinterpret_cast<const uint4*>(staged + swizzle<D>(r, ch * 8));
  }
}

// ---------------------------------------------------------------------------------------------------
// The backward's per-warp steps, shared by attention_bwd.cu's mma.sync kernels and attention_bwd_wgmma.cu's wgmma
// kernels (a warp's 16 rows of a wgmma accumulator are an mma.sync fragment: the same registers, the same code).
//
// dK dV passes hold a warp's transposed tile: 16 keys j0 + g + 8 half along its rows, NT * 8 queries
// i0 + 8 nt + 2 tq + e along its columns (element e + 2 half of fragment nt).

// Dropout's keep bits of the transposed tile (byte nt2: n-tiles 2 nt2, 2 nt2 + 1), drawn before its products.
template <bool kSharedDraw, int NT>
__device__ __forceinline__ void draw_keep_cols(const FlashArgs& a, int bh, int i0, int j0, int lane,
                                               KeepBytes<NT / 2>& keep) {
#pragma unroll
  for (int nt2 = 0; nt2 < NT / 2; nt2++)
    keep.set(nt2, kSharedDraw ? dropout_keep_cols(a, bh, i0 + nt2 * 16, j0, lane)  // a block per 8 elements
                              : dropout_keep_cols_each(a, bh, i0 + nt2 * 16, j0, lane));
}

// S^T and dP^T into (P Z)^T (in s) and dS^T = P (dP Z - delta) (in dp), P = exp(S scale - lse) with the masks:
// key_ok says whether each of the lane's keys is in range and unpadded; the causal limit is tested only where a key
// of the warp's tile is past a query's diagonal (a second copy of the loop). lse_t, delta_t: the query tile's values
// (lse in natural-log units).
template <bool kDropout, int NT>
__device__ __forceinline__ void dkdv_scores_to_ds(const FlashArgs& a, float (&s)[NT][4], float (&dp)[NT][4],
                                                  const KeepBytes<NT / 2>& keep_bits, const float* lse_t,
                                                  const float* delta_t, const bool (&key_ok)[2], int i0, int j0,
                                                  int lane) {
  constexpr float kLog2e = 1.4426950408889634f;
  const int g = lane / 4, tq = lane % 4;
  auto body = [&](auto causal_tile) {
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
      bool keep[4] = {true, true, true, true};
      if constexpr (kDropout) {
#pragma unroll
        for (int e = 0; e < 4; e++) keep[e] = keep_bits(nt / 2, col_keep_bit(nt % 2, e >> 1, e & 1));
      }
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const int half = e >> 1, col = nt * 8 + 2 * tq + (e & 1);
        float p = fast_exp2(s[nt][e] * a.scale_log2 - lse_t[col] * kLog2e);
        bool visible = key_ok[half];
        if constexpr (decltype(causal_tile)::value) {
          // key j = j0 + g + 8 half is past query i = i0 + col's diagonal
          visible = visible && j0 + g + half * 8 <= i0 + col + (a.Lk - a.Lq);
        }
        p = visible ? p : 0.f;
        const float z = kDropout ? (keep[e] ? a.keep_scale : 0.f) : 1.f;
        dp[nt][e] = p * (dp[nt][e] * z - delta_t[col]);  // dS^T
        s[nt][e] = p * z;                                // (P Z)^T
      }
    }
  };
  if (a.causal && j0 + 15 > i0 + (a.Lk - a.Lq))
    body(std::true_type{});
  else
    body(std::false_type{});
}

// dS [queries, keys] out, for the dQ pass: lane (g, tq) holds keys j (= g, g + 8) of queries i, i + 1; lanes g and
// g ^ 1 swap a value so that each stores two neighbouring keys of one query (4-byte stores). Every query row of the
// tile is written (zeros where masked or past Lq); a warp whose keys start past dS's columns (a block of keys that
// overhangs Lk rounded up to 64) writes nothing.
template <typename T, int NT>
__device__ __forceinline__ void store_ds_transposed(const FlashArgs& a, int bh, int i0, int j0, int lane,
                                                    const float (&ds)[NT][4]) {
  if (j0 >= a.ds_ld) return;  // (the whole warp: ds_ld is a multiple of 64, j0 of 16)
  const int g = lane / 4, tq = lane % 4;
  uint16_t* dsh = static_cast<uint16_t*>(a.ds) + int64_t(bh) * a.ds_rows * a.ds_ld;
  const bool odd = g & 1;
#pragma unroll
  for (int nt = 0; nt < NT; nt++)
#pragma unroll
    for (int half = 0; half < 2; half++) {
      const float lo = ds[nt][2 * half], hi = ds[nt][2 * half + 1];  // dS(i, j), dS(i + 1, j)
      const float other = __shfl_xor_sync(0xffffffffu, odd ? lo : hi, 4);
      const int i = i0 + nt * 8 + 2 * tq + (odd ? 1 : 0), j = j0 + half * 8 + (g & ~1);
      *reinterpret_cast<uint32_t*>(dsh + int64_t(i) * a.ds_ld + j) = odd ? pack2<T>(other, hi) : pack2<T>(lo, other);
    }
}

// A warp's dK = scale * dS^T Q and dV rows j0 .. j0 + 15 of head (b, h); rows past Lk are not written.
template <typename T, int DT>
__device__ __forceinline__ void store_dkdv(const FlashArgs& a, int b, int h, int j0, int lane, const float (&dk)[DT][4],
                                           const float (&dv)[DT][4]) {
  const int g = lane / 4, tq = lane % 4;
  uint16_t* dkh = static_cast<uint16_t*>(a.dk) + b * a.dks.b + h * a.dks.h;  // [Lk, D], rows dks.l apart
  uint16_t* dvh = static_cast<uint16_t*>(a.dv) + b * a.dvs.b + h * a.dvs.h;
#pragma unroll
  for (int half = 0; half < 2; half++) {
    const int j = j0 + g + half * 8;
    if (j >= a.Lk) continue;
#pragma unroll
    for (int dt = 0; dt < DT; dt++) {
      const int col = dt * 8 + 2 * tq;
      *reinterpret_cast<uint32_t*>(dkh + int64_t(j) * a.dks.l + col) =
          pack2<T>(dk[dt][2 * half] * a.scale, dk[dt][2 * half + 1] * a.scale);
      *reinterpret_cast<uint32_t*>(dvh + int64_t(j) * a.dvs.l + col) = pack2<T>(dv[dt][2 * half], dv[dt][2 * half + 1]);
    }
  }
}

// dQ passes hold a warp's tile with queries along its rows (row0 + g + 8 half) and keys k0 + 8 nt + 2 tq + e along
// its columns.

// Dropout's keep bits of a warp's [16, 8 NT] tile at rows row0 .., keys k0 .. (bytes first .. first + NT / 2 of keep:
// n-tiles 2 nt2, 2 nt2 + 1), drawn before its products. kWrite (the Hopper forward's Drop::bits: shared draws), the
// tile's bytes are also written to a.keep_out, NT bytes per row (keys k0 .. k0 + 8 NT; k0 a multiple of 8 NT): lanes
// tq = 0, 1 of each quad write rows row0 + g + 8 tq (rows past Lq: none; bytes past the keep bits' rows: none).
template <bool kSharedDraw, int NT, bool kWrite = false, int N>
__device__ __forceinline__ void draw_keep_rows(const FlashArgs& a, int bh, int row0, int k0, int lane,
                                               KeepBytes<N>& keep, int first = 0) {
  static_assert(!kWrite || kSharedDraw, "the keep bits are written from shared draws");
  const int i = row0 + lane / 4, tq = lane & 3;
  constexpr int kWords = (NT + 7) / 8;  // 8-byte words of a row's NT bytes (one 4-byte word when NT = 4)
  [[maybe_unused]] uint64_t row_bytes[kWords] = {};  // row i + 8 (tq & 1): bytes (i.e. keys k0 + 8 b ..) b = 0 .. NT
#pragma unroll
  for (int nt2 = 0; nt2 < NT / 2; nt2++) {
    if constexpr (kSharedDraw) {  // a block per 8 elements
      const uint32_t quad = dropout_keep_quad(a, bh, i, k0 + nt2 * 16, lane);
      keep.set(first + nt2, keep_rows_of(quad, tq));
      if constexpr (kWrite) {  // the row's bytes of blocks t = 0, 1
        const uint32_t two = __byte_perm(quad, 0, (tq & 1) ? 0x4431 : 0x4420);
        row_bytes[nt2 / 4] |= uint64_t(two) << (16 * (nt2 % 4));
      }
    } else {
      keep.set(first + nt2, dropout_keep_rows_each(a, bh, i, k0 + nt2 * 16, lane));
    }
  }
  if constexpr (kWrite) {
    const int row = i + 8 * tq;
    if (tq < 2 && row < a.Lq) {
      uint8_t* out = a.keep_out + (int64_t(bh) * a.Lq + row) * a.keep_ld + k0 / 8;
      if constexpr (NT == 4) {
        *reinterpret_cast<uint32_t*>(out) = uint32_t(row_bytes[0]);
      } else {
#pragma unroll
        for (int w = 0; w < kWords; w++)
          if (k0 / 8 + 8 * w < a.keep_ld) reinterpret_cast<uint64_t*>(out)[w] = row_bytes[w];
      }
    }
  }
}

// The same keep bits read from the forward's keep bits instead of drawn: `tile` is the [rows, NT] bytes of the
// warp's block's keys in shared memory (row stride ld bytes, the warp's rows from `row`, keys from byte `col`).
template <int NT, int N>
__device__ __forceinline__ void read_keep_rows(const uint8_t* tile, int ld, int row, int col, int lane,
                                               KeepBytes<N>& keep) {
  const int g = lane >> 2, tq = lane & 3;
  const uint8_t* r0 = tile + (row + g) * ld + col;
#pragma unroll
  for (int nt2 = 0; nt2 < NT / 2; nt2++) {  // rows i, i + 8: keys 16 nt2 .. (two bytes each)
    const uint32_t lo = *reinterpret_cast<const uint16_t*>(r0 + 2 * nt2);
    const uint32_t hi = *reinterpret_cast<const uint16_t*>(r0 + 8 * ld + 2 * nt2);
    keep.set(nt2, keep_rows_of(__byte_perm(lo, hi, 0x5140), tq));  // dropout_keep_quad's order
  }
}

// dS = P (dP Z - delta) into dp from S (in s) and dP, P = exp2(S scale log2e - lse2); lse2 (log2 units) and delta of
// the lane's two rows. Masks as the forward's (a per-column test and a per-row causal limit), in a second copy of
// the loop that only tiles with need_mask run.
template <bool kDropout, int NT>
__device__ __forceinline__ void dq_scores_to_ds(const FlashArgs& a, const float (&s)[NT][4], float (&dp)[NT][4],
                                                const KeepBytes<NT / 2>& keep_bits, const float (&lse2)[2],
                                                const float (&delta)[2], bool need_mask, const uint8_t* pad_row,
                                                int row0, int k0, int lane) {
  const int g = lane / 4, tq = lane % 4;
  auto body = [&](auto masked) {
    bool col_ok[NT][2];
    int last[2];  // last visible nt * 8 + e of each of the lane's rows
    if constexpr (decltype(masked)::value) {
      key_columns_ok(a, pad_row, k0, tq, col_ok);
#pragma unroll
      for (int half = 0; half < 2; half++)
        last[half] = a.causal ? row0 + g + half * 8 + a.Lk - a.Lq - k0 - 2 * tq : 0x7fffffff;
    }
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
      bool keep[4] = {true, true, true, true};  // keep[2 half + e]
      if constexpr (kDropout) {
#pragma unroll
        for (int e = 0; e < 4; e++) keep[e] = keep_bits(nt / 2, row_keep_bit(nt % 2, e >> 1, e & 1));
      }
#pragma unroll
      for (int half = 0; half < 2; half++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
          float p = fast_exp2(s[nt][2 * half + e] * a.scale_log2 - lse2[half]);
          if constexpr (decltype(masked)::value) {
            if (!col_ok[nt][e] || nt * 8 + e > last[half]) p = 0.f;
          }
          const float z = kDropout ? (keep[2 * half + e] ? a.keep_scale : 0.f) : 1.f;
          dp[nt][2 * half + e] = p * (dp[nt][2 * half + e] * z - delta[half]);
        }
    }
  };
  if (need_mask)
    body(std::true_type{});
  else
    body(std::false_type{});
}

// A warp's dQ rows row0 .. row0 + 15 of head (b, h), times the scale; rows past Lq are not written.
template <typename T, int DT>
__device__ __forceinline__ void store_dq(const FlashArgs& a, int b, int h, int row0, int lane,
                                         const float (&dq)[DT][4]) {
  const int g = lane / 4, tq = lane % 4;
  uint16_t* dqh = static_cast<uint16_t*>(a.dq) + b * a.dqs.b + h * a.dqs.h;  // [Lq, D], rows dqs.l apart
#pragma unroll
  for (int half = 0; half < 2; half++) {
    const int i = row0 + g + half * 8;
    if (i >= a.Lq) continue;
#pragma unroll
    for (int dt = 0; dt < DT; dt++)
      *reinterpret_cast<uint32_t*>(dqh + int64_t(i) * a.dqs.l + dt * 8 + 2 * tq) =
          pack2<T>(dq[dt][2 * half] * a.scale, dq[dt][2 * half + 1] * a.scale);
  }
}

// ---------------------------------------------------------------------------------------------------
// Launchers of each file (host). `variant` < 0 picks the default configuration; each returns false when
// the configuration does not exist for this head dim.
bool launch_forward_tensor_core(const FlashArgs& a, bool bf16, int variant);
// attention_fwd_wgmma.cu: the forward on Hopper's wgmma (a build for sm_90a on a compute capability 9.0 device; head
// dim 64 or 128), launch_forward_tensor_core's last kForwardWgmmaConfigs variants where available: config 0 plain,
// 1 with the products of consecutive key tiles overlapped (both copying with every thread), 2 and 3 the
// warp-specialized kernel of attention_fwd_tma.cu without and with that overlap; false when it cannot run.
constexpr int kForwardWgmmaConfigs = 4;
bool forward_wgmma_available();
bool launch_forward_wgmma(const FlashArgs& a, bool bf16, int config);
void launch_forward_tma(const FlashArgs& a, bool bf16, bool overlap);
bool launch_backward_tensor_core(const FlashArgs& a, bool bf16, int variant);
// attention_bwd_wgmma.cu: the backward on wgmma (where forward_wgmma_available; head dim 64 or 128), config 0 with a
// warpgroup per block, 1 with two: launch_backward_tensor_core's last two variants there; false when it cannot run.
bool launch_backward_wgmma(const FlashArgs& a, bool bf16, int config);
int forward_tensor_core_variants(int head_dim);
int backward_tensor_core_variants(int head_dim);
const char* forward_tensor_core_name(int head_dim, int variant);
const char* backward_tensor_core_name(int head_dim, int variant);
// delta = rowsum(dO * O) - dlse, any dtype and strides (both paths use it).
void launch_backward_delta(const FlashArgs& a, int dtype);
// The generic kernels; dtype is an engine::DType as int.
void launch_forward_generic(const FlashArgs& a, int dtype);
// The keep bits a.keep_out from the draw, by a kernel of their own (for the forwards that do not write them: all but
// the Hopper forward with shared draws).
void launch_keep_bits(const FlashArgs& a);
void launch_backward_generic(const FlashArgs& a, int dtype);
// attention_simt.cu: true fp32 at head dim 64 (rows of every operand 16-byte vectors, checked by the caller).
// simt_applies: D == Dv == 64. With dropout the kernels read the keep bits where kept (forward: a.keep_out, which
// launch_forward_simt reads after launch_keep_bits wrote it; backward: a.keep_in) and draw otherwise; the backward's
// dQ reads a.ds where kept and recomputes dS otherwise.
bool simt_applies(const FlashArgs& a);
void launch_forward_simt(const FlashArgs& a);
void launch_backward_simt(const FlashArgs& a);

}  // namespace ops::cuda::attn
