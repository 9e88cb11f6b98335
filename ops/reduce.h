// reduce.h: reductions over dimensions.
//
// sum and mean over any set of dimensions (an empty list means all), keepdim as in PyTorch; amax along one
// dimension (gradient to the first maximal element); sum_to(x, shape) sums the broadcast dimensions away,
// which is the backward of broadcasting. Accumulation is in float (double for f64) in a fixed order, so
// results are deterministic.
#pragma once
#include <vector>

#include "engine/tensor.h"

namespace ops {

using engine::Shape;
using engine::Tensor;

Tensor sum(const Tensor& x, std::vector<int64_t> dims = {}, bool keepdim = false);
Tensor mean(const Tensor& x, std::vector<int64_t> dims = {}, bool keepdim = false);
Tensor amax(const Tensor& x, int64_t dim, bool keepdim = false);
// Sums x down to `shape`, where x's shape is `shape` broadcast (leading and size-1 dimensions).
Tensor sum_to(const Tensor& x, const Shape& shape);
// Index of the (first) maximum along dim, as i64 (no gradient).
Tensor argmax(const Tensor& x, int64_t dim, bool keepdim = false);

// For ops that sum inside their own kernels (weight_norm): the GPU's workspace for summing x over the dimensions
// where reduced[d] is true into `outputs` values: [splits, outputs] partial sums of the accumulation type (f32;
// f64 for f64) when the GPU cuts each output's inputs into pieces, else undefined. A function of the shape,
// allocated alike on every device (cpu and meta leave it unused), so that meta predicts the GPU.
Tensor sum_workspace(const Tensor& x, const std::vector<bool>& reduced, int64_t outputs);

}  // namespace ops
