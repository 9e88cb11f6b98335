// cpu/yolo.h: the CPU reference kernel of YOLOv3 target assignment (ops/yolo.h says what it computes), and
// the per-prediction and per-truth math it is made of, ENGINE_HD so that the CUDA kernel (cuda/yolo.cu)
// runs the same lines. Everything is computed in double.
#pragma once
#include <cmath>
#include <cstdint>

#include "engine/rng.h"  // ENGINE_HD
#include "engine/tensor.h"
#include "ops/yolo.h"

namespace ops::cpu {

// The shapes and anchors of one scale, by value (a kernel argument).
struct YoloGeometry {
  static constexpr int kMaxAnchors = 16;
  int64_t H = 0, W = 0, A = 0, D = 0, M = 0;  // pred [N, H, W, A, D], boxes [N, M, 4]
  int64_t anchors = 0;                        // all scales' anchors
  double anchor_w[kMaxAnchors] = {}, anchor_h[kMaxAnchors] = {};  // as fractions of the image
  int64_t mask[kMaxAnchors] = {};             // this scale's A anchors
  double ignore_thresh = 0.5;
};
YoloGeometry yolo_geometry(const engine::Tensor& pred, const engine::Tensor& boxes, const YoloTargetParams& p);

// IoU of two boxes given as centre and size.
ENGINE_HD double yolo_iou(double ax, double ay, double aw, double ah, double bx, double by, double bw, double bh) {
  const double ox = fmax(fmin(ax + aw / 2, bx + bw / 2) - fmax(ax - aw / 2, bx - bw / 2), 0.0);
  const double oy = fmax(fmin(ay + ah / 2, by + bh / 2) - fmax(ay - ah / 2, by - bh / 2), 0.0);
  const double inter = ox * oy, uni = aw * ah + bw * bh - inter;
  return uni > 0 ? inter / uni : 0.0;
}

// Whether the prediction (raw tx, ty, tw, th) of anchor a at cell (j, i) decodes to a box whose IoU with
// one of its image's truths (boxes [M, 4], labels [M]; labels < 0 are padding) exceeds ignore_thresh.
ENGINE_HD bool yolo_ignored(const YoloGeometry& g, double tx, double ty, double tw, double th, int64_t j, int64_t i,
                            int64_t a, const float* boxes, const int64_t* labels) {
  const int64_t k = g.mask[a];
  const double x = (double(i) + 1.0 / (1.0 + exp(-tx))) / double(g.W),
               y = (double(j) + 1.0 / (1.0 + exp(-ty))) / double(g.H);
  const double w = exp(tw) * g.anchor_w[k], h = exp(th) * g.anchor_h[k];
  double best = 0;
  for (int64_t m = 0; m < g.M; m++)
    if (labels[m] >= 0)
      best = fmax(best, yolo_iou(x, y, w, h, boxes[4 * m], boxes[4 * m + 1], boxes[4 * m + 2], boxes[4 * m + 3]));
  return best > g.ignore_thresh;
}

// Where a truth (cx, cy, w, h) goes on this scale: its best anchor by shape among all the scales' anchors,
// taken (a >= 0) only when that anchor is one of this scale's; the cell holding its centre; the regression
// targets and the box weight 2 - w h.
struct YoloAssignment {
  int64_t a = -1, j = 0, i = 0;
  double t[4] = {};
  double scale = 0;
};
ENGINE_HD YoloAssignment yolo_assign(const YoloGeometry& g, const float* box) {
  const double cx = box[0], cy = box[1], w = box[2], h = box[3];
  YoloAssignment r;
  int64_t best_anchor = 0;
  double best_iou = -1;
  for (int64_t k = 0; k < g.anchors; k++) {
    const double iou = yolo_iou(0, 0, w, h, 0, 0, g.anchor_w[k], g.anchor_h[k]);
    if (iou > best_iou) best_iou = iou, best_anchor = k;
  }
  for (int64_t a = 0; a < g.A; a++)
    if (g.mask[a] == best_anchor) r.a = a;
  if (r.a < 0) return r;
  // The cell, clamped to the grid before the conversion: a NaN or huge centre (from a batch file) must not
  // reach an integer conversion (undefined behaviour); NaN lands in cell 0.
  const double fx = cx * double(g.W), fy = cy * double(g.H);
  r.i = !(fx >= 0) ? 0 : fx >= double(g.W) ? g.W - 1 : int64_t(fx);
  r.j = !(fy >= 0) ? 0 : fy >= double(g.H) ? g.H - 1 : int64_t(fy);
  r.t[0] = cx * double(g.W) - double(r.i);
  r.t[1] = cy * double(g.H) - double(r.j);
  r.t[2] = log(w / g.anchor_w[best_anchor]);
  r.t[3] = log(h / g.anchor_h[best_anchor]);
  r.scale = 2.0 - w * h;  // small boxes weigh more (darknet's delta scale)
  return r;
}

// pred [N, H, W, A, 5 + C] contiguous; boxes [N, M, 4] f32 contiguous; labels [N, M] i64 contiguous;
// target (pred's dtype) and weight (acc dtype) [N, H, W, A, 5 + C] contiguous, fully written.
void yolo_targets(const engine::Tensor& pred, const engine::Tensor& boxes, const engine::Tensor& labels,
                  const YoloTargetParams& p, const engine::Tensor& target, const engine::Tensor& weight);

}  // namespace ops::cpu
