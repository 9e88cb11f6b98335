#!/usr/bin/env python3
"""cuDNN's convolution TFLOP/s on the layer shapes of the engine's ConvCudaPerf.DISABLED_TFlops (same names).

Run in the same device call as the engine's test so both see the same GPU, clocks and day:
    .gpu/engine_cuda_tests --gtest_also_run_disabled_tests --gtest_filter='ConvCudaPerf*'
    python3 tools/bench/conv_torch.py
For each shape and type (bf16, tf32, fp32) it times forward, data gradient and weight gradient separately with
aten.convolution_backward's output mask (so each pass is one cuDNN call, as the engine's are), NHWC
(channels_last) tensors, cudnn.benchmark on (cuDNN picks its fastest algorithm first), 10 calls per timed run,
median of 7 runs after a warm-up. FLOPs: 2 N Ho Wo Cout Cin KH KW per pass (the engine's count).

--depthwise times the depthwise shapes of the engine's ConvCudaPerf.DISABLED_Depthwise instead (NASNet-A
Large at batch 32; groups = channels; whichever kernel PyTorch dispatches to: cuDNN, or its own depthwise
kernels), in ms per pass and GB/s of x + dy (the engine's count), bf16 and fp32 (TF32 off):
    .gpu/engine_cuda_tests --gtest_also_run_disabled_tests --gtest_filter='ConvCudaPerf.DISABLED_Depthwise'
    python3 tools/bench/conv_torch.py --depthwise

--gemm times, for each shape, the plain GEMMs of the three passes' sizes through torch.matmul (cuBLAS), bf16 and
tf32: forward and data gradient [N Ho Wo, K] x [K, Cout] and [N Ho Wo, Cout] x [Cout, K] (K = KH KW Cin), weight
gradient [Cout, N Ho Wo] x [N Ho Wo, K]. Same FLOPs as the convolution, no im2col: what a GEMM library reaches on the
implicit GEMM's sizes, the bound a convolution kernel could approach if gathering its operand cost nothing.

--kernels prints, for each shape and pass, the names of the kernels cuDNN ran (torch.profiler, after the benchmark's
warm-up picked them): their names carry cuDNN's tile shape, cluster and stages, what the engine's tiles are compared
with.
"""
import argparse
import statistics

import torch

# name, (N, H, W, Cin, Cout, KH, KW, stride, padding, dilation): tests/ops/conv_cuda_test.cpp's list
SHAPES = [
    ("ResNet 3x3 64->64 128^2 N8", (8, 128, 128, 64, 64, 3, 3, 1, 1, 1)),
    ("ResNet 3x3 d2 256->256 32^2 N8", (8, 32, 32, 256, 256, 3, 3, 1, 2, 2)),
    ("ResNet 1x1 1024->256 32^2 N8", (8, 32, 32, 1024, 256, 1, 1, 1, 0, 1)),
    ("stem 7x7 s2 3->64 513^2 N2", (2, 513, 513, 3, 64, 7, 7, 2, 3, 1)),
    ("3x3 s2 128->256 76^2 N8", (8, 76, 76, 128, 256, 3, 3, 2, 1, 1)),
    ("Darknet 3x3 128->256 152^2 N8", (8, 152, 152, 128, 256, 3, 3, 1, 1, 1)),
    ("Darknet 3x3 s2 256->512 152^2 N8", (8, 152, 152, 256, 512, 3, 3, 2, 1, 1)),
    ("Darknet stem 3x3 3->32 416^2 N8", (8, 416, 416, 3, 32, 3, 3, 1, 1, 1)),
]


# name, (N, H, W, C, K, stride): padding (K - 1) / 2; tests/ops/conv_cuda_test.cpp's DISABLED_Depthwise list
DEPTHWISE = [
    ("dw 5x5 s2 42ch 165^2", (32, 165, 165, 42, 5, 2)),
    ("dw 7x7 s2 96ch 165^2", (32, 165, 165, 96, 7, 2)),
    ("dw 5x5 s1 42ch 83^2", (32, 83, 83, 42, 5, 1)),
    ("dw 7x7 s2 84ch 83^2", (32, 83, 83, 84, 7, 2)),
    ("dw 3x3 s1 168ch 42^2", (32, 42, 42, 168, 3, 1)),
    ("dw 5x5 s1 168ch 42^2", (32, 42, 42, 168, 5, 1)),
    ("dw 7x7 s2 336ch 42^2", (32, 42, 42, 336, 7, 2)),
    ("dw 5x5 s1 336ch 21^2", (32, 21, 21, 336, 5, 1)),
    ("dw 3x3 s1 672ch 11^2", (32, 11, 11, 672, 3, 1)),
    ("dw 7x7 s1 672ch 11^2", (32, 11, 11, 672, 7, 1)),
]


