// detection.h: the selection ops of a two-stage detector (Mask R-CNN's RPN and box post-processing), with fixed
// output counts so that a step's memory does not depend on the image: top-k, pairwise IoU and greedy NMS.
// They are data, not functions that learn: no autograd node, and an Error when asked for a gradient.
//
//   topk(x, k) -> {values, indices}
//     x        [N, K] floating; values [N, k] (x's dtype) and indices i64 [N, k]: each row's k largest, in
//              decreasing order, ties to the lower index; NaN counts as larger than every number (as torch.topk).
//              Deterministic on every device (the order is total: value, then index).
//   box_iou(a, b) -> [N, A, B] f32
//     a [N, A, 4], b [N, B, 4] f32 boxes (x1, y1, x2, y2): area (x2 - x1)(y2 - y1) (torchvision's convention, no
//     +1), IoU = intersection / (area_a + area_b - intersection), 0 where that union is 0.
//   nms(boxes, valid, iou_threshold, max_out) -> keep i64 [N, max_out]
//     boxes [N, K, 4] f32 in decreasing score order (topk's); valid bool [N, K] (or undefined: all valid): which
//     candidates take part. Greedy NMS (torchvision.ops.nms): walk the boxes in order, keep a valid box unless
//     it overlaps (IoU > iou_threshold) a box kept before it. keep: the kept indices in order, then -1 padding
//     (at most max_out kept: the first ones).
//
// Kernels: cpu (the reference loops) and cuda (cuda/detection.cu); the IoU of two boxes is one ENGINE_HD function
// (cpu/detection.h) rounded the same on both (cpu/rounding.h), so the two agree bit for bit, NMS decisions
// included. Memory: outputs only, plus, on every device alike (cpu and meta leave them unused), the GPU's
// temporaries, freed before the op returns: topk none; nms the suppression bitmask, u64 [N, K, ceil(K / 64)].
#pragma once
#include <cstdint>

#include "engine/tensor.h"

namespace ops {

using engine::Tensor;

struct TopK {
  Tensor values, indices;
};

TopK topk(const Tensor& x, int64_t k);
Tensor box_iou(const Tensor& a, const Tensor& b);
Tensor nms(const Tensor& boxes, const Tensor& valid, double iou_threshold, int64_t max_out);

// The largest k of topk, on every device (the GPU's one block sorts a row's k candidates in shared memory).
constexpr int64_t kTopkMaxK = 4096;

}  // namespace ops
