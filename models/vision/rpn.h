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
//   Built from ops (ops/detection.h: topk, box_decode, nms) with no kernel of its own.
#pragma once
#include <vector>

#include "engine/tensor.h"

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

Proposals rpn_proposals(const std::vector<engine::Tensor>& objectness, const std::vector<engine::Tensor>& deltas,
                        const std::vector<engine::Tensor>& anchors, const engine::Tensor& image_hw, const RpnParams& p);

}  // namespace models::vision
