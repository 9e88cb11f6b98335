// cuda/reduce.h: the GPU kernels of the reduce family, with ops/cpu/reduce.h's contract, plus the
// workspace the op allocates for reductions that the GPU sums in pieces (see ops/reduce.cpp).
#pragma once
#include <vector>

#include "engine/tensor.h"

namespace ops::cuda {

// out = sum of x over the dimensions where reduced[d] is true (out has x's shape with those set to 1,
// contiguous), times `scale`. `partials` is undefined, or a [splits, out.numel()] workspace of the
// accumulation type (f32; f64 for f64): each output's inputs are then summed in `splits` pieces by
// separate blocks and the pieces added in order by a second kernel (deterministic: no atomics).
void sum(const engine::Tensor& x, const std::vector<bool>& reduced, double scale, const engine::Tensor& out,
         const engine::Tensor& partials);
// out = the sum over the reduced dimensions of x * y (one dot product per output: weight normalization's squared
// norms and its backward's projections); y has x's dtype, shape and strides; out is contiguous, of the accumulation
// type (f32; f64 for f64); `partials` as for sum.
void sum_of_products(const engine::Tensor& x, const engine::Tensor& y, const std::vector<bool>& reduced,
                     const engine::Tensor& out, const engine::Tensor& partials);
// values and i64 indices of the max along dim (out shapes: x's with dim set to 1); the first maximum on
// ties, and a NaN wins (the first NaN), as on the cpu.
void amax(const engine::Tensor& x, int64_t dim, const engine::Tensor& values, const engine::Tensor& indices);

}  // namespace ops::cuda
