// pool_params.h: the geometry of 2-D max and average pooling over NHWC images, shared by the op
// (ops/pool.cpp), its cpu reference kernels (ops/cpu/pool.*) and its CUDA kernels (ops/cuda/pool.cu), so that
// all three agree on output sizes, window bounds, divisors and on which windows hold an input pixel
// (the backward kernels are gathers: each input pixel sums the windows that contain it, in a fixed order).
//
// Padding may be asymmetric (pad_top != pad_bottom): TensorFlow's 'SAME' pooling pads the extra row at the
// bottom (same_pool_padding). Output size along one axis, as PyTorch computes it (pad_before + pad_after
// in place of 2 pad):
//   out = (in + pad_before + pad_after - dilation (k - 1) - 1 + (ceil_mode ? stride - 1 : 0)) / stride + 1,
//   and with ceil_mode the last window must start inside the input or the leading padding (else out - 1).
// Average pooling (PyTorch's rule): the window [start, start + k) is first clipped to the padded extent
// [-pad_before, in + pad_after), whose size is the divisor when count_include_pad; then to the input [0, in),
// whose size is the divisor otherwise.
#pragma once
#include <cstdint>

#include "engine/rng.h"  // ENGINE_HD

namespace ops {

struct Pool2dParams {
  int64_t kernel_h = 1, kernel_w = 1;
  int64_t stride_h = 1, stride_w = 1;
  int64_t pad_top = 0, pad_bottom = 0, pad_left = 0, pad_right = 0;
  int64_t dilation_h = 1, dilation_w = 1;  // max pooling only
  bool ceil_mode = false;
  bool count_include_pad = true;  // average pooling only
};

// One axis of a pooling window: sizes and the window arithmetic of that axis.
struct PoolAxis {
  int64_t in, out, k, stride, pad_before, pad_after, dilation;

  // First position (may be negative: padding) of window o.
  ENGINE_HD int64_t start(int64_t o) const { return o * stride - pad_before; }
  // The windows that may contain input position i: [first, last] (empty when first > last). Window o
  // spans [start(o), start(o) + dilation (k - 1)]; with dilation the caller still checks the tap.
  ENGINE_HD void windows_containing(int64_t i, int64_t& first, int64_t& last) const {
    const int64_t span = dilation * (k - 1);
    const int64_t lo = i + pad_before - span;  // start(o) >= i - span
    first = lo <= 0 ? 0 : stride == 1 ? lo : (lo + stride - 1) / stride;
    last = stride == 1 ? i + pad_before : (i + pad_before) / stride;  // start(o) <= i (no division at stride 1)
    if (last > out - 1) last = out - 1;
  }
  // Average pooling: the window clipped to the input, and its size clipped to the padded extent.
  ENGINE_HD void avg_window(int64_t o, int64_t& begin, int64_t& end, int64_t& padded_size) const {
    begin = start(o);
    end = begin + k;
    if (end > in + pad_after) end = in + pad_after;
    padded_size = end - begin;
    if (begin < 0) begin = 0;
    if (end > in) end = in;
  }
};

inline PoolAxis pool_axis(int64_t in, int64_t k, int64_t stride, int64_t pad_before, int64_t pad_after,
                          int64_t dilation, bool ceil_mode) {
  const int64_t span = in + pad_before + pad_after - dilation * (k - 1) - 1;
  int64_t out = (span + (ceil_mode ? stride - 1 : 0)) / stride + 1;
  if (span < 0) out = 0;
  if (ceil_mode && out > 0 && (out - 1) * stride >= in + pad_before) out--;
  return {in, out, k, stride, pad_before, pad_after, dilation};
}

inline PoolAxis pool_axis_h(int64_t H, const Pool2dParams& p) {
  return pool_axis(H, p.kernel_h, p.stride_h, p.pad_top, p.pad_bottom, p.dilation_h, p.ceil_mode);
}
inline PoolAxis pool_axis_w(int64_t W, const Pool2dParams& p) {
  return pool_axis(W, p.kernel_w, p.stride_w, p.pad_left, p.pad_right, p.dilation_w, p.ceil_mode);
}

// PyTorch's nn.MaxPool2d / AvgPool2d arguments (square kernel, symmetric padding; stride 0 = kernel).
inline Pool2dParams pool2d_params(int64_t kernel, int64_t stride = 0, int64_t padding = 0, int64_t dilation = 1,
                                  bool ceil_mode = false, bool count_include_pad = true) {
  Pool2dParams p;
  p.kernel_h = p.kernel_w = kernel;
  p.stride_h = p.stride_w = stride > 0 ? stride : kernel;
  p.pad_top = p.pad_bottom = p.pad_left = p.pad_right = padding;
  p.dilation_h = p.dilation_w = dilation;
  p.ceil_mode = ceil_mode;
  p.count_include_pad = count_include_pad;
  return p;
}

// TensorFlow's 'SAME' padding for an H x W input: out = ceil(in / stride), the total padding
// max((out - 1) stride + dilation (k - 1) + 1 - in, 0) split with the extra row/column after (bottom/right).
inline Pool2dParams same_pool_padding(Pool2dParams p, int64_t H, int64_t W) {
  auto split = [](int64_t in, int64_t k, int64_t s, int64_t d, int64_t& before, int64_t& after) {
    const int64_t out = (in + s - 1) / s;
    int64_t total = (out - 1) * s + d * (k - 1) + 1 - in;
    if (total < 0) total = 0;
    before = total / 2;
    after = total - before;
  };
  split(H, p.kernel_h, p.stride_h, p.dilation_h, p.pad_top, p.pad_bottom);
  split(W, p.kernel_w, p.stride_w, p.dilation_w, p.pad_left, p.pad_right);
  p.ceil_mode = false;
  return p;
}

}  // namespace ops
