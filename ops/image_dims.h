// image_dims.h: the sizes of an NHWC image op's larger and smaller tensor ([N, H, W, C] and [N, Ho, Wo, C]),
// which every pooling, upsampling and padding kernel (cpu and cuda) unpacks the same way.
#pragma once
#include <cstdint>

#include "engine/rng.h"  // ENGINE_HD
#include "engine/tensor.h"

namespace ops {

struct ImageDims {
  int64_t N, H, W, C;  // the input  [N, H, W, C]
  int64_t Ho, Wo;      // the output [N, Ho, Wo, C]
};

inline ImageDims image_dims(const engine::Tensor& input, const engine::Tensor& output) {
  return {input.size(0), input.size(1), input.size(2), input.size(3), output.size(1), output.size(2)};
}

// Element i of a contiguous [N, rows, cols, C] tensor as (n, row, col, c): the one-thread-per-element kernels'
// decode of the output ([N, Ho, Wo, C]) or of the input ([N, H, W, C]).
struct PixelIndex {
  int64_t n, h, w, c;
};
// Where every size fits 32 bits the decode runs in 32-bit arithmetic (a GPU's 64-bit division is a long
// software routine; this decode was most of the pooling kernels' time); the result is the same.
ENGINE_HD PixelIndex pixel_of(int64_t i, int64_t rows, int64_t cols, int64_t C) {
  if (uint64_t(i) <= UINT32_MAX && uint64_t(rows) * uint64_t(cols) <= UINT32_MAX && uint64_t(C) <= UINT32_MAX) {
    const uint32_t i32 = uint32_t(i), c32 = uint32_t(C), w32 = uint32_t(cols), h32 = uint32_t(rows);
    const uint32_t pix = i32 / c32, row = pix / w32, n = row / h32;
    return {int64_t(n), int64_t(row - n * h32), int64_t(pix - row * w32), int64_t(i32 - pix * c32)};
  }
  const int64_t pix = i / C;
  return {pix / (cols * rows), pix / cols % rows, pix % cols, i % C};
}

}  // namespace ops
