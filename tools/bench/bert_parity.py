#!/usr/bin/env python3
"""Writes the Hugging Face reference for the engine's BERT parity tests (tests/models/bert_test.cpp).

For a small BertForPreTraining and a small BertForQuestionAnswering built with `transformers` (random
weights; dropout off; eager attention) it writes, under tests/data/bert/:
    parity_pretraining.safetensors, parity_qa.safetensors    the weights, exactly as save_pretrained writes
                                                             them (so the engine's loader meets transformers'
                                                             own handling of the tied decoder)
    parity_pretraining_expected.safetensors, parity_qa_expected.safetensors
                                                             the batch (ids, token types, attention mask with
                                                             padding, masked positions / labels, NSP labels,
                                                             span positions), the losses, and the gradient of
                                                             every parameter ("grad.<name>")
The reference loss and gradients are computed in float64 from the float32 weights (the engine runs float32
and is compared with the exact function), then stored as float64 (losses) and float32 (gradients).

The masked-LM labels are -100 except at the masked positions, and the engine gathers exactly those positions,
so both compute the same loss. Padding: transformers adds a large negative bias to padded keys, the engine
masks them with -inf; the same function for every row with a visible key.

    python3 -m venv /tmp/venv && /tmp/venv/bin/pip install torch transformers safetensors numpy
    /tmp/venv/bin/python tools/bench/bert_parity.py            # then: build/engine_tests --gtest_filter='Bert*'
"""
import argparse
import os
import shutil
import tempfile

import numpy as np
import torch
import transformers
from safetensors.numpy import save_file

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "..", "tests", "data", "bert")

# Small enough that the four files stay well under 1 MB; 4 heads of 8, 2 layers, as the tiny size's shape.
CONFIG = dict(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
              max_position_embeddings=64, type_vocab_size=2, hidden_act="gelu", hidden_dropout_prob=0.0,
              attention_probs_dropout_prob=0.0, layer_norm_eps=1e-12, initializer_range=0.1, pad_token_id=0)
B, T, M = 3, 16, 2  # batch, sequence, masked positions per sequence (round(0.15 * 16))
PADDED = 5          # the last row ends in this many [PAD] tokens


def perturb(model, gen):
    # transformers starts biases at 0 and LayerNorm at (1, 0): move them so the test sees every parameter
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or "LayerNorm" in name:
                p.add_(0.1 * torch.randn(p.shape, generator=gen))


def save_weights(model, name):
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        shutil.copy(os.path.join(tmp, "model.safetensors"), os.path.join(OUT, name))


def make_batch(gen):
    ids = torch.randint(5, CONFIG["vocab_size"], (B, T), generator=gen)
    ids[:, 0] = 2  # [CLS]
    ids[:, T // 2] = 3  # [SEP]
    ids[:, -1] = 3
    types = torch.zeros(B, T, dtype=torch.long)
    types[:, T // 2 + 1:] = 1
    mask = torch.ones(B, T, dtype=torch.long)
    mask[-1, T - PADDED:] = 0
    ids[-1, T - PADDED:] = 0
    types[-1, T - PADDED:] = 0
    return ids, types, mask


def gradients(model):
    return {"grad." + n: p.grad.detach().float().numpy().copy() for n, p in model.named_parameters()
            if p.grad is not None}


def pretraining(gen):
    cfg = transformers.BertConfig(attn_implementation="eager", **CONFIG)
    model = transformers.BertForPreTraining(cfg).eval()
    perturb(model, gen)
    save_weights(model, "parity_pretraining.safetensors")
    ids, types, mask = make_batch(gen)
    labels = torch.full((B, T), -100, dtype=torch.long)
    positions = []
    for b in range(B):
        real = int(mask[b].sum())
        candidates = [t for t in range(1, real) if t not in (T // 2, real - 1)]
        chosen = sorted(torch.randperm(len(candidates), generator=gen)[:M].tolist())
        for i in chosen:
            t = candidates[i]
            positions.append(b * T + t)
            labels[b, t] = int(ids[b, t])
            ids[b, t] = 4  # [MASK]
    nsp = torch.tensor([0, 1, 0])
    model = model.double()
    out = model(input_ids=ids, token_type_ids=types, attention_mask=mask, labels=labels, next_sentence_label=nsp)
    out.loss.backward()
    ce = torch.nn.functional.cross_entropy
    mlm = ce(out.prediction_logits.view(-1, cfg.vocab_size), labels.view(-1))
    nsp_loss = ce(out.seq_relationship_logits, nsp)
    expected = {"input_ids": ids.numpy(), "token_type_ids": types.numpy(), "attention_mask": mask.numpy(),
                "masked_positions": np.array(positions, dtype=np.int64),
                "masked_labels": np.array([int(labels.view(-1)[p]) for p in positions], dtype=np.int64),
                "next_sentence_label": nsp.numpy(), "loss": np.array(out.loss.item()),
                "mlm_loss": np.array(mlm.item()), "nsp_loss": np.array(nsp_loss.item())}
    expected.update(gradients(model))
    save_file(expected, os.path.join(OUT, "parity_pretraining_expected.safetensors"),
              metadata={"transformers": transformers.__version__, "torch": torch.__version__})
    print(f"pretraining: loss {out.loss.item():.10f} (mlm {mlm.item():.6f}, nsp {nsp_loss.item():.6f})")


def question_answering(gen):
    cfg = transformers.BertConfig(attn_implementation="eager", **CONFIG)
    model = transformers.BertForQuestionAnswering(cfg).eval()
    perturb(model, gen)
    save_weights(model, "parity_qa.safetensors")
    ids, types, mask = make_batch(gen)
    # the last start position lies past the sequence: transformers clamps it to T and ignores it
    start = torch.tensor([9, 12, 40])
    end = torch.tensor([10, 14, 9])
    model = model.double()
    out = model(input_ids=ids, token_type_ids=types, attention_mask=mask, start_positions=start, end_positions=end)
    out.loss.backward()
    expected = {"input_ids": ids.numpy(), "token_type_ids": types.numpy(), "attention_mask": mask.numpy(),
                "start_positions": start.numpy(), "end_positions": end.numpy(), "loss": np.array(out.loss.item())}
    expected.update(gradients(model))
    save_file(expected, os.path.join(OUT, "parity_qa_expected.safetensors"),
              metadata={"transformers": transformers.__version__, "torch": torch.__version__})
    print(f"question answering: loss {out.loss.item():.10f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    os.makedirs(OUT, exist_ok=True)
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    pretraining(gen)
    question_answering(gen)
    total = sum(os.path.getsize(os.path.join(OUT, f)) for f in os.listdir(OUT) if f.startswith("parity_"))
    print(f"wrote {OUT}/parity_*.safetensors ({total / 1024:.0f} KiB), transformers {transformers.__version__}")


if __name__ == "__main__":
    main()
