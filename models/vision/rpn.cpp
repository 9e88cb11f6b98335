// vision/rpn.cpp: the RPN's proposal selection from ops, in torchvision's order (rpn.h).
#include "models/vision/rpn.h"

#include <algorithm>

#include "engine/error.h"
#include "graph/autograd.h"
#include "ops/detection.h"
#include "ops/elementwise.h"
#include "ops/factory.h"
#include "ops/loss.h"
#include "ops/reduce.h"
#include "ops/shape.h"
#include "ops/view.h"

namespace models::vision {

using engine::DType;
using engine::Tensor;

Proposals rpn_proposals(const std::vector<Tensor>& objectness, const std::vector<Tensor>& deltas,
                        const std::vector<Tensor>& anchors, const Tensor& image_hw, const RpnParams& p) {
  ENGINE_CHECK(!objectness.empty() && objectness.size() == deltas.size() && objectness.size() == anchors.size(),
               "rpn_proposals: one objectness, deltas and anchors tensor per level (", objectness.size(), ", ",
               deltas.size(), ", ", anchors.size(), ")");
  ENGINE_CHECK(p.pre_nms_top_n >= 1 && p.post_nms_top_n >= 1, "rpn_proposals: the top-n counts must be >= 1");
  graph::NoGrad no_grad;  // proposals are constants for the second stage (torchvision detaches them)
  const int64_t N = objectness[0].size(0);
  std::vector<Tensor> level_scores, level_boxes;
  int64_t candidates = 0;
  for (size_t l = 0; l < objectness.size(); l++) {
    const Tensor& logit = objectness[l];
    ENGINE_CHECK(logit.dim() == 2 && logit.size(0) == N && deltas[l].shape() == (engine::Shape{N, logit.size(1), 4}) &&
                     anchors[l].shape() == (engine::Shape{logit.size(1), 4}),
                 "rpn_proposals: level ", l, ": objectness [N, K], deltas [N, K, 4] and anchors [K, 4] expected, got ",
                 engine::shape_str(logit.shape()), ", ", engine::shape_str(deltas[l].shape()), ", ",
                 engine::shape_str(anchors[l].shape()));
    const int64_t k = std::min(p.pre_nms_top_n, logit.size(1));
    ops::TopK top = ops::topk(ops::to(logit.detach(), DType::f32), k);  // [N, k], decreasing objectness
    Tensor codes = ops::gather_rows(ops::to(deltas[l].detach(), DType::f32), top.indices);
    Tensor refs = ops::reshape(ops::index_select(anchors[l], 0, ops::reshape(top.indices, {N * k})), {N, k, 4});
    ops::BoxCoderParams unit;  // the RPN's codes have weights 1, 1, 1, 1
    Tensor boxes = ops::box_decode(ops::contiguous(codes), ops::contiguous(refs), unit, image_hw);  // [N, k, 4]
    Tensor w = ops::sub(ops::select(boxes, 2, 2), ops::select(boxes, 2, 0));
    Tensor h = ops::sub(ops::select(boxes, 2, 3), ops::select(boxes, 2, 1));
    Tensor big = ops::mul(ops::to(ops::compare(ops::CompareOp::ge, w, p.min_size), DType::f32),
                          ops::to(ops::compare(ops::CompareOp::ge, h, p.min_size), DType::f32));
    Tensor keep = ops::nms(boxes, ops::compare(ops::CompareOp::gt, big, 0.5), p.nms_threshold, k);  // [N, k]
    // Survivors' scores (sigmoid of the logit), -1 in the padding slots; their boxes, 0 there.
    Tensor kept = ops::to(ops::compare(ops::CompareOp::ge, keep, 0.0), DType::f32);
    Tensor slot = ops::index_or_zero(keep);
    Tensor score = ops::gather(ops::sigmoid(top.values), 1, slot);
    level_scores.push_back(ops::add(ops::mul(score, kept), ops::add(kept, -1.0)));
    level_boxes.push_back(ops::mul(ops::gather_rows(boxes, slot), ops::reshape(kept, {N, k, 1})));
    candidates += k;
  }
  Tensor scores = ops::concat(level_scores, 1), boxes = ops::concat(level_boxes, 1);  // [N, sum k], [N, sum k, 4]
  const int64_t post = std::min(p.post_nms_top_n, candidates);
  ops::TopK best = ops::topk(scores, post);
  Proposals out;
  out.scores = best.values;
  out.boxes = ops::gather_rows(boxes, best.indices);
  out.valid = ops::compare(ops::CompareOp::ge, best.values, 0.0);
  return out;
}

RpnTargets rpn_targets(const Tensor& anchors, const Tensor& truths, const Tensor& truth_valid, double high,
                       double low) {
  ENGINE_CHECK(anchors.dim() == 2 && anchors.size(1) == 4 && truths.dim() == 3 && truths.size(2) == 4,
               "rpn_targets: anchors [A, 4] and truths [N, G, 4] expected, got ", engine::shape_str(anchors.shape()),
               " and ", engine::shape_str(truths.shape()));
  graph::NoGrad no_grad;
  const int64_t N = truths.size(0), A = anchors.size(0);
  Tensor per_image = ops::contiguous(ops::broadcast_to(ops::reshape(anchors, {1, A, 4}), {N, A, 4}));
  Tensor matches = ops::match_boxes(ops::box_iou(truths, per_image), truth_valid, high, low, true);  // [N, A]
  RpnTargets t;
  t.labels = ops::to(ops::sub(ops::to(ops::compare(ops::CompareOp::ge, matches, 0.0), DType::f32),
                              ops::to(ops::compare(ops::CompareOp::eq, matches, -2.0), DType::f32)),
                     DType::i64);
  Tensor truth_index = ops::index_or_zero(matches);
  ops::BoxCoderParams unit;
  // Padding truths become unit boxes for the encoding: an anchor matched to none gets finite (unused) codes.
  Tensor real = truth_valid.defined() ? ops::unit_boxes_where_invalid(truths, truth_valid) : truths;
  t.targets = ops::box_encode(ops::contiguous(ops::gather_rows(real, truth_index)), per_image, unit);
  return t;
}

RpnLoss rpn_loss(const Tensor& objectness, const Tensor& deltas, const Tensor& targets, const ops::Sampled& sampled) {
  const int64_t N = sampled.index.size(0), num = sampled.index.size(1);
  const DType dt = ops::loss_dtype(objectness.dtype());
  Tensor logits = ops::to(ops::gather(objectness, 1, sampled.index), dt);            // [N, num]
  Tensor valid = ops::to(ops::compare(ops::CompareOp::ge, sampled.label, 0.0), dt);  // [N, num]
  Tensor positive = ops::to(ops::compare(ops::CompareOp::eq, sampled.label, 1.0), dt);
  // The batch's sampled count (torchvision's sampled_inds.numel()), at least 1.
  Tensor count = ops::maximum(ops::sum(valid), ops::full({}, 1.0, dt, valid.device_ptr()));
  Tensor bce = ops::bce_with_logits(logits, positive, Tensor(), ops::Reduction::none);  // [N, num]
  RpnLoss loss;
  loss.objectness = ops::div(ops::sum(ops::mul(bce, valid)), count);
  Tensor codes = ops::to(ops::gather_rows(deltas, sampled.index), dt);  // [N, num, 4]
  Tensor wanted = ops::to(ops::gather_rows(targets, sampled.index), dt);
  Tensor box = ops::smooth_l1_loss(codes, wanted, 1.0 / 9, ops::Reduction::none);
  loss.box = ops::div(ops::sum(ops::mul(box, ops::reshape(positive, {N, num, 1}))), count);
  return loss;
}

}  // namespace models::vision
