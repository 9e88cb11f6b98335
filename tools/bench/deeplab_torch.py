#!/usr/bin/env python3
"""PyTorch reference for deeplabv3: torchvision's deeplabv3_resnet101 (no aux classifier, 21 classes) trained
with SGD (momentum 0.9, wd 5e-4) on synthetic 513x513 images, channels_last (NHWC, as the engine), cuDNN
autotuning on, on the same GPU as the engine, in the same run.

Prints: torch deeplabv3 513 batch B precision | img/s | ms | peak GiB (torch.cuda.max_memory_allocated)
Usage: python3 tools/bench/deeplab_torch.py --batch 8 --precision fp32|tf32|bf16 [--steps 5 --warmup 3]
       python3 tools/bench/deeplab_torch.py --precision fp32 --max-batch-cap-gib 22.81
           (the largest batch whose training steps fit under torch.cuda.set_per_process_memory_fraction(cap), by
            doubling then bisection inside one process, the cache emptied after each out-of-memory probe; cap =
            the engine's arena for a card, e.g. titanrtx/rtx6000 24 GiB less its reserve: tools/gpu_profiles.cpp)
Note: torchvision's model has output stride 8 (dilated layer3 and layer4) and ASPP rates 12/24/36; the
engine's default `voc` size is the paper's output stride 16 (rates 6/12/18), so it does about 3x fewer FLOPs
in the backbone's last stages; `engine_train --model deeplabv3 --size torchvision` is the like-for-like one.
"""
import argparse

import torch
import torchvision

from torch_bench import fits_by_running, max_batch, release, time_steps


def run_config(batch, steps, warmup):
    """Trains `warmup` + `steps` steps at `batch`; returns (seconds per timed step, peak GiB)."""
    dev = torch.device("cuda")
    model = torchvision.models.segmentation.deeplabv3_resnet101(weights=None, weights_backbone=None,
                                                                num_classes=21, aux_loss=False)
    model = model.to(dev).to(memory_format=torch.channels_last).train()
    opt = torch.optim.SGD(model.parameters(), lr=0.007, momentum=0.9, weight_decay=5e-4)
    x = y = None
    try:
        x = torch.randn(batch, 3, ARGS.size, ARGS.size, device=dev).to(memory_format=torch.channels_last)
        y = torch.randint(0, 21, (batch, ARGS.size, ARGS.size), device=dev)
        amp = ARGS.precision == "bf16"
        loss_fn = torch.nn.CrossEntropyLoss(ignore_index=255)

        def step():
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp):
                loss = loss_fn(model(x)["out"], y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        return time_steps(step, steps, warmup)
    finally:
        del model, opt, x, y
        release()


def report_max_batch(cap_gib):
    # smallest 2: the image-pooling branch's batch norm needs more than one value per channel in training
    lo = max_batch(fits_by_running(lambda b: run_config(b, steps=0, warmup=2)), cap_gib, smallest=2)
    print(f"torch deeplabv3 {ARGS.size} {ARGS.precision} | max batch {lo} under {cap_gib} GiB "
          f"(set_per_process_memory_fraction; {lo + 1} does not fit)", flush=True)


def main():
    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_tf32 = ARGS.precision == "tf32"  # tf32: TF32 tensor cores for f32 (as --precision tf32)
    torch.backends.cudnn.allow_tf32 = ARGS.precision == "tf32"
    if ARGS.max_batch_cap_gib > 0:
        report_max_batch(ARGS.max_batch_cap_gib)
        return
    dt, peak = run_config(ARGS.batch, ARGS.steps, ARGS.warmup)
    print(f"torch deeplabv3 {ARGS.size} batch {ARGS.batch} {ARGS.precision} | {ARGS.batch / dt:.1f} img/s | "
          f"{dt * 1000:.1f} ms | peak {peak:.2f} GiB", flush=True)


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--size", type=int, default=513)
    p.add_argument("--precision", default="fp32", choices=["fp32", "tf32", "bf16"])
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--max-batch-cap-gib", type=float, default=0)
    ARGS = p.parse_args()
    main()
