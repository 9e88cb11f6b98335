#!/usr/bin/env python3
"""Writes tests/data/maskrcnn_reference.safetensors: torchvision's Mask R-CNN, built from its own modules at the
engine's `--size tiny` shapes, on a seeded batch, for tests/models/maskrcnn_test.cpp (MaskRcnn.MatchesTorchvision).

The network is torchvision's code throughout: its Bottleneck blocks (a ResNet body of width 8 with one block per
stage, the engine's tiny backbone; torchvision's resnet50 itself is too large for a test fixture), FrozenBatchNorm2d
with random statistics and affine parameters (so that they matter), BackboneWithFPN (16 channels, LastLevelMaxPool),
RPNHead, AnchorGenerator (sizes 8 .. 128, ratios 0.5 / 1 / 2), MultiScaleRoIAlign (7 x 7, sampling 2), TwoMLPHead
(64), FastRCNNPredictor, MaskRCNNHeads (4 x 16) and MaskRCNNPredictor, 4 classes. Its random weights are written
under their torchvision names ("backbone.body.conv1.weight", ...: the state dict, OIHW) so the test loads them with
MaskRcnn::load_weights, and beside them under "ref.":
  ref.images            [2, 128, 160, 3] NHWC (the network's input, already normalized and padded)
  ref.features.k        the FPN levels P2..P6 ("0".."3", "pool"), NHWC
  ref.objectness.k      the RPN head's logits per level, [N, H W A] (torchvision's permute_and_flatten order)
  ref.deltas.k          its box codes per level, [N, H W A, 4]
  ref.box.rois          [2, 32, 4]: RoIHeads.select_training_samples' draw (32 per image, a quarter foreground) of
                        jittered truths and random boxes; ref.box.labels [2, 32], ref.box.targets [2, 32, 4]
  ref.box.class_logits  [64, 4] and ref.box.box_regression [64, 16]: box_roi_pool + box_head + box_predictor on them
  ref.box.loss          [2]: fastrcnn_loss (classifier, box regression)
  ref.mask.rois         [2, 8, 4]: each image's foreground slots of that draw, padded to 8 (label 0 beyond)
  ref.mask.labels       [2, 8]; ref.mask.targets [2, 8, 14, 14] (torchvision's project_masks_on_boxes of the truths'
                        full-image masks, 0 in padding); ref.mask.logits [2, 8, 14, 14, 4] NHWC (0 in padding)
  ref.mask.loss         [1]: maskrcnn_loss on the foreground slots
Regenerate: python3 tools/bench/maskrcnn_parity.py   (made with torch 2.15.0, torchvision 0.29.2, on the cpu)

--size full --out FILE [--device cuda]: the same references from torchvision's maskrcnn_resnet50_fpn network itself
(MaskRCNN on resnet50 with FrozenBatchNorm2d, trainable_layers 3, 91 classes: the engine's --size torchvision), two
800 x 1344 images, its default 512 RoIs per image and the foreground padded to 128, TF32 off; 300+ MB, written where
the test runs: MASKRCNN_FULL_REFERENCE=FILE engine_cuda_tests --gtest_filter=MaskRcnnCuda.* (tools/bench/
maskrcnn_gpu.sh parity).
"""
import argparse
import os

import torch
from safetensors.torch import save_file
from torch import nn
from torchvision.models.detection.anchor_utils import AnchorGenerator
from torchvision.models.detection.backbone_utils import BackboneWithFPN
from torchvision.models.detection.faster_rcnn import FastRCNNPredictor, TwoMLPHead
from torchvision.models.detection.mask_rcnn import MaskRCNN, MaskRCNNHeads, MaskRCNNPredictor
from torchvision.models.detection.roi_heads import fastrcnn_loss, maskrcnn_loss, project_masks_on_boxes
from torchvision.models.resnet import Bottleneck
from torchvision.ops import MultiScaleRoIAlign
from torchvision.ops.feature_pyramid_network import LastLevelMaxPool
from torchvision.ops.misc import FrozenBatchNorm2d

ap = argparse.ArgumentParser()
ap.add_argument("--size", default="tiny", choices=["tiny", "full"])
ap.add_argument("--out", default=None)
ap.add_argument("--device", default="cpu")
args = ap.parse_args()
FULL = args.size == "full"
torch.manual_seed(0)
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
N, H, W, CLASSES, WIDTH, FPN = (2, 800, 1344, 91, 64, 256) if FULL else (2, 128, 160, 4, 8, 16)
F, M = (128, 28) if FULL else (8, 14)  # mask slots per image, mask size


