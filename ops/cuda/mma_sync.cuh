// cuda/mma_sync.cuh: the tensor-core primitives of sm_80 and later that the flash attention and convolution kernels
// share: shared-memory addresses and the 16-byte-chunk swizzle, cp.async copies, ldmatrix, the m16n8k16 mma.sync
// (bf16 / f16, f32 accumulators), packing accumulators into 16-bit operand pairs, and the lanes' fragment addresses.
// (Hopper's warpgroup MMA and bulk tensor copies are wgmma.cuh's.)
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

namespace ops::cuda {

// Tiles of 16-bit elements live in shared memory as rows of D elements split in 16-byte chunks; chunk c of row r is
// stored at chunk c ^ (r % 8), so the 8 row addresses of one ldmatrix (8 rows, same logical chunk) hit 8 different
// bank groups: no bank conflicts.

template <int D>
__device__ __forceinline__ int swizzle(int row, int col) {  // col a multiple of 8 -> element offset
  return row * D + ((((col >> 3) ^ (row & 7))) << 3);
}

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared without registers; src_bytes 0 fills zeros (rows past the end).
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async4(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 4 : 0));
}
__device__ __forceinline__ void cp_async8(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 8 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// c[16x8] += a[16x16] b[16x8], f32 accumulators; T is __nv_bfloat16 or __half.
template <typename T>
__device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// Two floats as a packed pair of T (round to nearest even), low half = x.
template <typename T>
__device__ __forceinline__ uint32_t pack2(float x, float y) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    __nv_bfloat162 v = __floats2bfloat162_rn(x, y);
    return *reinterpret_cast<uint32_t*>(&v);
  } else {
    __half2 v = __floats2half2_rn(x, y);
    return *reinterpret_cast<uint32_t*>(&v);
  }
}

// The A operand of an m16n8k16 MMA from two neighbouring 16x8 accumulator tiles (n-tiles 2kk, 2kk+1):
// the accumulator layout of C is the register layout of A, so P or dS never leave registers.
template <typename T>
__device__ __forceinline__ void acc_to_a(const float (&lo)[4], const float (&hi)[4], uint32_t (&a)[4]) {
  a[0] = pack2<T>(lo[0], lo[1]);
  a[1] = pack2<T>(lo[2], lo[3]);
  a[2] = pack2<T>(hi[0], hi[1]);
  a[3] = pack2<T>(hi[2], hi[3]);
}

// Where a lane's ldmatrix row address points in a swizzled [rows, D] tile. Every fragment load of the
// kernels reads rows (multiple of 8) + a lane row whose low 3 bits are lane % 8, and a 16-column step k16
// at chunk 2*k16 + cbit; since 2*k16 and cbit are disjoint bits, the swizzled chunk is
// (2*k16) ^ (cbit ^ row % 8): the byte address is a per-lane base plus a constant row offset, XORed with a
// constant column offset. Unrolled loops then cost one add or XOR per load, not a register per address.
template <int D>
struct FragAddr {
  uint32_t base;  // tile address + lane row * row bytes
  uint32_t col;   // (cbit ^ lane row % 8) * 16 bytes
  __device__ __forceinline__ FragAddr(const uint16_t* tile, int lane_row, int cbit)
      : base(smem_addr(tile) + uint32_t(lane_row * D * 2)), col(uint32_t(((cbit ^ (lane_row & 7)) << 4))) {}
  // Rows row0 (a multiple of 8) + lane row, columns 16 * k16 + 8 * cbit.
  __device__ __forceinline__ uint32_t operator()(int row0, int k16) const {
    return base + uint32_t(row0 * D * 2) + (col ^ uint32_t(k16 << 5));
  }
};

// The three fragment shapes (mma16816's operand layouts):
//   A [16 rows, 16 k] from a row-major tile:            lane row = lane % 16,                  cbit = lane / 16
//   B [16 k, 8+8 n] from a tile stored [n, k] (K rows):  lane row = (lane/16)*8 + lane % 8,     cbit = (lane/8) % 2
//   B [16 k, 8+8 n] from a tile stored [k, n], .trans:  lane row = ((lane/8)%2)*8 + lane % 8,  cbit = lane / 16
template <int D>
__device__ __forceinline__ FragAddr<D> frag_a(const uint16_t* tile, int lane) {
  return FragAddr<D>(tile, lane & 15, lane >> 4);
}
template <int D>
__device__ __forceinline__ FragAddr<D> frag_b_rows(const uint16_t* tile, int lane) {
  return FragAddr<D>(tile, (lane >> 4) * 8 + (lane & 7), (lane >> 3) & 1);
}
template <int D>
__device__ __forceinline__ FragAddr<D> frag_b_trans(const uint16_t* tile, int lane) {
  return FragAddr<D>(tile, ((lane >> 3) & 1) * 8 + (lane & 7), lane >> 4);
}

}  // namespace ops::cuda
