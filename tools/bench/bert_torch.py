#!/usr/bin/env python3
"""PyTorch reference for the BERT-family benchmarks: transformers' BertForPreTraining /
BertForQuestionAnswering / BertForSequenceClassification trained with AdamW on synthetic batches, on the
same GPU as the engine, in the same run.

Prints one line per config:  model seq batch precision attn | seq/s | peak GiB (torch.cuda.max_memory_allocated)
Usage: python3 tools/bench/bert_torch.py --model bert_base --seq 128 --batch 32 --precision fp32 --attn eager
"""
import argparse
import time

import torch
import transformers


def build(model_name, attn):
    if model_name == "bert_base":
        cfg = transformers.BertConfig(attn_implementation=attn)
        return transformers.BertForPreTraining(cfg), cfg
    large = dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096)
    if model_name == "bert_squad":  # BERT-Base by default in the engine; PERF.md measures Large: --size large
        cfg = transformers.BertConfig(attn_implementation=attn, **(large if ARGS.size == "large" else {}))
        return transformers.BertForQuestionAnswering(cfg), cfg
    if model_name == "mtdnn":  # the MT-DNN encoder with a linear classifier (the SAN head is small)
        cfg = transformers.BertConfig(attn_implementation=attn, num_labels=3, **large)
        return transformers.BertForSequenceClassification(cfg), cfg
    raise SystemExit(f"unknown model {model_name}")


def batch(model_name, cfg, b, s, dev):
    ids = torch.randint(5, cfg.vocab_size, (b, s), device=dev)
    types = torch.zeros(b, s, dtype=torch.long, device=dev)
    types[:, s // 2:] = 1
    mask = torch.ones(b, s, dtype=torch.long, device=dev)
    kw = dict(input_ids=ids, token_type_ids=types, attention_mask=mask)
    if model_name == "bert_base":
        labels = torch.full((b, s), -100, device=dev)
        m = max(1, round(0.15 * s))
        pos = torch.stack([torch.randperm(s, device=dev)[:m] for _ in range(b)])
        labels.scatter_(1, pos, ids.gather(1, pos))
        kw.update(labels=labels, next_sentence_label=torch.randint(0, 2, (b,), device=dev))
    elif model_name == "bert_squad":
        kw.update(start_positions=torch.randint(0, s, (b,), device=dev), end_positions=torch.randint(0, s, (b,), device=dev))
    else:
        kw.update(labels=torch.randint(0, 3, (b,), device=dev))
    return kw


def main():
    dev = torch.device("cuda")
    torch.backends.cuda.matmul.allow_tf32 = ARGS.precision == "tf32"
    torch.backends.cudnn.allow_tf32 = ARGS.precision == "tf32"
    model, cfg = build(ARGS.model, ARGS.attn)
    model.to(dev).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
    kw = batch(ARGS.model, cfg, ARGS.batch, ARGS.seq, dev)
    amp = ARGS.precision == "bf16"

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp):
            loss = model(**kw).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    for _ in range(ARGS.warmup):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for _ in range(ARGS.steps):
        step()
    torch.cuda.synchronize()
    dt = (time.perf_counter() - t0) / ARGS.steps
    peak = torch.cuda.max_memory_allocated() / 2**30
    print(f"torch {ARGS.model} seq {ARGS.seq} batch {ARGS.batch} {ARGS.precision} {ARGS.attn} | "
          f"{ARGS.batch / dt:.1f} seq/s | {dt * 1000:.1f} ms | peak {peak:.2f} GiB", flush=True)


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="bert_base")
    p.add_argument("--size", default="base")
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--precision", default="fp32", choices=["fp32", "tf32", "bf16"])
    p.add_argument("--attn", default="eager", choices=["eager", "sdpa"])
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    ARGS = p.parse_args()
    main()
