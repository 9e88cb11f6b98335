// cpu/yolo.cpp: YOLOv3 target assignment as plain loops, in darknet's order: first every prediction's
// objectness (a negative, or ignored when it already overlaps a truth), then each truth's positive anchor
// (in slot order: a later truth on the same cell and anchor overwrites the box targets).
#include "ops/cpu/yolo.h"

#include <algorithm>

#include "ops/cpu/cpu_util.h"

namespace ops::cpu {

YoloGeometry yolo_geometry(const Tensor& pred, const Tensor& boxes, const YoloTargetParams& p) {
  YoloGeometry g;
  const Shape& s = pred.shape();
  g.H = s[1], g.W = s[2], g.A = s[3], g.D = s[4], g.M = boxes.shape()[1];
  g.anchors = int64_t(p.anchors.size());
  for (size_t k = 0; k < p.anchors.size(); k++) {
    g.anchor_w[k] = p.anchors[k][0] / double(p.image_w);
    g.anchor_h[k] = p.anchors[k][1] / double(p.image_h);
  }
  for (size_t a = 0; a < p.mask.size(); a++) g.mask[a] = p.mask[a];
  g.ignore_thresh = p.ignore_thresh;
  return g;
}

void yolo_targets(const Tensor& pred, const Tensor& boxes, const Tensor& labels, const YoloTargetParams& p,
                  const Tensor& target, const Tensor& weight) {
  const YoloGeometry g = yolo_geometry(pred, boxes, p);
  const int64_t N = pred.shape()[0], H = g.H, W = g.W, A = g.A, D = g.D, C = D - 5, M = g.M;
  const float* pb = boxes.data<float>();       // [N, M, 4]
  const int64_t* pl = labels.data<int64_t>();  // [N, M]
  for (int64_t k = 0; k < N * M; k++)
    ENGINE_CHECK(pl[k] < C, "yolo_targets: labels[", k / M, ", ", k % M, "] = ", pl[k], " is not a class of pred's ",
                 C, " (5 + C = ", D, ") nor padding (< 0)");
  ENGINE_FLOAT_SWITCH(pred.dtype(), T, {
    using Acc = acc_t<T>;
    const T* px = pred.data<T>();
    T* pt = target.data<T>();
    Acc* pw = weight.data<Acc>();
    std::fill(pt, pt + target.numel(), st<T>(0.0));
    std::fill(pw, pw + weight.numel(), Acc(0));
    for (int64_t n = 0; n < N; n++) {
      const float* boxes_n = pb + n * M * 4;
      const int64_t* labels_n = pl + n * M;
      for (int64_t j = 0; j < H; j++)
        for (int64_t i = 0; i < W; i++)
          for (int64_t a = 0; a < A; a++) {
            const int64_t cell = (((n * H + j) * W + i) * A + a) * D;
            const T* x = px + cell;
            const bool ignored = yolo_ignored(g, double(ld(x[0])), double(ld(x[1])), double(ld(x[2])), double(ld(x[3])),
                                              j, i, a, boxes_n, labels_n);
            pw[cell + 4] = ignored ? Acc(0) : Acc(1);
          }
      for (int64_t m = 0; m < M; m++) {
        const int64_t label = labels_n[m];
        if (label < 0) continue;
        const YoloAssignment r = yolo_assign(g, boxes_n + 4 * m);
        if (r.a < 0) continue;
        const int64_t cell = (((n * H + r.j) * W + r.i) * A + r.a) * D;
        for (int k = 0; k < 4; k++) {
          pt[cell + k] = st<T>(r.t[k]);
          pw[cell + k] = Acc(r.scale);
        }
        pt[cell + 4] = st<T>(1.0);
        pw[cell + 4] = Acc(1);
        for (int64_t c = 0; c < C; c++) pw[cell + 5 + c] = Acc(1);
        pt[cell + 5 + label] = st<T>(1.0);  // several truths on one anchor: several ones (darknet)
      }
    }
  });
}

}  // namespace ops::cpu
