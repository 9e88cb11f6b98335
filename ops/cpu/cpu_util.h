// cpu_util.h: the helpers every CPU reference kernel uses: dtype dispatch and strided iteration.
//
// CPU kernels are the reference the CUDA kernels are tested against: plain loops written to be read.
// They are templated over the storage type T and compute in acc_t<T> (float, or double for f64), so bf16
// and f16 tensors are computed exactly as "load, convert to float, compute, round back".
#pragma once
#include <array>
#include <cstdint>
#include <vector>

#include "engine/dtype.h"
#include "engine/error.h"
#include "engine/tensor.h"

namespace ops::cpu {

using engine::acc_t;
using engine::DType;
using engine::Shape;
using engine::Tensor;

template <typename T> inline acc_t<T> ld(T v) { return static_cast<acc_t<T>>(v); }
template <typename T, typename A> inline T st(A v) { return static_cast<T>(static_cast<acc_t<T>>(v)); }

// ENGINE_FLOAT_SWITCH(dtype, T, { body using T })
#define ENGINE_FLOAT_SWITCH(dtype, T, ...)                                                             \
  switch (dtype) {                                                                                    \
    case ::engine::DType::f32: { using T = float; __VA_ARGS__; } break;                               \
    case ::engine::DType::f64: { using T = double; __VA_ARGS__; } break;                              \
    case ::engine::DType::bf16: { using T = ::engine::bf16; __VA_ARGS__; } break;                     \
    case ::engine::DType::f16: { using T = ::engine::f16; __VA_ARGS__; } break;                       \
    default: throw ::engine::Error(::engine::str("cpu kernel: dtype ", ::engine::dtype_name(dtype),   \
                                                 " is not a floating type"));                        \
  }

// ENGINE_ALL_SWITCH: floating types plus i32, i64, u8, bool (copies, fills, gathers).
#define ENGINE_ALL_SWITCH(dtype, T, ...)                                                               \
  switch (dtype) {                                                                                    \
    case ::engine::DType::f32: { using T = float; __VA_ARGS__; } break;                               \
    case ::engine::DType::f64: { using T = double; __VA_ARGS__; } break;                              \
    case ::engine::DType::bf16: { using T = ::engine::bf16; __VA_ARGS__; } break;                     \
    case ::engine::DType::f16: { using T = ::engine::f16; __VA_ARGS__; } break;                       \
    case ::engine::DType::i32: { using T = int32_t; __VA_ARGS__; } break;                             \
    case ::engine::DType::i64: { using T = int64_t; __VA_ARGS__; } break;                             \
    case ::engine::DType::u8: { using T = uint8_t; __VA_ARGS__; } break;                              \
    case ::engine::DType::boolean: { using T = uint8_t; __VA_ARGS__; } break;                         \
  }

// Visits every index of `shape` in row-major order, calling f(offsets) where offsets[k] is the element
// offset of that index in the k-th stride set (a stride of 0 broadcasts).
template <size_t K, typename F>
void for_each_index(const Shape& shape, const std::array<Shape, K>& strides, F&& f) {
  int64_t n = engine::numel_of(shape);
  if (n == 0) return;
  size_t nd = shape.size();
  std::vector<int64_t> idx(nd, 0);
  std::array<int64_t, K> off{};
  for (int64_t i = 0; i < n; i++) {
    f(off);
    for (int64_t d = int64_t(nd) - 1; d >= 0; d--) {
      if (++idx[d] < shape[d]) {
        for (size_t k = 0; k < K; k++) off[k] += strides[k][d];
        break;
      }
      for (size_t k = 0; k < K; k++) off[k] -= strides[k][d] * (shape[d] - 1);
      idx[d] = 0;
    }
  }
}

// f(i) for i in [0, n), on OpenMP threads when n is large enough to pay for them.
template <typename F>
void parallel_for(int64_t n, F&& f) {
#pragma omp parallel for if (n > (1 << 16))
  for (int64_t i = 0; i < n; i++) f(i);
}

// Strides of `t` seen through broadcasting to `shape` (0 where t has size 1 or lacks the dimension).
Shape broadcast_strides(const Tensor& t, const Shape& shape);

}  // namespace ops::cpu
