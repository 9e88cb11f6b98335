#!/usr/bin/env python3
"""PyTorch reference for the BERT-family benchmarks: transformers' BertForPreTraining /
BertForQuestionAnswering / BertForSequenceClassification trained with AdamW on synthetic batches, on the
same GPU as the engine, in the same run.

Prints one line per config:  model seq batch precision attn | seq/s | peak GiB (torch.cuda.max_memory_allocated)
Usage: python3 tools/bench/bert_torch.py --model bert_base --seq 128 --batch 32 --precision fp32 --attn eager
       python3 tools/bench/bert_torch.py --sweep bert_base:128:32:fp32:eager,mtdnn:512:8:bf16:sdpa
           (several configs in one process: the import and CUDA start-up are paid once; memory is freed and
            the peak counter reset between configs)
       python3 tools/bench/bert_torch.py --best --seq 512 --batch 32 --precision bf16
           (bert_base as the strongest setup: SDPA, the MLM head on the masked positions, fused AdamW; eager, then
            torch.compile)
       python3 tools/bench/bert_torch.py --model bert_base --seq 512 --precision bf16 --max-batch-cap-gib 24
           (the largest batch whose training steps fit under torch.cuda.set_per_process_memory_fraction(cap),
            by bisection inside one process, the cache emptied after each out-of-memory probe)
       python3 tools/bench/bert_torch.py --size large --sweep bert_squad:384:16:fp32:sdpa --fused-adamw --profile
           (the top CUDA kernels of one step instead of the timing, to set beside engine_train --profile)
"""
import argparse

import torch
import transformers

from torch_bench import fits_by_running, max_batch, measure, release


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


