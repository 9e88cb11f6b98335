#!/usr/bin/env python3
"""Writes tests/data/roi_align_reference.safetensors: torchvision.ops.roi_align's outputs and input gradients on a
small two-level pyramid, for tests/ops/roi_align_test.cpp (RoiAlign.MatchesTorchvision) to hold the engine's
RoIAlign to an implementation it shares no code with.

Each RoI is pooled by torchvision from its own level (sampling_ratio 2, out 3 x 4, aligned false and true), padding
RoIs (level -1) are not given to torchvision (their expected output and gradient are 0), and the gradient is that
of sum(y * g) for a random g. Tensors are NHWC f32 (the engine's layout): "x<l>", "rois" [R, 5], "levels" [R] i64,
"g", and per alignment a in {0, 1}: "expected.y.aligned<a>", "expected.dx<l>.aligned<a>".
Regenerate: python3 tools/bench/roi_align_parity.py   (made with torch 2.15.0, torchvision 0.29.2, on the cpu)
"""
import os

import torch
from safetensors.torch import save_file
from torchvision.ops import roi_align

torch.manual_seed(0)
SCALES = [0.25, 0.125]
x = [torch.randn(2, 4, 12, 16, dtype=torch.float64), torch.randn(2, 4, 6, 8, dtype=torch.float64)]  # NCHW
rows = [  # image, x1, y1, x2, y2, level: inside, across the edges, tiny, outside, inverted, padding
    (0, 4.0, 6.0, 40.0, 30.0, 0), (1, 10.5, 3.2, 60.0, 46.0, 0), (0, -20.0, -8.0, 30.0, 20.0, 1),
    (1, 50.0, 30.0, 90.0, 70.0, 1), (0, 1.0, 1.0, 2.0, 2.5, 0), (1, 30.0, 20.0, 10.0, 5.0, 1),
    (0, 0.0, 0.0, 63.0, 47.0, 1), (1, 200.0, 200.0, 260.0, 240.0, 0), (0, 5.0, 5.0, 30.0, 30.0, -1),
    (1, 62.0, 44.0, 64.0, 48.0, 0), (0, 31.9, 23.7, 32.3, 24.1, 1)]
rois = torch.tensor([r[:5] for r in rows], dtype=torch.float32)
levels = torch.tensor([r[5] for r in rows], dtype=torch.int64)
OUT = (3, 4)
g = torch.randn(len(rows), 4, *OUT, dtype=torch.float64)
out = {f"x{l}": t.permute(0, 2, 3, 1).float().contiguous() for l, t in enumerate(x)}
out.update({"rois": rois, "levels": levels, "g": g.permute(0, 2, 3, 1).float().contiguous()})
for aligned in (0, 1):
    xs = [t.float().clone().requires_grad_(True) for t in x]
    y = torch.zeros(len(rows), 4, *OUT)
    for l, t in enumerate(xs):
        idx = (levels == l).nonzero().flatten()
        y[idx] = roi_align(t, rois[idx], OUT, spatial_scale=SCALES[l], sampling_ratio=2, aligned=bool(aligned))
    (y * g.float()).sum().backward()
    out[f"expected.y.aligned{aligned}"] = y.detach().permute(0, 2, 3, 1).contiguous()
    for l, t in enumerate(xs):
        out[f"expected.dx{l}.aligned{aligned}"] = t.grad.permute(0, 2, 3, 1).contiguous()
here = os.path.dirname(os.path.abspath(__file__))
save_file(out, os.path.join(here, "..", "..", "tests", "data", "roi_align_reference.safetensors"),
          metadata={"made_by": "tools/bench/roi_align_parity.py"})
