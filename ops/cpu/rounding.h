// cpu/rounding.h: arithmetic that rounds the same on the cpu and the GPU. nvcc contracts a * b + c into one fma
// (one rounding) unless told not to, gcc on x86-64 without -mfma does not: kernels whose cpu and cuda versions must
// agree bit for bit (roi_align, the detection ops) use these, ENGINE_HD so both compile the same lines.
#pragma once
#include "engine/rng.h"  // ENGINE_HD

namespace ops::cpu {

// a * b and a + b, each rounded once on every device (nvcc would otherwise contract a * b + c into an fma).
template <typename A>
ENGINE_HD A mul_rn(A a, A b) {
#ifdef __CUDA_ARCH__
  if constexpr (sizeof(A) == 4) {
    return __fmul_rn(a, b);
  } else {
    return __dmul_rn(a, b);
  }
#else
  return a * b;
#endif
}

template <typename A>
ENGINE_HD A add_rn(A a, A b) {
#ifdef __CUDA_ARCH__
  if constexpr (sizeof(A) == 4) {
    return __fadd_rn(a, b);
  } else {
    return __dadd_rn(a, b);
  }
#else
  return a + b;
#endif
}

template <typename A>
ENGINE_HD A sub_rn(A a, A b) {
  return add_rn(a, -b);
}

}  // namespace ops::cpu
