// roi_align.h: RoIAlign over the levels of a feature pyramid (Mask R-CNN's box and mask poolers), and its backward.
//
//   roi_align(levels, rois, roi_levels, p) -> [R, p.out_h, p.out_w, C]
//     levels      L feature maps [N, H_l, W_l, C] (NHWC; one dtype, one device, the same N and C)
//     rois        f32 [R, 5]: (image index, x1, y1, x2, y2) in input-image pixels
//     roi_levels  i64 [R]: the level each RoI is pooled from (FPN level assignment). A RoI whose level is outside
//                 [0, L) or whose image index is outside [0, N) is padding: its output is 0 and it gets no gradient
//                 (the fixed RoI counts of Mask R-CNN are padded so).
//   Output bin (ph, pw) of RoI r, channel c: the mean of sampling_ratio x sampling_ratio bilinear samples of level
//   l = roi_levels[r] at scale s_l = p.scales[l], maskrcnn-benchmark's ROIAlign (torchvision's roi_align with
//   aligned = false): the box (x1 s, y1 s) .. (x2 s, y2 s) at least 1 x 1, cut into out_h x out_w bins; a sample at
//   (y, x) outside [-1, H] x [-1, W] is 0, else it is clamped into the map and interpolated from its 4 neighbours.
//   p.aligned = true shifts the box by -0.5 pixel and drops the 1 x 1 minimum (Detectron2's ROIAlignV2).
//   The rois and roi_levels are data: no gradient reaches them.
//
//   roi_align_backward(g, level_shapes, rois, roi_levels, p) -> one dx per level: the adjoint (the transpose of the
//     linear map x -> roi_align(x)), so the rule of each op is the other. Deterministic on every device, no float
//     atomics: each input pixel sums the contributions that reach it in one fixed order (RoI, bin row, bin column,
//     sample row, sample column, neighbour), the order the cpu's loops run in (ops/cpu/roi_align.h).
//
// Accumulation in f32 (f64 for f64 maps). FLOPs: per sample, 4 multiply-adds per channel plus the divide, i.e.
// 9 R out_h out_w sampling_ratio^2 C (the same count for the backward).
#pragma once
#include <vector>

#include "engine/tensor.h"

namespace ops {

using engine::Shape;
using engine::Tensor;

struct RoiAlignParams {
  int64_t out_h = 7, out_w = 7;
  int64_t sampling_ratio = 2;  // samples per bin side (> 0: maskrcnn-benchmark's fixed count)
  std::vector<double> scales;  // per level: feature pixels per input pixel (1/4 .. 1/32 for P2 .. P5)
  bool aligned = false;
};

Tensor roi_align(const std::vector<Tensor>& levels, const Tensor& rois, const Tensor& roi_levels,
                 const RoiAlignParams& p);
std::vector<Tensor> roi_align_backward(const Tensor& g, const std::vector<Shape>& level_shapes, const Tensor& rois,
                                       const Tensor& roi_levels, const RoiAlignParams& p);

}  // namespace ops
