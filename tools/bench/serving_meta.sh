#!/usr/bin/env bash
# The serving question on the meta device (no GPU needed): the most sequences GPT-2 XL (transformer_lm --size xl,
# 1.56 B parameters) can decode at once per card, bf16 weights without any training state, flash attention,
# for a context of C tokens = a prompt of C/2 tokens (one prefill pass) + C/2 generated greedily one by one,
# with the KV cache of every sequence allocated at C positions. Each cell is engine_train --find-max-batch
# --inference (2 decoding steps per probe), so it holds the arena's fragmentation too.
# Usage: tools/bench/serving_meta.sh [build] > table.md
set -euo pipefail
BUILD=${1:-build}
gpus=${GPUS:-"rtx2080ti titanrtx v100-32 a100-40 l4 rtx4090 a100-80 h100 h200"}
echo "| context (prompt + generated) | $(echo $gpus | sed 's/ / | /g') |"
echo "|---|$(for g in $gpus; do printf -- '---:|'; done)"
for ctx in 512 1024; do
  cells=""
  for g in $gpus; do
    n=$("$BUILD/engine_train" --model transformer_lm --size xl --precision bf16 --attention flash --inference \
          --seq $((ctx / 2)) --generate $((ctx / 2)) --device meta --gpu "$g" --find-max-batch 2>/dev/null \
        | sed -n 's/^max batch: \([0-9]*\) seq fit.*/\1/p; s/^max batch: not even.*/0/p')
    cells="$cells | ${n:-?}"
  done
  echo "| $ctx ($((ctx / 2)) + $((ctx / 2)))$cells |"
done
