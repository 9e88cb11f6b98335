// cuda/softmax.h: the GPU kernels of the softmax family, with the contract of ops/cpu/softmax.h.
#pragma once
#include <cstdint>

#include "engine/tensor.h"

namespace ops::cuda {

// y = softmax(x) (or log_softmax when `log`) along dim; y has x's shape; any strides.
void softmax_forward(const engine::Tensor& x, int64_t dim, bool log, const engine::Tensor& y);
// out = y * (g - sum(g * y))   or, when `log`,   out = g - exp(y) * sum(g)   (sums along dim).
void softmax_backward(const engine::Tensor& g, const engine::Tensor& y, int64_t dim, bool log,
                      const engine::Tensor& out);

}  // namespace ops::cuda
