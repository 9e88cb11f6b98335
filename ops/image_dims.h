// image_dims.h: the sizes of an NHWC image op's larger and smaller tensor ([N, H, W, C] and [N, Ho, Wo, C]),
// which every pooling, upsampling and padding kernel (cpu and cuda) unpacks the same way.
#pragma once
#include <cstdint>

#include "engine/tensor.h"

namespace ops {

struct ImageDims {
  int64_t N, H, W, C;  // the input  [N, H, W, C]
  int64_t Ho, Wo;      // the output [N, Ho, Wo, C]
};

inline ImageDims image_dims(const engine::Tensor& input, const engine::Tensor& output) {
  return {input.size(0), input.size(1), input.size(2), input.size(3), output.size(1), output.size(2)};
}

}  // namespace ops
