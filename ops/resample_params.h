// resample_params.h: the index arithmetic of upsampling (nearest, bilinear) and 2-D padding (constant,
// reflection) along one image axis, shared by the op (ops/resample.cpp), its cpu reference kernels
// (ops/cpu/resample.*) and its CUDA kernels (ops/cuda/resample.cu): both devices compute the same source
// indices and weights, to the bit, by construction.
//
// PyTorch's formulas (aten/src/ATen/native/UpSample.h), restated:
//   nearest:  src(o) = min(floor(o * s), in - 1) in float, s = 1 / scale_factor if one is given, else in / out
//             (out == in and out == 2 in are exact: o and o / 2)
//   bilinear: align_corners:  src(o) = o * (in - 1) / (out - 1)      (0 when out == 1)
//             otherwise:      src(o) = max(0, (o + 0.5) * s - 0.5),  s as for nearest
//             i0 = min(floor(src), in - 1), i1 = i0 + (i0 < in - 1), w1 = clamp(src - i0, 0, 1), w0 = 1 - w1
//             computed in acc_t (float; double for f64); out == in is the identity.
// Both index maps are nondecreasing in o, so the outputs that read input i form one contiguous range; the
// backward passes are gathers over that range (outputs_reading), deterministic and without atomics.
// Padding: output o reads o - before when inside, else nothing (constant) or its mirror image without
// repeating the edge (reflection, PyTorch's ReflectionPad2d: pad < in).
#pragma once
#include <cmath>
#include <cstdint>

#include "engine/rng.h"  // ENGINE_HD

namespace ops {

enum class UpsampleMode { nearest, bilinear };

struct UpsampleParams {
  UpsampleMode mode = UpsampleMode::nearest;
  int64_t out_h = 0, out_w = 0;
  double scale_h = 0, scale_w = 0;  // > 0: the scale factor the caller gave (its inverse maps indices)
  bool align_corners = false;       // bilinear only
};

// One axis of an upsampling: source taps of each output, and the outputs that read each input.
template <typename A> struct ResampleAxis {
  int64_t in = 0, out = 0;
  bool nearest = true, align_corners = false;
  float nearest_scale = 0;  // nearest: PyTorch maps in float whatever the dtype
  A ratio = 0;              // bilinear

  // Output o reads inputs i0 (weight w0) and i1 (weight w1); i1 == i0 when it reads one.
  ENGINE_HD void taps(int64_t o, int64_t& i0, int64_t& i1, A& w0, A& w1) const {
    if (out == in) {
      i0 = i1 = o, w0 = A(1), w1 = A(0);
      return;
    }
    if (nearest) {
      i0 = out == 2 * in ? o >> 1 : static_cast<int64_t>(floorf(float(o) * nearest_scale));
      if (i0 > in - 1) i0 = in - 1;
      i1 = i0, w0 = A(1), w1 = A(0);
      return;
    }
    A src = align_corners ? ratio * A(o) : ratio * (A(o) + A(0.5)) - A(0.5);
    if (src < A(0)) src = A(0);
    i0 = static_cast<int64_t>(floor(src));
    if (i0 > in - 1) i0 = in - 1;
    w1 = src - A(i0);
    w1 = w1 < A(0) ? A(0) : (w1 > A(1) ? A(1) : w1);
    w0 = A(1) - w1;
    i1 = i0 + (i0 < in - 1 ? 1 : 0);
  }
  ENGINE_HD int64_t first_tap(int64_t o) const {
    int64_t i0, i1;
    A w0, w1;
    taps(o, i0, i1, w0, w1);
    return i0;
  }
  // The weight with which output o reads input i (0 when it does not).
  ENGINE_HD A weight(int64_t o, int64_t i) const {
    int64_t i0, i1;
    A w0, w1;
    taps(o, i0, i1, w0, w1);
    A w = A(0);
    if (i0 == i) w += w0;
    if (i1 == i) w += w1;  // at the last input both taps are one pixel: weight w0 + w1 = 1
    return w;
  }
  // Outputs [first, last) that may read input i: those whose first tap is i (or i - 1 for bilinear), found
  // by bisection on the nondecreasing first tap.
  ENGINE_HD void outputs_reading(int64_t i, int64_t& first, int64_t& last) const {
    first = lower_bound(nearest ? i : i - 1);
    last = lower_bound(i + 1);
  }
  // The first output whose first tap is >= v (out when none).
  ENGINE_HD int64_t lower_bound(int64_t v) const {
    int64_t lo = 0, hi = out;
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo) / 2;
      if (first_tap(mid) < v) lo = mid + 1;
      else hi = mid;
    }
    return lo;
  }
};

template <typename A>
inline ResampleAxis<A> resample_axis(int64_t in, int64_t out, double scale, const UpsampleParams& p) {
  ResampleAxis<A> a;
  a.in = in, a.out = out;
  a.nearest = p.mode == UpsampleMode::nearest;
  a.align_corners = p.align_corners;
  a.nearest_scale = scale > 0 ? static_cast<float>(1.0 / scale) : static_cast<float>(in) / float(out);
  if (p.align_corners) a.ratio = out > 1 ? A(in - 1) / A(out - 1) : A(0);
  else a.ratio = scale > 0 ? A(1.0 / scale) : A(in) / A(out);
  return a;
}

// ---------------------------------------------------------------------------------------------------
// Padding

enum class PadMode { constant, reflect };

struct Pad2dParams {
  int64_t left = 0, right = 0, top = 0, bottom = 0;  // F.pad's order: (left, right, top, bottom)
  PadMode mode = PadMode::constant;
  double value = 0;  // constant mode
};

struct PadAxis {
  int64_t in = 0, before = 0, after = 0;
  bool reflect = false;

  ENGINE_HD int64_t out() const { return in + before + after; }
  // The input position output o reads, or -1 (constant padding).
  ENGINE_HD int64_t src(int64_t o) const {
    const int64_t i = o - before;
    if (i >= 0 && i < in) return i;
    if (!reflect) return -1;
    return i < 0 ? -i : 2 * (in - 1) - i;
  }
  // The outputs that read input i, in increasing order (at most 3: left mirror, itself, right mirror).
  ENGINE_HD int outputs_reading(int64_t i, int64_t (&o)[3]) const {
    const int64_t candidates[3] = {before - i, before + i, before + 2 * (in - 1) - i};
    int n = 0;
    for (int k = 0; k < 3; k++) {
      const int64_t c = candidates[k];
      if (c < 0 || c >= out() || src(c) != i || (n > 0 && o[n - 1] == c)) continue;
      o[n++] = c;
    }
    return n;
  }
};

inline PadAxis pad_axis_h(int64_t H, const Pad2dParams& p) { return {H, p.top, p.bottom, p.mode == PadMode::reflect}; }
inline PadAxis pad_axis_w(int64_t W, const Pad2dParams& p) { return {W, p.left, p.right, p.mode == PadMode::reflect}; }

}  // namespace ops
