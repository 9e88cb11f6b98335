"""Greedy decoding of a GPT-2-shaped model with Hugging Face transformers, the PyTorch side of the engine's
`transformer_lm --inference --generate N` (tools/bench/serving_gpu.sh runs both in one call).

The same work: random weights of GPT-2's shape (--size small|medium|large|xl), bf16 weights only (model.to(bf16),
eval, no grad), SDPA attention, B prompts of P random tokens, one prefill, then N - 1 single-token steps, greedy,
no early stop (no EOS), the KV cache kept (transformers' default DynamicCache, or --cache static: preallocated at
P + N like the engine's). Prints tokens/s over the whole generate() call and torch.cuda.max_memory_allocated,
or OOM when the batch does not fit the --cap-gib memory cap (the engine's arena for the same card).
"""
import argparse
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel

SIZES = {"small": (12, 768), "medium": (24, 1024), "large": (36, 1280), "xl": (48, 1600)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="xl", choices=SIZES)
    ap.add_argument("--batch", type=int, nargs="+", required=True)
    ap.add_argument("--seq", type=int, default=512, help="prompt tokens")
    ap.add_argument("--generate", type=int, default=512, help="tokens generated")
    ap.add_argument("--cache", default="dynamic", choices=["dynamic", "static"])
    ap.add_argument("--cap-gib", type=float, default=0, help="memory cap (0: the whole GPU)")
    a = ap.parse_args()
    layers, dim = SIZES[a.size]
    cfg = GPT2Config(n_layer=layers, n_embd=dim, n_head=dim // 64, n_positions=1024, attn_implementation="sdpa")
    torch.manual_seed(1)
    with torch.device("cuda"):
        model = GPT2LMHeadModel(cfg).to(torch.bfloat16).eval()
    if a.cap_gib > 0:
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(a.cap_gib * 2**30 / total)
    for batch in a.batch:
        ids = torch.randint(0, cfg.vocab_size, (batch, a.seq), device="cuda")
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        try:
            with torch.no_grad():
                t0 = time.perf_counter()
                out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=a.generate,
                                     min_new_tokens=a.generate, do_sample=False, use_cache=True,
                                     cache_implementation=None if a.cache == "dynamic" else "static",
                                     pad_token_id=0, eos_token_id=None)
                torch.cuda.synchronize()
                dt = time.perf_counter() - t0
            assert out.shape == (batch, a.seq + a.generate), out.shape
            print(f"hf gpt2-{a.size} {a.cache} cache batch {batch} prompt {a.seq} + {a.generate}: "
                  f"{batch * a.generate / dt:.0f} tok/s ({dt * 1e3:.0f} ms), "
                  f"peak {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB", flush=True)
            del out
        except torch.OutOfMemoryError:
            print(f"hf gpt2-{a.size} {a.cache} cache batch {batch} prompt {a.seq} + {a.generate}: OOM "
                  f"(peak {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB before it)", flush=True)
        del ids
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
