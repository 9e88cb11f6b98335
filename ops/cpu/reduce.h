// cpu/reduce.h: CPU reference kernels of the reduce family.
#pragma once
#include <vector>

#include "engine/tensor.h"

namespace ops::cpu {

// out = sum of x over the dimensions where reduced[d] is true (out has x's shape with those set to 1,
// contiguous), times `scale` (1/count for mean).
void sum(const engine::Tensor& x, const std::vector<bool>& reduced, double scale, const engine::Tensor& out);
// values and i64 indices of the max along dim (out shapes: x's with dim set to 1).
void amax(const engine::Tensor& x, int64_t dim, const engine::Tensor& values, const engine::Tensor& indices);

}  // namespace ops::cpu
