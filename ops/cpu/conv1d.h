// cpu/conv1d.h: the CPU reference kernels of the conv1d family (1-D convolution over [B, T, C], GLU).
// Every tensor is contiguous (the op guarantees it); shapes as in ops/conv1d.h.
#pragma once
#include "engine/tensor.h"

namespace ops::cpu {

// y [B, To, Cout] = bias (or 0) + sum_k x[:, t + k - pad_left, :] @ w[k]      (x [B, T, Cin], w [K, Cin, Cout])
void conv1d_forward(const engine::Tensor& x, const engine::Tensor& w, const engine::Tensor& bias, int64_t pad_left,
                    const engine::Tensor& y);
// dx [B, T, Cin] = sum_k g[:, s - k + pad_left, :] @ w[k]^T                   (g [B, To, Cout])
void conv1d_backward_input(const engine::Tensor& g, const engine::Tensor& w, int64_t pad_left,
                           const engine::Tensor& dx);
// dw [K, Cin, Cout] = sum_{b, t} x[b, t + k - pad_left, :]^T g[b, t, :]
void conv1d_backward_weight(const engine::Tensor& g, const engine::Tensor& x, int64_t pad_left,
                            const engine::Tensor& dw);

// x viewed as [outer, 2H, inner] (split along dim) -> y [outer, H, inner] = a * sigmoid(b).
void glu_forward(const engine::Tensor& x, int64_t dim, const engine::Tensor& y);
// dx = [g * s | g * a * s * (1 - s)], s = sigmoid(b).
void glu_backward(const engine::Tensor& g, const engine::Tensor& x, int64_t dim, const engine::Tensor& dx);

}  // namespace ops::cpu
