// cuda/convert.cuh: conversions between every dtype on the device, exactly as the CPU reference's casts
// make them, and the all-dtype switch (copies, fills, comparisons and random tensors take integer types too).
//
// The CPU loads element type T as acc_t<T> (float; double for f64, i32, i64: engine/dtype.h) and stores a
// value v as static_cast<T>(static_cast<acc_t<T>>(v)). ld() and st<T>() below are those two casts
// on the device, so a copy between any two dtypes gives the CPU's bits: bf16/f16 round to nearest even
// through float (never directly from double), integer stores truncate toward zero. kernel_util.cuh's
// to_acc/from_acc cover the floating types; these extend them to i32, i64, u8 and bool.
#pragma once
#include "ops/cuda/kernel_util.cuh"

namespace ops::cuda {

// What the CPU computes in for each storage type (engine::acc_t, with the device's bf16/f16 types).
template <typename T> struct CpuAcc { using type = float; };
template <> struct CpuAcc<double> { using type = double; };
template <> struct CpuAcc<int32_t> { using type = double; };
template <> struct CpuAcc<int64_t> { using type = double; };
template <typename T> using cpu_acc_t = typename CpuAcc<T>::type;

// ld(): a stored element as the CPU loads it (cpu_util.h's ld).
__device__ __forceinline__ float ld(float v) { return v; }
__device__ __forceinline__ double ld(double v) { return v; }
__device__ __forceinline__ float ld(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float ld(__half v) { return __half2float(v); }
__device__ __forceinline__ double ld(int32_t v) { return double(v); }
__device__ __forceinline__ double ld(int64_t v) { return double(v); }
__device__ __forceinline__ float ld(uint8_t v) { return float(v); }

// cast<D>(v): static_cast<D>(v) for v float or double, as the host compiles it (copies cast the loaded value).
template <typename D> struct Cast {
  template <typename A> __device__ static D to(A v) { return D(v); }  // float, double, i32, i64: plain casts
};
template <> struct Cast<__nv_bfloat16> {  // engine::bf16(float): through float, one rounding per step
  template <typename A> __device__ static __nv_bfloat16 to(A v) { return __float2bfloat16_rn(float(v)); }
};
template <> struct Cast<__half> {
  template <typename A> __device__ static __half to(A v) { return __float2half_rn(float(v)); }
};
// u8 and bool: x86 converts a float or double to a 32-bit integer and keeps its low byte; the same here, so
// in-range values agree bit for bit and out-of-range ones wrap alike.
template <> struct Cast<uint8_t> {
  template <typename A> __device__ static uint8_t to(A v) { return uint8_t(int32_t(v)); }
};
template <typename D, typename A> __device__ __forceinline__ D cast(A v) { return Cast<D>::to(v); }

// st<T>(v): static_cast<T>(static_cast<acc_t<T>>(v)), the CPU kernels' store.
template <typename T, typename A> __device__ __forceinline__ T st(A v) { return cast<T>(cpu_acc_t<T>(v)); }

// ENGINE_CUDA_ALL_SWITCH(dtype, T, { body }): every dtype, T its device storage type (bool is u8 storage).
#define ENGINE_CUDA_ALL_SWITCH(dtype, T, ...)                                                            \
  switch (dtype) {                                                                                    \
    case ::engine::DType::f32: { using T = float; __VA_ARGS__; } break;                               \
    case ::engine::DType::f64: { using T = double; __VA_ARGS__; } break;                              \
    case ::engine::DType::bf16: { using T = __nv_bfloat16; __VA_ARGS__; } break;                      \
    case ::engine::DType::f16: { using T = __half; __VA_ARGS__; } break;                              \
    case ::engine::DType::i32: { using T = int32_t; __VA_ARGS__; } break;                             \
    case ::engine::DType::i64: { using T = int64_t; __VA_ARGS__; } break;                             \
    case ::engine::DType::u8: { using T = uint8_t; __VA_ARGS__; } break;                              \
    case ::engine::DType::boolean: { using T = uint8_t; __VA_ARGS__; } break;                         \
  }

}  // namespace ops::cuda
