// vision/roi_heads.h: the box head's training targets and loss (torchvision's RoIHeads.select_training_samples and
// fastrcnn_loss, Mask R-CNN's second stage), with fixed counts: every image's candidates are its RPN proposal slots
// followed by its truth slots (add_gt_proposals), padding included and labelled -1, so shapes do not depend on the
// image.
//
//   roi_targets(proposals, proposal_valid, truths, truth_labels, truth_valid) -> {boxes, labels, targets}
//     proposals [N, P, 4] (rpn_proposals' boxes), proposal_valid bool [N, P], truths [N, G, 4], truth_labels i64
//     [N, G] (classes 1 .. C - 1), truth_valid bool [N, G]. Candidates [N, P + G, 4]; Matcher(0.5, 0.5, no low-quality
//     matches) against the valid truths: label = the matched truth's class, 0 for background, -1 for a padding
//     candidate; targets = BoxCoder(10, 10, 5, 5) codes of each candidate's matched truth (truth 0 if none: unused;
//     padding boxes count as unit boxes there, so every code is finite); matched = the matched truth's index (-1
//     below the threshold).
//   sampler_labels(labels) -> 1 (foreground), 0 (background), -1: the input of ops::sample_balanced (512 per image,
//     a quarter positive in Mask R-CNN).
//   take_samples(t, sampled) -> the sampled slots' boxes [N, num, 4], labels [N, num] (-1 in padding slots),
//     targets [N, num, 4] and matched truths [N, num]: what the box and mask heads pool and are trained on.
//   fastrcnn_loss(class_logits [N num, C], box_regression [N num, 4 C], labels, targets) -> {classifier, box}:
//     cross-entropy over the sampled slots (mean; padding ignored), and smooth L1 (beta 1/9) of the foreground
//     slots' codes for their own class, summed and divided by the sampled count. Differentiable in the logits and
//     the regression.
//   mask_loss(mask_logits [R, M, M, C], labels [R] or [N, F], mask_targets [R, M, M]) -> f32 scalar: torchvision's
//     maskrcnn_loss once the targets are made: binary cross-entropy of each foreground slot's logits for its own class
//     against its target, the mean over the foreground slots' pixels; slots with label <= 0 (background, padding)
//     count for nothing. In fixed slots: the mask head runs on the first F = 128 slots of each image's draw, where
//     ops::sample_balanced puts the positives (at most a quarter of 512). Differentiable in the logits.
//   Built from ops (ops/detection.h, cross_entropy, smooth_l1_loss, bce_with_logits) with no kernel of their own.
#pragma once
#include "engine/tensor.h"
#include "ops/detection.h"  // Sampled

namespace models::vision {

struct RoiTargets {
  engine::Tensor boxes;    // f32 [N, S, 4]
  engine::Tensor labels;   // i64 [N, S]
  engine::Tensor targets;  // f32 [N, S, 4]
  engine::Tensor matched;  // i64 [N, S]: the matched truth's index (the mask head's target), < 0 for none
};

struct FastRcnnLoss {
  engine::Tensor classifier, box;  // f32 scalars
};

RoiTargets roi_targets(const engine::Tensor& proposals, const engine::Tensor& proposal_valid,
                       const engine::Tensor& truths, const engine::Tensor& truth_labels,
                       const engine::Tensor& truth_valid);
engine::Tensor sampler_labels(const engine::Tensor& labels);
RoiTargets take_samples(const RoiTargets& t, const ops::Sampled& sampled);
FastRcnnLoss fastrcnn_loss(const engine::Tensor& class_logits, const engine::Tensor& box_regression,
                           const engine::Tensor& labels, const engine::Tensor& targets);
engine::Tensor mask_loss(const engine::Tensor& mask_logits, const engine::Tensor& labels,
                         const engine::Tensor& mask_targets);

}  // namespace models::vision
