// vision/roi_heads.cpp: the box head's targets and loss from ops, in torchvision's order (roi_heads.h).
#include "models/vision/roi_heads.h"

#include "engine/error.h"
#include "graph/autograd.h"
#include "ops/elementwise.h"
#include "ops/factory.h"
#include "ops/loss.h"
#include "ops/reduce.h"
#include "ops/shape.h"
#include "ops/view.h"

namespace models::vision {

using engine::DType;
using engine::Tensor;

namespace {

Tensor as_f32(const Tensor& x) { return ops::to(x, DType::f32); }

}  // namespace

RoiTargets roi_targets(const Tensor& proposals, const Tensor& proposal_valid, const Tensor& truths,
                       const Tensor& truth_labels, const Tensor& truth_valid) {
  ENGINE_CHECK(proposals.dim() == 3 && truths.dim() == 3 && truths.size(0) == proposals.size(0) &&
                   truth_labels.shape() == (engine::Shape{truths.size(0), truths.size(1)}),
               "roi_targets: proposals [N, P, 4], truths [N, G, 4] and truth_labels [N, G] expected, got ",
               engine::shape_str(proposals.shape()), ", ", engine::shape_str(truths.shape()), ", ",
               engine::shape_str(truth_labels.shape()));
  graph::NoGrad no_grad;
  RoiTargets t;
  t.boxes = ops::concat({proposals.detach(), truths}, 1);  // [N, S, 4], S = P + G (add_gt_proposals)
  Tensor matches = ops::match_boxes(ops::box_iou(truths, t.boxes), truth_valid, 0.5, 0.5, false);  // [N, S]
  Tensor m = as_f32(matches);
  Tensor index = ops::index_or_zero(m);
  Tensor cls = ops::gather(as_f32(truth_labels), 1, index);                  // the matched truth's class
  Tensor fg = as_f32(ops::compare(ops::CompareOp::ge, m, 0.0));              // matched
  Tensor bg = as_f32(ops::compare(ops::CompareOp::eq, m, -1.0));             // below the threshold
  Tensor candidate = as_f32(ops::concat({proposal_valid, truth_valid}, 1));  // 0 for padding slots
  // label = class (fg), 0 (bg), -1 (between the thresholds: none at 0.5 / 0.5); -1 for a padding candidate.
  Tensor label = ops::sub(ops::mul(fg, cls), ops::sub(ops::add(ops::neg(fg), 1.0), bg));
  label = ops::add(ops::mul(ops::add(label, 1.0), candidate), -1.0);
  t.labels = ops::to(label, DType::i64);
  t.matched = matches;
  ops::BoxCoderParams head;
  head.wx = head.wy = 10, head.ww = head.wh = 5;
  // Padding candidates and padding truths become unit boxes for the encoding: finite codes (never trained on).
  Tensor candidate_valid = ops::concat({proposal_valid, truth_valid}, 1);
  Tensor matched = ops::gather_rows(ops::unit_boxes_where_invalid(truths, truth_valid), index);
  t.targets = ops::box_encode(ops::contiguous(matched), ops::unit_boxes_where_invalid(t.boxes, candidate_valid), head);
  return t;
}

Tensor sampler_labels(const Tensor& labels) {
  return ops::to(ops::minimum(as_f32(labels), ops::full(labels.shape(), 1.0, DType::f32, labels.device_ptr())),
                 DType::i64);
}

RoiTargets take_samples(const RoiTargets& t, const ops::Sampled& sampled) {
  graph::NoGrad no_grad;
  RoiTargets s;
  s.boxes = ops::gather_rows(t.boxes, sampled.index);
  s.targets = ops::gather_rows(t.targets, sampled.index);
  s.matched = ops::to(ops::gather(as_f32(t.matched), 1, sampled.index), DType::i64);
  // A padding slot of the draw (label -1) stays -1; a drawn slot has its candidate's label.
  Tensor drawn = as_f32(ops::compare(ops::CompareOp::ge, sampled.label, 0.0));
  Tensor label = as_f32(ops::gather(t.labels, 1, sampled.index));
  s.labels = ops::to(ops::add(ops::mul(ops::add(label, 1.0), drawn), -1.0), DType::i64);
  return s;
}

FastRcnnLoss fastrcnn_loss(const Tensor& class_logits, const Tensor& box_regression, const Tensor& labels,
                           const Tensor& targets) {
  const int64_t rows = labels.numel(), C = class_logits.size(1);
  ENGINE_CHECK(
      class_logits.dim() == 2 && class_logits.size(0) == rows && box_regression.shape() == (engine::Shape{rows, 4 * C}),
      "fastrcnn_loss: class_logits [R, C] and box_regression [R, 4 C] for R = ", rows, " sampled slots expected, got ",
      engine::shape_str(class_logits.shape()), " and ", engine::shape_str(box_regression.shape()));
  Tensor flat = ops::reshape(labels, {rows});
  FastRcnnLoss loss;
  loss.classifier = ops::cross_entropy(class_logits, flat, -1);
  const DType dt = loss.classifier.dtype();
  Tensor label_f = ops::to(flat, dt);
  Tensor sampled = ops::to(ops::compare(ops::CompareOp::ge, label_f, 0.0), dt);
  Tensor positive = ops::to(ops::compare(ops::CompareOp::gt, label_f, 0.0), dt);
  Tensor count = ops::maximum(ops::sum(sampled), ops::full({}, 1.0, dt, sampled.device_ptr()));
  // Each slot's codes for its own class: box_regression [R, C, 4] at class max(label, 0).
  Tensor cls = ops::index_or_zero(label_f);
  Tensor index = ops::contiguous(ops::broadcast_to(ops::reshape(cls, {rows, 1, 1}), {rows, 1, 4}));
  Tensor codes =
      ops::to(ops::reshape(ops::gather(ops::reshape(box_regression, {rows, C, 4}), 1, index), {rows, 4}), dt);
  Tensor wanted = ops::to(ops::reshape(targets, {rows, 4}), dt);
  Tensor box = ops::smooth_l1_loss(codes, wanted, 1.0 / 9, ops::Reduction::none);  // [R, 4]
  loss.box = ops::div(ops::sum(ops::mul(box, ops::reshape(positive, {rows, 1}))), count);
  return loss;
}

Tensor mask_loss(const Tensor& mask_logits, const Tensor& labels, const Tensor& mask_targets) {
  const int64_t R = labels.numel();
  ENGINE_CHECK(mask_logits.dim() == 4 && mask_logits.size(0) == R && mask_logits.size(1) == mask_logits.size(2) &&
                   mask_targets.shape() == (engine::Shape{R, mask_logits.size(1), mask_logits.size(2)}),
               "mask_loss: mask_logits [R, M, M, C] and mask_targets [R, M, M] for R = ", R, " slots expected, got ",
               engine::shape_str(mask_logits.shape()), " and ", engine::shape_str(mask_targets.shape()));
  const int64_t M = mask_logits.size(1);
  Tensor label_f = as_f32(ops::reshape(labels, {R}));
  Tensor cls = ops::index_or_zero(label_f);
  Tensor index = ops::contiguous(ops::broadcast_to(ops::reshape(cls, {R, 1, 1, 1}), {R, M, M, 1}));
  Tensor logits = ops::reshape(ops::gather(mask_logits, 3, index), {R, M, M});  // each slot's own class
  const DType dt = ops::loss_dtype(logits.dtype());
  logits = ops::to(logits, dt);
  Tensor bce = ops::bce_with_logits(logits, ops::to(mask_targets, dt), Tensor(), ops::Reduction::none);
  Tensor foreground = ops::to(ops::compare(ops::CompareOp::gt, label_f, 0.0), dt);  // [R]
  Tensor pixels = ops::maximum(ops::mul(ops::sum(foreground), double(M * M)), ops::full({}, 1.0, dt, bce.device_ptr()));
  return ops::div(ops::sum(ops::mul(bce, ops::reshape(foreground, {R, 1, 1}))), pixels);
}

}  // namespace models::vision
