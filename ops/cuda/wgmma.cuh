// cuda/wgmma.cuh: Hopper's warpgroup matrix multiply-accumulate (wgmma.mma_async, sm_90a only) for the
// tensor-core kernels: the shared-memory matrix descriptors, the ordering instructions, and
// D[64 x N] += A[64 x 16] B[16 x N] (N = 64, 128 or 256) with A and B in shared memory (or A in registers, N = 64 or
// 128), 16-bit inputs, f32 accumulators.
//
// A warpgroup (4 consecutive warps, the first a multiple of 4) issues the instruction together; it runs
// asynchronously on the tensor cores, reading A and B from shared memory through the "async proxy":
//   fence()       before the first wgmma, and after any ordinary instruction touched the accumulators;
//   commit()      closes a group of issued wgmmas;
//   wait<N>()     returns when at most N groups are still running (their accumulators are then valid, and
//                 the shared memory they read may be overwritten).
// Shared memory written by ordinary stores or cp.async must be made visible to the async proxy first:
// fence_proxy_async() in each writing thread (after its copies completed), then a barrier.
//
// Layout: each operand tile is rows (M for A, N for B) of 128 bytes of K (64 16-bit elements), 16-byte chunk c
// of row r stored at chunk c ^ (r % 8) (the 128-byte swizzle; conv_igemm.cuh's tile_chunk and
// mma_sync.cuh's swizzle produce exactly this), the tile 1024-byte aligned. desc_k128 describes such a
// tile to the tensor cores (K-major, 128-byte swizzle: 8-row groups 1024 bytes apart); the k-th 16-element
// step of a slice starts 32 k bytes further (the hardware applies the swizzle to the address it computes,
// which is why the tile must be aligned to the swizzle's 1024-byte period).
//
// MN-major operands (A stored [k][m], B [k][n]; 16-bit types only) come in panels of 64 columns: panel p holds
// columns 64p .. 64p + 63 as rows of k of 128 bytes (chunk c of k-row r at c ^ (r % 8)), the panels `panel_bytes`
// apart; desc_mn128 describes them (8-k-row groups 1024 bytes apart) and the k-th 16-row step starts 2048 k bytes
// further. The instruction transposes them (its trans-a / trans-b flags).
//
// Accumulators: thread t of the warpgroup (warp w = t / 32, g = lane / 4, tq = lane % 4) holds, for each
// 8-column block j < N / 8, d[4j .. 4j + 3] = D[16w + g][8j + 2tq, +1] and D[16w + g + 8][8j + 2tq, +1]:
// mma.sync's m16n8 fragment, per warp 16 rows.
//
// ENGINE_WGMMA is defined by the Makefile when the build targets sm_90a (CUDA_ARCHS holds 90a); the instructions
// exist only in that target's pass (__CUDA_ARCH_FEAT_SM90_ALL): in any other the functions below trap, and the
// host chooses kernels that use them only on a compute capability 9.0 device of such a build (available()).
#pragma once
#include <cuda.h>  // CUtensorMap (the type only: no driver library is linked)
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "engine/cuda/runtime.h"

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define ENGINE_WGMMA_DEVICE 1
#endif

