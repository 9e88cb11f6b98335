// conv1d.h: the gated temporal convolution of convs2s: a 1-D convolution over sequences [B, T, C] (channels
// last, batch first) and the gated linear unit (GLU) that follows it.
//
// conv1d(x, weight, bias, pad_left, pad_right)
//   x [B, T, Cin], weight [K, Cin, Cout] (fairseq ConvTBC's layout: tap k is a plain [Cin, Cout] matrix),
//   bias [Cout] or undefined -> y [B, To, Cout], To = T + pad_left + pad_right - K + 1 (>= 1).
//   y[b, t, :] = bias + sum_k x[b, t + k - pad_left, :] @ weight[k]   (rows outside [0, T) are zero padding)
//   Encoder: pad (K-1)/2 on both sides (To = T); decoder: pad K-1 on the left only (causal: y[t] sees x[<= t]).
//   Computed as fairseq's ConvTBC does it: K GEMMs over shifted views, each accumulating into y (beta = 1),
//   so no im2col buffer exists: the op allocates y and nothing else. Tap k touches only the output rows
//   t whose input row t + k - pad_left lies in [0, T), so padding is never materialized.
//   FLOPs: 2 * B * Cin * Cout * (number of valid (t, k) pairs), i.e. 2 * B * To * K * Cin * Cout without padding.
// The two gradients are ops of their own (bilinear maps, so each one's rule is written with the other two):
//   conv1d_backward_input(g [B, To, Cout], weight, pl, pr) -> dx [B, T, Cin], T = To - pl - pr + K - 1:
//       dx[b, s, :] = sum_k g[b, s - k + pl, :] @ weight[k]^T
//   conv1d_backward_weight(g [B, To, Cout], x [B, T, Cin], K, pl, pr) -> dweight [K, Cin, Cout]:
//       dweight[k] = sum_{b, t} x[b, t + k - pl, :]^T g[b, t, :]
//   With <.,.> the sum of elementwise products: <g, conv1d(x, w)> = <backward_input(g, w), x>
//   = <backward_weight(g, x), w>, which gives every rule: conv1d's dx, dw (and db = sum of g over B, To);
//   backward_input(g, w) with incoming gg: d/dg = conv1d(gg, w), d/dw = backward_weight(g, gg);
//   backward_weight(g, x) with incoming gg: d/dg = conv1d(x, gg), d/dx = backward_input(g, gg).
//   Saved: x and weight (each only when the other's gradient needs it).
// Operands are made contiguous by the op (a copy, identical on every device, only if they are not).
//
// glu(x, dim): x = [a | b] split in two halves along dim (its size must be even) -> a * sigmoid(b)
//   (PyTorch's F.glu). Saved: x only. Backward: glu_backward(g, x, dim) -> dx = [g s | g a s (1 - s)],
//   s = sigmoid(b), one fused kernel; its own rule is written with engine ops (double backward).
//   FLOPs: 4 per output forward, 6 backward (counted as such; exp counted once).
#pragma once
#include <algorithm>

#include "engine/tensor.h"

namespace ops {

using engine::Tensor;

// The output rows [begin, end) that tap k reaches: those whose input row t + k - pad_left lies in [0, T).
// Shared by the op (FLOP count) and the cpu and cuda kernels, so all three skip the same padding.
struct Conv1dTapRows {
  int64_t begin, end;
  int64_t count() const { return std::max<int64_t>(0, end - begin); }
};
inline Conv1dTapRows conv1d_tap_rows(int64_t k, int64_t pad_left, int64_t T, int64_t To) {
  return {std::max<int64_t>(0, pad_left - k), std::min<int64_t>(To, T + pad_left - k)};
}

Tensor conv1d(const Tensor& x, const Tensor& weight, const Tensor& bias, int64_t pad_left, int64_t pad_right);
Tensor conv1d_backward_input(const Tensor& g, const Tensor& weight, int64_t pad_left, int64_t pad_right);
Tensor conv1d_backward_weight(const Tensor& g, const Tensor& x, int64_t kernel_size, int64_t pad_left,
                              int64_t pad_right);

Tensor glu(const Tensor& x, int64_t dim);
Tensor glu_backward(const Tensor& g, const Tensor& x, int64_t dim);

}  // namespace ops
