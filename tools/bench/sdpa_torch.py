#!/usr/bin/env python3
"""PyTorch's attention kernels beside the engine's flash attention benchmark (AttentionCudaBench in
tests/ops/attention_cuda_test.cpp): torch.nn.functional.scaled_dot_product_attention on each backend that runs the
shape (cuDNN, FlashAttention-2, memory-efficient), bf16, q, k, v, dout contiguous [B, H, L, D] normal(0, 1) as the
engine's benchmark makes them, plain, causal and with dropout 0.1; the forward alone, and the backward
(torch.autograd.grad of the outputs with dout, the forward's graph kept) alone.

FLOPs as the engine counts them: forward 4 B H L^2 D, backward 2.5 times that, halved causal. Each figure is the
median of 20 timings (CUDA events around one call) after 3 warm-up calls, as the engine's median_ms.

Prints one line per (shape, mode, backend, pass): "torch <shape> <mode> <backend> <pass> <ms> ms <TFLOP/s> TFLOP/s",
and "torch ... unsupported: <reason>" where a backend refuses the case.
Usage: python3 tools/bench/sdpa_torch.py [--shapes 32x12x512x64,8x16x4096x128]
Untested here (no GPU or torch on the build machine); the lead runs it in the same call as the engine's benchmark.
"""
import argparse

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

BACKENDS = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash2": SDPBackend.FLASH_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION}


def median_ms(fn, warmup=3, reps=20):
    for _ in range(warmup):
        fn()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    times.sort()
    return times[len(times) // 2]


def bench(B, H, L, D, mode, backend):
    torch.manual_seed(10)
    make = lambda: torch.randn(B, H, L, D, device="cuda", dtype=torch.bfloat16)
    q, k, v, dout = make(), make(), make(), make()
    q.requires_grad_(True), k.requires_grad_(True), v.requires_grad_(True)
    causal, p = mode == "causal", 0.1 if mode == "drop" else 0.0
    fwd_flops = 4.0 * B * H * L * L * D * (0.5 if causal else 1.0)
    shape = f"{B}x{H}x{L}x{D}"
    with sdpa_kernel([BACKENDS[backend]]):
        try:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, dropout_p=p)
        except RuntimeError as e:
            print(f"torch {shape} {mode} {backend} unsupported: {str(e).splitlines()[0][:120]}", flush=True)
            return
        fwd = median_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal, dropout_p=p))
        bwd = median_ms(lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True))
    for name, ms, flops in (("fwd", fwd, fwd_flops), ("bwd", bwd, 2.5 * fwd_flops)):
        print(f"torch {shape} {mode} {backend} {name} {ms:.3f} ms {flops / ms / 1e9:.1f} TFLOP/s", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="32x12x512x64,8x16x4096x128", help="B x H x L x D, comma-separated")
    args = ap.parse_args()
    print(f"torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}, {torch.cuda.get_device_name()}")
    for s in args.shapes.split(","):
        B, H, L, D = (int(x) for x in s.split("x"))
        for mode in ("plain", "causal", "drop"):
            for backend in BACKENDS:
                bench(B, H, L, D, mode, backend)


if __name__ == "__main__":
    main()
