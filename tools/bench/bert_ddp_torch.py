#!/usr/bin/env python3
"""PyTorch reference for issue 22's data-parallel runs: BERT-Base pretraining as bert_torch.py --best sets it up
(transformers' BertForPreTraining, SDPA, the MLM head on the gathered 15% masked positions, fused AdamW, bf16
autocast, dropout on), each rank one GPU, under DistributedDataParallel (NCCL all-reduce of bf16-autocast f32
gradients in 25 MB buckets, overlapped with backward; gradient_as_bucket_view) or FSDP2 (fully_shard of each
encoder layer and the root: ZeRO-3's sharding of parameters, gradients and optimizer state).

Launch: torchrun --standalone --nproc_per_node N tools/bench/bert_ddp_torch.py --seq 512 --batch 32 [--fsdp]
--batch is per rank (as engine_train --nproc's). Rank 0 prints one line: the world's seq/s (N x batch / step
time), the step time, and the largest per-rank peak (torch.cuda.max_memory_allocated, gathered over the ranks).
"""
import argparse
import os

import torch
import torch.distributed as dist
import transformers

from bert_torch import batch
from torch_bench import time_steps


class PretrainingLoss(torch.nn.Module):
    """bert_torch.py --best's loss as a module, so that DDP's forward (which arms its gradient hooks) runs it."""

    def __init__(self, model, cfg, flat, targets, nsp):
        super().__init__()
        self.model, self.cfg = model, cfg
        self.flat, self.targets, self.nsp = flat, targets, nsp

    def forward(self, input_ids, token_type_ids):
        out = self.model.bert(input_ids=input_ids, token_type_ids=token_type_ids)
        h = out[0].reshape(-1, self.cfg.hidden_size).index_select(0, self.flat)
        mlm = self.model.cls.predictions(h)
        nsp_logits = self.model.cls.seq_relationship(out[1])
        return (torch.nn.functional.cross_entropy(mlm.float(), self.targets) +
                torch.nn.functional.cross_entropy(nsp_logits.float(), self.nsp))


def main(args):
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    local = int(os.environ.get("LOCAL_RANK", rank))
    torch.cuda.set_device(local)
    dev = torch.device("cuda", local)
    torch.manual_seed(1234 + rank)  # each rank its own batch
    torch.backends.cuda.matmul.allow_tf32 = False
    cfg = transformers.BertConfig(attn_implementation="sdpa")
    model = transformers.BertForPreTraining(cfg).to(dev).train()
    kw = batch("bert_base", cfg, args.batch, args.seq, dev)
    labels, nsp = kw.pop("labels"), kw.pop("next_sentence_label")
    kw.pop("attention_mask")
    where = (labels != -100).nonzero(as_tuple=False)
    flat = where[:, 0] * args.seq + where[:, 1]
    targets = labels[where[:, 0], where[:, 1]]
    net = PretrainingLoss(model, cfg, flat, targets, nsp)
    if args.fsdp:
        from torch.distributed.fsdp import fully_shard
        for layer in model.bert.encoder.layer:
            fully_shard(layer)
        fully_shard(net)
        wrapped = net
        how = "FSDP2 (fully_shard per layer)"
    else:
        wrapped = torch.nn.parallel.DistributedDataParallel(net, device_ids=[local], gradient_as_bucket_view=True)
        how = "DDP (25 MB buckets)"
    opt = torch.optim.AdamW(wrapped.parameters(), lr=1e-4, weight_decay=0.01, fused=True)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = wrapped(**kw)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    dt, peak = time_steps(step, args.steps, args.warmup)
    peaks = [None] * world
    dist.all_gather_object(peaks, peak)
    if rank == 0:
        print(f"torch bert_base seq {args.seq} batch {args.batch} per rank x {world} ranks bf16 sdpa gathered-mlm "
              f"fused-adamw {how} | {world * args.batch / dt:.1f} seq/s | {dt * 1000:.1f} ms | "
              f"peak per rank {max(peaks):.2f} GiB", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--batch", type=int, default=32, help="sequences per rank")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--fsdp", action="store_true", help="FSDP2 instead of DDP")
    main(p.parse_args())
