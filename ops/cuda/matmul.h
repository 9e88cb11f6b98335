// cuda/matmul.h: the GEMM behind matmul, bmm and linear on the GPU (cuBLASLt).
#pragma once
#include "engine/tensor.h"

namespace ops::cuda {

// Same contract as ops::cpu::matmul: out[..., M, N] = bias[N] (or 0) + a[..., M, K] @ b[..., K, N], out
// contiguous, batch dimensions of a and b broadcast. Each operand's matrices must have unit stride along
// rows or columns (the op makes any other layout contiguous first).
void matmul(const engine::Tensor& a, const engine::Tensor& b, const engine::Tensor& bias,
            const engine::Tensor& out);

}  // namespace ops::cuda