def median_ms(fn, calls=10, reps=7):
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / calls)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--types", default="bf16,tf32,fp32")
    ap.add_argument("--depthwise", action="store_true", help="the depthwise shapes (NASNet-A Large, batch 32)")
    ap.add_argument("--gemm", action="store_true", help="plain GEMMs of each pass's sizes (cuBLAS), for comparison")
    ap.add_argument("--kernels", action="store_true", help="the names of the kernels cuDNN runs for each pass")
    ap.add_argument("--only", default="", help="only the shapes whose names contain this (one kernel under ncu)")
    a = ap.parse_args()
    torch.backends.cudnn.benchmark = True
    print(f"# cuDNN {torch.backends.cudnn.version()}, torch {torch.__version__}, {torch.cuda.get_device_name()}")
    if a.depthwise:
        depthwise()
        return
    if a.gemm:
        gemms(a.types, a.only)
        return
    print(f"{'layer':34s} {'dtype':6s} {'fwd':>9s} {'data':>9s} {'weight':>9s}")
    for kind in a.types.split(","):
        dtype = torch.bfloat16 if kind == "bf16" else torch.float32
        torch.backends.cudnn.allow_tf32 = kind == "tf32"
        for name, (n, h, w, cin, cout, kh, kw, stride, pad, dil) in SHAPES:
            if a.only not in name:
                continue
            x = torch.randn(n, cin, h, w, device="cuda", dtype=dtype).to(memory_format=torch.channels_last)
            wt = (0.1 * torch.randn(cout, cin, kh, kw, device="cuda", dtype=dtype)).to(memory_format=torch.channels_last)
            y = torch.nn.functional.conv2d(x, wt, None, stride, pad, dil)
            dy = torch.randn_like(y).to(memory_format=torch.channels_last)
            ho, wo = y.shape[2], y.shape[3]
            flops = 2.0 * n * ho * wo * cout * cin * kh * kw

            def backward(mask):
                return lambda: torch.ops.aten.convolution_backward(dy, x, wt, None, [stride] * 2, [pad] * 2, [dil] * 2,
                                                                   False, [0, 0], 1, mask)

            passes = (("fwd", lambda: torch.nn.functional.conv2d(x, wt, None, stride, pad, dil)),
                      ("data", backward([True, False, False])), ("weight", backward([False, True, False])))
            f, d, g = (median_ms(fn) for _, fn in passes)
            if a.kernels:
                for pass_name, fn in passes:
                    print(f"  {name} {kind} {pass_name}: {', '.join(kernel_names(fn))}")
            print(f"{name:34s} {kind:6s} {flops / f * 1e-9:9.1f} {flops / d * 1e-9:9.1f} {flops / g * 1e-9:9.1f}   "
                  f"TFLOP/s ({f:.3f} / {d:.3f} / {g:.3f} ms)", flush=True)
            del x, wt, y, dy
        torch.cuda.empty_cache()


def kernel_names(fn):
    """The CUDA kernels one call of fn launches, in order (torch.profiler)."""
    torch.cuda.synchronize()
    try:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        return [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    except Exception as e:  # the profiler is an aid here: its failure must not cost the timings
        return [f"(profiler failed: {e})"]


def gemms(types, only):
    print(f"{'layer (as plain GEMMs)':34s} {'dtype':6s} {'fwd':>9s} {'data':>9s} {'weight':>9s}")
    for kind in types.split(","):
        if kind == "fp32":
            continue  # cuBLAS's true-fp32 GEMM says nothing about the tensor-core kernels
        dtype = torch.bfloat16 if kind == "bf16" else torch.float32
        torch.backends.cuda.matmul.allow_tf32 = kind == "tf32"
        for name, (n, h, w, cin, cout, kh, kw, stride, pad, dil) in SHAPES:
            if only not in name:
                continue
            ho = (h + 2 * pad - dil * (kh - 1) - 1) // stride + 1
            wo = (w + 2 * pad - dil * (kw - 1) - 1) // stride + 1
            m, k = n * ho * wo, kh * kw * cin
            flops = 2.0 * m * cout * k
            a_mk = torch.randn(m, k, device="cuda", dtype=dtype)
            b_kn = torch.randn(k, cout, device="cuda", dtype=dtype)
            dy_mn = torch.randn(m, cout, device="cuda", dtype=dtype)
            f = median_ms(lambda: a_mk @ b_kn)
            d = median_ms(lambda: dy_mn @ b_kn.t())
            g = median_ms(lambda: dy_mn.t() @ a_mk)
            print(f"{name:34s} {kind:6s} {flops / f * 1e-9:9.1f} {flops / d * 1e-9:9.1f} {flops / g * 1e-9:9.1f}   "
                  f"TFLOP/s ({f:.3f} / {d:.3f} / {g:.3f} ms)", flush=True)
            del a_mk, b_kn, dy_mn
        torch.cuda.empty_cache()
    torch.backends.cuda.matmul.allow_tf32 = False


def depthwise():
    torch.backends.cudnn.allow_tf32 = False
    print(f"{'layer':24s} {'dtype':5s} {'fwd ms':>10s} {'data ms':>10s} {'weight ms':>10s}   GB/s fwd / data / weight")
    for kind, dtype in (("bf16", torch.bfloat16), ("f32", torch.float32)):
        for name, (n, h, w, c, k, stride) in DEPTHWISE:
            pad = (k - 1) // 2
            x = torch.randn(n, c, h, w, device="cuda", dtype=dtype).to(memory_format=torch.channels_last)
            wt = (0.1 * torch.randn(c, 1, k, k, device="cuda", dtype=dtype)).to(memory_format=torch.channels_last)
            y = torch.nn.functional.conv2d(x, wt, None, stride, pad, 1, c)
            dy = torch.randn_like(y).to(memory_format=torch.channels_last)

            def backward(mask):
                return lambda: torch.ops.aten.convolution_backward(dy, x, wt, None, [stride] * 2, [pad] * 2, [1, 1],
                                                                   False, [0, 0], c, mask)

            f = median_ms(lambda: torch.nn.functional.conv2d(x, wt, None, stride, pad, 1, c))
            d = median_ms(backward([True, False, False]))
            g = median_ms(backward([False, True, False]))
            nbytes = (x.numel() + dy.numel()) * x.element_size()
            print(f"{name:24s} {kind:5s} {f:10.4f} {d:10.4f} {g:10.4f}   "
                  f"{nbytes / f * 1e-6:.0f} / {nbytes / d * 1e-6:.0f} / {nbytes / g * 1e-6:.0f}", flush=True)
            del x, wt, y, dy
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
