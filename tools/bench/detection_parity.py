#!/usr/bin/env python3
"""Writes tests/data/detection_reference.safetensors: torchvision's own detection utilities on random boxes, for
tests/ops/detection_test.cpp (Detection.MatchesTorchvision) to hold ops::box_iou, nms, box_encode, box_decode and
match_boxes to the library whose Mask R-CNN the engine's is meant to equal.

One image: "anchors" [A, 4], "truths" [G + 2, 4] whose last two rows are padding (given to the engine with
gt_valid false, not to torchvision), "deltas" [A, 4] random codes; torchvision's outputs: "expected.iou" [G, A]
(box_iou), "expected.matches_rpn" (Matcher(0.7, 0.3, allow_low_quality_matches=True)), "expected.matches_head"
(Matcher(0.5, 0.5, False)), "expected.encoded" (BoxCoder((10, 10, 5, 5)).encode_single of each anchor's best truth),
"expected.decoded" (decode_single of the deltas, then clip_boxes_to_image at 600 x 800), "scores" [A] and
"expected.keep" (nms at 0.7 over the anchors by score; the engine takes them sorted by score); "expected.anchors"
(AnchorGenerator(sizes ((32,), (64,)), ratios (0.5, 1, 2)) on a 64 x 96 image with 16 x 24 and 8 x 12 maps, the two
levels concatenated); "level_boxes" [1, 300, 4] and "expected.levels" (LevelMapper(2, 5) - 2); for
models/vision/rpn.h: "rpn.objectness" [2, K] and "rpn.deltas" [2, K, 4] over those anchors, and
RegionProposalNetwork.filter_proposals's result (pre_nms_top_n 200, post_nms_top_n 150, NMS 0.7, images 64 x 96
and 60 x 90) padded to 150 slots: "expected.rpn.boxes" [2, 150, 4] (0 in padding), "expected.rpn.scores" (-1),
"expected.rpn.count" [2]; the RPN's training targets and loss: "rpn.truths" [2, 3, 4] (image 1's third row
padding), torchvision's assign_targets_to_anchors and encode ("expected.rpn.labels" [2, K], "expected.rpn.targets"
[2, K, 4]), and compute_loss with its sampler replaced by a fixed draw ("rpn.sampled_index", "rpn.sampled_label"
[2, 256]: the first positives, at most 128, then the first negatives, then padding; ops::sample_balanced's slot
layout): "expected.rpn.loss" [2] (objectness, box). For models/vision/roi_heads.h: "roi.proposals" [2, 60, 4],
"roi.truth_labels" [2, 3] (image 1's third padding), RoIHeads' add_gt_proposals + assign_targets_to_proposals
("expected.roi.labels" [2, 63], -1 where the engine's padding truth stands) and encode ("expected.roi.targets"),
then fastrcnn_loss on a fixed draw of 32 slots per image ("roi.sampled_index", "roi.sampled_label", a quarter
positive at most) with random "roi.class_logits" [64, 5] and "roi.box_regression" [64, 20]: "expected.roi.loss".
Regenerate: python3 tools/bench/detection_parity.py   (made with torch 2.15.0, torchvision 0.29.2, on the cpu)
"""
import os

import torch
from safetensors.torch import save_file
from torchvision.models.detection._utils import BoxCoder, Matcher
from torchvision.models.detection.anchor_utils import AnchorGenerator
from torchvision.models.detection.image_list import ImageList
from torchvision.models.detection.roi_heads import RoIHeads, fastrcnn_loss
from torchvision.models.detection.rpn import RegionProposalNetwork, RPNHead
from torchvision.ops import box_iou, clip_boxes_to_image, nms
from torchvision.ops.poolers import LevelMapper

torch.manual_seed(0)


def boxes(n, extent_w=800, extent_h=600, size=200):
    xy = torch.rand(n, 2) * torch.tensor([extent_w, extent_h])
    wh = 4 + torch.rand(n, 2) * size
    return torch.cat([xy, xy + wh], 1)


