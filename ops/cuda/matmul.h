// cuda/matmul.h: the GEMM behind matmul, bmm and linear on the GPU (cuBLASLt).
#pragma once
#include "engine/tensor.h"

namespace ops::cuda {

// Same contract as ops::cpu::matmul: out[..., M, N] = bias[N] (or 0) + a[..., M, K] @ b[..., K, N], then
// max(0, .) with `relu` (cuBLASLt's RELU / RELU_BIAS epilogue), out contiguous, batch dimensions of a and b
// broadcast. Each operand's matrices must have unit stride along rows or columns (the op makes any other layout
// contiguous first).
void matmul(const engine::Tensor& a, const engine::Tensor& b, const engine::Tensor& bias, const engine::Tensor& out,
            bool relu = false);

// out[i] = alpha a[i] @ b[i] + beta out[i] (+ bias[N] on every row, if defined) for i in [0, batch): a
// strided-batched GEMM, by default with alpha = beta = 1 (the GEMM accumulates into out, as BLAS's C = A B + C).
// a [batch, M, K]; b [batch, K, N] or [K, N] (the same matrix for every i); out [batch, M, N] with unit column stride
// and any row and batch strides (a view into a larger tensor, e.g. the rows of y that one tap of a 1-D convolution
// reaches). Each operand's matrices must have unit stride along rows or columns, any stride along the other (a row
// every T rows of a [B, T, C] tensor). Added for conv1d (K shifted GEMMs accumulating into one output, the first with
// beta = 0 and the bias; the weight gradient's corrections, alpha = -1).
void matmul_accumulate(const engine::Tensor& a, const engine::Tensor& b, const engine::Tensor& out, double alpha = 1,
                       double beta = 1, const engine::Tensor& bias = engine::Tensor());

}  // namespace ops::cuda
