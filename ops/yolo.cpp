// yolo.cpp: the yolo_targets op: checks, the two fixed-shape outputs, the cpu / cuda kernels. No autograd node:
// targets are constants of the loss (the predictions are read, never differentiated through here).
#include "ops/yolo.h"

#include "ops/cpu/yolo.h"
#include "ops/cuda/yolo.h"
#include "ops/elementwise.h"
#include "ops/op.h"

namespace ops {

YoloTargets yolo_targets(const Tensor& pred_in, const Tensor& boxes_in, const Tensor& labels_in,
                         const YoloTargetParams& p) {
  OpScope scope("yolo_targets");
  check_floating("yolo_targets", "pred", pred_in);
  check_dim("yolo_targets", "pred", pred_in, 5);
  check_dtype("yolo_targets", "boxes", boxes_in, DType::f32);
  check_dim("yolo_targets", "boxes", boxes_in, 3);
  check_dtype("yolo_targets", "labels", labels_in, DType::i64);
  check_dim("yolo_targets", "labels", labels_in, 2);
  check_same_device("yolo_targets", pred_in, boxes_in);
  check_same_device("yolo_targets", pred_in, labels_in);
  const Shape& s = pred_in.shape();
  const int64_t N = s[0], A = s[3], D = s[4], M = boxes_in.shape()[1];
  ENGINE_CHECK(D > 5, "yolo_targets: pred ", engine::shape_str(s), " must be [N, H, W, A, 5 + classes] with ",
               "at least one class");
  ENGINE_CHECK(boxes_in.shape() == (Shape{N, M, 4}) && labels_in.shape() == (Shape{N, M}), "yolo_targets: boxes ",
               engine::shape_str(boxes_in.shape()), " and labels ", engine::shape_str(labels_in.shape()),
               " must be [N, M, 4] and [N, M] with pred's N = ", N);
  ENGINE_CHECK(int64_t(p.mask.size()) == A, "yolo_targets: mask has ", p.mask.size(), " anchors, pred ",
               engine::shape_str(s), " has A = ", A);
  for (int64_t m : p.mask)
    ENGINE_CHECK(m >= 0 && m < int64_t(p.anchors.size()), "yolo_targets: mask entry ", m, " is not one of the ",
                 p.anchors.size(), " anchors");
  ENGINE_CHECK(p.anchors.size() <= size_t(cpu::YoloGeometry::kMaxAnchors), "yolo_targets: ", p.anchors.size(),
               " anchors, at most ", cpu::YoloGeometry::kMaxAnchors, " supported");
  for (const auto& a : p.anchors)
    ENGINE_CHECK(a[0] > 0 && a[1] > 0, "yolo_targets: anchor (", a[0], ", ", a[1], ") must be positive");
  ENGINE_CHECK(p.image_w > 0 && p.image_h > 0, "yolo_targets: image size ", p.image_w, "x", p.image_h,
               " must be positive");
  // Contiguous copies only when needed (the model passes a reshaped convolution output: a view, no copy).
  const Tensor pred = contiguous(pred_in.detach()), boxes = contiguous(boxes_in), labels = contiguous(labels_in);
  YoloTargets out;
  out.target = new_empty(pred, s, pred.dtype());
  out.weight = new_empty(pred, s, pred.dtype() == DType::f64 ? DType::f64 : DType::f32);
  run_kernel("yolo_targets", pred, [&] { cpu::yolo_targets(pred, boxes, labels, p, out.target, out.weight); },
             CUDA_KERNEL(cuda::yolo_targets(pred, boxes, labels, p, out.target, out.weight)));
  // ~20 flops per prediction and truth for the decode and IoU; bytes: pred read, two outputs written.
  engine::count_op("yolo_targets", 20.0 * double(pred.numel() / D) * double(M),
                   double(pred.nbytes() + out.target.nbytes() + out.weight.nbytes()));
  return out;
}

}  // namespace ops
