// vision/rpn.h: the region proposal network's proposal selection (torchvision's RegionProposalNetwork
// .filter_proposals, Mask R-CNN's first stage), with fixed counts: per level the pre_nms_top_n anchors of highest
// objectness, decoded and clipped to their image, small boxes dropped, NMS per level, then the post_nms_top_n best
// of the survivors over all levels. torchvision returns a different number of proposals per image; here every image
// has min(post_nms_top_n, the candidates) slots, the survivors first (decreasing score) and then padding (valid
// false, score -1, box 0), so a step's memory does not depend on the image.
//
//   rpn_proposals(objectness, deltas, anchors, image_hw, p) -> {boxes [N, post, 4], scores [N, post], valid [N, post]}
//     objectness  per level l: [N, K_l] logits (detached inside: proposals carry no gradient)
//     deltas      per level l: [N, K_l, 4] box codes (weights 1, 1, 1, 1), detached too
//     anchors     per level l: [K_l, 4] (ops::grid_anchors), the same order as the logits
//     image_hw    f32 [N, 2]: each image's height and width before padding (the clip)
//
//   rpn_targets(anchors, truths, truth_valid, high, low) -> {labels i64 [N, A], targets f32 [N, A, 4]}
//     anchors [A, 4] (every level's, concatenated in the logits' order), truths [N, G, 4], truth_valid bool [N, G]
//     (padding truths false): torchvision's assign_targets_to_anchors, Matcher(0.7, 0.3, low-quality matches on):
//     label 1 (matched), 0 (background), -1 (between the thresholds: not trained); targets the codes (weights 1) of
//     each anchor's matched truth (truth 0 for the unmatched: unused).
//   rpn_loss(objectness [N, A], deltas [N, A, 4], targets, sampled) -> {objectness, box}: torchvision's
//     compute_loss on the sampled slots (ops::sample_balanced of the labels: 256 per image, half positive): binary
//     cross-entropy of the sampled logits against label == 1, averaged over the sampled slots of the batch, and
//     smooth L1 (beta 1/9) of the positives' codes, summed and divided by the same count. Padding slots count for
//     nothing. Differentiable in objectness and deltas.
//   Built from ops (ops/detection.h: topk, box_decode, nms, box_iou, match_boxes, box_encode) with no kernel of its
//   own.
#pragma once
#include <vector>

#include "engine/tensor.h"
#include "ops/detection.h"  // Sampled

namespace models::vision {

struct RpnParams {
  int64_t pre_nms_top_n = 2000;   // per level and image (training; 1000 at test time)
  int64_t post_nms_top_n = 2000;  // per image
  double nms_threshold = 0.7;
  double min_size = 1e-3;  // remove_small_boxes
};

struct Proposals {
  engine::Tensor boxes;   // f32 [N, post, 4]
  engine::Tensor scores;  // f32 [N, post]: sigmoid(objectness), -1 in padding
  engine::Tensor valid;   // bool [N, post]
};

struct RpnTargets {
  engine::Tensor labels;   // i64 [N, A]: 1, 0 or -1
  engine::Tensor targets;  // f32 [N, A, 4]
};

struct RpnLoss {
  engine::Tensor objectness, box;  // f32 scalars
};

Proposals rpn_proposals(const std::vector<engine::Tensor>& objectness, const std::vector<engine::Tensor>& deltas,
                        const std::vector<engine::Tensor>& anchors, const engine::Tensor& image_hw, const RpnParams& p);
RpnTargets rpn_targets(const engine::Tensor& anchors, const engine::Tensor& truths, const engine::Tensor& truth_valid,
                       double high = 0.7, double low = 0.3);
RpnLoss rpn_loss(const engine::Tensor& objectness, const engine::Tensor& deltas, const engine::Tensor& targets,
                 const ops::Sampled& sampled);

}  // namespace models::vision
