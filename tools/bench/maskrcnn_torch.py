#!/usr/bin/env python3
"""torchvision's Mask R-CNN R-50-FPN training step on the GPU, the reference for `engine_train --model maskrcnn`.

The same work as the engine's maskrcnn: torchvision's MaskRCNN on resnet50 with FrozenBatchNorm2d and
trainable_layers 3 (the stem and layer1 frozen, as maskrcnn_resnet50_fpn builds it with pretrained weights), 81
classes, images of 800 x 1333 (its GeneralizedRCNNTransform keeps them, pads to 800 x 1344), 1 to 8 ellipse objects
per image with their boxes and full-image masks (torchvision rasterizes its mask targets with roi_align of those;
the engine rasterizes polygons into the crops), SGD momentum 0.9, weight decay 1e-4, fused (PyTorch 2's
foreach / fused SGD). Precision: fp32 (true fp32: TF32 off), tf32, or bf16 / fp16 autocast (with a GradScaler for
fp16, as torchvision's references/detection --amp). Prints one line: images per second over the timed steps, the
step's mean time and torch.cuda.max_memory_allocated over the timed steps (cudnn.benchmark's trials in the warm-up
steps allocate tens of GiB of workspace: not counted).

What differs from the engine: torchvision's counts are data-dependent (the proposals after NMS, the sampled RoIs:
fewer than 512 when an image lacks candidates, the foreground masks) where the engine fixes and pads them;
torchvision's RoIAlign backward uses atomics; its AMP runs FrozenBatchNorm2d in f32 (x * scale promotes).

Usage: python3 tools/bench/maskrcnn_torch.py [--batch 2] [--precision fp32|tf32|bf16|fp16] [--steps 10]
"""
import argparse
import math
import time

import torch
import torchvision
from torchvision.models.detection import MaskRCNN
from torchvision.models.detection.backbone_utils import _resnet_fpn_extractor
from torchvision.ops import misc as misc_nn_ops


def scenes(batch, height, width, classes, gen, device):
    images, targets = [], []
    yy = torch.arange(height, device=device).view(-1, 1) + 0.5
    xx = torch.arange(width, device=device).view(1, -1) + 0.5
    palette = torch.rand(classes, 3, generator=gen) * 2 - 1
    for _ in range(batch):
        image = (torch.rand(3, height, width, generator=gen) * 0.4 - 0.2).to(device)
        count = int(torch.randint(1, 9, (1,), generator=gen))
        boxes, labels, masks = [], [], []
        lo, hi = max(8, min(height, width) // 25), min(height, width) // 2
        for _ in range(count):
            cls = int(torch.randint(1, classes, (1,), generator=gen))
            h, w = (int(torch.randint(lo, hi + 1, (1,), generator=gen)) for _ in range(2))
            top = int(torch.randint(0, height - h + 1, (1,), generator=gen))
            left = int(torch.randint(0, width - w + 1, (1,), generator=gen))
            inside = ((xx - left - w / 2) / (w / 2)) ** 2 + ((yy - top - h / 2) / (h / 2)) ** 2 <= 1
            image[:, inside] += palette[cls].to(device).view(3, 1)
            boxes.append([left, top, left + w, top + h])
            labels.append(cls)
            masks.append(inside.to(torch.uint8))
        images.append(image)
        targets.append({"boxes": torch.tensor(boxes, dtype=torch.float32, device=device),
                        "labels": torch.tensor(labels, dtype=torch.int64, device=device),
                        "masks": torch.stack(masks)})
    return images, targets


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--precision", default="fp32", choices=["fp32", "tf32", "bf16", "fp16"])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--classes", type=int, default=81)
    ap.add_argument("--backbone", default="r50", choices=["r50", "r101"])
    args = ap.parse_args()
    device = torch.device("cuda")
    torch.backends.cudnn.benchmark = True
    tf32 = args.precision != "fp32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    torch.manual_seed(1)
    ctor = torchvision.models.resnet50 if args.backbone == "r50" else torchvision.models.resnet101
    body = ctor(weights=None, norm_layer=misc_nn_ops.FrozenBatchNorm2d)
    model = MaskRCNN(_resnet_fpn_extractor(body, 3), num_classes=args.classes).to(device).train()
    params = [p for p in model.parameters() if p.requires_grad]
    lr = 0.02 * args.batch / 16
    try:
        opt = torch.optim.SGD(params, lr=lr, momentum=0.9, weight_decay=1e-4, fused=True)
    except (TypeError, RuntimeError):
        opt = torch.optim.SGD(params, lr=lr, momentum=0.9, weight_decay=1e-4, foreach=True)
    # torchvision's references/detection warm-up (LinearLR from 0.001 over the first 1000 iterations): from random
    # weights with frozen batch norm at its identity statistics, the full rate makes the losses overflow in a few
    # steps, and a non-finite step does different work (NMS of NaN boxes). The engine warms up too
    # (maskrcnn-benchmark's x 1/3 over 500 updates); the step's work does not depend on the rate.
    warmup = torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.001, total_iters=1000)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.precision)
    scaler = torch.amp.GradScaler("cuda") if args.precision == "fp16" else None
    gen = torch.Generator().manual_seed(1)
    batches = [scenes(args.batch, 800, 1333, args.classes, gen, device) for _ in range(4)]
    times, losses_seen = [], []
    for step in range(args.warmup + args.steps):
        images, targets = batches[step % len(batches)]
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=dtype, enabled=dtype is not None):
            losses = model(images, targets)
            loss = sum(losses.values())
        opt.zero_grad(set_to_none=True)
        if scaler:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            opt.step()
        warmup.step()
        torch.cuda.synchronize()
        if step >= args.warmup:
            times.append(time.perf_counter() - t0)
        if step + 1 == args.warmup:  # the peak of the timed steps: not cudnn.benchmark's trial workspaces
            torch.cuda.reset_peak_memory_stats()
        losses_seen.append(loss.item())
    mean = sum(times) / len(times)
    peak = torch.cuda.max_memory_allocated() / 2**30
    print(f"torchvision maskrcnn {args.backbone} batch {args.batch} {args.precision}: {args.batch / mean:.2f} img/s "
          f"({mean * 1000:.1f} ms/step over {len(times)} steps), peak {peak:.2f} GiB, torch {torch.__version__}, "
          f"torchvision {torchvision.__version__}, loss {losses_seen[0]:.4f} -> {losses_seen[-1]:.4f}"
          + ("" if all(math.isfinite(v) for v in losses_seen) else " (NOT FINITE)"))


if __name__ == "__main__":
    main()
