// softmax.h: softmax and log_softmax along one dimension, and their fused backward ops.
//
//   softmax(x, dim)         y = exp(x - max) / sum(exp(x - max))        (max subtracted: no overflow)
//   log_softmax(x, dim)     y = x - max - log(sum(exp(x - max)))
// Both save only their output y (the input is not needed: softmax' = y (g - sum(g y)), log_softmax' uses exp(y)).
// The backward of each is an op of its own with a one-pass kernel; its own rule is written with engine ops,
// so double backward works:
//   softmax_backward(g, y, dim)      = y * (g - sum(g * y))
//       rule: d/dg = softmax_backward(h, y) (self-adjoint in g),  d/dy = h (g - sum(g y)) - g sum(h y)
//   log_softmax_backward(g, y, dim)  = g - exp(y) * sum(g)
//       rule: d/dg = h - sum(h exp(y)),  d/dy = -h exp(y) sum(g)
// (sums along dim). Computation is in float (double for f64) whatever the storage dtype.
// FLOPs: 5 per element forward (max, subtract, exp, sum, divide), 4 per element backward.
#pragma once
#include <cstdint>

#include "engine/tensor.h"

namespace ops {

using engine::Tensor;

Tensor softmax(const Tensor& x, int64_t dim);
Tensor log_softmax(const Tensor& x, int64_t dim);
Tensor softmax_backward(const Tensor& g, const Tensor& y, int64_t dim);
Tensor log_softmax_backward(const Tensor& g, const Tensor& y, int64_t dim);

}  // namespace ops