class TinyResNet(nn.Module):
    """torchvision's ResNet layout (conv1, bn1, relu, maxpool, layer1..4) with its Bottleneck, one block per stage."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, WIDTH, 7, 2, 3, bias=False)
        self.bn1 = FrozenBatchNorm2d(WIDTH)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        inplanes = WIDTH
        for k in range(4):
            planes, stride = WIDTH << k, 1 if k == 0 else 2
            down = nn.Sequential(nn.Conv2d(inplanes, planes * 4, 1, stride, bias=False), FrozenBatchNorm2d(planes * 4))
            setattr(self, f"layer{k + 1}",
                    nn.Sequential(Bottleneck(inplanes, planes, stride, down, norm_layer=FrozenBatchNorm2d)))
            inplanes = planes * 4


if FULL:
    from torchvision.models import resnet50
    from torchvision.models.detection.backbone_utils import _resnet_fpn_extractor
    body = resnet50(weights=None, norm_layer=FrozenBatchNorm2d)
else:
    body = TinyResNet()
for m in body.modules():
    if isinstance(m, nn.Conv2d) and not FULL:
        nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
    if isinstance(m, FrozenBatchNorm2d):  # statistics and affine away from the identity
        c = m.weight.numel()
        m.weight.copy_(0.5 + torch.rand(c))
        m.bias.copy_(0.2 * torch.randn(c))
        m.running_mean.copy_(0.2 * torch.randn(c))
        m.running_var.copy_(0.5 + torch.rand(c))
if FULL:
    model = MaskRCNN(_resnet_fpn_extractor(body, 3), num_classes=CLASSES)
else:
    backbone = BackboneWithFPN(body, {"layer1": "0", "layer2": "1", "layer3": "2", "layer4": "3"},
                               [WIDTH * 4, WIDTH * 8, WIDTH * 16, WIDTH * 32], FPN, extra_blocks=LastLevelMaxPool())
    anchors = AnchorGenerator(((8,), (16,), (32,), (64,), (128,)), ((0.5, 1.0, 2.0),) * 5)
    model = MaskRCNN(backbone, num_classes=None, rpn_anchor_generator=anchors,
                     box_roi_pool=MultiScaleRoIAlign(["0", "1", "2", "3"], 7, 2),
                     box_head=TwoMLPHead(FPN * 49, 64), box_predictor=FastRCNNPredictor(64, CLASSES),
                     box_batch_size_per_image=32, box_positive_fraction=0.25,
                     mask_roi_pool=MultiScaleRoIAlign(["0", "1", "2", "3"], 7, 2),
                     mask_head=MaskRCNNHeads(FPN, [16, 16, 16, 16], 1),
                     mask_predictor=MaskRCNNPredictor(16, 16, CLASSES))
model.train()
dev = torch.device(args.device)
with torch.no_grad():  # biases away from 0 too (torchvision starts the FPN's and heads' at 0)
    for name, p in model.named_parameters():
        if name.endswith("bias"):
            p.copy_(0.1 * torch.randn_like(p))
model.to(dev)
S = 512 if FULL else 32  # RoIs sampled per image (torchvision's default at full size)
scale = 6.0 if FULL else 1.0  # object and proposal sizes

# The batch: two images of noise, with 3 truths each (boxes and full-image masks: ellipses in the boxes).
images = torch.randn(N, 3, H, W)
targets, image_shapes = [], [(H, W)] * N
yy, xx = torch.meshgrid(torch.arange(H) + 0.5, torch.arange(W) + 0.5, indexing="ij")
for n in range(N):
    xy = torch.rand(3, 2) * torch.tensor([W - 60.0 * scale, H - 60.0 * scale])
    wh = 16 * scale + torch.rand(3, 2) * (40 * scale)
    boxes = torch.cat([xy, xy + wh], 1)
    masks = torch.stack([(((xx - (b[0] + b[2]) / 2) / ((b[2] - b[0]) / 2)) ** 2 +
                          ((yy - (b[1] + b[3]) / 2) / ((b[3] - b[1]) / 2)) ** 2 <= 1).to(torch.uint8) for b in boxes])
    targets.append({"boxes": boxes.to(dev), "labels": torch.tensor([1, 2, 3], device=dev), "masks": masks.to(dev)})
images = images.to(dev)

out = {}
with torch.no_grad():
    features = model.backbone(images)
    names = list(features.keys())  # "0".."3", "pool"
    for k, name in enumerate(names):
        out[f"ref.features.{k}"] = features[name].permute(0, 2, 3, 1).contiguous()
    objectness, deltas = model.rpn.head(list(features.values()))
    for k, (o, d) in enumerate(zip(objectness, deltas)):
        A = o.shape[1]
        out[f"ref.objectness.{k}"] = o.permute(0, 2, 3, 1).reshape(N, -1).contiguous()
        out[f"ref.deltas.{k}"] = d.view(N, A, 4, d.shape[2], d.shape[3]).permute(0, 3, 4, 1, 2).reshape(N, -1, 4)

    # The box head on a fixed draw: candidates = jittered truths + random boxes, sampled by torchvision.
    proposals = []
    for t in targets:
        J, K = (20, 600) if FULL else (6, 40)
        jitter = t["boxes"].cpu().repeat(J, 1) + torch.randn(3 * J, 4) * (3 * scale)
        xy = torch.rand(K, 2) * torch.tensor([W - 30.0 * scale, H - 30.0 * scale])
        random = torch.cat([xy, xy + 8 * scale + torch.rand(K, 2) * (30 * scale)], 1)
        proposals.append(torch.cat([jitter, random]).clamp(min=0).to(dev))
    rois, matched, labels, regression = model.roi_heads.select_training_samples(proposals, targets)
    assert all(r.shape[0] == S for r in rois), [r.shape for r in rois]
    pooled = model.roi_heads.box_roi_pool(features, rois, image_shapes)
    class_logits, box_regression = model.roi_heads.box_predictor(model.roi_heads.box_head(pooled))
    cls_loss, box_loss = fastrcnn_loss(class_logits, box_regression, labels, regression)
    out["ref.box.rois"] = torch.stack(rois)
    out["ref.box.labels"] = torch.stack(labels)
    out["ref.box.targets"] = torch.stack(regression)
    out["ref.box.class_logits"] = class_logits
    out["ref.box.box_regression"] = box_regression
    out["ref.box.loss"] = torch.stack([cls_loss, box_loss])

    # The mask head on the draw's foreground, padded to F slots per image.
    mask_rois, mask_labels, mask_targets, mask_logits = [], [], [], []
    fg_rois, fg_matched = [], []
    for n in range(N):
        fg = torch.where(labels[n] > 0)[0]
        assert 0 < fg.numel() <= F
        fg_rois.append(rois[n][fg])
        fg_matched.append(matched[n][fg])
        pad = F - fg.numel()
        mask_rois.append(torch.cat([rois[n][fg], torch.zeros(pad, 4, device=dev)]))
        mask_labels.append(torch.cat([labels[n][fg], torch.zeros(pad, dtype=torch.int64, device=dev)]))
        t = project_masks_on_boxes(targets[n]["masks"], rois[n][fg], matched[n][fg], M)
        mask_targets.append(torch.cat([t, torch.zeros(pad, M, M, device=dev)]))
    mask_pooled = model.roi_heads.mask_roi_pool(features, fg_rois, image_shapes)
    logits = model.roi_heads.mask_predictor(model.roi_heads.mask_head(mask_pooled))  # [R, C, M, M]
    mask_loss = maskrcnn_loss(logits, fg_rois, [t["masks"] for t in targets], [t["labels"] for t in targets],
                              fg_matched)
    at = 0
    for n in range(N):
        k = fg_rois[n].shape[0]
        padded = torch.zeros(F, M, M, CLASSES, device=dev)
        padded[:k] = logits[at:at + k].permute(0, 2, 3, 1)
        mask_logits.append(padded)
        at += k
    out["ref.mask.rois"] = torch.stack(mask_rois)
    out["ref.mask.labels"] = torch.stack(mask_labels)
    out["ref.mask.targets"] = torch.stack(mask_targets)
    out["ref.mask.logits"] = torch.stack(mask_logits)
    out["ref.mask.loss"] = mask_loss.reshape(1)

out["ref.images"] = images.permute(0, 2, 3, 1).contiguous()
state = {k: v for k, v in model.state_dict().items() if not k.endswith("num_batches_tracked")}
tensors = {k: v.detach().cpu().contiguous() for k, v in {**state, **out}.items()}
path = args.out or os.path.join(os.path.dirname(__file__), "..", "..", "tests", "data", "maskrcnn_reference.safetensors")
save_file(tensors, path, metadata={"source": "tools/bench/maskrcnn_parity.py", "torch": torch.__version__})
print(f"wrote {os.path.normpath(path)}: {len(state)} weights, {len(out)} references, "
      f"box loss {cls_loss.item():.6f} / {box_loss.item():.6f}, mask loss {mask_loss.item():.6f}")
