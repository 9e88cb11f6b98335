// cuda/elementwise.h: the GPU kernels of the elementwise family, with ops/cpu/elementwise.h's contract
// (same arguments, same results: math from elementwise_math.h, bf16/f16 loaded to float and rounded to
// nearest even on store, any input strides, broadcasting by stride 0).
#pragma once
#include "engine/tensor.h"
#include "ops/elementwise_math.h"

namespace ops::cuda {

// out (contiguous, broadcast shape) = op(a, b); a and b may have any strides (broadcast included).
void binary(BinaryOp op, const engine::Tensor& a, const engine::Tensor& b, const engine::Tensor& out);
// out = f(x), elementwise, any strides in x; out contiguous with x's shape.
void unary(UnaryOp op, double alpha, double beta, const engine::Tensor& x, const engine::Tensor& out);
// out = g * f'(s)
void unary_backward(UnaryOp op, double alpha, double beta, const engine::Tensor& g, const engine::Tensor& s,
                    const engine::Tensor& out);
// out = d f'(s)/ds
void unary_d2(UnaryOp op, double alpha, double beta, const engine::Tensor& s, const engine::Tensor& out);
// out (bool) = a op b, compared in double, any dtypes (a and b the same one), broadcasting.
void compare(CompareOp op, const engine::Tensor& a, const engine::Tensor& b, const engine::Tensor& out);
void compare_scalar(CompareOp op, const engine::Tensor& a, double c, const engine::Tensor& out);
// dst = src elementwise with conversion, any strides on both sides (src broadcast to dst's shape).
void copy(const engine::Tensor& src, const engine::Tensor& dst);
void fill(const engine::Tensor& dst, double value);
// a += alpha * b, b broadcast to a's shape.
void add_inplace(const engine::Tensor& a, const engine::Tensor& b, double alpha);
void scale_inplace(const engine::Tensor& a, double c);

}  // namespace ops::cuda
