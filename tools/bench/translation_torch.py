#!/usr/bin/env python3
"""PyTorch reference for transformer_big: torch.nn.Transformer with fairseq's transformer_vaswani_wmt_en_de_big
shapes (6+6 post-LN layers, d 1024, FFN 4096 ReLU, 16 heads, dropout 0.3, one shared 32768 x 1024 embedding
scaled by sqrt(d) for encoder input, decoder input and output projection, sinusoidal positions), label-smoothed
cross-entropy 0.1 (ignore <pad> = 1), Adam (0.9, 0.98), on the batch the engine's first steps run: the token
budget filled with sentences of the longest length (engine: --tokens 3584 -> 14 sentences x 256 tokens).

Prints one JSON line: {"model", "tokens", "sentences", "length", "precision", "attn", "tok_per_s",
"ms_per_step", "peak_bytes" (torch.cuda.max_memory_allocated), "peak_gib"}; throughput counts target tokens.
Usage: python3 tools/bench/translation_torch.py --tokens 3584 --length 256 --precision fp32 [--attn math|flash]
Untested here (no GPU on the build machine); the lead runs it beside build/engine_train --device cuda.
"""
import argparse
import json
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from torch_bench import time_steps

V, C, H, FFN, LAYERS, PAD, EOS = 32768, 1024, 16, 4096, 6, 1, 2


def sinusoidal(length, dim, device, first=PAD + 1):  # fairseq's table: half sin, half cos, from padding_idx + 1
    half = dim // 2
    freq = torch.exp(torch.arange(half, dtype=torch.float32, device=device) * -(math.log(10000.0) / (half - 1)))
    pos = torch.arange(first, first + length, dtype=torch.float32, device=device)[:, None] * freq[None, :]
    return torch.cat([torch.sin(pos), torch.cos(pos)], dim=1)  # [L, C]


class TransformerBig(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(V, C, padding_idx=PAD)
        nn.init.normal_(self.embed.weight, 0, C ** -0.5)
        self.transformer = nn.Transformer(C, H, LAYERS, LAYERS, FFN, dropout=0.3, activation="relu",
                                          batch_first=True, norm_first=False)
        # fairseq's post-LN model has no final encoder/decoder LayerNorm: make nn.Transformer's identities.
        self.transformer.encoder.norm = nn.Identity()
        self.transformer.decoder.norm = nn.Identity()

    def embed_tokens(self, ids):
        x = self.embed(ids) * math.sqrt(C) + sinusoidal(ids.shape[1], C, ids.device)
        return F.dropout(x, 0.3, self.training)

    def forward(self, src, prev):
        T = prev.shape[1]
        causal = torch.triu(torch.full((T, T), float("-inf"), device=src.device), diagonal=1)
        h = self.transformer(self.embed_tokens(src), self.embed_tokens(prev), tgt_mask=causal,
                             src_key_padding_mask=src.eq(PAD), memory_key_padding_mask=src.eq(PAD))
        return F.linear(h, self.embed.weight)  # [B, T, V]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", type=int, default=3584)
    p.add_argument("--length", type=int, default=256, help="sentence length with EOS (source = target)")
    p.add_argument("--precision", choices=["fp32", "tf32", "bf16"], default="fp32")
    p.add_argument("--attn", choices=["math", "flash", "default"], default="math",
                   help="scaled_dot_product_attention backend (math = materialized scores, as the engine's naive)")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    a = p.parse_args()
    dev = torch.device("cuda")
    torch.backends.cuda.matmul.allow_tf32 = a.precision == "tf32"
    B, L = a.tokens // a.length, a.length
    model = TransformerBig().to(dev).train()
    opt = torch.optim.Adam(model.parameters(), lr=5e-4, betas=(0.9, 0.98), eps=1e-8)
    g = torch.Generator(device=dev).manual_seed(1)
    words = torch.randint(5, V, (B, L - 1), device=dev, generator=g)
    src = torch.cat([words, torch.full((B, 1), EOS, device=dev)], 1)
    tgt = torch.cat([words.flip(1), torch.full((B, 1), EOS, device=dev)], 1)  # the reversal, as the engine's data
    prev = torch.cat([torch.full((B, 1), EOS, device=dev), tgt[:, :-1]], 1)
    backends = {"math": [torch.nn.attention.SDPBackend.MATH], "flash": [torch.nn.attention.SDPBackend.FLASH_ATTENTION],
                "default": None}[a.attn]

    def step():
        ctx = torch.nn.attention.sdpa_kernel(backends) if backends else torch.autocast("cuda", enabled=False)
        with ctx, torch.autocast("cuda", dtype=torch.bfloat16, enabled=a.precision == "bf16"):
            logits = model(src, prev)
            loss = F.cross_entropy(logits.float().view(-1, V), tgt.reshape(-1), ignore_index=PAD, label_smoothing=0.1)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    s, _ = time_steps(step, a.steps, a.warmup)
    peak = torch.cuda.max_memory_allocated()  # of the timed steps: time_steps reset the statistics before them
    print(json.dumps({"model": "transformer_big (torch.nn.Transformer)", "tokens": a.tokens, "sentences": B,
                      "length": L, "precision": a.precision, "attn": a.attn, "tok_per_s": round(B * L / s, 1),
                      "ms_per_step": round(1000 * s, 2), "peak_bytes": peak, "peak_gib": round(peak / 2**30, 3)}))


if __name__ == "__main__":
    main()
