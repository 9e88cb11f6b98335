// cpu/matmul.h: the CPU reference GEMM (Eigen) behind matmul, bmm and linear.
#pragma once
#include "engine/tensor.h"

namespace ops::cpu {

// out[..., M, N] = bias[N] (or 0) + a[..., M, K] @ b[..., K, N], then max(0, .) with `relu`; with `accumulate`,
// out's own values take the bias's place (out += a @ b, summed in the compute type and rounded once).
// out is contiguous; a and b may have any strides, and their batch dimensions (all but the last two)
// broadcast to out's (missing or size-1 dimensions repeat). bias is undefined or [N], any stride.
void matmul(const engine::Tensor& a, const engine::Tensor& b, const engine::Tensor& bias, const engine::Tensor& out,
            bool relu = false, bool accumulate = false);

}  // namespace ops::cpu
