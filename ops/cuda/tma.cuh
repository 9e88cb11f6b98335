// cuda/tma.cuh: the host side of the bulk tensor copy (TMA, sm_90): the tensor maps that describe a global array to
// the copy engine, made through the driver's cuTensorMapEncode* functions (reached through the runtime: no driver
// library is linked). The device side (the copy instructions and their mbarriers) is wgmma.cuh's. Users: the
// implicit-GEMM convolutions (conv_igemm_tma.cuh) and the warp-specialized flash attention forward
// (attention_fwd_tma.cu).
#pragma once
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "engine/cuda/runtime.h"

namespace ops::cuda {

// A CUDA 12.0 driver function, through the runtime.
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

// The tensor map of a `rank`-dimensional (at most 5) array of 16-bit T (dims and box innermost first, the innermost
// contiguous; strides: the byte strides of dimensions 1 .. rank - 1, multiples of 16; base 16-byte aligned) for bulk
// copies of boxes whose innermost extent is 64 elements (128 bytes) into tiles of 128-byte rows with the 128-byte
// swizzle (16-byte chunk c of row r at chunk c ^ (r % 8): wgmma.cuh's layout); box elements past the array read zeros
// (and count toward the bytes a copy delivers).
template <typename T>
CUtensorMap swizzle128_map(const void* base, int rank, const cuuint64_t* dims, const cuuint64_t* strides,
                           const cuuint32_t* box) {
  static const auto encode = driver_function<PFN_cuTensorMapEncodeTiled_v12000>("cuTensorMapEncodeTiled");
  ENGINE_CHECK(rank >= 1 && rank <= 5, "swizzle128_map: rank ", rank, " (1 to 5)");
  CUtensorMap map;
  const cuuint32_t elem_strides[5] = {1, 1, 1, 1, 1};
  const CUtensorMapDataType type = tensor_map_type<T>;
  const CUresult r = encode(&map, type, cuuint32_t(rank), const_cast<void*>(base), dims, strides, box, elem_strides,
                            CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  ENGINE_CHECK(r == CUDA_SUCCESS, "cuTensorMapEncodeTiled failed (", int(r), ") for a ", rank, "-dimensional array (",
               dims[0], " innermost)");
  return map;
}

}  // namespace ops::cuda
