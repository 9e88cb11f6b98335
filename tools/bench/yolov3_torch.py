#!/usr/bin/env python3
"""PyTorch reference for yolov3: the training step of `engine_train --model yolov3` (--size coco: YOLOv3 at 608x608,
80 classes, batch 8) written here from models/vision/yolov3.h, darknet.h and ops/yolo.h, on the same GPU as the
engine, in the same run.

The same work as the engine's step:
  network   Darknet-53 (stem 3x3 32; stages of a 3x3 stride-2 conv then 1/2/8/8/4 residuals 1x1 c/2 -> 3x3 c, each
            conv without bias + BatchNorm2d (eps 1e-5, momentum 0.1, training mode) + leaky ReLU 0.1, padding k/2);
            yolov3.cfg's three heads (1x1 m, 3x3 2m, 1x1 m, 3x3 2m, 1x1 m = the branch, 3x3 2m, then a 1x1 conv with
            bias to 3 x 85 = 255), laterals 1x1 m -> m/2 + nearest x2 + concat [upsampled, finer feature]; PyTorch's
            default init (the engine's too). 61,949,149 parameters (checked below).
  data      made every step on the device, as the engine's make_batch: per image 1 to 4 rectangles of a class
            colour (uniform in [-1, 1]; black background) + noise 0.2 (2u - 1), sides 1/8 to 1/2 of the image, later
            rectangles over earlier ones; their boxes (cx, cy, w, h image fractions) in 100 slots per image, labels
            -1 in the padded slots; images in the compute dtype (bf16 under --precision bf16), NHWC memory.
  targets   built inside the step from the batch and the detached predictions, vectorized (the engine's
            yolo_targets op, darknet's rule): each truth's best anchor of all 9 by the IoU of its shape with the
            anchors' (f64), the cell holding its centre, tx, ty = the centre's offset in the cell, tw, th =
            log(size / anchor), box weight 2 - w h; a scale takes the truth when that anchor is one of its 3; two
            truths on one cell and anchor: the later slot's box wins, class ones accumulate; objectness weight 0
            (ignored) where an unassigned prediction's decoded box has IoU > 0.5 with one of its image's truths.
            Dense target and weight tensors [N, h, w, 3, 85] per scale, as the engine's.
  loss      per scale, summed: x, y: weighted BCE-with-logits; w, h: weighted 0.5 (t - raw)^2; objectness and
            classes: weighted BCE-with-logits; the sum of the three scales divided by the batch.
  update    SGD momentum 0.9, weight decay 5e-4 on every parameter (PyTorch's SGD formula, the engine's too), fused
            (foreach where fused SGD is missing), lr 1e-3 with darknet's burn-in (x (b / 1000)^4, b = update + 1) as
            ops::DarknetSteps; the loss read on the host after every update (the engine's StepResult does too).
  setup     channels_last, cudnn.benchmark; fp32 = true fp32 (TF32 off for cuDNN and matmul), tf32 = TF32 on,
            bf16 = torch.autocast(bfloat16); --compile wraps the network in torch.compile.

What differs from the engine (honestly):
  - bf16: autocast keeps f32 weights and casts them to bf16 in each forward; the engine keeps bf16 weights and
    gradients with f32 masters written back by the fused update. The loss here runs on an f32 copy of the
    predictions (autocast runs BCE and MSE in f32 anyway); the engine's targets are stored in bf16 (pred's dtype),
    here in f32.
  - targets: the engine's kernel loops over an image's 100 slots and skips the padded ones; here every prediction
    is compared with all 100 slots as [N, h*w*3, 100] tensors (padded slots zeroed: IoU 0, so the same mask), in
    f32 where the engine computes the ignore test in f64. Those transient tensors (about 55 MB each at the 76x76
    scale, batch 8) count in the peak. Scatter instead of a thread per image: a truth later overwritten on its
    cell and anchor is routed to a discarded row, so the result is the engine's and deterministic.
  - data: the same distribution, not the same pixels or boxes (torch's CUDA generator instead of the engine's
    host mt19937_64 for the rectangles and Philox for the noise); the rectangles are drawn on the device here, on
    the host and uploaded there (a few hundred bytes).
  - gradients are freed (set_to_none) rather than zeroed; LeakyReLU runs in place; --compile compiles the network
    only (the loss and targets stay eager).

Prints: torch yolov3 608 [compiled] batch B precision | img/s | ms | peak GiB (torch.cuda.max_memory_allocated of the
timed steps), after a line with the parameter count (asserted to be 61949149).
Usage: python3 tools/bench/yolov3_torch.py --batch 8 --precision fp32|tf32|bf16 [--compile] [--steps 5 --warmup 3]
       python3 tools/bench/yolov3_torch.py --precision bf16 --profile          (the top CUDA kernels of one step)
       python3 tools/bench/yolov3_torch.py --precision fp32 --max-batch-cap-gib 22.81   (as deeplab_torch.py)
"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

from torch_bench import measure, release, run_main

CLASSES = 80
PARAMETERS = 61949149  # engine_train --model yolov3 --size coco prints "parameters 61949149"
ANCHORS = [(10, 13), (16, 30), (33, 23), (30, 61), (62, 45), (59, 119), (116, 90), (156, 198), (373, 326)]
MASKS = [(6, 7, 8), (3, 4, 5), (0, 1, 2)]  # head 0 (stride 32) first, as yolov3.cfg's `mask`
IGNORE_THRESH = 0.5
MAX_BOXES = 100  # ground-truth slots per image
MAX_RECTANGLES = 4  # synthetic rectangles per image: 1 to 4
NOISE = 0.2
LR, MOMENTUM, WEIGHT_DECAY, BURN_IN, BURN_IN_POWER = 1e-3, 0.9, 5e-4, 1000, 4


# ---------------------------------------------------------------------------------------------------------------
# The network (module names as the engine's: backbone.stem, backbone.stages.<s>.down / .blocks.<b>.conv1, heads.<k>
# .convs.<j> / .output, laterals.<k>).
class ConvBnLeaky(nn.Sequential):
    """KxK convolution without bias (padding K/2) - BatchNorm2d - leaky ReLU 0.1 (darknet's batch_normalize=1)."""

    def __init__(self, cin, cout, kernel, stride=1):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, kernel, stride, kernel // 2, bias=False)
        self.bn = nn.BatchNorm2d(cout)
        self.act = nn.LeakyReLU(0.1, inplace=True)


class Residual(nn.Module):
    """1x1 c -> c/2, 3x3 c/2 -> c, + the input (darknet's [shortcut] from=-3)."""

    def __init__(self, c):
        super().__init__()
        self.conv1 = ConvBnLeaky(c, c // 2, 1)
        self.conv2 = ConvBnLeaky(c // 2, c, 3)

    def forward(self, x):
        return x + self.conv2(self.conv1(x))


class Stage(nn.Module):
    def __init__(self, cin, blocks):
        super().__init__()
        self.down = ConvBnLeaky(cin, 2 * cin, 3, 2)
        self.blocks = nn.Sequential(*[Residual(2 * cin) for _ in range(blocks)])

    def forward(self, x):
        return self.blocks(self.down(x))


class Darknet53(nn.Module):
    def __init__(self, blocks=(1, 2, 8, 8, 4), width=32):
        super().__init__()
        self.stem = ConvBnLeaky(3, width, 3)
        self.stages = nn.ModuleList(Stage(width << s, n) for s, n in enumerate(blocks))

    def forward(self, x):
        """-> the stride 8, 16 and 32 features (256, 512, 1024 channels at width 32)."""
        x = self.stem(x)
        out = []
        for s, stage in enumerate(self.stages):
            x = stage(x)
            if s >= 2:
                out.append(x)
        return out


class YoloHead(nn.Module):
    """1x1 m, 3x3 2m, 1x1 m, 3x3 2m, 1x1 m (the branch), 3x3 2m, then a 1x1 conv with bias to `out` channels."""

    def __init__(self, cin, mid, out):
        super().__init__()
        self.convs = nn.ModuleList(ConvBnLeaky(mid, 2 * mid, 3) if k % 2 else ConvBnLeaky(2 * mid if k else cin, mid, 1)
                                   for k in range(6))
        self.output = nn.Conv2d(2 * mid, out, 1)

    def forward(self, x):
        for conv in self.convs[:5]:
            x = conv(x)
        return x, self.output(self.convs[5](x))


class YoloV3(nn.Module):
    def __init__(self, classes=CLASSES, width=32):
        super().__init__()
        self.backbone = Darknet53(width=width)
        features = (8 * width, 16 * width, 32 * width)  # strides 8, 16, 32
        cin, mid = features[2], features[2] // 2
        self.heads, self.laterals = nn.ModuleList(), nn.ModuleList()
        for k in range(3):
            self.heads.append(YoloHead(cin, mid, len(MASKS[k]) * (5 + classes)))
            if k == 2:
                break
            self.laterals.append(ConvBnLeaky(mid, mid // 2, 1))
            cin, mid = mid // 2 + features[1 - k], mid // 2

    def forward(self, images):
        """[N, 3, S, S] -> raw predictions [N, 255, S/32, S/32], [N, 255, S/16, S/16], [N, 255, S/8, S/8]."""
        features = self.backbone(images)
        x, preds = features[2], []
        for k, head in enumerate(self.heads):
            branch, pred = head(x)
            preds.append(pred)
            if k < 2:  # darknet's [upsample] and [route] -1, 61 (then -1, 36)
                up = F.interpolate(self.laterals[k](branch), scale_factor=2, mode="nearest")
                x = torch.cat([up, features[1 - k]], 1)
        return preds


# ---------------------------------------------------------------------------------------------------------------
class SyntheticDetection:
    """The engine's synthetic detection batches (yolov3.cpp's synthetic_detection), drawn on the device each step."""

    def __init__(self, batch, size, classes, dtype, device, seed=1):
        self.batch, self.size, self.classes, self.dtype = batch, size, classes, dtype
        self.gen = torch.Generator(device=device).manual_seed(seed)
        colours = torch.rand(classes, 3, generator=torch.Generator().manual_seed(0xB0C5EED)) * 2 - 1
        self.palette = torch.cat([torch.zeros(1, 3), colours]).to(device)  # row 0: the black background
        self.pixels = torch.arange(size, device=device)

    def __call__(self):
        """-> images [N, 3, S, S] (channels_last, the compute dtype), boxes [N, 100, 4] f32, labels [N, 100] i64."""
        n, s, r, dev, gen = self.batch, self.size, MAX_RECTANGLES, self.palette.device, self.gen
        filled = torch.arange(r, device=dev) < torch.randint(1, r + 1, (n, 1), device=dev, generator=gen)  # [N, R]
        cls = torch.randint(0, self.classes, (n, r), device=dev, generator=gen)
        hw = torch.randint(max(2, s // 8), s // 2 + 1, (n, r, 2), device=dev, generator=gen)  # heights, widths
        room = s - hw + 1
        tl = (torch.rand(n, r, 2, device=dev, generator=gen) * room).long().minimum(room - 1)  # tops, lefts
        # Each pixel's palette row: the last filled rectangle holding it (class + 1), else 0. A loop over the 4 slots,
        # each over the whole batch.
        rows = torch.zeros(n, s, s, dtype=torch.long, device=dev)
        for k in range(r):
            top, left, h, w = tl[:, k, 0, None], tl[:, k, 1, None], hw[:, k, 0, None], hw[:, k, 1, None]
            in_y = (self.pixels >= top) & (self.pixels < top + h) & filled[:, k, None]  # [N, S]
            in_x = (self.pixels >= left) & (self.pixels < left + w)
            rows = torch.where(in_y[:, :, None] & in_x[:, None, :], (cls[:, k] + 1).view(n, 1, 1), rows)
        noise = torch.rand(n, s, s, 3, device=dev, generator=gen).mul_(2).sub_(1).mul_(NOISE)
        images = self.palette[rows].add_(noise).to(self.dtype).permute(0, 3, 1, 2)  # NHWC memory = channels_last
        tlf, hwf = tl.float(), hw.float()
        box = torch.stack([(tlf[..., 1] + hwf[..., 1] / 2) / s, (tlf[..., 0] + hwf[..., 0] / 2) / s,
                           hwf[..., 1] / s, hwf[..., 0] / s], -1)  # cx, cy, w, h
        boxes = torch.zeros(n, MAX_BOXES, 4, device=dev)
        boxes[:, :r] = box * filled[..., None]
        labels = torch.full((n, MAX_BOXES), -1, dtype=torch.long, device=dev)
        labels[:, :r] = torch.where(filled, cls, -1)
        return images, boxes, labels


# ---------------------------------------------------------------------------------------------------------------
def max_iou(px, py, pw, ph, boxes):
    """The largest IoU of each predicted box (px, py, pw, ph [N, P]: centre and size) with its image's truths (boxes
    [N, M, 4] cx, cy, w, h; zero-size rows give IoU 0) -> [N, P]. Transients [N, P, M]."""
    px, py, pw, ph = (t.unsqueeze(2) for t in (px, py, pw, ph))  # [N, P, 1]
    bx, by, bw, bh = (boxes[..., c].unsqueeze(1) for c in range(4))  # [N, 1, M]
    ox = torch.minimum(px + pw / 2, bx + bw / 2).sub_(torch.maximum(px - pw / 2, bx - bw / 2)).clamp_(min=0)
    oy = torch.minimum(py + ph / 2, by + bh / 2).sub_(torch.maximum(py - ph / 2, by - bh / 2)).clamp_(min=0)
    inter = ox.mul_(oy)
    del oy
    union = (pw * ph + bw * bh).sub_(inter).clamp_(min=1e-30)  # 0 only with inter 0 (the engine: IoU 0)
    return inter.div_(union).amax(2)


class YoloLoss:
    """darknet's loss (yolov3.cpp's detection_loss with ops::yolo_targets), targets built on the device each call."""

    def __init__(self, size, device):
        anchors = torch.tensor(ANCHORS, dtype=torch.float64, device=device) / size  # [9, 2] image fractions
        self.anchors64 = anchors
        self.scale_anchors = [anchors[list(mask)].float() for mask in MASKS]  # [A, 2] per scale, f32 (the decode)
        self.lut = []  # per scale: anchor index (of the 9) -> its slot on the scale, or -1
        for mask in MASKS:
            lut = torch.full((len(ANCHORS),), -1, dtype=torch.long, device=device)
            lut[list(mask)] = torch.arange(len(mask), device=device)
            self.lut.append(lut)
        # later[m, m2]: slot m2 comes after slot m (a later truth on the same cell and anchor overwrites the box)
        self.later = torch.ones(MAX_BOXES, MAX_BOXES, dtype=torch.bool, device=device).triu(1)

    def best_anchors(self, boxes):
        """[N, M] the best anchor of all 9 by the IoU of the truth's shape with the anchor's (both centred), in f64
        as the engine; the first of equal ones."""
        w, h = boxes[..., 2, None].double(), boxes[..., 3, None].double()
        aw, ah = self.anchors64[:, 0], self.anchors64[:, 1]
        inter = torch.minimum(w, aw) * torch.minimum(h, ah)  # [N, M, 9]
        return (inter / (w * h + aw * ah - inter)).argmax(-1)

    def targets(self, p, k, boxes, truths, labels, valid, best):
        """ops::yolo_targets for scale k: p [N, H, W, A, D] (detached) -> target, weight [N*H*W*A, D] f32.
        boxes: the batch's; truths: boxes with the padded rows zeroed; best: best_anchors(boxes)."""
        n, hh, ww, a, d = p.shape
        dev, rows = p.device, n * hh * ww * a
        # The ignore rule: each prediction decoded, against every truth of its image.
        gx = (torch.arange(ww, device=dev).view(1, 1, ww, 1) + p[..., 0].sigmoid()) / ww
        gy = (torch.arange(hh, device=dev).view(1, hh, 1, 1) + p[..., 1].sigmoid()) / hh
        pw = p[..., 2].exp() * self.scale_anchors[k][:, 0]
        ph = p[..., 3].exp() * self.scale_anchors[k][:, 1]
        ignored = max_iou(*(t.reshape(n, -1) for t in (gx, gy, pw, ph)), truths) > IGNORE_THRESH  # [N, P]
        # The positives (f64, as the engine): the slot on this scale of each truth's best anchor, its cell, targets.
        slot = self.lut[k][best]  # [N, M]
        take = valid & (slot >= 0)
        cx, cy, bw, bh = boxes.double().unbind(-1)
        fx, fy = cx * ww, cy * hh
        i = fx.nan_to_num(0.0).floor().clamp(0, ww - 1)
        j = fy.nan_to_num(0.0).floor().clamp(0, hh - 1)
        t = torch.stack([fx - i, fy - j, (bw / self.anchors64[best, 0]).log(), (bh / self.anchors64[best, 1]).log()],
                        -1)  # [N, M, 4]
        img = torch.arange(n, device=dev).view(n, 1)
        row = ((img * hh + j.long()) * ww + i.long()) * a + slot  # [N, M]
        # The last taken slot on each row writes the row (the engine's slot order); the others go to a spare row.
        m = boxes.shape[1]
        overwritten = ((row[:, :, None] == row[:, None, :]) & take[:, None, :] & self.later[:m, :m]).any(2)
        win = torch.where(take & ~overwritten, row, rows).view(-1)
        hit = torch.where(take, row, rows).view(-1)
        trow = torch.zeros(n, m, d, device=dev)
        trow[..., :4] = t
        trow[..., 4] = 1
        wrow = torch.ones(n, m, d, device=dev)
        wrow[..., :4] = (2 - bw * bh)[..., None]  # darknet's delta scale: small boxes weigh more
        target = torch.zeros(rows + 1, d, device=dev)
        weight = torch.zeros(rows + 1, d, device=dev)
        weight[:rows, 4] = (~ignored).view(-1).float()
        target.index_copy_(0, win, trow.view(-1, d))
        weight.index_copy_(0, win, wrow.view(-1, d))
        target[hit, 5 + labels.clamp(min=0).view(-1)] = 1.0  # several truths on one anchor: several ones
        return target[:rows], weight[:rows]

    def __call__(self, preds, boxes, labels):
        """preds: the network's three [N, A*D, h, w]; boxes [N, M, 4]; labels [N, M] -> the loss (f32 scalar)."""
        n = boxes.shape[0]
        with torch.no_grad():
            valid = labels >= 0
            truths = boxes * valid[..., None]
            best = self.best_anchors(boxes)
        box = obj = cls = 0
        for k, pred in enumerate(preds):
            a = len(MASKS[k])
            d = pred.shape[1] // a
            p = pred.permute(0, 2, 3, 1).float()  # [N, h, w, A*D]: channels_last memory seen NHWC (bf16: an f32 copy)
            with torch.no_grad():
                target, weight = self.targets(p.detach().reshape(n, p.shape[1], p.shape[2], a, d), k, boxes, truths,
                                              labels, valid, best)
            p = p.reshape(-1, d)
            xy = F.binary_cross_entropy_with_logits(p[:, 0:2], target[:, 0:2], weight=weight[:, 0:2], reduction="sum")
            wh = (weight[:, 2:4] * (p[:, 2:4] - target[:, 2:4]).square()).sum()
            box = box + xy + 0.5 * wh
            obj = obj + F.binary_cross_entropy_with_logits(p[:, 4], target[:, 4], weight=weight[:, 4], reduction="sum")
            cls = cls + F.binary_cross_entropy_with_logits(p[:, 5:], target[:, 5:], weight=weight[:, 5:],
                                                           reduction="sum")
        return (box + obj + cls) / n


def darknet_lr(update):
    """ops::DarknetSteps at `update` (updates done so far): burn-in x (b / 1000)^4, b = update + 1. (The x 0.1 steps
    at 400k and 450k lie beyond any benchmark.)"""
    b = update + 1
    return LR * (b / BURN_IN) ** BURN_IN_POWER if b < BURN_IN else LR


def sgd(params):
    try:
        return torch.optim.SGD(params, lr=LR, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY, fused=True)
    except (TypeError, RuntimeError):  # a PyTorch without fused SGD
        return torch.optim.SGD(params, lr=LR, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY, foreach=True)


def run_config(batch, steps, warmup):
    """Trains `warmup` + `steps` steps at `batch`: (seconds per timed step, peak GiB), or None with --profile."""
    dev = torch.device("cuda")
    torch.manual_seed(1)
    model = YoloV3().to(dev).to(memory_format=torch.channels_last).train()
    opt = sgd(model.parameters())
    fwd = torch.compile(model) if ARGS.compile else model
    amp = ARGS.precision == "bf16"
    data = SyntheticDetection(batch, ARGS.size, CLASSES, torch.bfloat16 if amp else torch.float32, dev)
    criterion = YoloLoss(ARGS.size, dev)
    updates = [0]
    try:
        def step():
            images, boxes, labels = data()  # the engine's make_batch, every step
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp):
                preds = fwd(images)
            loss = criterion(preds, boxes, labels)  # f32, outside autocast
            loss.backward()
            for group in opt.param_groups:
                group["lr"] = darknet_lr(updates[0])
            opt.step()
            opt.zero_grad(set_to_none=True)
            updates[0] += 1
            return loss.item()  # the engine reads each step's loss after the update

        return measure(step, steps, warmup, profile=ARGS.profile)
    finally:
        del model, opt, fwd, data, criterion
        release()


def main():
    assert ARGS.size % 32 == 0, f"--size {ARGS.size}: a multiple of 32 (the coarsest scale's stride)"
    with torch.device("meta"):
        count = sum(p.numel() for p in YoloV3().parameters())
    print(f"torch yolov3 parameters {count}", flush=True)
    assert count == PARAMETERS, f"parameters {count}, the engine's yolov3 (--size coco) has {PARAMETERS}"
    run_main(ARGS, f"torch yolov3 {ARGS.size}{' compiled' if ARGS.compile else ''}", run_config)


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--size", type=int, default=608)
    p.add_argument("--precision", default="fp32", choices=["fp32", "tf32", "bf16"])
    p.add_argument("--compile", action="store_true", help="torch.compile the network (the loss stays eager)")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--max-batch-cap-gib", type=float, default=0)
    p.add_argument("--profile", action="store_true", help="print the top CUDA kernels of one step instead")
    ARGS = p.parse_args()
    main()