def lengths(model_name, b, s):
    """Each row's length as the engine's synthetic batches draw it (--padding engine), or None (full rows):
    bert_squad: question 1..min(16, s/8), context max_ctx/2..max_ctx (models/data/squad.cpp's synthetic_span_batch),
    3 specials; mtdnn (MNLI pairs, models/data/glue.cpp's synthetic_glue_example): a sentence of n = 1..(s-3)/2
    letters, the second the same length (entailment, contradiction) or 1..(s-3)/2 (neutral), 3 specials."""
    if ARGS.padding == "none" or model_name == "bert_base":
        return None
    g = torch.Generator().manual_seed(1)
    draw = lambda lo, hi: int(torch.randint(lo, hi + 1, (1,), generator=g))  # noqa: E731
    out = []
    for _ in range(b):
        if model_name == "bert_squad":
            q = draw(1, min(16, s // 8))
            max_ctx = s - q - 3
            out.append(q + draw(max_ctx // 2, max_ctx) + 3)
        else:
            n = draw(1, (s - 3) // 2)
            m = n if draw(0, 2) < 2 else draw(1, (s - 3) // 2)
            out.append(min(s, n + m + 3))
    return out


def batch(model_name, cfg, b, s, dev):
    ids = torch.randint(5, cfg.vocab_size, (b, s), device=dev)
    types = torch.zeros(b, s, dtype=torch.long, device=dev)
    types[:, s // 2:] = 1
    mask = torch.ones(b, s, dtype=torch.long, device=dev)
    rows = lengths(model_name, b, s)
    if rows is not None:  # padded rows: attention_mask 0 past each length (SDPA then computes every key with a mask)
        mask = (torch.arange(s, device=dev)[None, :] < torch.tensor(rows, device=dev)[:, None]).long()
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


def time_training(loss_of, opt, amp, steps, warmup):
    """Times training steps: loss_of() under bf16 autocast when `amp`, backward, opt.step, zero_grad (set_to_none);
    returns measure()'s (seconds per step, peak GiB), or None after printing one step's top kernels (--profile)."""
    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp):
            loss = loss_of()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    return measure(step, steps, warmup, profile=ARGS.profile)


def run_config(model_name, seq, batch_size, precision, attn, steps, warmup):
    """Trains `steps` timed steps after `warmup`; returns (seconds per step, peak GiB)."""
    dev = torch.device("cuda")
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    torch.backends.cudnn.allow_tf32 = precision == "tf32"
    model, cfg = build(model_name, attn)
    model.to(dev).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01, fused=True if ARGS.fused_adamw else None)
    kw = batch(model_name, cfg, batch_size, seq, dev)
    amp = precision == "bf16"

    try:
        return time_training(lambda: model(**kw).loss, opt, amp, steps, warmup)
    finally:
        del model, opt, kw
        release()


def run_best(seq, batch_size, precision, steps, warmup, compiled):
    """BERT-Base pretraining as the strongest PyTorch setup we can write for the engine's work: SDPA attention (no
    mask: every sequence is full length, as the engine's), the MLM head on the gathered 15% masked positions only
    (transformers' BertForPreTraining would project all positions), fused AdamW, bf16 autocast, dropout on, the loss
    under torch.compile when `compiled`. Returns (seconds per step, peak GiB)."""
    dev = torch.device("cuda")
    torch.backends.cuda.matmul.allow_tf32 = False
    cfg = transformers.BertConfig(attn_implementation="sdpa")
    model = transformers.BertForPreTraining(cfg).to(dev).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01, fused=True)
    kw = batch("bert_base", cfg, batch_size, seq, dev)
    labels, nsp = kw.pop("labels"), kw.pop("next_sentence_label")
    kw.pop("attention_mask")
    where = (labels != -100).nonzero(as_tuple=False)
    flat = where[:, 0] * seq + where[:, 1]
    targets = labels[where[:, 0], where[:, 1]]
    amp = precision == "bf16"

    def loss_fn(input_ids, token_type_ids):
        out = model.bert(input_ids=input_ids, token_type_ids=token_type_ids)
        h = out[0].reshape(-1, cfg.hidden_size).index_select(0, flat)
        mlm = model.cls.predictions(h)
        nsp_logits = model.cls.seq_relationship(out[1])
        return (torch.nn.functional.cross_entropy(mlm.float(), targets) +
                torch.nn.functional.cross_entropy(nsp_logits.float(), nsp))

    f = torch.compile(loss_fn) if compiled else loss_fn

    try:
        return time_training(lambda: f(**kw), opt, amp, steps, warmup)
    finally:
        del model, opt, kw
        release()


def report_max_batch(model_name, seq, precision, attn, cap_gib):
    lo = max_batch(fits_by_running(lambda b: run_config(model_name, seq, b, precision, attn, steps=0, warmup=2)),
                   cap_gib)
    print(f"torch {model_name} seq {seq} {precision} {attn} | max batch {lo} under {cap_gib} GiB "
          f"(set_per_process_memory_fraction; {lo + 1} does not fit)", flush=True)


def main():
    if ARGS.best:
        for compiled in (False, True):
            result = run_best(ARGS.seq, ARGS.batch, ARGS.precision, ARGS.steps, ARGS.warmup, compiled)
            if result is None:  # --profile printed its table
                continue
            dt, peak = result
            print(f"torch bert_base seq {ARGS.seq} batch {ARGS.batch} {ARGS.precision} sdpa gathered-mlm fused-adamw"
                  f"{' compiled' if compiled else ''} | {ARGS.batch / dt:.1f} seq/s | {dt * 1000:.1f} ms | "
                  f"peak {peak:.2f} GiB", flush=True)
        return
    if ARGS.max_batch_cap_gib:
        report_max_batch(ARGS.model, ARGS.seq, ARGS.precision, ARGS.attn, ARGS.max_batch_cap_gib)
        return
    configs = [(ARGS.model, ARGS.seq, ARGS.batch, ARGS.precision, ARGS.attn)]
    if ARGS.sweep:
        configs = []
        for item in ARGS.sweep.split(","):
            m, s, b, p, a = item.split(":")
            configs.append((m, int(s), int(b), p, a))
    for m, s, b, p, a in configs:
        result = run_config(m, s, b, p, a, ARGS.steps, ARGS.warmup)
        if result is None:  # --profile printed its table
            continue
        dt, peak = result
        size = f" {ARGS.size}" if m == "bert_squad" else ""
        fused = " fused-adamw" if ARGS.fused_adamw else ""
        padded = " padded-like-engine" if lengths(m, b, s) is not None else ""
        print(f"torch {m}{size} seq {s} batch {b} {p} {a}{fused}{padded} | {b / dt:.1f} seq/s | "
              f"{dt * 1000:.1f} ms | peak {peak:.2f} GiB", flush=True)


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
    p.add_argument("--sweep", default="", help="model:seq:batch:precision:attn,... run in one process")
    p.add_argument("--max-batch-cap-gib", type=float, default=0)
    p.add_argument("--fused-adamw", action="store_true", help="AdamW's fused CUDA update (one kernel for all)")
    p.add_argument("--padding", default="engine", choices=["engine", "none"],
                   help="bert_squad/mtdnn rows padded like the engine's synthetic batches (the same work), or full")
    p.add_argument("--profile", action="store_true",
                   help="print the top CUDA kernels of one step of each config instead of the timing")
    p.add_argument("--best", action="store_true",
                   help="bert_base only: SDPA, MLM on the masked positions, fused AdamW; eager, then torch.compile")
    ARGS = p.parse_args()
    main()
