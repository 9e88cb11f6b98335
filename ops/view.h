// view.h: ops that reinterpret a tensor's shape and strides without copying (when they can).
//
// reshape of a contiguous tensor, permute, transpose, slice, squeeze/unsqueeze are views: they share the
// storage and allocate nothing. reshape of a non-contiguous tensor copies first (contiguous()).
// Backward of each is the inverse view, so none of them saves anything for backward.
#pragma once
#include <vector>

#include "engine/tensor.h"

namespace ops {

using engine::Shape;
using engine::Tensor;

// One entry of `shape` may be -1 (inferred).
Tensor reshape(const Tensor& x, Shape shape);
Tensor flatten(const Tensor& x, int64_t start_dim = 0, int64_t end_dim = -1);
Tensor permute(const Tensor& x, const std::vector<int64_t>& order);
Tensor transpose(const Tensor& x, int64_t dim0, int64_t dim1);
// Elements [start, end) with step along dim (negative start/end count from the end).
Tensor slice(const Tensor& x, int64_t dim, int64_t start, int64_t end, int64_t step = 1);
// The gradient of slice: zeros of `shape` with g in the window (differentiable: its backward slices).
Tensor slice_backward(const Tensor& g, const Shape& shape, int64_t dim, int64_t start, int64_t end, int64_t step);
Tensor select(const Tensor& x, int64_t dim, int64_t index);  // slice of width 1, dim removed
Tensor unsqueeze(const Tensor& x, int64_t dim);
Tensor squeeze(const Tensor& x, int64_t dim);

}  // namespace ops
