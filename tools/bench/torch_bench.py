"""Shared pieces of the PyTorch comparison scripts (tools/bench/*_torch.py): timing a training step, and the
largest batch that fits a memory cap, measured the same way for every model; run_main and add_run_args, the main
and the common flags of the scripts that use them.
"""
import gc
import time

import torch


def time_steps(step, steps, warmup):
    """Runs step() `warmup` times, then `steps` timed times; returns (seconds per timed step, peak GiB of the
    timed steps by torch.cuda.max_memory_allocated)."""
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / max(steps, 1), torch.cuda.max_memory_allocated() / 2**30


def profile_step(step, warmup, top=20):
    """Runs step() `warmup` times, then once under torch.profiler; prints the `top` CUDA kernels by total GPU time
    (what bounds the PyTorch side, to compare with the engine's --profile)."""
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=top, max_name_column_width=90), flush=True)


def measure(step, steps, warmup, profile=False):
    """time_steps(step, steps, warmup), or with `profile` the top kernels of one step (profile_step; None)."""
    if profile:
        profile_step(step, warmup)
        return None
    return time_steps(step, steps, warmup)


def add_run_args(parser, batch):
    """The flags of a script run by run_main: --batch (default `batch`), --precision, --steps, --warmup,
    --max-batch-cap-gib, --profile."""
    parser.add_argument("--batch", type=int, default=batch)
    parser.add_argument("--precision", default="fp32", choices=["fp32", "tf32", "bf16"])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--max-batch-cap-gib", type=float, default=0)
    parser.add_argument("--profile", action="store_true", help="print the top CUDA kernels of one step instead")


def run_main(args, name, run_config, unit="img"):
    """A training-step script's main: cudnn.benchmark, TF32 only for --precision tf32 (fp32 is true fp32), then the
    max batch under --max-batch-cap-gib, or the profile of one step, or one line: `name batch B precision | U/s | ms |
    peak GiB`. run_config(batch, steps, warmup) trains and returns measure()'s result."""
    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_tf32 = args.precision == "tf32"
    torch.backends.cudnn.allow_tf32 = args.precision == "tf32"
    if args.max_batch_cap_gib > 0:
        lo = max_batch(fits_by_running(lambda b: run_config(b, steps=0, warmup=2)), args.max_batch_cap_gib)
        print(f"{name} {args.precision} | max batch {lo} under {args.max_batch_cap_gib} GiB", flush=True)
        return
    result = run_config(args.batch, args.steps, args.warmup)
    if result is None:  # --profile printed its table
        return
    dt, peak = result
    print(f"{name} batch {args.batch} {args.precision} | {args.batch / dt:.2f} {unit}/s | {dt * 1000:.1f} ms | "
          f"peak {peak:.2f} GiB", flush=True)


def release():
    """Frees what a finished or failed configuration left in PyTorch's caching allocator."""
    gc.collect()
    torch.cuda.empty_cache()


def max_batch(fits, cap_gib, smallest=1):
    """The largest batch b >= smallest with fits(b) True under torch.cuda.set_per_process_memory_fraction(cap_gib):
    doubling from `smallest`, then bisection (never below it: deeplabv3 cannot train on 1 image). fits(b) runs a
    few training steps at b and returns False on torch.OutOfMemoryError (use fits_by_running). Returns the
    largest that fits, or 0."""
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(cap_gib * 2**30 / total)
    lo, hi = 0, smallest
    while fits(hi):
        lo, hi = hi, hi * 2
    while hi - max(lo, smallest - 1) > 1:
        mid = (max(lo, smallest - 1) + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def fits_by_running(run):
    """fits(b) for max_batch from run(b), which trains at batch b and raises torch.OutOfMemoryError when it
    does not fit."""
    def fits(b):
        try:
            run(b)
            return True
        except torch.OutOfMemoryError:
            release()
            return False
    return fits
