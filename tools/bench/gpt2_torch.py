#!/usr/bin/env python3
"""PyTorch reference for transformer_lm's GPT-2 sizes: transformers' GPT2LMHeadModel (pre-LN, learned positions,
GELU tanh form, tied embeddings; dropout 0.1 on embeddings, residuals and attention, as models/transformer_lm.cpp)
trained with fused AdamW (lr 6e-4, betas (0.9, 0.95), weight decay 0.1) and the gradient norm clipped at 1, as the
engine does, on sequences of the engine's synthetic kind (x_i = (s + i k) mod V), on the same GPU in the same run.

Prints one line: `torch gpt2 SIZE seq L batch B precision attn | seq/s | ms | peak GiB`.
Usage: python3 tools/bench/gpt2_torch.py --size small --seq 1024 --batch 8 --precision fp32 --attn sdpa
       (--attn eager: transformers' own attention; sdpa: torch's scaled_dot_product_attention, which in fp32 runs
        the memory-efficient kernel; --compile: the loss under torch.compile)
"""
import argparse

import torch
import transformers

from torch_bench import measure, release

SIZES = {"small": (12, 768), "medium": (24, 1024), "large": (36, 1280), "xl": (48, 1600)}


def run(args):
    dev = torch.device("cuda")
    torch.backends.cuda.matmul.allow_tf32 = args.precision == "tf32"
    torch.backends.cudnn.allow_tf32 = args.precision == "tf32"
    layers, dim = SIZES[args.size]
    cfg = transformers.GPT2Config(n_layer=layers, n_embd=dim, n_head=dim // 64, n_positions=1024,
                                  attn_implementation=args.attn)
    model = transformers.GPT2LMHeadModel(cfg).to(dev).train()
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
    g = torch.Generator().manual_seed(0)
    s = torch.randint(0, cfg.vocab_size, (args.batch, 1), generator=g)
    k = torch.randint(1, 5, (args.batch, 1), generator=g)
    t = torch.arange(args.seq + 1)
    seqs = ((s + t * k) % cfg.vocab_size).to(dev)
    ids, targets = seqs[:, :-1].contiguous(), seqs[:, 1:].contiguous()
    amp = args.precision == "bf16"

    def loss_of():
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp):
            logits = model(input_ids=ids).logits
            return torch.nn.functional.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1))

    loss_fn = torch.compile(loss_of) if args.compile else loss_of

    def step():
        opt.zero_grad(set_to_none=True)
        loss = loss_fn()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss

    try:
        return measure(step, args.steps, args.warmup)
    finally:
        del model, opt
        release()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--size", default="small", choices=list(SIZES))
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--precision", default="fp32", choices=["fp32", "tf32", "bf16"])
    p.add_argument("--attn", default="sdpa", choices=["eager", "sdpa"])
    p.add_argument("--compile", action="store_true")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    args = p.parse_args()
    dt, peak = run(args)
    print(f"torch gpt2 {args.size} seq {args.seq} batch {args.batch} {args.precision} {args.attn}"
          f"{' compiled' if args.compile else ''} | {args.batch / dt:.2f} seq/s | {dt * 1000:.1f} ms | "
          f"peak {peak:.2f} GiB", flush=True)


if __name__ == "__main__":
    main()
