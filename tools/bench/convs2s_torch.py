#!/usr/bin/env python3
"""PyTorch reference for convs2s: fairseq's fconv_wmt_en_de (Gehring et al. 2017; fairseq/models/fconv.py) written
out in plain PyTorch, as models/convs2s/fconv.h describes the engine's: embeddings 768 (learned positions), 15 + 15
weight-normalized convolutions [(512, 3)] x 9 + [(1024, 3)] x 4 + [(2048, 1)] x 2 to 2C channels and GLU, residuals
scaled by sqrt(0.5) (weight-normalized projections where the width changes), encoder padding rows zeroed, the
encoder output's gradient scaled by 1 / (2 x attention layers), an attention layer per decoder layer (z = (in(h) +
target embedding) sqrt(0.5), softmax over the unpadded source, context times sqrt(source length)), decoder fc2 ->
512, fc3 -> 40000; dropout 0.2; label-smoothed cross-entropy 0.1 ignoring <pad>; fairseq's NAG (SGD, Nesterov
momentum 0.99, lr 0.5) with the gradient norm clipped at 0.1.

The batch: --tokens filled with sentences of --length tokens (source = target, the engine's reversal task), where the
engine's steps are its own length-bucketed batches under the same token budget (similar, not identical work: compare
target tokens per second). Convolutions: --conv cudnn (F.conv1d over [B, C, T], cuDNN; the decoder's causal padding on
the left) or tbc (torch.conv_tbc, fairseq's own ConvTBC op, time-major; the decoder's padded both sides and its last
K - 1 outputs dropped, as fairseq's LinearizedConvolution).

Prints one JSON line: {"model", "parameters", "tokens", "sentences", "length", "precision", "conv", "tok_per_s",
"ms_per_step", "loss", "peak_gib"}. Usage: python3 tools/bench/convs2s_torch.py --tokens 4000 --length 25 --precision
bf16 [--conv tbc]. Written on 2026-12-07 on a machine without torch or a GPU: not yet run (its first run should check
the parameter count against the engine's 209,569,920; "loss" is that of one more step after the timed ones).
"""
import argparse
import json
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.utils.parametrizations import weight_norm

from torch_bench import time_steps

V, E, OUT_E, PAD, EOS, MAX_POS, DROPOUT = 40000, 768, 512, 1, 2, 1024, 0.2
LAYERS = [(512, 3)] * 9 + [(1024, 3)] * 4 + [(2048, 1)] * 2
HALF = math.sqrt(0.5)


def wn_linear(i, o, dropout=0.0):  # fairseq's Linear: N(0, sqrt((1 - dropout) / in)), zero bias, weight norm dim 0
    m = nn.Linear(i, o)
    nn.init.normal_(m.weight, 0, math.sqrt((1 - dropout) / i))
    nn.init.zeros_(m.bias)
    return weight_norm(m, dim=0)


