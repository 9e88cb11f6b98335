// cuda/dropout.h: the GPU kernel of dropout, with ops/cpu/dropout.h's contract: the same keep decision
// for every element (engine/rng.h's 16-bit dropout draws against the same threshold), so the masks agree bit for
// bit.
#pragma once
#include <cstdint>

#include "engine/tensor.h"

namespace ops::cuda {

// out[i] = dropout_bits(seed, offset, i / group) >= threshold ? x[i] * keep_scale : 0 (engine::dropout_rate(p)), i
// the row-major element index of x (any strides); out contiguous with x's shape. group > 1: drop path (one draw
// per sample of `group` elements).
void dropout(const engine::Tensor& x, double p, uint64_t seed, uint64_t offset, const engine::Tensor& out,
             int64_t group = 1);

}  // namespace ops::cuda
