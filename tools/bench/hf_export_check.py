#!/usr/bin/env python3
"""Checks engine_train --export-hf against Hugging Face transformers (run where torch and transformers are, e.g.
the GPU machine; the engine runs on cpu here, so no GPU is needed).

For bert_base (BertForPreTraining) and bert_squad (BertForQuestionAnswering), at --size tiny and at full size:
  1. the engine trains a few steps and exports DIR (model.safetensors + config.json);
  2. transformers loads DIR with from_pretrained: no missing, unexpected or mismatched keys, and every tensor of
     the file arrives unchanged (the tied MLM decoder is the word embeddings);
  3. one batch (random ids, token types, masked positions / labels, next-sentence labels, or span positions)
     goes through both in eval mode: transformers' logits give the loss the engine computes from the same
     batch file (engine_train --load DIR/model.safetensors --batch-file B --inference prints it to 10 digits),
     and the two losses must agree to 1e-5 relative; the logits' largest entries are printed.

    python3 tools/bench/hf_export_check.py [--build build] [--out DIR] [--full]
"""
import argparse
import json
import os
import re
import subprocess
import sys

import numpy as np
import torch
import transformers
from safetensors.numpy import save_file
from safetensors.torch import load_file


def run(cmd):
    print("$", " ".join(cmd), flush=True)
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
    return p.stdout


def engine_loss(out):
    m = re.findall(r"^  loss ([-0-9.e+]+)$", out, re.M)
    if not m:
        sys.exit("no 10-digit loss line in the engine's output:\n" + out)
    return float(m[-1])


def check(model, size, build, out_dir, steps=3):
    d = os.path.join(out_dir, f"{model}_{size}")
    args = [f"{build}/engine_train", "--model", model, "--size", size, "--device", "cpu"]
    run(args + ["--steps", str(steps), "--batch", "2", "--export-hf", d])
    cfg = json.load(open(os.path.join(d, "config.json")))
    cls = {"BertForPreTraining": transformers.BertForPreTraining,
           "BertForQuestionAnswering": transformers.BertForQuestionAnswering}[cfg["architectures"][0]]
    hf, info = cls.from_pretrained(d, output_loading_info=True, attn_implementation="eager")
    hf.eval()
    problems = {k: v for k, v in info.items() if v}
    print(f"{model} {size}: {cls.__name__} loading info {info}")
    assert not problems, f"{model} {size}: {problems}"
    state = hf.state_dict()
    for name, t in load_file(os.path.join(d, "model.safetensors")).items():
        assert torch.equal(state[name], t), f"{name} changed on load"
    if cls is transformers.BertForPreTraining:
        assert torch.equal(state["cls.predictions.decoder.weight"], state["bert.embeddings.word_embeddings.weight"])

    gen = torch.Generator().manual_seed(7)
    B, T = 3, min(64, cfg["max_position_embeddings"])
    ids = torch.randint(5, cfg["vocab_size"], (B, T), generator=gen)
    types = (torch.arange(T) >= T // 2).long().expand(B, T).contiguous()
    batch = {"ids": ids.numpy(), "token_types": types.numpy()}
    with torch.no_grad():
        if cls is transformers.BertForPreTraining:
            M = round(0.15 * T)
            pos = torch.stack([torch.randperm(T, generator=gen)[:M].sort().values for _ in range(B)])
            flat = (pos + torch.arange(B)[:, None] * T).reshape(-1)
            labels = torch.randint(5, cfg["vocab_size"], (B * M,), generator=gen)
            nsp = torch.randint(0, 2, (B,), generator=gen)
            o = hf(input_ids=ids, token_type_ids=types)
            mlm_logits = o.prediction_logits.reshape(B * T, -1)[flat]
            ref = (torch.nn.functional.cross_entropy(mlm_logits.double(), labels) +
                   torch.nn.functional.cross_entropy(o.seq_relationship_logits.double(), nsp)).item()
            batch.update(masked_positions=flat.numpy(), masked_labels=labels.numpy(), next_sentence_labels=nsp.numpy())
            logits = mlm_logits
        else:
            start = torch.randint(0, T, (B,), generator=gen)
            end = torch.randint(0, T, (B,), generator=gen)
            o = hf(input_ids=ids, token_type_ids=types)
            ref = 0.5 * (torch.nn.functional.cross_entropy(o.start_logits.double(), start) +
                         torch.nn.functional.cross_entropy(o.end_logits.double(), end)).item()
            batch.update(key_padding_mask=np.zeros((B, T), dtype=bool), start_positions=start.numpy(),
                         end_positions=end.numpy())
            logits = o.start_logits
    bfile = os.path.join(d, "batch.safetensors")
    save_file({k: np.ascontiguousarray(v) for k, v in batch.items()}, bfile)
    out = run(args + ["--load", os.path.join(d, "model.safetensors"), "--batch-file", bfile, "--inference",
                      "--steps", "1"])
    ours = engine_loss(out)
    rel = abs(ours - ref) / abs(ref)
    print(f"{model} {size}: loss engine {ours:.10g}, transformers {ref:.10g}, relative difference {rel:.2e}; "
          f"logits max |x| {logits.abs().max().item():.4f}")
    assert rel < 1e-5, f"{model} {size}: the losses differ by {rel:.2e}"
    return rel


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--out", default="/tmp/hf_export_check")
    ap.add_argument("--full", action="store_true", help="also the full-size models (BERT-Base; slower on cpu)")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    sizes = ["tiny"] + (["base"] if a.full else [])
    for model in ["bert_base", "bert_squad"]:
        for size in sizes:
            check(model, size, a.build, a.out, steps=3 if size == "tiny" else 1)
    print("ok: every export loads with no missing or unexpected keys and gives the engine's loss")


if __name__ == "__main__":
    main()