class Conv(nn.Module):
    """A weight-normalized convolution over [B, T, Cin] -> [B, T, Cout] (fairseq's ConvTBC init: N(0, sqrt(4 (1 -
    dropout) / (K Cin))), the norm per output channel)."""

    def __init__(self, cin, cout, k, causal, mode):
        super().__init__()
        self.k, self.causal, self.mode = k, causal, mode
        conv = nn.Conv1d(cin, cout, k)
        nn.init.normal_(conv.weight, 0, math.sqrt(4 * (1 - DROPOUT) / (k * cin)))
        nn.init.zeros_(conv.bias)
        self.conv = weight_norm(conv, dim=0)

    def forward(self, x):
        k = self.k
        if self.mode == "tbc":  # time-major, fairseq's op: weight [K, Cin, Cout]
            w = self.conv.weight.permute(2, 1, 0)
            pad = k - 1 if self.causal else (k - 1) // 2
            y = torch.conv_tbc(x.transpose(0, 1), w, self.conv.bias, pad)
            if self.causal and k > 1:
                y = y[: -(k - 1)]
            return y.transpose(0, 1)
        xt = x.transpose(1, 2)  # [B, Cin, T]
        xt = F.pad(xt, (k - 1, 0)) if self.causal else F.pad(xt, ((k - 1) // 2, (k - 1) // 2))
        return F.conv1d(xt, self.conv.weight, self.conv.bias).transpose(1, 2)


class GradMultiply(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, scale):
        ctx.scale = scale
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        return g * ctx.scale, None


class Side(nn.Module):
    def __init__(self, decoder, mode):
        super().__init__()
        self.embed_tokens = nn.Embedding(V, E, padding_idx=PAD)
        nn.init.normal_(self.embed_tokens.weight, 0, 0.1)
        nn.init.zeros_(self.embed_tokens.weight[PAD])
        self.embed_positions = nn.Embedding(MAX_POS, E, padding_idx=PAD)
        nn.init.normal_(self.embed_positions.weight, 0, 0.1)
        nn.init.zeros_(self.embed_positions.weight[PAD])
        c0 = LAYERS[0][0]
        self.fc1 = wn_linear(E, c0, DROPOUT)
        self.projections, self.convolutions, self.attention = nn.ModuleList(), nn.ModuleList(), nn.ModuleList()
        cin = c0
        for c, k in LAYERS:
            self.projections.append(wn_linear(cin, c) if cin != c else nn.Identity())
            self.convolutions.append(Conv(cin, 2 * c, k, decoder, mode))
            if decoder:
                self.attention.append(nn.ModuleList([wn_linear(c, E), wn_linear(E, c)]))
            cin = c

    def embed(self, ids):
        pos = torch.where(ids.eq(PAD), PAD, PAD + 1 + torch.arange(ids.shape[1], device=ids.device)[None, :])
        return F.dropout(self.embed_tokens(ids) + self.embed_positions(pos), DROPOUT, self.training)


class FConv(nn.Module):
    def __init__(self, mode):
        super().__init__()
        self.encoder, self.decoder = Side(False, mode), Side(True, mode)
        self.encoder_fc2 = wn_linear(LAYERS[-1][0], E)
        self.decoder_fc2 = wn_linear(LAYERS[-1][0], OUT_E)
        self.decoder_fc3 = wn_linear(OUT_E, V, DROPOUT)

    def forward(self, src, prev):
        enc, dec = self.encoder, self.decoder
        pad = src.eq(PAD)
        x = enc.embed(src)
        input_embedding = x
        x = enc.fc1(x)
        for proj, conv in zip(enc.projections, enc.convolutions):
            residual = proj(x)
            x = F.dropout(x.masked_fill(pad[..., None], 0.0), DROPOUT, self.training)
            x = (F.glu(conv(x), dim=-1) + residual) * HALF
        x = self.encoder_fc2(x).masked_fill(pad[..., None], 0.0)
        keys = GradMultiply.apply(x, 1.0 / (2.0 * len(LAYERS)))
        values = (keys + input_embedding) * HALF
        keys_t = keys.transpose(1, 2)
        scale = (src.shape[1] - pad.sum(1, keepdim=True).to(x.dtype)).sqrt()[..., None]  # [B, 1, 1]
        x = dec.embed(prev)
        target_embedding = x
        x = dec.fc1(x)
        for proj, conv, (in_proj, out_proj) in zip(dec.projections, dec.convolutions, dec.attention):
            residual = proj(x)
            x = F.glu(conv(F.dropout(x, DROPOUT, self.training)), dim=-1)
            z = (in_proj(x) + target_embedding) * HALF
            p = torch.softmax(torch.bmm(z, keys_t).masked_fill(pad[:, None, :], float("-inf")), dim=-1)
            c = torch.bmm(p, values) * scale
            x = (out_proj(c) + x) * HALF
            x = (x + residual) * HALF
        x = F.dropout(self.decoder_fc2(x), DROPOUT, self.training)
        return self.decoder_fc3(x)  # [B, T, V]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", type=int, default=4000)
    p.add_argument("--length", type=int, default=25, help="sentence length with EOS (source = target)")
    p.add_argument("--precision", choices=["fp32", "tf32", "bf16"], default="fp32")
    p.add_argument("--conv", choices=["cudnn", "tbc"], default="cudnn")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    a = p.parse_args()
    dev = torch.device("cuda")
    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_tf32 = a.precision == "tf32"
    torch.backends.cudnn.allow_tf32 = a.precision == "tf32"
    B, L = a.tokens // a.length, a.length
    model = FConv(a.conv).to(dev).train()
    try:
        opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.99, nesterov=True, fused=True)
    except (TypeError, RuntimeError):
        opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.99, nesterov=True)
    g = torch.Generator(device=dev).manual_seed(1)
    words = torch.randint(4, V, (B, L - 1), device=dev, generator=g)
    src = torch.cat([words, torch.full((B, 1), EOS, device=dev)], 1)
    tgt = torch.cat([words.flip(1), torch.full((B, 1), EOS, device=dev)], 1)  # the reversal, as the engine's data
    prev = torch.cat([torch.full((B, 1), EOS, device=dev), tgt[:, :-1]], 1)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=a.precision == "bf16"):
            logits = model(src, prev)
        loss = F.cross_entropy(logits.float().view(-1, V), tgt.reshape(-1), ignore_index=PAD, label_smoothing=0.1)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()  # float() of a tensor that requires grad warns

    s, peak = time_steps(step, a.steps, a.warmup)
    params = sum(t.numel() for t in model.parameters())
    print(json.dumps({"model": "convs2s (fconv_wmt_en_de in PyTorch)", "parameters": params, "tokens": a.tokens,
                      "sentences": B, "length": L, "precision": a.precision, "conv": a.conv,
                      "tok_per_s": round(B * L / s, 1), "ms_per_step": round(1000 * s, 2),
                      "loss": round(float(step()), 4), "peak_gib": round(peak, 3)}), flush=True)


if __name__ == "__main__":
    main()
