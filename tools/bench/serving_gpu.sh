#!/usr/bin/env bash
# The serving table's check on the H200 (one device call): GPT-2 XL (random weights), bf16, flash attention,
# prompts of 512 tokens + 512 generated greedily. The engine at meta's answer for the h200 profile's arena
# (tools/bench/serving_meta.sh: 463 sequences) and one more, on cuda in that same arena (--memory, the profile's
# 143771 - 1320 MiB); then the throughput at batch 64 and 463; then transformers' GPT2LMHeadModel.generate at the
# same batches under the same memory cap (tools/bench/lm_generate_torch.py).
# Usage on the GPU machine: BIN=build/carry OUT=$OUT bash tools/bench/serving_gpu.sh
set -uo pipefail
BIN=${BIN:-build}
OUT=${OUT:-.}
ARENA=142451MiB
common="--model transformer_lm --size xl --precision bf16 --attention flash --inference --seq 512 --generate 512 \
  --device cuda --memory $ARENA --steps 1"
for b in 64 463 464; do
  echo "== engine batch $b"
  "$BIN/engine_train" $common --batch $b --json "$OUT/engine_xl_b$b.json" 2>&1 | grep -E "^step|generated|out of memory|error" \
    | cut -c1-400
done
echo "== transformers"
python3 tools/bench/lm_generate_torch.py --size xl --batch 64 463 --cap-gib 139.11
python3 tools/bench/lm_generate_torch.py --size xl --batch 64 463 --cache static --cap-gib 139.11
