// yolo.h: YOLOv3 target assignment (Redmon & Farhadi 2018; pjreddie/darknet src/yolo_layer.c), as an op so
// that it runs where the predictions are, with fixed-shape outputs, and never on the host.
//
// yolo_targets(pred, boxes, labels, p) -> {target, weight}, for one detection scale:
//   pred    [N, H, W, A, 5 + C]  the scale's raw head output (tx, ty, tw, th, objectness, C class logits per
//                                anchor of this scale); read only (no gradient flows through the op)
//   boxes   [N, M, 4] f32        ground truth (cx, cy, w, h) as fractions of the image; M is a fixed maximum
//                                (100 in the model): rows are padding where labels < 0
//   labels  [N, M] i64           class in [0, C), or < 0 for a padded row (ignored entirely)
//   target  [N, H, W, A, 5 + C]  pred's dtype: tx, ty (the box centre's offset in its cell, in [0, 1)),
//                                tw, th (log(box size / anchor size)), objectness (1 assigned, 0 otherwise),
//                                class one-hot (several truths on one anchor: several ones, as darknet)
//   weight  [N, H, W, A, 5 + C]  f32 (f64 for f64 pred): box columns (2 - w h) where a truth is assigned, else 0;
//                                objectness 1, except 0 for an unassigned anchor whose predicted box has IoU >
//                                ignore_thresh with some truth (darknet's "ignore"); classes 1 where assigned
// Assignment (darknet): each truth goes to the cell holding its centre, on the anchor (of all the scales'
// anchors) whose shape (w, h, both centred at 0) has the best IoU with its own; a scale takes it only if that
// anchor is one of the scale's (p.mask). Two truths on one cell and anchor: the later one's box wins.
// The ignore test decodes every prediction ((i + sigmoid(tx)) / W, (j + sigmoid(ty)) / H, exp(tw) anchor_w /
// image_w, exp(th) anchor_h / image_h) and compares it with every truth of its image.
// Kernels: cpu (the reference loops, O(N H W A M)) and cuda (cuda/yolo.cu: the same ENGINE_HD math from
// cpu/yolo.h, a thread per prediction then a thread per image); meta allocates the same two outputs and runs
// nothing. Bad labels (>= C) are an Error raised by the kernel (on cuda after a stream synchronization).
#pragma once
#include <array>
#include <cstdint>
#include <vector>

#include "engine/tensor.h"

namespace ops {

using engine::Tensor;

struct YoloTargetParams {
  std::vector<std::array<double, 2>> anchors;  // every scale's anchors (w, h) in pixels, e.g. darknet's 9
  std::vector<int64_t> mask;                   // which of `anchors` this scale predicts (A of them)
  int64_t image_w = 0, image_h = 0;            // the network input size in pixels (anchors are in these units)
  double ignore_thresh = 0.5;
};

struct YoloTargets {
  Tensor target;  // [N, H, W, A, 5 + C] pred's dtype
  Tensor weight;  // [N, H, W, A, 5 + C] f32 (f64 for f64 pred)
};

YoloTargets yolo_targets(const Tensor& pred, const Tensor& boxes, const Tensor& labels, const YoloTargetParams& p);

}  // namespace ops
