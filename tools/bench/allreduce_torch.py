#!/usr/bin/env python3
"""nccl-tests-style all-reduce bandwidth through torch.distributed (NCCL), for issue 22's reference: the bus
bandwidth of a sum all-reduce of each size, bus GB/s = 2 (n - 1) / n x bytes / time (nccl-tests' definition),
median of --iters timed calls after --warmup, on one GPU per rank.

Launch: torchrun --standalone --nproc_per_node N tools/bench/allreduce_torch.py --mib 1,8,27.5,64 --dtype bf16
Rank 0 prints one line per size.
"""
import argparse
import os

import torch
import torch.distributed as dist


def main(args):
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    local = int(os.environ.get("LOCAL_RANK", rank))
    torch.cuda.set_device(local)
    dtype = {"bf16": torch.bfloat16, "f32": torch.float32}[args.dtype]
    for mib in (float(m) for m in args.mib.split(",")):
        n = int(mib * 2**20) // torch.tensor([], dtype=dtype).element_size()
        x = torch.ones(n, dtype=dtype, device="cuda")
        for _ in range(args.warmup):
            dist.all_reduce(x)
        times = []
        for _ in range(args.iters):
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            dist.all_reduce(x)
            stop.record()
            stop.synchronize()
            times.append(start.elapsed_time(stop) / 1000)
        t = sorted(times)[len(times) // 2]
        bus = 2 * (world - 1) / world * x.numel() * x.element_size() / t / 1e9
        if rank == 0:
            print(f"torch all_reduce {args.dtype} {mib:g} MiB x {world} ranks | {t * 1e6:.1f} us | bus {bus:.1f} GB/s",
                  flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--mib", default="1,8,27.5,64,256")
    p.add_argument("--dtype", default="bf16", choices=["bf16", "f32"])
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    main(p.parse_args())
