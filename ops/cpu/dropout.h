// cpu/dropout.h: CPU reference kernel of dropout (the mask is drawn from Philox, never stored).
#pragma once
#include <cstdint>

#include "engine/tensor.h"

namespace ops::cpu {

// out[i] = dropout_bits(seed, offset, i / group) >= threshold ? x[i] * keep_scale : 0 (engine::dropout_rate(p)), i
// the row-major element index of x (any strides); out contiguous with x's shape. group 1: dropout; group = the
// elements of one sample (x's numel over its first dimension): drop path, one draw per sample.
void dropout(const engine::Tensor& x, double p, uint64_t seed, uint64_t offset, const engine::Tensor& out,
             int64_t group = 1);

}  // namespace ops::cpu
