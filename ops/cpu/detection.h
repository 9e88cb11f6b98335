// cpu/detection.h: the detection ops' shared math (ENGINE_HD: cuda/detection.cu runs the same lines) and their cpu
// reference kernels. ops/detection.h says what they compute.
#pragma once
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

// values / indices [N, k] from x [N, K] (contiguous).
void topk(const engine::Tensor& x, int64_t k, const engine::Tensor& values, const engine::Tensor& indices);
// iou [N, A, B] from a [N, A, 4] and b [N, B, 4] (contiguous f32).
void box_iou(const engine::Tensor& a, const engine::Tensor& b, const engine::Tensor& iou);
// keep [N, max_out] from boxes [N, K, 4] and valid [N, K] (bool, or undefined).
void nms(const engine::Tensor& boxes, const engine::Tensor& valid, float iou_threshold, const engine::Tensor& keep);

}  // namespace ops::cpu