namespace ops::cuda::wgmma {

// Whether kernels built on these instructions can run: the build targets sm_90a and the device is compute
// capability 9.0 (the convolutions' igemm_wgmma_available and the attention's forward_wgmma_available ask this).
inline bool available() {
#if defined(ENGINE_WGMMA)
  return engine::cuda::compute_capability() == 90;
#else
  return false;
#endif
}

// The descriptor of a tile with the 128-byte swizzle starting at shared address `addr` (bytes): 8-row groups
// 1024 bytes apart, `leading_bytes` between the MN-major panels (see above).
__device__ __forceinline__ uint64_t desc_mn128(uint32_t addr, uint32_t leading_bytes) {
  uint64_t d = uint64_t((addr & 0x3FFFF) >> 4);  // start address, 16-byte units
  d |= uint64_t(leading_bytes >> 4) << 16;          // leading-dimension offset
  d |= uint64_t(1024 >> 4) << 32;                   // stride-dimension offset: 8 rows of 128 bytes
  d |= uint64_t(1) << 62;                           // 128-byte swizzle
  return d;
}
// A K-major tile (the tile 1024-byte aligned, or 32 k bytes past such a start for k-step k): the leading-dimension
// offset is unused by this layout.
__device__ __forceinline__ uint64_t desc_k128(uint32_t addr) { return desc_mn128(addr, 16); }

#if defined(ENGINE_WGMMA_DEVICE)
#define ENGINE_WGMMA_ASM(...) asm volatile(__VA_ARGS__)
#else
#define ENGINE_WGMMA_ASM(...) __trap()
#endif

__device__ __forceinline__ void fence() { ENGINE_WGMMA_ASM("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void commit() { ENGINE_WGMMA_ASM("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wait() {
  ENGINE_WGMMA_ASM("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
__device__ __forceinline__ void fence_proxy_async() {
  ENGINE_WGMMA_ASM("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// The bulk tensor copy (TMA) and its mbarriers (shared-memory addresses in bytes, barriers 8-byte aligned):
// mbar_init with the arrivals of a phase, then fence_mbarrier_init and a block barrier before any copy uses it;
// mbar_expect_tx arrives and announces the bytes the phase's copies will deliver; tma_load_2d copies the box at
// (c0, c1) (elements, innermost first) of the tensor map into dst, completing those bytes on `bar` (tma_load_3d and
// tma_load_4d: a three- or four-dimensional map's box at (c0, c1, c2[, c3])); mbar_wait returns once the phase of the
// given parity has completed.
__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
  ENGINE_WGMMA_ASM("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void fence_mbarrier_init() {
  ENGINE_WGMMA_ASM("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
  ENGINE_WGMMA_ASM("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, int parity) {
  uint32_t done = 0;
  do {
    ENGINE_WGMMA_ASM(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap* map, int c0, int c1, uint32_t bar) {
  ENGINE_WGMMA_ASM(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n"
      ::"r"(dst), "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar)
      : "memory");
}

__device__ __forceinline__ void tma_load_3d(uint32_t dst, const CUtensorMap* map, int c0, int c1, int c2,
                                            uint32_t bar) {
  ENGINE_WGMMA_ASM(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], "
      "[%5];\n"
      ::"r"(dst), "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
      : "memory");
}

__device__ __forceinline__ void tma_load_4d(uint32_t dst, const CUtensorMap* map, int c0, int c1, int c2, int c3,
                                            uint32_t bar) {
  ENGINE_WGMMA_ASM(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], "
      "[%6];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
      : "memory");
}

// The registers per thread of the executing warpgroup raised / lowered to N (a multiple of 8, 24 to 256; sm_90a): a
// warp-specialized kernel moves the registers its producer warpgroup does not need to its consumers. It takes effect
// only in a kernel compiled with a register cap (__launch_bounds__(threads, 1)) whose roles are the two branches of one
// if/else (HOPPER.md); ptxas says so when it ignores it (warning C7508).
template <int N>
__device__ __forceinline__ void setmaxnreg_inc() {
  ENGINE_WGMMA_ASM("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() {
  ENGINE_WGMMA_ASM("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}

// Named block barriers (ids 1-15; 0 is __syncthreads') among `threads` threads, a multiple of 32, whole warps each:
// bar_sync waits until that many threads arrived (itself included), bar_arrive arrives without waiting (a producer
// signalling a consumer that syncs on the same id).
__device__ __forceinline__ void bar_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void bar_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// The im2col bulk tensor copy (a map made by cuTensorMapEncodeIm2col over an NHWC tensor, dims innermost first
// C, W, H, N): pixelsPerColumn consecutive output pixels (W fastest, then H, then N, inside the map's bounding box,
// `traversal strides` apart) of the channels c .. c + channelsPerPixel - 1, the pixel read at its coordinate plus
// (off_w, off_h); pixels outside the tensor read zeros. (w, h, n) is the first pixel's coordinate at offset 0.
__device__ __forceinline__ void tma_load_im2col_4d(uint32_t dst, const CUtensorMap* map, int c, int w, int h, int n,
                                                   uint16_t off_w, uint16_t off_h, uint32_t bar) {
  ENGINE_WGMMA_ASM(
      "cp.async.bulk.tensor.4d.shared::cluster.global.im2col.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, "
      "%5}], [%6], {%7, %8};\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c), "r"(w), "r"(h), "r"(n), "r"(bar), "h"(off_w), "h"(off_h)
      : "memory");
}
// One arrival on the barrier (its phase completes after `count` of them, mbar_init's).
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  ENGINE_WGMMA_ASM("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}

// The bulk reduction: dst[0 .. bytes / 4) += the f32 values at shared address src, by the async proxy, added to the
// thread's open bulk group (bytes a multiple of 16, both addresses 16-byte aligned); bulk_commit closes the group and
// bulk_wait_all returns once every group this thread committed has completed, its writes performed.
// fence_proxy_async_global orders this thread's generic-proxy accesses to global memory with its async-proxy ones (an
// acquire before a bulk operation, a bulk operation's completion before a release).
__device__ __forceinline__ void bulk_reduce_add_f32(float* dst, uint32_t src, uint32_t bytes) {
  ENGINE_WGMMA_ASM("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(dst), "r"(src),
                   "r"(bytes)
                   : "memory");
}
__device__ __forceinline__ void bulk_commit() { ENGINE_WGMMA_ASM("cp.async.bulk.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void bulk_wait_all() { ENGINE_WGMMA_ASM("cp.async.bulk.wait_group 0;\n" ::: "memory"); }
__device__ __forceinline__ void fence_proxy_async_global() {
  ENGINE_WGMMA_ASM("fence.proxy.async.global;\n" ::: "memory");
}

// A counter in global memory read with acquire / written with release semantics at the GPU's scope: the writes the
// writer made before the release are visible to a reader whose acquire saw the value.
__device__ __forceinline__ uint32_t load_acquire(const uint32_t* p) {
  uint32_t v = 0;
  ENGINE_WGMMA_ASM("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void store_release(uint32_t* p, uint32_t v) {
  ENGINE_WGMMA_ASM("st.release.gpu.global.u32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}

// Keeps the compiler from moving accesses to the accumulators across the asynchronous wgmma (CUTLASS's
// warpgroup_fence_operand).
template <int N>
__device__ __forceinline__ void fence_operands(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; i++) asm volatile("" : "+f"(d[i])::"memory");
}

// The inline-assembly operand lists: asm needs its operands numbered literally.
#define ENGINE_WGMMA_REGS_64                                                       \
  "{"                                                                              \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "         \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31" \
  "}"
#define ENGINE_WGMMA_ACC_64                                                                                   \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), \
      "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),  \
      "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), \
      "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define ENGINE_WGMMA_REGS_128 "{" \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, " \
  "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, " \
  "%40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, " \
  "%59, %60, %61, %62, %63" \
  "}"
#define ENGINE_WGMMA_ACC_128 \
      "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
      "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
      "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
      "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
      "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
      "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
      "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
      "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
#define ENGINE_WGMMA_REGS_256 "{" \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, " \
  "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, " \
  "%40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, " \
  "%59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, " \
  "%78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, " \
  "%97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, " \
  "%113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127" \
  "}"
#define ENGINE_WGMMA_ACC_256 \
      "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
      "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
      "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
      "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
      "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
      "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
      "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
      "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), \
      "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), \
      "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), \
      "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), \
      "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), \
      "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), \
      "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), \
      "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), \
      "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])

// D[64 x N] += A[64 x 16] B[16 x N], N = 2 * size of d; T is __nv_bfloat16 or __half; kTransA / kTransB: the
// operand is MN-major (desc_mn128), else K-major (desc_k128).
#define ENGINE_WGMMA_DEFINE(N, REGS, ACC, A, B, TA, TB)                                                         \
  template <typename T, int kTransA, int kTransB>                                                              \
  __device__ __forceinline__ void mma_m64k16(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b,              \
                                             std::integral_constant<int, N>) {                                 \
    if constexpr (std::is_same_v<T, __nv_bfloat16>)                                                            \
      ENGINE_WGMMA_ASM("wgmma.mma_async.sync.aligned.m64n" #N "k16.f32.bf16.bf16 " REGS ", %" #A ", %" #B       \
                       ", 1, 1, 1, %" #TA ", %" #TB ";\n"                                                      \
                       : ACC                                                                                   \
                       : "l"(desc_a), "l"(desc_b), "n"(kTransA), "n"(kTransB));                                \
    else                                                                                                       \
      ENGINE_WGMMA_ASM("wgmma.mma_async.sync.aligned.m64n" #N "k16.f32.f16.f16 " REGS ", %" #A ", %" #B        \
                       ", 1, 1, 1, %" #TA ", %" #TB ";\n"                                                      \
                       : ACC                                                                                   \
                       : "l"(desc_a), "l"(desc_b), "n"(kTransA), "n"(kTransB));                                \
  }
ENGINE_WGMMA_DEFINE(64, ENGINE_WGMMA_REGS_64, ENGINE_WGMMA_ACC_64, 32, 33, 34, 35)
ENGINE_WGMMA_DEFINE(128, ENGINE_WGMMA_REGS_128, ENGINE_WGMMA_ACC_128, 64, 65, 66, 67)
ENGINE_WGMMA_DEFINE(256, ENGINE_WGMMA_REGS_256, ENGINE_WGMMA_ACC_256, 128, 129, 130, 131)
#undef ENGINE_WGMMA_DEFINE

// D[64 x N] += A[64 x 16] B[16 x N] with A from registers: each warp of the warpgroup holds its 16 rows as
// mma.sync's m16n8k16 A fragment (a[0..3]: rows g / g + 8, k 2tq (+ 8), two 16-bit values per register), so an
// accumulator tile converted to 16-bit pairs (mma_sync.cuh's acc_to_a) feeds the next product without shared
// memory. B in shared memory as above (kTransB: MN-major).
#define ENGINE_WGMMA_RS_DEFINE(N, REGS, ACC, A0, A1, A2, A3, B, TB)                                                    \
  template <typename T, int kTransB>                                                                                   \
  __device__ __forceinline__ void mma_m64k16_rs(float(&d)[N / 2], const uint32_t(&a)[4], uint64_t desc_b,              \
                                                std::integral_constant<int, N>) {                                      \
    if constexpr (std::is_same_v<T, __nv_bfloat16>)                                                                    \
      ENGINE_WGMMA_ASM("wgmma.mma_async.sync.aligned.m64n" #N "k16.f32.bf16.bf16 " REGS ", {%" #A0 ", %" #A1 ", %" #A2 \
                       ", %" #A3 "}, %" #B ", 1, 1, 1, %" #TB ";\n"                                                    \
                       : ACC                                                                                           \
                       : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "n"(kTransB));                       \
    else                                                                                                               \
      ENGINE_WGMMA_ASM("wgmma.mma_async.sync.aligned.m64n" #N "k16.f32.f16.f16 " REGS ", {%" #A0 ", %" #A1 ", %" #A2   \
                       ", %" #A3 "}, %" #B ", 1, 1, 1, %" #TB ";\n"                                                    \
                       : ACC                                                                                           \
                       : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "n"(kTransB));                       \
  }
ENGINE_WGMMA_RS_DEFINE(64, ENGINE_WGMMA_REGS_64, ENGINE_WGMMA_ACC_64, 32, 33, 34, 35, 36, 37)
ENGINE_WGMMA_RS_DEFINE(128, ENGINE_WGMMA_REGS_128, ENGINE_WGMMA_ACC_128, 64, 65, 66, 67, 68, 69)
#undef ENGINE_WGMMA_RS_DEFINE
#undef ENGINE_WGMMA_ASM

}  // namespace ops::cuda::wgmma
