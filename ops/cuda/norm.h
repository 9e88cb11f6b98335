// cuda/norm.h: the GPU kernels of layer normalization, with the contract of ops/cpu/norm.h plus one
// workspace for the deterministic column sums of the backward pass.
#pragma once
#include <cstdint>

#include "engine/tensor.h"

namespace ops::cuda {

// y [..., C] = (x - mean) * rstd * weight + bias; writes mean and rstd [rows] (dtype acc_t of x's).
// weight, bias: [C] or undefined. Any strides.
void layer_norm_forward(const engine::Tensor& x, const engine::Tensor& weight, const engine::Tensor& bias,
                        double eps, const engine::Tensor& y, const engine::Tensor& mean, const engine::Tensor& rstd);

// ops::dropout_add_layer_norm: sum = st(st(dropout(y)) + residual) (dropout at (p, seed, offset); p 0: none), then
// out = layer_norm(sum), mean and rstd as above; one pass when y, residual and sum are contiguous and aligned.
void dropout_add_layer_norm(const engine::Tensor& y, const engine::Tensor& residual, const engine::Tensor& weight,
                            const engine::Tensor& bias, double p, uint64_t seed, uint64_t offset, double eps,
                            const engine::Tensor& sum, const engine::Tensor& out, const engine::Tensor& mean,
                            const engine::Tensor& rstd);

// dx [..., C], dweight [C], dbias [C] (each may be undefined: not computed) from g, x, weight (or
// undefined) and the saved mean, rstd; as ops::cpu::layer_norm_backward.
// workspace [P, 2, C] (stats dtype, contiguous) is given when dweight or dbias is requested: rows are
// split into P fixed chunks, chunk b writes its column sums of g * xhat and g to workspace[b], and a
// second kernel adds the P partial rows in order. P is the op's choice (ops/norm.cpp), the same on
// every device; the result does not depend on the GPU.
void layer_norm_backward(const engine::Tensor& g, const engine::Tensor& x, const engine::Tensor& weight,
                         const engine::Tensor& mean, const engine::Tensor& rstd, const engine::Tensor& dx,
                         const engine::Tensor& dweight, const engine::Tensor& dbias, const engine::Tensor& workspace);

// Weight normalization's passes after its sums (cuda::sum_of_products of v with v, or of dw with v, into
// norm_sq / s [n] of the accumulation type), v viewed as [outer, n, inner] around dim, every tensor contiguous;
// the same functions as ops::cpu::weight_norm_forward / _backward:
//   weight_norm_scale      w = v * g / sqrt(norm_sq) per channel
//   weight_norm_backward   dv = (g / r) (dw - v s / r^2), dg = s / r (r = sqrt(norm_sq)); dv or dg may be undefined
// Where weight_norm_one_pass(v's shape, dim) (ops/norm.h: the channels are v's rows or its columns), each direction
// in one kernel, its sums included: forward norm_sq and w; backward dv and dg (either may be undefined) from the
// saved norm_sq. No workspace.
void weight_norm_forward_one_pass(const engine::Tensor& v, const engine::Tensor& g, int64_t dim,
                                  const engine::Tensor& norm_sq, const engine::Tensor& w);
void weight_norm_backward_one_pass(const engine::Tensor& dw, const engine::Tensor& v, const engine::Tensor& g,
                                   const engine::Tensor& norm_sq, int64_t dim, const engine::Tensor& dv,
                                   const engine::Tensor& dg);
void weight_norm_scale(const engine::Tensor& v, const engine::Tensor& g, const engine::Tensor& norm_sq, int64_t dim,
                       const engine::Tensor& w);
void weight_norm_backward(const engine::Tensor& dw, const engine::Tensor& v, const engine::Tensor& g,
                          const engine::Tensor& norm_sq, const engine::Tensor& s, int64_t dim, const engine::Tensor& dv,
                          const engine::Tensor& dg);

}  // namespace ops::cuda
