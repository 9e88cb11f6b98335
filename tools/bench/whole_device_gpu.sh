#!/usr/bin/env bash
# The whole device on the H200 (one device call): each config on cuda in the h200 profile's arena (--memory
# 142451MiB = 143771 - 1320 MiB, as meta's --gpu h200), then cudaMemGetInfo's count after the run (engine_train's
# "The whole device" lines: before the arena by stage, the arena, what loaded since) against meta's model of what
# lies outside the arena: the profile's reserve less the driver's share (1320 - 616 = 704 MiB).
# Usage on the GPU machine: BIN=build/carry bash tools/bench/whole_device_gpu.sh
set -uo pipefail
BIN=${BIN:-build}
configs=(
  "--model bert_base --seq 128 --batch 32 --precision bf16 --steps 2"
  "--model transformer_lm --size small --batch 8 --steps 2"
  "--model deeplabv3 --size torchvision --batch 4 --precision bf16 --steps 2"
  "--model transformer_lm --size xl --precision bf16 --attention flash --inference --seq 256 --generate 64 --batch 16 --steps 1"
)
echo "| config | peak (arena) | outside the arena, measured (B) | of it before the arena | since the arena |"
echo "|---|---:|---:|---|---:|"
for c in "${configs[@]}"; do
  cuda=$("$BIN/engine_train" $c --device cuda --memory 142451MiB 2>&1)
  echo "$cuda" | grep -E "^In use now|out of memory|rror" | cut -c1-600 >&2
  outside=$(echo "$cuda" | sed -n 's/.*Outside the arena in all: [^(]*(\([0-9]*\) B).*/\1/p' | head -1)
  before=$(echo "$cuda" | sed -n 's/.*before the arena \([0-9.]* [KMGT]*i*B ([^)]*)\).*/\1/p' | head -1)
  since=$(echo "$cuda" | sed -n 's/.*since the arena [^(]*(\([0-9]*\) B.*/\1/p' | head -1)
  peak=$(echo "$cuda" | sed -n 's/^The peak, \([^,]*\),.*/\1/p' | head -1)
  echo "| \`$c\` | $peak | ${outside:-?} | $before | ${since:-?} |"
done