A, G = 500, 7
anchors = boxes(A)
anchors[:20] = anchors[0]  # ties: twenty equal anchors (one best IoU shared by many)
truths = torch.cat([boxes(G), torch.tensor([[0.0, 0.0, 800.0, 600.0], [10.0, 10.0, 50.0, 50.0]])])
iou = box_iou(truths[:G], anchors)
rpn = Matcher(0.7, 0.3, allow_low_quality_matches=True)(iou)
head = Matcher(0.5, 0.5, allow_low_quality_matches=False)(iou)
best = iou.argmax(0)
coder = BoxCoder((10.0, 10.0, 5.0, 5.0))
encoded = coder.encode_single(truths[best], anchors)
deltas = torch.randn(A, 4) * 2
deltas[5, 2:] = 9.0  # beyond the log(1000 / 16) clip
decoded = clip_boxes_to_image(coder.decode_single(deltas, anchors), (600, 800))
scores = torch.rand(A)
order = scores.argsort(descending=True)
keep = nms(anchors, scores, 0.7)  # indices into anchors; the engine's are into the sorted order
rank = torch.empty(A, dtype=torch.int64)
rank[order] = torch.arange(A)
out = {"anchors": anchors, "truths": truths, "deltas": deltas, "scores": scores, "order": order,
       "expected.iou": iou, "expected.matches_rpn": rpn, "expected.matches_head": head, "expected.encoded": encoded,
       "expected.decoded": decoded, "expected.keep_sorted": rank[keep]}
generator = AnchorGenerator(sizes=((32,), (64,)), aspect_ratios=((0.5, 1.0, 2.0),) * 2)
images = ImageList(torch.zeros(1, 3, 64, 96), [(64, 96)])
out["expected.anchors"] = torch.cat(generator(images, [torch.zeros(1, 8, 16, 24), torch.zeros(1, 8, 8, 12)])[0].split(
    [16 * 24 * 3, 8 * 12 * 3]))
side = torch.exp(torch.rand(300) * 7)  # sqrt(area) from 1 to 1100: every level and both clamps
corner = torch.rand(300, 2) * 100
level_boxes = torch.cat([corner, corner + side[:, None] * torch.stack([torch.rand(300) + 0.5, torch.ones(300)], 1)], 1)
level_boxes[:, 3] = level_boxes[:, 1] + side * side / (level_boxes[:, 2] - level_boxes[:, 0])
out["level_boxes"] = level_boxes[None]
out["expected.levels"] = LevelMapper(2, 5)([level_boxes])
K0, K1 = 16 * 24 * 3, 8 * 12 * 3
rpn = RegionProposalNetwork(generator, RPNHead(8, 3), 0.7, 0.3, 256, 0.5, dict(training=200, testing=200),
                            dict(training=150, testing=150), 0.7).eval()
objectness = torch.randn(2, K0 + K1)
codes = torch.randn(2, K0 + K1, 4) * 0.5
anchor_list = out["expected.anchors"]
decoded_rpn = rpn.box_coder.decode(codes.reshape(-1, 4), [anchor_list, anchor_list]).view(2, -1, 4)
kept_boxes, kept_scores = rpn.filter_proposals(decoded_rpn, objectness.reshape(-1, 1), [(64, 96), (60, 90)], [K0, K1])
out["rpn.objectness"], out["rpn.deltas"] = objectness, codes
out["expected.rpn.boxes"] = torch.zeros(2, 150, 4)
out["expected.rpn.scores"] = -torch.ones(2, 150)
out["expected.rpn.count"] = torch.tensor([len(s) for s in kept_scores], dtype=torch.int64)
for n in range(2):
    out["expected.rpn.boxes"][n, : len(kept_scores[n])] = kept_boxes[n]
    out["expected.rpn.scores"][n, : len(kept_scores[n])] = kept_scores[n]
truth_boxes = [torch.tensor([[10.0, 8.0, 40.0, 30.0], [50.0, 20.0, 90.0, 60.0], [30.0, 30.0, 44.0, 50.0]]),
               torch.tensor([[5.0, 5.0, 60.0, 40.0], [70.0, 10.0, 95.0, 35.0]])]
