// cpu/roi_align.h: RoIAlign's geometry (ENGINE_HD, so the CUDA kernels in cuda/roi_align.cu run the same lines)
// and the cpu reference kernels. ops/roi_align.h says what the op computes.
//
// The arithmetic is maskrcnn-benchmark's, in its order: the box in feature pixels, bins, sample points, then the
// bilinear weights of a sample's 4 neighbours (clamped at the map's edges). A sample's value is
// ((w1 v1 + w2 v2) + w3 v3) + w4 v4; a bin's the sum of its samples in order divided by their count; the backward
// adds (g / count) w_k to neighbour k. Products and sums round separately (mul_rn / add_rn: no contraction into an
// fma on the GPU), so the cpu and the GPU give the same bits.
#pragma once
#include <cstdint>
#include <vector>

#include "engine/rng.h"  // ENGINE_HD
#include "engine/tensor.h"
#include "ops/cpu/rounding.h"
#include "ops/roi_align.h"

namespace ops::cpu {

// RoI r's box on its level, in feature pixels: its corner and bin size.
template <typename A>
struct RoiGeometry {
  A y0, x0, bin_h, bin_w;
};

template <typename A>
ENGINE_HD RoiGeometry<A> roi_geometry(const float* roi, A scale, int64_t out_h, int64_t out_w, bool aligned) {
  const A offset = aligned ? A(0.5) : A(0);
  const A x0 = add_rn(mul_rn(A(roi[1]), scale), -offset), y0 = add_rn(mul_rn(A(roi[2]), scale), -offset);
  const A x1 = add_rn(mul_rn(A(roi[3]), scale), -offset), y1 = add_rn(mul_rn(A(roi[4]), scale), -offset);
  A w = x1 - x0, h = y1 - y0;
  if (!aligned) {  // maskrcnn-benchmark: a malformed box is at least 1 x 1
    w = w > A(1) ? w : A(1);
    h = h > A(1) ? h : A(1);
  }
  return {y0, x0, h / A(out_h), w / A(out_w)};
}

// Sample (iy, ix) of bin (ph, pw): its position in feature pixels.
template <typename A>
ENGINE_HD void sample_point(const RoiGeometry<A>& g, int64_t ph, int64_t pw, int64_t iy, int64_t ix, int64_t grid, A* y,
                            A* x) {
  *y = add_rn(add_rn(g.y0, mul_rn(A(ph), g.bin_h)), mul_rn(A(iy) + A(0.5), g.bin_h) / A(grid));
  *x = add_rn(add_rn(g.x0, mul_rn(A(pw), g.bin_w)), mul_rn(A(ix) + A(0.5), g.bin_w) / A(grid));
}

// A sample's 4 neighbours (row-major offsets into an H x W plane) and weights; not valid (it reads and receives
// nothing) outside [-1, H] x [-1, W].
template <typename A>
struct Bilinear {
  bool valid;
  int64_t at[4];
  A w[4];
};

template <typename A>
ENGINE_HD Bilinear<A> bilinear(A y, A x, int64_t H, int64_t W) {
  Bilinear<A> b{false, {0, 0, 0, 0}, {A(0), A(0), A(0), A(0)}};
  if (y < A(-1) || y > A(H) || x < A(-1) || x > A(W)) return b;
  b.valid = true;
  if (y <= A(0)) y = A(0);
  if (x <= A(0)) x = A(0);
  int64_t y_lo = int64_t(y), x_lo = int64_t(x), y_hi, x_hi;
  if (y_lo >= H - 1) {
    y_hi = y_lo = H - 1;
    y = A(y_lo);
  } else {
    y_hi = y_lo + 1;
  }
  if (x_lo >= W - 1) {
    x_hi = x_lo = W - 1;
    x = A(x_lo);
  } else {
    x_hi = x_lo + 1;
  }
  const A ly = y - A(y_lo), lx = x - A(x_lo), hy = A(1) - ly, hx = A(1) - lx;
  b.at[0] = y_lo * W + x_lo, b.at[1] = y_lo * W + x_hi, b.at[2] = y_hi * W + x_lo, b.at[3] = y_hi * W + x_hi;
  b.w[0] = hy * hx, b.w[1] = hy * lx, b.w[2] = ly * hx, b.w[3] = ly * lx;
  return b;
}

// The level RoI r pools from, or -1 for a padding RoI (level outside [0, L) or image outside [0, N)).
ENGINE_HD int64_t roi_level(const float* roi, int64_t level, int64_t L, int64_t N) {
  const float image = roi[0];
  if (level < 0 || level >= L || !(image >= 0.f) || image >= float(N)) return -1;
  return level;
}

// y [R, out_h, out_w, C] from levels (contiguous) as ops/roi_align.h says.
void roi_align_forward(const std::vector<Tensor>& levels, const Tensor& rois, const Tensor& roi_levels,
                       const RoiAlignParams& p, const Tensor& y);
// dx[l] (contiguous, shapes of the levels) from g [R, out_h, out_w, C]: every element written.
void roi_align_backward(const Tensor& g, const Tensor& rois, const Tensor& roi_levels, const RoiAlignParams& p,
                        const std::vector<Tensor>& dx);

}  // namespace ops::cpu
