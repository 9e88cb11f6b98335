// cpu/softmax.h: CPU reference kernels of the softmax family (rows along any dimension, any strides).
#pragma once
#include <cstdint>

#include "engine/tensor.h"

namespace ops::cpu {

// y = softmax(x) (or log_softmax when `log`) along dim; y has x's shape.
void softmax_forward(const engine::Tensor& x, int64_t dim, bool log, const engine::Tensor& y);
// out = y * (g - sum(g * y))   or, when `log`,   out = g - exp(y) * sum(g)   (sums along dim).
void softmax_backward(const engine::Tensor& g, const engine::Tensor& y, int64_t dim, bool log,
                      const engine::Tensor& out);

}  // namespace ops::cpu