labels, matched = rpn.assign_targets_to_anchors([anchor_list, anchor_list], [{"boxes": b} for b in truth_boxes])
regression = rpn.box_coder.encode(matched, [anchor_list, anchor_list])
out["rpn.truths"] = torch.stack([truth_boxes[0], torch.cat([truth_boxes[1], torch.zeros(1, 4)])])
out["expected.rpn.labels"] = torch.stack(labels).to(torch.int64)
out["expected.rpn.targets"] = torch.stack(regression)
index, label, pos_masks, neg_masks = [], [], [], []
for lab in labels:
    pos = torch.where(lab == 1)[0][:128]
    neg = torch.where(lab == 0)[0][: 256 - len(pos)]
    index.append(torch.cat([pos, neg, torch.zeros(256 - len(pos) - len(neg), dtype=torch.int64)]))
    label.append(torch.cat([torch.ones(len(pos)), torch.zeros(len(neg)), -torch.ones(256 - len(pos) - len(neg))]))
    pos_masks.append(torch.zeros_like(lab, dtype=torch.uint8).index_fill_(0, pos, 1))
    neg_masks.append(torch.zeros_like(lab, dtype=torch.uint8).index_fill_(0, neg, 1))
out["rpn.sampled_index"], out["rpn.sampled_label"] = torch.stack(index), torch.stack(label).to(torch.int64)
rpn.fg_bg_sampler = lambda _labels: (pos_masks, neg_masks)
losses = rpn.compute_loss(objectness.reshape(-1, 1), codes.reshape(-1, 4), labels, regression)
out["expected.rpn.loss"] = torch.stack(list(losses))
heads = RoIHeads(None, None, None, 0.5, 0.5, 512, 0.25, (10.0, 10.0, 5.0, 5.0), 0.05, 0.5, 100)
proposals = [boxes(60, 96, 64, 40), boxes(60, 96, 64, 40)]
truth_labels = [torch.tensor([1, 4, 2]), torch.tensor([3, 1])]
candidates = heads.add_gt_proposals(proposals, truth_boxes)
matched_idxs, roi_labels = heads.assign_targets_to_proposals(candidates, truth_boxes, truth_labels)
roi_targets = heads.box_coder.encode([truth_boxes[n][matched_idxs[n]] for n in range(2)], candidates)
out["roi.proposals"] = torch.stack(proposals)
out["roi.truth_labels"] = torch.stack([truth_labels[0], torch.cat([truth_labels[1], torch.zeros(1, dtype=torch.int64)])])
out["expected.roi.labels"] = torch.stack([roi_labels[0], torch.cat([roi_labels[1], -torch.ones(1, dtype=torch.int64)])])
out["expected.roi.targets"] = torch.stack([roi_targets[0], torch.cat([roi_targets[1], torch.zeros(1, 4)])])
sampled_index, sampled_label, head_labels, head_targets = [], [], [], []
for n in range(2):
    pos = torch.where(roi_labels[n] > 0)[0][:8]
    neg = torch.where(roi_labels[n] == 0)[0][: 32 - len(pos)]
    take = torch.cat([pos, neg])
    sampled_index.append(torch.cat([take, torch.zeros(32 - len(take), dtype=torch.int64)]))
    sampled_label.append(torch.cat([torch.ones(len(pos)), torch.zeros(len(neg)), -torch.ones(32 - len(take))]))
    head_labels.append(roi_labels[n][take])
    head_targets.append(roi_targets[n][take])
assert all(len(t) == 32 for t in head_labels), "the fixed draw must fill every slot (torchvision has no padding)"
out["roi.sampled_index"], out["roi.sampled_label"] = torch.stack(sampled_index), torch.stack(sampled_label).long()
out["roi.class_logits"], out["roi.box_regression"] = torch.randn(64, 5), torch.randn(64, 20) * 0.3
out["expected.roi.loss"] = torch.stack(list(fastrcnn_loss(out["roi.class_logits"], out["roi.box_regression"],
                                                          head_labels, head_targets)))
here = os.path.dirname(os.path.abspath(__file__))
save_file({k: v.contiguous() for k, v in out.items()},
          os.path.join(here, "..", "..", "tests", "data", "detection_reference.safetensors"),
          metadata={"made_by": "tools/bench/detection_parity.py"})
