// cpu/detection.h: the detection ops' shared math (ENGINE_HD: cuda/detection.cu runs the same lines) and their cpu
// reference kernels. ops/detection.h says what they compute.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

#include "engine/rng.h"  // ENGINE_HD
#include "engine/tensor.h"
#include "ops/cpu/rounding.h"

namespace ops::cpu {

// topk's total order as one unsigned key: the value's bits made monotonic (NaN above +inf, -0 as +0) in the high
// word, the complemented index in the low word (a lower index is a larger key). Keys of one row are distinct.
ENGINE_HD uint64_t topk_key(float v, int64_t index) {
  uint32_t bits;
#ifdef __CUDA_ARCH__
  bits = __float_as_uint(v);
#else
  std::memcpy(&bits, &v, sizeof bits);
#endif
  uint32_t ordered;
  if ((bits & 0x7fffffffu) > 0x7f800000u) {
    ordered = 0xffffffffu;  // NaN: the largest
  } else {
    if (bits == 0x80000000u) bits = 0;  // -0 ties with +0
    ordered = (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
  }
  return (uint64_t(ordered) << 32) | uint64_t(~uint32_t(index));
}

ENGINE_HD int64_t topk_key_index(uint64_t key) { return int64_t(~uint32_t(key & 0xffffffffu)); }

// IoU of boxes a, b (x1, y1, x2, y2), torchvision's box_iou: no +1, 0 where the union is 0.
ENGINE_HD float box_iou_of(const float* a, const float* b) {
  const float area_a = mul_rn(sub_rn(a[2], a[0]), sub_rn(a[3], a[1]));
  const float area_b = mul_rn(sub_rn(b[2], b[0]), sub_rn(b[3], b[1]));
  const float w = sub_rn(a[2] < b[2] ? a[2] : b[2], a[0] > b[0] ? a[0] : b[0]);
  const float h = sub_rn(a[3] < b[3] ? a[3] : b[3], a[1] > b[1] ? a[1] : b[1]);
  const float inter = mul_rn(w > 0.f ? w : 0.f, h > 0.f ? h : 0.f);
  const float uni = sub_rn(add_rn(area_a, area_b), inter);
  return uni > 0.f ? inter / uni : 0.f;
}

// One box's encoding (reference r, box b -> d) and decoding (reference r, deltas d -> b, clipped to [0, bound_w] x
// [0, bound_h] when clip_to_image), torchvision's BoxCoder in f32.
struct CoderWeights {
  float wx, wy, ww, wh, clip;
};

ENGINE_HD void encode_box(const float* r, const float* b, const CoderWeights& w, float* d) {
  const float rw = r[2] - r[0], rh = r[3] - r[1], rcx = r[0] + 0.5f * rw, rcy = r[1] + 0.5f * rh;
  const float bw = b[2] - b[0], bh = b[3] - b[1], bcx = b[0] + 0.5f * bw, bcy = b[1] + 0.5f * bh;
  d[0] = w.wx * (bcx - rcx) / rw;
  d[1] = w.wy * (bcy - rcy) / rh;
  d[2] = w.ww * logf(bw / rw);
  d[3] = w.wh * logf(bh / rh);
}

ENGINE_HD void decode_box(const float* r, const float* d, const CoderWeights& w, bool clip_to_image, float bound_h,
                          float bound_w, float* b) {
  const float rw = r[2] - r[0], rh = r[3] - r[1], rcx = r[0] + 0.5f * rw, rcy = r[1] + 0.5f * rh;
  const float dx = d[0] / w.wx, dy = d[1] / w.wy;
  float dw = d[2] / w.ww, dh = d[3] / w.wh;
  dw = dw < w.clip ? dw : w.clip;
  dh = dh < w.clip ? dh : w.clip;
  const float cx = dx * rw + rcx, cy = dy * rh + rcy, half_w = 0.5f * (expf(dw) * rw), half_h = 0.5f * (expf(dh) * rh);
  b[0] = cx - half_w, b[1] = cy - half_h, b[2] = cx + half_w, b[3] = cy + half_h;
  if (clip_to_image)
    for (int k = 0; k < 4; k++) {
      const float hi = k % 2 == 0 ? bound_w : bound_h;
      b[k] = b[k] < 0.f ? 0.f : (b[k] > hi ? hi : b[k]);
    }
}

// Anchor a's match from its IoUs with the G truths (column a of iou [G, A]), each truth's best IoU gmax [G], and
// the valid flags (null: all valid): match_boxes' rule (ops/detection.h).
ENGINE_HD int64_t match_anchor(const float* iou, int64_t G, int64_t A, int64_t a, const float* gmax, const bool* valid,
                               float high, float low, bool allow_low_quality) {
  float best = -1.f;
  int64_t arg = -1;
  for (int64_t g = 0; g < G; g++)
    if ((!valid || valid[g]) && iou[g * A + a] > best) best = iou[g * A + a], arg = g;
  if (arg < 0) return -1;
  int64_t m = best >= high ? arg : (best >= low ? -2 : -1);
  if (allow_low_quality)
    for (int64_t g = 0; g < G; g++)
      if ((!valid || valid[g]) && iou[g * A + a] == gmax[g]) m = arg;
  return m;
}

// Pixel (i, j) of a size x size crop of the box (x1, y1) + (w, h) (w, h >= 1): 1 when its cell's centre lies inside
// one of the P parts of `parts` [P, V, 2] (part p: its first counts[p] vertices, closed; fewer than 3: empty), by
// the even-odd rule (a ray towards +x crosses an odd number of edges), else 0. polygon_masks' rule
// (ops/detection.h), in the crop's frame, every product and sum rounded alone (cpu/rounding.h).
ENGINE_HD float polygon_mask_pixel(const float* parts, const int64_t* counts, int64_t P, int64_t V, float x1, float y1,
                                   float w, float h, int64_t size, int64_t i, int64_t j) {
  const float sx = float(size) / w, sy = float(size) / h;
  const float px = float(j) + 0.5f, py = float(i) + 0.5f;
  for (int64_t p = 0; p < P; p++) {
    const int64_t n = counts[p] < V ? counts[p] : V;
    if (n < 3) continue;
    const float* v = parts + p * V * 2;
    bool inside = false;
    float ax = mul_rn(sub_rn(v[(n - 1) * 2], x1), sx), ay = mul_rn(sub_rn(v[(n - 1) * 2 + 1], y1), sy);
    for (int64_t k = 0; k < n; k++) {
      const float bx = mul_rn(sub_rn(v[k * 2], x1), sx), by = mul_rn(sub_rn(v[k * 2 + 1], y1), sy);
      if ((ay > py) != (by > py)) {
        const float cross = add_rn(ax, mul_rn(sub_rn(py, ay), sub_rn(bx, ax)) / sub_rn(by, ay));
        if (px < cross) inside = !inside;
      }
      ax = bx, ay = by;
    }
    if (inside) return 1.f;
  }
  return 0.f;
}

// values / indices [N, k] from x [N, K] (contiguous).
void topk(const engine::Tensor& x, int64_t k, const engine::Tensor& values, const engine::Tensor& indices);
// iou [N, A, B] from a [N, A, 4] and b [N, B, 4] (contiguous f32).
void box_iou(const engine::Tensor& a, const engine::Tensor& b, const engine::Tensor& iou);
// keep [N, max_out] from boxes [N, K, 4] and valid [N, K] (bool, or undefined).
void nms(const engine::Tensor& boxes, const engine::Tensor& valid, float iou_threshold, const engine::Tensor& keep);
// out [N, K, 4] from in and reference [N, K, 4] (contiguous f32); image_hw [N, 2] or undefined (decode only).
void box_code(bool decode, const engine::Tensor& in, const engine::Tensor& reference, const CoderWeights& w,
              const engine::Tensor& image_hw, const engine::Tensor& out);
// matches [N, A] from iou [N, G, A], valid [N, G] (or undefined); gmax: a [N, G] f32 scratch.
void match_boxes(const engine::Tensor& iou, const engine::Tensor& valid, float high, float low, bool allow_low_quality,
                 const engine::Tensor& gmax, const engine::Tensor& matches);

// masks [N, R, M, M] from polygons [N, G, P, V, 2], counts [N, G, P], rois [N, R, 4] and truth [N, R] (contiguous).
void polygon_masks(const engine::Tensor& polygons, const engine::Tensor& counts, const engine::Tensor& rois,
                   const engine::Tensor& truth, const engine::Tensor& masks);

}  // namespace ops::cpu
