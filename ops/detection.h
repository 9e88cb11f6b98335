// detection.h: the box ops of a two-stage detector (Mask R-CNN's RPN, matching and post-processing), with fixed
// output counts so that a step's memory does not depend on the image: top-k, pairwise IoU, greedy NMS, box
// encoding and decoding, and anchor-to-truth matching. They are data, not functions that learn: no autograd node,
// and an Error when asked for a gradient (the losses differentiate the network's deltas, not these).
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
//   box_encode(boxes, reference, p) -> deltas, box_decode(deltas, reference, p, image_hw) -> boxes
//     [N, K, 4] f32 each, torchvision's BoxCoder with weights (wx, wy, ww, wh) (RPN 1, 1, 1, 1; box head 10, 10, 5,
//     5): with w, h, cx, cy the reference's width, height and centre, deltas = (wx (cx' - cx) / w, wy (cy' - cy) / h,
//     ww log(w' / w), wh log(h' / h)); decoding inverts it with dw, dh clamped at p.clip (log(1000 / 16)), then,
//     when image_hw (f32 [N, 2]: each image's height, width) is given, clips x to [0, width] and y to [0, height].
//   polygon_masks(polygons, counts, rois, truth, size) -> f32 [N, R, size, size]
//     The mask head's targets: each RoI's truth, a union of polygons (COCO's segmentation), rasterized into the RoI's
//     size x size crop (maskrcnn-benchmark's SegmentationMask crop + resize + rasterize). polygons f32 [N, G, P, V, 2]:
//     truth g's part p is the closed polygon of its first counts[n, g, p] vertices (x, y in image pixels); counts i64
//     [N, G, P] (a part of fewer than 3 vertices is empty). rois f32 [N, R, 4] (x1, y1, x2, y2); truth i64 [N, R]: the
//     truth each RoI is trained on (outside [0, G): none, an all-zero crop). Pixel (i, j) is 1 when the centre of
//     its cell, (j + 0.5, i + 0.5) in the crop's frame where a vertex (x, y) is at ((x - x1) size / w, (y - y1) size
//     / h), w = max(x2 - x1, 1), h = max(y2 - y1, 1), lies inside some part (the even-odd rule per part), else 0.
//   match_boxes(iou, gt_valid, high, low, allow_low_quality) -> i64 [N, A]
//     iou [N, G, A] (box_iou(truths, anchors)), gt_valid bool [N, G] (or undefined: all valid; padding truths are
//     invalid). torchvision's Matcher: each anchor's best valid truth (ties to the lower index) if its IoU >= high,
//     -2 (ignored) if in [low, high), -1 (background) below low or with no valid truth; allow_low_quality: every
//     anchor whose IoU with some valid truth equals that truth's best IoU over all anchors gets back its best truth.
//
// Built from the ops above and the elementwise ones (no kernels of their own):
//   grid_anchors(grid_h, grid_w, stride_h, stride_w, sizes, ratios, device) -> f32 [grid_h grid_w A, 4], A = ratios x
//     sizes: torchvision's AnchorGenerator for one level. Cell anchors round((-w, -h, w, h) / 2) with h = size
//     sqrt(ratio), w = size / sqrt(ratio) (ratio-major, in f32, rounded half to even), shifted by (x s_w, y s_h, x s_w,
//     y s_h) at every cell (y, x), row-major, a cell's anchors consecutive. A function of the sizes only: computed on
//     the host and uploaded.
//   fpn_levels(boxes [N, K, 4], k_min, k_max, canonical_size, canonical_level, eps) -> i64 [N, K]: torchvision's
//     LevelMapper, clamp(floor(canonical_level + log2(sqrt(area) / canonical_size) + eps), k_min, k_max) - k_min:
//     the pyramid level (0 = k_min) each RoI is pooled from, as comparisons of sqrt(area) with the level bounds.
//   sample_balanced(labels [N, A] i64 (1 positive, 0 negative, else neither), num, positive_fraction) -> {index,
//     label} i64 [N, num]: torchvision's BalancedPositiveNegativeSampler in fixed slots: p = min(#positives,
//     floor(num fraction)) positives drawn uniformly without replacement, then min(#negatives, num - p) negatives,
//     then padding (index 0, label -1). The draws are ops::rand's (the default generator): reproducible from the seed.
//
// Kernels: cpu (the reference loops) and cuda (cuda/detection.cu); the IoU of two boxes is one ENGINE_HD function
// (cpu/detection.h) rounded the same on both (cpu/rounding.h), so the two agree bit for bit, NMS decisions
// included; so is a mask pixel's polygon test. Memory: outputs only, plus, on every device alike (cpu and meta
// leave them unused), the GPU's temporaries, freed before the op returns: topk none; nms the suppression bitmask,
// u64 [N, K, ceil(K / 64)]; match_boxes each truth's best IoU, f32 [N, G]. box_encode / box_decode use exp and log:
// the GPU's differ from the cpu's by an ulp or so (the other ops agree bit for bit).
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "engine/tensor.h"

namespace ops {

using engine::Tensor;

struct TopK {
  Tensor values, indices;
};

TopK topk(const Tensor& x, int64_t k);
Tensor box_iou(const Tensor& a, const Tensor& b);
Tensor nms(const Tensor& boxes, const Tensor& valid, double iou_threshold, int64_t max_out);

struct BoxCoderParams {
  double wx = 1, wy = 1, ww = 1, wh = 1;
  double clip = 4.135166556742356;  // log(1000 / 16): the largest dw, dh decoded
};

Tensor box_encode(const Tensor& boxes, const Tensor& reference, const BoxCoderParams& p);
Tensor box_decode(const Tensor& deltas, const Tensor& reference, const BoxCoderParams& p,
                  const Tensor& image_hw = Tensor());
Tensor match_boxes(const Tensor& iou, const Tensor& gt_valid, double high, double low, bool allow_low_quality);
Tensor polygon_masks(const Tensor& polygons, const Tensor& counts, const Tensor& rois, const Tensor& truth,
                     int64_t size);

Tensor grid_anchors(int64_t grid_h, int64_t grid_w, int64_t stride_h, int64_t stride_w,
                    const std::vector<double>& sizes, const std::vector<double>& ratios,
                    std::shared_ptr<engine::Device> device = nullptr);
Tensor fpn_levels(const Tensor& boxes, int64_t k_min = 2, int64_t k_max = 5, double canonical_size = 224,
                  int64_t canonical_level = 4, double eps = 1e-6);
struct Sampled {
  Tensor index, label;  // i64 [N, num]
};
Sampled sample_balanced(const Tensor& labels, int64_t num, double positive_fraction);
// An index tensor (any dtype, values below 2^24) as i64 with its negative entries (padding: -1) replaced by 0, so
// that it can be gathered with; the caller masks what the padding slots read.
Tensor index_or_zero(const Tensor& index);
// boxes [N, K, 4] with the rows where valid (bool [N, K]) is false replaced by the unit box (0, 0, 1, 1): padding rows
// (zero boxes) give finite codes in box_encode instead of log(0) and 0 / 0, which a 0 weight could not undo.
Tensor unit_boxes_where_invalid(const Tensor& boxes, const Tensor& valid);

// The largest k of topk, on every device (the GPU's one block sorts a row's k candidates in shared memory).
constexpr int64_t kTopkMaxK = 4096;

}  // namespace ops
