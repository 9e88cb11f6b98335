// cuda/dropout.h: the GPU kernel of dropout, with ops/cpu/dropout.h's contract: the same keep decision
// for every element (Philox from engine/rng.h, compared with p in double), so the masks agree bit for bit.
#pragma once
#include <cstdint>

#include "engine/tensor.h"

namespace ops::cuda {

// out[i] = philox_uniform(seed, offset, i / group) >= p ? x[i] / (1 - p) : 0, i the row-major element index of
// x (any strides); out contiguous with x's shape. group > 1: drop path (one draw per sample of `group` elements).
void dropout(const engine::Tensor& x, double p, uint64_t seed, uint64_t offset, const engine::Tensor& out,
             int64_t group = 1);

}  // namespace ops::cuda
