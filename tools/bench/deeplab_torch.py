#!/usr/bin/env python3
"""PyTorch reference for deeplabv3: torchvision's deeplabv3_resnet101 (no aux classifier, 21 classes) trained
with SGD (momentum 0.9, wd 5e-4) on synthetic 513x513 images, channels_last (NHWC, as the engine), cuDNN
autotuning on, on the same GPU as the engine, in the same run.

Prints: torch deeplabv3 513 batch B precision | img/s | ms | peak GiB (torch.cuda.max_memory_allocated)
Usage: python3 tools/bench/deeplab_torch.py --batch 8 --precision fp32|tf32|bf16 [--steps 5 --warmup 3]
Note: torchvision's model has output stride 8 (dilated layer3 and layer4) and ASPP rates 12/24/36; the
engine's default `voc` size is the paper's output stride 16 (rates 6/12/18), so it does about 3x fewer FLOPs
in the backbone's last stages; `engine_train --model deeplabv3 --size torchvision` is the like-for-like one.
"""
import argparse
import time

import torch
import torchvision


def main():
    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_tf32 = ARGS.precision == "tf32"  # tf32: TF32 tensor cores for f32 (as --precision tf32)
    torch.backends.cudnn.allow_tf32 = ARGS.precision == "tf32"
    dev = torch.device("cuda")
    model = torchvision.models.segmentation.deeplabv3_resnet101(weights=None, weights_backbone=None,
                                                                num_classes=21, aux_loss=False)
    model = model.to(dev).to(memory_format=torch.channels_last).train()
    opt = torch.optim.SGD(model.parameters(), lr=0.007, momentum=0.9, weight_decay=5e-4)
    x = torch.randn(ARGS.batch, 3, ARGS.size, ARGS.size, device=dev).to(memory_format=torch.channels_last)
    y = torch.randint(0, 21, (ARGS.batch, ARGS.size, ARGS.size), device=dev)
    amp = ARGS.precision == "bf16"
    loss_fn = torch.nn.CrossEntropyLoss(ignore_index=255)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp):
            loss = loss_fn(model(x)["out"], y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(ARGS.warmup):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for _ in range(ARGS.steps):
        step()
    torch.cuda.synchronize()
    dt = (time.perf_counter() - t0) / ARGS.steps
    print(f"torch deeplabv3 {ARGS.size} batch {ARGS.batch} {ARGS.precision} | {ARGS.batch / dt:.1f} img/s | "
          f"{dt * 1000:.1f} ms | peak {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB", flush=True)


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--size", type=int, default=513)
    p.add_argument("--precision", default="fp32", choices=["fp32", "tf32", "bf16"])
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=3)
    ARGS = p.parse_args()
    main()
