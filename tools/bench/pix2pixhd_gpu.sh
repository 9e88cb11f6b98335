#!/usr/bin/env bash
# Issue 16's GPU checks and measurements for pix2pixhd in one call (device time is scarce), engine and PyTorch on the
# same GPU:
#   1. tests: instance norm against the cpu and meta, its bandwidth at pix2pixHD's largest shapes (the 1024 x 2048 x 32
#      local enhancer's), and every model's cuda ledger against meta's (pix2pixhd included);
#   2. pix2pixhd at 2048 x 1024, batch 1, fp32 and bf16: the engine (step 6) beside tools/bench/pix2pixhd_torch.py
#      (NVIDIA's step written from its architecture, channels_last, cudnn.benchmark, autocast for bf16);
#   3. the max batch under the 2020 cards' arenas on the GPU itself (the study: 0 on 11 GB, 1 on 24 GB, 2 on 48 GB),
#      beside meta's answer for the same --gpu.
# Usage on the GPU machine: BIN=build/carry OUT=$OUT tools/bench/pix2pixhd_gpu.sh [tests] [speed] [maxbatch]
set -uo pipefail
PARTS=${*:-tests speed maxbatch}
want() { [[ " $PARTS " == *" $1 "* ]]; }
BIN=${BIN:-build}
OUT=${OUT:-/tmp/pix2pixhd_gpu}
mkdir -p "$OUT"
if want tests; then
  echo "== tests"
  timeout 300 "$BIN/engine_cuda_tests" --gtest_filter='InstanceNormCuda.*:BatchNormCuda.*:ModelsCuda.*' \
    > "$OUT/cuda_tests.log" 2>&1
  grep -E 'passed|FAILED' "$OUT/cuda_tests.log" | tail -5
  timeout 120 "$BIN/engine_cuda_tests" --gtest_also_run_disabled_tests \
    --gtest_filter='InstanceNormCuda.DISABLED_Bandwidth' 2>&1 | grep -E 'GB/s' | tee "$OUT/instance_norm_bandwidth.log"
fi
if want speed; then
  echo "== 2048 x 1024, batch 1: engine, then PyTorch"
  for p in fp32 bf16; do
    timeout 150 "$BIN/engine_train" --model pix2pixhd --device cuda --steps 6 --precision "$p" \
      > "$OUT/engine_$p.log" 2>&1
    echo "engine $p | $(grep -E '^step 6|rror' "$OUT/engine_$p.log" | tail -1)"
    timeout 150 python3 tools/bench/pix2pixhd_torch.py --precision "$p" 2>&1 | tail -1 | tee "$OUT/torch_$p.log"
  done
fi
if want maxbatch; then
  echo "== max batch per 2020 card: cuda, then meta"
  for g in rtx2080ti titanrtx rtx8000; do
    for d in cuda meta; do
      timeout 150 "$BIN/engine_train" --model pix2pixhd --device "$d" --gpu "$g" --find-max-batch \
        > "$OUT/maxbatch_${g}_$d.log" 2>&1
      echo "$g $d | $(grep -iE 'largest|fits|rror' "$OUT/maxbatch_${g}_$d.log" | head -1)"
    done
  done
fi
