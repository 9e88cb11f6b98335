#!/usr/bin/env python3
"""PyTorch reference for nasnet_large: timm's nasnetalarge (1001 classes) trained on synthetic 331x331 images with
the engine's recipe as far as PyTorch has it (label-smoothed cross-entropy 0.1; torch.optim.RMSprop with alpha 0.9,
momentum 0.9, eps 1.0, weight decay 5e-5 (eps outside the square root: PyTorch's form; the same work per step);
global gradient clipping at 10), channels_last, cuDNN autotuning on, optionally AMP bf16 and torch.compile, on the
same GPU as the engine in the same run.

Prints: torch nasnetalarge 331 batch B precision [compiled] | img/s | ms | peak GiB (torch.cuda.max_memory_allocated)
Usage: python3 tools/bench/nasnet_torch.py --batch 32 --precision fp32|tf32|bf16 [--compile] [--steps 5 --warmup 3]
       python3 tools/bench/nasnet_torch.py --precision fp32 --max-batch-cap-gib 23.414   (as deeplab_torch.py)
What differs from the engine's default size: timm's model has no aux head and no drop path (the engine's
`--size timm` is the same network; its default `imagenet` size adds slim's aux head, 4.6 M parameters, and drop
path); timm applies one ReLU per operation where the engine shares one per tensor (the same values).
"""
import argparse
import time

import timm
import torch
import torch.nn.functional as F

from torch_bench import fits_by_running, max_batch, release, time_steps


def run_config(batch, steps, warmup):
    dev = torch.device("cuda")
    model = timm.create_model("nasnetalarge", pretrained=False, num_classes=1001)
    model = model.to(dev).to(memory_format=torch.channels_last).train()
    opt = torch.optim.RMSprop(model.parameters(), lr=0.015 * batch / 16, alpha=0.9, eps=1.0, momentum=0.9,
                              weight_decay=5e-5, foreach=True)
    fwd = torch.compile(model) if ARGS.compile else model
    x = y = None
    try:
        x = torch.randn(batch, 3, ARGS.size, ARGS.size, device=dev).to(memory_format=torch.channels_last)
        y = torch.randint(0, 1001, (batch,), device=dev)
        amp = ARGS.precision == "bf16"

        def step():
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp):
                loss = F.cross_entropy(fwd(x), y, label_smoothing=0.1)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 10.0, foreach=True)
            opt.step()
            opt.zero_grad(set_to_none=True)

        return time_steps(step, steps, warmup)
    finally:
        del model, opt, x, y, fwd
        release()


def main():
    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_tf32 = ARGS.precision == "tf32"
    torch.backends.cudnn.allow_tf32 = ARGS.precision == "tf32"
    if ARGS.max_batch_cap_gib > 0:
        fits = fits_by_running(lambda b: run_config(b, steps=0, warmup=2))

        def probe(b):  # each probe printed as it ends: a search cut short by a timeout still says what it saw
            ok = fits(b)
            print(f"  batch {b}: {'fits' if ok else 'out of memory'}", flush=True)
            return ok
        lo = max_batch(probe, ARGS.max_batch_cap_gib, ARGS.max_batch_from)
        print(f"torch nasnetalarge {ARGS.size} {ARGS.precision} | max batch {lo} under {ARGS.max_batch_cap_gib} GiB "
              f"(set_per_process_memory_fraction; {lo + 1} does not fit)", flush=True)
        return
    t0 = time.time()
    dt, peak = run_config(ARGS.batch, ARGS.steps, ARGS.warmup)
    print(f"torch nasnetalarge {ARGS.size} batch {ARGS.batch} {ARGS.precision}{' compiled' if ARGS.compile else ''} | "
          f"{ARGS.batch / dt:.1f} img/s | {dt * 1000:.1f} ms | peak {peak:.2f} GiB | {time.time() - t0:.0f} s in all",
          flush=True)


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--size", type=int, default=331)
    p.add_argument("--precision", default="fp32", choices=["fp32", "tf32", "bf16"])
    p.add_argument("--compile", action="store_true")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--max-batch-cap-gib", type=float, default=0)
    p.add_argument("--max-batch-from", type=int, default=1,
                   help="the search's first batch (it doubles from there; never reports below it)")
    ARGS = p.parse_args()
    main()
